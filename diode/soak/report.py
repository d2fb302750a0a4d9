"""The soak's report: memory slopes, latency per minute, the plots (matplotlib) and report.md.

Plots share one look: minutes since the start on the x-axis, each fault a vertical line at its
start (a shaded span while it lasts), coloured by its category.
"""

from pathlib import Path

CATEGORIES = {"link": ("link fault", "tab:orange"), "kill": ("kill -9", "tab:red"),
              "restart": ("side restart", "tab:purple"), "broker": ("broker paused/stopped",
                                                                   "tab:brown")}
MIB = 2 ** 20


def category(kind: str) -> str:
    if kind.startswith("link-"):
        return "link"
    if kind == "kill-worker":
        return "kill"
    return "restart" if kind.endswith("-restart") else "broker"


def _series(timeline: list) -> dict:
    """Per worker title: [(t, pid, rss bytes, cpu %)]."""
    out: dict = {}
    for s in timeline:
        for title, w in s.get("workers", {}).items():
            out.setdefault(title, []).append((s["t"], w["pid"], w["rss"], w["cpu"]))
    return out


def _slope(points: list) -> float:
    """Least-squares slope of (x, y)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def memory(timeline: list, warmup: float = 60.0) -> dict:
    """Per worker title: start_mb, end_mb, max_mb, slope_mb_per_h, incarnations. The slope is
    fitted on the worker's longest-lived process (one pid), after `warmup` seconds of it (or
    its first tenth, if that leaves too little); under 10 points left, None."""
    out = {}
    for title, pts in _series(timeline).items():
        lives: dict = {}
        for t, pid, rss, _ in pts:
            lives.setdefault(pid, []).append((t, rss))
        longest = max(lives.values(), key=lambda p: p[-1][0] - p[0][0])
        begin = longest[0][0]
        fit = [p for p in longest if p[0] - begin >= warmup]
        if len(fit) < 10:
            fit = longest[len(longest) // 10:]
        slope = None
        if len(fit) >= 10:
            slope = round(_slope([(t / 3600, rss / MIB) for t, rss in fit]), 2)
        out[title] = {"start_mb": round(pts[0][2] / MIB, 1), "end_mb": round(pts[-1][2] / MIB, 1),
                      "max_mb": round(max(p[2] for p in pts) / MIB, 1),
                      "slope_mb_per_h": slope, "incarnations": len(lives)}
    return out


def memory_verdict(mem: dict, max_slope_mb_per_h: float) -> list:
    """Workers whose memory grew faster than the limit, one line each."""
    return [f"{title} grew {m['slope_mb_per_h']:.1f} MB/h (limit {max_slope_mb_per_h:g})"
            for title, m in sorted(mem.items())
            if m["slope_mb_per_h"] is not None and m["slope_mb_per_h"] > max_slope_mb_per_h]


def latency_per_minute(latency: list) -> list:
    """The audit's latency buckets regrouped per minute; a minute's p50 and p99 are its buckets'
    weighted by record count (an approximation of the minute's own percentiles)."""
    minutes: dict = {}
    for b in latency:
        if b.get("p50") is None:
            continue
        minutes.setdefault(int(b["t"] // 60), []).append(b)
    out = []
    for minute, buckets in sorted(minutes.items()):
        n = sum(b["count"] for b in buckets)
        out.append({"minute": minute, "count": n,
                    "p50": round(sum(b["p50"] * b["count"] for b in buckets) / n, 1),
                    "p99": round(sum(b["p99"] * b["count"] for b in buckets) / n, 1)})
    return out


def _smooth(values: list, window: int) -> list:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _rates(timeline: list, key: str) -> tuple:
    ts, rates = [], []
    for a, b in zip(timeline, timeline[1:]):
        if b["t"] > a["t"]:
            ts.append(b["t"] / 60)
            rates.append(max(0.0, (b[key] - a[key]) / (b["t"] - a["t"])))
    return ts, _smooth(rates, 5)


def _faults(ax, faults: list) -> None:
    seen = set()
    for f in faults:
        cat = category(f["kind"])
        label, colour = CATEGORIES[cat]
        start = f.get("at", f["start"]) / 60
        end = f.get("ended", f.get("end", f["start"]))
        end = (end if "ended" in f else f.get("at", f["start"]) + f["duration"]) / 60
        shown = None if cat in seen else label
        seen.add(cat)
        ax.axvline(start, color=colour, linestyle="--", linewidth=1, label=shown)
        if end > start:
            ax.axvspan(start, end, color=colour, alpha=0.12)


def plot(out_dir, timeline: list, latency: list, faults: list) -> dict:
    """throughput.png, latency.png, backlog.png, rss.png, cpu.png in out_dir, with the faults
    drawn; returns {name: file name}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out_dir = Path(out_dir)
    series = _series(timeline)
    charts = {}

    def chart(name: str, title: str, ylabel: str, draw) -> None:
        fig, ax = plt.subplots(figsize=(12, 5), dpi=100)
        try:
            if not draw(ax):
                ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
            _faults(ax, faults)
            ax.set_title(title)
            ax.set_xlabel("minutes since the start")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            handles, labels = ax.get_legend_handles_labels()
            if handles:
                ax.legend(loc="upper left", fontsize=8, ncol=2 if len(handles) > 8 else 1)
            fig.tight_layout()
            fig.savefig(out_dir / f"{name}.png")
            charts[name] = f"{name}.png"
        finally:
            plt.close(fig)

    def throughput(ax):
        for key, label in (("produced", "produced"), ("delivered", "delivered")):
            ts, rates = _rates(timeline, key)
            ax.plot(ts, rates, label=label)
        return len(timeline) > 1

    def lat(ax):
        pts = [b for b in latency if b.get("p50") is not None]
        if not pts:
            return False
        ts = [b["t"] / 60 for b in pts]
        ax.plot(ts, [b["p50"] for b in pts], label="p50")
        ax.plot(ts, [b["p99"] for b in pts], label="p99")
        low = min(b["p50"] for b in pts) or 1
        if max(b["p99"] for b in pts) / low > 100:
            ax.set_yscale("log")
        return True

    def backlog(ax):
        ax.plot([s["t"] / 60 for s in timeline], [s["backlog"] for s in timeline],
                label="backlog")
        return bool(timeline)

    def per_worker(index: int, scale: float, window: int):
        def draw(ax):
            for title, pts in sorted(series.items()):
                ax.plot([p[0] / 60 for p in pts], _smooth([p[index] / scale for p in pts],
                                                          window), label=title, linewidth=1)
            return bool(series)
        return draw

    chart("throughput", "throughput (records/s, 5 s mean)", "records/s", throughput)
    chart("latency", "end-to-end latency (source timestamp to written)", "ms", lat)
    chart("backlog", "backlog (produced, not yet written or reported)", "records", backlog)
    chart("rss", "resident memory per worker", "MiB", per_worker(2, MIB, 1))
    chart("cpu", "CPU per worker (10 s mean)", "% of one core", per_worker(3, 1, 10))
    return charts


def _mss(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def write_markdown(out_dir, report: dict, images: dict) -> str:
    """report.md: verdict, command, figures, faults, memory, latency and the plots."""
    r = report
    verdict = "PASSED" if r.get("passed") else "FAILED"
    lines = [f"# Soak report: {verdict}", "", "```", r.get("command", ""), "```", "",
             f"Started {r.get('started_at')}, {r.get('duration', 0) / 60:g} minutes of "
             f"traffic at {r.get('rate', 0):.0f} records/s (sizes {r.get('sizes')}), "
             f"{len(r.get('faults', []))} faults, {r.get('worker_restarts', 0)} worker restarts.",
             "", "| figure | value | must be |", "| --- | ---: | --- |"]
    for name in ("produced", "delivered", "missing_reported", "late_filled", "silent_loss",
                 "false_missing", "duplicates", "corrupted", "unexplained_loss"):
        must = "0" if name in ("silent_loss", "false_missing", "duplicates", "corrupted",
                               "unexplained_loss") else ""
        lines.append(f"| {name} | {r.get(name)} | {must} |")
    if r.get("failures"):
        lines += ["", "Failed:", ""] + [f"- {f}" for f in r["failures"]]
    if r.get("missing_reasons"):
        lines += ["", "Missing by reason: " + ", ".join(
            f"{k or '-'} {v}" for k, v in sorted(r["missing_reasons"].items()))]
    lines += ["", "## Faults", "", "| at | kind | lasted | parameters |",
              "| --- | --- | ---: | --- |"]
    for f in r.get("faults", []):
        params = ", ".join(f"{k}={v}" for k, v in f.items() if k not in (
            "kind", "start", "end", "duration", "seed", "at", "epoch", "ended") and v is not None)
        lasted = f.get("ended", f.get("at", 0)) - f.get("at", 0)
        lines.append(f"| {_mss(f.get('at', f['start']))} | {f['kind']} | {lasted:.1f} s | "
                     f"{params} |")
    lines += ["", "## Memory per worker", "",
              "| worker | start MiB | end MiB | max MiB | slope MB/h | processes |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for title, m in sorted(r.get("memory", {}).items()):
        slope = "-" if m["slope_mb_per_h"] is None else f"{m['slope_mb_per_h']:.1f}"
        lines.append(f"| {title} | {m['start_mb']} | {m['end_mb']} | {m['max_mb']} | {slope} | "
                     f"{m['incarnations']} |")
    if not r.get("memory_judged"):
        lines += ["", "(Memory slopes are judged on soaks of 10 minutes or more.)"]
    lat = r.get("latency_overall") or {}
    if lat.get("p50") is not None:
        lines += ["", f"End-to-end latency over the soak: p50 {lat['p50']} ms, p99 {lat['p99']} "
                  f"ms, max {lat['max']} ms."]
    for name, file in images.items():
        lines += ["", f"## {name}", "", f"![{name}]({file})"]
    path = Path(out_dir) / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return str(path)
