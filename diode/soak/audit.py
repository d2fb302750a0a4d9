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
  in the source at all.

The records not written are also returned as ranges (consecutive offsets of a partition, with
when their first and last were produced), which diode.soak.report ties to the faults that ran
when they were sent: a range no fault that may lose records explains is an unexplained loss.

Records are compared by a digest of their content (xxhash64 over key, value and headers, taken
where they are read), so that hours of traffic (gigabytes of values) never cross a shuffle or
sit in Spark's memory: the first long soak ran its executor out of heap joining the values
themselves. The crc32 of each destination value is checked where it is read, too.
`classify` and `counts` are the transform: pure DataFrame functions with a known-answer test.
"""

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from diode.kafka.messages import MISSING, WRITTEN_AT
from diode.spark import verify
from diode.soak.traffic import CRC_HEADER

KEY = ["sourceTopic", "sourcePartition", "sourceOffset"]
EVENT = MISSING.spark_schema("type", "sourceTopic", "sourcePartition", "firstOffset",
                             "lastOffset", "reason")
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
    from diode.soak.traffic import KAFKA_LOG
    topics = AdminClient({"bootstrap.servers": bootstrap, "logger": KAFKA_LOG}) \
        .list_topics(timeout=15).topics
    return topic in topics


def _source_rows(src: DataFrame) -> DataFrame:
    """(sourceTopic, sourcePartition, sourceOffset, sDigest, producedAt) of the source's rows."""
    return src.select(F.col("topic").alias("sourceTopic"),
                      F.col("partition").alias("sourcePartition"),
                      F.col("offset").alias("sourceOffset"),
                      F.xxhash64("key", "value", F.to_json("headers")).alias("sDigest"),
                      F.unix_millis("timestamp").alias("producedAt"))


def _destination_rows(dst: DataFrame, written_at: str) -> DataFrame:
    """(KEY, dDigest, crcBad, writtenAt, dTimestamp) of the destination's rows: the digest over
    the record as the source had it (the receiver appends provenance, 4 headers: Confluent's
    three and sourceTopicId, then `written_at`; the rest are the source's own, in order)."""
    added = 5 if written_at else 4
    own = F.slice("headers", F.lit(1), F.greatest(F.size("headers") - added, F.lit(0)))
    crc = F.try_element_at(F.filter(own, lambda h: h["key"] == F.lit(CRC_HEADER)),
                           F.lit(1))["value"].cast("string")
    return verify.with_provenance_rows(dst).select(
        *KEY, F.xxhash64("key", "value", F.to_json(own)).alias("dDigest"),
        F.coalesce(F.conv(crc, 16, 10).cast("long") != F.crc32("value"), F.lit(True))
        .alias("crcBad"),
        verify._header(written_at, "long").alias("writtenAt") if written_at
        else F.lit(None).cast("long").alias("writtenAt"),
        F.unix_millis("timestamp").alias("dTimestamp"))


def _flags(reports: DataFrame) -> DataFrame:
    """Per record named by a report: reported (a missing event), filled (a filled event),
    reports (how many missing events) and the first reason."""
    return reports.groupBy(*KEY).agg(
        F.max(F.when(F.col("type") == "missing", 1).otherwise(0)).alias("reported"),
        F.max(F.when(F.col("type") == "filled", 1).otherwise(0)).alias("filled"),
        F.sum(F.when(F.col("type") == "missing", 1).otherwise(0)).alias("reports"),
        F.first(F.when(F.col("type") == "missing", F.col("reason")), True).alias("reason"))


def copies_of(d: DataFrame) -> DataFrame:
    """Per source record written: copies, and whether any copy differs from the others or
    failed its crc (the least and greatest digest, the worst crc)."""
    return d.groupBy(*KEY).agg(F.count("*").alias("copies"), F.min("dDigest").alias("dMin"),
                               F.max("dDigest").alias("dMax"),
                               F.max(F.col("crcBad").cast("int")).alias("crcBad"))


def classify(s: DataFrame, copies: DataFrame, flags: DataFrame) -> DataFrame:
    """One row per source record: KEY, producedAt, delivered, copies, corrupted (a copy whose
    content is not the source's, or whose value fails its crc32), reported, filled, reports,
    reason."""
    altered = (F.col("dMin") != F.col("sDigest")) | (F.col("dMax") != F.col("sDigest"))
    return (s.join(copies, KEY, "left").join(flags, KEY, "left")
            .select(*KEY, "producedAt",
                    F.col("copies").isNotNull().alias("delivered"),
                    F.coalesce("copies", F.lit(0)).alias("copies"),
                    (F.col("copies").isNotNull() & (altered | (F.col("crcBad") == 1)))
                    .alias("corrupted"),
                    F.coalesce("reported", F.lit(0)).cast("boolean").alias("reported"),
                    F.coalesce("filled", F.lit(0)).cast("boolean").alias("filled"),
                    F.coalesce("reports", F.lit(0)).alias("reports"), "reason"))


