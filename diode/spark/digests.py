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
"""

import re

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from diode.accounting import digests as dg
from diode.accounting.ranges import merge, subtract
from diode.spark.verify import SOURCE, by_source, extract, own_headers, with_provenance_rows

DIGEST_SCHEMA = ("sourceTopic string, sourcePartition int, sourceTopicId string, "
                 "firstOffset long, lastOffset long, count long, digest string")
JUDGED = T.StructType([T.StructField("state", T.StringType()),
                       T.StructField("present", T.LongType()),
                       T.StructField("conflicting", T.LongType()),
                       T.StructField("absent", T.ArrayType(T.ArrayType(T.LongType())))])


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


def check(rows: DataFrame, digests: DataFrame, written_at: str = "writtenAt") -> DataFrame:
    """Per digest (SOURCE, firstOffset, lastOffset, count): state, present (distinct source
    offsets found), conflicting (offsets with two contents), absent (ranges, where the range's
    offsets are contiguous)."""
    recs = with_provenance_rows(rows).select(
        *SOURCE, "sourceOffset",
        _record_hash("key", "value", own_headers(written_at),
                     F.unix_millis("timestamp")).alias("h"))
    d = digests.withColumn("id", F.monotonically_increasing_id())
    ranges = F.broadcast(d.select(*SOURCE, "id", "firstOffset", "lastOffset"))
    placed = by_source(recs, ranges).where(
        F.col("sourceOffset").between(F.col("firstOffset"), F.col("lastOffset")))
    grouped = placed.groupBy("id").agg(
        F.collect_list(F.struct("sourceOffset", "h")).alias("records"))
    judged = d.join(grouped, "id", "left").select(
        *SOURCE, "firstOffset", "lastOffset", "count",
        _judge("records", "firstOffset", "lastOffset", "count", "digest").alias("j"))
    return judged.select(*SOURCE, "firstOffset", "lastOffset", "count", "j.*") \
        .orderBy(*SOURCE, "firstOffset")


def reported_missing(cluster, topic: str) -> dict:
    """The receiver's missing-records topic on `cluster` (its librdkafka settings, or bootstrap
    servers): (source topic, partition, topic id) -> merged ranges reported missing and not
    filled since."""
    from diode.kafka import recovery
    from diode.kafka.cluster import settings_of
    found: dict = {}
    for e in recovery.all_events(settings_of(cluster), topic):
        if e.get("type") not in ("missing", "filled") or e.get("reason") == "expired":
            continue
        key = (e.get("sourceTopic"), e.get("sourcePartition"), e.get("sourceTopicId"))
        span = [(int(e["firstOffset"]), int(e["lastOffset"]))]
        now = found.get(key, [])
        found[key] = merge(now + span) if e["type"] == "missing" else subtract(now, span)
    return found


def summary(rows: list, reported: dict | None) -> dict:
    """The judged digests as the report's `digests`: counts, and the ranges not verified, each
    incomplete one saying whether its absent records were reported missing (None: unknown)."""
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
    return out


def lines(s: dict) -> list:
    """The digests' part of the table."""
    out = [f"digests: {s['verified']} ranges verified, {s['altered']} altered, "
           f"{s['incomplete']} incomplete ({s['unreported']} with records not reported "
           "missing)"]
    for r in s["ranges"][:20]:
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
    if len(s["ranges"]) > 20:
        out.append(f"  … and {len(s['ranges']) - 20} more")
    return out
