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
from tests.conftest import (ROOT, consume, create_topic, headers_of, produce, wait_for,
                            write_topology)

TOTAL, PER_DIGEST = 400, 50


def verify(dst, *more) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diode", "verify", "--bootstrap", dst,
                           "--prefix", "dst_", "--digest-topic", "digests",
                           "--missing-records-topic", "missing", "--master", "local[2]",
                           "--format", "python", *more],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_verify_proves_the_content_and_names_an_altered_and_a_deleted_record(
        spark, brokers, launch, tmp_path):
    src, dst = brokers
    create_topic(src.bootstrap, "src", 2)
    topology = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                              sender={"digest.records": PER_DIGEST,
                                      "digest.interval.ms": 1000},
                              receiver={"digest.topic": "digests",
                                        "missing.records.topic": "missing"})
    diode = launch(topology)
    produce(src.bootstrap, "src", [
        {"key": b"k%d" % (i % 7) if i % 3 else None, "value": b"v%d" % i, "partition": i % 2,
         "headers": [("h", b"%d" % i)] if i % 5 else None} for i in range(TOTAL)])
    wait_for(lambda: diode.metric("records", "kafka_writer") == TOTAL, 60, "every record")
    wait_for(lambda: diode.metric("digests", "kafka_writer") == TOTAL // PER_DIGEST, 30,
             "a digest per 50 records")
    assert diode.stop() == 0

    r = verify(dst.bootstrap)
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout
    assert f"digests: {TOTAL // PER_DIGEST} ranges verified, 0 altered, 0 incomplete" \
        in r.stdout, r.stdout

    # a forged copy beside the original: the same provenance, another value
    original = next(m for m in consume(dst.bootstrap, "dst_src", TOTAL, timeout=30)
                    if headers_of(m)["sourceOffset"] == b"60"
                    and headers_of(m)["sourcePartition"] == b"1")
    produce(dst.bootstrap, "dst_src", [{"key": original.key(), "value": b"forged",
                                        "partition": original.partition(),
                                        "timestamp": original.timestamp()[1],
                                        "headers": original.headers()}])
    r = verify(dst.bootstrap, "--json", str(tmp_path / "report.json"))
    assert r.returncode == 1, r.stderr[-3000:] + r.stdout
    assert "altered: src[1] 50..99: 1 offset(s) written with two contents" in r.stdout, r.stdout
    report = json.loads((tmp_path / "report.json").read_text())["digests"]
    assert (report["verified"], report["altered"], report["incomplete"]) == \
        (TOTAL // PER_DIGEST - 1, 1, 0)

    # a record gone from the destination (as a compaction would take it): the range is
    # incomplete, and the receiver never reported it missing
    rows = extract(spark, dst.bootstrap, "dst_src", "python")
    gone = rows.where(~((F.col("partition") == 0) & (F.col("offset") == 10)))
    judged = [r.asDict(recursive=True) for r in check(
        gone, extract_digests(spark, dst.bootstrap, "digests", "python")).collect()]
    s = summary(judged, reported_missing(dst.bootstrap, "missing"))
    assert (s["altered"], s["incomplete"], s["unreported"]) == (1, 1, 1)
    incomplete = next(x for x in s["ranges"] if x["state"] == "incomplete")
    assert (incomplete["sourcePartition"], incomplete["firstOffset"], incomplete["present"],
            incomplete["absent"], incomplete["reported"]) == (0, 0, 49, [[10, 10]], False)
    # reported missing by the receiver: known, not silent
    s = summary(judged, {("src", 0, incomplete["sourceTopicId"]): [(5, 12)]})
    assert s["unreported"] == 0
    assert next(x for x in s["ranges"] if x["state"] == "incomplete")["reported"] is True
