"""What a kafka_reader knows of its sources' incarnations: pure logic, and its memory on disk.

The reader reads by topic name; the watcher (diode.kafka.refresh) tells it each topic's
incarnation (diode.kafka.identity) and each partition's end. A Lineage keeps, per reader:

- the incarnation of every topic read, and each partition's end as last confirmed for it;
- where partitions no longer read stood (`Departed`: their topic gone from the cluster, or
  recreated): a recreation turns them into *retired claims*, which the heartbeats carry
  (diode.kafka.claims) for RETIRED_CLAIM_SECONDS so the receiver reports what of the old
  incarnation never crossed: where its chain started, the last offset handed to the kernel
  (moved on while what was in flight then is sent) and the last offset its source held;
- its memory across its own restarts. A reader the supervisor restarts (a crash, a kill -9; on
  Tansu, librdkafka crashes when a topic it reads is deleted) starts from the committed offsets
  and would not know the incarnation it was reading: a recreation meanwhile would leave the old
  one's end unreported, and on a broker that keeps no commit metadata the old positions,
  committed by name under the new topic, would be taken for the new one's. So at each heartbeat
  after a change (`changed`: ends, departures, retired claims; the reader's own reads, sends
  and assignments) and after a look of the watcher that changed it (the ends it found are known
  at once, not a heartbeat later) the reader records what it knows in `<run dir>/state/`, and a restarted
  reader starts from it as if it had never stopped: the partitions it read count as departed
  until the watcher finds their topics as they were (then they are simply read again) or
  recreated. The file names the topology and the reader count; one of another is not used. A
  whole sender restarted with a new run directory starts without it (docs/reference.md, "Source
  identity", says what that leaves unknown).

What a restart needs grows with the partitions (a 500 KB file at 10 000): the loop only takes a
Picture of it (copies of its tables, which C copies in well under a millisecond), and a Keeper
makes the memory of it and writes it from a thread of its own, a slice of partitions at a time
(the loop's heartbeats never wait for it); pictures taken while it writes are replaced by the
latest, and a reader that stops writes its last before it closes.
"""

import json
import logging
import os
import threading
import time
from collections import deque
from typing import NamedTuple

from diode.kafka import identity
from diode.runtime import files

log = logging.getLogger("diode.kafka.lineage")

RETIRED_CLAIM_SECONDS = 24 * 3600  # how long heartbeats tell of an incarnation that went away
MAX_RETIRED_CLAIMS = 1000          # of how many, at most (the oldest go first)
MEMORY_VERSION = 1
MEMORY_SLICE = 1000                # partitions serialized at a time (other threads run between)
OFFSET_BEGINNING = -2              # (confluent_kafka's logical offset)


class Departed(NamedTuple):
    """Where a partition no longer read stood: its chain's start and the last offset read
    (None: nothing read since it was assigned, at `assigned`), the last handed to the kernel,
    and the messages still in flight then ((message id, last offset of the partition))."""
    start: int | None
    read: int | None
    sent: int
    assigned: int
    inflight: deque


class Retired(NamedTuple):
    """A retired claim as heartbeats carry it ([topic, partition, incarnation, chain start,
    last sent, source end, True]; its last-sent offset moves on as `inflight` is sent), and
    since when."""
    claim: list
    since: float
    inflight: deque


