"""`diode verify`: an independent audit, on Spark, of what crossed the diode.

On the low side nobody can ask the sender what it sent, so the audit works from what the
destination holds: the provenance headers of every record (sourceTopic, sourcePartition,
sourceOffset, sourceTopicId) and, when the receiver records them, the sender's heartbeats (the
last offset sent per partition). Per incarnation of a source partition (diode.kafka.identity:
offsets mean something only within one, and a recreated topic starts again at 0) it reports
records, distinct offsets, duplicates, missing offset ranges, out-of-order arrivals and
end-to-end latency. Records of a diode older than topic ids carry no sourceTopicId: theirs is
the null incarnation, audited as one. `--stream` keeps auditing (diode.spark.stream).

Extract, transform and load are separate functions; `provenance` and `audit` (the transform)
are pure DataFrame -> DataFrame functions with known-answer tests. `extract` reads exactly what
each partition held when the audit began (diode.spark.coverage.extents, found by a consumer
reading to the real end), and the command checks that the read covered it (`offsets_read`,
coverage.shortfalls): a short read is an error, not a report.
"""

import logging
import os
import re
import sys

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from diode.kafka.messages import (HEARTBEAT, SOURCE_OFFSET, SOURCE_PARTITION, SOURCE_TOPIC,
                                  SOURCE_TOPIC_ID, TICKET_HEADER, WRITTEN_AT)
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
        .config("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower())  # a terminal
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

def extract(spark: SparkSession, cluster, pattern: str, mode: str = "auto",
            held: dict | None = None) -> DataFrame:
    """The topics matching `pattern` (fully) of `cluster` (its librdkafka settings, or bootstrap
    servers: diode.kafka.cluster), as Kafka rows: exactly the records each partition held when
    `held` was found (diode.spark.coverage.extents; found now when not given), read to the real
    end whatever the broker's ListOffsets says, the same records at each pass."""
    from diode.kafka.cluster import settings_of
    from diode.spark import coverage
    from diode.spark.kafka_source import SCHEMA
    settings = settings_of(cluster)
    if held is None:
        held = coverage.extents(settings, pattern=pattern)
    if not held:
        return spark.createDataFrame([], SCHEMA)
    return coverage.pin(kafka_reader(spark.read, spark, settings, mode), held).load()


def kafka_reader(reader, spark: SparkSession, cluster, mode: str):
    """`spark.read` or `spark.readStream` on the chosen Kafka source (`source_options`) for
    `cluster` (its librdkafka settings, or bootstrap servers), from the earliest offsets,
    headers included."""
    from diode.kafka.cluster import settings_of
    fmt, options = source_options(spark, settings_of(cluster), mode)
    reader = reader.format(fmt).option("includeHeaders", "true") \
        .option("startingOffsets", "earliest")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader


_said: set = set()  # notes on the sources' settings, said once


def source_options(spark: SparkSession, settings: dict, mode: str) -> tuple[str, dict]:
    """(the Kafka source to read with, choose_format's; its `kafka.` options) for a cluster's
    librdkafka `settings`: Spark's connector takes them in the terms of Kafka's Java client
    (diode.kafka.java: sasl.jaas.config for sasl.username and sasl.password, a PEM trust store
    for ssl.ca.location, ...), diode's Python source as they are. With `auto`, settings the
    Java client has no counterpart for are read with the Python source; with `native`, they are
    a ClusterError naming the setting."""
    from diode.errors import ClusterError
    from diode.kafka.java import Untranslatable, java_settings
    fmt = choose_format(spark, mode)
    if fmt == "kafka":
        try:
            java, left_out = java_settings(settings)
        except Untranslatable as exc:
            if mode != "auto":
                raise ClusterError(f"Spark's Kafka connector (--format native) cannot take "
                                   f"{exc}: read with --format python") from None
            _say_once(f"Spark's Kafka connector cannot take {exc}: reading with diode's "
                      "Python source")
            fmt = choose_format(spark, "python")
        else:
            if left_out:
                _say_once(f"Spark's Kafka connector does not take {', '.join(left_out)} "
                          "(librdkafka's own): read without")
            return fmt, {f"kafka.{k}": v for k, v in java.items()}
    return fmt, {f"kafka.{k}": v for k, v in settings.items()}


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        say(message)


def extract_heartbeats(spark: SparkSession, cluster, topic: str,
                       mode: str = "auto") -> DataFrame:
    """The heartbeats of receiver.heartbeat.topic as `claims`: per incarnation, where the
    sender's earliest chain started and the highest offset it said it had sent."""
    return claims(extract(spark, cluster, re.escape(topic), mode))


def extract_topic_ids(cluster, topics: list) -> dict:
    """topic -> its topic id now (text, as sourceTopicId holds it) on `cluster` (its librdkafka
    settings, or bootstrap servers), for `compare`; topics it does not have, or of a broker
    without topic ids, are left out."""
    from confluent_kafka.admin import AdminClient

    from diode.kafka import identity
    from diode.kafka.clients import admin_config
    from diode.kafka.cluster import librdkafka_log, settings_of
    from diode.kafka.refresh import topic_ids
    admin = AdminClient({**admin_config(settings_of(cluster)), "logger": librdkafka_log()})
    ids = topic_ids(admin, topics)
    return {t: identity.text(i) for t, i in ids.items() if i != identity.NO_INCARNATION}


# -- transform -----------------------------------------------------------------------------------

def provenance(rows: DataFrame, written_at: str = WRITTEN_AT) -> DataFrame:
    """Destination rows reduced to what the audit needs: where each record sits (topic, partition,
    offset), where it came from (sourceTopic, sourcePartition, sourceOffset, and the incarnation
    sourceTopicId: null for records of a diode older than topic ids), when the receiver wrote
    it (writtenAt, ms) and its end-to-end latency in ms (the `written_at` header,
    receiver.written.at.header, minus the source timestamp the record kept; null without the
    header). Rows without provenance (not written by diode) are left out."""
    return of_provenance(read_provenance(rows, written_at))


def read_provenance(rows: DataFrame, written_at: str = WRITTEN_AT) -> DataFrame:
    """`provenance`'s columns of every row read, those without provenance too (null
    sourceOffset): what the audit keeps of a read, and what tells how far the read went."""
    stamp = _header(written_at, "long") if written_at else F.lit(None).cast("long")
    return rows.select(
        "topic", "partition", "offset", *_origin(),
        stamp.alias("writtenAt"),
        (stamp - F.unix_millis("timestamp")).alias("latencyMs"),
    )


def of_provenance(read: DataFrame) -> DataFrame:
    """The rows of `read_provenance` that have provenance (written by diode)."""
    return read.where(F.col("sourceOffset").isNotNull())


def offsets_read(rows: DataFrame) -> dict:
    """{(topic, partition): (lowest, highest) offset} of the Kafka rows (or any with topic,
    partition and offset columns), for diode.spark.coverage.shortfalls."""
    got = rows.groupBy("topic", "partition").agg(F.min("offset").alias("lo"),
                                                 F.max("offset").alias("hi")).collect()
    return {(r.topic, r.partition): (r.lo, r.hi) for r in got}


def _origin() -> list:
    """sourceTopic, sourcePartition, sourceOffset, sourceTopicId columns from the provenance
    headers (sourceTopicId null when absent): the audit's reading of the headers
    diode.kafka.messages defines, taken as its Provenance.parse takes them."""
    return [_header(SOURCE_TOPIC, "string").alias(SOURCE_TOPIC),
            _header(SOURCE_PARTITION, "int").alias(SOURCE_PARTITION),
            _header(SOURCE_OFFSET, "long").alias(SOURCE_OFFSET),
            _incarnation().alias(SOURCE_TOPIC_ID)]


def _incarnation():
    """The sourceTopicId of the nearest provenance: the header after its sourceOffset. A record
    whose nearest diode was older than topic ids has none, whatever an upstream diode's headers
    say."""
    last = F.try_element_at(
        F.filter("headers", lambda h: h["key"].isin(SOURCE_OFFSET, SOURCE_TOPIC_ID)), F.lit(-1))
    return F.when(last["key"] == F.lit(SOURCE_TOPIC_ID), last["value"].cast("string"))


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
    """Per incarnation of a source partition (SOURCE), from `provenance` rows: records, distinct
    offsets, duplicates, first and last offsets, missing ranges, out-of-order arrivals (a record
    written after a later one of its incarnation), and latency percentiles and maximum in ms.

    Spark reduces the rows to a summary per incarnation (`summarize`: runs of consecutive
    offsets, so its size is the number of holes); the missing ranges are then judged by the
    same ledger the streaming audit keeps (diode.accounting.ledger: holes between runs, a lost
    tail up to what the heartbeats claim, a lost head from where the sender's chain started
    unless the destination partition no longer starts at offset 0), one set of rules for both.
    A heartbeat claim counts for the incarnation it names (`claims`); one without a topic id,
    from a receiver older than topic ids, for the records without one.
    Offsets of compacted topics are not contiguous: there a hole may be a record that never
    existed; `compare` against the source cluster settles it."""
    from diode.accounting.ledger import PartitionLedger
    spark = p.sparkSession
    said = {(c.sourceTopic, c.sourcePartition, c.sourceTopicId): c for c in
            (heartbeats.collect() if heartbeats is not None else [])}
    rows = []
    for r in summarize(p).collect():
        runs = sorted((x.first, x.last) for x in r.runs)
        ledger = PartitionLedger(grace_ms=0)
        ledger.add(runs, r.records, r.outOfOrder, destination_first=r.destinationFirst)
        c = said.get((r.sourceTopic, r.sourcePartition, r.sourceTopicId))
        if c is not None:
            ledger.claim(c.lastSent, None, 0, c.firstSent)
        missing, _ = ledger.settle(0, caught_up=True)
        distinct = sum(b - a + 1 for a, b in runs)
        q = r.q or [None] * 3
        rows.append((r.sourceTopic, r.sourcePartition, r.sourceTopicId, r.records, distinct,
                     r.records - distinct, runs[0][0], runs[-1][1],
                     sum(b - a + 1 for a, b in missing),
                     [{"first": a, "last": b} for a, b in missing], r.outOfOrder,
                     q[0], q[1], q[2], r.latencyMax))
    return spark.createDataFrame(rows, AUDIT_SCHEMA).orderBy(*SOURCE)


AUDIT_SCHEMA = (f"sourceTopic string, sourcePartition int, sourceTopicId string, records long, "
                f"distinct long, duplicates long, first long, last long, missing long, "
                f"missingRanges {MISSING}, outOfOrder long, latencyP50 long, latencyP90 long, "
                "latencyP99 long, latencyMax long")


# An incarnation of a source partition: what offsets are counted within (sourceTopicId null
# for the records of a diode older than topic ids, one incarnation of their own)
SOURCE = ["sourceTopic", "sourcePartition", "sourceTopicId"]


def by_source(left: DataFrame, right: DataFrame, how: str = "inner", *also) -> DataFrame:
    """`left` joined with `right` on SOURCE, a null sourceTopicId matching a null one (an equi
    join drops null keys), and on the conditions `also` (of columns only one side has)."""
    theirs = right.select(*[F.col(c).alias(f"_{c}") for c in SOURCE],
                          *[c for c in right.columns if c not in SOURCE])
    on = [left[c].eqNullSafe(theirs[f"_{c}"]) for c in SOURCE] + list(also)
    return left.join(theirs, on, how).drop(*[f"_{c}" for c in SOURCE])


def summarize(p: DataFrame, known: DataFrame | None = None) -> DataFrame:
    """Per incarnation of a source partition in one micro-batch (`provenance` rows): runs of
    consecutive distinct source offsets, records, out-of-order arrivals (after a later record of
    this batch or, given `known` (SOURCE, last), of an earlier batch), latency percentiles, and
    the lowest offset of the destination partition it was written to (destinationFirst). Its
    size is the number of holes, not of records."""
    arrival = Window.partitionBy("topic", "partition", *SOURCE).orderBy("offset")
    late = p.withColumn("prevMax", F.max("sourceOffset").over(
        arrival.rowsBetween(Window.unboundedPreceding, -1)))
    if known is not None:
        late = by_source(late, F.broadcast(known), "left") \
            .withColumn("prevMax", F.greatest("prevMax", "last"))
    counts = late.groupBy(*SOURCE).agg(
        F.count("*").alias("records"),
        F.sum(F.when(F.col("sourceOffset") < F.col("prevMax"), 1).otherwise(0))
        .alias("outOfOrder"),
        _quantiles().alias("q"), F.max("latencyMs").alias("latencyMax"),
        F.max("writtenAt").alias("written"))
    # Of the whole destination partition, not of this incarnation's records (above 0,
    # retention removed records there and a lost head cannot be judged): a recreated topic's
    # new incarnation is written after the old one's records, in the same partition.
    placed = p.groupBy("topic", "partition", *SOURCE).agg(F.min("offset").alias("from"))
    starts = (placed.withColumn("start", F.min("from").over(
        Window.partitionBy("topic", "partition")))
        .groupBy(*SOURCE).agg(F.min("start").alias("destinationFirst")))
    island = F.col("sourceOffset") - F.row_number().over(
        Window.partitionBy(*SOURCE).orderBy("sourceOffset"))
    runs = (p.select(*SOURCE, "sourceOffset").distinct()
            .withColumn("island", island)
            .groupBy(*SOURCE, "island")
            .agg(F.min("sourceOffset").alias("first"), F.max("sourceOffset").alias("last"))
            .groupBy(*SOURCE)
            .agg(F.collect_list(F.struct("first", "last")).alias("runs")))
    return by_source(by_source(counts, starts), runs)


def claims(beats: DataFrame) -> DataFrame:
    """(SOURCE, lastSent, receivedAt, firstSent) from heartbeat records
    (receiver.heartbeat.topic): per incarnation, the highest offset claimed and when the
    receiver got it, and the earliest chain start. A claim names its incarnation (topicId)
    since topic ids; an older receiver's names none (sourceTopicId null: the claim is about
    the records without a topic id)."""
    beat = F.from_json(F.col("value").cast("string"),
                       HEARTBEAT.spark_schema("receivedAt", "lastSent"))
    latest = F.max(F.struct(F.col("s.offset").alias("lastSent"), F.col("receivedAt")))
    return (beats.select(beat["receivedAt"].alias("receivedAt"),
                         F.explode(beat["lastSent"]).alias("s"))
            .groupBy(F.col("s.topic").alias("sourceTopic"),
                     F.col("s.partition").alias("sourcePartition"),
                     F.col("s.topicId").alias("sourceTopicId"))
            .agg(latest.alias("c"), F.min("s.chainStart").alias("firstSent"))
            .select(*SOURCE, "c.lastSent", "c.receivedAt", "firstSent"))


def latency(p: DataFrame) -> dict:
    """Latency percentiles (ms) over all records: {p50, p90, p99, max}, None without data."""
    row = p.agg(_quantiles().alias("q"), F.max("latencyMs").alias("m")).first()
    q = row["q"] or [None] * 3
    return {"p50": q[0], "p90": q[1], "p99": q[2], "max": row["m"]}


def compare(source: DataFrame, destination: DataFrame, written_at: str = WRITTEN_AT,
            current: dict | None = None) -> DataFrame:
    """Record by record, against the source cluster (soak tests, pre-production): per source
    partition, records lost (in the source, not in the destination), duplicated (written more
    than once) and altered (key, value or headers differ). The headers the receiver appends
    (provenance, then `written_at`) are left out of the comparison; the destination keeps the
    source's own headers first, in order.

    `current`: topic -> the source's topic id now (sourceTopicId's text). The source holds only
    that incarnation's records, so destination records of another (the topic recreated since)
    are left out; records without a topic id (a diode older than topic ids) and topics not in
    `current` (a broker without topic ids) are compared by offset alone. sourceTopicId in the
    result: the incarnation compared (null when not known)."""
    key = ["sourceTopic", "sourcePartition", "sourceOffset"]
    own = own_headers(written_at)
    ids = sorted((current or {}).items())
    now = F.create_map(*[F.lit(v) for kv in ids for v in kv])[F.col("sourceTopic")] if ids \
        else F.lit(None).cast("string")
    dst = with_provenance_rows(destination) \
        .where(F.col("sourceTopicId").isNull() | now.isNull() | (F.col("sourceTopicId") == now)) \
        .select(*key, F.col("key").alias("dKey"), F.col("value").alias("dValue"),
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
    return (joined.groupBy("sourceTopic", "sourcePartition", now.alias("sourceTopicId")).agg(
        F.count("*").alias("sourceRecords"),
        F.sum(F.when(F.col("copies").isNull(), 1).otherwise(0)).alias("lost"),
        F.sum(F.when(F.col("copies") > 1, F.col("copies") - 1).otherwise(0))
        .alias("duplicated"),
        F.sum(F.when(F.col("copies").isNotNull() & altered, 1).otherwise(0)).alias("altered"))
        .orderBy("sourceTopic", "sourcePartition"))


def own_headers(written_at: str = WRITTEN_AT):
    """A destination record's own headers: the source's, in order, without those the receiver
    appends after them: provenance (sourceTopic, sourcePartition, sourceOffset, then
    sourceTopicId since topic ids), `written_at`, and on a resent record diodeTicket."""
    def key_at(back):
        return F.try_element_at("headers", F.lit(-1) - back)["key"]
    ticket = F.when(key_at(F.lit(0)) == F.lit(TICKET_HEADER), 1).otherwise(0)
    stamp = F.when(F.lit(bool(written_at)) & (key_at(ticket) == F.lit(written_at)), 1) \
        .otherwise(0)
    named = F.when(key_at(ticket + stamp) == F.lit(SOURCE_TOPIC_ID), 1).otherwise(0)
    return F.slice("headers", F.lit(1),
                   F.greatest(F.size("headers") - 3 - ticket - stamp - named, F.lit(0)))


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
    """The report as text: a line per incarnation of a source partition (topic id `-`: records
    of a diode older than topic ids), then the totals."""
    head = ("records", "distinct", "duplicates", "missing", "out of order", "p50 ms", "p99 ms")
    lines = [f"{'source partition':>16}  {'topic id':>22}  " + "  ".join(f"{h:>12}" for h in head)
             + "  missing ranges"]
    for r in rep["partitions"]:
        ranges = ", ".join(f"{m['first']}..{m['last']}" for m in r["missingRanges"][:5])
        if len(r["missingRanges"]) > 5:
            ranges += f", … ({len(r['missingRanges'])} ranges)"
        where = f"{r['sourceTopic']}[{r['sourcePartition']}]"
        lines.append(f"{where:>16}  {r['sourceTopicId'] or '-':>22}  " + "  ".join(
            f"{v:>12}" for v in (r["records"], r["distinct"], r["duplicates"], r["missing"],
                                 r["outOfOrder"], _ms(r["latencyP50"]), _ms(r["latencyP99"])))
            + "  " + (ranges or "-"))
    t = rep["totals"]
    lines.append(f"total: {t['records']} records, {t['distinct']} distinct, {t['duplicates']} "
                 f"duplicates, {t['missing']} missing, {t['outOfOrder']} out of order")
    lat = t.get("latencyMs") or {}
    if lat.get("p50") is not None:
        lines.append(f"end-to-end latency: p50 {lat['p50']} ms, p90 {lat['p90']} ms, "
                     f"p99 {lat['p99']} ms, max {lat['max']} ms")
    return "\n".join(lines)


def manifest(rep: dict) -> dict:
    """The resend manifest: missing ranges per incarnation of a source partition, with the
    incarnation's topic id (`diode resend` refuses ranges of another incarnation than the
    source's current one); none for records of a diode older than topic ids."""
    return {"version": 1, "missing": [
        {"topic": r["sourceTopic"], "partition": r["sourcePartition"],
         **({"topicId": r["sourceTopicId"]} if r["sourceTopicId"] is not None else {}),
         "ranges": [[m["first"], m["last"]] for m in r["missingRanges"]]}
        for r in rep["partitions"] if r["missingRanges"]]}


def say(message: str) -> None:
    """Progress, on stderr (the table and the JSON go to stdout and files)."""
    print(f"diode verify: {message}", file=sys.stderr, flush=True)


def pattern_of(args) -> str:
    return args.pattern or (re.escape(args.prefix) + ".*")


def cause(e: Exception) -> str:
    """The line of a (Spark-wrapped) error that says what went wrong."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    ours = [ln for ln in lines if "diode_kafka:" in ln or "diode verify" in ln]
    return (ours or lines or [type(e).__name__])[-1][:1000]
