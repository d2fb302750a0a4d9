"""`diode verify`: an independent audit, on Spark, of what crossed the diode.

On the low side nobody can ask the sender what it sent, so the audit works from what the
destination holds: the provenance headers of every record (sourceTopic, sourcePartition,
sourceOffset) and, when the receiver records them, the sender's heartbeats (the last offset sent
per partition). Per source partition it reports records, distinct offsets, duplicates, missing
offset ranges, out-of-order arrivals and end-to-end latency. `--stream` keeps auditing
(diode.spark.stream).

Extract, transform and load are separate functions; `provenance` and `audit` (the transform)
are pure DataFrame -> DataFrame functions with known-answer tests.
"""

import json
import logging
import os
import re
import sys
import time

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from diode.spark.kafka_source import choose_format, connector_jars

MISSING = "array<struct<first: long, last: long>>"


def session(master: str | None = None, app: str = "diode verify",
            source: str = "auto") -> SparkSession:
    """The SparkSession: `master` if given; else spark-submit's (--master), else local[*].
    With `source` native (or auto, once it is cached) Spark's Kafka connector is on its
    classpath (kafka_source.connector_jars); under spark-submit, pass --jars yourself."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # not its INFO chatter at exit
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # started by spark-submit
    builder = SparkSession.builder.appName(app) \
        .config("spark.ui.showConsoleProgress", "true")
    if master or not submitted:
        master = master or "local[*]"
        builder = builder.master(master)
    jars = [] if submitted else connector_jars(source)
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    if master and master.startswith("local"):  # one machine: small shuffles, no web UI
        builder = builder.config("spark.sql.shuffle.partitions", "8") \
            .config("spark.ui.enabled", "false") \
            .config("spark.driver.memory", local_memory())
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")  # spark-submit's INFO would bury the progress lines
    return spark


def local_memory() -> str:
    """The JVM heap for a local[*] session: a quarter of this machine's memory, 1 to 8 GiB
    (Spark's default of 1 GiB is tight beside Kafka's fetch buffers and a persisted audit)."""
    import psutil
    gib = psutil.virtual_memory().total / 4 / 2 ** 30
    return f"{max(1, min(8, int(gib)))}g"


# -- extract -------------------------------------------------------------------------------------

def extract(spark: SparkSession, bootstrap: str, pattern: str, mode: str = "auto",
            kafka: dict | None = None) -> DataFrame:
    """The destination topics matching `pattern`, as Kafka rows."""
    reader = kafka_reader(spark.read, spark, bootstrap, mode).option("subscribePattern", pattern)
    for k, v in (kafka or {}).items():
        reader = reader.option(f"kafka.{k}", v)
    return reader.load()


def kafka_reader(reader, spark: SparkSession, bootstrap: str, mode: str):
    """`spark.read` or `spark.readStream` on the chosen Kafka source, from the earliest
    offsets, headers included."""
    return reader.format(choose_format(spark, mode)) \
        .option("kafka.bootstrap.servers", bootstrap).option("includeHeaders", "true") \
        .option("startingOffsets", "earliest")


def extract_heartbeats(spark: SparkSession, bootstrap: str, topic: str,
                       mode: str = "auto") -> DataFrame:
    """(sourceTopic, sourcePartition, firstSent, lastSent) from receiver.heartbeat.topic: where
    the sender's earliest chain started and the highest offset it said it had sent."""
    rows = kafka_reader(spark.read, spark, bootstrap, mode).option("subscribe", topic).load()
    sent = F.from_json(F.col("value").cast("string"),
                       "struct<lastSent: array<struct<topic: string, partition: int, "
                       "offset: long, chainStart: long>>>")
    return (rows.select(F.explode(sent["lastSent"]).alias("s"))
            .groupBy(F.col("s.topic").alias("sourceTopic"),
                     F.col("s.partition").alias("sourcePartition"))
            .agg(F.min("s.chainStart").alias("firstSent"), F.max("s.offset").alias("lastSent")))


# -- transform -----------------------------------------------------------------------------------

