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
join) and read backward from each partition's end in growing chunks. A partition's end is where
reading it reaches partition EOF and then nothing more comes for a moment, never the reported
high watermark: Tansu's ListOffsets "latest" is the first offset of the last batch + 1
(docs/design.md §8), so the records after it are read too.
"""

import logging
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

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
    cannot be reached, or stops answering, within `timeout` seconds."""
    wanted = set(wanted)
    if not wanted:
        return {}
    best: dict[tuple[str, int, bytes], int] = {}
    with _Reader(settings, timeout) as r:
        count = r.partitions(destination_topic)
        if not count:
            return {}
        pending: dict[int, set] = {}  # destination partition -> pairs not found there yet
        for t, p, inc in wanted:
            for dp in ([p] if p < count else range(count)):
                pending.setdefault(dp, set()).add((t, p, inc))

        def take(dp: int, msgs: list) -> None:
            here = pending[dp]
            for m in msgs:
                p = Provenance.parse(m.headers())
                if p is None:
                    continue  # (not written by diode)
                pair = (p.topic, p.partition, p.incarnation)
                if pair not in wanted:
                    continue
                if p.offset > best.get(pair, -1):
                    best[pair] = p.offset
                here.discard(pair)

        scans = {dp: _Backward(*r.watermarks(destination_topic, dp), max_scan)
                 for dp in sorted(pending)}
        chunks = {dp: s.first() for dp, s in scans.items()}
        while chunks:
            r.read(destination_topic, chunks, take)
            chunks = {dp: c for dp, s in scans.items()
                      if pending[dp] and (c := s.next()) is not None}
    return best


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
    found: dict[tuple[str, int, bytes], list] = {}
    skipped = 0

    def take(dp: int, msgs: list) -> None:
        nonlocal skipped
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

    with _Reader(settings, timeout) as r:
        count = r.partitions(missing_topic)
        if not count:
            return {}
        marks = {dp: r.watermarks(missing_topic, dp) for dp in range(count)}
        starts = {dp: max(low, high - max_scan) for dp, (low, high) in marks.items()}
        if since_ms is not None:
            for dp, at in r.offsets_at(missing_topic, since_ms, count).items():
                low, high = marks[dp]
                # -1: nothing that recent before the reported end; Tansu's end is the start of
                # its last batch, so that batch is read again (and filtered by timestamp)
                starts[dp] = max(starts[dp], at if at >= 0 else high - 1, low)
        r.read(missing_topic, {dp: (s, None) for dp, s in starts.items()}, take)
    if skipped:
        log.warning("%s: %d record(s) are not missing-range events; ignored", missing_topic,
                    skipped)
    return {pair: [list(rg) for rg in merge(ranges)] for pair, ranges in sorted(found.items())}


