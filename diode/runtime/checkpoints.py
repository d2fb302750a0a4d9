"""The kafka_writers' checkpoints: what the destination has acknowledged, kept beside the journal.

Each writer keeps one file, `checkpoint-<index>.json` in receiver.journal.dir, replaced atomically
(written aside, synced, renamed), with:

- `low_water`: a journal position below which every datagram this writer may have needed is
  written to the destination, reported missing, or a duplicate; the journal is replayed from the
  lowest low water of all writers after any restart;
- `partitions`: per incarnation of each source partition (its topic id, diode.kafka.identity),
  the ordering state a restart resumes from (diode.accounting.ordering.PartitionState.checkpoint),
  with `incarnation` in text and `current`: false for one a newer incarnation replaced (kept so
  that copies of its records are still told apart);
- `writers`: how many writers there were, so a restart with a different count still finds every
  partition's state (each writer takes the partitions it now owns from every file);
- `time_ms`: when it was written (the missing-records topic is read back from about then);
- `readers`: the earliest sender time (ms) of a heartbeat heard of each of the sender's readers
  (by index), which tells a chain that started while the receiver was down from one it joined
  (diode.accounting.ordering, "Where a chain starts");
- `id`: what names this whole checkpoint for the changes written over it (below); a checkpoint
  without one (written by a diode before them) has none over it.

A writer holding 10 000 partitions, most idle, does not rewrite them all every interval: between
two whole checkpoints it writes `checkpoint-<index>.changes.json`, replaced the same way, with
`changes_to` (the `id` of the whole one it changes), `low_water`, `time_ms`, `readers`, and only
the `partitions` entries of the source partitions whose states changed since that whole one
(all of their incarnations), and `dropped`: those it no longer holds. A whole checkpoint is
written again once the changes would hold a quarter of the partitions (diode.writer.recovery),
and the changes file is then removed. `load` gives the whole one with its changes merged over it
(the changes' partitions replacing the whole one's, their low water, time and readers); changes
naming another whole checkpoint (a crash between writing a whole one and removing them) are left
out and logged, the whole one is used alone.
"""

import logging
import os
import re

from diode.runtime import files

log = logging.getLogger("diode.runtime.checkpoints")

VERSION = 2  # 1: states per source partition, without incarnations (not used: see load)


NAME = re.compile(r"checkpoint-(\d+)\.json$")


def path(directory: str, index: int) -> str:
    return os.path.join(directory, f"checkpoint-{index}.json")


def changes_path(directory: str, index: int) -> str:
    return os.path.join(directory, f"checkpoint-{index}.changes.json")


def save(directory: str, index: int, low_water: int, partitions: list, writers: int,
         time_ms: int, sync: bool, readers: dict | None = None,
         whole_id: str | None = None) -> None:
    """Replace writer `index`'s checkpoint; `partitions` is [topic, partition, state] of every
    incarnation of every source partition the writer holds; `readers` {reader index: earliest
    sender time heard}; `whole_id` names it for the changes written over it (save_changes),
    and the changes of the one it replaces are removed."""
    data = {"version": VERSION, "writer": index, "writers": writers, "low_water": low_water,
            "time_ms": time_ms, "partitions": [list(entry) for entry in partitions],
            "readers": {str(r): t for r, t in (readers or {}).items()}}
    if whole_id is not None:
        data["id"] = whole_id
    files.replace_json(path(directory, index), data, sync)
    try:
        os.unlink(changes_path(directory, index))
    except FileNotFoundError:
        pass


def save_changes(directory: str, index: int, whole_id: str, low_water: int, partitions: list,
                 dropped: list, time_ms: int, sync: bool, readers: dict | None = None) -> None:
    """Replace writer `index`'s changes over its whole checkpoint `whole_id`: `partitions`, the
    entries (as save's) of every source partition changed since that one, `dropped` [topic,
    partition] of those no longer held."""
    data = {"version": VERSION, "writer": index, "changes_to": whole_id, "low_water": low_water,
            "time_ms": time_ms, "partitions": [list(entry) for entry in partitions],
            "dropped": [list(tp) for tp in dropped],
            "readers": {str(r): t for r, t in (readers or {}).items()}}
    files.replace_json(changes_path(directory, index), data, sync)