def provenance(rows: DataFrame, written_at: str = "writtenAt") -> DataFrame:
    """Destination rows reduced to what the audit needs: where each record sits (topic, partition,
    offset), where it came from (sourceTopic, sourcePartition, sourceOffset), when the
    receiver wrote it (writtenAt, ms) and its end-to-end latency in ms (the `written_at`
    header, receiver.written.at.header, minus the source timestamp the record kept; null
    without the header). Rows without provenance (not written by diode) are left out."""
    stamp = _header(written_at, "long") if written_at else F.lit(None).cast("long")
    return rows.select(
        "topic", "partition", "offset", *_origin(),
        stamp.alias("writtenAt"),
        (stamp - F.unix_millis("timestamp")).alias("latencyMs"),
    ).where(F.col("sourceOffset").isNotNull())


def _origin() -> list:
    """sourceTopic, sourcePartition, sourceOffset columns from the provenance headers."""
    return [_header("sourceTopic", "string").alias("sourceTopic"),
            _header("sourcePartition", "int").alias("sourcePartition"),
            _header("sourceOffset", "long").alias("sourceOffset")]


def _header(name: str, kind: str):
    """The value of the last header called `name` (the receiver appends its own last: a record
    that crossed two diodes keeps both provenances, and the nearer one counts), as `kind`; null
    when absent or not a number. Kafka allows repeated header keys, so no map here."""
    last = F.try_element_at(F.filter("headers", lambda h: h["key"] == F.lit(name)), F.lit(-1))
    return last["value"].cast("string").try_cast(kind)


def _quantiles():
    """Latency p50, p90, p99 (approximate: 1/10000 relative error)."""
    return F.percentile_approx("latencyMs", F.array(F.lit(0.5), F.lit(0.9), F.lit(0.99)),
                               10000)


def _latency_columns(agg: str = "q") -> list:
    return [F.col(agg)[0].alias("latencyP50"), F.col(agg)[1].alias("latencyP90"),
            F.col(agg)[2].alias("latencyP99")]


def audit(p: DataFrame, heartbeats: DataFrame | None = None) -> DataFrame:
    """Per source partition, from `provenance` rows: records, distinct offsets, duplicates,
    first and last offsets, missing ranges (holes from the first offset seen, or where the
    sender's chain started by its heartbeats, to the last one seen or announced), out-of-order
    arrivals (a record written after a later one of its partition), and latency percentiles
    and maximum in ms. Offsets of compacted topics are not contiguous: there a hole may be a
    record that never existed; `compare` against the source cluster settles it."""
    key = ["sourceTopic", "sourcePartition"]
    arrival = Window.partitionBy("topic", "partition", *key).orderBy("offset")
    late = p.withColumn("prevMax", F.max("sourceOffset").over(
        arrival.rowsBetween(Window.unboundedPreceding, -1)))
    counts = late.groupBy(*key).agg(
        F.count("*").alias("records"),
        F.min("offset").alias("destinationFirst"),
        F.min("sourceOffset").alias("first"),
        F.max("sourceOffset").alias("last"),
        F.sum(F.when(F.col("sourceOffset") < F.col("prevMax"), 1).otherwise(0))
        .alias("outOfOrder"),
        _quantiles().alias("q"), F.max("latencyMs").alias("latencyMax"))
    offsets = p.select(*key, "sourceOffset").distinct()
    # distinct offsets counted apart: beside percentile_approx, countDistinct would keep a
    # percentile sketch per offset
    counts = counts.join(offsets.groupBy(*key).agg(F.count("*").alias("distinct")), key)
    if heartbeats is not None:  # what the sender announced: sentinels just outside it
        known = heartbeats.join(counts.select(*key, "first", "last", "destinationFirst"), key)
        tails = known.where(F.col("lastSent") > F.col("last")) \
            .select(*key, (F.col("lastSent") + 1).alias("sourceOffset"))
        # a head only where the destination partition still starts at offset 0: past its
        # retention (or compaction) the earliest records are gone, not missing
        heads = known.where((F.col("firstSent") < F.col("first"))
                            & (F.col("destinationFirst") == 0)) \
            .select(*key, (F.col("firstSent") - 1).alias("sourceOffset"))
        offsets = offsets.unionByName(tails).unionByName(heads)
    gaps = (offsets
            .withColumn("prev", F.lag("sourceOffset").over(
                Window.partitionBy(*key).orderBy("sourceOffset")))
            .where(F.col("sourceOffset") - F.col("prev") > 1)
            .groupBy(*key)
            .agg(F.sort_array(F.collect_list(F.struct(
                (F.col("prev") + 1).alias("first"),
                (F.col("sourceOffset") - 1).alias("last")))).alias("missingRanges")))
    out = counts.join(gaps, key, "left").withColumn(
        "missingRanges", F.coalesce("missingRanges", F.array().cast(MISSING)))
    return (out.withColumn("duplicates", F.col("records") - F.col("distinct"))
            .withColumn("missing", F.aggregate(
                "missingRanges", F.lit(0).cast("long"),
                lambda acc, r: acc + r["last"] - r["first"] + 1))
            .select(*key, "records", "distinct", "duplicates", "first", "last", "missing",
                    "missingRanges", "outOfOrder", *_latency_columns(), "latencyMax")
            .orderBy(*key))


