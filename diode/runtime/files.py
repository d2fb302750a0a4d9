"""Small JSON state files: replaced whole (written aside, then renamed over the old one, so a
crash leaves the old file or the new one, never half of either), and read back."""

import json
import os


def replace_json(path: str, data, sync: bool) -> None:
    """Replace `path` with `data` as compact JSON. `sync`: fsync the file and its directory
    first, so that a power loss too leaves one or the other (a process crash never needs it:
    what a returned write(2) wrote is in the page cache)."""
    aside = path + ".new"
    with open(aside, "w") as f:
        json.dump(data, f, separators=(",", ":"))
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(aside, path)
    if sync:
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read_json(path: str):
    """What `path` holds as JSON; None when there is no such file. OSError or ValueError
    when it cannot be read or is not JSON (the caller says what that means)."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
