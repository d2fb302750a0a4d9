"""Content proven one way (diode.accounting.digests, diode.spark.digests): the sender digests
what it reads, the receiver writes the digests to receiver.digest.topic, and `diode verify
--digest-topic` checks the destination against them without the source cluster. On Apache
Kafka and on Tansu."""

import json
import subprocess
import sys

from pyspark.sql import functions as F

from diode.spark.digests import check, extract_digests, reported_missing, summary
from diode.spark.verify import extract
from tests.spark.examples import examples, for_brokers
from tests.conftest import (ROOT, consume, create_topic, headers_of, produce, wait_for,
                            write_topology)

TOTAL, PER_DIGEST = 400, 50


# the demo topology's names (topology.yaml), which the examples of docs/verification.md use
DEMO = {"topic.prefix": "dest_", "digest.topic": "diode-digests",
        "missing.records.topic": "diode-missing"}


def verify_args(dst, *more, prefix="dst_", digests="digests", missing="missing") -> list:
    return ["--bootstrap", dst, "--prefix", prefix, "--digest-topic", digests,
            "--missing-records-topic", missing, "--master", "local[2]", "--format", "python",
            *more]


def verify(dst, *more) -> subprocess.CompletedProcess:
    """`diode verify` as a process of its own (its own JVM)."""
    return subprocess.run([sys.executable, "-m", "diode", "verify", *verify_args(dst, *more)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_verify_proves_the_content_and_names_an_altered_and_a_deleted_record(
        spark, brokers, launch, tmp_path, verify_here):
    """On a topology with the demo's names, the `diode verify` examples of the docs first, as
    printed but for the ports: the first as a process (its own JVM, the source the default
    --format picks), the others in this process on the shared session (as `diode verify` is
    below; the compaction test runs it as a process)."""
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
        if i == 0:
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
            assert f"digests: {TOTAL // PER_DIGEST} ranges verified, 0 altered, 0 incomplete" \
                in r.stdout, said

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
        start_brokers, launch, tmp_path):
    """A real compaction (Apache Kafka's log cleaner; Tansu does not compact): a newer record
    with the key of a replicated one, written to the destination by someone else, and the
    cleaner removes the replicated one. `diode verify --digest-topic` names its range
    incomplete, the record absent and not reported missing."""
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
    r = verify(dst.bootstrap)
    assert r.returncode == 1, r.stderr[-3000:] + r.stdout
    assert "digests: 1 ranges verified, 0 altered, 1 incomplete (1 with records not reported " \
        "missing)" in r.stdout, r.stdout
    assert "incomplete: src[0] 0..49: 49 of 50 records; absent: 10..10 (NOT reported " \
        "missing)" in r.stdout, r.stdout
