"""The kafka_writers' checkpoints: what the destination has acknowledged, kept beside the journal.

Each writer keeps one file, `checkpoint-<index>.json` in receiver.journal.dir, replaced atomically
(written aside, synced, renamed), with:

- `low_water`: a journal position below which every datagram this writer may have needed is
  written to the destination, reported missing, or a duplicate; the journal is replayed from the
  lowest low water of all writers after any restart;
- `partitions`: per source partition, the ordering state a restart resumes from
  (diode.accounting.ordering.PartitionState.checkpoint);
- `writers`: how many writers there were, so a restart with a different count still finds every
  partition's state (each writer takes the partitions it now owns from every file);
- `time_ms`: when it was written (the missing-records topic is read back from about then).
"""

import json
import logging
import os

log = logging.getLogger("diode.runtime.checkpoints")

VERSION = 1


def path(directory: str, index: int) -> str:
    return os.path.join(directory, f"checkpoint-{index}.json")


def save(directory: str, index: int, low_water: int, partitions: dict, writers: int,
         time_ms: int, sync: bool) -> None:
    """Replace writer `index`'s checkpoint; `partitions` maps (topic, partition) to state."""
    data = {"version": VERSION, "writer": index, "writers": writers, "low_water": low_water,
            "time_ms": time_ms,
            "partitions": [[t, p, s] for (t, p), s in partitions.items()]}
    final = path(directory, index)
    aside = final + ".new"
    with open(aside, "w") as f:
        json.dump(data, f, separators=(",", ":"))
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(aside, final)
    if sync:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def load(directory: str, index: int) -> dict | None:
    """One writer's checkpoint; None if there is none, or it cannot be read (then the log says
    why and the caller starts from the destination's provenance headers)."""
    try:
        with open(path(directory, index)) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path(directory, index)}: {exc}") from None
    if data.get("version") != VERSION:
        raise CheckpointError(f"{path(directory, index)}: version {data.get('version')}, "
                              f"not {VERSION}")
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
        if name.startswith("checkpoint-") and name.endswith(".json"):
            try:
                data = load(directory, int(name[len("checkpoint-"):-len(".json")]))
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


class CheckpointError(Exception):
    pass
