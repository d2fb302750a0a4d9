"""What the destination cluster already holds, for a receiver that restarts without a usable
checkpoint (new machine, deleted directory) or whose destination got records after the last one.

- `last_written`: per incarnation of a source partition, the highest source offset already
  written, from the provenance headers (sourceTopic, sourcePartition, sourceTopicId, sourceOffset)
  of the destination topic's last records, so nothing is written twice nor reported missing once
  written;
- `last_reported`: per incarnation of a source partition, the missing ranges already written to
  the missing-records topic, so none is reported twice.

Both go by the incarnation (diode.kafka.identity: the source topic's id), never by the topic name
alone: the records of a topic deleted and recreated, or of a cluster rebuilt, say nothing of the
new one's offsets. Records and events that name no incarnation (written by a diode before it
carried them) are not taken for any.

Both read with a consumer of their own that is assigned partitions (never subscribed: no group
join) and read backward from each partition's end in growing chunks. `holdings` answers both for
many destination topics at once (a writer restarting among 2 000 topics): one metadata request,
one ListOffsets request per broker, one consumer assigned every partition, one wait for the true
end, where asking topic by topic cost ~0.7 s a topic. A partition's end is where
reading it reaches partition EOF and then nothing more comes for a moment, never the reported
high watermark: Tansu's ListOffsets "latest" is the first offset of the last batch + 1
(docs/design.md §8), so the records after it are read too.
"""

import logging
import time
import uuid
from typing import NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from diode.errors import DiodeError
from diode.kafka.clients import admin_config
from diode.kafka.messages import Provenance, RangeEvent
from diode.accounting.ranges import merge

log = logging.getLogger("diode.kafka.recovery")

FIRST_CHUNK = 1000   # records read back from a partition's end first; doubled each time after
BATCH = 10_000       # most messages taken by one consume() call
POLL = 0.1           # s: longest wait of one consume() call
QUIET = 0.2          # s: nothing more after partition EOF: the true end is read
QUIET_MAX = 2.0      # s: longest wait for that quiet moment


class Holdings(NamedTuple):
    """What `holdings` read."""
    written: dict          # (source topic, partition, incarnation) -> highest sourceOffset held
    failed: dict           # destination topic -> why it could not be read (its pairs absent)
    reported: dict | None  # last_reported's answer; None when no missing-records topic was asked


