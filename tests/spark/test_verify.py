"""diode verify on Spark: known answers from records planted in a real (embedded) broker."""

import json
import subprocess
import sys

from diode import ticket_command
from diode.runtime import topology as topo
from diode.spark.kafka_source import choose_format
from diode.spark.verify import (
    audit,
    extract,
    extract_heartbeats,
    latency,
    manifest,
    provenance,
    report,
)
from tests.conftest import (RECENT_MS, consume, create_topic, only_on, produce,
                            write_topology)


def origin(topic, partition, offset):
    return [("sourceTopic", topic.encode()), ("sourcePartition", str(partition).encode()),
            ("sourceOffset", str(offset).encode())]


def plant(bootstrap):
    """dst_a: source a[0] offsets 0..19 without 3,4 and 15, with 7 twice and 9 before 8;
    source a[1] offsets 0..4 complete, written 10, 20, 30, 40 and 50 ms after their source
    timestamps, one with repeated and upstream headers. dst_b: source b[0] 100..104, while the
    heartbeats say the sender's chain started at 97 (a lost head: 97..99)."""
    create_topic(bootstrap, "dst_a", 2)
    order = [o for o in range(20) if o not in (3, 4, 15)]
    i, j = order.index(8), order.index(9)
    order[i], order[j] = order[j], order[i]
    recs = [{"value": b"a0-%d" % o, "partition": 0, "headers": origin("a", 0, o)}
            for o in order + [7]]
    t = RECENT_MS
    # a1@2 crossed an upstream diode before: its own headers repeat keys and hold that
    # diode's provenance; the last (nearest) provenance counts
    upstream = [("trace", b"1"), ("trace", b"2"), ("sourceOffset", b"999")]
    recs += [{"value": b"a1-%d" % o, "partition": 1, "timestamp": t,
              "headers": (upstream if o == 2 else []) + origin("a", 1, o)
              + [("writtenAt", b"%d" % (t + 10 * (o + 1)))]}
             for o in range(5)]
    produce(bootstrap, "dst_a", recs)
    create_topic(bootstrap, "dst_b", 1)
    produce(bootstrap, "dst_b", [{"value": b"b", "headers": origin("b", 0, o)}
                                 for o in range(100, 105)])
    create_topic(bootstrap, "not_replicated", 1)
    produce(bootstrap, "not_replicated", [{"value": b"no provenance"}])
    create_topic(bootstrap, "beats", 1)
    produce(bootstrap, "beats", [{"value": json.dumps({"lastSent": [
        {"topic": "a", "partition": 0, "offset": 22, "chainStart": 0},
        {"topic": "b", "partition": 0, "offset": 104, "chainStart": 97}]}).encode()}])


