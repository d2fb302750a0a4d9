"""Files replaced whole: written aside (`<path>.new`), then renamed over the old one, so that a
reader, or a crash, sees the old file or the new one, never half of either; and JSON read back.
The one way diode writes a file that something else may read at any moment: checkpoints, the
journal's identity, launches' registrations and status, workers' metrics, topology edits,
password files, the audit's ledger."""

import json
import os


def replace(path, data: bytes | str, sync: bool, mode: int | None = None) -> None:
    """Replace `path` with `data` (str: UTF-8). `sync`: fsync the file and its directory first,
    so that a power loss too leaves one or the other (a process crash never needs it: what a
    returned write(2) wrote is in the page cache). `mode`: the new file's permissions, set
    before anything is written (a secret never sits in a file readable by others); else the
    usual 0o666 less the umask. Whatever fails, the old file stays and nothing is left aside."""
    path = os.fspath(path)
    aside = path + ".new"
    if isinstance(data, str):
        data = data.encode()
    try:
        os.unlink(aside)  # left by a crash: its permissions and contents are not ours
    except FileNotFoundError:
        pass
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if mode is not None else
                 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(aside, path)
    except BaseException:
        try:
            os.unlink(aside)
        except OSError:
            pass
        raise
    if sync:
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def replace_json(path, data, sync: bool, indent: int | None = None) -> None:
    """Replace `path` with `data` as JSON: compact, or indented by `indent` for people."""
    replace(path, json.dumps(data, indent=indent, separators=None if indent else (",", ":")),
            sync)


def read_json(path: str):
    """What `path` holds as JSON; None when there is no such file. OSError or ValueError
    when it cannot be read or is not JSON (the caller says what that means)."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