def latency(p: DataFrame) -> dict:
    """Latency percentiles (ms) over all records: {p50, p90, p99, max}, None without data."""
    row = p.agg(_quantiles().alias("q"), F.max("latencyMs").alias("m")).first()
    q = row["q"] or [None] * 3
    return {"p50": q[0], "p90": q[1], "p99": q[2], "max": row["m"]}


def compare(source: DataFrame, destination: DataFrame,
            written_at: str = "writtenAt") -> DataFrame:
    """Record by record, against the source cluster (soak tests, pre-production): per source
    partition, records lost (in the source, not in the destination), duplicated (written more
    than once) and altered (key, value or headers differ). The headers the receiver appends
    (provenance, then `written_at`) are left out of the comparison; the destination keeps the
    source's own headers first, in order."""
    key = ["sourceTopic", "sourcePartition", "sourceOffset"]
    # the receiver appends provenance (3 headers) and then `written_at`: drop those only
    added = F.when(F.lit(bool(written_at)) & (F.try_element_at("headers", F.lit(-1))["key"]
                                              == F.lit(written_at)), 4).otherwise(3)
    own = F.slice("headers", F.lit(1), F.greatest(F.size("headers") - added, F.lit(0)))
    dst = with_provenance_rows(destination).select(
        *key, F.col("key").alias("dKey"), F.col("value").alias("dValue"),
        own.alias("dHeaders"))
    src = source.select(F.col("topic").alias("sourceTopic"),
                        F.col("partition").alias("sourcePartition"),
                        F.col("offset").alias("sourceOffset"),
                        F.col("key").alias("sKey"), F.col("value").alias("sValue"),
                        F.col("headers").alias("sHeaders"))
    copies = dst.groupBy(*key).agg(F.count("*").alias("copies"),
                                   F.first("dKey").alias("dKey"),
                                   F.first("dValue").alias("dValue"),
                                   F.first("dHeaders").alias("dHeaders"))
    joined = src.join(copies, key, "left")
    altered = ~(F.col("sKey").eqNullSafe(F.col("dKey"))
                & F.col("sValue").eqNullSafe(F.col("dValue"))
                & (F.to_json("sHeaders") == F.to_json("dHeaders")))
    return (joined.groupBy("sourceTopic", "sourcePartition").agg(
        F.count("*").alias("sourceRecords"),
        F.sum(F.when(F.col("copies").isNull(), 1).otherwise(0)).alias("lost"),
        F.sum(F.when(F.col("copies") > 1, F.col("copies") - 1).otherwise(0))
        .alias("duplicated"),
        F.sum(F.when(F.col("copies").isNotNull() & altered, 1).otherwise(0)).alias("altered"))
        .orderBy("sourceTopic", "sourcePartition"))


def with_provenance_rows(rows: DataFrame) -> DataFrame:
    """Destination rows with their provenance as columns (and their own columns kept)."""
    return rows.select("*", *_origin()).where(F.col("sourceOffset").isNotNull())


