"""`diode verify --stream`: keep auditing the destination topics as records arrive.

A Structured Streaming query reads the destination topics (and the heartbeat topic, for the
missing tail) in micro-batches of at most `--max-offsets-per-trigger` records. Each batch is
reduced on Spark to a small summary per incarnation of a source partition (diode.spark.verify
SOURCE: topic, partition and topic id; runs of consecutive source offsets, record and
out-of-order counts, latency); the driver folds it into one `PartitionLedger` per incarnation
(diode.accounting.ledger) and writes an event for every newly missing range and every later
fill, to a Kafka topic and/or Parquet. The ledgers are saved in the checkpoint directory after
each batch, beside Spark's own checkpoint, so a restarted audit carries on without reporting a
range twice; a batch Spark replays after a crash is recognised by its id.
Events are written before the ledger is saved: after a crash, a batch's events may be written
twice (at least once).
"""

import json
import os
import re
import signal
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from diode.kafka.messages import AUDIT, audit_event, audit_record
from diode.accounting.ledger import PartitionLedger
from diode.runtime import files
from diode.spark.verify import (_quantiles, claims, kafka_reader, pattern_of, provenance, say,
                                session, summarize)

EVENT_SCHEMA = AUDIT.spark_schema()  # (diode.kafka.messages: the columns of --missing-parquet)


# -- the driver's side: ledgers, events, checkpoint ----------------------------------------------

