"""Audit throughput of `diode verify` on Spark, by Spark cores, against a one-process reader.

Run with ./scripts/bench-verify (it installs .venv first). On 127.0.0.1:

1. an embedded broker (--broker: Apache Kafka by default, or Tansu) holding a destination topic
   of --records records (default 1 000 000,
   100-byte values) over --partitions partitions, written as the receiver writes them: the
   provenance headers and writtenAt, one source partition per destination partition, with one
   source offset in every --gap-every left out (so the audit has holes to find);
2. per Kafka source in --sources (default python,native: diode's Python data source, Spark's
   own spark-sql-kafka connector) and per Spark core count in --cores (default 1,2), the batch
   audit (`extract`, `provenance`, `audit`, `latency`, the same functions `diode verify` runs)
   in a fresh process, timed from
   the first read to the report (Spark's start-up is reported apart, and how much of the time
   went to reading the topic into Spark); the report is checked: every record counted, exactly
   the planted holes;
3. the baseline, in the same run: one Python process reading the same records with
   confluent-kafka and tallying each record's provenance headers (what a script without Spark
   would do);
4. a table (every run, then medians) and, with --json FILE, one JSON line with every figure.

Speed is never asserted anywhere: this is a measurement, not a test.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from diode.kafka.brokers import KINDS, free_port, make_broker

TOPIC = "dest_bench"
SOURCE = "bench"
TOPIC_ID = b"AQIDBAUGBwgJCgsMDQ4PEA"  # the incarnation the records name (sourceTopicId)
T0 = (int(time.time()) - 3600) * 1000  # recent: no retention deletes the records


def fill(bootstrap: str, records: int, partitions: int, gap_every: int) -> None:
    """Write the destination topic, one source offset in every `gap_every` left out."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(TOPIC, partitions, 1)]).values():
        f.result()
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                  "queue.buffering.max.messages": 1_000_000, "compression.type": "none"})
    value = os.urandom(100)
    for i in range(records):
        part, k = i % partitions, i // partitions
        src = k + k // (gap_every - 1)  # source offsets gap_every-1, gap_every*2-1, … left out
        headers = [("sourceTopic", SOURCE.encode()), ("sourcePartition", b"%d" % part),
                   ("sourceOffset", b"%d" % src), ("sourceTopicId", TOPIC_ID),
                   ("writtenAt", b"%d" % (T0 + 40 + i % 50))]
        while True:
            try:
                p.produce(TOPIC, value=value, partition=part, timestamp=T0, headers=headers)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(120) == 0


