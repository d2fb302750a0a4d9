"""Content proven one way (diode.accounting.digests, diode.spark.digests): the sender digests
what it reads, the receiver writes the digests to receiver.digest.topic, and `diode verify
--digest-topic` checks the destination against them without the source cluster. On Apache
Kafka and on Tansu."""

import json
import re
import subprocess

from pyspark.sql import functions as F

from diode.spark.digests import (DIGEST_SCHEMA, check, extract_digests, reported_missing,
                                 summary)
from diode.spark.verify import extract
from tests.spark.examples import examples, for_brokers
from tests.conftest import (RECENT_MS, ROOT, consume, create_topic, headers_of, produce,
                            wait_for, write_topology)

TOTAL, PER_DIGEST = 400, 50


# the demo topology's names (topology.yaml), which the examples of docs/verification.md use
DEMO = {"topic.prefix": "dest_", "digest.topic": "diode-digests",
        "missing.records.topic": "diode-missing"}


def verify_args(dst, *more, prefix="dst_", digests="digests", missing="missing") -> list:
    return ["--bootstrap", dst, "--prefix", prefix, "--digest-topic", digests,
            "--missing-records-topic", missing, "--master", "local[2]", "--format", "python",
            *more]


def test_verify_proves_the_content_and_names_an_altered_and_a_deleted_record(
        spark, brokers, broker_kind, launch, tmp_path, verify_here):
    """On a topology with the demo's names, the `diode verify` examples of the docs first, as
    printed but for the ports, with the source the default --format picks. On Apache Kafka the
    first runs as a process (its own JVM: the one test of `diode verify` as a command of its
    own); every other run is in this process on the shared session, as `diode verify` is below.
    Both brokers, for what they hold: Tansu's short ListOffsets "latest" is what the audit must
    read past (docs/design.md §8); the command's process and JVM are the same on either, and
    a JVM more to start here is some 20 s."""
    src, dst = brokers
    create_topic(src.bootstrap, "src", 2)
    topology = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                              sender={"digest.records": PER_DIGEST,
                                      "digest.interval.ms": 1000},
                              receiver=DEMO)
    diode = launch(topology)
    produce(src.bootstrap, "src", [
        {"key": b"k%d" % (i % 7) if i % 3 else None, "value": b"v%d" % i, "partition": i % 2,
         "headers": [("h", b"%d" % i)] if i % 5 else None} for i in range(TOTAL)])
    wait_for(lambda: diode.metric("records", "kafka_writer") == TOTAL, 60, "every record")
    wait_for(lambda: diode.metric("digests", "kafka_writer") == TOTAL // PER_DIGEST, 30,
             "a digest per 50 records")
    assert diode.stop() == 0

    documented = examples()
    assert len(documented) >= 2, documented
    for i, (doc, argv) in enumerate(documented):
        argv = for_brokers(argv, src.bootstrap, dst.bootstrap)
        if i == 0 and broker_kind == "kafka":
            r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
        else:
            r = verify_here(*argv[argv.index("verify") + 1:])
        said = f"{doc}: {' '.join(argv)}\n{r.stdout}{r.stderr[-3000:]}"
        assert r.returncode == 0, said
        assert f"total: {TOTAL} records, {TOTAL} distinct, 0 duplicates, 0 missing" \
            in r.stdout, said
        if "--source-bootstrap" in argv:
            assert "against the source: 0 lost, 0 duplicated, 0 altered" in r.stdout, said
        if "--digest-topic" in argv:
            assert f"digests: {TOTAL // PER_DIGEST} ranges verified, 0 altered, 0 incomplete " \
                "(0 with records not reported missing); 0 records unproven" in r.stdout, said

    def judged(rows):
        return [r.asDict(recursive=True) for r in check(
            rows, extract_digests(spark, dst.bootstrap, "diode-digests", "python")).collect()]
    rows = extract(spark, dst.bootstrap, "dest_src", "python")
    s = summary(judged(rows), None)
    assert (s["verified"], s["altered"], s["incomplete"]) == (TOTAL // PER_DIGEST, 0, 0)

    # a forged copy beside the original: the same provenance, another value
    original = next(m for m in consume(dst.bootstrap, "dest_src", TOTAL, timeout=30)
                    if headers_of(m)["sourceOffset"] == b"60"
                    and headers_of(m)["sourcePartition"] == b"1")
    produce(dst.bootstrap, "dest_src", [{"key": original.key(), "value": b"forged",
                                        "partition": original.partition(),
                                        "timestamp": original.timestamp()[1],
                                        "headers": original.headers()}])
    r = verify_here(*verify_args(dst.bootstrap, "--json", tmp_path / "report.json",
                                 prefix="dest_", digests="diode-digests",
                                 missing="diode-missing"))
    assert r.returncode == 1, r.stderr[-3000:] + r.stdout
    assert "altered: src[1] 50..99: 1 offset(s) written with two contents" in r.stdout, r.stdout
    report = json.loads((tmp_path / "report.json").read_text())["digests"]
    assert (report["verified"], report["altered"], report["incomplete"]) == \
        (TOTAL // PER_DIGEST - 1, 1, 0)

    # a record gone from the destination (as a compaction would take it): the range is
    # incomplete, and the receiver never reported it missing
    rows = extract(spark, dst.bootstrap, "dest_src", "python")
    gone = judged(rows.where(~((F.col("partition") == 0) & (F.col("offset") == 10))))
    s = summary(gone, reported_missing(dst.bootstrap, "diode-missing"))
    assert (s["altered"], s["incomplete"], s["unreported"]) == (1, 1, 1)
    incomplete = next(x for x in s["ranges"] if x["state"] == "incomplete")
    assert (incomplete["sourcePartition"], incomplete["firstOffset"], incomplete["present"],
            incomplete["absent"], incomplete["reported"]) == (0, 0, 49, [[10, 10]], False)
    # reported missing by the receiver: known, not silent
    s = summary(gone, {("src", 0, incomplete["sourceTopicId"]): [(5, 12)]})
    assert s["unreported"] == 0
    assert next(x for x in s["ranges"] if x["state"] == "incomplete")["reported"] is True


def test_a_record_compacted_away_in_the_destination_is_named_incomplete(
        start_brokers, launch, tmp_path, verify_here):
    """A real compaction (Apache Kafka's log cleaner; Tansu does not compact): a newer record
    with the key of a replicated one, written to the destination by someone else, and the
    cleaner removes the replicated one. `diode verify --digest-topic` names its range
    incomplete, the record absent and not reported missing (in this process on the shared
    session: the first test runs the command as a process)."""
    src, dst = start_brokers("kafka", "source", "destination",
                             config={"log.cleaner.backoff.ms": 200})
    create_topic(src.bootstrap, "src", 1)
    compacted_now = {  # compacted, and cleaned at once
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0", "delete.retention.ms": "100"}
    create_topic(dst.bootstrap, "dst_src", 1, compacted_now)
    topology = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                              sender={"digest.records": PER_DIGEST},
                              receiver={"digest.topic": "digests",
                                        "missing.records.topic": "missing",
                                        # (pinned: else the source's delete policy is synced)
                                        "topic.configs": {"dst_src": compacted_now}})
    diode = launch(topology)
    produce(src.bootstrap, "src", [{"key": b"k%d" % i, "value": b"v%d" % i}
                                   for i in range(100)])
    wait_for(lambda: diode.metric("digests", "kafka_writer") == 2, 60, "two digests")
    assert diode.stop() == 0

    def still_there():
        return any(headers_of(m).get("sourceOffset") == b"10"
                   for m in consume(dst.bootstrap, "dst_src", 100, timeout=10))
    produce(dst.bootstrap, "dst_src", [{"key": b"k10", "value": b"newer"}])

    def compacted():
        # (a record more rolls the segment of the newer one, for the cleaner to take it)
        produce(dst.bootstrap, "dst_src", [{"key": b"roll", "value": b""}])
        return not still_there()
    wait_for(compacted, 90, "the log cleaner to remove the replicated k10")
    r = verify_here(*verify_args(dst.bootstrap))
    assert r.returncode == 1, r.stderr[-3000:] + r.stdout
    assert "digests: 1 ranges verified, 0 altered, 1 incomplete (1 with records not reported " \
        "missing)" in r.stdout, r.stdout
    assert "incomplete: src[0] 0..49: 49 of 50 records; absent: 10..10 (NOT reported " \
        "missing)" in r.stdout, r.stdout
    # the records written there by someone else (k10's newer one, at offset 100, then those
    # that rolled its segment, of which the cleaner may have left the last) are named too
    assert re.search(r"  unproven: dst_src\[0\] 100(\.\.\d+ \(\d+ records\))?: no provenance "
                     "headers", r.stdout), r.stdout


SOURCE_ID = "AAECAwQFBgcICQoLDA0ODw"  # the source topic's id (sourceTopicId's text)
COPIED, PER_RANGE = 3000, 1000


def plant_copy(bootstrap) -> None:
    """What a receiver writes for 3 000 records of src[0] (topic id SOURCE_ID) copied to
    dest_src[0], offsets 0..2999, with the provenance headers it appends, and the sender's
    digests of them in diode-digests: 3 ranges of 1 000 records."""
    from diode.accounting import digests as dg
    records = [{"key": b"k%d" % o, "value": b"v%d" % o, "timestamp": RECENT_MS + o,
                "headers": [("sourceTopic", b"src"), ("sourcePartition", b"0"),
                            ("sourceOffset", b"%d" % o), ("sourceTopicId", SOURCE_ID.encode()),
                            ("writtenAt", b"%d" % (RECENT_MS + o + 5))]}
               for o in range(COPIED)]
    create_topic(bootstrap, "dest_src", 1)
    produce(bootstrap, "dest_src", records)
    create_topic(bootstrap, "diode-digests", 1)
    produce(bootstrap, "diode-digests", [{"value": json.dumps({
        "sourceTopic": "src", "sourcePartition": 0, "sourceTopicId": SOURCE_ID,
        "firstOffset": first, "lastOffset": first + PER_RANGE - 1, "count": PER_RANGE,
        "digest": dg.range_digest([dg.record_hash(r["key"], r["value"], [], r["timestamp"])
                                   for r in records[first:first + PER_RANGE]]).hex()}).encode()}
        for first in range(0, COPIED, PER_RANGE)])


def claiming(offset: int, topic_id: str | None, value: bytes = b"forged") -> dict:
    """A record written straight into dest_src[0], its headers claiming src[0] `offset` (and
    `topic_id` as its sourceTopicId; none when None)."""
    return {"key": b"k%d" % offset, "value": value, "timestamp": RECENT_MS + offset,
            "headers": [("sourceTopic", b"src"), ("sourcePartition", b"0"),
                        ("sourceOffset", b"%d" % offset)]
            + ([("sourceTopicId", topic_id.encode())] if topic_id else [])}


def test_a_record_no_digest_proves_is_named_unproven_with_its_destination_offset(
        start_brokers, verify_here, tmp_path):
    """Issue 34: 3 000 records copied, then two written straight into the destination topic
    claiming src[0] offset 10, one with the real sourceTopicId and one without any. The first
    was found altered, the second taken as a record of a diode older than topic ids, proven by
    nothing (alone, the audit passed: exit 0). Now every record of the audited topics is
    proven by a digest or named unproven, with its destination offset and why (exit 1);
    records without a topic id pass unproven only with --allow-without-topic-id, counted.
    On Tansu alone: what is checked does not depend on the broker (the first test of this file
    checks a real diode's copy on both), and on Apache Kafka the same took 29 s, not 21."""
    (dst,) = start_brokers("tansu", "destination")
    plant_copy(dst.bootstrap)
    report = tmp_path / "report.json"

    def audit(*more):
        r = verify_here(*verify_args(dst.bootstrap, "--json", report, *more, prefix="dest_",
                                     digests="diode-digests", missing="diode-missing"))
        return r, r.stdout + r.stderr[-3000:], json.loads(report.read_text())["digests"]

    produce(dst.bootstrap, "dest_src", [claiming(10, SOURCE_ID),  # at offset 3000
                                        claiming(10, None)])      # at 3001
    r, said, d = audit()
    assert r.returncode == 1, said
    assert "digests: 2 ranges verified, 1 altered, 0 incomplete (0 with records not " \
        "reported missing); 1 records unproven" in r.stdout, said
    assert "  altered: src[0] 0..999: 1 offset(s) written with two contents" in r.stdout, said
    assert "  unproven: dest_src[0] 3001: no sourceTopicId (claims src[0] 10)" in r.stdout, said
    assert [(u["topic"], u["partition"], u["firstOffset"], u["lastOffset"], u["reason"])
            for u in d["unprovenRecords"]] == [("dest_src", 0, 3001, 3001, "no-topic-id")]
    assert (d["unproven"], d["takenWithoutTopicId"]) == (1, None)

    # forged with a topic id no digest names, and a record without provenance: unproven even
    # where records without a topic id are allowed (that one is counted); read by Spark's
    # own Kafka source this time
    produce(dst.bootstrap, "dest_src", [claiming(20, "ZZZZZZZZZZZZZZZZZZZZZZ"),
                                        {"value": b"written by someone else"}])
    r, said, d = audit("--allow-without-topic-id", "--format", "native")
    assert r.returncode == 1, said
    assert "1 altered, 0 incomplete (0 with records not reported missing); 2 records " \
        "unproven, 1 without a topic id taken unproven (--allow-without-topic-id)" \
        in r.stdout, said
    assert "  unproven: dest_src[0] 3002: a sourceTopicId no digest names (claims src[0] 20, " \
        "topic id ZZZZZZZZZZZZZZZZZZZZZZ)" in r.stdout, said
    assert "  unproven: dest_src[0] 3003: no provenance headers" in r.stdout, said
    assert [(u["firstOffset"], u["reason"]) for u in d["unprovenRecords"]] == \
        [(3002, "unknown-topic-id"), (3003, "no-provenance")]
    assert (d["unproven"], d["takenWithoutTopicId"]) == (2, 1)


def test_each_record_no_digest_covers_is_named_in_runs_with_why(spark):
    """The check alone (place, judge, unproven, summary, lines), on Kafka rows made here: a
    known answer for each reason a record is unproven, runs of consecutive destination offsets,
    and records without a topic id taken only when asked."""
    from datetime import datetime, timezone

    from diode.accounting import digests as dg
    from diode.spark.digests import judge, lines, numbered, place, unproven
    from diode.spark.kafka_source import SCHEMA
    at = datetime.fromtimestamp(RECENT_MS / 1000, timezone.utc)

    def row(partition, offset, value, source=None):
        """A record of d[partition] at `offset`; `source`: (topic, partition, offset, topic
        id or None) its provenance headers claim."""
        headers = []
        if source:
            headers = [("sourceTopic", source[0].encode()),
                       ("sourcePartition", b"%d" % source[1]),
                       ("sourceOffset", b"%d" % source[2])]
            headers += [("sourceTopicId", source[3].encode())] if source[3] else []
        return (None, value, "d", partition, offset, at, 0, headers)
    i, j = "AAECAwQFBgcICQoLDA0ODw", "ZZZZZZZZZZZZZZZZZZZZZZ"
    rows = [row(0, o, b"v%d" % o, ("x", 0, o, i)) for o in range(10)]
    rows += [row(0, 10, b"forged", ("x", 0, 3, i)),      # beside x[0] 3: its range altered
             row(0, 11, b"a"), row(0, 12, b"b"),          # no provenance
             row(0, 13, b"v20", ("x", 0, 20, None)),      # a diode older than topic ids
             row(0, 14, b"v21", ("x", 0, 21, j)),         # a topic id no digest names
             row(1, 0, b"w0", ("x", 1, 0, i)),            # a partition never digested
             row(1, 1, b"y0", ("y", 0, 0, j))]            # a topic never digested

    def digest(first, last):
        hashes = [dg.record_hash(None, b"v%d" % o, [], RECENT_MS) for o in range(first, last + 1)]
        return ("x", 0, i, first, last, last - first + 1, dg.range_digest(hashes).hex())
    # x[0] 5 in no range, 7..9 after the last
    d = numbered(spark.createDataFrame([digest(0, 4), digest(6, 6)], DIGEST_SCHEMA))
    placed = place(spark.createDataFrame(rows, SCHEMA), d)
    judged = [r.asDict(recursive=True) for r in judge(placed, d).collect()]
    assert [(r["firstOffset"], r["state"], r["conflicting"]) for r in judged] == \
        [(0, "altered", 1), (6, "verified", 0)]
    loose = [r.asDict() for r in unproven(placed, d).collect()]
    assert [(u["partition"], u["firstOffset"], u["lastOffset"], u["records"], u["reason"],
             u["sourceTopicId"], u["sourceFirstOffset"], u["sourceLastOffset"])
            for u in loose] == [(0, 5, 5, 1, "not-digested", i, 5, 5),
                                (0, 7, 9, 3, "after-last-digest", i, 7, 9),
                                (0, 11, 12, 2, "no-provenance", None, None, None),
                                (0, 13, 13, 1, "no-topic-id", None, 20, 20),
                                (0, 14, 14, 1, "unknown-topic-id", j, 21, 21),
                                (1, 0, 0, 1, "not-digested", i, 0, 0),
                                (1, 1, 1, 1, "not-digested", j, 0, 0)]

    s = summary(judged, None, loose)
    assert (s["verified"], s["altered"], s["unproven"], s["takenWithoutTopicId"]) == \
        (1, 1, 10, None)
    shown = lines(s)
    assert shown[0].endswith("; 10 records unproven"), shown
    assert "  unproven: d[0] 7..9 (3 records): after the last digest of its source partition " \
        "(claims x[0] 7..9)" in shown, shown
    allowed = summary(judged, None, loose, without_topic_id=True)
    assert (allowed["unproven"], allowed["takenWithoutTopicId"]) == (9, 1)
    assert "no-topic-id" not in [u["reason"] for u in allowed["unprovenRecords"]]
    assert lines(allowed)[0].endswith("; 9 records unproven, 1 without a topic id taken "
                                      "unproven (--allow-without-topic-id)")
    # only records of a diode older than topic ids, allowed: nothing unproven
    old = [u for u in loose if u["reason"] == "no-topic-id"]
    assert summary(judged, None, old, without_topic_id=True)["unproven"] == 0
