"""`diode verify --digest-topic`: the destination's content proven against the sender's digests,
without the source cluster (diode.accounting.digests).

Each digest names a range the sender read of an incarnation of a source partition: first and
last offset, how many records, and BLAKE2b over their record hashes in offset order. Spark
hashes every destination record as the sender did (its own headers: those the receiver appended
are left out), takes those of each range, and judges it:

- verified: exactly `count` source offsets, one content each, and the digest matches;
- altered: an offset written with two contents (a forged copy beside the original), more
  offsets than the sender read, or the digest differs (a record changed);
- incomplete: fewer offsets than `count` (lost on the link, deleted or compacted away in the
  destination). Where the range's offsets are contiguous the absent ones are named, and
  checked against the receiver's missing-records topic: a loss it reported is known, one it
  did not is silent.

Every other record of the audited topics is unproven (`unproven`): no digest range covers it,
and nothing says its content is what the sender read. Each is named by where it sits in the
destination (topic, partition, offset, in runs of consecutive offsets) and why (WHY): no
provenance headers, no sourceTopicId, a sourceTopicId no digest names, an offset after the last
digest of its source partition or in no digest's range. Records without a sourceTopicId are
those of a diode older than topic ids, which sent no digests: they pass unproven only when the
operator says so (`diode verify --allow-without-topic-id`), counted.
"""

import re

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from diode.accounting import digests as dg
from diode.accounting import reasons
from diode.kafka.messages import DIGEST, WRITTEN_AT
from diode.accounting.ranges import merge, subtract
from diode.spark.verify import SOURCE, _origin, by_source, extract, own_headers

DIGEST_SCHEMA = DIGEST.spark_schema("sourceTopic", "sourcePartition", "sourceTopicId",
                                    "firstOffset", "lastOffset", "count", "digest")
JUDGED = T.StructType([T.StructField("state", T.StringType()),
                       T.StructField("present", T.LongType()),
                       T.StructField("conflicting", T.LongType()),
                       T.StructField("absent", T.ArrayType(T.ArrayType(T.LongType())))])
# Why a record is unproven: the reason in the JSON report, and as the table says it
WHY = {"no-provenance": "no provenance headers",
       "no-topic-id": "no sourceTopicId",
       "unknown-topic-id": "a sourceTopicId no digest names",
       "after-last-digest": "after the last digest of its source partition",
       "not-digested": "no digest covers its source offset"}
# The unproven records of a diode older than topic ids, which --allow-without-topic-id takes
OLD_DIODE = "no-topic-id"


def extract_digests(spark: SparkSession, cluster, topic: str,
                    mode: str = "auto") -> DataFrame:
    """receiver.digest.topic's digests, once each (a journal replay may write one twice), on
    `cluster` (its librdkafka settings, or bootstrap servers)."""
    rows = extract(spark, cluster, re.escape(topic), mode)
    return rows.select(F.from_json(F.col("value").cast("string"), DIGEST_SCHEMA).alias("d")) \
        .select("d.*").where(F.col("digest").isNotNull()).dropDuplicates()


@F.udf(T.BinaryType(), useArrow=False)  # (no pandas here: one row at a time)
def _record_hash(key, value, headers, timestamp):
    return dg.record_hash(key, value, [(h["key"], h["value"]) for h in headers or ()],
                          timestamp)


@F.udf(JUDGED, useArrow=False)
def _judge(records, first, last, count, digest):
    contents: dict = {}
    for r in records or ():
        contents.setdefault(r["sourceOffset"], set()).add(bytes(r["h"]))
    conflicting = sum(len(c) > 1 for c in contents.values())
    present = len(contents)
    absent = []
    if count == last - first + 1 and present < count:
        absent = [list(r) for r in subtract([(first, last)],
                                            merge([(o, o) for o in contents]))]
    if conflicting or present > count:
        state = "altered"
    elif present < count:
        state = "incomplete"
    else:
        found = dg.range_digest([next(iter(contents[o])) for o in sorted(contents)]).hex()
        state = "verified" if found == digest else "altered"
    return state, present, conflicting, absent


def numbered(digests: DataFrame) -> DataFrame:
    """The digests, each with an `id`, computed once and kept (a range's id must be the same
    where records are placed in it and where it is judged)."""
    return digests.withColumn("id", F.monotonically_increasing_id()).localCheckpoint()