def test_python_kafka_source_reads_every_record_with_the_native_schema(spark, brokers):
    src, _ = brokers
    create_topic(src.bootstrap, "t", 3)
    produce(src.bootstrap, "t", [{"value": b"%d" % i, "key": b"k", "partition": i % 3,
                                  "headers": [("h", b"v")], "timestamp": RECENT_MS}
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
    assert r.timestampType == 0 and r.timestamp.timestamp() * 1000 == RECENT_MS
    ending = (spark.read.format(fmt).option("kafka.bootstrap.servers", src.bootstrap)
              .option("subscribe", "t").option("endingOffsets", json.dumps({"t": {"0": 10}}))
              .load().where("partition = 0").count())
    assert ending == 10


@only_on("tansu")
def test_audit_names_exactly_the_planted_gaps_duplicates_and_reordering_and_a_short_read(
        spark, brokers, verify_here, monkeypatch):
    """On Tansu, whose short ListOffsets "latest" the audit must read past; on Apache Kafka
    the next test audits the same planted records with both sources (the same report, 9
    missing)."""
    _, dst = brokers
    plant(dst.bootstrap)
    rows = extract(spark, dst.bootstrap, "dst_.*", "python")
    beats = extract_heartbeats(spark, dst.bootstrap, "beats", "python")
    p = provenance(rows)
    rep = report(audit(p, beats))
    by = {(r["sourceTopic"], r["sourcePartition"]): r for r in rep["partitions"]}
    assert set(by) == {("a", 0), ("a", 1), ("b", 0)}
    a0 = by[("a", 0)]
    assert (a0["records"], a0["distinct"], a0["duplicates"]) == (18, 17, 1)
    # holes inside, and the tail the heartbeats announced (20..22)
    assert a0["missingRanges"] == [{"first": 3, "last": 4}, {"first": 15, "last": 15},
                                   {"first": 20, "last": 22}]
    assert a0["missing"] == 6
    assert a0["outOfOrder"] == 2  # 8 after 9, and the second 7
    assert (by[("a", 1)]["missing"], by[("a", 1)]["outOfOrder"], by[("a", 1)]["last"]) == \
        (0, 0, 4)
    b0 = by[("b", 0)]  # the head the heartbeats' chain start says was sent
    assert (b0["first"], b0["missing"], b0["missingRanges"]) == (100, 3, [{"first": 97,
                                                                            "last": 99}])
    a1 = by[("a", 1)]  # end-to-end latency, from the writtenAt header and the timestamp
    assert (a1["latencyP50"], a1["latencyP99"], a1["latencyMax"]) == (30, 50, 50)
    assert a0["latencyP50"] is None  # no writtenAt header: no latency, rather than a guess
    assert latency(p) == {"p50": 30, "p90": 50, "p99": 50, "max": 50}
    assert manifest(rep) == {"version": 1, "missing": [
        {"topic": "a", "partition": 0, "ranges": [[3, 4], [15, 15], [20, 22]]},
        {"topic": "b", "partition": 0, "ranges": [[97, 99]]}]}

    # The Kafka source given an end 3 offsets short of dst_a[0]'s last record (offset 17), as
    # Spark's own source was when it trusted a ListOffsets answered short (Tansu's): exit 2,
    # the partition and what was not read named, no report. --format auto reads it again with
    # the Python source first (given the same end here, it reads short too).
    from diode.spark import coverage
    pin = coverage.pin

    def short(reader, held):
        return pin(reader, {tp: e._replace(end=e.end - 3) if tp == ("dst_a", 0) else e
                            for tp, e in held.items()})
    monkeypatch.setattr(coverage, "pin", short)
    r = verify_here("--bootstrap", dst.bootstrap, "--prefix", "dst_", "--format", "auto")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "dst_a[0]: read to offset 14, but it holds records to offset 17: offsets 15..17 " \
        "not read (3 offsets)" in r.stderr, r.stderr[-3000:]
    assert "reading it again with diode's Python source" in r.stderr
    assert "total:" not in r.stdout and "missing" not in r.stdout


def test_native_kafka_source_gives_the_same_audit_as_the_python_source(spark,
                                                                      start_brokers,
                                                                      verify_here,
                                                                      monkeypatch):
    """spark-sql-kafka (fetched through mvn) and diode's Python source, on the same topics:
    the same report. Then records deleted while the audit reads are named as not read.
    Apache Kafka only (DeleteRecords); both sources read to the real end on Tansu too
    (test_digests runs the docs' examples there with the default source)."""
    dst, = start_brokers("kafka", "destination")
    plant(dst.bootstrap)
    reports = {}
    for source, fmt in (("python", "diode_kafka"), ("native", "kafka")):
        assert choose_format(spark, source) == fmt
        rows = extract(spark, dst.bootstrap, "dst_.*", source)
        beats = extract_heartbeats(spark, dst.bootstrap, "beats", source)
        reports[source] = report(audit(provenance(rows), beats))
    assert reports["native"]["totals"]["missing"] == 9
    assert reports["native"] == reports["python"]
    assert choose_format(spark, "auto") == "kafka"  # on the classpath: the native one

    # dst_a[0]'s first 5 records deleted (as retention would remove them) after the audit
    # found what the partition holds and before it reads it: exit 2, the offsets named
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from diode.spark import coverage
    found = coverage.extents

    def then_delete(*args, **kw):
        held = found(*args, **kw)
        admin = AdminClient({"bootstrap.servers": dst.bootstrap})
        for f in admin.delete_records([TopicPartition("dst_a", 0, 5)]).values():
            f.result(30)
        return held
    monkeypatch.setattr(coverage, "extents", then_delete)
    r = verify_here("--bootstrap", dst.bootstrap, "--prefix", "dst_", "--format", "native")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "dst_a[0]: read from offset 5, but it held records from offset 0 when the audit " \
        "began: offsets 0..4 not read (5 offsets;" in r.stderr, r.stderr[-3000:]


def test_verify_command_prints_the_table_and_exits_1_when_records_are_missing(brokers,
                                                                            tmp_path,
                                                                            verify_here):
    """Through Spark's own connector on both brokers (given the ends a consumer found, it reads
    Tansu to the end too). In this process on the shared session: the command as a process of
    its own runs in test_digests (the docs' examples, on both brokers)."""
    src, dst = brokers
    plant(dst.bootstrap)
    create_topic(src.bootstrap, "b", 1)  # the source of dst_b, for the comparison
    produce(src.bootstrap, "b", [{"value": b"b"} for _ in range(105)])
    out = tmp_path / "report.json"
    topology = write_topology(tmp_path, src.bootstrap, dst.bootstrap)  # (its key signs)
    r = verify_here("--bootstrap", dst.bootstrap, "--prefix", "dst_", "--heartbeat-topic",
                    "beats", "--json", out, "--manifest", tmp_path / "manifest.json",
                    "--master", "local[2]", "--topology", topology,
                    "--source-bootstrap", src.bootstrap, "--format", "native")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "a[0]" in r.stdout and "3..4, 15..15, 20..22" in r.stdout
    # b[0] holds offsets 0..104 at the source; the destination has only 100..104
    assert "against the source: 100 lost, 0 duplicated, 0 altered" in r.stdout
    assert json.loads(out.read_text())["totals"]["missing"] == 9
    written = json.loads((tmp_path / "manifest.json").read_text())
    assert written["missing"][0]["ranges"] == [[3, 4], [15, 15], [20, 22]]
    assert ticket_command.manifest_problem(topo.load(str(topology)), written) is None


@only_on("tansu")
def test_compare_with_the_source_names_lost_duplicated_and_altered_records(spark, brokers):
    """compare() on what the Python source read of both clusters: on Tansu alone, as reading
    to the real end on each broker is test_python_kafka_source's, and the comparison is the
    same whichever broker held the records."""
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
        own = [("h", b"2")] if o == 2 else [("h", b"1")]  # altered too
        copies = 2 if o == 8 else 1  # duplicated
        stamp = [("writtenAt", b"1795311657390")] if o % 2 else []  # left out of the comparison
        written += [{"value": value, "key": b"k",
                     "headers": own + origin("s", 0, o) + stamp}] * copies
    produce(dst.bootstrap, "dst_s", written)
    fmt = choose_format(spark, "python")

    def read(bootstrap, topic):
        return (spark.read.format(fmt).option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic).load())
    (row,) = compare(read(src.bootstrap, "s"), read(dst.bootstrap, "dst_s")).collect()
    assert row.asDict() == {"sourceTopic": "s", "sourcePartition": 0, "sourceTopicId": None,
                            "sourceRecords": 10, "lost": 1, "duplicated": 1, "altered": 2}


def numbers(bootstrap, lo, hi):
    produce(bootstrap, "t", [{"value": b"%d" % i, "partition": i % 3} for i in range(lo, hi)])


def to_memory(spark, bootstrap, name, checkpoint, **options):
    """A streaming query from topic t into the memory table `name`."""
    reader = (spark.readStream.format(choose_format(spark, "python"))
              .option("kafka.bootstrap.servers", bootstrap).option("subscribe", "t"))
    for k, v in options.items():
        reader = reader.option(k, v)
    return (reader.load().writeStream.format("memory").queryName(name)
            .option("checkpointLocation", str(checkpoint)).start())


def test_stream_reader_caps_each_micro_batch_and_picks_up_new_records(spark, brokers,
                                                                     tmp_path):
    src, _ = brokers
    create_topic(src.bootstrap, "t", 3)
    numbers(src.bootstrap, 0, 3000)
    q = to_memory(spark, src.bootstrap, "capped", tmp_path / "ck", maxOffsetsPerTrigger="1000")
    try:
        q.processAllAvailable()
        assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == \
            [1000, 1000, 1000]
        numbers(src.bootstrap, 3000, 3500)
        q.processAllAvailable()
    finally:
        q.stop()
    values = [int(r.value) for r in spark.sql("select value from capped").collect()]
    assert sorted(values) == list(range(3500))  # each once, to the real end of partition
    # startingOffsets latest: from the real end (this broker's ListOffsets says less), so
    # only what comes after the start
    q = to_memory(spark, src.bootstrap, "latest", tmp_path / "ck-latest",
                  startingOffsets="latest")
    try:
        q.processAllAvailable()
        numbers(src.bootstrap, 3500, 3600)
        q.processAllAvailable()
    finally:
        q.stop()
    values = [int(r.value) for r in spark.sql("select value from latest").collect()]
    assert sorted(values) == list(range(3500, 3600))


def stream_args(tmp_path, bootstrap, **kw):
    from argparse import Namespace
    args = dict(bootstrap=bootstrap, prefix="dst_", pattern=None, heartbeat_topic="beats",
                written_at_header="writtenAt", format="python", checkpoint=str(tmp_path / "ck"),
                missing_topic="audit-missing", missing_parquet=str(tmp_path / "missing"),
                trigger_seconds=0.5, max_offsets_per_trigger=10, grace_seconds=0.0, json=None,
                available_now=False)
    args.update(kw)
    return Namespace(**args)


@only_on("tansu")
def test_streaming_audit_reports_missing_ranges_then_fills_and_carries_on_after_restart(
        spark, brokers, tmp_path):
    """On Tansu, whose short ListOffsets "latest" the stream must read past: the stream
    reader's test reads to the real end on both brokers, and the spark-submit test below runs
    the same streaming audit, and carries it on from its checkpoint, on Apache Kafka."""
    from diode.spark import stream
    _, dst = brokers
    plant(dst.bootstrap)
    create_topic(dst.bootstrap, "audit-missing", 1)
    args = stream_args(tmp_path, dst.bootstrap, json=str(tmp_path / "now.json"))

    def events():
        rows = spark.read.parquet(args.missing_parquet).collect()
        return sorted((r.type, r.sourceTopic, r.sourcePartition, r.firstOffset, r.lastOffset)
                      for r in rows)

    q, auditor = stream.start(spark, args, dst.bootstrap)
    try:
        q.processAllAvailable()
        # several micro-batches (10 records each at most), the same answer as the batch audit
        assert len([p for p in q.recentProgress if p["numInputRows"]]) >= 3
        assert events() == [("missing", "a", 0, 3, 4), ("missing", "a", 0, 15, 15),
                            ("missing", "a", 0, 20, 22), ("missing", "b", 0, 97, 99)]
        rep = json.loads((tmp_path / "now.json").read_text())
        a0 = next(r for r in rep["partitions"] if r["sourcePartition"] == 0
                  and r["sourceTopic"] == "a")
        assert (a0["records"], a0["duplicates"], a0["outOfOrder"], a0["missing"]) == \
            (18, 1, 2, 6)
        # a resend fills 3..4
        produce(dst.bootstrap, "dst_a", [{"value": b"a0-%d" % o, "partition": 0,
                                          "headers": origin("a", 0, o)} for o in (3, 4)])
        q.processAllAvailable()
        assert ("filled", "a", 0, 3, 4) in events()
    finally:
        q.stop()
        auditor.close()
    # restarted from its checkpoint: nothing reported twice, and later fills still seen
    q, auditor = stream.start(spark, args, dst.bootstrap)
    try:
        produce(dst.bootstrap, "dst_a", [{"value": b"a0-15", "partition": 0,
                                          "headers": origin("a", 0, 15)}])
        q.processAllAvailable()
    finally:
        q.stop()
        auditor.close()
    assert events() == [("filled", "a", 0, 3, 4), ("filled", "a", 0, 15, 15),
                        ("missing", "a", 0, 3, 4), ("missing", "a", 0, 15, 15),
                        ("missing", "a", 0, 20, 22), ("missing", "b", 0, 97, 99)]
    assert [(r["sourceTopic"], r["missingRanges"]) for r in auditor.report()["partitions"]
            if r["missingRanges"]] == [("a", [{"first": 20, "last": 22}]),
                                       ("b", [{"first": 97, "last": 99}])]
    # the same events went to the missing-records topic
    sent = [json.loads(m.value()) for m in consume(dst.bootstrap, "audit-missing", 6)]
    assert sorted((e["type"], e["firstOffset"]) for e in sent) == [
        ("filled", 3), ("filled", 15), ("missing", 3), ("missing", 15), ("missing", 20),
        ("missing", 97)]


def test_spark_submit_runs_an_incremental_streaming_audit_that_carries_on(brokers, broker_kind,
                                                                         tmp_path, verify_here):
    """The documented spark-submit command, with --stream --available-now: each run audits
    what arrived since the last one, from its checkpoint, and exits 0 once nothing is missing.
    The next run, from the same checkpoint, is `diode verify` with the same arguments in this
    process (on the shared session: a second spark-submit would be a JVM more to start).
    spark-submit runs on Apache Kafka; on Tansu the first run is in this process too: what
    the broker changes is where an available-now run ends (Tansu's ListOffsets "latest" is
    short, docs/design.md §8), not how spark-submit starts the command, which costs a JVM of
    some 20 s."""
    import os
    from pathlib import Path

    import pyspark

    import diode.spark.command
    _, dst = brokers
    plant(dst.bootstrap)
    report_path = tmp_path / "report.json"
    args = ["--bootstrap", dst.bootstrap, "--prefix", "dst_", "--heartbeat-topic", "beats",
            "--stream", "--available-now", "--checkpoint", str(tmp_path / "ck"),
            "--grace-seconds", "0", "--max-offsets-per-trigger", "20", "--format", "python",
            "--json", str(report_path)]
    cmd = [str(Path(pyspark.__file__).parent / "bin" / "spark-submit"), "--master", "local[2]",
           "--conf", f"spark.pyspark.python={sys.executable}", diode.spark.command.__file__,
           *args]
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env) \
        if broker_kind == "kafka" else verify_here(*args)
    assert first.returncode == 1, first.stderr[-3000:]
    # progress, batch by batch (spark-submit puts the driver's stderr on its stdout)
    assert "diode verify: batch 0:" in first.stdout + first.stderr
    rep = json.loads(report_path.read_text())
    assert rep["totals"]["missing"] == 9
    produce(dst.bootstrap, "dst_a", [{"value": b"a0-%d" % o, "partition": 0,
                                      "headers": origin("a", 0, o)}
                                     for o in (3, 4, 15, 20, 21, 22)])
    produce(dst.bootstrap, "dst_b", [{"value": b"b", "headers": origin("b", 0, o)}
                                     for o in (97, 98, 99)])
    second = verify_here(*args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "carrying on from batch" in second.stdout + second.stderr
    rep = json.loads(report_path.read_text())
    assert rep["totals"]["missing"] == 0 and rep["totals"]["records"] == 37


def test_audit_reports_a_lost_head_only_where_the_destination_still_starts_at_zero(spark):
    """audit() alone, on provenance rows: x[0] sits in a destination partition that starts at
    offset 0, y[0] in one whose first records are gone (retention): the same heartbeat claim,
    chain started at 0, is a lost head for x and nothing for y."""
    schema = ("topic string, partition int, offset long, sourceTopic string, "
              "sourcePartition int, sourceOffset long, sourceTopicId string, writtenAt long, "
              "latencyMs long")
    rows = [("dx", 0, o - 10, "x", 0, o, None, None, None) for o in range(10, 15)]
    rows += [("dy", 0, o + 90, "y", 0, o, None, None, None) for o in range(10, 15)]
    beats = spark.createDataFrame([("x", 0, None, 0, 14), ("y", 0, None, 0, 14)],
                                  "sourceTopic string, sourcePartition int, "
                                  "sourceTopicId string, firstSent long, lastSent long")
    rep = report(audit(spark.createDataFrame(rows, schema), beats))
    assert {r["sourceTopic"]: r["missingRanges"] for r in rep["partitions"]} == {
        "x": [{"first": 0, "last": 9}], "y": []}
