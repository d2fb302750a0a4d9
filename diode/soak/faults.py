"""The faults of a soak, applied while it runs (diode.soak.run): each started on time in a
thread of its own, logged in the soak's fault log (what its view and report show), and ended after
its duration, or early on Ctrl-C. A link fault changes link-sim's settings through its control
socket; kill-worker kills one worker with SIGKILL; a restart stops one side's launch (SIGTERM or
SIGKILL) and starts it again; a broker fault pauses one of the soak's embedded brokers, or stops
and starts it again. A fault that cannot be applied fails the soak.
"""

import json
import logging
import queue
import random
import signal
import socket
import threading
import time

import psutil

from diode.errors import DiodeError
from diode.link.path import DATAGRAM_BUFFER
from diode.soak import schedule as sched

log = logging.getLogger("diode.soak")

# Link-sim settings of each link fault, from the fault's parameters.
LINK_SETTINGS = {
    "link-loss": lambda p: {"loss": p["loss"]},
    "link-burst": lambda p: {"burst_probability": p["probability"],
                             "burst_length": p["length"]},
    "link-reorder": lambda p: {"reorder": p["probability"], "reorder_delay_ms": p["delay_ms"]},
    "link-duplicate": lambda p: {"duplicate": p["probability"]},
    "link-corrupt": lambda p: {"corrupt": p["probability"]},
    "link-delay": lambda p: {"delay_ms": p["delay_ms"]},
    "link-down": lambda p: {"loss": 1.0},
}
BROKER_FAULTS = {"destination-pause": "destination", "destination-stop": "destination",
                 "source-pause": "source"}


def _kill(p) -> None:
    try:
        p.kill()
    except psutil.Error:
        pass


class Faults:
    """The faults of one soak (`soak`, a diode.soak.run.Soak: its launches, brokers, fault log,
    failures and stopping event). `control` is link-sim's control address, once it runs."""

    def __init__(self, soak):
        self.soak = soak
        self.control = None
        self.threads: list = []                      # one per fault started
        self.main_calls: queue.Queue = queue.Queue()  # (call, done, box) for the main thread

    def in_progress(self) -> bool:
        return any(th.is_alive() for th in self.threads)

    def inject(self, fault) -> None:
        """Start `fault` now, in a thread of its own, and log it."""
        entry = {**fault.as_dict(), "at": round(time.monotonic() - self.soak.t0, 2),
                 "epoch": time.time()}
        self.soak.fault_log.append(entry)
        self.soak.say(f"fault at {sched.format_duration(entry['at'])}: {fault.describe()}")
        th = threading.Thread(target=self._run, args=(fault, entry), daemon=True)
        self.threads.append(th)
        th.start()

    def _run(self, fault, entry: dict) -> None:
        try:
            self._apply(fault, entry)
        except Exception as exc:  # noqa: BLE001 - a fault that cannot be applied fails the soak
            self.soak.failures.append(f"fault {fault.describe()} could not be applied: {exc}")
            log.exception("fault %s", fault.describe())
            self.soak.stopping.set()  # what follows would not be the soak that was asked for
        entry["ended"] = round(time.monotonic() - self.soak.t0, 2)

    def _apply(self, fault, entry: dict) -> None:
        k, p = fault.kind, fault.params
        if fault.link:
            self._link({**LINK_SETTINGS[k](p), "seed": fault.seed})
            self._hold(fault.duration)
            self._link({})
        elif k == "kill-worker":
            sides = ("sender", "receiver") if p.get("side", "any") == "any" else (p["side"],)
            workers = {title: proc for s in sides for title, proc in
                       self.soak.launches[s].workers().items()
                       if not p.get("stage") or title.split("/")[1].rsplit("-", 1)[0]
                       == p["stage"]}
            if not workers:  # its side is restarting (a schedule of overlapping faults)
                entry["skipped"] = "no live worker to kill"
                self.soak.say(f"  skipped: {entry['skipped']}")
                return
            title = random.Random(fault.seed).choice(sorted(workers))
            entry["victim"] = title
            self.soak.say(f"  kill -9 {title} (pid {workers[title].pid})")
            _kill(workers[title])
        elif k in ("sender-restart", "receiver-restart"):
            side = k.split("-")[0]
            launch = self.soak.launches[side]
            self.soak.restarting.add(side)
            sig = signal.SIGKILL if p.get("signal") == "kill" else signal.SIGTERM
            code = launch.stop(sig)
            entry["exit"] = code
            self._hold(fault.duration)
            launch.start()
            launch.wait_ready(self.soak.worker_count(side))
            self.soak.restarting.discard(side)
            self.soak.say(f"  {side} back")
        elif k in BROKER_FAULTS:
            b = self.soak.brokers[BROKER_FAULTS[k]]
            if k == "destination-stop":
                b.stop(keep_data=True)
                self._hold(fault.duration)
                # a broker dies with the thread that started it (PR_SET_PDEATHSIG follows the
                # forking thread): the main thread starts it again
                self._on_main(b.launch)
                b.wait_ready()
            else:
                b.pause()
                try:
                    self._hold(fault.duration)
                finally:
                    b.resume()
        else:
            raise DiodeError(f"unknown fault kind {k}")

    def _on_main(self, call) -> None:
        """Run `call` on the main thread (at its next sample) and wait for it."""
        done = threading.Event()
        box = {}
        self.main_calls.put((call, done, box))
        done.wait()
        if "error" in box:
            raise box["error"]

    def run_main_calls(self) -> None:
        """Run what the faults' threads asked the main thread to (the soak's loop calls it)."""
        while True:
            try:
                call, done, box = self.main_calls.get_nowait()
            except queue.Empty:
                return
            try:
                call()
            except Exception as exc:  # noqa: BLE001 - handed back to the fault's thread
                box["error"] = exc
            done.set()

    def _hold(self, seconds: float) -> None:
        """Wait a fault's duration; Ctrl-C ends it early."""
        self.soak.stopping.wait(seconds)

    def _link(self, settings: dict) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(5)
            s.sendto(json.dumps(settings).encode(), self.control)
            answer = json.loads(s.recv(DATAGRAM_BUFFER))
        if "error" in answer:
            raise DiodeError(f"link-sim refused {settings}: {answer['error']}")
