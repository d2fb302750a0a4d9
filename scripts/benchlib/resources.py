"""What the bench starts (brokers, processes, directories) and how it is all stopped again.

Every process is started in its own session and registered here, so that the end of the bench,
an error or Ctrl-C stops each one and whatever it forked, and nothing else.
"""

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from diode import testbed
from diode.kafka.brokers import EmbeddedBroker, free_port, make_broker

REPO = Path(__file__).resolve().parents[2]
BENCH_PY = REPO / "scripts" / "bench.py"
PYTHON = sys.executable

# Set by the SIGINT/SIGTERM handler. The handler also raises KeyboardInterrupt, but a signal that
# lands inside a librdkafka call can be swallowed there, so the loops check this flag too.
INTERRUPTED: list = []
# A JVM broker starts in 5 to 20 s here; on a machine shared with test runs it took over 60.
BROKER_START_SECONDS = 180.0


def check_interrupted() -> None:
    if INTERRUPTED:
        raise KeyboardInterrupt


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def child_env() -> dict:
    """The environment of every process the bench starts: this checkout's diode first on the
    path, whatever the venv's editable install points at."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def bench_mode(mode: str, *args) -> list[str]:
    """The command line of one of bench.py's subprocess modes (_relay, _sink, ...)."""
    return [PYTHON, str(BENCH_PY), mode, *map(str, args)]


class Resources:
    def __init__(self, broker_kind: str):
        self.broker_kind = broker_kind
        self.bed = None                   # the two-host test bed (--path veth), or None
        self.brokers: list[EmbeddedBroker] = []
        self.procs: list[subprocess.Popen] = []
        self.launches: list = []          # diode.runtime.launches.Launch
        self.dirs: list[str] = []

    def broker(self, name: str, workdir: str, low: bool = False) -> EmbeddedBroker:
        """A broker on 127.0.0.1, or with `low` on the receiving host of the test bed (where
        there is one)."""
        low = low and self.bed is not None
        b = make_broker(self.broker_kind, name,
                        f"{self.bed.low if low else '127.0.0.1'}:{free_port()}",
                        os.path.join(workdir, f"{name}.log"),
                        where=self.bed.run_in([]) if low else ())
        self.brokers.append(b)
        b.start(BROKER_START_SECONDS)
        return b

    def stop_broker(self, b: EmbeddedBroker) -> None:
        b.stop()
        if b in self.brokers:
            self.brokers.remove(b)

    def popen(self, args, log_path: str | None = None, pipes: bool = False,
              **kw) -> subprocess.Popen:
        """Start `args` in its own session; stderr (and stdout unless `pipes`) to `log_path`;
        with `pipes`, stdin and stdout are pipes (read them with read_line)."""
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            p = subprocess.Popen(
                args, start_new_session=True, env=child_env(), stderr=subprocess.STDOUT
                if not pipes else out, stdout=subprocess.PIPE if pipes else out,
                stdin=subprocess.PIPE if pipes else subprocess.DEVNULL, **kw)
        finally:
            if log_path:
                out.close()
        self.procs.append(p)
        return p

    def stop_proc(self, p: subprocess.Popen, timeout: float = 30.0,
                  sig: int = signal.SIGTERM) -> int:
        """`sig`, wait, then SIGKILL what is left of its process group (its own session)."""
        if p.poll() is None:
            p.send_signal(sig)
            deadline = time.monotonic() + timeout
            # Wait without reaping: until it is reaped its pid, and so its group id, cannot be
            # reused, so the killpg below reaches only what we started.
            while True:
                try:
                    if os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                        break
                except ChildProcessError:
                    break
                if time.monotonic() > deadline:
                    log(f"pid {p.pid} did not stop within {timeout:.0f} s: killing its group")
                    break
                time.sleep(0.05)
            try:
                os.killpg(p.pid, signal.SIGKILL)  # any worker left behind
            except (ProcessLookupError, PermissionError):
                pass
        p.wait()
        for f in (p.stdin, p.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        if p in self.procs:
            self.procs.remove(p)
        return p.returncode

    def add_launch(self, launch):
        """A started `diode launch` (diode.runtime.launches.Launch) that close() stops."""
        self.launches.append(launch)
        return launch

    def stop_launch(self, launch, timeout: float = 30.0) -> int:
        """SIGTERM, wait; after `timeout`, SIGKILL to all of it."""
        code = launch.stop(signal.SIGTERM, timeout)
        if launch in self.launches:
            self.launches.remove(launch)
        return code

    def close(self) -> None:
        for launch in list(self.launches):
            self.stop_launch(launch, 10)
        for p in list(self.procs):
            self.stop_proc(p, 10)
        for b in list(self.brokers):
            self.stop_broker(b)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        if self.bed is not None:
            testbed.down(self.bed)
            self.bed = None

    def low_host(self, argv: list) -> list:
        """`argv` run on the receiving host: in the test bed's namespace, or here."""
        return self.bed.run_in(argv) if self.bed is not None else list(argv)

    @property
    def link_host(self) -> str:
        """The receiving host's address: the test bed's far end, or 127.0.0.1."""
        return self.bed.low if self.bed is not None else "127.0.0.1"

    @property
    def link_source(self) -> str:
        """The sending host's address, which the receiver admits: the test bed's near end, or
        127.0.0.1."""
        return self.bed.high if self.bed is not None else "127.0.0.1"


def read_line(p: subprocess.Popen, prefix: str, timeout: float) -> str | None:
    """The next line of `p`'s stdout (a pipe) that starts with `prefix`, waiting at most
    `timeout` seconds; None when it did not come (or `p` closed its stdout)."""
    buf = p.__dict__.setdefault("_bench_lines", bytearray())
    fd = p.stdout.fileno()
    deadline = time.monotonic() + timeout
    while True:
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            text = line.decode(errors="replace")
            if text.startswith(prefix):
                return text
        check_interrupted()
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], min(left, 0.2))
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            buf += chunk


def read_json(p: subprocess.Popen, prefix: str, timeout: float) -> dict:
    """The JSON after `prefix` on the next such line of `p`'s stdout ({} when none came)."""
    line = read_line(p, prefix, timeout)
    return json.loads(line[len(prefix):]) if line else {}


def tell(p: subprocess.Popen, line: str) -> None:
    p.stdin.write(line.encode() + b"\n")
    p.stdin.flush()


@dataclass
class Bench:
    """What every mode shares: the options, the resources, the work dir, the profiler's
    directory (None: no profiles)."""
    args: object
    res: Resources
    work: str
    profile_dir: str | None = None
    profiles: list = field(default_factory=list)  # every profile summary, for the report
    captures: dict = field(default_factory=dict)  # size -> the capture run (receiver mode)

    @property
    def secret(self) -> str:
        """The link's password file (one per bench: captured datagrams stay readable)."""
        path = os.path.join(self.work, "bench.password")
        if not os.path.exists(path):
            Path(path).write_text(os.urandom(16).hex() + "\n")
            os.chmod(path, 0o600)
        return path