def holdings(settings: dict, wanted: dict[str, set], missing_topic: str | None = None,
             since_ms: int | None = None, max_scan: int = 100_000,
             max_reported: int = 1_000_000, timeout: float = 30.0) -> Holdings:
    """What the destination holds of many topics at once: for each destination topic of
    `wanted` (destination topic -> {(source topic, partition, incarnation)}), last_written's
    answer, and with `missing_topic` last_reported's, read with one consumer: the partition
    counts of every topic in one metadata request, their offsets in one ListOffsets request per
    broker, then one read of every partition to its true end (the quiet wait once, not once per
    topic), then the chunks further back of the partitions where something is not found yet,
    together. A topic the cluster refuses (or whose partitions do not answer while the others'
    do) is in `failed`, the others are answered; DiodeError when the cluster cannot be reached,
    or the missing-records topic cannot be read, within `timeout` seconds."""
    started = time.monotonic()
    written: dict[tuple[str, int, bytes], int] = {}
    wanted = {topic: set(pairs) for topic, pairs in wanted.items() if pairs}
    if not wanted and not missing_topic:
        return Holdings({}, {}, None)
    found: dict[tuple[str, int, bytes], list] = {}
    skipped = 0
    with _Reader(settings, timeout) as r:
        counts, failed = r.partitions(sorted(wanted) + ([missing_topic] if missing_topic else []))
        if missing_topic in failed:
            raise DiodeError(f"destination cluster {r.where}: topic {missing_topic}: "
                             f"{failed.pop(missing_topic)}")
        pending: dict[tuple[str, int], set] = {}  # (topic, partition) -> pairs not found there
        for topic, pairs in wanted.items():
            count = counts.get(topic, 0)
            for t, p, inc in pairs if count else ():
                for dp in ([p] if p < count else range(count)):
                    pending.setdefault((topic, dp), set()).add((t, p, inc))
        reported_parts = [(missing_topic, dp) for dp in range(counts.get(missing_topic, 0))] \
            if missing_topic else []
        marks, refused = r.watermarks(sorted(pending) + reported_parts)
        failed.update(refused)
        if missing_topic in failed:
            raise DiodeError(f"destination cluster {r.where}: topic {missing_topic}: "
                             f"{failed.pop(missing_topic)}")
        pending = {key: pairs for key, pairs in pending.items() if key[0] not in failed}
        starts = {key: max(marks[key][0], marks[key][1] - max_reported) for key in reported_parts}
        if since_ms is not None and reported_parts:
            at, refused = r.offsets_at(reported_parts, since_ms)
            if refused:
                raise DiodeError(f"destination cluster {r.where}: topic {missing_topic}: "
                                 f"{refused[missing_topic]}")
            for key, offset in at.items():
                low, high = marks[key]
                # -1: nothing that recent before the reported end; Tansu's end is the start of
                # its last batch, so that batch is read again (and filtered by timestamp)
                starts[key] = max(starts[key], offset if offset >= 0 else high - 1, low)

        def take(key: tuple[str, int], msgs: list) -> None:
            nonlocal skipped
            if key[0] == missing_topic:
                skipped += _events(msgs, since_ms, found)
                return
            here, asked = pending[key], wanted[key[0]]
            for m in msgs:
                p = Provenance.parse(m.headers())
                if p is None:
                    continue  # (not written by diode)
                pair = (p.topic, p.partition, p.incarnation)
                if pair not in asked:
                    continue
                if p.offset > written.get(pair, -1):
                    written[pair] = p.offset
                here.discard(pair)

        scans = {key: _Backward(*marks[key], max_scan) for key in sorted(pending)}
        chunks = {key: s.first() for key, s in scans.items()}
        chunks.update((key, (start, None)) for key, start in starts.items())
        asked_at = time.monotonic()
        empty = {key for key in [*pending, *reported_parts] if marks[key][0] == marks[key][1]}
        while chunks:
            stuck = r.read(chunks, take, empty=empty)
            if stuck:  # (read again on their own: a broker under load may have starved them)
                stuck = r.read({k: c for k, c in chunks.items() if k[0] in stuck}, take,
                               again=True)
            for topic in stuck:
                why = "its partitions do not answer" + \
                    (f" ({r.stuck_error})" if r.stuck_error else "")
                if topic == missing_topic:
                    raise r.unreachable(f"reading {topic}", why)
                failed[topic] = why
            chunks = {key: c for key, s in scans.items()
                      if pending[key] and key[0] not in failed and (c := s.next()) is not None}
    log.info("read what the destination holds of %d topic(s) (%d partition(s)%s) in %.1f s "
             "(%.1f s of metadata and offsets)%s", len(wanted), len(scans),
             f", and {missing_topic}" if missing_topic else "", time.monotonic() - started,
             asked_at - started, f"; {len(failed)} not read" if failed else "")
    if skipped:
        log.warning("%s: %d record(s) are not missing-range events; ignored", missing_topic,
                    skipped)
    for topic in failed:  # (what was found of a topic read in part is not an answer)
        for pair in wanted.get(topic, ()):
            written.pop(pair, None)
    reported = {pair: [list(rg) for rg in merge(ranges)]
                for pair, ranges in sorted(found.items())} if missing_topic else None
    return Holdings(written, failed, reported)


def last_written(settings: dict, destination_topic: str, wanted: set[tuple[str, int, bytes]],
                 max_scan: int = 100_000,
                 timeout: float = 30.0) -> dict[tuple[str, int, bytes], int]:
    """For each (source topic, source partition, incarnation) in `wanted`, the highest
    sourceOffset among the records of `destination_topic` whose provenance headers name it.

    Source partition p is looked for in destination partition p when the destination has more
    than p partitions (the writer keeps the partition number then), otherwise in every
    destination partition (the writer let the partitioner spread it by key). Each destination
    partition is read backward from its end in chunks (1000 records, then doubling) until a
    record of each wanted pair routed there is found, or its start or `max_scan` records back
    from its reported end are reached; the first chunk runs on to the true end. A missing topic
    or empty partitions: those pairs are absent from the result. DiodeError when the cluster
    cannot be reached, or stops answering, or refuses the topic, within `timeout` seconds
    (`holdings` reads many topics at once)."""
    got = holdings(settings, {destination_topic: wanted}, max_scan=max_scan, timeout=timeout)
    if got.failed:
        raise DiodeError(f"destination cluster {settings.get('bootstrap.servers', '?')}: "
                         f"topic {destination_topic}: {got.failed[destination_topic]}")
    return got.written


