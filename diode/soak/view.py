"""The soak's live view: elapsed and remaining time, rates, delivered, reported missing,
backlog, worker restarts, the last fault and each worker's RSS and CPU, redrawn every second
(rich). Without a terminal (CI, a log file) it prints one line every 10 s instead."""

import sys
import time

from diode.soak import schedule as sched

PLAIN_EVERY = 10.0


class View:
    def __init__(self, soak, plan, live: bool = True, console=None):
        self.soak, self.plan = soak, plan
        from rich.console import Console
        self.console = console or Console(file=sys.stderr)
        self.live = None
        if live and self.console.is_terminal:
            from rich.live import Live
            self.live = Live(console=self.console, refresh_per_second=2, transient=False)
        self._next_line = 0.0

    def __enter__(self) -> "View":
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live:
            self.update()
            self.live.__exit__(*exc)

    def _figures(self) -> dict | None:
        tl = self.soak.timeline
        if not tl:
            return None
        s = tl[-1]
        back = next((x for x in reversed(tl) if x["t"] <= s["t"] - 10), tl[0])
        span = max(s["t"] - back["t"], 1e-9)
        return {**s, "in_rate": (s["produced"] - back["produced"]) / span,
                "out_rate": (s["delivered"] - back["delivered"]) / span,
                "remaining": max(0.0, self.soak.duration - s["t"])}

    def update(self) -> None:
        f = self._figures()
        if f is None:
            return
        if self.live:
            self.live.update(self._table(f))
        elif time.monotonic() >= self._next_line:
            self._next_line = time.monotonic() + PLAIN_EVERY
            rss = sum(w["rss"] for w in f["workers"].values()) / 2**20
            print(f"diode soak: {sched.format_duration(f['t'])} of "
                  f"{sched.format_duration(self.soak.duration)}: produced {f['produced']} "
                  f"({f['in_rate']:.0f}/s), delivered {f['delivered']} ({f['out_rate']:.0f}/s), "
                  f"missing {f['missing']}, backlog {f['backlog']}, restarts {f['restarts']}, "
                  f"workers' RSS {rss:.0f} MiB", file=sys.stderr, flush=True)

    def _table(self, f: dict):
        from rich.console import Group
        from rich.table import Table
        head = Table.grid(padding=(0, 2))
        head.add_row("elapsed", sched.format_duration(f["t"]), "remaining",
                     sched.format_duration(f["remaining"]))
        head.add_row("produced", f"{f['produced']:,}  ({f['in_rate']:,.0f}/s)", "delivered",
                     f"{f['delivered']:,}  ({f['out_rate']:,.0f}/s)")
        head.add_row("reported missing", f"{f['missing']:,}", "backlog", f"{f['backlog']:,}")
        head.add_row("worker restarts", str(f["restarts"]), "traffic behind",
                     f"{f['behind']:,} records")
        faults = self.soak.fault_log
        if faults:
            last = faults[-1]
            head.add_row("last fault", f"{last['kind']} at {sched.format_duration(last['at'])}",
                         "faults so far", f"{len(faults)} of {len(self.plan.faults)}")
        workers = Table(title="workers", title_justify="left")
        for col in ("worker", "pid", "RSS MiB", "CPU %"):
            workers.add_column(col, justify="right" if col != "worker" else "left")
        for title, w in sorted(f["workers"].items()):
            workers.add_row(title, str(w["pid"]), f"{w['rss'] / 2**20:.1f}", f"{w['cpu']:.0f}")
        return Group(head, workers)