def all_events(settings: dict, missing_topic: str,
               timeout: float = 30.0) -> list[RangeEvent]:
    """Every event of the missing-records topic still held, each partition's in order (a
    source partition's events are all in one), to the true end, parsed; records that are not
    events are counted in a warning. A missing topic: []."""
    events, skipped = [], 0

    def take(dp: int, msgs: list) -> None:
        nonlocal skipped
        for m in msgs:
            e = RangeEvent.parse(m.value())
            if e is None:
                skipped += 1
            else:
                events.append(e)

    with _Reader(settings, timeout) as r:
        count = r.partitions(missing_topic)
        if not count:
            return []
        starts = {dp: r.watermarks(missing_topic, dp)[0] for dp in range(count)}
        r.read(missing_topic, {dp: (s, None) for dp, s in starts.items()}, take)
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
    """A consumer of the destination cluster for one call: assigned, never subscribed."""

    def __init__(self, settings: dict, timeout: float):
        self.where = settings.get("bootstrap.servers", "?")
        self.timeout = timeout
        self.topic, self.paused = "", []
        self.consumer = Consumer({
            **admin_config(settings),  # what connects; the writer's producer settings stay out
            "group.id": f"diode-recovery-{uuid.uuid4().hex}",
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",  # a chunk start already deleted: from the start
            # a partition EOF comes after one empty fetch, and a drained queue is refilled at
            # once (the defaults wait 500 ms and 1 s: most of a call's time)
            "fetch.wait.max.ms": 50, "fetch.queue.backoff.ms": 10,
            "logger": log})

    def __enter__(self) -> "_Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.consumer.close()

    def _unreachable(self, what: str, exc) -> DiodeError:
        return DiodeError(f"destination cluster {self.where}: {what} failed within "
                          f"{self.timeout:g} s ({exc}); is it running and reachable with the "
                          "receiver.kafka settings?")

    def partitions(self, topic: str) -> int:
        """How many partitions `topic` has; 0 when it does not exist."""
        try:
            md = self.consumer.list_topics(topic, timeout=self.timeout).topics.get(topic)
        except KafkaException as exc:
            raise self._unreachable(f"reading the metadata of {topic}", exc) from exc
        if md is None or md.error is not None:
            # (a topic that does not exist, or cannot: nothing was ever written to it)
            if md is not None and md.error.code() not in (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                          KafkaError.TOPIC_EXCEPTION):
                raise DiodeError(f"destination cluster {self.where}: topic {topic}: {md.error}")
            return 0
        return len(md.partitions)

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """(low, high) as the broker reports them (Tansu's high may be short of the end)."""
        try:
            return self.consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                       timeout=self.timeout, cached=False)
        except KafkaException as exc:
            raise self._unreachable(f"listing the offsets of {topic}[{partition}]", exc) from exc

    def offsets_at(self, topic: str, ms: int, count: int) -> dict[int, int]:
        """partition -> first offset at or after timestamp `ms` (-1: none)."""
        try:
            got = self.consumer.offsets_for_times(
                [TopicPartition(topic, dp, ms) for dp in range(count)], timeout=self.timeout)
        except KafkaException as exc:
            raise self._unreachable(f"looking up {topic}'s offsets at {ms} ms", exc) from exc
        return {tp.partition: tp.offset for tp in got}

    def read(self, topic: str, chunks: dict, take) -> None:
        """Read each partition's chunk, partition -> (start, end): to `end` (exclusive), or with
        end None to the true end, calling take(partition, messages) with its records in order."""
        c = self.consumer
        if self.paused:  # before assign(): a resume after it would not wake the fetcher
            c.resume(self.paused)
            self.paused = []
        c.assign([TopicPartition(topic, dp, start) for dp, (start, _) in chunks.items()])
        self.topic = topic
        pos = {dp: start for dp, (start, _) in chunks.items()}
        open_ = set(chunks)
        to_end = any(end is None for _, end in chunks.values())
        last_news, error = time.monotonic(), None
        while open_:
            # As many messages as the bounded chunks still hold: consume() returns at once
            # instead of waiting out its timeout for a batch that cannot fill.
            want = sum(chunks[dp][1] - pos[dp] for dp in open_ if chunks[dp][1] is not None)
            msgs = c.consume(BATCH if to_end else max(1, min(BATCH, want)), POLL)
            now = time.monotonic()
            if msgs:
                last_news = now
            elif now - last_news > self.timeout:
                raise self._unreachable(
                    f"reading {topic} (at {dict(sorted(pos.items()))})", error or "no answer")
            error = self._take(msgs, chunks, pos, open_, take) or error
        if to_end:
            # Past every partition EOF, until nothing comes for a moment: the true end. What a
            # running writer keeps adding after QUIET_MAX is not waited for.
            until = time.monotonic() + QUIET_MAX
            unbounded = {dp: (s, e) for dp, (s, e) in chunks.items() if e is None}
            while msgs := c.consume(BATCH, QUIET):
                self._take(msgs, unbounded, pos, set(), take)
                if time.monotonic() > until:
                    break

    def _take(self, msgs, chunks, pos, open_, take):
        """Sort a consume() batch out by partition; close chunks that are read."""
        runs: dict[int, list] = {}
        error = None
        for m in msgs:
            err = m.error()
            dp = m.partition()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if dp in chunks:
                        self._close(dp, open_, chunks[dp][1] is not None)
                elif err.fatal():
                    raise DiodeError(f"destination cluster {self.where}: {err}")
                else:
                    error = err  # transient: librdkafka retries; reported if nothing comes
                continue
            if dp not in chunks:
                continue
            end = chunks[dp][1]
            offset = m.offset()
            if end is not None and offset >= end:
                self._close(dp, open_, True)
                continue
            runs.setdefault(dp, []).append(m)
            pos[dp] = offset + 1
            if end is not None and offset + 1 >= end:
                self._close(dp, open_, True)
        for dp, run in runs.items():
            take(dp, run)
        return error

    def _close(self, dp: int, open_: set, bounded: bool) -> None:
        if dp in open_:
            open_.discard(dp)
            if bounded:  # no fetching on into what is read already
                tp = TopicPartition(self.topic, dp)
                self.consumer.pause([tp])
                self.paused.append(tp)