def expected_holes(records: int, partitions: int, gap_every: int) -> int:
    """Holes in the source offsets `fill` wrote: one per offset left out below the last."""
    per = [records // partitions + (1 if p < records % partitions else 0)
           for p in range(partitions)]
    return sum((n - 1) // (gap_every - 1) for n in per if n)


def baseline(bootstrap: str, partitions: int) -> dict:
    """One process: read every record and tally its provenance (count, highest offset)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-baseline",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
    tally, open_ = {}, set(range(partitions))
    start = time.monotonic()
    while open_:
        for m in c.consume(1000, timeout=1.0):
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    open_.discard(m.partition())
                continue
            h = dict(m.headers())
            key = (h["sourceTopic"], h["sourcePartition"], h["sourceTopicId"])
            n, hi = tally.get(key, (0, -1))
            tally[key] = (n + 1, max(hi, int(h["sourceOffset"])))
    took = time.monotonic() - start
    c.close()
    return {"seconds": took, "records": sum(n for n, _ in tally.values())}


def audit_once(bootstrap: str, cores: int, source: str) -> dict:
    """In this process: the batch audit on local[cores] through `source`, timed."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from diode.spark.verify import audit, extract, latency, provenance, report, session
    t0 = time.monotonic()
    spark = session(f"local[{cores}]", "diode bench", source)
    started = time.monotonic()
    from pyspark import StorageLevel
    p = provenance(extract(spark, bootstrap, TOPIC, source)) \
        .persist(StorageLevel.MEMORY_AND_DISK)
    p.count()  # the read, apart (verify itself lets the audit's first stage do it)
    read = time.monotonic() - started
    rep = report(audit(p))
    lat = latency(p)
    took = time.monotonic() - started
    spark.stop()
    return {"cores": cores, "seconds": took, "startup": started - t0, "read": read,
            "records": rep["totals"]["records"], "missing": rep["totals"]["missing"],
            "ranges": sum(len(r["missingRanges"]) for r in rep["partitions"]),
            "latency_p50": lat["p50"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--gap-every", type=int, default=10_000)
    ap.add_argument("--cores", default="1,2", help="Spark core counts, comma separated")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--sources", default="python,native",
                    help="Kafka sources, comma separated: python (diode's data source), native "
                    "(spark-sql-kafka, fetched through mvn the first time)")
    ap.add_argument("--broker", default="kafka", choices=KINDS,
                    help="embedded broker kind (default kafka; Tansu's short ListOffsets makes "
                    "the native source read short)")
    ap.add_argument("--json", help="append one JSON line with every figure")
    ap.add_argument("--_audit", nargs=3, metavar=("BOOTSTRAP", "CORES", "SOURCE"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._audit:
        print(json.dumps(audit_once(args._audit[0], int(args._audit[1]), args._audit[2])))
        return 0

    cores = [int(c) for c in args.cores.split(",")]
    sources = [s for s in args.sources.split(",") if s]
    with tempfile.TemporaryDirectory() as tmp:
        broker = make_broker(args.broker, "bench", f"127.0.0.1:{free_port()}",
                             str(Path(tmp) / "broker.log")).start()
        try:
            t = time.monotonic()
            fill(broker.bootstrap, args.records, args.partitions, args.gap_every)
            print(f"wrote {args.records} records in {time.monotonic() - t:.1f} s",
                  file=sys.stderr)
            holes = expected_holes(args.records, args.partitions, args.gap_every)
            runs = []
            for r in range(args.repeat):
                b = baseline(broker.bootstrap, args.partitions)
                assert b["records"] == args.records, b
                runs.append({"system": "one-process reader", "run": r, **b})
                for source in sources:
                    for c in cores:
                        out = subprocess.run([sys.executable, __file__, "--_audit",
                                              broker.bootstrap, str(c), source],
                                             capture_output=True, text=True, check=False)
                        if out.returncode:
                            print(out.stderr[-3000:], file=sys.stderr)
                            return 1
                        a = json.loads(out.stdout.strip().splitlines()[-1])
                        ok = a["records"] == args.records and a["ranges"] == holes
                        runs.append({"system": f"verify {source} local[{c}]", "run": r,
                                     "ok": ok, "source": source, **a})
        finally:
            broker.stop()

    print(f"{'system':<26}{'run':>4}{'seconds':>9}{'records/s':>12}  notes")
    for r in runs:
        note = "" if "cores" not in r else \
            f"start-up {r['startup']:.1f} s, read {r['read']:.1f} s; {r['ranges']} holes " \
            "found, " \
            f"{'as planted' if r['ok'] else 'WRONG'}"
        print(f"{r['system']:<26}{r['run']:>4}{r['seconds']:>9.1f}"
              f"{r['records'] / r['seconds']:>12.0f}  {note}")
    medians = {}
    for name in dict.fromkeys(r["system"] for r in runs):
        medians[name] = statistics.median(r["records"] / r["seconds"] for r in runs
                                          if r["system"] == name)
    base = medians["one-process reader"]
    print(f"\nmedians, {args.records} records, {args.broker} broker, {platform.node()}, "
          f"{os.cpu_count()} cores:")
    for name, rate in medians.items():
        print(f"  {name:<26}{rate:>10.0f} records/s  {rate / base:.2f}× the one-process reader")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"records": args.records, "partitions": args.partitions,
                                "broker": args.broker,
                                "runs": runs, "medians": medians}) + "\n")
    return 0 if all(r.get("ok", True) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
