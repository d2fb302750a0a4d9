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
  each partition's end too (a marked watcher, below: between listings only the topics read
  since they were last checked, and at a listing the ends of topics without an id);
- every `state` seconds (source.state.interval.ms), the source's state: each partition's log
  start and end, each topic's retention settings, which the reader sends across the link.

A kafka_reader's watcher is `marked`: its reader's consumer fetches every partition it reads
every fetch.wait.max.ms even when nothing comes, and each fetch response carries the
partition's log start and end (its watermarks), which the reader hands over, without a request,
before each look at the state. That look lists (ListOffsets) the log start and end only of the
partitions whose watermarks moved since they were last listed, never listed yet, or whose turn
it is (every partition at least every STATE_TURN_LOOKS looks, should a fetch have stopped); the
others' are as last listed. A partition the reader gives no watermarks of (not fetched yet, or
its watermarks not taken yet: over thousands of partitions the reader takes them in turn) is
listed when it first gives some, and in its turn meanwhile: it is not listed at every look. A reader held back since the last look (its
consumer stops fetching what waits) hands none, and everything is listed. Its listings between
ask the ends only of topics without an id (whose recreation only their ends tell); the ends of
what it reads come from its fetches (diode.kafka.lineage). Each topic's settings are described
at its first look at the state and then in turn (each within STATE_TURN_LOOKS looks). Its looks
between listings check the ids only of the topics the reader read records of since they were
last checked (`read`: a topic recreated and refilled is read, so checked at the next look) and
of those with partitions not handed over; a listing checks them all. At 1 000 idle partitions
of 200 topics that is about 170 partitions listed and 34 topics described every 10 s, and no
id checked between listings, where 1 000 ends were listed every 5 s, 1 000 log starts and 200
topics' configs every 10 s, and 200 ids every second.

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
STATE_TURN_LOOKS = 6  # a marked watcher lists every partition's log start and end, and
#                       describes every topic's settings, at least every this many looks at
#                       the source's state, moved or not
MARKS_WAIT = 1.0       # how long a marked watcher waits for its reader's watermarks


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
    whole: bool = True  # whether every topic's id was checked (else those of `incarnations`)


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


