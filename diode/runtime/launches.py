"""Where running `diode launch`es can be found, and what their supervisors say of their workers.

Each supervisor registers itself in a state directory (`$DIODE_STATE_DIR`, else
`$XDG_RUNTIME_DIR/diode`, else `/tmp/diode-<uid>`): one small JSON file per launch naming its
pid, topology, sides and run directory, removed when it stops. In its run directory it keeps
`supervisor.json`, rewritten about once a second: every worker's state, pid, CPUs and
restarts. Beside it, `metrics/` holds each worker's own metrics (diode.runtime.metrics). `diode tune
--live` reads them; nothing here is needed for the pipeline to run.
"""

import json
import os
import re
import tempfile
import time
from pathlib import Path

STATUS_FILE = "supervisor.json"
# a worker's process title (diode.runtime.worker): "diode: receiver/unpacker-0"
WORKER_TITLE = re.compile(r"diode: ((?:sender|receiver)/[a-z_]+-\d+)")


def state_dir() -> Path:
    if os.environ.get("DIODE_STATE_DIR"):
        return Path(os.environ["DIODE_STATE_DIR"])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "diode"
    return Path(tempfile.gettempdir()) / f"diode-{os.getuid()}"


def _write_json(path: Path, data: dict) -> None:
    """Atomically: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def register(topology_path: str, name: str, sides: tuple, run_dir: str) -> Path | None:
    """Record this process as a running launch; its file's path (None if the state directory
    cannot be written: the launch runs anyway, it just cannot be found)."""
    d = state_dir()
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = d / f"launch-{os.getpid()}.json"
        _write_json(path, {"pid": os.getpid(), "topology": os.path.abspath(topology_path),
                           "name": name, "sides": list(sides), "run_dir": run_dir,
                           "started": time.time()})
        return path
    except OSError:
        return None


def unregister(path: Path | None) -> None:
    if path is not None:
        try:
            path.unlink()
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def running(topology: str | None = None) -> list[dict]:
    """The launches running now, oldest first; those of `topology` (a path) only, if given.
    Files left by launches that died without removing them are removed."""
    want = os.path.realpath(topology) if topology else None
    out = []
    for f in sorted(state_dir().glob("launch-*.json")):
        try:
            entry = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not _alive(int(entry.get("pid", 0))):
            unregister(f)
            continue
        if want is None or os.path.realpath(entry["topology"]) == want:
            out.append(entry)
    return sorted(out, key=lambda e: e["started"])


def write_status(run_dir: str, status: dict) -> None:
    try:
        _write_json(Path(run_dir) / STATUS_FILE, {**status, "updated": time.time()})
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
            m = WORKER_TITLE.fullmatch(" ".join(child.cmdline()).strip())
        except psutil.Error:
            continue
        if m:
            out[m.group(1)] = child
    return out