class StreamAudit:
    """foreachBatch target: folds each micro-batch into the ledgers and writes events."""

    def __init__(self, spark: SparkSession, args, sinks: list):
        self.spark, self.args, self.sinks = spark, args, sinks
        self.settings = {"grace_ms": int(args.grace_seconds * 1000)}
        self.path = os.path.join(args.checkpoint, "diode-ledger.json")
        self.batch_id, self.ledgers = -1, {}
        if os.path.exists(self.path):
            with open(self.path) as f:
                saved = json.load(f)
            self.batch_id = saved["batch"]
            # (a ledger saved before topic ids names none: its partitions' null incarnation)
            self.ledgers = {(e["topic"], e["partition"], e.get("topicId")):
                            PartitionLedger.from_json(e["ledger"], **self.settings)
                            for e in saved["partitions"]}
            say(f"carrying on from batch {self.batch_id}: {len(self.ledgers)} source "
                "partitions, " + self._open_text())

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        if batch_id <= self.batch_id:  # replayed by Spark after a restart: already counted
            return
        hb = self.args.heartbeat_topic
        # read the batch once: without record values, except the heartbeats'
        slim = df.select("topic", "partition", "offset", "timestamp", "headers",
                         F.when(F.col("topic") == F.lit(hb or ""), F.col("value"))
                         .alias("value")).persist()
        p = provenance(slim.where(F.col("topic") != hb) if hb else slim,
                       self.args.written_at_header)
        known = None
        if self.ledgers:
            known = self.spark.createDataFrame(
                [(*key, led.last) for key, led in self.ledgers.items()],
                "sourceTopic string, sourcePartition int, sourceTopicId string, last long")
        total = slim.count()
        # a batch cut short by maxOffsetsPerTrigger means the audit is still catching up
        caught_up = total < self.args.max_offsets_per_trigger
        rows = summarize(p, known).collect()
        beats = claims(slim.where(F.col("topic") == hb)).collect() if hb else []
        batch_latency = p.agg(_quantiles().alias("q")).first()["q"]
        slim.unpersist()
        now = int(time.time() * 1000)
        for r in rows:
            self._ledger(r.sourceTopic, r.sourcePartition, r.sourceTopicId).add(
                [(x.first, x.last) for x in r.runs], r.records, r.outOfOrder, r.written,
                r.destinationFirst)
        for b in beats:  # (a claim counts for the incarnation it names)
            self._ledger(b.sourceTopic, b.sourcePartition, b.sourceTopicId).claim(
                b.lastSent, b.receivedAt, now, b.firstSent)
        events = []
        for key, led in self._sorted():
            missing, filled = led.settle(now, caught_up)
            events += [self._event("missing", key, r, now, batch_id) for r in missing]
            events += [self._event("filled", key, r, now, batch_id) for r in filled]
        for sink in self.sinks:
            sink(events)
        self._save(batch_id)
        self.batch_id = batch_id
        self._progress(batch_id, rows, events, batch_latency)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

    def _ledger(self, topic: str, partition: int, topic_id: str | None) -> PartitionLedger:
        key = (topic, partition, topic_id)
        if key not in self.ledgers:
            self.ledgers[key] = PartitionLedger(**self.settings)
        return self.ledgers[key]

    def _sorted(self) -> list:
        """(key, ledger) by topic, partition and topic id (the null one first)."""
        return sorted(self.ledgers.items(), key=lambda kv: (kv[0][:2], kv[0][2] or ""))

    @staticmethod
    def _event(kind, key, r, now, batch_id) -> dict:
        topic, partition, topic_id = key
        return audit_event(kind, topic, partition, topic_id, r[0], r[1], now, batch_id)

    def _save(self, batch_id: int) -> None:
        # replaced whole: a crash leaves the old ledger or the new one
        files.replace_json(self.path, {"batch": batch_id, "partitions": [
            {"topic": t, "partition": p, "topicId": i, "ledger": led.to_json()}
            for (t, p, i), led in self._sorted()]}, sync=False)
        if self.args.json:
            files.replace_json(self.args.json, self.report(), sync=False, indent=1)

    def report(self) -> dict:
        parts = [{"sourceTopic": t, "sourcePartition": p, "sourceTopicId": i,
                  "records": led.records, "duplicates": led.duplicates,
                  "outOfOrder": led.out_of_order,
                  "last": led.last, "settled": led.settled,
                  "missing": sum(b - a + 1 for a, b in led.reported) + led.settled,
                  "missingRanges": [{"first": a, "last": b} for a, b in led.reported]}
                 for (t, p, i), led in self._sorted()]
        return {"batch": self.batch_id, "partitions": parts,
                "totals": {k: sum(r[k] for r in parts)
                           for k in ("records", "duplicates", "outOfOrder", "missing")}}

    def _open_text(self) -> str:
        ranges = sum(len(led.reported) for led in self.ledgers.values())
        n = sum(b - a + 1 for led in self.ledgers.values() for a, b in led.reported)
        return f"{ranges} missing ranges open ({n} records)"

    def _progress(self, batch_id, rows, events, latency) -> None:
        n = sum(r.records for r in rows)
        kinds = [e["type"] for e in events]
        lat = f"; latency p50 {latency[0]} ms, p99 {latency[2]} ms" \
            if latency and latency[0] is not None else ""
        say(f"batch {batch_id}: {n} records of {len(rows)} source partitions, "
            f"{kinds.count('missing')} new missing ranges, {kinds.count('filled')} filled; "
            f"{self._open_text()}{lat}")


class KafkaSink:
    """Events as JSON to a topic (keyed by source partition, like the receiver's events)."""

    def __init__(self, cluster, topic: str):
        from confluent_kafka import Producer

        from diode.kafka.cluster import librdkafka_log, settings_of
        settings = settings_of(cluster)
        self.bootstrap, self.topic, self.failures = settings["bootstrap.servers"], topic, []
        self.producer = Producer({**settings, "enable.idempotence": True,
                                  "logger": librdkafka_log()})

    def __call__(self, events: list) -> None:
        for e in events:
            key, value = audit_record(e)
            self.producer.produce(self.topic, key=key, value=value, on_delivery=self._delivered)
            self.producer.poll(0)
        if self.producer.flush(30) or self.failures:
            raise RuntimeError(f"could not write missing-range events to {self.topic} on "
                               f"{self.bootstrap}: {self.failures[:1] or 'timed out'}")

    def _delivered(self, err, msg):
        if err is not None:
            self.failures.append(err)

    def close(self) -> None:
        self.producer.flush(10)
        self.producer.close()