class Turns:
    """A turn through a set of keys: each call names the next ceil(keys / looks) of them, in
    sorted order, so that every key is named at least once in `looks` calls."""

    def __init__(self, looks: int):
        self.looks, self.at = looks, 0

    def next(self, keys) -> set:
        ordered = sorted(keys)
        n = len(ordered)
        if not n:
            return set()
        per = -(-n // self.looks)
        turn = self.at % n
        self.at = turn + per
        return set(ordered[turn:turn + per]) | set(ordered[:max(0, turn + per - n)])


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
                 state: float | None = None, marked: bool = False):
        self.config, self.owned, self.interval = config, owned, interval
        self.check = min(interval, check) if check else interval
        self.state = state  # seconds between looks at the source's state (None: never)
        # marked: the reader hands its fetches' watermarks before each look at the source's
        # state (wants_marks, give_marks), and only what moved is listed (see the module)
        self.marked = marked
        self._want_marks = threading.Event()
        self._marks_given = threading.Event()
        self._marks: dict | None = None
        self._listed: dict = {}   # (topic, partition) -> its watermarks when last listed
        self._starts: dict = {}   # (topic, partition) -> its log start as last listed
        self._unnamed: set = set()  # topics whose broker gave no id at the last look
        self._settings: dict = {}  # topic -> its settings as last described
        self._read: dict = {}      # topics the reader read records of since they were checked
        #                            -> when handed (a count): one handed again during a look
        #                            that checked it is checked again at the next
        self._read_count = 0
        self._read_lock = threading.Lock()
        self._pairs_turn = Turns(STATE_TURN_LOOKS)  # partitions listed in turn
        self._topics_turn = Turns(STATE_TURN_LOOKS)  # topics whose settings are described
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

    def read(self, topics: set) -> None:
        """(Marked) the reader read records of `topics`: their ids are checked at the next
        look (the others' at each listing)."""
        with self._read_lock:
            self._read_count += 1
            self._read.update(dict.fromkeys(topics, self._read_count))

    def wants_marks(self) -> bool:
        """(Marked) whether a look at the source's state waits for the reader's watermarks."""
        return self._want_marks.is_set()

    def give_marks(self, marks: dict | None) -> None:
        """(Marked) the reader's fetches' watermarks: (topic, partition) -> (log start, end)
        as its consumer last fetched them, of the partitions it fetches now; None when they
        may be behind (the reader held back: its consumer stops fetching what waits)."""
        self._marks = marks
        self._want_marks.clear()
        self._marks_given.set()

    def _take_marks(self) -> dict | None:
        """(Marked) ask the reader for its watermarks and wait MARKS_WAIT for them at most
        (None: not given, everything is listed)."""
        self._marks, self._marks_given = None, threading.Event()
        self._want_marks.set()
        self._marks_given.wait(MARKS_WAIT)
        self._want_marks.clear()
        return self._marks

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
                marks = self._take_marks() if stating and self.marked else None
                found = self._look(client, admin, listing, woken, stating, marks)
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

    def _look(self, client, admin, listing: bool, woken: bool, stating: bool = False,
              marks: dict | None = None) -> Found:
        """The topics (when `listing`), the incarnations, and the ends (when listing, woken or
        `stating`: the ends cost a request per partition leader, the ids one); with `stating`
        the log starts and the topics' retention settings too. A marked watcher lists the
        ends and starts of fewer partitions (_listed_pairs). What the cluster did not answer
        for is left out (`Found.waiting`); the look fails only when nothing answered."""
        started = time.monotonic()
        unready = Unready()
        chosen: dict = {}  # (the pairs _listed_pairs chose, once per look)

        def listed(owned: set) -> set:
            if "pairs" not in chosen:
                chosen["pairs"] = self._listed_pairs(owned, listing, woken, stating, marks)
            return chosen["pairs"] & owned
        with self._read_lock:
            read = dict(self._read)
        # (a marked watcher's looks between listings check the ids of the topics read since,
        # and of those with partitions not handed over yet: _checked)
        checked = self._checked(set(read)) if self.marked and not (
            listing or woken or stating) else None
        try:
            if listing or not self._counts:
                self._list(admin)
            owned, ends, ids, asked = self._identify(admin, listed, unready, checked)
            if not listing and (set(ids) | set(unready.topics) != asked or any(
                    self._identities.known.get(t, inc) != inc for t, inc in ids.items()
                    if inc != NO_INCARNATION)):
                # a topic went, or came back as another: its partitions may be others now
                listing = True
                self._list(admin)
                unready = Unready()
                owned, ends, ids, asked = self._identify(admin, lambda owned: owned, unready)
            unnamed = {t for t, inc in ids.items() if inc == NO_INCARNATION}
            self._unnamed = unnamed
            for t in unnamed:
                ids[t] = self._fallback(client, t, owned, ends)
            unasked = {t for t, _ in owned} - asked  # (neither gone nor come)
            resets, gone = self._identities.update(
                ids, set(unready.topics) | self._troubled | unasked)
            forget = set(resets) | set(gone)
            if forget:
                self._handed = {tp for tp in self._handed if tp[0] not in forget}
                self._listed = {tp: m for tp, m in self._listed.items() if tp[0] not in forget}
                self._starts = {tp: s for tp, s in self._starts.items() if tp[0] not in forget}
                self._settings = {t: s for t, s in self._settings.items() if t not in forget}
            unhanded = owned - self._handed
            new = sorted(tp for tp in unhanded if tp[0] in ids)
            committed = self._committed(client, new, unready)
            kept = {tp for tp in owned if tp[0] in ids and tp[0] not in resets}
            starts = self._state_starts(admin, kept, listed(kept), ends, marks, unready) \
                if stating else {}
            settings = self._state_settings(admin, {t for t, _ in kept}, unready) \
                if stating else {}
        except KafkaException as exc:  # (a timeout too: tried again next time)
            return Found({}, [], str(exc))
        with self._read_lock:
            for t in asked & read.keys():
                if self._read.get(t) == read[t]:
                    del self._read[t]
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
                     waiting, asked == {t for t, _ in owned})

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

    def _identify(self, admin, ends_of: Callable[[set], set], unready: Unready,
                  checked: Callable[[set], set] | None = None) -> tuple:
        """(owned pairs, the ends of those `ends_of(owned)` names, the incarnations of their
        topics or of those `checked(owned)` names, the topics asked), the ends asked first;
        what the cluster did not answer for in `unready`."""
        owned = self.owned(self._counts)
        ends = end_offsets(admin, ends_of(owned), unready)
        topics = {t for t, _ in owned}
        asked = topics if checked is None else checked(owned) & topics
        return owned, ends, topic_ids(admin, sorted(asked), unready), asked

    def _checked(self, read: set) -> Callable[[set], set]:
        """(Marked) which topics a look between listings checks the ids of: those the reader
        read records of since they were last checked (a topic recreated and refilled is read,
        and its records are labelled with the new incarnation from the next look on, as with
        every topic checked), and those with partitions not handed over (handed over only with
        their id). A topic recreated with nothing read is seen at the next listing, or at once
        when the reader's position falls outside it (wake)."""
        def checked(owned: set) -> set:
            return read | {t for t, _ in owned - self._handed}
        return checked

    def _listed_pairs(self, owned: set, listing: bool, woken: bool, stating: bool,
                      marks: dict | None) -> set:
        """Of the `owned` pairs, those a look lists the end (and, `stating`, the log start)
        of: all of them when listing, woken or stating, unless marked. A marked watcher lists
        them all when woken, at its first look at the state and when the reader gave no
        watermarks; else at a listing the ends of the topics without an id (a recreation of
        one is told by its ends), and at a look at the state those of the partitions whose
        watermarks moved since they were last listed (a partition it gave none of when last
        listed counts as moved once it gives some), or never listed, and of a turn of the others: every partition is listed at least every
        STATE_TURN_LOOKS looks at the state, moved or not."""
        if not (listing or woken or stating):
            return set()
        if not self.marked or woken or (stating and (marks is None or not self._starts)):
            return set(owned)
        pairs = {tp for tp in owned if tp[0] in self._unnamed} if listing else set()
        if not stating:
            return pairs
        listed = self._listed
        pairs |= self._pairs_turn.next(owned)
        pairs.update(tp for tp in owned if tp not in listed or marks.get(tp) != listed[tp])
        return pairs

    def _state_settings(self, admin, topics: set, unready: Unready) -> dict:
        """The retention settings of `topics`; a marked watcher describes those of a turn of
        them and of those it never described (a topic's 33 configs on Apache Kafka, whatever
        is asked: the largest cost of an idle look), and gives the others' as last described."""
        if not self.marked:
            return topic_settings(admin, sorted(topics), unready)
        asked = self._topics_turn.next(topics) | (topics - self._settings.keys())
        self._settings.update(topic_settings(admin, sorted(asked), unready))
        return {t: self._settings[t] for t in topics if t in self._settings}

    def _state_starts(self, admin, kept: set, asked: set, ends: dict, marks: dict | None,
                      unready: Unready) -> dict:
        """The log starts of the `kept` pairs, listed for those `asked`; a marked watcher keeps
        what it listed, gives the others' as last listed, and notes each listed pair's
        watermarks (the reader's, as they were before the listing, None where it gave none;
        a pair whose start or end was not answered: listed again next)."""
        starts = start_offsets(admin, asked, unready)
        if not self.marked:
            return starts
        self._starts.update(starts)
        for tp in asked:
            if tp in starts and tp in ends and marks is not None:
                # (None: the reader gave none; listed again once it gives some, or in turn)
                self._listed[tp] = marks.get(tp)
            else:
                self._listed.pop(tp, None)
        return {tp: self._starts[tp] for tp in kept if tp in self._starts}

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