def place(rows: DataFrame, d: DataFrame, written_at: str = WRITTEN_AT) -> DataFrame:
    """Every destination row (Kafka rows) as (topic, partition, offset, SOURCE, sourceOffset,
    id, h): its provenance (nulls where it has none), the `id` of each `numbered` digest range
    that covers it (one row per range; null: none does) and its record hash `h` as the sender
    took it (its own headers)."""
    recs = rows.select("topic", "partition", "offset", *_origin(), "key", "value",
                       own_headers(written_at).alias("own"), "timestamp")
    ranges = F.broadcast(d.select(*SOURCE, "id", "firstOffset", "lastOffset"))
    placed = by_source(recs, ranges, "left",
                       F.col("sourceOffset").between(F.col("firstOffset"), F.col("lastOffset")))
    return placed.select("topic", "partition", "offset", *SOURCE, "sourceOffset", "id",
                         _record_hash("key", "value", "own",
                                      F.unix_millis("timestamp")).alias("h"))


def judge(placed: DataFrame, d: DataFrame) -> DataFrame:
    """Per digest of `numbered` (SOURCE, firstOffset, lastOffset, count), from the `place`d
    records: state, present (distinct source offsets found), conflicting (offsets with two
    contents), absent (ranges, where the range's offsets are contiguous)."""
    grouped = placed.where(F.col("id").isNotNull()).groupBy("id").agg(
        F.collect_list(F.struct("sourceOffset", "h")).alias("records"))
    judged = d.join(grouped, "id", "left").select(
        *SOURCE, "firstOffset", "lastOffset", "count",
        _judge("records", "firstOffset", "lastOffset", "count", "digest").alias("j"))
    return judged.select(*SOURCE, "firstOffset", "lastOffset", "count", "j.*") \
        .orderBy(*SOURCE, "firstOffset")


def check(rows: DataFrame, digests: DataFrame, written_at: str = WRITTEN_AT) -> DataFrame:
    """`judge` of the destination rows (Kafka rows) against the digests, in one go."""
    d = numbered(digests)
    return judge(place(rows, d, written_at), d)


def unproven(placed: DataFrame, d: DataFrame) -> DataFrame:
    """The `place`d records no digest covers, in runs: (topic, partition, firstOffset,
    lastOffset, records, reason, SOURCE, sourceFirstOffset, sourceLastOffset), a run being
    consecutive destination offsets of one partition with one reason and one claimed source
    incarnation (the lowest and highest source offsets it claims), in destination order. Its
    size is the number of runs, not of records. The reason (WHY): no-provenance (no source
    topic, partition or offset that reads as one), no-topic-id, unknown-topic-id (digests of
    its source topic name other topic ids, not its), after-last-digest (beyond the last range
    of its incarnation's partition: not digested yet, or that digest was lost) or
    not-digested (no digest of its topic, partition or offset)."""
    loose = placed.where(F.col("id").isNull())
    ids = F.broadcast(d.groupBy("sourceTopic").agg(
        F.collect_set("sourceTopicId").alias("digestedIds")))
    last = F.broadcast(d.groupBy(*SOURCE).agg(F.max("lastOffset").alias("lastDigested")))
    loose = by_source(loose.join(ids, "sourceTopic", "left"), last, "left")
    c = F.col
    reason = (F.when(c("sourceTopic").isNull() | c("sourcePartition").isNull()
                     | c("sourceOffset").isNull(), "no-provenance")
              .when(c("sourceTopicId").isNull(), OLD_DIODE)
              .when(~F.array_contains("digestedIds", c("sourceTopicId")), "unknown-topic-id")
              .when(c("sourceOffset") > c("lastDigested"), "after-last-digest")
              .otherwise("not-digested"))
    run = ["topic", "partition", "reason", *SOURCE]
    island = c("offset") - F.row_number().over(Window.partitionBy(*run).orderBy("offset"))
    return (loose.withColumn("reason", reason).withColumn("island", island)
            .groupBy(*run, "island")
            .agg(F.min("offset").alias("firstOffset"), F.max("offset").alias("lastOffset"),
                 F.count("*").alias("records"), F.min("sourceOffset").alias("sourceFirstOffset"),
                 F.max("sourceOffset").alias("sourceLastOffset"))
            .select("topic", "partition", "firstOffset", "lastOffset", "records", "reason",
                    *SOURCE, "sourceFirstOffset", "sourceLastOffset")
            .orderBy("topic", "partition", "firstOffset"))


def reported_missing(cluster, topic: str) -> dict:
    """The receiver's missing-records topic on `cluster` (its librdkafka settings, or bootstrap
    servers): (source topic, partition, topic id) -> merged ranges reported missing and not
    filled since."""
    from diode.kafka import recovery
    from diode.kafka.cluster import settings_of
    found: dict = {}
    for e in recovery.all_events(settings_of(cluster), topic):
        if e.kind not in ("missing", "filled") or e.reason == reasons.EXPIRED:
            continue
        key = (e.topic, e.partition, e.topic_id)
        now = found.get(key, [])
        found[key] = merge(now + [(e.first, e.last)]) if e.kind == "missing" \
            else subtract(now, [(e.first, e.last)])
    return found


