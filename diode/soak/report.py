"""The soak's report: the faults that caused each missing record, memory slopes, latency per
minute, the plots (PNG) and report.md.

Pure functions over what `diode soak` collected (the per-second timeline, the audit's latency
buckets, the fault log); the only I/O is writing into the report directory. Pass/fail of the
invariants is the caller's; memory_verdict() only turns slopes into readable failure lines.

Every plot shares one look: minutes since the start on the x-axis, each fault a dashed vertical
line at its start (and a shaded span while it lasts), coloured by its category, and one legend
entry per category rather than per fault.
"""

from pathlib import Path

from diode.soak.schedule import LOSSY, format_duration

MIB = 2 ** 20
# fault kind -> category; every "link-*" kind is "link"; anything else unknown is "other"
CATEGORY_OF = {"kill-worker": "kill", "sender-restart": "restart", "receiver-restart": "restart",
               "destination-pause": "broker", "destination-stop": "broker",
               "source-pause": "broker"}
# category -> (legend label, colour)
CATEGORIES = {"link": ("link fault", "tab:orange"), "kill": ("worker killed", "tab:red"),
              "restart": ("side restarted", "tab:purple"),
              "broker": ("broker paused/stopped", "tab:brown"), "other": ("other fault", "grey")}
INVARIANTS = ("silent_loss", "false_missing", "duplicates", "corrupted", "unexplained_loss")
COUNTS = ("produced", "delivered", "missing_reported", *INVARIANTS)
# fault log keys that are not the fault's parameters
_NOT_PARAMS = {"kind", "start", "end", "duration", "seed", "at", "ended", "epoch"}


def category(kind: str) -> str:
    return "link" if kind.startswith("link-") else CATEGORY_OF.get(kind, "other")


def fault_span(fault: dict) -> tuple:
    """(start, end) in seconds since the start: when it really ran ("at"/"ended", from the
    fault log) if known, else when it was scheduled."""
    start = fault.get("at", fault["start"])
    if fault.get("ended") is not None:
        return start, max(start, fault["ended"])
    length = fault.get("duration", fault.get("end", fault["start"]) - fault["start"])
    return start, start + (length or 0)


# -- missing records and their faults -----------------------------------------------------------

def fault_window(fault: dict, margin: float) -> tuple:
    """(first, last) epoch seconds within which a record sent may have been lost by the fault:
    from `margin` before it began to `margin` after it ended (a restart ends when its side is
    back; a fault still running when the soak stopped, at its scheduled length)."""
    began, ended = fault.get("at", fault["start"]), fault.get("ended")
    length = ended - began if ended is not None else fault.get("duration") or 0.0
    return fault["epoch"] - margin, fault["epoch"] + max(0.0, length) + margin


def attribute(ranges: list, faults: list, margin: float, t0: float) -> list:
    """Each missing range (diode.soak.audit.missing_ranges: topic, partition, first, last,
    records, sent_from_ms, sent_until_ms, ...) with what ran while its records were sent, within
    `margin` seconds: `faults`, the faults that may lose records (schedule.LOSSY), as
    {"kind", "at", "until"} (seconds since `t0`, the epoch of the soak's start), the likeliest
    cause first (the nearest to the send times, then the one that overlaps them longest) --
    empty: an unexplained loss; and `during`, the faults that must lose nothing that ran then
    (what was going on when a loss is unexplained). `sent_at`, `sent_until`: since `t0`."""
    windows = []
    for f in faults:
        if "epoch" not in f:  # (scheduled, never started)
            continue
        first, last = fault_window(f, margin)
        start, end = fault_span(f)
        windows.append((first, last, f["kind"] in LOSSY, t0 + start, t0 + end,
                        {"kind": f["kind"], "at": round(start, 1), "until": round(end, 1)}))
    out = []
    for r in ranges:
        sent, until = r["sent_from_ms"] / 1000, r["sent_until_ms"] / 1000

        def likeliest(w):
            began, ended = w[3], w[4]
            return max(0.0, began - until, sent - ended), -(min(until, ended) - max(sent, began))
        ran = [(lossy, named) for first, last, lossy, *_, named in
               sorted(windows, key=likeliest) if sent <= last and until >= first]
        out.append({**r, "sent_at": round(sent - t0, 1), "sent_until": round(until - t0, 1),
                    "faults": [named for lossy, named in ran if lossy],
                    "during": [named for lossy, named in ran if not lossy]})
    return out


