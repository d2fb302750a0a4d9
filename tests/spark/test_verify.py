"""diode verify on Spark: known answers from records planted in a real (embedded) broker."""

import json
import subprocess
import sys

from diode.spark.kafka_source import choose_format
from diode.spark.verify import audit, extract, extract_heartbeats, manifest, report
from tests.conftest import create_topic, produce


def provenance(topic, partition, offset):
    return [("sourceTopic", topic.encode()), ("sourcePartition", str(partition).encode()),
            ("sourceOffset", str(offset).encode())]


def plant(bootstrap):
    """dst_a: source a[0] offsets 0..19 without 3,4 and 15, with 7 twice and 9 before 8;
    source a[1] offsets 0..4 complete. dst_b: source b[0] 100..104 complete."""
    create_topic(bootstrap, "dst_a", 2)
    order = [o for o in range(20) if o not in (3, 4, 15)]
    i, j = order.index(8), order.index(9)
    order[i], order[j] = order[j], order[i]
    recs = [{"value": b"a0-%d" % o, "partition": 0, "headers": provenance("a", 0, o)}
            for o in order + [7]]
    recs += [{"value": b"a1-%d" % o, "partition": 1, "headers": provenance("a", 1, o)}
             for o in range(5)]
    produce(bootstrap, "dst_a", recs)
    create_topic(bootstrap, "dst_b", 1)
    produce(bootstrap, "dst_b", [{"value": b"b", "headers": provenance("b", 0, o)}
                                 for o in range(100, 105)])
    produce(bootstrap, "not_replicated", [{"value": b"no provenance"}])
    create_topic(bootstrap, "beats", 1)
    produce(bootstrap, "beats", [{"value": json.dumps({"lastSent": [
        {"topic": "a", "partition": 0, "offset": 22},
        {"topic": "b", "partition": 0, "offset": 104}]}).encode()}])


def test_python_kafka_source_reads_every_record_with_the_native_schema(spark, brokers):
    src, _ = brokers
    create_topic(src.bootstrap, "t", 3)
    produce(src.bootstrap, "t", [{"value": b"%d" % i, "key": b"k", "partition": i % 3,
                                  "headers": [("h", b"v")], "timestamp": 1_700_000_000_000}
                                 for i in range(3000)])
    fmt = choose_format(spark, "python")
    df = (spark.read.format(fmt).option("kafka.bootstrap.servers", src.bootstrap)
          .option("subscribe", "t").option("maxRecordsPerPartition", "300").load())
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp",
                          "timestampType", "headers"]
    rows = df.collect()
    assert len(rows) == 3000  # to the real end, although this broker's "latest" is wrong
    assert sorted(int(r.value) for r in rows) == list(range(3000))
    r = rows[0]
    assert r.key == b"k" and r.headers[0].key == "h" and r.headers[0].value == b"v"
    assert r.timestampType == 0 and r.timestamp.year == 2023
    ending = (spark.read.format(fmt).option("kafka.bootstrap.servers", src.bootstrap)
              .option("subscribe", "t").option("endingOffsets", json.dumps({"t": {"0": 10}}))
              .load().where("partition = 0").count())
    assert ending == 10


def test_audit_names_exactly_the_planted_gaps_duplicates_and_reordering(spark, brokers):
    _, dst = brokers
    plant(dst.bootstrap)
    rows = extract(spark, dst.bootstrap, "dst_.*", "python")
    beats = extract_heartbeats(spark, dst.bootstrap, "beats", "python")
    rep = report(audit(rows, beats))
    by = {(r["sourceTopic"], r["sourcePartition"]): r for r in rep["partitions"]}
    assert set(by) == {("a", 0), ("a", 1), ("b", 0)}
    a0 = by[("a", 0)]
    assert (a0["records"], a0["distinct"], a0["duplicates"]) == (18, 17, 1)
    # holes inside, and the tail the heartbeats announced (20..22)
    assert a0["missingRanges"] == [{"first": 3, "last": 4}, {"first": 15, "last": 15},
                                   {"first": 20, "last": 22}]
    assert a0["missing"] == 6
    assert a0["outOfOrder"] == 2  # 8 after 9, and the second 7
    assert (by[("a", 1)]["missing"], by[("a", 1)]["outOfOrder"]) == (0, 0)
    assert (by[("b", 0)]["first"], by[("b", 0)]["missing"]) == (100, 0)
    assert manifest(rep) == {"version": 1, "missing": [
        {"topic": "a", "partition": 0, "ranges": [[3, 4], [15, 15], [20, 22]]}]}


def test_verify_command_prints_the_table_and_exits_1_when_records_are_missing(brokers,
                                                                            tmp_path):
    src, dst = brokers
    plant(dst.bootstrap)
    create_topic(src.bootstrap, "b", 1)  # the source of dst_b, for the comparison
    produce(src.bootstrap, "b", [{"value": b"b"} for _ in range(105)])
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "diode", "verify", "--bootstrap", dst.bootstrap,
                        "--prefix", "dst_", "--heartbeat-topic", "beats", "--json", str(out),
                        "--manifest", str(tmp_path / "manifest.json"), "--master", "local[2]",
                        "--source-bootstrap", src.bootstrap,
                        "--format", "python"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "a[0]" in r.stdout and "3..4, 15..15, 20..22" in r.stdout
    # b[0] holds offsets 0..104 at the source; the destination has only 100..104
    assert "against the source: 100 lost, 0 duplicated, 0 altered" in r.stdout
    assert json.loads(out.read_text())["totals"]["missing"] == 6
    assert json.loads((tmp_path / "manifest.json").read_text())["missing"][0]["ranges"] == [
        [3, 4], [15, 15], [20, 22]]


def test_compare_with_the_source_names_lost_duplicated_and_altered_records(spark, brokers):
    from diode.spark.verify import compare
    src, dst = brokers
    create_topic(src.bootstrap, "s", 1)
    produce(src.bootstrap, "s", [{"value": b"v%d" % o, "key": b"k", "headers": [("h", b"1")]}
                                 for o in range(10)])
    create_topic(dst.bootstrap, "dst_s", 1)
    written = []
    for o in range(10):
        if o == 4:
            continue  # lost
        value = b"changed" if o == 6 else b"v%d" % o  # altered
        copies = 2 if o == 8 else 1  # duplicated
        written += [{"value": value, "key": b"k",
                     "headers": [("h", b"1")] + provenance("s", 0, o)}] * copies
    produce(dst.bootstrap, "dst_s", written)
    fmt = choose_format(spark, "python")

    def read(bootstrap, topic):
        return (spark.read.format(fmt).option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic).load())
    (row,) = compare(read(src.bootstrap, "s"), read(dst.bootstrap, "dst_s")).collect()
    assert row.asDict() == {"sourceTopic": "s", "sourcePartition": 0, "sourceRecords": 10,
                            "lost": 1, "duplicated": 1, "altered": 1}