def summary(rows: list, reported: dict | None, loose: list | None = None,
            without_topic_id: bool = False) -> dict:
    """The judged digests as the report's `digests`: counts, and the ranges not verified, each
    incomplete one saying whether its absent records were reported missing (None: unknown).
    Given the `unproven` runs (`loose`): how many records are unproven and every run of them
    (unprovenRecords); with `without_topic_id`, those without a sourceTopicId are taken as a
    diode older than topic ids wrote them, counted (takenWithoutTopicId) and not listed."""
    out = {"verified": 0, "altered": 0, "incomplete": 0, "unreported": 0, "ranges": []}
    for r in rows:
        out[r["state"]] += 1
        if r["state"] == "verified":
            continue
        known = None
        if r["state"] == "incomplete" and reported is not None and r["absent"]:
            spans = reported.get((r["sourceTopic"], r["sourcePartition"], r["sourceTopicId"]), [])
            known = not subtract([tuple(a) for a in r["absent"]], spans)
        if r["state"] == "incomplete" and known is False:
            out["unreported"] += 1
        out["ranges"].append({k: r[k] for k in (*SOURCE, "firstOffset", "lastOffset", "count",
                                                "state", "present", "conflicting", "absent")}
                             | {"reported": known})
    if loose is not None:
        taken = [u for u in loose if without_topic_id and u["reason"] == OLD_DIODE]
        listed = [u for u in loose if not (without_topic_id and u["reason"] == OLD_DIODE)]
        out["unproven"] = sum(u["records"] for u in listed)
        out["unprovenRecords"] = listed
        out["takenWithoutTopicId"] = sum(u["records"] for u in taken) \
            if without_topic_id else None
    return out


SHOWN = 20  # ranges, and runs of unproven records, the table lists (the JSON has them all)


def lines(s: dict) -> list:
    """The digests' part of the table."""
    head = (f"digests: {s['verified']} ranges verified, {s['altered']} altered, "
            f"{s['incomplete']} incomplete ({s['unreported']} with records not reported "
            "missing)")
    if "unproven" in s:
        head += f"; {s['unproven']} records unproven"
        if s["takenWithoutTopicId"] is not None:
            head += (f", {s['takenWithoutTopicId']} without a topic id taken unproven "
                     "(--allow-without-topic-id)")
    out = [head]
    for r in s["ranges"][:SHOWN]:
        where = f"{r['sourceTopic']}[{r['sourcePartition']}] {r['firstOffset']}..{r['lastOffset']}"
        if r["state"] == "altered":
            why = (f"{r['conflicting']} offset(s) written with two contents"
                   if r["conflicting"] else "the records differ from what the sender read")
        else:
            absent = ", ".join(f"{a}..{b}" for a, b in r["absent"][:5]) or "not named"
            said = {True: "reported missing", False: "NOT reported missing",
                    None: "not checked against the missing-records topic"}[r["reported"]]
            why = f"{r['present']} of {r['count']} records; absent: {absent} ({said})"
        out.append(f"  {r['state']}: {where}: {why}")
    if len(s["ranges"]) > SHOWN:
        out.append(f"  … and {len(s['ranges']) - SHOWN} more")
    runs = s.get("unprovenRecords", [])
    out += [f"  unproven: {_unproven_line(u)}" for u in runs[:SHOWN]]
    if len(runs) > SHOWN:
        out.append(f"  … and {len(runs) - SHOWN} more runs of unproven records (the --json "
                   "report lists them all)")
    return out


def _unproven_line(u: dict) -> str:
    """`dest_src[0] 3000: no sourceTopicId (claims src[0] 10)`: where an unproven run sits in
    the destination, why, and the source it claims."""
    where = f"{u['topic']}[{u['partition']}] {u['firstOffset']}"
    if u["lastOffset"] != u["firstOffset"]:
        where += f"..{u['lastOffset']} ({u['records']} records)"
    line = f"{where}: {WHY[u['reason']]}"
    if u["reason"] != "no-provenance":
        first, last = u["sourceFirstOffset"], u["sourceLastOffset"]
        claim = f"{u['sourceTopic']}[{u['sourcePartition']}] {first}" + \
            (f"..{last}" if last != first else "")
        if u["reason"] == "unknown-topic-id":
            claim += f", topic id {u['sourceTopicId']}"
        line += f" (claims {claim})"
    return line