def missing_by_fault(attributed: list, faults: list, examples: int = 20) -> dict:
    """What `attribute` found, summed: all the ranges and records missing; per fault that may
    lose records and ran, the ranges and records it is the likeliest cause of (each range
    counts once); and the unexplained ones, the first `examples` of them listed."""
    by_fault = [{"kind": f["kind"], "at": round(start, 1), "until": round(end, 1),
                 "ranges": 0, "records": 0}
                for f in faults if "epoch" in f and f["kind"] in LOSSY
                for start, end in [fault_span(f)]]
    unexplained = [r for r in attributed if not r["faults"]]
    for r in attributed:
        if r["faults"]:
            named = r["faults"][0]
            row = next(b for b in by_fault if (b["kind"], b["at"], b["until"]) ==
                       (named["kind"], named["at"], named["until"]))
            row["ranges"] += 1
            row["records"] += r["records"]
    return {"ranges": len(attributed), "records": sum(r["records"] for r in attributed),
            "by_fault": by_fault,
            "unexplained": {"ranges": len(unexplained),
                            "records": sum(r["records"] for r in unexplained),
                            "examples": unexplained[:examples]}}


# -- memory -----------------------------------------------------------------------------------

def _series(timeline: list) -> dict:
    """Per worker title: [(t, pid, rss bytes, cpu %)] over the samples it appears in."""
    out: dict = {}
    for s in timeline:
        for title, w in s.get("workers", {}).items():
            out.setdefault(title, []).append((s["t"], w["pid"], w["rss"], w["cpu"]))
    return out


def _lives(pts: list) -> list:
    """A worker's samples split into incarnations (runs of one pid)."""
    runs: list = []
    for p in pts:
        if not runs or runs[-1][-1][1] != p[1]:
            runs.append([])
        runs[-1].append(p)
    return runs


def _pooled_slope(stretches: list) -> float:
    """The least-squares slope of y over x shared by several stretches of [(x, y)], each with
    its own level: only the change within each stretch counts, never the steps between them."""
    sxy = sxx = 0.0
    for pts in stretches:
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        sxy += sum((x - mx) * (y - my) for x, y in pts)
        sxx += sum((x - mx) ** 2 for x, _ in pts)
    return sxy / sxx if sxx else 0.0


def quiet_times(timeline: list, faults: list, settle: float = 30.0,
                backlog_limit: float | None = None) -> set:
    """The sample times at which nothing disturbs the pipeline: no fault running or ended less
    than `settle` seconds before, and (given a limit) no more backlog than that."""
    spans = [fault_span(f) for f in faults]
    return {s["t"] for s in timeline
            if not any(a <= s["t"] <= b + settle for a, b in spans)
            and (backlog_limit is None or s.get("backlog", 0) <= backlog_limit)}


MIN_STRETCH = 10          # samples: a shorter quiet stretch says nothing of a slope
MIN_QUIET_SECONDS = 300   # a worker's quiet time below which its slope is not judged