def last_reported(settings: dict, missing_topic: str, since_ms: int | None = None,
                  max_scan: int = 1_000_000,
                  timeout: float = 30.0) -> dict[tuple[str, int, bytes], list]:
    """Missing ranges already reported: (source topic, source partition, incarnation) -> sorted,
    merged list of [first, last] of the "missing" events of `missing_topic` ("filled" events are
    ignored: the range was reported all the same; events naming no incarnation are left out).
    Read from `since_ms` (record timestamps; the broker's
    offsets_for_times only says where to start, the timestamps decide) or, without it, from the
    last `max_scan` events of each partition, to the true end; never more than `max_scan` back
    from a partition's reported end. A missing topic: {}. DiodeError as last_written's."""
    return holdings(settings, {}, missing_topic, since_ms, max_reported=max_scan,
                    timeout=timeout).reported


def _events(msgs: list, since_ms: int | None, found: dict) -> int:
    """The missing ranges of a run of the missing-records topic's records added to `found`;
    how many records are not events."""
    skipped = 0
    for m in msgs:
        if since_ms is not None and m.timestamp()[1] < since_ms:
            continue
        e = RangeEvent.parse(m.value())
        if e is None:
            skipped += 1
        elif e.kind == "missing" and e.incarnation is not None:
            # (an event naming no incarnation: reported by a diode before incarnations)
            found.setdefault((e.topic, e.partition, e.incarnation), []).append(
                (e.first, e.last))
    return skipped


def all_events(settings: dict, missing_topic: str,
               timeout: float = 30.0) -> list[RangeEvent]:
    """Every event of the missing-records topic still held, each partition's in order (a
    source partition's events are all in one), to the true end, parsed; records that are not
    events are counted in a warning. A missing topic: []."""
    events, skipped = [], 0

    def take(key: tuple[str, int], msgs: list) -> None:
        nonlocal skipped
        for m in msgs:
            e = RangeEvent.parse(m.value())
            if e is None:
                skipped += 1
            else:
                events.append(e)

    with _Reader(settings, timeout) as r:
        counts, failed = r.partitions([missing_topic])
        if failed:
            raise DiodeError(f"destination cluster {r.where}: topic {missing_topic}: "
                             f"{failed[missing_topic]}")
        parts = [(missing_topic, dp) for dp in range(counts[missing_topic])]
        marks, failed = r.watermarks(parts)
        if failed:
            raise DiodeError(f"destination cluster {r.where}: topic {missing_topic}: "
                             f"{failed[missing_topic]}")
        if r.read({key: (marks[key][0], None) for key in parts}, take,
                  empty={key for key in parts if marks[key][0] == marks[key][1]}):
            raise r.unreachable(f"reading {missing_topic}", "its partitions do not answer")
    if skipped:
        log.warning("%s: %d record(s) are not events; ignored", missing_topic, skipped)
    return events


class _Backward:
    """The chunks of one partition, from its end backward: (start, end) with end None for the
    first (read on to the true end), never below the start or `max_scan` before the reported
    end."""

    def __init__(self, low: int, high: int, max_scan: int):
        self.floor = max(low, high - max_scan)
        self.size = FIRST_CHUNK
        self.start = max(self.floor, high - self.size)

    def first(self) -> tuple[int, None]:
        return self.start, None

    def next(self) -> tuple[int, int] | None:
        if self.start <= self.floor:
            return None
        self.size *= 2
        end, self.start = self.start, max(self.floor, self.start - self.size)
        return self.start, end


