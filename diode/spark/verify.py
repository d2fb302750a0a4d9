"""`diode verify`: an independent audit, on Spark, of what crossed the diode.

On the low side nobody can ask the sender what it sent, so the audit works from what the
destination holds: the provenance headers of every record (sourceTopic, sourcePartition,
sourceOffset) and, when the receiver records them, the sender's heartbeats (the last offset sent
per partition). Per source partition it reports records, distinct offsets, duplicates, missing
offset ranges, out-of-order arrivals.

Extract, transform and load are separate functions; `audit` (the transform) is a pure
DataFrame -> DataFrame function with a known-answer test.
"""

import json
import os
import sys

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from diode.spark.kafka_source import choose_format

MISSING = "array<struct<first: long, last: long>>"


def session(master: str = "local[*]", app: str = "diode verify") -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (SparkSession.builder.master(master).appName(app)
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "8")
            .getOrCreate())


# -- extract -------------------------------------------------------------------------------------

def extract(spark: SparkSession, bootstrap: str, pattern: str, mode: str = "auto",
            kafka: dict | None = None) -> DataFrame:
    """The destination topics matching `pattern`, as Kafka rows."""
    fmt = choose_format(spark, mode)
    reader = spark.read.format(fmt).option("kafka.bootstrap.servers", bootstrap) \
        .option("subscribePattern", pattern).option("startingOffsets", "earliest")
    for k, v in (kafka or {}).items():
        reader = reader.option(f"kafka.{k}", v)
    return reader.load()


def extract_heartbeats(spark: SparkSession, bootstrap: str, topic: str,
                       mode: str = "auto") -> DataFrame:
    """(sourceTopic, sourcePartition, lastSent): the highest offset the sender's heartbeats
    said it had sent, from receiver.heartbeat.topic."""
    fmt = choose_format(spark, mode)
    rows = spark.read.format(fmt).option("kafka.bootstrap.servers", bootstrap) \
        .option("subscribe", topic).option("startingOffsets", "earliest").load()
    sent = F.from_json(F.col("value").cast("string"),
                       "struct<lastSent: array<struct<topic: string, partition: int, "
                       "offset: long>>>")
    return (rows.select(F.explode(sent["lastSent"]).alias("s"))
            .groupBy(F.col("s.topic").alias("sourceTopic"),
                     F.col("s.partition").alias("sourcePartition"))
            .agg(F.max("s.offset").alias("lastSent")))


# -- transform -----------------------------------------------------------------------------------

def audit(rows: DataFrame, heartbeats: DataFrame | None = None) -> DataFrame:
    """Per source partition: records, distinct offsets, duplicates, first and last offsets,
    missing ranges (holes between the first offset seen and the last one seen or announced by
    heartbeats), and out-of-order arrivals (a record written after a later one of its
    partition). Offsets of compacted topics are not contiguous: there a hole may be a record
    that never existed; `compare` against the source cluster settles it."""
    p = with_provenance_rows(rows).select("topic", "partition", "offset", "sourceTopic",
                                          "sourcePartition", "sourceOffset")
    key = ["sourceTopic", "sourcePartition"]
    arrival = Window.partitionBy("topic", "partition", *key).orderBy("offset")
    late = p.withColumn("prevMax", F.max("sourceOffset").over(
        arrival.rowsBetween(Window.unboundedPreceding, -1)))
    counts = late.groupBy(*key).agg(
        F.count("*").alias("records"),
        F.countDistinct("sourceOffset").alias("distinct"),
        F.min("sourceOffset").alias("first"),
        F.max("sourceOffset").alias("last"),
        F.sum(F.when(F.col("sourceOffset") < F.col("prevMax"), 1).otherwise(0))
        .alias("outOfOrder"))
    offsets = p.select(*key, "sourceOffset").distinct()
    if heartbeats is not None:  # the tail the sender announced: a sentinel one past it
        tails = heartbeats.join(counts.select(*key, "last"), key) \
            .where(F.col("lastSent") > F.col("last")) \
            .select(*key, (F.col("lastSent") + 1).alias("sourceOffset"))
        offsets = offsets.unionByName(tails)
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
                    "missingRanges", "outOfOrder")
            .orderBy(*key))