def memory(timeline: list, faults: list = (), warmup: float = 60.0, settle: float = 30.0,
           backlog_limit: float | None = None) -> dict:
    """Per worker title: {"start_mb", "end_mb", "max_mb", "slope_mb_per_h", "quiet_minutes",
    "incarnations"}.

    start_mb/end_mb: RSS (MiB, 1 decimal) in the worker's first and last sample. The slope
    (MB/h) is how fast its RSS grows while nothing changes: fitted on every stretch of quiet
    samples (quiet_times: no fault running or just ended, no backlog) of every incarnation past
    its first `warmup` seconds, each stretch at its own level. So a restart's drop, warm-up,
    and the high-water mark a destination outage leaves (a backlog's buffers, kept by the
    allocator once freed) are not growth; a leak, which grows in every stretch, is. Under
    MIN_QUIET_SECONDS of quiet samples: slope None (not judged). incarnations: distinct pids."""
    calm = quiet_times(timeline, faults, settle, backlog_limit)
    out = {}
    for title, pts in _series(timeline).items():
        stretches = []
        for life in _lives(pts):
            current: list = []
            for p in life:
                if p[0] - life[0][0] >= warmup and p[0] in calm:
                    current.append((p[0] / 3600, p[2] / MIB))
                    continue
                if len(current) >= MIN_STRETCH:
                    stretches.append(current)
                current = []
            if len(current) >= MIN_STRETCH:
                stretches.append(current)
        quiet = sum((s[-1][0] - s[0][0]) * 3600 for s in stretches)
        slope = round(_pooled_slope(stretches), 2) if quiet >= MIN_QUIET_SECONDS else None
        out[title] = {"start_mb": round(pts[0][2] / MIB, 1), "end_mb": round(pts[-1][2] / MIB, 1),
                      "max_mb": round(max(p[2] for p in pts) / MIB, 1),
                      "slope_mb_per_h": slope, "quiet_minutes": round(quiet / 60, 1),
                      "incarnations": len({p[1] for p in pts})}
    return out


def memory_verdict(mem: dict, max_slope_mb_per_h: float) -> list[str]:
    """Workers whose RSS grew faster than the limit, one readable line each
    ("receiver/kafka_writer-0 grew 14.2 MB/h (limit 10)"); empty when all are flat."""
    return [f"{title} grew {m['slope_mb_per_h']:.1f} MB/h (limit {max_slope_mb_per_h:g})"
            for title, m in sorted(mem.items())
            if m["slope_mb_per_h"] is not None and m["slope_mb_per_h"] > max_slope_mb_per_h]


# -- latency ----------------------------------------------------------------------------------

