"""The soak's verdict, on Spark, record by record (the same extract and provenance functions as
`diode verify`, diode.spark.verify).

Every record the source holds is joined with its copies at the destination (by the provenance
headers) and with the missing-records topic's reports. A record is then:

- delivered: written at least once; each copy beyond the first is a duplicate;
- corrupted: written with a key, value or headers other than the source's, or with a value
  whose crc32 is not its `soak.crc` header;
- reported missing: in a `missing` event and never written (a `missing` event later
  followed by a `filled` one for a record that came late is counted as a late fill, not as a
  false report);
- a silent loss: neither written nor reported;
- a false missing report: reported and written without a `filled` event, or reported but never
  in the source at all;
- an unexplained loss: not written although no fault that may lose records (schedule.LOSSY)
  ran around the time it was produced.
"""

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from diode.spark import verify
from diode.soak.traffic import CRC_HEADER

KEY = ["sourceTopic", "sourcePartition", "sourceOffset"]
EVENT = ("struct<type: string, sourceTopic: string, sourcePartition: int, firstOffset: long, "
         "lastOffset: long, reason: string>")
BUCKET_SECONDS = 10


def _reports(spark: SparkSession, bootstrap: str, topic: str, fmt: str) -> DataFrame:
    """(type, sourceTopic, sourcePartition, sourceOffset, reason): one row per record named by
    a missing or filled event."""
    rows = verify.kafka_reader(spark.read, spark, bootstrap, fmt).option("subscribe", topic) \
        .load()
    e = F.from_json(F.col("value").cast("string"), EVENT)
    return (rows.select(e.alias("e")).select("e.*")
            .where(F.col("type").isin("missing", "filled"))
            .select("type", "sourceTopic", "sourcePartition",
                    F.explode(F.sequence("firstOffset", "lastOffset")).alias("sourceOffset"),
                    "reason"))


def _exists(bootstrap: str, topic: str) -> bool:
    """Whether the topic is there (the receiver creates the missing-records topic with its first
    report: a soak that lost nothing has none)."""
    from confluent_kafka.admin import AdminClient
    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=15).topics
    return topic in topics