def compare(source: DataFrame, destination: DataFrame) -> DataFrame:
    """Record by record, against the source cluster (soak tests, pre-production): per source
    partition, records lost (in the source, not in the destination), duplicated (written more
    than once) and altered (key, value or headers differ). Provenance headers are left out of
    the comparison; the destination keeps the source's own headers first, in order."""
    key = ["sourceTopic", "sourcePartition", "sourceOffset"]
    provenance = F.array(*[F.lit(h) for h in ("sourceTopic", "sourcePartition",
                                                "sourceOffset")])
    own = F.filter("headers", lambda h: ~F.array_contains(provenance, h["key"]))
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
    h = F.map_from_entries("headers")
    return rows.select(
        "*",
        h["sourceTopic"].cast("string").alias("sourceTopic"),
        h["sourcePartition"].cast("string").cast("int").alias("sourcePartition"),
        h["sourceOffset"].cast("string").cast("long").alias("sourceOffset"),
    ).where(F.col("sourceOffset").isNotNull())


# -- load ----------------------------------------------------------------------------------------

def report(result: DataFrame) -> dict:
    rows = [r.asDict(recursive=True) for r in result.collect()]
    return {"partitions": rows,
            "totals": {k: sum(r[k] for r in rows)
                       for k in ("records", "distinct", "duplicates", "missing", "outOfOrder")}}


def table(rep: dict) -> str:
    head = ("source partition", "records", "distinct", "duplicates", "missing", "out of order",
            "missing ranges")
    lines = ["  ".join(f"{h:>12}" for h in head)]
    for r in rep["partitions"]:
        ranges = ", ".join(f"{m['first']}..{m['last']}" for m in r["missingRanges"][:5])
        if len(r["missingRanges"]) > 5:
            ranges += f", … ({len(r['missingRanges'])} ranges)"
        lines.append("  ".join(f"{v:>12}" for v in (
            f"{r['sourceTopic']}[{r['sourcePartition']}]", r["records"], r["distinct"],
            r["duplicates"], r["missing"], r["outOfOrder"])) + "  " + (ranges or "-"))
    t = rep["totals"]
    lines.append(f"total: {t['records']} records, {t['distinct']} distinct, {t['duplicates']} "
                 f"duplicates, {t['missing']} missing, {t['outOfOrder']} out of order")
    return "\n".join(lines)


def manifest(rep: dict) -> dict:
    """The resend manifest: missing ranges per source topic and partition."""
    return {"version": 1, "missing": [
        {"topic": r["sourceTopic"], "partition": r["sourcePartition"],
         "ranges": [[m["first"], m["last"]] for m in r["missingRanges"]]}
        for r in rep["partitions"] if r["missingRanges"]]}


def main(args) -> int:
    """`diode verify`: exit 0 when nothing is missing (or lost or altered), 1 otherwise."""
    spark = session(args.master)
    try:
        pattern = args.pattern or (__import__("re").escape(args.prefix) + ".*")
        rows = extract(spark, args.bootstrap, pattern, args.format)
        beats = extract_heartbeats(spark, args.bootstrap, args.heartbeat_topic, args.format) \
            if args.heartbeat_topic else None
        rep = report(audit(rows, beats))
        if args.source_bootstrap:
            topics = sorted({r["sourceTopic"] for r in rep["partitions"]})
            source = extract(spark, args.source_bootstrap,
                             "|".join(__import__("re").escape(t) for t in topics) or "(?!)",
                             args.format)
            rep["comparison"] = [r.asDict() for r in compare(source, rows).collect()]
            rep["totals"].update({k: sum(r[k] for r in rep["comparison"])
                                  for k in ("lost", "duplicated", "altered")})
    finally:
        spark.stop()
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


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="audit the destination topics on Spark: per source "
                       "partition records, duplicates, missing ranges, order (exit 1: missing)")
    p.add_argument("--bootstrap", required=True, help="the destination cluster")
    p.add_argument("--prefix", default="", help="destination topic prefix (receiver.topic.prefix)")
    p.add_argument("--pattern", help="destination topics by regular expression instead")
    p.add_argument("--heartbeat-topic", help="receiver.heartbeat.topic, for the missing tail")
    p.add_argument("--source-bootstrap", help="the source cluster too: compare record by record "
                   "(lost, duplicated, altered); soak tests and pre-production")
    p.add_argument("--json", help="write the report as JSON")
    p.add_argument("--manifest", help="write the resend manifest (missing ranges)")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--format", choices=("auto", "native", "python"), default="auto",
                   help="Kafka source: spark-sql-kafka (native), diode's Python source, or "
                   "native when on the classpath (auto)")
    p.set_defaults(func=main)