class Lineage:
    def __init__(self):
        self.cluster = ""
        self.incarnations: dict = {}   # topic -> incarnation, as the watcher last said
        self.ends: dict = {}           # (topic, partition) -> end offset (next to be written)
        self.departed: dict = {}       # (topic, partition) -> Departed
        self.retired: dict = {}        # (topic, partition, incarnation) -> Retired
        self.remembered: dict = {}     # topic -> incarnation a restarted reader had read
        self.recreated: set = set()    # topics found recreated: read from their first record
        self.fetched: tuple | None = None  # (when, {(topic, partition): end}) fetches saw
        self.changed = False           # since its memory was last taken (the reader's to clear)

    def incarnation(self, topic: str) -> bytes:
        return self.incarnations.get(topic, identity.NO_INCARNATION)

    def depart(self, tp, start, read, sent: int, assigned: int, inflight) -> None:
        """Partition `tp` is no longer read (see Departed)."""
        self.changed = True
        self.departed[tp] = Departed(start, read, sent, assigned, deque(inflight))

    def recreate(self, topic: str, old: bytes) -> int:
        """`topic` is a new incarnation: its departed partitions become retired claims of
        `old`, its ends are forgotten, and it is read from its first record. Returns how many
        claims."""
        tps = sorted(tp for tp in self.departed if tp[0] == topic)
        self.changed = True
        for tp in tps:
            self._retire(tp, old, self.departed.pop(tp))
        for tp in [tp for tp in self.ends if tp[0] == topic]:
            del self.ends[tp]
        self.fetched = None
        self.recreated.add(topic)
        return len(tps)

    def _retire(self, tp, old: bytes, gone: Departed) -> None:
        start, sent = gone.start, gone.sent
        if start is None:  # nothing read: it stood where it was assigned
            at = 0 if gone.assigned == OFFSET_BEGINNING else gone.assigned
            start, sent = (at, at - 1) if at >= 0 else (-1, -1)
        end = max(self.ends.get(tp, 0) - 1, gone.read if gone.read is not None else -1)
        self.retired[(tp[0], tp[1], old)] = Retired([tp[0], tp[1], old, start, sent, end, True],
                                                    time.monotonic(), gone.inflight)
        while len(self.retired) > MAX_RETIRED_CLAIMS:
            del self.retired[next(iter(self.retired))]

    def confirmed(self, incarnations: dict, ends: dict, started: float,
                  whole: bool = True) -> None:
        """A look of the watcher that began at `started` found these topics as `incarnations`
        (none recreated), with these `ends` (or none). Their departed partitions are simply read
        again.
        The ends kept are the larger of the listed end and what this reader's fetches saw
        before the look began (so, of the same incarnation): some brokers list the end short
        (Tansu: the start of the last batch + 1), a fetch's high watermark is not. A look
        that was not `whole` (it checked the ids of some topics) leaves what the fetches saw of
        the others for a later look."""
        if any(self.incarnations.get(t) != inc for t, inc in incarnations.items()):
            self.changed = True
        self.incarnations.update(incarnations)
        for tp in [tp for tp in self.departed if tp[0] in incarnations]:
            del self.departed[tp]
            self.changed = True
        self._end_at_least(ends)
        if self.fetched is not None and started > self.fetched[0]:
            when, fetched = self.fetched
            self._end_at_least({tp: end for tp, end in fetched.items() if tp[0] in incarnations})
            left = {} if whole else {tp: end for tp, end in fetched.items()
                                     if tp[0] not in incarnations}
            self.fetched = (when, left) if left else None

    def _end_at_least(self, ends: dict) -> None:
        for tp, end in ends.items():
            if end > self.ends.get(tp, 0):
                self.ends[tp] = end
                self.changed = True

    def wants_fetched(self) -> bool:
        """Whether to take what this reader's fetches saw now (see `confirmed`)."""
        return self.fetched is None

    def fetched_now(self, highs: dict) -> None:
        self.fetched = (time.monotonic(), highs)

    def claims(self, sent) -> list:
        """The retired claims of the last RETIRED_CLAIM_SECONDS, each one's last offset sent
        moved on over the messages in flight at the retirement that `sent(message id)` says
        are sent now."""
        now = time.monotonic()
        for key in [k for k, r in self.retired.items() if now - r.since > RETIRED_CLAIM_SECONDS]:
            del self.retired[key]
            self.changed = True
        for r in self.retired.values():
            while r.inflight and sent(r.inflight[0][0]):
                r.claim[4] = max(r.claim[4], r.inflight.popleft()[1])
                self.changed = True
        return [r.claim for r in self.retired.values()]

    def lost_inflight(self) -> None:
        """What was in flight will never be sent (the reader rewound: an incarnation gone is
        not read again)."""
        for gone in [*self.retired.values(), *self.departed.values()]:
            gone.inflight.clear()

    # -- memory --------------------------------------------------------------------------------

    def memory(self, reading: list) -> dict:
        """What a restart needs: `reading` is [topic, partition, chain start, last read, last
        sent, assigned at] of every partition read now."""
        return _memory(reading, self.picture({}, {}, {}, {}))

    def picture(self, assigned: dict, chain_start: dict, last_read: dict,
                positions: dict) -> "Picture":
        """What a restart needs, as it stands now (see Picture): the reader's `assigned`
        (partition -> offset assigned at), `chain_start`, `last_read` and the tracker's
        `positions` (the next offset after what was sent), and this lineage; all copied."""
        return Picture(dict(assigned), dict(chain_start), dict(last_read), dict(positions),
                       self.cluster, dict(self.incarnations), dict(self.remembered),
                       dict(self.ends), dict(self.departed),
                       [(list(r.claim), r.since) for r in self.retired.values()],
                       time.monotonic())

    def restore(self, saved: dict) -> None:
        """Start from what a reader before this restart knew (`load`)."""
        self.cluster = saved["cluster"]
        self.remembered = dict(saved["topics"])
        for t, p, start, read, sent, assigned, end in saved["partitions"]:
            self.departed[(t, p)] = Departed(start, read, sent, assigned, deque())
            self.ends[(t, p)] = end + 1
        now = time.monotonic()
        for claim, age in saved["retired"]:
            self.retired[tuple(claim[:3])] = Retired(claim, now - age, deque())


