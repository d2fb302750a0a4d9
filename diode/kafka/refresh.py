"""Which source partitions a reader should read, and which incarnation each is, found off its loop.

Asking a cluster for its topics, and for the committed offsets of new partitions, waits on the
cluster: seconds when it is slow or unreachable. A kafka_reader asking in its own loop stops for
that long, and so do its heartbeats, and the receiver takes a slow source cluster for a dead link.
A PartitionWatcher asks from a thread of its own, with clients of its own (a confluent_kafka
client is not shared with the loop's), and hands what it found to the loop through a small
queue: the loop never waits on the cluster.

It looks in three ways:

- every `interval` seconds (refresh.topics.interval.seconds), the cluster's topics: new topics
  and partitions, handed over with their committed offsets;
- every `check` seconds (identity.check.interval.ms), the incarnation of each topic the reader
  reads (diode.kafka.identity: its topic id); with the listing, and when the loop wakes it,
  each partition's end too;
- every `state` seconds (source.state.interval.ms), the source's state: each partition's log
  start and end, each topic's retention settings, which the reader sends across the link.

A look hands over what the cluster answered: a partition whose leader is not elected yet, or
whose committed offset, end or topic id the cluster did not give this time (a broker making
the logs of thousands of new partitions answers for them one by one, over minutes), is left out
of it (`Found.waiting`, with why) and asked for again at the next look, RETRY_SECONDS later at
most, while the others are read: one partition not ready never holds up the rest. A topic not
answered for is not taken as gone. Only a look at which nothing answered fails whole.

A topic whose id changed was deleted and recreated (or its cluster rebuilt): it is handed over
again as a reset, its partitions anew with the committed offsets that belong to the new
incarnation; a topic gone from the cluster is handed over as gone. The ends are taken before
the ids, so an end handed over with an unchanged id is the end of that incarnation.

Committed offsets carry the incarnation they were committed for in their metadata
(identity.metadata); an offset committed for another incarnation (a recreated topic whose group
offsets survived, a cluster restored under the same group) is never used.
"""

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import wait
from typing import NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType

from diode.kafka import identity
from diode.kafka.clients import admin_config
from diode.link.records import NO_INCARNATION
from diode.link.wire import UNKNOWN

COMMITTED_TIMEOUT = 10.0
REQUEST_TIMEOUT = 10.0
RETRY_SECONDS = 1.0


class Found(NamedTuple):
    counts: dict        # topic -> partition count (empty when only the identities were checked)
    new: list           # TopicPartition of partitions not handed over before, with the
    #                     committed offset (negative: none, or one of another incarnation)
    error: str | None   # why the cluster could not be read this time (the rest empty)
    cluster: str = ""   # the source cluster's id
    incarnations: dict = {}  # topic -> incarnation (16 bytes), of the topics read
    ends: dict = {}     # (topic, partition) -> end offset (next to be written) of the
    #                     incarnation in `incarnations`
    resets: dict = {}   # topic -> (old incarnation, new one): the topic was recreated
    gone: list = []     # topics read until now and no longer in the cluster
    stale: list = []    # (topic, partition, offset): committed for another incarnation, unused
    unnamed: set = set()  # topics whose broker gives no id (their incarnation a fallback)
    started: float = 0.0  # when the look began (time.monotonic)
    starts: dict = {}   # (topic, partition) -> log start: the first offset the source holds
    #                     (only in a look at the source's state, every `state` seconds)
    settings: dict = {}  # topic -> (retention.ms, retention.bytes, cleanup.policy), the same
    waiting: dict = {}  # (topic, partition) not handed over (no id, no committed offset
    #                     answered) -> why: asked for again at the next look


class Unready:
    """What the cluster did not answer for in one look, and why (the first reason of each
    kind kept): partitions, and topics whose id it did not give."""

    def __init__(self):
        self.partitions: dict = {}  # (topic, partition) -> why
        self.topics: dict = {}      # topic -> why

    def partition(self, tp, why: str) -> None:
        self.partitions.setdefault(tp, why)

    def topic(self, topic: str, why: str) -> None:
        self.topics.setdefault(topic, why)