def run(*, source: str, topics: list, destination: str, dest_pattern: str, missing_topic: str,
        lossy_windows_ms: list, started_ms: int, written_at: str = "writtenAt",
        fmt: str = "auto", master: str | None = None) -> dict:
    """The verdict's counts, the unexplained losses (at most 20, with their time), latency
    per BUCKET_SECONDS bucket and overall. `lossy_windows_ms`: (first, last) epoch ms within
    which a record may be lost."""
    import re
    spark = verify.session(master, app="diode soak audit", source=fmt)
    try:
        src = verify.extract(spark, source, "|".join(re.escape(t) for t in topics), fmt)
        dst = verify.extract(spark, destination, dest_pattern, fmt)
        s = src.select(F.col("topic").alias("sourceTopic"),
                       F.col("partition").alias("sourcePartition"),
                       F.col("offset").alias("sourceOffset"), F.col("key").alias("sKey"),
                       F.col("value").alias("sValue"), F.col("headers").alias("sHeaders"),
                       F.unix_millis("timestamp").alias("producedAt"))
        # the receiver appends provenance (3 headers), then `written_at`: the rest are the
        # source's own, in order
        added = 4 if written_at else 3
        d = verify.with_provenance_rows(dst).select(
            *KEY, F.col("key").alias("dKey"), F.col("value").alias("dValue"),
            F.slice("headers", F.lit(1), F.greatest(F.size("headers") - added, F.lit(0)))
            .alias("dHeaders"),
            verify._header(written_at, "long").alias("writtenAt") if written_at
            else F.lit(None).cast("long").alias("writtenAt"),
            F.unix_millis("timestamp").alias("dTimestamp"))
        crc = F.try_element_at(F.filter("dHeaders", lambda h: h["key"] == F.lit(CRC_HEADER)),
                               F.lit(1))["value"].cast("string")
        d = d.withColumn("crcBad", F.coalesce(
            F.conv(crc, 16, 10).cast("long") != F.crc32("dValue"), F.lit(True)))
        d = d.persist(StorageLevel.MEMORY_AND_DISK)
        copies = d.groupBy(*KEY).agg(
            F.count("*").alias("copies"), F.first("dKey").alias("dKey"),
            F.first("dValue").alias("dValue"), F.first("dHeaders").alias("dHeaders"),
            F.max(F.col("crcBad").cast("int")).alias("crcBad"))
        reports = _reports(spark, destination, missing_topic, fmt) \
            if missing_topic and _exists(destination, missing_topic) else None
        if reports is not None:
            flags = reports.groupBy(*KEY).agg(
                F.max(F.when(F.col("type") == "missing", 1).otherwise(0)).alias("reported"),
                F.max(F.when(F.col("type") == "filled", 1).otherwise(0)).alias("filled"),
                F.sum(F.when(F.col("type") == "missing", 1).otherwise(0)).alias("reports"),
                F.first(F.when(F.col("type") == "missing", F.col("reason")), True)
                .alias("reason"))
        else:
            flags = spark.createDataFrame([], "sourceTopic string, sourcePartition int, "
                                          "sourceOffset long, reported int, filled int, "
                                          "reports long, reason string")
        altered = ~(F.col("sKey").eqNullSafe(F.col("dKey"))
                    & F.col("sValue").eqNullSafe(F.col("dValue"))
                    & (F.to_json("sHeaders") == F.to_json("dHeaders")))
        rec = (s.join(copies, KEY, "left").join(flags, KEY, "left")
               .select(*KEY, "producedAt",
                       F.col("copies").isNotNull().alias("delivered"),
                       F.coalesce("copies", F.lit(0)).alias("copies"),
                       (F.col("copies").isNotNull() & (altered | (F.col("crcBad") == 1)))
                       .alias("corrupted"),
                       F.coalesce("reported", F.lit(0)).cast("boolean").alias("reported"),
                       F.coalesce("filled", F.lit(0)).cast("boolean").alias("filled"),
                       F.coalesce("reports", F.lit(0)).alias("reports"), "reason"))
        rec = rec.persist(StorageLevel.MEMORY_AND_DISK)
        t = rec.agg(
            F.count("*").alias("produced"),
            F.sum(F.col("delivered").cast("long")).alias("delivered"),
            F.sum(F.when(~F.col("delivered") & F.col("reported"), 1).otherwise(0))
            .alias("missing_reported"),
            F.sum(F.when(~F.col("delivered") & ~F.col("reported"), 1).otherwise(0))
            .alias("silent_loss"),
            F.sum(F.when(F.col("delivered") & F.col("reported") & ~F.col("filled"), 1)
                  .otherwise(0)).alias("false_missing"),
            F.sum(F.when(F.col("delivered") & F.col("filled"), 1).otherwise(0))
            .alias("late_filled"),
            F.sum(F.when(F.col("reports") > 1, 1).otherwise(0)).alias("reported_twice"),
            F.sum(F.greatest(F.col("copies") - 1, F.lit(0))).alias("duplicates"),
            F.sum(F.col("corrupted").cast("long")).alias("corrupted"),
        ).first().asDict()
        out = {k: int(v or 0) for k, v in t.items()}
        # reports of records the source never held are false too
        phantom = flags.where("reported = 1").join(s.select(*KEY), KEY, "left_anti").count()
        out["false_missing"] += phantom
        out["phantom_reports"] = phantom
        # written copies whose provenance names no source record: forged or misrouted
        out["unknown_written"] = copies.join(s.select(*KEY), KEY, "left_anti").count()
        out["missing_reasons"] = {r["reason"] or "": r["n"] for r in rec.where(
            ~F.col("delivered") & F.col("reported")).groupBy("reason")
            .agg(F.count("*").alias("n")).collect()}
        windows = spark.createDataFrame([(int(a), int(b)) for a, b in lossy_windows_ms] or
                                        [(0, -1)], "wFirst long, wLast long")
        lost = rec.where(~F.col("delivered"))
        unexplained = lost.join(F.broadcast(windows),
                                (F.col("producedAt") >= F.col("wFirst"))
                                & (F.col("producedAt") <= F.col("wLast")), "left_anti")
        out["unexplained_loss"] = unexplained.count()
        out["unexplained_examples"] = [
            {**r.asDict(), "t": round((r["producedAt"] - started_ms) / 1000, 1)}
            for r in unexplained.select(*KEY, "producedAt", "reason")
            .orderBy("producedAt").limit(20).collect()]
        lat = d.where(F.col("writtenAt").isNotNull()).select(
            F.floor((F.col("writtenAt") - F.lit(started_ms)) / (1000 * BUCKET_SECONDS))
            .alias("b"), (F.col("writtenAt") - F.col("dTimestamp")).alias("ms"))
        q = F.percentile_approx("ms", F.array(F.lit(0.5), F.lit(0.99)), 1000)
        out["latency"] = [{"t": float(r["b"] * BUCKET_SECONDS), "p50": r["q"][0],
                           "p99": r["q"][1], "count": r["n"]}
                          for r in lat.groupBy("b").agg(q.alias("q"), F.count("*").alias("n"))
                          .orderBy("b").collect()]
        overall = lat.agg(q.alias("q"), F.max("ms").alias("m")).first()
        out["latency_overall"] = {"p50": (overall["q"] or [None, None])[0],
                                  "p99": (overall["q"] or [None, None])[1],
                                  "max": overall["m"]}
        rec.unpersist()
        d.unpersist()
        return out
    finally:
        spark.stop()