def counts(rec: DataFrame) -> dict:
    """The verdict's counts over `classify`'s rows."""
    when = lambda cond: F.sum(F.when(cond, 1).otherwise(0))  # noqa: E731
    delivered, reported, filled = F.col("delivered"), F.col("reported"), F.col("filled")
    t = rec.agg(
        F.count("*").alias("produced"),
        F.sum(delivered.cast("long")).alias("delivered"),
        when(~delivered & reported).alias("missing_reported"),
        when(~delivered & ~reported).alias("silent_loss"),
        when(delivered & reported & ~filled).alias("false_missing"),
        when(delivered & filled).alias("late_filled"),
        when(F.col("reports") > 1).alias("reported_twice"),
        F.sum(F.greatest(F.col("copies") - 1, F.lit(0))).alias("duplicates"),
        F.sum(F.col("corrupted").cast("long")).alias("corrupted"),
    ).first().asDict()
    return {k: int(v or 0) for k, v in t.items()}


def missing_ranges(rec: DataFrame) -> DataFrame:
    """The records `classify` found not written, as ranges of consecutive offsets of a
    partition: sourceTopic, sourcePartition, firstOffset, lastOffset, records, reported (how
    many of them were reported missing), reason (a reported one's), sentFrom and sentUntil
    (epoch ms: when the first and the last of them were produced)."""
    by_offset = Window.partitionBy("sourceTopic", "sourcePartition").orderBy("sourceOffset")
    lost = rec.where(~F.col("delivered")).withColumn(
        "run", F.col("sourceOffset") - F.row_number().over(by_offset))  # equal along a range
    return lost.groupBy("sourceTopic", "sourcePartition", "run").agg(
        F.min("sourceOffset").alias("firstOffset"), F.max("sourceOffset").alias("lastOffset"),
        F.count("*").alias("records"), F.sum(F.col("reported").cast("long")).alias("reported"),
        F.first("reason", True).alias("reason"), F.min("producedAt").alias("sentFrom"),
        F.max("producedAt").alias("sentUntil")).drop("run")


def run(*, source: str, topics: list, destination: str, dest_pattern: str, missing_topic: str,
        started_ms: int, written_at: str = WRITTEN_AT, fmt: str = "auto",
        master: str | None = None, digest_topic: str = "") -> dict:
    """The verdict's counts, every range of records not written (missing_ranges, as
    dicts), latency per BUCKET_SECONDS bucket and overall, and the sender's digests checked as
    `diode verify --digest-topic` does (verified, altered, incomplete; none altered in a
    sound run)."""
    import re
    spark = verify.session(master, app="diode soak audit", source=fmt)
    try:
        s = _source_rows(verify.extract(spark, source, "|".join(re.escape(t) for t in topics),
                                        fmt)).persist(StorageLevel.MEMORY_AND_DISK)
        d = _destination_rows(verify.extract(spark, destination, dest_pattern, fmt),
                              written_at).persist(StorageLevel.MEMORY_AND_DISK)
        copies = copies_of(d)
        if digest_topic and _exists(destination, digest_topic):
            from diode.spark import digests
            judged = [r.asDict(recursive=True) for r in digests.check(
                verify.extract(spark, destination, dest_pattern, fmt),
                digests.extract_digests(spark, destination, digest_topic, fmt),
                written_at).collect()]
            found = digests.summary(judged, None)
            out_digests = {k: found[k] for k in ("verified", "altered", "incomplete")}
        else:
            out_digests = None
        if missing_topic and _exists(destination, missing_topic):
            flags = _flags(_reports(spark, destination, missing_topic, fmt))
        else:
            flags = spark.createDataFrame([], "sourceTopic string, sourcePartition int, "
                                          "sourceOffset long, reported int, filled int, "
                                          "reports long, reason string")
        rec = classify(s, copies, flags).persist(StorageLevel.MEMORY_AND_DISK)
        out = counts(rec)
        out["digests"] = out_digests
        # reports of records the source never held are false too
        phantom = flags.where("reported = 1").join(s.select(*KEY), KEY, "left_anti").count()
        out["false_missing"] += phantom
        out["phantom_reports"] = phantom
        # written copies whose provenance names no source record: forged or misrouted
        out["unknown_written"] = copies.join(s.select(*KEY), KEY, "left_anti").count()
        out["missing_reasons"] = {r["reason"] or "": r["n"] for r in rec.where(
            ~F.col("delivered") & F.col("reported")).groupBy("reason")
            .agg(F.count("*").alias("n")).collect()}
        out["missing_ranges"] = [
            {"topic": r["sourceTopic"], "partition": r["sourcePartition"],
             "first": r["firstOffset"], "last": r["lastOffset"], "records": r["records"],
             "reported": r["reported"], "reason": r["reason"], "sent_from_ms": r["sentFrom"],
             "sent_until_ms": r["sentUntil"]}
            for r in missing_ranges(rec).orderBy("sentFrom", "sourceTopic", "sourcePartition")
            .collect()]
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
        for frame in (rec, d, s):
            frame.unpersist()
        return out
    finally:
        spark.stop()
