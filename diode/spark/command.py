"""`diode verify`: the command around the audit (diode.spark.verify, the batch audit's extract
and transform; diode.spark.stream, the streaming audit). Run by `diode verify`, or by
spark-submit on a cluster: `spark-submit .../diode/spark/command.py ARGS`.

Spark is imported when the command runs, not when the CLI builds its parser: every other
`diode` command starts without it, and a machine without the `spark` extra is told what to
install."""

import json
import re
import sys
import time

from diode.kafka.messages import WRITTEN_AT


def main(args) -> int:
    """`diode verify`: exit 0 when nothing is missing (or lost, altered, incomplete or
    unproven), 1 otherwise, 2 when it could not audit everything (a read short of what the
    partitions held, an error)."""
    try:
        import pyspark  # noqa: F401
    except ModuleNotFoundError:
        print("diode verify needs the `spark` extra: pip install 'diode[spark]'",
              file=sys.stderr)
        return 2
    from diode.errors import DiodeError
    from diode.spark import stream
    from diode.spark.coverage import ShortRead
    from diode.spark.verify import cause, say
    if args.allow_without_topic_id and not args.digest_topic:
        say("--allow-without-topic-id says which records pass the digests' proof unproven: "
            "give it with --digest-topic")
        return 2
    try:
        destination, source = clusters(args)
        if args.stream:
            return stream.main(args, destination, source)
        return audit_once(args, destination, source)
    except DiodeError as e:  # (a cluster that cannot be used, its settings, the topology)
        say(str(e))
        return 2
    except ShortRead as e:
        say(f"{e}\nno report: an audit of part of the records would say too little")
        return 2
    except Exception as e:  # noqa: BLE001 - Spark wraps planner and executor errors: show the cause
        say(f"failed: {cause(e)}")
        return 2


def clusters(args) -> tuple:
    """(the destination cluster, the source cluster or None) the options give
    (diode.kafka.cluster), each asked for its metadata first: a ClusterError naming the
    setting to check, before Spark starts, when one cannot be used."""
    from diode.kafka.cluster import of_args, reach
    destination = of_args(args, "receiver", what="the destination cluster")
    source = of_args(args, "sender", prefix="source-", flag="-S", what="the source cluster")
    for cluster in (destination, source):
        if cluster is not None:
            reach(cluster)
    return destination, source


