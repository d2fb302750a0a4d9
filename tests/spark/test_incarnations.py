"""diode verify per incarnation of a source partition (the sourceTopicId header): known answers
from rows built in memory, with the Kafka source's schema (no broker: the transforms are pure).

A topic deleted and recreated starts again at offset 0. Its two incarnations are two rows of the
audit, each complete, never each other's duplicates; heartbeat claims count for the incarnation
they name; records and heartbeats of a diode older than topic ids are audited as before."""

import json
from argparse import Namespace
from datetime import datetime, timezone

from diode.kafka import identity
from diode.spark.kafka_source import SCHEMA
from diode.spark.verify import (audit, claims, compare, manifest, provenance, report, summarize,
                                table)

OLD = identity.text(b"\x01" * 16)  # the incarnation deleted
NEW = identity.text(b"\x02" * 16)  # the topic created again under the same name
WHEN = datetime(2026, 1, 1, tzinfo=timezone.utc)


def origin(topic, partition, offset, topic_id=None):
    """The receiver's provenance headers (sourceTopicId since topic ids)."""
    return [("sourceTopic", topic.encode()), ("sourcePartition", str(partition).encode()),
            ("sourceOffset", str(offset).encode()),
            *([("sourceTopicId", topic_id.encode())] if topic_id else [])]


def kafka_rows(spark, records):
    """records: dicts of topic, partition, offset, headers (value, key optional), as the Kafka
    source gives them."""
    return spark.createDataFrame(
        [(r.get("key"), r.get("value", b"v"), r["topic"], r["partition"], r["offset"], WHEN, 0,
          r.get("headers", [])) for r in records], SCHEMA)


def written(topic, partition, first, headers):
    """Destination records at offsets first, first+1, … of `topic`[`partition`]."""
    return [{"topic": topic, "partition": partition, "offset": first + i, "headers": h}
            for i, h in enumerate(headers)]


def beat(*claimed):
    """A heartbeat record (receiver.heartbeat.topic) with claims (topic, partition, topic id or
    None for a receiver older than topic ids, last sent, chain start)."""
    return {"topic": "beats", "partition": 0, "offset": 0, "value": json.dumps({
        "receivedAt": 1, "lastSent": [
            {"topic": t, "partition": p, **({"topicId": i} if i else {}), "offset": last,
             "chainStart": start} for t, p, i, last, start in claimed]}).encode()}


def recreated(spark):
    """dst_s[0]: source s[0] offsets 0..4 of the old incarnation, then 1, 2 and 5 of the new
    one (0, 3 and 4 lost). dst_s[1]: source s[1] from a diode older than topic ids, offsets 0..2
    with 1 twice, and one record whose nearest diode was older (its upstream diode's topic id
    does not count)."""
    rows = written("dst_s", 0, 0, [origin("s", 0, o, OLD) for o in range(5)]
                   + [origin("s", 0, o, NEW) for o in (1, 2, 5)])
    upstream = origin("s", 1, 999, NEW)  # a diode before this one, on the same path
    rows += written("dst_s", 1, 0, [origin("s", 1, 0), origin("s", 1, 1), origin("s", 1, 1),
                                    upstream + origin("s", 1, 2)])
    return kafka_rows(spark, rows)


def test_two_incarnations_of_a_partition_are_two_rows_with_their_own_gaps(spark):
    beats = claims(kafka_rows(spark, [beat(
        ("s", 0, OLD, 4, 0),   # the old incarnation: everything sent arrived
        ("s", 0, NEW, 6, 0),   # the new one: its head 0, 3, 4 and 6 lost
        ("s", 0, None, 9, 0),  # an older receiver's claim: not about either incarnation
        ("s", 1, None, 3, 0),  # ... but about the records without a topic id: 3 lost
    )]))
    rep = report(audit(provenance(recreated(spark)), beats))
    got = [(r["sourceTopic"], r["sourcePartition"], r["sourceTopicId"], r["records"],
            r["distinct"], r["duplicates"], r["outOfOrder"],
            [(m["first"], m["last"]) for m in r["missingRanges"]]) for r in rep["partitions"]]
    assert got == [
        ("s", 0, OLD, 5, 5, 0, 0, []),
        # 1, 2 again: no duplicates, in order; its lost head judged, although the
        # destination partition held the old incarnation before
        ("s", 0, NEW, 3, 3, 0, 0, [(0, 0), (3, 4), (6, 6)]),
        ("s", 1, None, 4, 3, 1, 0, [(3, 3)]),  # as before topic ids
    ]
    assert rep["totals"] == {"records": 12, "distinct": 11, "duplicates": 1, "missing": 5,
                             "outOfOrder": 0}
    assert manifest(rep) == {"version": 1, "missing": [
        {"topic": "s", "partition": 0, "topicId": NEW, "ranges": [[0, 0], [3, 4], [6, 6]]},
        {"topic": "s", "partition": 1, "ranges": [[3, 3]]}]}
    lines = table(rep).splitlines()
    assert "topic id" in lines[0]
    assert [line.split()[:3] for line in lines[1:4]] == [["s[0]", OLD, "5"], ["s[0]", NEW, "3"],
                                                         ["s[1]", "-", "4"]]