def load(directory: str, index: int) -> dict | None:
    """One writer's checkpoint; None if there is none, or it cannot be read (then the log says
    why and the caller starts from the destination's provenance headers)."""
    try:
        data = files.read_json(path(directory, index))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path(directory, index)}: {exc}") from None
    if data is None:
        return None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path(directory, index)}: not a checkpoint")
    if data.get("version") == 1:
        raise CheckpointError(f"{path(directory, index)}: written by an earlier diode, whose "
                              "states do not name the source incarnation they belong to; not "
                              "used (the destination's provenance headers are)")
    if data.get("version") != VERSION:
        raise CheckpointError(f"{path(directory, index)}: version {data.get('version')}, "
                              f"not {VERSION}")
    return merged(data, directory, index)


def merged(data: dict, directory: str, index: int) -> dict:
    """A whole checkpoint with the changes written over it merged in (see the module); alone
    when there are none, or they are not its own (logged)."""
    where = changes_path(directory, index)
    try:
        changes = files.read_json(where)
    except (OSError, ValueError) as exc:
        log.warning("checkpoint changes left out (the whole checkpoint is used): %s: %s",
                    where, exc)
        return data
    if changes is None:
        return data
    if not isinstance(changes, dict) or changes.get("version") != VERSION or \
            changes.get("writer") != data.get("writer") or data.get("id") is None or \
            changes.get("changes_to") != data["id"]:
        log.warning("checkpoint changes left out (the whole checkpoint is used): %s: they "
                    "change another checkpoint than %s", where, path(directory, index))
        return data
    try:
        replaced = {(t, p) for t, p, _ in changes["partitions"]} | \
            {tuple(tp) for tp in changes["dropped"]}
        return {**data, "low_water": changes["low_water"], "time_ms": changes["time_ms"],
                "readers": changes["readers"],
                "partitions": [e for e in data["partitions"] if (e[0], e[1]) not in replaced] +
                changes["partitions"]}
    except (KeyError, TypeError, ValueError) as exc:  # (a file damaged on disk)
        log.warning("checkpoint changes left out (the whole checkpoint is used): %s: %r",
                    where, exc)
        return data


def load_all(directory: str) -> list[dict]:
    """Every writer's checkpoint in the directory (any writer count); an unreadable one is
    left out and logged (its partitions then start from the destination's provenance)."""
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in sorted(names):
        if (match := NAME.match(name)) is not None:
            try:
                data = load(directory, int(match.group(1)))
            except (ValueError, CheckpointError) as exc:
                log.warning("checkpoint left out: %s", exc)
                continue
            if data is not None:
                found.append(data)
    return found


def low_water(directory: str, writers: int) -> int | None:
    """Where a replay must start: the lowest low water of the current writers' checkpoints;
    None when one of them has none yet (then from the start of the journal)."""
    lows = []
    for i in range(writers):
        try:
            data = load(directory, i)
        except CheckpointError:
            return None
        if data is None:
            return None
        lows.append(data["low_water"])
    return min(lows) if lows else None


class LowWaters:
    """low_water for a caller that asks every second (the udp_reader, releasing its journal):
    a writer's checkpoint is read again only once its files were replaced (each replace is a
    new file: its inode, size and times change), where every call parsed every writer's
    whole checkpoint (4 ms at 1 000 partitions, 100 ms at 10 000) for one number."""

    def __init__(self, directory: str, writers: int):
        self.directory, self.writers = directory, writers
        self.known: dict = {}  # writer index -> (its files' stamps, its low water)

    def get(self) -> int | None:
        """As low_water(directory, writers)."""
        lows = []
        for i in range(self.writers):
            stamps = (_stamp(path(self.directory, i)), _stamp(changes_path(self.directory, i)))
            known = self.known.get(i)
            if known is None or known[0] != stamps:
                self.known.pop(i, None)
                try:
                    data = load(self.directory, i)
                except CheckpointError:
                    return None
                if data is None:
                    return None
                known = self.known[i] = (stamps, data["low_water"])
            lows.append(known[1])
        return min(lows) if lows else None


def _stamp(where: str) -> tuple | None:
    try:
        st = os.stat(where)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class CheckpointError(Exception):
    pass