# -- load ----------------------------------------------------------------------------------------

def report(result: DataFrame) -> dict:
    rows = [r.asDict(recursive=True) for r in result.collect()]
    return {"partitions": rows,
            "totals": {k: sum(r[k] for r in rows)
                       for k in ("records", "distinct", "duplicates", "missing", "outOfOrder")}}


def _ms(v) -> str:
    return "-" if v is None else str(v)


def table(rep: dict) -> str:
    head = ("source partition", "records", "distinct", "duplicates", "missing", "out of order",
            "p50 ms", "p99 ms", "missing ranges")
    lines = ["  ".join(f"{h:>12}" for h in head)]
    for r in rep["partitions"]:
        ranges = ", ".join(f"{m['first']}..{m['last']}" for m in r["missingRanges"][:5])
        if len(r["missingRanges"]) > 5:
            ranges += f", … ({len(r['missingRanges'])} ranges)"
        lines.append("  ".join(f"{v:>12}" for v in (
            f"{r['sourceTopic']}[{r['sourcePartition']}]", r["records"], r["distinct"],
            r["duplicates"], r["missing"], r["outOfOrder"], _ms(r["latencyP50"]),
            _ms(r["latencyP99"]))) + "  " + (ranges or "-"))
    t = rep["totals"]
    lines.append(f"total: {t['records']} records, {t['distinct']} distinct, {t['duplicates']} "
                 f"duplicates, {t['missing']} missing, {t['outOfOrder']} out of order")
    lat = t.get("latencyMs") or {}
    if lat.get("p50") is not None:
        lines.append(f"end-to-end latency: p50 {lat['p50']} ms, p90 {lat['p90']} ms, "
                     f"p99 {lat['p99']} ms, max {lat['max']} ms")
    return "\n".join(lines)


def manifest(rep: dict) -> dict:
    """The resend manifest: missing ranges per source topic and partition."""
    return {"version": 1, "missing": [
        {"topic": r["sourceTopic"], "partition": r["sourcePartition"],
         "ranges": [[m["first"], m["last"]] for m in r["missingRanges"]]}
        for r in rep["partitions"] if r["missingRanges"]]}


def say(message: str) -> None:
    """Progress, on stderr (the table and the JSON go to stdout and files)."""
    print(f"diode verify: {message}", file=sys.stderr, flush=True)


def pattern_of(args) -> str:
    return args.pattern or (re.escape(args.prefix) + ".*")


def main(args) -> int:
    """`diode verify`: exit 0 when nothing is missing (or lost or altered), 1 otherwise."""
    try:
        if args.stream:
            from diode.spark.stream import main as stream_main
            return stream_main(args)
        return audit_once(args)
    except Exception as e:  # noqa: BLE001 - Spark wraps planner and executor errors: show the cause
        say(f"failed: {cause(e)}")
        return 2


