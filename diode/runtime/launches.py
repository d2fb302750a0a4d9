"""Where running `diode launch`es can be found, what their supervisors and workers say, and
how a program runs one.

A supervisor keeps `supervisor.json` in its run directory, rewritten about once a second: its
pid, topology, sides, run directory and start, and every worker's state, pid, CPUs and
restarts. Its process title names its run directory (`supervisor_title`), so whoever can see
the process table finds every running launch, whoever started it, from wherever, with whatever
environment: a launch of the systemd unit (run directory /run/diode/SIDE-NAME) as well as one
started by hand, whatever the HOME or working directory of either. A run directory given by
name is read directly (`running(run_dirs=...)`): its supervisor.json, fresh and naming a live
pid. Beside it, `metrics/` holds each worker's own metrics (diode.runtime.metrics), read by
`worker_metrics` here and nowhere else. `diode status` and `diode tune --live` read them;
nothing here is needed for the pipeline to run.

`Launch` is `diode launch` as a child process, the one way the soak, `diode tune`, the bench,
the figures scripts and the tests start one, wait for it and stop it.
"""

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from diode.errors import DiodeError
from diode.runtime import files

log = logging.getLogger("diode.runtime.launches")
STATUS_FILE = "supervisor.json"
STATUS_FRESH_SECONDS = 10.0  # a live supervisor rewrites its status file about once a second
METRICS_DIR = "metrics"  # in a run directory: <side>-<stage>-<index>.prom per worker
# a worker's process title (diode.runtime.worker): "diode: receiver/unpacker-0"
WORKER_TITLE = re.compile(r"diode: ((?:sender|receiver)/[a-z_]+-\d+)")
# a supervisor's: "diode: supervisor receiver (/etc/diode/plant1.yaml, run dir
# /run/diode/receiver-plant1)"; the run directory absolute
SUPERVISOR_TITLE = re.compile(r"diode: supervisor ([a-z+]+) \((.*), run dir (/.*)\)")


def supervisor_title(sides, topology_path: str, run_dir: str) -> str:
    """The process title of a supervisor of `sides` running `topology_path` in `run_dir`: what
    `running` finds it by (and what `ps` shows)."""
    return (f"diode: supervisor {'+'.join(sides)} ({os.path.abspath(topology_path)}, run dir "
            f"{os.path.abspath(run_dir)})")


def _title(proc) -> str:
    """A process's title (its command line as `ps` shows it); "" when it cannot be read."""
    words = proc.info.get("cmdline") if hasattr(proc, "info") else proc.cmdline()
    return " ".join(words or ()).strip()


def entry_of(proc) -> dict | None:
    """The running launch whose supervisor is `proc` (a psutil.Process): its pid, topology,
    name, sides, run_dir and started (a time.time()), from its status file; None when `proc`
    is not a supervisor or has not written its status file yet. A status file this user may
    not read gives what the title says, with `unreadable` saying why."""
    import psutil
    try:
        m = SUPERVISOR_TITLE.fullmatch(_title(proc))
        if m is None:
            return None
        sides, topology, run_dir = m.group(1).split("+"), m.group(2), m.group(3)
        try:
            status = json.loads((Path(run_dir) / STATUS_FILE).read_text())
        except PermissionError as exc:
            return {"pid": proc.pid, "topology": topology, "name": None, "sides": sides,
                    "run_dir": run_dir, "started": proc.create_time(),
                    "unreadable": f"{exc.strerror}: {exc.filename}"}
        except (OSError, ValueError):
            return None  # (starting: its first status file is written at once)
    except psutil.Error:
        return None  # (it exited meanwhile, or is hidden from this user)
    return _entry(status) if status.get("pid") == proc.pid else None


def _entry(status: dict) -> dict:
    return {k: status.get(k) for k in ("pid", "topology", "name", "sides", "run_dir",
                                       "started")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # (another user's)


def at(run_dir) -> dict | None:
    """The launch running in `run_dir`, from its status file alone: one written in the last
    STATUS_FRESH_SECONDS by a pid that is alive (a process table hidden from this user, or a
    supervisor's title it could not set, do not hide it); else None."""
    try:
        path = Path(run_dir) / STATUS_FILE
        status = json.loads(path.read_text())
        fresh = time.time() - path.stat().st_mtime < STATUS_FRESH_SECONDS
    except (OSError, ValueError):
        return None
    if not (fresh and isinstance(status.get("pid"), int) and _alive(status["pid"])):
        return None
    return _entry({**status, "run_dir": status.get("run_dir") or os.path.abspath(run_dir)})


def not_running(run_dir) -> str:
    """Why no launch is running in `run_dir`, for an operator who named it."""
    path = Path(run_dir) / STATUS_FILE
    try:
        status = json.loads(path.read_text())
        written = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(path.stat().st_mtime))
    except FileNotFoundError:
        return (f"{run_dir}: no launch's status file ({STATUS_FILE}) there: not a run "
                "directory, or its launch never started")
    except (OSError, ValueError) as exc:
        return f"{run_dir}: cannot read {path}: {exc}"
    return (f"{run_dir}: no launch is running there; the last one (supervisor pid "
            f"{status.get('pid')}) wrote its status at {written}")