class Identities:
    """The incarnation of each topic a reader reads, as last seen, and what a new look means:
    pure logic, tested alone."""

    def __init__(self, known: dict | None = None):
        # topic -> incarnation last seen (kept while a topic is gone); `known`: what a
        # restarted reader knew (diode.kafka.lineage)
        self.known: dict = dict(known or {})
        self.present: set = set(self.known)  # topics seen in the last look

    def update(self, ids: dict, unsure=()) -> tuple[dict, list]:
        """`ids`: topic -> incarnation of the topics the reader reads that the cluster has now;
        `unsure`: topics it has whose id it did not give this time (neither gone nor come).
        Returns (resets: topic -> (old, new), gone: topics that were there and are not)."""
        resets = {t: (self.known[t], inc) for t, inc in ids.items()
                  if t in self.known and self.known[t] != inc}
        gone = sorted(self.present - set(ids) - set(unsure))
        self.known.update(ids)
        self.present = set(ids) | (self.present & set(unsure))
        return resets, gone


class Looker:
    """A thread that asks a cluster for a worker's loop, with clients of its own, and hands
    what it found to the loop through a bounded queue (`found`): the loop never waits on the
    cluster. Subclasses give `name` and `_run`, which ends once `_stop` is set."""

    name = "looker"

    def __init__(self, handed: int):
        self.found: queue.Queue = queue.Queue(maxsize=handed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def take(self) -> list:
        """What was found since the last call, oldest first (never waits)."""
        return taken(self.found)

    def close(self, timeout: float = REQUEST_TIMEOUT + 5) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        raise NotImplementedError


class PartitionWatcher(Looker):
    """`owned(counts)` -> the (topic, partition) pairs this reader reads, of those counts.
    `config`: the source consumer's settings (its group's committed offsets are read)."""

    name = "partition-watcher"

    def __init__(self, config: dict, owned: Callable[[dict], set], interval: float,
                 check: float | None = None, known: dict | None = None,
                 state: float | None = None):
        self.config, self.owned, self.interval = config, owned, interval
        self.check = min(interval, check) if check else interval
        self.state = state  # seconds between looks at the source's state (None: never)
        super().__init__(4)
        self._wake = threading.Event()
        self._handed: set = set()  # pairs whose committed offsets went to the loop
        self._counts: dict = {}    # the last topic listing
        self._troubled: set = set()  # topics it named with an error
        self._cluster = ""
        self._identities = Identities(known)
        self._renew: set = set()   # topics without an id found recreated by the loop

    def wake(self) -> None:
        """Look at the identities now (the loop saw a partition's offsets move back)."""
        self._wake.set()

    def close(self, timeout: float = COMMITTED_TIMEOUT + 5) -> None:
        self._wake.set()
        super().close(timeout)

    def _run(self) -> None:
        client = Consumer(self.config)
        admin = AdminClient(admin_config(self.config))
        next_listing = next_state = 0.0
        woken = False
        try:
            while not self._stop.is_set():
                listing = time.monotonic() >= next_listing
                stating = self.state is not None and time.monotonic() >= next_state
                found = self._look(client, admin, listing, woken, stating)
                if listing and found.error is None:
                    next_listing = time.monotonic() + self.interval
                if stating and found.error is None:
                    next_state = time.monotonic() + self.state
                self._hand(found)
                # (a failure, often a coordinator still loading at start, is retried soon, and
                # so is what the cluster did not answer for)
                woken = self._wake.wait(self.check if found.error is None and not found.waiting
                                        else min(self.check, RETRY_SECONDS))
                self._wake.clear()
        finally:
            client.close()

    def _look(self, client, admin, listing: bool, woken: bool, stating: bool = False) -> Found:
        """The topics (when `listing`), the incarnations, and the ends (when listing, woken or
        `stating`: the ends cost a request per partition leader, the ids one); with `stating`
        the log starts and the topics' retention settings too. What the cluster did not answer
        for is left out (`Found.waiting`); the look fails only when nothing answered."""
        started = time.monotonic()
        unready = Unready()
        try:
            if listing or not self._counts:
                self._list(admin)
            owned, ends, ids = self._identify(admin, listing or woken or stating, unready)
            if not listing and (set(ids) | set(unready.topics) != {t for t, _ in owned} or any(
                    self._identities.known.get(t, inc) != inc for t, inc in ids.items()
                    if inc != NO_INCARNATION)):
                # a topic went, or came back as another: its partitions may be others now
                listing = True
                self._list(admin)
                unready = Unready()
                owned, ends, ids = self._identify(admin, True, unready)
            unnamed = {t for t, inc in ids.items() if inc == NO_INCARNATION}
            for t in unnamed:
                ids[t] = self._fallback(client, t, owned, ends)
            resets, gone = self._identities.update(ids, set(unready.topics) | self._troubled)
            forget = set(resets) | set(gone)
            if forget:
                self._handed = {tp for tp in self._handed if tp[0] not in forget}
            unhanded = owned - self._handed
            new = sorted(tp for tp in unhanded if tp[0] in ids)
            committed = self._committed(client, new, unready)
            kept = {tp for tp in owned if tp[0] in ids and tp[0] not in resets}
            starts = start_offsets(admin, kept, unready) if stating else {}
            settings = topic_settings(admin, sorted({t for t, _ in kept}), unready) \
                if stating else {}
        except KafkaException as exc:  # (a timeout too: tried again next time)
            return Found({}, [], str(exc))
        stale = []
        for tp in committed:
            said, _ = identity.from_metadata(tp.metadata)
            # After a reset only what was committed for the new incarnation counts: a broker
            # that keeps no metadata (Tansu) may hold the old one's positions under the new.
            if tp.offset >= 0 and (said not in (None, ids[tp.topic]) or
                                   (tp.topic in resets and said is None)):
                stale.append((tp.topic, tp.partition, tp.offset))
                tp.offset = -1001  # OFFSET_INVALID: none
        self._handed.update((tp.topic, tp.partition) for tp in committed)
        confirmed = {tp: end for tp, end in ends.items() if tp[0] in ids and tp[0] not in resets}
        waiting = {tp: why for tp, why in unready.partitions.items() if tp not in self._handed}
        waiting.update((tp, unready.topics[tp[0]]) for tp in unhanded
                       if tp[0] in unready.topics)
        return Found(dict(self._counts) if listing else {}, committed, None, self._cluster,
                     ids, confirmed, resets, gone, stale, unnamed, started, starts, settings,
                     waiting)

    def _committed(self, client, new: list, unready: Unready) -> list:
        """The committed offsets of the `new` pairs that the cluster answered for (those it
        did not: `unready`, asked again at the next look)."""
        if not new:
            return []
        try:
            answered = client.committed([TopicPartition(t, p) for t, p in new],
                                        timeout=COMMITTED_TIMEOUT)
        except KafkaException as exc:  # (the group's coordinator: none of them answered)
            for tp in new:
                unready.partition(tp, f"committed offset: {exc.args[0].str()}")
            return []
        out = []
        for tp in answered:
            if tp.error is not None:
                unready.partition((tp.topic, tp.partition),
                                  f"committed offset: {tp.error.str()}")
            else:
                out.append(tp)
        return out

    def _list(self, admin) -> None:
        # (by the admin client: its listing refreshes the metadata its offset requests use,
        # which would otherwise not know the partitions added to a topic for minutes)
        md = admin.list_topics(timeout=REQUEST_TIMEOUT)
        self._cluster = md.cluster_id or ""
        self._counts = {name: len(t.partitions) for name, t in md.topics.items()
                        if t.error is None}
        # (a topic the listing names with an error, a leader not elected yet, is not gone)
        self._troubled = {name for name, t in md.topics.items() if t.error is not None}

    def _identify(self, admin, with_ends: bool, unready: Unready) -> tuple:
        """(owned pairs, their ends or {}, the incarnations of their topics), the ends asked
        first; what the cluster did not answer for in `unready`."""
        owned = self.owned(self._counts)
        ends = end_offsets(admin, owned, unready) if with_ends else {}
        return owned, ends, topic_ids(admin, sorted({t for t, _ in owned}), unready)

    def _fallback(self, client, topic: str, owned: set, ends: dict) -> bytes:
        """The incarnation of a topic whose broker gives no id (diode.kafka.identity): the one
        already known; else the one its committed offsets name, if they are not past its
        partitions' ends (a recreated topic starts again at 0); else a new one."""
        known = self._identities.known.get(topic)
        if topic in self._renew:
            self._renew.discard(topic)
        elif known is not None:
            return known
        else:
            mine = [TopicPartition(t, p) for t, p in sorted(owned) if t == topic]
            for tp in client.committed(mine, timeout=COMMITTED_TIMEOUT) if mine else []:
                said, _ = identity.from_metadata(tp.metadata)
                if said is not None and 0 <= tp.offset <= ends.get((topic, tp.partition), -1):
                    return said
        return identity.fallback(self._cluster, topic, str(int(time.time() * 1000)))

    def renew(self, topic: str) -> None:
        """A topic without a topic id whose offsets went back below what was read: it was
        recreated; the next look gives it a new incarnation."""
        self._renew.add(topic)
        self._wake.set()

    def _hand(self, found: Found) -> None:
        hand(self.found, found, self._stop)


def taken(q: queue.Queue) -> list:
    """What a helper thread handed to the loop through `q`, oldest first (never waits)."""
    out = []
    while True:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            return out


def hand(q: queue.Queue, item, stop: threading.Event) -> None:
    """From a helper thread: `item` to the loop through `q`, a bounded queue; while it is full
    (the loop is busy: it takes them in order when it can), wait, unless `stop` is set."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.5)
            return
        except queue.Full:
            continue


def topic_ids(admin, topics: list, unready: Unready | None = None) -> dict:
    """topic -> incarnation (NO_INCARNATION where the broker gives no topic id) of those of
    `topics` the cluster has; one that it does not have is left out, and so is one it did
    not answer for (in `unready`; without it, that fails the call)."""
    if not topics:
        return {}
    futures = admin.describe_topics(TopicCollection(topics), request_timeout=REQUEST_TIMEOUT)
    return {topic: identity.from_uuid(described.topic_id) for topic, described in answers(
        futures, lambda topic, why: unready.topic(topic, f"topic id: {why}"),
        unready is not None)}


def answers(futures: dict, unanswered, partial: bool = True):
    """(key, result) of each of an admin request's `futures` that answered within
    REQUEST_TIMEOUT + 5 s (all of them waited for together); a key the cluster does not have
    (deleted meanwhile) is left out. One that failed otherwise, or did not answer in time, is
    left out too, told to `unanswered(key, why)`, when `partial` and something else answered;
    else a KafkaException is raised (nothing answered: the cluster could not be read)."""
    wait(futures.values(), timeout=REQUEST_TIMEOUT + 5)
    out, failed = [], None
    for key, future in futures.items():
        if not future.done():  # (a TimeoutError from result() ended the watcher's thread)
            exc = KafkaException(KafkaError(KafkaError._TIMED_OUT, "no answer in time"))
        else:
            try:
                out.append((key, future.result(0)))
                continue
            except KafkaException as caught:
                exc = caught
            if exc.args[0].code() in UNKNOWN_TOPIC_CODES:
                continue  # (deleted meanwhile)
        if not partial:
            raise exc
        failed = failed or exc
        unanswered(key, exc.args[0].str())
    if failed is not None and not out:
        raise failed
    return out


def end_offsets(admin, pairs, unready: Unready | None = None) -> dict:
    """(topic, partition) -> end offset (the next to be written). A partition the cluster no
    longer has is left out, and one it did not answer for (see topic_ids)."""
    return _offsets(admin, pairs, OffsetSpec.latest(), unready is not None)


def start_offsets(admin, pairs, unready: Unready | None = None) -> dict:
    """(topic, partition) -> log start (the first offset the partition still holds)."""
    return _offsets(admin, pairs, OffsetSpec.earliest(), unready is not None)


SETTINGS = ("retention.ms", "retention.bytes", "cleanup.policy")


def topic_settings(admin, topics: list, unready: Unready | None = None) -> dict:
    """topic -> (retention.ms, retention.bytes, cleanup.policy) as the cluster says them
    (wire.UNKNOWN, or "" for the policy, where it does not: Tansu gives only what was set)."""
    return {topic: (_long(said.get("retention.ms")), _long(said.get("retention.bytes")),
                    said.get("cleanup.policy", ""))
            for topic, said in topic_configs(admin, topics, SETTINGS, unready).items()}


def topic_configs(admin, topics: list, names: list, unready: Unready | None = None) -> dict:
    """topic -> {config: value} of `names` as the cluster describes them (those it says
    nothing of, or gives no value, left out; a topic it did not answer for, see topic_ids)."""
    if not topics or not names:
        return {}
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics],
                                     request_timeout=REQUEST_TIMEOUT)
    # (a topic whose settings were not answered is simply not in this look: not `waiting`)
    return {resource.name: {k: str(described[k].value) for k in names
                            if k in described and described[k].value is not None}
            for resource, described in answers(futures, lambda *_: None, unready is not None)}


def _long(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return UNKNOWN


def _offsets(admin, pairs, spec, partial: bool) -> dict:
    if not pairs:
        return {}
    futures = admin.list_offsets({TopicPartition(t, p): spec for t, p in pairs},
                                 request_timeout=REQUEST_TIMEOUT)
    # (an end or a start not answered is not `waiting`: the partition is read without it, and
    # the next look asks again)
    return {(tp.topic, tp.partition): info.offset
            for tp, info in answers(futures, lambda *_: None, partial)}


UNKNOWN_TOPIC_CODES = {3, 100}  # UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID
