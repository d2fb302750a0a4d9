"""The receiver's state directory (receiver.journal.dir) knows whose state it holds.

The journal and the writers' checkpoints describe one flow: one topology's receiver, on one link.
Used by another (two topology files beside each other share the default `diode-journal`; a
directory copied or reused), they would make its receiver replay datagrams and resume from
offsets that are not its own. So the directory records, in `identity.json`, the topology's name
and the link (the receiver's UDP port) it was made for; a launch of anything else on it is
refused with a clear error before anything is read or written, and `--reset-state` discards it
after saying what it held.

What the checkpoints hold per source partition (each incarnation, diode.kafka.identity) is read
here too, for `diode check`, `diode status` and the reset's report.
"""

import errno
import fcntl
import os

from diode.errors import DiodeError
from diode.runtime import checkpoints, files
from diode.runtime.journal import SEGMENT_NAME

IDENTITY_FILE = "identity.json"


def identity_of(t) -> dict:
    """What a topology's receiver state is the state of."""
    return {"topology": t.name, "link": f"udp port {t.link.port}"}


def read_identity(directory: str) -> dict | None:
    """The identity a directory records; None when it records none (new, or made by a diode
    before identities). DiodeError when the file cannot be read."""
    path = os.path.join(directory, IDENTITY_FILE)
    try:
        data = files.read_json(path)
        if data is None:
            return None
        return {"topology": data["topology"], "link": data["link"]}
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise DiodeError(f"receiver.journal.dir: cannot read {path} ({exc!r}); it says whose "
                         "state the directory holds. Remove it to adopt the directory, or run "
                         "with --reset-state to discard it") from None


def claim(t, directory: str, reset: bool, log) -> None:
    """Before the receiver uses `directory`: refuse it if it holds another flow's state
    (DiodeError naming it and what to do), or discard everything in it first when `reset`;
    then record whose it is. Nothing else is read or written when it is refused."""
    mine = identity_of(t)
    if reset:
        discard(directory, log)
    found = read_identity(directory) if os.path.isdir(directory) else None
    if found is not None and found != mine:
        raise DiodeError(
            f"receiver.journal.dir {directory} holds the state of topology "
            f"{found['topology']!r} ({found['link']}), not of {mine['topology']!r} "
            f"({mine['link']}): its journal and checkpoints are another flow's, refused. Point "
            f"receiver.journal.dir at a directory of this topology's own, or launch with "
            f"--reset-state to discard what it holds ({summary(directory)})")
    if found is None:
        try:
            os.makedirs(directory, exist_ok=True)
            write_identity(directory, mine)
        except OSError as exc:
            raise DiodeError(f"receiver.journal.dir {directory}: cannot record whose state it "
                             f"holds ({exc.strerror}); make it writable by this user, or point "
                             "it elsewhere") from None


def write_identity(directory: str, identity: dict) -> None:
    files.replace_json(os.path.join(directory, IDENTITY_FILE), identity, sync=True)


def discard(directory: str, log) -> None:
    """--reset-state: say what the directory holds, then remove it (the journal's segments, the
    checkpoints, the identity; never the directory itself, which may be a mount). Refused while
    a receiver uses it."""
    if not os.path.isdir(directory):
        return
    fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise DiodeError(f"--reset-state: a receiver is running on {directory}; stop "
                                 "it first") from None
            raise
        log.warning("--reset-state: discarding the receiver state in %s: %s", directory,
                    summary(directory))
        for name in os.listdir(directory):
            if SEGMENT_NAME.match(name) or name == IDENTITY_FILE or (
                    name.startswith("checkpoint-") and name.endswith((".json", ".json.new"))):
                os.unlink(os.path.join(directory, name))
    finally:
        os.close(fd)


def summary(directory: str) -> str:
    """What a state directory holds, in a line: whose it is, the journal's size (and how much
    of it no checkpoint says is written), the state of each source partition."""
    try:
        names = os.listdir(directory)
    except OSError:
        return "nothing"
    segments = sorted(n for n in names if SEGMENT_NAME.match(n))
    size = sum(os.path.getsize(os.path.join(directory, n)) for n in segments)
    found = read_identity_quietly(directory)
    parts = []
    if found:
        parts.append(f"topology {found['topology']!r} ({found['link']})")
    if segments:
        start = int(segments[0][:20])
        low = min((c["low_water"] for c in checkpoints.load_all(directory)), default=start)
        unwritten = max(0, start + size - max(low, start))
        parts.append(f"a journal of {size} bytes in {len(segments)} segment(s), {unwritten} of "
                     "them past the checkpoints (records there not written to the destination "
                     "are lost)")
    held = held_state(directory)
    parts.append(f"checkpoints of {len(held)} source partition(s)" +
                 (": " + "; ".join(held) if held else ""))
    return ", ".join(parts)


def read_identity_quietly(directory: str) -> dict | None:
    try:
        return read_identity(directory)
    except DiodeError:
        return None


def held(directory: str) -> list[dict]:
    """Per source partition, the incarnations the writers' checkpoints hold state for (the
    newest checkpoint of each partition): [{"topic", "partition", "incarnations": [{"topic_id",
    "frontier", "current"}, ...]}], the current incarnation first."""
    newest: dict = {}
    for data in sorted(checkpoints.load_all(directory), key=lambda d: d["time_ms"]):
        found: dict = {}
        for topic, partition, state in data["partitions"]:
            found.setdefault((topic, partition), []).append(state)
        newest.update(found)
    return [{"topic": topic, "partition": partition,
             "incarnations": [{"topic_id": s.get("incarnation"), "frontier": s.get("frontier"),
                               "current": bool(s.get("current"))}
                              for s in sorted(states, key=lambda s: not s.get("current"))]}
            for (topic, partition), states in sorted(newest.items())]


def held_state(directory: str) -> list[str]:
    """held() as lines."""
    return held_lines(held(directory))


def held_lines(entries: list[dict]) -> list[str]:
    """held()'s entries as lines: 'topic[p]: topic id X up to offset N (current), ...'."""
    lines = []
    for entry in entries:
        described = []
        for inc in entry["incarnations"]:
            where = ("nothing resolved" if inc["frontier"] is None
                     else f"up to offset {inc['frontier']}")
            described.append(f"topic id {inc['topic_id']} {where} "
                             f"({'current' if inc['current'] else 'retired'})")
        lines.append(f"{entry['topic']}[{entry['partition']}]: " + ", ".join(described))
    return lines