class Picture(NamedTuple):
    """What a restart of a reader needs, as it stood when taken (Lineage.picture): copies,
    which the loop never changes afterwards, for a Keeper to make its memory of off the loop."""
    assigned: dict      # (topic, partition) -> the offset it was assigned at
    chain_start: dict   # (topic, partition) -> where its chain started
    last_read: dict     # (topic, partition) -> the last offset read
    positions: dict     # (topic, partition) -> the next offset after what was sent
    cluster: str
    incarnations: dict  # (Lineage's, as they were)
    remembered: dict
    ends: dict
    departed: dict
    retired: list       # (claim, since) of each retired claim
    taken: float        # when (time.monotonic)


def sent(tp, positions: dict, chain_start: dict) -> int:
    """The last offset of `tp` handed to the kernel (before its chain's start: nothing)."""
    if tp in positions:
        return positions[tp] - 1
    start = chain_start.get(tp)
    return start - 1 if start is not None else -1


def memory(picture: Picture) -> dict:
    """What a restart needs (as Lineage.memory says it) of a picture."""
    p = picture
    reading = [[t, q, p.chain_start.get((t, q)), p.last_read.get((t, q)),
                sent((t, q), p.positions, p.chain_start), at]
               for (t, q), at in p.assigned.items()]
    return _memory(reading, p)


def _memory(reading: list, p: Picture) -> dict:
    partitions = [[*entry, p.ends.get((entry[0], entry[1]), 0) - 1] for entry in reading]
    partitions += [[t, q, d.start, d.read, d.sent, d.assigned, p.ends.get((t, q), 0) - 1]
                   for (t, q), d in p.departed.items()]
    topics = {t: p.incarnations.get(t) or p.remembered.get(t)
              for t in {e[0] for e in partitions}}
    return {"cluster": p.cluster,
            "topics": {t: inc for t, inc in topics.items() if inc is not None},
            "partitions": [e for e in partitions if topics.get(e[0]) is not None],
            "retired": [(claim, p.taken - since) for claim, since in p.retired]}


