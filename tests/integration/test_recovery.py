"""A receiver without a usable checkpoint learns from the destination cluster itself what it has
written (the provenance headers of the last records) and what it has reported missing (the
missing-records topic), on both brokers (Tansu's "latest" offset is short of the end): per
incarnation of each source partition, never from records or events of another, nor from those
that name none (written by a diode before incarnations)."""

import json
import time

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from diode.accounting.ordering import PartitionState, SourcePartition
from diode.kafka import identity, recovery
from diode.kafka.brokers import free_port
from diode.errors import DiodeError
from diode.kafka.preparer import Preparer
from diode.kafka.recovery import last_reported, last_written
from diode.writer.recovery import Recovery
from tests.conftest import RECENT_MS, create_topic, produce, wait_for
from tests.unit.writer_fakes import LOG, metrics, settings as settings_of

ONE, TWO = b"\x01" * 16, b"\x02" * 16  # two incarnations of each source partition


def written(source_topic: str, source_partition: int, offset: int, incarnation=ONE,
            **record) -> dict:
    """A destination record as the kafka_writer writes it: own headers, then provenance (a
    diode before incarnations wrote no sourceTopicId: incarnation None)."""
    ids = [] if incarnation is None else [("sourceTopicId", identity.text(incarnation).encode())]
    return {"value": b"v%d" % offset, "key": b"k%d" % offset,
            "headers": [("app", b"own"), ("sourceTopic", source_topic.encode()),
                        ("sourcePartition", b"%d" % source_partition),
                        ("sourceOffset", b"%d" % offset), *ids], **record}


def event(kind: str, topic: str, partition: int, first: int, last: int, at: int,
          incarnation=ONE) -> dict:
    value = {"type": kind, "sourceTopic": topic, "sourcePartition": partition,
             "firstOffset": first, "lastOffset": last, "reason": "gap", "detectedAt": at}
    if incarnation is not None:
        value["sourceTopicId"] = identity.text(incarnation)
    return {"key": f"{topic}-{partition}".encode(), "value": json.dumps(value).encode(),
            "timestamp": at}


def test_last_written_finds_each_source_partition_where_the_writer_put_it(brokers):
    destination = brokers[1]
    settings = destination.client_config()
    # two source partitions interleaved in one destination partition, the highest offset of
    # one not last (a re-sent record), records of other pairs and without provenance around
    create_topic(destination.bootstrap, "dst_a", 1)
    records = []
    for i in range(100):
        records.append(written("a", 0, 3 * i, partition=0))
        if i % 2:
            records.append(written("a", 1, 1000 + i, partition=0))
    records += [written("a", 0, 150, partition=0), written("b", 0, 5000, partition=0),
                {"value": b"no provenance", "partition": 0},
                # the same partition's other incarnation, and a record naming none, after
                written("a", 0, 9000, TWO, partition=0), written("a", 1, 9000, None, partition=0)]
    produce(destination.bootstrap, "dst_a", records)
    assert last_written(settings, "dst_a", {("a", 0, ONE), ("a", 1, ONE), ("a", 7, ONE)}) == \
        {("a", 0, ONE): 297, ("a", 1, ONE): 1099}
    assert last_written(settings, "dst_a", {("a", 0, TWO), ("a", 1, TWO)}) == \
        {("a", 0, TWO): 9000}

    # source partition 3 written to a 2-partition topic: spread by key over both
    create_topic(destination.bootstrap, "dst_b", 2)
    produce(destination.bootstrap, "dst_b",
            [written("b", 3, i) for i in range(200)] +
            [written("b", 0, i, partition=0) for i in range(10)] +
            [written("b", 1, i, partition=1) for i in range(20)])
    assert last_written(settings, "dst_b", {("b", 0, ONE), ("b", 1, ONE), ("b", 3, ONE)}) == \
        {("b", 0, ONE): 9, ("b", 1, ONE): 19, ("b", 3, ONE): 199}

    assert last_written(settings, "dst_nothing", {("a", 0, ONE)}) == {}


def test_last_written_reads_back_chunk_after_chunk_and_on_past_the_reported_end(brokers):
    destination = brokers[1]
    settings = destination.client_config()
    create_topic(destination.bootstrap, "dst_c", 1)
    # the last record of c[0] 5000 records before the end: several chunks back; c[1]'s last
    # records batched together at the end (Tansu's "latest" is the start of that batch + 1)
    produce(destination.bootstrap, "dst_c", [written("c", 0, i, partition=0) for i in range(10)])
    for first in range(0, 5000, 1000):  # each call flushes: batches of at most 1000
        produce(destination.bootstrap, "dst_c",
                [written("c", 1, i, partition=0) for i in range(first, first + 1000)])
    assert last_written(settings, "dst_c", {("c", 0, ONE), ("c", 1, ONE)}) == \
        {("c", 0, ONE): 9, ("c", 1, ONE): 4999}
    # not further back than max_scan records
    assert last_written(settings, "dst_c", {("c", 0, ONE), ("c", 1, ONE)}, max_scan=3000) == \
        {("c", 1, ONE): 4999}