def audit_once(args, destination, source=None) -> int:
    """The batch audit of `destination` (and against `source`, diode.kafka.cluster's): the
    table, the JSON report, the manifest; 1 when anything is missing. Raises
    coverage.ShortRead when a read fell short of what the partitions held."""
    from diode.spark import coverage
    from diode.spark.verify import (audit, compare, extract_heartbeats, extract_topic_ids,
                                    latency, manifest, of_provenance, pattern_of,
                                    read_provenance, report, say, session, table)
    started = time.monotonic()
    say(f"starting Spark ({args.master or 'spark-submit master or local[*]'})")
    spark = session(args.master, source=args.format)
    try:
        pattern = pattern_of(args)
        held = coverage.extents(destination, pattern=pattern)
        say(f"auditing the topics matching {pattern} on {destination.name}: "
            f"{coverage.describe(held)}")
        audit_start = time.monotonic()
        rows, kept = read_checked(spark, destination, pattern, held, args.format,
                                  lambda r: read_provenance(r, args.written_at_header))
        p = of_provenance(kept)
        beats = extract_heartbeats(spark, destination, args.heartbeat_topic, args.format) \
            if args.heartbeat_topic else None
        rep = report(audit(p, beats))
        rep["totals"]["latencyMs"] = latency(p)
        took = time.monotonic() - audit_start
        n = rep["totals"]["records"]
        say(f"audited {n} records of {len(rep['partitions'])} source partitions in "
            f"{took:.1f} s ({rate(n, took)} records/s)")
        if source is not None:
            topics = sorted({r["sourceTopic"] for r in rep["partitions"]})
            say(f"comparing with {source.name}: {len(topics)} topics")
            wanted = "|".join(re.escape(t) for t in topics) or "(?!)"
            source_held = coverage.extents(source, pattern=wanted)
            _, source_rows = read_checked(spark, source, wanted, source_held, args.format,
                                          lambda r: r)
            # (the source holds only its topics' current incarnations: compared with those)
            current = extract_topic_ids(source, topics)
            rep["comparison"] = [r.asDict() for r in compare(
                source_rows, rows, args.written_at_header, current).collect()]
            rep["totals"].update({k: sum(r[k] for r in rep["comparison"])
                                  for k in ("lost", "duplicated", "altered")})
            source_rows.unpersist()
        if args.digest_topic:
            rep["digests"] = check_digests(spark, rows, destination, args)
        kept.unpersist()
    finally:
        spark.stop()
    say(f"done in {time.monotonic() - started:.1f} s")
    print(table(rep))
    if "digests" in rep:
        from diode.spark.digests import lines
        print("\n".join(lines(rep["digests"])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=1)
    if args.manifest:
        written = manifest(rep)
        if args.topology:
            from diode.runtime import topology as topo
            from diode.ticket_command import signed
            written = signed(topo.load(args.topology), written)
        else:
            say("the manifest is not signed (no --topology): `diode resend` refuses it on a "
                "link with a cipher")
        with open(args.manifest, "w") as f:
            json.dump(written, f, indent=1)
    if "comparison" in rep:
        t = rep["totals"]
        print(f"against the source: {t['lost']} lost, {t['duplicated']} duplicated, "
              f"{t['altered']} altered")
    t = rep["totals"]
    d = rep.get("digests") or {}
    return 1 if t["missing"] or t.get("lost") or t.get("altered") or d.get("altered") or \
        d.get("incomplete") or d.get("unproven") else 0


def read_checked(spark, cluster, pattern: str, held: dict, mode: str, keep) -> tuple:
    """(the Kafka rows of `cluster`'s (diode.kafka.cluster) topics matching `pattern`, `keep` of
    them persisted), read once and checked against what the partitions held (`held`,
    coverage.extents): a read that fell short raises coverage.ShortRead. With --format auto, a
    short read by Spark's Kafka source is read again with diode's Python source before giving
    up."""
    from pyspark import StorageLevel

    from diode.spark import coverage
    from diode.spark.verify import extract, offsets_read, say, source_options
    what = cluster.what.removesuffix(" cluster")
    while True:
        fmt, _ = source_options(spark, cluster.settings, mode)
        say(f"reading {what} with the {fmt} source")
        rows = extract(spark, cluster, pattern, mode, held=held)
        kept = keep(rows).persist(StorageLevel.MEMORY_AND_DISK)
        short = coverage.shortfalls(held, offsets_read(kept))
        if not short:
            return rows, kept
        kept.unpersist()
        if mode != "auto" or fmt != "kafka":
            raise coverage.ShortRead(f"{what} ({cluster.bootstrap}, {fmt} source)", short)
        say(f"Spark's Kafka source read {what} short ({short[0]}): reading it again with "
            "diode's Python source")
        mode = "python"


def rate(n: int, seconds: float) -> str:
    """n / seconds, with the digits that say something: 33223, 41.5, 0.4 (never 0 when n > 0)."""
    r = n / max(seconds, 1e-9)
    if r >= 100 or r == 0:
        return f"{r:.0f}"
    return f"{r:.1f}" if r >= 1 else f"{r:.2g}"


def check_digests(spark, rows, destination, args) -> dict:
    """The destination against the sender's digests (diode.spark.digests): the report's
    `digests`. Every record of the audited topics but those of the receiver's own topics named
    here (digests, missing records, heartbeats) is proven or named unproven."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from diode.spark import digests
    from diode.spark.verify import say
    say(f"checking the destination against the sender's digests in {args.digest_topic}")
    started = time.monotonic()
    own = [t for t in (args.digest_topic, args.missing_records_topic, args.heartbeat_topic)
           if t]
    d = digests.numbered(digests.extract_digests(spark, destination, args.digest_topic,
                                                 args.format))
    placed = digests.place(rows.where(~F.col("topic").isin(own)), d, args.written_at_header) \
        .persist(StorageLevel.MEMORY_AND_DISK)
    judged = [r.asDict(recursive=True) for r in digests.judge(placed, d).collect()]
    loose = [r.asDict() for r in digests.unproven(placed, d).collect()]
    placed.unpersist()
    reported = digests.reported_missing(destination, args.missing_records_topic) \
        if args.missing_records_topic else None
    found = digests.summary(judged, reported, loose, args.allow_without_topic_id)
    say(f"checked {len(judged)} digests in {time.monotonic() - started:.1f} s: "
        f"{found['unproven']} records no digest proves")
    return found


def add_arguments(p) -> None:
    from diode.kafka.cluster import add_options
    add_options(p, "receiver", topology_help=(
        "the receiver's topology: its receiver.kafka settings reach the destination cluster "
        "(bootstrap.servers, security.*, sasl.*, ssl.*; secrets read from its ${file:} and "
        "${env:} as the launch reads them), and its link key signs the manifest (diode resend "
        "refuses an unsigned one when the link has a cipher)"))
    add_options(p, "sender", prefix="source-", flag="-S", topology_help=(
        "the source cluster too, from this topology's sender.kafka settings: compare record "
        "by record (lost, duplicated, altered); soak tests and pre-production. -S and "
        "--source-bootstrap give or add to its settings as -X and --bootstrap do the "
        "destination's"))
    p.add_argument("--prefix", default="", help="destination topic prefix (receiver.topic.prefix)")
    p.add_argument("--pattern", help="destination topics by regular expression instead")
    p.add_argument("--heartbeat-topic", help="receiver.heartbeat.topic, for the missing tail")
    p.add_argument("--written-at-header", default=WRITTEN_AT,
                   help="receiver.written.at.header, for latency ('' for none)")
    p.add_argument("--digest-topic", help="receiver.digest.topic: check every range the sender "
                   "digested (verified, altered, incomplete) without the source cluster, and "
                   "name every record no digest proves (unproven: exit 1)")
    p.add_argument("--allow-without-topic-id", action="store_true",
                   help="with --digest-topic: records without a sourceTopicId (written by a "
                   "diode older than topic ids, which sent no digests) pass unproven, counted "
                   "in the report; without it each is named unproven (exit 1)")
    p.add_argument("--missing-records-topic", help="receiver.missing.records.topic: say "
                   "whether the records absent from a digested range were reported missing")
    p.add_argument("--json", help="write the report as JSON")
    p.add_argument("--manifest", help="write the resend manifest (missing ranges), signed "
                   "with the link's key of --topology")
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument("--format", choices=("auto", "native", "python"), default="auto",
                   help="Kafka source: Spark's spark-sql-kafka (native; fetched through mvn "
                   "the first time), diode's Python source (python; no JVM jars), or native "
                   "when on the classpath or cached, else python (auto; a native read "
                   "that falls short is read again with python)")
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
                       "(exit 1: missing, or altered, incomplete or unproven against the "
                       "digests; 2: could not read everything the topics held)")
    add_arguments(p)
    p.set_defaults(func=main)


if __name__ == "__main__":  # spark-submit …/diode/spark/command.py ARGS
    import argparse
    parser = argparse.ArgumentParser(prog="diode verify")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