class ParquetSink:
    def __init__(self, spark: SparkSession, path: str):
        self.spark, self.path = spark, path

    def __call__(self, events: list) -> None:
        if events:
            self.spark.createDataFrame(events, EVENT_SCHEMA).write.mode("append") \
                .parquet(self.path)

    def close(self) -> None:
        pass


def start(spark: SparkSession, args, destination) -> tuple:
    """Start the streaming audit of `destination` (diode.kafka.cluster's: its settings, or
    bootstrap servers): (the StreamingQuery, its StreamAudit)."""
    sinks = []
    if args.missing_topic:
        sinks.append(KafkaSink(destination, args.missing_topic))
    if args.missing_parquet:
        sinks.append(ParquetSink(spark, args.missing_parquet))
    os.makedirs(args.checkpoint, exist_ok=True)
    auditor = StreamAudit(spark, args, sinks)
    pattern = pattern_of(args)
    if args.heartbeat_topic:
        pattern = f"(?:{pattern})|{re.escape(args.heartbeat_topic)}"
    rows = (kafka_reader(spark.readStream, spark, destination,
                         stream_format(args, destination, pattern))
            .option("subscribePattern", pattern)
            .option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger)).load())
    query = (rows.writeStream.foreachBatch(auditor)
             .option("checkpointLocation", os.path.join(args.checkpoint, "spark"))
             .trigger(**({"availableNow": True} if args.available_now else
                         {"processingTime": f"{args.trigger_seconds} seconds"}))
             .queryName("diode-verify").start())
    return query, auditor


def stream_format(args, destination, pattern: str) -> str:
    """--format, or for auto the source that reads to the end on this cluster: Spark's
    streaming Kafka source ends each micro-batch where ListOffsets says, so where a partition's
    high watermark is short of its last record (the embedded Tansu) diode's Python source, which
    reads to the end of partition. (A cluster is seen to answer short only where a partition's
    last batch holds more than one record.)"""
    from diode.spark import coverage
    if args.format == "python":
        return "python"
    short = coverage.short_watermarks(
        coverage.extents(destination, pattern=pattern))
    if not short:
        return args.format
    if args.format == "auto":
        say(f"the high watermark of {short[0]} is short of its last record: auditing with "
            "diode's Python source, which reads to the end of partition")
        return "python"
    say(f"warning: the high watermark of {short[0]} is short of its last record: Spark's "
        "Kafka source (--format native) will read short on this cluster; use --format python")
    return args.format


def main(args, destination, source=None) -> int:
    """Audit `destination` (diode.kafka.cluster's Cluster) until Ctrl-C/SIGTERM (or
    --run-seconds); exit 1 if ranges are still missing. (`source`: refused, a batch audit's.)"""
    if not args.checkpoint:
        raise SystemExit("diode verify --stream needs --checkpoint DIR (Spark's checkpoint and "
                         "the audit's ledger; a restart carries on from it)")
    if source is not None or args.manifest or args.digest_topic:
        raise SystemExit("diode verify --stream: the source cluster (--source-topology, "
                         "--source-bootstrap, -S), --manifest and --digest-topic are for batch "
                         "audits; run one without --stream")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append("SIGTERM"))
    say(f"starting Spark ({args.master or 'spark-submit master or local[*]'})")
    spark = session(args.master, source=args.format)
    try:
        query, auditor = start(spark, args, destination)
        say(f"streaming audit of {pattern_of(args)} on {destination.name}: a batch every "
            f"{args.trigger_seconds:g} s, checkpoint {args.checkpoint}; Ctrl-C stops")
        deadline = time.monotonic() + args.run_seconds if args.run_seconds else None
        try:
            while not stop and query.isActive and (deadline is None
                                                   or time.monotonic() < deadline):
                query.awaitTermination(1)
        except KeyboardInterrupt:
            pass
        query.stop()
        auditor.close()
        if query.exception() is not None:
            say(f"the streaming query failed: {query.exception()}")
            return 2
    finally:
        spark.stop()
    rep = auditor.report()
    say(f"stopped after batch {rep['batch']}: {auditor._open_text()}")
    return 1 if rep["totals"]["missing"] else 0