def test_last_reported_merges_the_missing_ranges_of_each_source_partition(brokers):
    destination = brokers[1]
    settings = destination.client_config()
    create_topic(destination.bootstrap, "missing", 2)
    before, since = RECENT_MS - 600_000, RECENT_MS
    produce(destination.bootstrap, "missing", [
        {**event("missing", "a", 0, 1, 4, before), "partition": 0},
        {**event("missing", "a", 0, 20, 29, since), "partition": 0},
        {**event("missing", "a", 0, 10, 19, since + 1), "partition": 1},
        {**event("filled", "a", 0, 12, 12, since + 2), "partition": 1},
        {**event("filled", "a", 2, 1, 9, since + 2), "partition": 1},
        {**event("missing", "a", 0, 50, 59, since + 3), "partition": 0},
        {**event("missing", "a-1", 0, 7, 7, since + 4), "partition": 1},
        {"value": b"not an event", "partition": 0, "timestamp": since + 5},
        {**event("missing", "a", 0, 100, 109, since + 6, TWO), "partition": 1},
        {**event("missing", "a", 0, 200, 209, since + 7, None), "partition": 1},
    ])
    assert last_reported(settings, "missing", since_ms=since) == \
        {("a", 0, ONE): [[10, 29], [50, 59]], ("a", 0, TWO): [[100, 109]],
         ("a-1", 0, ONE): [[7, 7]]}
    assert last_reported(settings, "missing") == \
        {("a", 0, ONE): [[1, 4], [10, 29], [50, 59]], ("a", 0, TWO): [[100, 109]],
         ("a-1", 0, ONE): [[7, 7]]}
    assert last_reported(settings, "missing_nothing") == {}


@pytest.mark.parametrize("call", [
    lambda s: last_written(s, "dst", {("a", 0, ONE)}, timeout=3),
    lambda s: last_reported(s, "missing", timeout=3)], ids=["last_written", "last_reported"])
def test_an_unreachable_cluster_is_one_clear_error_within_the_timeout(call):
    where = f"127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(DiodeError) as exc:
        call({"bootstrap.servers": where})
    assert time.monotonic() - started < 15  # the 3 s asked, not the default 30 s
    assert where in str(exc.value) and "3 s" in str(exc.value)


def test_a_writer_restarting_among_many_topics_reads_them_all_with_one_consumer(
        brokers, monkeypatch):
    """What a restarted writer waits for in many source topics at once is read together: one
    consumer (and one wait for the true end) for all of them, where it was one per topic, ~0.7 s
    each (2 000 topics: writers killed for silence); each topic's answer is its own."""
    destination = brokers[1]
    settings = destination.client_config()
    topics = [f"s{i}" for i in range(TOPICS)]
    admin = AdminClient({"bootstrap.servers": destination.bootstrap})
    for future in admin.create_topics([NewTopic(f"dst_{t}", 2) for t in topics] +
                                      [NewTopic("missing", 1)]).values():
        future.result(60)
    # source partition p of topic i written up to offset i + p, then a record of s1[1]'s
    # next incarnation; s3[0]'s offsets 10..12 reported missing
    produce(destination.bootstrap, "", [
        {**written(t, p, offset, partition=p), "topic": f"dst_{t}"}
        for i, t in enumerate(topics) for p in range(2) for offset in range(i + p + 1)] +
        [{**written(topics[1], 1, 50, TWO, partition=0), "topic": f"dst_{topics[1]}"}])
    produce(destination.bootstrap, "missing", [event("missing", "s3", 0, 10, 12, RECENT_MS)])
    made = []
    consumer = recovery.Consumer
    monkeypatch.setattr(recovery, "Consumer", lambda conf: made.append(conf) or consumer(conf))
    preparer = Preparer(settings).start()
    sources = {}

    def state(topic, partition, incarnation, now=None):
        source = sources.setdefault((topic, partition), SourcePartition())
        if source.current is None:
            source.current = PartitionState(0.0, incarnation=incarnation)
        return source.current

    rec = Recovery(settings_of(**{"missing.records.topic": "missing"}), metrics(), LOG,
                   "unused", 0, 1, sources=sources, source_partitions=dict.fromkeys(topics, 2),
                   owns=lambda t, p: True, name_of=lambda t: "dst_" + t, state=state,
                   ask_holdings=preparer.holdings, resuming=True)
    try:
        for t in topics:
            assert not rec.recover(t, 0, ONE)
            rec.unrecovered[t].append((t, 0, ONE))  # (a claim waiting)
        rec.ask_again()
        handed = []
        wait_for(lambda: [handed.extend(rec.recovered_by(a, 0.0)) for a in preparer.take()]
                 and False or len(handed) == TOPICS, 60, "every topic's answer")
    finally:
        preparer.close()
    assert len(made) == 1  # (one consumer for every topic, and the missing-records topic)
    assert {tp: s.current.frontier for tp, s in sources.items()} == \
        {(t, p): max(i + p, 12 if (t, p) == ("s3", 0) else -1)
         for i, t in enumerate(topics) for p in range(2)}
    assert sources[("s3", 0)].current.gaps == [[10, 12]]


TOPICS = 20