def cause(e: Exception) -> str:
    """The line of a (Spark-wrapped) error that says what went wrong."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    ours = [ln for ln in lines if "diode_kafka:" in ln or "diode verify" in ln]
    return (ours or lines or [type(e).__name__])[-1][:1000]


def audit_once(args) -> int:
    """The batch audit: the table, the JSON report, the manifest; 1 when anything is missing."""
    started = time.monotonic()
    say(f"starting Spark ({args.master or 'spark-submit master or local[*]'})")
    spark = session(args.master, source=args.format)
    try:
        pattern = pattern_of(args)
        say(f"auditing the topics matching {pattern} on {args.bootstrap} "
            f"({choose_format(spark, args.format)} source)")
        rows = extract(spark, args.bootstrap, pattern, args.format)
        p = provenance(rows, args.written_at_header).persist(StorageLevel.MEMORY_AND_DISK)
        beats = extract_heartbeats(spark, args.bootstrap, args.heartbeat_topic, args.format) \
            if args.heartbeat_topic else None
        audit_start = time.monotonic()
        rep = report(audit(p, beats))
        rep["totals"]["latencyMs"] = latency(p)
        took = time.monotonic() - audit_start
        n = rep["totals"]["records"]
        say(f"audited {n} records of {len(rep['partitions'])} source partitions in "
            f"{took:.1f} s ({n / max(took, 1e-9):.0f} records/s)")
        if args.source_bootstrap:
            topics = sorted({r["sourceTopic"] for r in rep["partitions"]})
            say(f"comparing with the source cluster {args.source_bootstrap}: "
                f"{len(topics)} topics")
            source = extract(spark, args.source_bootstrap,
                             "|".join(re.escape(t) for t in topics) or "(?!)", args.format)
            rep["comparison"] = [r.asDict() for r in
                                 compare(source, rows, args.written_at_header).collect()]
            rep["totals"].update({k: sum(r[k] for r in rep["comparison"])
                                  for k in ("lost", "duplicated", "altered")})
        p.unpersist()
    finally:
        spark.stop()
    say(f"done in {time.monotonic() - started:.1f} s")
    print(table(rep))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=1)
    if args.manifest:
        with open(args.manifest, "w") as f:
            json.dump(manifest(rep), f, indent=1)
    if "comparison" in rep:
        t = rep["totals"]
        print(f"against the source: {t['lost']} lost, {t['duplicated']} duplicated, "
              f"{t['altered']} altered")
    t = rep["totals"]
    return 1 if t["missing"] or t.get("lost") or t.get("altered") else 0


def add_arguments(p) -> None:
    p.add_argument("--bootstrap", required=True, help="the destination cluster")
    p.add_argument("--prefix", default="", help="destination topic prefix (receiver.topic.prefix)")
    p.add_argument("--pattern", help="destination topics by regular expression instead")
    p.add_argument("--heartbeat-topic", help="receiver.heartbeat.topic, for the missing tail")
    p.add_argument("--written-at-header", default="writtenAt",
                   help="receiver.written.at.header, for latency ('' for none)")
    p.add_argument("--source-bootstrap", help="the source cluster too: compare record by record "
                   "(lost, duplicated, altered); soak tests and pre-production")
    p.add_argument("--json", help="write the report as JSON")
    p.add_argument("--manifest", help="write the resend manifest (missing ranges)")
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument("--format", choices=("auto", "native", "python"), default="auto",
                   help="Kafka source: Spark's spark-sql-kafka (native; fetched through mvn "
                   "the first time), diode's Python source (python; no JVM jars), or native "
                   "when on the classpath or cached, else python (auto)")
    s = p.add_argument_group("streaming mode (--stream): keep auditing as records arrive")
    s.add_argument("--stream", action="store_true", help="audit continuously; report missing "
                   "ranges and later fills as they are seen")
    s.add_argument("--checkpoint", help="directory for Spark's checkpoint and the audit's "
                   "ledger (required with --stream; a restart carries on from it)")
    s.add_argument("--missing-topic", help="write missing/filled events (JSON) to this topic of "
                   "the destination cluster")
    s.add_argument("--missing-parquet", help="append missing/filled events to Parquet here")
    s.add_argument("--trigger-seconds", type=float, default=10.0,
                   help="how often a micro-batch runs (default 10)")
    s.add_argument("--max-offsets-per-trigger", type=int, default=1_000_000,
                   help="records per micro-batch at most (default 1000000)")
    s.add_argument("--grace-seconds", type=float, default=60.0, help="how long a heartbeat's "
                   "claim waits before its missing tail is reported (default 60)")
    s.add_argument("--run-seconds", type=float, default=0.0,
                   help="stop after this long (default 0: until Ctrl-C)")
    s.add_argument("--available-now", action="store_true", help="audit what the topics hold "
                   "now (in micro-batches), then stop: run it from cron for an incremental "
                   "audit that carries on from its checkpoint each time")


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="audit the destination topics on Spark: per source "
                       "partition records, duplicates, missing ranges, order, latency "
                       "(exit 1: missing)")
    add_arguments(p)
    p.set_defaults(func=main)


if __name__ == "__main__":  # spark-submit …/diode/spark/verify.py ARGS
    import argparse
    parser = argparse.ArgumentParser(prog="diode verify")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
