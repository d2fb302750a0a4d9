"""One side's Prometheus endpoint: `python -m diode.runtime.exporter`, started by the supervisor
for `sender.metrics.listen` / `receiver.metrics.listen`.

It serves what that side's workers mirror into prometheus_client's multiprocess files
(diode.runtime.metrics), and the supervisor's view of them from its status file
(diode.runtime.launches): each worker's state as `diode_worker_up` and its restarts as
`diode_worker_restarts_total`. A process of its own, so the supervisor, which forks workers,
runs no server thread; it dies with the supervisor. The files of a worker that died are
dropped for gauges (a dead process reports no queue depth) and kept for counters (what it
counted still happened).
"""

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from diode.runtime.parent import die_with_parent

READY = "serving metrics on"


# The supervisor's worker states (diode.runtime.supervisor.State's values), each a series of
# diode_worker_state: 1 for the state the worker is in, 0 for the others, so that an alert can
# ask for a state (state="backoff") without knowing which ones exist.
STATES = ("stopped", "starting", "running", "backoff", "stopping", "exited", "fatal")


class SupervisorCollector:
    """diode_worker_up, diode_worker_state and diode_worker_restarts_total from the
    supervisor's status file."""

    def __init__(self, status: str, side: str):
        self.status, self.side = status, side

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        try:
            workers = json.loads(Path(self.status).read_text()).get("workers", [])
        except (OSError, ValueError):
            workers = []
        labels = ["side", "stage", "index"]
        up = GaugeMetricFamily("diode_worker_up", "1 while the worker runs, 0 while it starts, "
                               "waits for a restart, has stopped or was given up on", labels=labels)
        state = GaugeMetricFamily("diode_worker_state", "1 for the supervisor's state of the "
                                  "worker (label state), 0 for the others",
                                  labels=[*labels, "state"])
        restarts = CounterMetricFamily("diode_worker_restarts", "Times the supervisor started "
                                       "the worker again", labels=labels)
        for w in workers:
            if w["side"] != self.side:
                continue
            values = [w["side"], w["stage"], str(w["index"])]
            up.add_metric(values, 1.0 if w["state"] == "running" else 0.0)
            for s in STATES:
                state.add_metric([*values, s], 1.0 if w["state"] == s else 0.0)
            restarts.add_metric(values, float(w["restarts"]))
        yield up
        yield state
        yield restarts


def forget_dead(directory: str) -> None:
    """Drop the live gauges of processes that are gone (counters stay)."""
    from prometheus_client import multiprocess
    for f in Path(directory).glob("gauge_live*_*.db"):
        pid = int(f.stem.rsplit("_", 1)[1])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            multiprocess.mark_process_dead(pid, directory)
        except PermissionError:
            pass


def registry(directory: str, status: str, side: str):
    from prometheus_client import CollectorRegistry, multiprocess

    class Collected(multiprocess.MultiProcessCollector):
        def collect(self):
            forget_dead(directory)
            return super().collect()

    reg = CollectorRegistry()
    Collected(reg, path=directory)
    reg.register(SupervisorCollector(status, side))
    return reg


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="diode-exporter")
    p.add_argument("--listen", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--status", required=True)
    p.add_argument("--side", required=True)
    args = p.parse_args(argv)
    die_with_parent()
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import make_wsgi_app

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):  # a scrape every few seconds is not news
            pass

    host, _, port = args.listen.rpartition(":")
    try:
        server = make_server(host.strip("[]"), int(port), make_wsgi_app(
            registry(args.dir, args.status, args.side)), handler_class=Quiet)
    except OSError as exc:
        print(f"{args.side}.metrics.listen {args.listen}: {exc.strerror or exc}",
              file=sys.stderr, flush=True)
        return 3
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    setproctitle(f"diode: {args.side}/metrics {args.listen}")
    print(f"{READY} {args.listen}", flush=True)  # (the supervisor waits for this line)
    server.serve_forever()
    return 0


def setproctitle(title: str) -> None:
    try:
        import setproctitle as spt
        spt.setproctitle(title)
    except ImportError:
        pass


if __name__ == "__main__":
    sys.exit(main())