def test_without_topic_ids_the_audit_is_what_it_was(spark):
    """Records and heartbeats of a diode older than topic ids only: one row per source
    partition, the heartbeat's tail and head judged as before."""
    rows = kafka_rows(spark, written("dst_a", 0, 0, [origin("a", 0, o) for o in (2, 3, 5)]))
    beats = claims(kafka_rows(spark, [beat(("a", 0, None, 7, 1))]))
    (r,) = report(audit(provenance(rows), beats))["partitions"]
    assert (r["sourceTopic"], r["sourcePartition"], r["sourceTopicId"], r["records"]) == \
        ("a", 0, None, 3)
    assert r["missingRanges"] == [{"first": 1, "last": 1}, {"first": 4, "last": 4},
                                  {"first": 6, "last": 7}]


def test_a_later_batch_knows_each_incarnation_apart(spark):
    """The streaming audit's summary: a record is late against what earlier batches held of
    its own incarnation only (the null one included)."""
    known = spark.createDataFrame([("s", 0, OLD, 4), ("s", 1, None, 2)],
                                  "sourceTopic string, sourcePartition int, "
                                  "sourceTopicId string, last long")
    batch = kafka_rows(spark, written("dst_s", 0, 10, [origin("s", 0, 0, NEW),
                                                       origin("s", 0, 3, OLD)])
                       + written("dst_s", 1, 10, [origin("s", 1, 1)]))
    got = {(r.sourceTopic, r.sourcePartition, r.sourceTopicId): (r.records, r.outOfOrder)
           for r in summarize(provenance(batch), known).collect()}
    assert got == {("s", 0, NEW): (1, 0), ("s", 0, OLD): (1, 1), ("s", 1, None): (1, 1)}


def test_streaming_audit_keeps_a_ledger_per_incarnation_across_restarts(spark, tmp_path):
    from diode.spark.stream import StreamAudit
    args = Namespace(heartbeat_topic="beats", written_at_header="writtenAt",
                     checkpoint=str(tmp_path), max_offsets_per_trigger=1000, grace_seconds=0.0,
                     json=None)
    events = []
    auditor = StreamAudit(spark, args, [events.extend])
    auditor(recreated(spark).unionByName(kafka_rows(spark, [beat(("s", 0, NEW, 6, 0))])), 0)
    assert sorted((e["type"], e["sourcePartition"], e["sourceTopicId"], e["firstOffset"],
                   e["lastOffset"]) for e in events) == [
        ("missing", 0, NEW, 0, 0), ("missing", 0, NEW, 3, 4), ("missing", 0, NEW, 6, 6)]
    # restarted from its ledger: the new incarnation's 3 fills its gap; the old one's 3 is a
    # duplicate of its own
    events.clear()
    auditor = StreamAudit(spark, args, [events.extend])
    auditor(kafka_rows(spark, written("dst_s", 0, 8, [origin("s", 0, 3, NEW),
                                                      origin("s", 0, 3, OLD)])), 1)
    assert [(e["type"], e["sourceTopicId"], e["firstOffset"]) for e in events] == \
        [("filled", NEW, 3)]
    got = {(r["sourcePartition"], r["sourceTopicId"]): (r["records"], r["duplicates"],
                                                         r["missing"])
           for r in auditor.report()["partitions"]}
    assert got == {(0, OLD): (6, 1, 0), (0, NEW): (4, 0, 3), (1, None): (4, 1, 0)}


def test_a_ledger_saved_before_topic_ids_carries_on_as_the_null_incarnation(spark, tmp_path):
    from diode.accounting.ledger import PartitionLedger
    from diode.spark.stream import StreamAudit
    led = PartitionLedger(runs=[(0, 4)], records=5)
    (tmp_path / "diode-ledger.json").write_text(json.dumps({"batch": 3, "partitions": [
        {"topic": "s", "partition": 1, "ledger": led.to_json()}]}))
    args = Namespace(heartbeat_topic=None, written_at_header="writtenAt",
                     checkpoint=str(tmp_path), max_offsets_per_trigger=1000, grace_seconds=0.0,
                     json=None)
    auditor = StreamAudit(spark, args, [])
    assert list(auditor.ledgers) == [("s", 1, None)]
    auditor(kafka_rows(spark, written("dst_s", 1, 5, [origin("s", 1, 5),
                                                      origin("s", 1, 0, NEW)])), 4)
    got = {r["sourceTopicId"]: (r["records"], r["last"]) for r in auditor.report()["partitions"]}
    assert got == {None: (6, 5), NEW: (1, 0)}


def test_compare_checks_the_sources_current_incarnation_only(spark):
    """The source holds the new incarnation (0..2); the destination holds the old one's 0..4
    too, other records at the same offsets. Only the new one's are compared with it."""
    source = kafka_rows(spark, [{"topic": "s", "partition": 0, "offset": o,
                                 "value": b"new-%d" % o, "headers": [("h", b"1")]}
                                for o in range(3)])
    stamp = [("writtenAt", b"1795311657390")]
    dst = kafka_rows(spark, [
        {"topic": "dst_s", "partition": 0, "offset": o, "value": b"old-%d" % o,
         "headers": [("h", b"0")] + origin("s", 0, o, OLD) + stamp} for o in range(5)] + [
        {"topic": "dst_s", "partition": 0, "offset": 5 + o, "value": b"new-%d" % o,
         "headers": [("h", b"1")] + origin("s", 0, o, NEW) + (stamp if o else [])}
        for o in range(3)])
    (row,) = compare(source, dst, current={"s": NEW}).collect()
    assert row.asDict() == {"sourceTopic": "s", "sourcePartition": 0, "sourceTopicId": NEW,
                            "sourceRecords": 3, "lost": 0, "duplicated": 0, "altered": 0}
    # not knowing the source's incarnation, offset by offset: the old records count too
    (row,) = compare(source, dst).collect()
    assert (row.sourceTopicId, row.duplicated) == (None, 3)