def running(topology: str | None = None, run_dirs=()) -> list[dict]:
    """The launches running now, oldest first, each {pid, topology, name, sides, run_dir,
    started} (and `unreadable` when its run directory is not this user's to read): every
    supervisor in the process table, and the launch of each of `run_dirs` (found there even
    when its process is not visible). Only those of `topology` (a path), and of `run_dirs`
    when any is given."""
    import psutil
    found = {}
    for proc in psutil.process_iter(["cmdline"]):
        entry = entry_of(proc)
        if entry is not None:
            found[entry["pid"]] = entry
    wanted = {os.path.realpath(d) for d in run_dirs}
    for d in run_dirs:
        entry = at(d)
        if entry is not None:
            found.setdefault(entry["pid"], entry)
    want = os.path.realpath(topology) if topology else None
    out = [e for e in found.values()
           if (want is None or os.path.realpath(e["topology"]) == want)
           and (not wanted or os.path.realpath(e["run_dir"]) in wanted)]
    return sorted(out, key=lambda e: e["started"] or 0.0)


def write_status(run_dir: str, status: dict) -> None:
    try:
        files.replace_json(Path(run_dir) / STATUS_FILE, {**status, "updated": time.time()},
                           sync=False)
    except OSError:
        pass


def read_status(run_dir: str) -> dict | None:
    try:
        return json.loads((Path(run_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None


def workers_of(supervisor) -> dict:
    """Title ("receiver/unpacker-0") -> psutil.Process of every live worker among a
    supervisor's children (a psutil.Process); not its brokers nor its metrics exporters."""
    import psutil
    out = {}
    try:
        children = supervisor.children()
    except psutil.Error:
        return out
    for child in children:
        try:
            m = WORKER_TITLE.fullmatch(_title(child))
        except psutil.Error:
            continue
        if m:
            out[m.group(1)] = child
    return out


# -- the workers' metrics files ------------------------------------------------------------------

def worker_metrics(run_dir, stage: str | None = None, since: float | None = None) -> dict:
    """Worker name ("receiver/unpacker-0") -> the Prometheus text of its metrics file in
    `run_dir` (`<run dir>/metrics/<side>-<stage>-<index>.prom`, rewritten about once a second
    by diode.runtime.metrics), in name order; of `stage` only, if given; of files written at
    `since` (a time.time()) or later only, if given: a restarted launch's workers rewrite the
    files their predecessors left. A file that cannot be read is left out."""
    out = {}
    for f in sorted(Path(run_dir, METRICS_DIR).glob(f"*-{stage}-*.prom" if stage
                                                    else "*.prom")):
        side, _, rest = f.stem.partition("-")
        try:
            if since is not None and f.stat().st_mtime < since:
                continue
            out[f"{side}/{rest}"] = f.read_text()
        except OSError:
            continue
    return out


def worker_counters(run_dir, names, stage: str | None = None) -> dict:
    """Worker name -> {metric: its value, summed over its samples} for each of `names`."""
    from diode.runtime.metrics import read_counter
    return {worker: {name: read_counter(text, name) for name in names}
            for worker, text in worker_metrics(run_dir, stage).items()}


def split_name(worker: str) -> tuple:
    """"receiver/unpacker-0" -> ("receiver", "unpacker", 0)."""
    side, _, rest = worker.partition("/")
    stage, _, index = rest.rpartition("-")
    return side, stage, int(index)


# -- running one ---------------------------------------------------------------------------------

class Launch:
    """`diode launch TOPOLOGY [--side SIDE] [--run-dir RUN_DIR] [ARGS]` as a child process: its
    output (stdout and stderr) appended to `log_path` (else discarded), run with `env` (else
    this process's), in `cwd`, under `where` (a command prefix: the test bed's `ip netns exec
    NAME`), by `python` (default: this interpreter; `-m diode`, so a PYTHONPATH in `env`
    chooses the code). It runs in a session of its own, so that a Ctrl-C meant for the caller
    reaches the caller, which stops it in order, and so that what is left of it can be killed
    as one process group.

    start() returns at once; wait_running(), wait_workers() and wait_ready() wait for the
    supervisor's registration, its workers' processes and their first metrics (sockets and
    clients open), raising `failure` when it exits first or the time is up. stop() signals
    the supervisor (SIGTERM: it drains its workers) and kills whatever is left after a
    timeout; kill() kills it all at once. With `with`, it is started and stopped."""

    def __init__(self, topology, side: str = "both", run_dir=None, log_path=None, env=None,
                 cwd=None, where=(), args=(), python: str = sys.executable):
        self.topology, self.side, self.log_path = topology, side, log_path
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.env, self.cwd, self.where, self.args, self.python = env, cwd, where, args, python
        self.proc: subprocess.Popen | None = None
        self.ps = None       # psutil.Process of the supervisor
        self.started = None  # time.time() of the last start

    def command(self) -> list:
        cmd = [*self.where, self.python, "-m", "diode", "launch", str(self.topology), "--side",
               self.side]
        if self.run_dir is not None:
            cmd += ["--run-dir", str(self.run_dir)]
        return [*cmd, *map(str, self.args)]

    def start(self) -> "Launch":
        """Start it (again, after a stop)."""
        import psutil
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.started = time.time()
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd,
                                         start_new_session=True)
        finally:
            if self.log_path:
                out.close()
        self.ps = psutil.Process(self.proc.pid)
        return self

    def __enter__(self) -> "Launch":
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def workers(self) -> dict:
        """Process title ("receiver/unpacker-0") -> psutil.Process of every live worker."""
        return workers_of(self.ps) if self.alive() else {}

    def failure(self, what: str) -> Exception:
        """The error a wait raises: `what` went wrong (a subclass may add the log's text)."""
        where = f" (its log: {self.log_path})" if self.log_path else ""
        return DiodeError(f"the {self.side} launch of {self.topology}: {what}{where}")

    def _wait(self, condition, timeout: float, what: str, interval: float = 0.1):
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if not self.alive():
                raise self.failure(f"exited with {self.proc.returncode} before {what}")
            if time.monotonic() > deadline:
                raise self.failure(f"not {what} within {timeout:g} s")
            time.sleep(interval)

    def wait_running(self, timeout: float = 30.0) -> dict:
        """Until its supervisor has set its title and written its status file; what
        `running` says of it (pid, topology, name, sides, run_dir, started). Sets run_dir
        when the supervisor chose it."""
        entry = self._wait(lambda: entry_of(self.ps), timeout, "registered")
        if self.run_dir is None:
            self.run_dir = Path(entry["run_dir"])
        return entry

    def wait_workers(self, count: int, timeout: float = 30.0) -> dict:
        """Until at least `count` workers run; workers()."""
        return self._wait(lambda: len(w := self.workers()) >= count and w, timeout,
                          f"running {count} workers")

    def wait_ready(self, count: int, timeout: float = 60.0) -> None:
        """Until `count` workers of this start have written their metrics (after their first
        step: sockets and clients open; a restart's predecessors left theirs)."""
        if self.run_dir is None:
            self.wait_running(timeout)
        self._wait(lambda: len(worker_metrics(self.run_dir, since=self.started)) >= count,
                   timeout, f"ready with {count} workers", 0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        """Signal the supervisor (SIGKILL: kill(), the whole side dies at once) and wait for it
        to exit; if it has not within `timeout`, kill what is left of it. Its exit code
        (negative: the signal that ended it); None if it never started."""
        if self.proc is None:
            return None
        if sig == signal.SIGKILL:
            return self.kill()
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
            if not self._exited_within(timeout):
                log.warning("diode launch pid %d (%s) did not stop within %.0f s: killed",
                            self.proc.pid, self.side, timeout)
                return self.kill()
        return self.proc.wait()

    def _exited_within(self, timeout: float) -> bool:
        # Without reaping: until the supervisor is reaped its pid, and so its process group's
        # id, cannot be reused, so kill() reaches only what this launch started.
        deadline = time.monotonic() + timeout
        while True:
            try:
                if os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                    return True
            except ChildProcessError:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def kill(self) -> int | None:
        """SIGKILL to every process of the launch: the supervisor, its workers, its embedded
        brokers and metrics endpoints (sessions of their own) and whatever else is in its
        process group (a worker restarted meanwhile). Its exit code."""
        import psutil
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            try:
                tree = self.ps.children(recursive=True)
            except psutil.Error:
                tree = []
            for p in [self.ps, *tree]:  # the supervisor first: it restarts no more workers
                try:
                    p.kill()
                except psutil.Error:
                    pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return self.proc.wait()