class _Reader:
    """A consumer of the destination cluster for one call (assigned, never subscribed), and an
    admin client for the metadata and offsets of all its topics at once."""

    def __init__(self, settings: dict, timeout: float):
        self.where = settings.get("bootstrap.servers", "?")
        self.timeout = timeout
        self.paused = []
        self.stuck_error = None  # the last error of a read whose partitions did not all answer
        connect = admin_config(settings)  # what connects; the writer's producer settings stay out
        self.consumer = Consumer({
            **connect,
            "group.id": f"diode-recovery-{uuid.uuid4().hex}",
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",  # a chunk start already deleted: from the start
            # a partition EOF comes after one empty fetch, and a drained queue is refilled at
            # once (the defaults wait 500 ms and 1 s: most of a call's time)
            "fetch.wait.max.ms": 50, "fetch.queue.backoff.ms": 10,
            "logger": log})
        # (asking for metadata never creates a topic, whatever the cluster's
        # auto.create.topics.enable)
        self.admin = AdminClient({**connect, "allow.auto.create.topics": False, "logger": log})

    def __enter__(self) -> "_Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.consumer.close()

    def unreachable(self, what: str, exc) -> DiodeError:
        return DiodeError(f"destination cluster {self.where}: {what} failed within "
                          f"{self.timeout:g} s ({exc}); is it running and reachable with the "
                          "receiver.kafka settings?")

    def _result(self, future, what: str):
        """A future's result; DiodeError when the cluster does not answer (librdkafka's own
        errors: timed out, no broker), KafkaException with the cluster's error otherwise."""
        try:
            return future.result(self.timeout + 5)
        except KafkaException as exc:
            if exc.args[0].code() < 0:
                raise self.unreachable(what, exc) from exc
            raise
        except TimeoutError:
            raise self.unreachable(what, "no answer") from None

    def partitions(self, topics: list) -> tuple[dict, dict]:
        """({topic: its partition count, 0 when it does not exist}, {topic: why the cluster
        refuses to describe it}): all of `topics` in one metadata request."""
        if not topics:
            return {}, {}
        what = f"reading the metadata of {', '.join(topics[:3])}" + \
            (f" and {len(topics) - 3} more" if len(topics) > 3 else "")
        try:
            futures = self.admin.describe_topics(TopicCollection(topics),
                                                 request_timeout=self.timeout)
        except KafkaException as exc:
            raise self.unreachable(what, exc) from exc
        counts, failed = {}, {}
        for topic, future in futures.items():
            try:
                counts[topic] = len(self._result(future, what).partitions)
            except KafkaException as exc:
                # (a topic that does not exist, or cannot: nothing was ever written to it)
                if exc.args[0].code() not in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                              KafkaError.TOPIC_EXCEPTION):
                    failed[topic] = exc.args[0].str()
                counts[topic] = 0
        return counts, failed

    def partition_count(self, topic: str) -> int:
        """How many partitions `topic` has; 0 when it does not exist; DiodeError when the
        cluster refuses to describe it."""
        counts, failed = self.partitions([topic])
        if failed:
            raise DiodeError(f"destination cluster {self.where}: topic {topic}: {failed[topic]}")
        return counts[topic]

    def watermark(self, topic: str, partition: int) -> tuple[int, int]:
        """watermarks() of one partition; DiodeError when the cluster refuses them."""
        marks, failed = self.watermarks([(topic, partition)])
        if failed:
            raise DiodeError(f"destination cluster {self.where}: topic {topic}: {failed[topic]}")
        return marks[(topic, partition)]

    def read_one(self, topic: str, partition: int, chunk: tuple, take) -> None:
        """read() of one partition's chunk, take(messages); DiodeError when it does not
        answer."""
        self.read({(topic, partition): chunk}, lambda _, msgs: take(msgs))

    def _offsets(self, keys: list, spec, what: str) -> tuple[dict, dict]:
        """({(topic, partition): offset as ListOffsets answers `spec`}, {topic: why refused})
        for every key, in one request per broker."""
        if not keys:
            return {}, {}
        try:
            futures = self.admin.list_offsets({TopicPartition(*key): spec for key in keys},
                                              request_timeout=self.timeout)
        except KafkaException as exc:
            raise self.unreachable(what, exc) from exc
        out, failed = {}, {}
        for tp, future in futures.items():
            try:
                out[(tp.topic, tp.partition)] = self._result(future, what).offset
            except KafkaException as exc:
                failed[tp.topic] = exc.args[0].str()
        return out, failed

    def watermarks(self, keys: list) -> tuple[dict, dict]:
        """({(topic, partition): (low, high)} as the broker reports them (Tansu's high may be
        short of the end), {topic: why refused})."""
        what = f"listing the offsets of {len(keys)} partition(s)"
        lows, failed = self._offsets(keys, OffsetSpec.earliest(), what)
        highs, refused = self._offsets([k for k in keys if k[0] not in failed],
                                       OffsetSpec.latest(), what)
        failed.update(refused)
        return {k: (lows[k], highs[k]) for k in keys if k[0] not in failed}, failed

    def offsets_at(self, keys: list, ms: int) -> tuple[dict, dict]:
        """({(topic, partition): the first offset at or after timestamp `ms`, -1: none},
        {topic: why refused})."""
        return self._offsets(keys, OffsetSpec.for_timestamp(ms),
                             f"looking up the offsets at {ms} ms")

    def read(self, chunks: dict, take, again: bool = False, empty=frozenset()) -> set:
        """Read each partition's chunk, (topic, partition) -> (start, end): to `end`
        (exclusive), or with end None to the true end, calling take((topic, partition),
        messages) with its records in order; all of them with one assignment, and the wait
        for the true end once, unless every partition read to its end is in `empty` (listed
        with its log start at its end: empty for Apache Kafka and Tansu alike) and none of them
        gave a record. Returns the topics of the partitions that never answered while others
        did (or, `again`: the partitions of a read where others answered); DiodeError when
        none answered within the timeout."""
        c = self.consumer
        if self.paused:  # before assign(): a resume after it would not wake the fetcher
            c.resume(self.paused)
            self.paused = []
        c.assign([TopicPartition(*key, start) for key, (start, _) in chunks.items()])
        pos = {key: start for key, (start, _) in chunks.items()}
        open_ = set(chunks)
        to_end = any(end is None for _, end in chunks.values())
        last_news, error, answered = time.monotonic(), None, again
        while open_:
            # As many messages as the bounded chunks still hold: consume() returns at once
            # instead of waiting out its timeout for a batch that cannot fill.
            want = sum(chunks[k][1] - pos[k] for k in open_ if chunks[k][1] is not None)
            msgs = c.consume(BATCH if to_end else max(1, min(BATCH, want)), POLL)
            now = time.monotonic()
            if msgs:
                last_news = now
            elif now - last_news > self.timeout:
                if answered:  # (some partitions answered: only the others' topics fail)
                    self.stuck_error = error
                    return {key[0] for key in open_}
                raise self.unreachable(
                    f"reading {', '.join(sorted({k[0] for k in open_})[:3])} (at "
                    f"{dict(sorted(pos.items())[:5])})", error or "no answer")
            before = len(open_)
            error = self._take(msgs, chunks, pos, open_, take) or error
            answered = answered or len(open_) < before or any(m.error() is None for m in msgs)
        if to_end and any(end is None and (key not in empty or pos[key] != start)
                          for key, (start, end) in chunks.items()):
            # Past every partition EOF, until nothing comes for a moment: the true end (Tansu's
            # listed end is its last batch's first offset + 1, and its end of partition may come
            # there). What a running writer keeps adding after QUIET_MAX is not waited for. A
            # partition listed empty has no last batch: its end of partition is its end (a
            # writer's first start on empty topics waited QUIET for nothing).
            until = time.monotonic() + QUIET_MAX
            unbounded = {k: (s, e) for k, (s, e) in chunks.items() if e is None}
            while msgs := c.consume(BATCH, QUIET):
                self._take(msgs, unbounded, pos, set(), take)
                if time.monotonic() > until:
                    break
        return set()

    def _take(self, msgs, chunks, pos, open_, take):
        """Sort a consume() batch out by partition; close chunks that are read."""
        runs: dict[tuple[str, int], list] = {}
        error = None
        for m in msgs:
            err = m.error()
            key = (m.topic(), m.partition())
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if key in chunks:
                        self._close(key, open_, chunks[key][1] is not None)
                elif err.fatal():
                    raise DiodeError(f"destination cluster {self.where}: {err}")
                else:
                    error = err  # transient: librdkafka retries; reported if nothing comes
                continue
            if key not in chunks:
                continue
            end = chunks[key][1]
            offset = m.offset()
            if end is not None and offset >= end:
                self._close(key, open_, True)
                continue
            runs.setdefault(key, []).append(m)
            pos[key] = offset + 1
            if end is not None and offset + 1 >= end:
                self._close(key, open_, True)
        for key, run in runs.items():
            take(key, run)
        return error

    def _close(self, key: tuple[str, int], open_: set, bounded: bool) -> None:
        if key in open_:
            open_.discard(key)
            if bounded:  # no fetching on into what is read already
                tp = TopicPartition(*key)
                self.consumer.pause([tp])
                self.paused.append(tp)