class Keeper:
    """Records a reader's memory at `where` (save) from a thread of its own: `keep` hands it a
    Picture and returns at once; the thread makes the memory of the latest picture handed
    and writes it (one handed while it writes replaces any not written yet: what a restart
    needs is the latest). `close` writes the last picture handed before it returns."""

    def __init__(self, where: str, topology: str, readers: int, log=log):
        self.where, self.topology, self.readers, self.log = where, topology, readers, log
        self._picture: Picture | None = None
        self._closing = False
        self._writing = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="lineage-keeper", daemon=True)
        self._thread.start()

    def keep(self, picture: Picture) -> None:
        with self._writing:
            self._picture = picture
            self._writing.notify()

    def close(self, timeout: float = 30.0) -> None:
        with self._writing:
            self._closing = True
            self._writing.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._writing:
                while self._picture is None and not self._closing:
                    self._writing.wait()
                picture, self._picture = self._picture, None
            if picture is None:
                return  # (closing, and everything handed was written)
            try:
                save(self.where, self.topology, self.readers, memory(picture))
            except OSError as exc:
                self.log.warning("cannot record what a restart needs to know in %s: %s",
                                 self.where, exc)


def memory_path(run_dir: str, index: int) -> str:
    return os.path.join(run_dir, "state", f"sender-kafka_reader-{index}.json")


def save(where: str, topology: str, readers: int, memory: dict) -> None:
    """Record a Lineage's memory for `topology` with `readers` readers."""
    os.makedirs(os.path.dirname(where), exist_ok=True)
    files.replace(where, _json({
        "version": MEMORY_VERSION, "topology": topology, "readers": readers,
        "cluster": memory["cluster"],
        "topics": {t: identity.text(inc) for t, inc in memory["topics"].items()},
        "partitions": memory["partitions"],
        "retired": [[[*claim[:2], identity.text(claim[2]), *claim[3:]], age]
                    for claim, age in memory["retired"]]}), sync=False)


def _json(data: dict) -> str:
    """`data` as compact JSON (the text json.dumps gives), its partitions MEMORY_SLICE at a
    time: the encoder holds the GIL for the whole of what it is given, and the reader's loop
    runs between slices."""
    compact = {"separators": (",", ":")}

    def value(key, v) -> str:
        if key != "partitions":
            return json.dumps(v, **compact)
        return "[" + ",".join(json.dumps(v[i:i + MEMORY_SLICE], **compact)[1:-1]
                              for i in range(0, len(v), MEMORY_SLICE)) + "]"
    return "{" + ",".join(f"{json.dumps(k)}:{value(k, v)}" for k, v in data.items()) + "}"


def load(where: str, topology: str, readers: int) -> dict | None:
    """What `save` recorded, incarnations as bytes again; None when there is nothing, or
    nothing this reader may use (logged)."""
    try:
        data = files.read_json(where)
    except (OSError, ValueError) as exc:
        log.warning("%s cannot be read (%s): starting without what it knew", where, exc)
        return None
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("version") != MEMORY_VERSION or \
            data.get("topology") != topology or data.get("readers") != readers:
        said = data if isinstance(data, dict) else {}
        log.warning("%s was written for topology %r with %s reader(s), not %r with %d: not "
                    "used", where, said.get("topology"), said.get("readers"), topology, readers)
        return None
    try:
        data["topics"] = {t: identity.parse(text) for t, text in data["topics"].items()}
        data["retired"] = [([*c[:2], identity.parse(c[2]), *c[3:]], age)
                           for c, age in data["retired"]]
        for entry in data["partitions"]:
            if len(entry) != 7:
                raise ValueError("a partition of another form")
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        log.warning("%s is not what a reader writes (%s): not used", where, exc)
        return None
    if None in data["topics"].values() or any(c[2] is None for c, _ in data["retired"]):
        log.warning("%s names an incarnation that is not one: not used", where)
        return None
    return data
