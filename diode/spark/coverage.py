"""What each partition holds before the audit reads it, and whether the read covered it.

An audit whose reader stops short says nothing is missing when it never looked. So before
reading, `extents` finds each partition's records with a consumer (diode.spark.kafka_source's
settings) that reads them, not by trusting ListOffsets: some brokers (the embedded Tansu) answer
"latest" with the first offset of the last batch + 1, short of the end. Per partition:

- start: the log start offset (the low watermark);
- end: the offset after the last record or transaction marker (the high watermark, or past it
  when a consumer reads further);
- first, last: the offsets of the first and the last record a consumer reads (None when there
  is none: an empty partition, or only markers and aborted records);
- high: the high watermark the broker reports (short of `last` + 1 on such a broker).

The audit reads exactly [start, end) of each partition (`pin`: the same snapshot for every
source, and for each pass over it; records written since are left for the next audit), then
`shortfalls` compares the offsets it read with `first` and `last`. Offsets are not counts
(compaction leaves holes, transaction markers take offsets of their own), so what is compared
is the offsets covered: a read that did not reach `last`, or began after `first` (records
removed by retention while it ran), is short.
"""

import json
import re
import time
from typing import NamedTuple

TIMEOUT = 30.0  # seconds to find the partitions' records before the audit gives up


class Extent(NamedTuple):
    start: int
    end: int
    first: int | None
    last: int | None
    high: int


def extents(cluster, pattern: str, timeout: float = TIMEOUT) -> dict:
    """{(topic, partition): Extent} of the topics matching `pattern` (fully), read by a consumer
    of `cluster` (its librdkafka settings, or bootstrap servers: diode.kafka.cluster)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from diode.kafka.cluster import librdkafka_log, settings_of
    from diode.spark.kafka_source import reader_config
    settings = settings_of(cluster)
    c = Consumer({**reader_config(settings), "logger": librdkafka_log()})
    try:
        try:
            listed = c.list_topics(timeout=10).topics
        except KafkaException as e:
            raise RuntimeError(f"diode verify: cannot list the topics of "
                               f"{settings.get('bootstrap.servers')}: {e}") from e
        parts = [(t, p) for t in sorted(listed) if not t.startswith("__")
                 and re.fullmatch(pattern, t)
                 for p in sorted(listed[t].partitions)]
        marks = {tp: c.get_watermark_offsets(TopicPartition(*tp), timeout=10) for tp in parts}
        deadline = time.monotonic() + timeout
        last = _last_records(c, marks, deadline)
        first = _read(c, {tp: marks[tp][0] for tp in last}, deadline, first_only=True)
        return {tp: Extent(low, max(high, last[tp] + 1 if tp in last else high),
                           first.get(tp), last.get(tp), high)
                for tp, (low, high) in marks.items()}
    finally:
        c.close()


def _last_records(consumer, marks: dict, deadline: float) -> dict:
    """{(topic, partition): offset of its last record}, for those that have one: read from just
    before the high watermark to the end of partition (past the watermark where a broker reports
    it short), further back while only markers or aborted records are found there."""
    last, window, pending = {}, 1, dict(marks)
    while pending:
        at = {tp: max(low, high - window) for tp, (low, high) in pending.items()}
        seen = _read(consumer, at, deadline)
        last.update(seen)
        pending = {tp: m for tp, m in pending.items() if tp not in seen and at[tp] > m[0]}
        window *= 64
    return last


def _read(consumer, at: dict, deadline: float, first_only: bool = False) -> dict:
    """{(topic, partition): the offset of the last record (or, `first_only`, the first) read
    from offset `at[tp]` to the end of partition}; partitions without one are left out."""
    from confluent_kafka import KafkaError, TopicPartition
    if not at:
        return {}
    consumer.assign([TopicPartition(t, p, o) for (t, p), o in at.items()])
    found, open_ = {}, set(at)
    try:
        while open_:
            if time.monotonic() > deadline:
                t, p = sorted(open_)[0]
                raise RuntimeError(f"diode verify: could not read {t}[{p}] to its end in time, "
                                   "so cannot know what the audit must read")
            for m in consumer.consume(1000, timeout=0.5):
                tp = (m.topic(), m.partition())
                err = m.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    open_.discard(tp)
                elif err is not None:
                    raise RuntimeError(f"diode verify: {tp[0]}[{tp[1]}]: {err}")
                elif tp in open_:
                    found[tp] = m.offset() if not first_only else found.get(tp, m.offset())
                    if first_only:
                        open_.discard(tp)
                        consumer.pause([TopicPartition(*tp)])
    finally:
        consumer.unassign()
    return found


def pin(reader, extents_: dict):
    """`reader` (spark.read on the Kafka source) set to read exactly [start, end) of each
    partition of `extents_` (assign, startingOffsets, endingOffsets: the native source's
    options, which diode_kafka takes too). Records gone before they are read are not an error
    of the source (failOnDataLoss false): `shortfalls` names them."""
    assign, starts, ends = {}, {}, {}
    for (t, p), e in sorted(extents_.items()):
        assign.setdefault(t, []).append(p)
        starts.setdefault(t, {})[str(p)] = e.start
        ends.setdefault(t, {})[str(p)] = e.end
    return reader.option("assign", json.dumps(assign)) \
        .option("startingOffsets", json.dumps(starts)) \
        .option("endingOffsets", json.dumps(ends)).option("failOnDataLoss", "false")


def shortfalls(extents_: dict, read: dict) -> list[str]:
    """What a read missed, one line per partition: `read` is {(topic, partition): (lowest,
    highest) offset read}; a partition holding records must have been read from its first to
    its last."""
    out = []
    for (t, p), e in sorted(extents_.items()):
        if e.last is None:
            continue
        lo, hi = read.get((t, p), (None, None))
        if hi is None:
            out.append(f"{t}[{p}]: nothing read of the records at offsets {e.first}..{e.last}")
        elif hi < e.last:
            out.append(f"{t}[{p}]: read to offset {hi}, but it holds records to offset "
                       f"{e.last}: offsets {hi + 1}..{e.last} not read ({e.last - hi} offsets)")
        elif lo > e.first:
            out.append(f"{t}[{p}]: read from offset {lo}, but it held records from offset "
                       f"{e.first} when the audit began: offsets {e.first}..{lo - 1} not read "
                       f"({lo - e.first} offsets; removed by retention or deleted meanwhile?)")
    return out


def describe(extents_: dict) -> str:
    """'3 partitions, offsets 0..4, 0..9 and 0..0 to read'; the sum when there are many."""
    spans = [f"{e.start}..{e.end - 1}" for _, e in sorted(extents_.items()) if e.end > e.start]
    if not spans:
        return f"{len(extents_)} partitions, nothing to read"
    if len(spans) > 3:
        return (f"{len(extents_)} partitions, "
                f"{sum(e.end - e.start for e in extents_.values())} offsets to read")
    listed = spans[0] if len(spans) == 1 else ", ".join(spans[:-1]) + " and " + spans[-1]
    return f"{len(extents_)} partitions, offsets {listed} to read"


def short_watermarks(extents_: dict) -> list[str]:
    """The partitions whose high watermark (ListOffsets "latest") is short of their real end:
    a source that trusts it (Spark's streaming Kafka source) would read them short."""
    return [f"{t}[{p}]" for (t, p), e in sorted(extents_.items())
            if e.last is not None and e.last >= e.high]


class ShortRead(Exception):
    """The audit read less than the partitions held: its report would say too little."""

    def __init__(self, what: str, lines: list):
        super().__init__(f"{what} read short:\n" + "\n".join(f"  {ln}" for ln in lines))
        self.lines = lines