def latency_per_minute(latency: list) -> list:
    """The audit's latency buckets regrouped per whole minute:
    [{"minute", "count", "p50", "p99"}]. A minute's p50/p99 are its buckets' p50/p99 averaged
    with each bucket weighted by its record count: an approximation, not the true percentile
    of the minute's records. Buckets without records or percentiles are left out."""
    minutes: dict = {}
    for b in latency:
        if b.get("p50") is not None and b.get("count"):
            minutes.setdefault(int(b["t"] // 60), []).append(b)
    out = []
    for minute, buckets in sorted(minutes.items()):
        n = sum(b["count"] for b in buckets)
        out.append({"minute": minute, "count": n,
                    "p50": round(sum(b["p50"] * b["count"] for b in buckets) / n, 1),
                    "p99": round(sum(b["p99"] * b["count"] for b in buckets) / n, 1)})
    return out


# -- plots ------------------------------------------------------------------------------------

def _smooth(ts: list, values: list, seconds: float) -> list:
    """Trailing mean over about `seconds`, given samples at times `ts`."""
    step = (ts[-1] - ts[0]) / (len(ts) - 1) if len(ts) > 1 and ts[-1] > ts[0] else 1.0
    window = max(1, round(seconds / step))
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _rate(timeline: list, key: str) -> tuple:
    """(minutes, records/s smoothed over 5 s) from a cumulative counter."""
    ts, rates = [], []
    for a, b in zip(timeline, timeline[1:]):
        if b["t"] > a["t"]:
            ts.append(b["t"])
            rates.append(max(0.0, (b[key] - a[key]) / (b["t"] - a["t"])))
    return [t / 60 for t in ts], _smooth(ts, rates, 5)


def _draw_faults(ax, faults: list) -> None:
    shown = set()
    for f in faults:
        cat = category(f["kind"])
        label, colour = CATEGORIES[cat]
        start, end = fault_span(f)
        ax.axvline(start / 60, color=colour, linestyle="--", linewidth=1,
                   label=None if cat in shown else label)
        if end > start:
            ax.axvspan(start / 60, end / 60, color=colour, alpha=0.12, linewidth=0)
        shown.add(cat)


def plot(out_dir, timeline: list, latency: list, faults: list) -> dict:
    """Writes throughput.png, latency.png, backlog.png, rss.png and cpu.png (1200x500 px) into
    out_dir, the faults drawn on each; returns {name: file name}. A plot without data is still
    written, with a "no data" note. Every figure is closed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    series = _series(timeline)
    images = {}

    def chart(name: str, title: str, ylabel: str, draw) -> None:
        fig, ax = plt.subplots(figsize=(12, 5), dpi=100)
        try:
            if not draw(ax):
                ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center",
                        fontsize=14, color="grey")
            _draw_faults(ax, faults)
            ax.set(title=title, xlabel="minutes since the start", ylabel=ylabel)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:  # beside the plot: 20 workers would hide it
                ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=7,
                          borderaxespad=0)
            fig.tight_layout()
            fig.savefig(out_dir / f"{name}.png")
            images[name] = f"{name}.png"
        finally:
            plt.close(fig)

    def throughput(ax) -> bool:
        if len(timeline) < 2:
            return False
        # produced wide and faint underneath: where the two agree, both stay visible
        ax.plot(*_rate(timeline, "produced"), label="produced", linewidth=3, alpha=0.4)
        ax.plot(*_rate(timeline, "delivered"), label="delivered", linewidth=1)
        return True

    def latency_lines(ax) -> bool:
        pts = [b for b in latency if b.get("p50") is not None]
        if not pts:
            return False
        for key in ("p50", "p99"):
            ax.plot([b["t"] / 60 for b in pts], [b[key] for b in pts], label=key)
        lows = [b["p50"] for b in pts if b["p50"] > 0]
        if lows and max(b["p99"] for b in pts) / min(lows) > 100:
            ax.set_yscale("log")
        return True

    def backlog(ax) -> bool:
        ax.plot([s["t"] / 60 for s in timeline], [s["backlog"] for s in timeline],
                label="backlog")
        return bool(timeline)

    def per_worker(index: int, scale: float, seconds: float):
        def draw(ax) -> bool:
            if len(series) > 10:
                ax.set_prop_cycle(color=plt.get_cmap("tab20").colors)
            for title, pts in sorted(series.items()):
                xs, ys = [], []
                for life in _lives(pts):  # a gap in the line where a restart was
                    ts = [p[0] for p in life]
                    xs += [t / 60 for t in ts] + [float("nan")]
                    ys += _smooth(ts, [p[index] / scale for p in life], seconds) + [float("nan")]
                ax.plot(xs, ys, label=title, linewidth=1)
            return bool(series)
        return draw

    chart("throughput", "throughput (records/s, 5 s mean)", "records/s", throughput)
    chart("latency", "end-to-end latency (source timestamp to written)", "ms", latency_lines)
    chart("backlog", "backlog (produced, not yet written or reported missing)", "records",
          backlog)
    chart("rss", "resident memory per worker", "MiB", per_worker(2, MIB, 0))
    chart("cpu", "CPU per worker (10 s mean)", "% of one core", per_worker(3, 1, 10))
    return images


# -- report.md --------------------------------------------------------------------------------

def _mss(seconds: float) -> str:
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    return f"{sign}{int(seconds // 60)}:{int(seconds % 60):02d}"


def _shown(value) -> str:
    return "-" if value is None else str(value)


def _when(named: dict) -> str:
    return f"{named['kind']} {_mss(named['at'])}-{_mss(named['until'])}"


def _missing_lines(m: dict, margin) -> list:
    """report.md's section on the records not written: per fault, what it lost; then each
    unexplained range, loud."""
    u = m["unexplained"]
    within = f" (within {margin:g} s)" if margin is not None else ""
    lines = ["", "## Missing records and the faults that caused them", "",
             f"{m['records']} records in {m['ranges']} ranges were not written. Each range is "
             f"tied to the faults that may lose records that ran while it was sent{within}, "
             "and counted here under the likeliest (the nearest to its send times; "
             "missing-ranges.json names them all).", "",
             "| fault | from | to | ranges | records |", "| --- | --- | --- | ---: | ---: |"]
    lines += [f"| {b['kind']} | {_mss(b['at'])} | {_mss(b['until'])} | {b['ranges']} | "
              f"{b['records']} |" for b in m["by_fault"]]
    lines.append(f"| **unexplained** (no fault that may lose records) | | | **{u['ranges']}** | "
                 f"**{u['records']}** |")
    if u["ranges"]:
        lines += ["", f"**{u['records']} records lost with no fault to explain them** (the "
                  f"first {len(u['examples'])} ranges; every one in missing-ranges.json):", "",
                  "| topic | partition | offsets | records | sent | reported | running then |",
                  "| --- | ---: | --- | ---: | --- | ---: | --- |"]
        lines += [f"| {x['topic']} | {x['partition']} | {x['first']}-{x['last']} | "
                  f"{x['records']} | {_mss(x['sent_at'])}-{_mss(x['sent_until'])} | "
                  f"{x['reported']} | {', '.join(map(_when, x['during'])) or 'no fault'} |"
                  for x in u["examples"]]
    return lines


def write_markdown(out_dir, report: dict, images: dict) -> str:
    """Writes out_dir/report.md (verdict, command, counts against their invariants, why it
    failed, faults, memory, latency, then the plots) and returns its path."""
    r = report
    lines = [f"# Soak report: {'PASSED' if r.get('passed') else 'FAILED'}", "",
             "```", r.get("command", ""), "```", "",
             f"Started {r.get('started_at', '-')}, for {format_duration(r.get('duration') or 0)}"
             + (f" at {r['rate']:g} records/s" if r.get("rate") else "")
             + f", {len(r.get('faults', []))} faults, {r.get('worker_restarts', 0)} worker "
             "restarts.", "", "| count | value | must be |", "| --- | ---: | --- |"]
    lines += [f"| {name} | {_shown(r.get(name))} | {'0' if name in INVARIANTS else ''} |"
              for name in COUNTS]
    d = r.get("digests")
    if d:
        lines += [f"| digested ranges verified | {d['verified']} | |",
                  f"| digested ranges altered | {d['altered']} | 0 |",
                  f"| digested ranges incomplete | {d['incomplete']} | |"]
    if r.get("failures"):
        lines += ["", "Failed because:", ""] + [f"- {f}" for f in r["failures"]]
    if r.get("missing") is not None:
        lines += _missing_lines(r["missing"], r.get("fault_margin"))

    lines += ["", "## Faults", "", "| at | kind | lasted | parameters |",
              "| --- | --- | ---: | --- |"]
    for f in r.get("faults", []):
        start, end = fault_span(f)
        params = ", ".join(f"{k}={v}" for k, v in f.items()
                           if k not in _NOT_PARAMS and v is not None)
        lines.append(f"| {_mss(start)} | {f['kind']} | {end - start:.1f} s | {params} |")

    lines += ["", "## Memory per worker", "",
              "| worker | start MiB | end MiB | max MiB | slope MB/h | quiet minutes | "
              "processes |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for title, m in sorted(r.get("memory", {}).items()):
        slope = "-" if m["slope_mb_per_h"] is None else f"{round(m['slope_mb_per_h'], 1) + 0.0}"
        lines.append(f"| {title} | {m['start_mb']} | {m['end_mb']} | {m['max_mb']} | {slope} "
                     f"| {_shown(m.get('quiet_minutes'))} | {m['incarnations']} |")
    lines += ["", "The slope is how fast RSS grows while nothing disturbs the pipeline (no fault "
              "running or ended within 30 s, no backlog), past each process's first minute: "
              "an outage's high-water mark is not growth, a leak is."]
    if r.get("memory_judged") is False:
        lines += ["", "(Memory slopes are judged only on uninterrupted soaks of 10 minutes or "
                  "more.)"]

    overall = r.get("latency_overall") or {}
    if overall.get("p50") is not None:
        lines += ["", "## Latency", "", f"End-to-end over the soak: p50 {overall['p50']} ms, "
                  f"p99 {overall['p99']} ms, max {_shown(overall.get('max'))} ms."]
    for name, file in images.items():
        lines += ["", f"## {name}", "", f"![{name}]({file})"]
    path = Path(out_dir) / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return str(path)
