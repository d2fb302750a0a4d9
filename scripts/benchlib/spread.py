"""--partitions N [--topics T]: diode end to end with records spread over many partitions
(issue 36), measured the way a plant runs it: T source topics of N partitions in all, both
sides launched as the bench launches them (the topics picked by `sender.topics.regex`), the
records already in the source before the launch.

Per run, in this order:

- copy: the records (spread round-robin over every partition) until the last one is in the
  destination (WatermarkMeter over every destination partition), timed from the launch, as e2e;
  the same run's relay (a one-process consume -> produce) copies the same records over the same
  partitions first, as baseline; with --against-partitions M, diode copies the same count over
  M partitions too, in the same repeat (the same minutes of a shared machine);
- startup: from the launch to the first meter reading that saw a record in the destination;
- idle: after a settling pause, CPU of every diode process (supervisors and workers, summed)
  over --idle-seconds, as a share of one core;
- latency: a lone record every --lone-interval-ms to a partition picked at random across the
  topics, --lone-records of them, each timed from just before its produce to its arrival at a
  consumer of the destination (fetch.wait.max.ms 10, so the measure adds up to about 10 ms);
  p50 and p99 over those that arrived within --lone-timeout seconds of the last produce;
- memory: every diode process's RSS at the end.

With --profile, py-spy records every worker over the idle window and over the latency phase
(files `...-idle-*` and `...-lone-*`), besides the copy.
"""

import json
import math
import os
import random
import socket
import threading
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from diode.kafka.brokers import free_port

from .cpu import CpuWatch, diode_label
from .launch import DiodeLaunch, link_figures, topology
from .meter import WatermarkMeter, list_offsets, measure
from .profile import Profiler
from .report import rate, run_result
from .resources import Bench, bench_mode, check_interrupted, log
from .workload import SIZES, make_value

PER_TOPIC = 5          # partitions per topic when --topics is not given (200 topics × 5)
CREATE_BATCH = 500     # topics per CreateTopics request
SETTLE_SECONDS = 3.0   # after the copy, before the idle window: lingers, commits, checkpoints
LONE_FETCH_WAIT_MS = 10
WARM_UP_SECONDS = 120.0  # the most the lone records' warm-up waits for its records
# the most the pre-produce waits for its acknowledgements: 50 000 records over 10 000
# partitions of Tansu took 297 s at load 40
PREPRODUCE_FLUSH_SECONDS = 900.0


def default_topics(partitions: int) -> int:
    """--topics when not given: PER_TOPIC partitions a topic, at least one topic."""
    return max(1, partitions // PER_TOPIC)


def add_arguments(ap) -> None:
    """--partitions and the options that go with it."""
    ap.add_argument("--partitions", type=int, default=None, metavar="N",
                    help="measure diode end to end with --records-small records of 100 B "
                         "spread over N source partitions (--topics topics), against the relay "
                         "on the same partitions: copy rate, startup to the first record, both "
                         "sides idle, a lone record's latency, every worker's RSS "
                         "(scripts/benchlib/spread.py)")
    ap.add_argument("--topics", type=int, default=None, metavar="T",
                    help="with --partitions: how many topics hold the N partitions (default "
                         f"N/{PER_TOPIC}, at least 1)")
    ap.add_argument("--against-partitions", type=int, default=None, metavar="M",
                    help="with --partitions: diode also copies the same count of records over "
                         f"M partitions (M/{PER_TOPIC} topics, at least 1) in every "
                         "repeat, for the ratio of the rates (e.g. 3)")
    ap.add_argument("--destination-topics-ahead", action="store_true",
                    help="with --partitions: create diode's destination topics before its "
                         "launch, as the relay's are (an operator who makes them ahead); by "
                         "default the kafka_writer creates them and the copy includes that")
    ap.add_argument("--idle-seconds", type=float, default=5.0,
                    help="with --partitions: the idle window after the copy (default 5)")
    ap.add_argument("--lone-records", type=int, default=200,
                    help="with --partitions: lone records timed (default 200)")
    ap.add_argument("--lone-interval-ms", type=float, default=20.0,
                    help="with --partitions: one lone record every this many ms (default 20)")
    ap.add_argument("--lone-timeout", type=float, default=15.0,
                    help="with --partitions: seconds after the last lone record before those "
                         "not arrived count as lost (default 15)")


def check_arguments(ap, args) -> None:
    """--topics by default, every layout possible, the options that need --partitions given
    it; the mode is "partitions" when it is."""
    if args.partitions is None:
        if args.topics is not None or args.against_partitions is not None or \
                args.destination_topics_ahead:
            ap.error("--topics, --against-partitions and --destination-topics-ahead go with "
                     "--partitions")
    else:
        if args.mode != "e2e" or args.live or args.path != "loopback":
            ap.error("--partitions measures end to end on loopback (or with --mode writer or "
                     "--mode startup): no other --mode, no --live or --path")
        if args.topics is None:
            args.topics = default_topics(args.partitions)
        layouts = [("--partitions/--topics", args.partitions, args.topics)]
        if args.against_partitions is not None:
            layouts.append(("--against-partitions", args.against_partitions,
                            default_topics(args.against_partitions)))
        for option, partitions, topics in layouts:
            try:
                layout(partitions, topics)
            except ValueError as e:
                ap.error(f"{option}: {e}")
        args.mode = "partitions"


def layout(partitions: int, topics: int) -> list[int]:
    """Partitions per topic: `partitions` spread over `topics` topics as evenly as they go
    (the first topics take one more when they do not divide)."""
    if partitions < 1 or not 1 <= topics <= partitions:
        raise ValueError(f"{partitions} partition(s) over {topics} topic(s): need "
                         "1 <= topics <= partitions")
    each, more = divmod(partitions, topics)
    return [each + (i < more) for i in range(topics)]


def percentile(values, q: float) -> float | None:
    """The nearest-rank q-th percentile (q in 0..100) of `values`; None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def core_share(before: dict, after: dict, seconds: float) -> tuple[float, dict]:
    """CPU used between two CpuWatch snapshots as a share of one core: summed over every
    process of the system, and per process."""
    per = {name: (sec - before["per_process"].get(name, 0.0)) / seconds
           for name, sec in after["per_process"].items()}
    return sum(per.values()), per


class Layout:
    """One source layout: topics named PREFIX-tNNNNN with their partition counts."""

    def __init__(self, partitions: int, topics: int):
        self.partitions = partitions
        self.prefix = f"p{partitions}"
        self.topics = {f"{self.prefix}-t{i:05d}": n
                       for i, n in enumerate(layout(partitions, topics))}
        self.ends: dict = {}  # (topic, partition) -> end offset

    @property
    def regex(self) -> str:
        return self.prefix + r"-t\d+"

    @property
    def label(self) -> str:
        counts = sorted(set(self.topics.values()))
        each = "/".join(map(str, counts))
        return f"{len(self.topics)} topic(s) × {each} = {self.partitions} partitions"

    def tps(self, prefix: str = "") -> list[TopicPartition]:
        return [TopicPartition(prefix + t, p) for t, n in self.topics.items() for p in range(n)]


def create_topics(bootstrap: str, topics: dict, timeout: float = 600.0) -> None:
    """Every topic of `topics` (name -> partitions), in CreateTopics requests of CREATE_BATCH,
    then until the metadata shows them all and the broker hosts every partition (up to
    `timeout` seconds: Apache Kafka at load 40 had not hosted 10 000 partitions after 120 s);
    what is still missing is logged every 30 s."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = list(topics)
    for i in range(0, len(names), CREATE_BATCH):
        batch = [NewTopic(t, topics[t]) for t in names[i:i + CREATE_BATCH]]
        for fut in admin.create_topics(batch, operation_timeout=60).values():
            fut.result()
    started = time.monotonic()
    next_log = started + 30
    unseen, unhosted = dict(topics), None
    while time.monotonic() < started + timeout:
        check_interrupted()
        md = admin.list_topics(timeout=30).topics
        unseen = {t: n for t, n in unseen.items()
                  if t not in md or md[t].error is not None or len(md[t].partitions) != n}
        if not unseen:
            # asked again of the partitions not hosted yet only
            unhosted = _unhosted(admin, [TopicPartition(t, p) for t, n in topics.items()
                                         for p in range(n)] if unhosted is None else unhosted)
            if not unhosted:
                return
        if time.monotonic() >= next_log:
            next_log += 30
            log(f"topics: {len(unseen)} of {len(topics)} not in the metadata yet, "
                f"{'-' if unhosted is None else len(unhosted)} partitions not hosted yet, "
                f"after {time.monotonic() - started:.0f} s")
        time.sleep(0.5)
    raise RuntimeError(f"{len(topics)} topics did not all appear on {bootstrap} in "
                       f"{timeout:.0f} s: {len(unseen)} not in the metadata, "
                       f"{'-' if unhosted is None else len(unhosted)} partitions not hosted")


def _unhosted(admin, tps: list) -> list:
    """The partitions of `tps` the broker does not answer ListOffsets for yet: the metadata
    names a partition's leader before a loaded broker has made its log (seconds to minutes
    for 1 000), and a producer's requests to it time out meanwhile."""
    answers = list_offsets(admin, {tp: OffsetSpec.latest() for tp in tps}, request_timeout=30)
    return [tp for tp, a in answers.items() if isinstance(a, KafkaException)]


def preproduce_spread(bootstrap: str, lay: Layout, count: int, size: int,
                      compressible: bool) -> float:
    """`count` records (a key and one header each) round-robin over every partition of the
    layout (record i to partition i mod N), produced a partition at a time so that each
    partition's records go in one batch; its ends from the delivery reports. Fails unless all
    are acknowledged."""
    # idempotent: a request that times out on a loaded broker is retried without a duplicate;
    # records wait up to the flush's time: over 10 000 partitions of Tansu at load 40 a third
    # of them timed out at librdkafka's default 300 s
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 200, "acks": "all",
                  "enable.idempotence": True, "batch.size": 1000000,
                  "queue.buffering.max.kbytes": 262144, "compression.type": "none",
                  "message.timeout.ms": int(PREPRODUCE_FLUSH_SECONDS * 1000)})
    tps = lay.tps()
    order = [i for first in range(len(tps)) for i in range(first, count, len(tps))]
    failed = []
    lay.ends = {(tp.topic, tp.partition): 0 for tp in tps}

    def delivered(err, msg):
        if err is not None:
            failed.append(err)
        else:
            key = (msg.topic(), msg.partition())
            lay.ends[key] = max(lay.ends[key], msg.offset() + 1)

    t0 = time.monotonic()
    for n, i in enumerate(order):
        if n % 1000 == 0:
            check_interrupted()
            p.poll(0)
        tp = tps[i % len(tps)]
        while True:
            try:
                p.produce(tp.topic, value=make_value(size, compressible), key=b"key-%d" % i,
                          partition=tp.partition, headers=[("bench", b"%d" % i)],
                          on_delivery=delivered)
                break
            except BufferError:
                p.poll(0.05)
    left = p.flush(PREPRODUCE_FLUSH_SECONDS)
    if left or failed or sum(lay.ends.values()) != count:
        raise RuntimeError(f"pre-producing {lay.label}: {left} unconfirmed, {len(failed)} "
                           f"failed{' (' + failed[0].str() + ')' if failed else ''}, ends add "
                           f"up to {sum(lay.ends.values())} of {count}")
    return time.monotonic() - t0


def run(b: Bench) -> dict:
    """--repeat repeats of: the relay over N partitions, diode over N, and diode over
    --against-partitions M when asked."""
    args, res = b.args, b.res
    size = SIZES["small"]
    src = res.broker("source-spread", b.work)
    layouts = [Layout(args.partitions, args.topics)]
    if args.against_partitions:
        layouts.append(Layout(args.against_partitions, default_topics(args.against_partitions)))
    for lay in layouts:
        t0 = time.monotonic()
        create_topics(src.bootstrap, lay.topics)
        made = time.monotonic() - t0
        secs = preproduce_spread(src.bootstrap, lay, args.records_small, size, args.compressible)
        log(f"source: {lay.label} created in {made:.1f} s, {args.records_small} records of "
            f"{size} B pre-produced in {secs:.1f} s")
    rows = []
    for run_no in range(1, args.repeat + 1):
        if not args.skip_baseline:
            r = {**relay(b, src, layouts[0], str(run_no)), "run": run_no}
            rows.append(r)
            log(f"partitions: relay over {layouts[0].label}: {rate(r)[0]:,.0f} records/s")
        for lay in layouts:
            check_interrupted()
            r = {**diode(b, src, lay, str(run_no)), "run": run_no}
            rows.append(r)
            idle_pct = "-" if r["idle_core"] is None else f"{100 * r['idle_core']:.1f}"
            log(f"partitions: diode over {lay.label}: {rate(r)[0]:,.0f} records/s, "
                f"{r['missing']} missing ({r['ended']}), idle {idle_pct} % of a core, lone "
                f"p50/p99 {fmt_ms(r['lone']['p50_ms'])}/{fmt_ms(r['lone']['p99_ms'])} ms, "
                f"startup {fmt_s(r['startup_seconds'])} s; the source's own p50/p99 "
                f"{fmt_ms(r['lone'].get('source', {}).get('p50_ms'))}/"
                f"{fmt_ms(r['lone'].get('source', {}).get('p99_ms'))} ms; load average "
                f"{r['load_average'][0]:.1f}")
    res.stop_broker(src)
    return {"records": args.records_small, "value_bytes": size,
            "layouts": [{"partitions": lay.partitions, "topics": len(lay.topics),
                         "label": lay.label} for lay in layouts],
            "idle_seconds": args.idle_seconds, "lone_records": args.lone_records,
            "lone_interval_ms": args.lone_interval_ms, "rows": rows,
            "summary": summarise(rows, layouts[0].partitions, args.against_partitions)}


def meter_interval(args, partitions: int) -> float:
    """Every tick lists every partition's offsets: at least 0.1 s per 1 000 partitions, so the
    meter's load on the destination broker stays what it is at 1 000."""
    return max(args.meter_interval, 0.1 * partitions / 1000)


def diode(b: Bench, src, lay: Layout, tag: str) -> dict:
    args, res = b.args, b.res
    dst = res.broker(f"dest-diode-p{lay.partitions}-{tag}", b.work)
    prefix = f"d{tag}_"
    udp_port = free_port(socket.SOCK_DGRAM)
    name = f"spread-p{lay.partitions}-{tag}"
    cfg = topology(b, f"bench-{name}", src.bootstrap, dst.bootstrap, "", prefix, udp_port,
                   os.path.join(b.work, f"run-{name}"), args.rate_mbps)
    del cfg["sender"]["topics"]
    cfg["sender"]["topics.regex"] = [lay.regex]
    if args.destination_topics_ahead:
        create_topics(dst.bootstrap, {prefix + t: n for t, n in lay.topics.items()})
    launch = DiodeLaunch(b, cfg, name)
    meter = WatermarkMeter(dst.bootstrap, None, tps=lay.tps(prefix),
                           exact=args.broker == "kafka")
    margs = _with(args, meter_interval=meter_interval(args, lay.partitions))
    log(f"partitions: diode over {lay.label}: launching")
    proc = launch.start()
    cpu = CpuWatch(proc.pid, diode_label, [src, dst])
    prof = Profiler(b, name, cpu) if b.profile_dir else None
    out: dict = {}
    try:
        end = measure(meter, args.records_small, proc, cpu, launch.started, margs,
                      (lambda: prof.watch(proc.pid)) if prof else None)
        if prof is not None:
            b.profiles.append(prof.stop())
        out["startup_seconds"] = (meter.first_at - launch.started) if meter.first_at else None
        meter.final()
        if end["ended"] == "complete" and proc.poll() is None:
            out.update(idle(b, proc, cpu, name))
            out["lone"] = lone_records(b, proc, cpu, src.bootstrap, dst.bootstrap, lay, prefix,
                                       meter, name)
            out["rss_bytes"] = cpu.rss()
            out["rss_peak_bytes"] = cpu.peak_rss()
        launch.stop()
    finally:
        launch.stop()
        meter.close()
        res.stop_broker(dst)
    launch.report_failure(end["ended"])
    metrics = launch.metrics()
    r = run_result("diode", meter, args.records_small, launch.started, end, launch.code,
                   SIZES["small"], None)
    r.update(link_figures(metrics), metrics=metrics, partitions=lay.partitions,
             topics=len(lay.topics))
    r.update({"startup_seconds": None, "idle_core": None, "idle_per_process": {},
              "rss_bytes": {}, "rss_peak_bytes": {}, "lone": lone_summary({}, {}, 0)})
    r.update(out)
    r["load_average"] = os.getloadavg()
    return r


def _with(args, **changes):
    """A copy of the options with some changed (measure() reads args.meter_interval)."""
    copy = type(args)(**vars(args))
    for k, v in changes.items():
        setattr(copy, k, v)
    return copy


def idle(b: Bench, proc, cpu: CpuWatch, name: str) -> dict:
    """Both sides' CPU over --idle-seconds after SETTLE_SECONDS, nothing coming in; with
    --profile, then every worker profiled over as long again."""
    time.sleep(SETTLE_SECONDS)
    before, t0 = cpu.snapshot(), time.monotonic()
    time.sleep(b.args.idle_seconds)
    share, per = core_share(before, cpu.snapshot(), time.monotonic() - t0)
    log(f"partitions: {name} idle: {100 * share:.1f} % of a core ("
        + ", ".join(f"{k} {100 * v:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])
                    if v >= 0.001) + ")")
    if b.profile_dir and proc.poll() is None:
        prof = Profiler(b, f"{name}-idle", cpu)
        prof.watch(proc.pid)
        time.sleep(b.args.idle_seconds)
        b.profiles.append(prof.stop())
    return {"idle_core": share, "idle_per_process": per}


def lone_records(b: Bench, proc, cpu, src: str, dst: str, lay: Layout, prefix: str, meter,
                 name: str) -> dict:
    """One record every --lone-interval-ms to a partition picked at random across the topics,
    each timed from just before its produce to its arrival at a consumer of the destination,
    and, as the floor that Kafka alone sets, at a consumer of the source (each consumer on a
    thread of its own)."""
    args = b.args
    prof = None
    if b.profile_dir:
        prof = Profiler(b, f"{name}-lone", cpu)
        prof.watch(proc.pid)
    p = Producer({"bootstrap.servers": src, "linger.ms": 0, "acks": "all"})
    sent: dict[bytes, float] = {}
    # from the ends the meter found (exact once it read the tails): only lone records come
    dest = Arrivals(dst, [TopicPartition(tp.topic, tp.partition,
                                         meter.end.get((tp.topic, tp.partition), 0))
                          for tp in lay.tps(prefix)])
    source = Arrivals(src, [TopicPartition(tp.topic, tp.partition,
                                           lay.ends.get((tp.topic, tp.partition), 0))
                            for tp in lay.tps()])
    rng = random.Random(36)
    tps = lay.tps()
    try:
        warm_up(p, tps, [dest, source])
        interval = args.lone_interval_ms / 1000
        next_at = time.monotonic()
        for i in range(args.lone_records):
            check_interrupted()
            time.sleep(max(0.0, next_at - time.monotonic()))
            tp = rng.choice(tps)
            key = b"lone-%d" % i
            sent[key] = time.monotonic()
            p.produce(tp.topic, partition=tp.partition, key=key,
                      value=make_value(SIZES["small"], False))
            p.poll(0)
            next_at += interval
        p.flush(10)
        deadline = time.monotonic() + args.lone_timeout
        while not all(k in dest.got for k in sent) and time.monotonic() < deadline:
            check_interrupted()
            time.sleep(0.05)
    finally:
        dest.close()
        source.close()
        if prof is not None:
            b.profiles.append(prof.stop())
    lay.ends.update(source.ends)  # the next run's source consumer starts after these
    return {**lone_summary(sent, dest.got, args.lone_records),
            "source": lone_summary(sent, source.got, args.lone_records)}


def warm_up(p, tps: list, arrivals: list) -> None:
    """One record to every partition, waited for at every consumer of `arrivals` (up to
    WARM_UP_SECONDS), before anything is timed: a consumer's first fetch of a partition comes
    only after it has looked up its leader and started its fetch session there, which over 1 000
    partitions of a loaded Apache Kafka broker took longer than the lone records themselves
    (the source's own p50 was 16.8 s where it is 4 ms over 3 partitions)."""
    t0 = time.monotonic()
    keys = []
    for i, tp in enumerate(tps):
        keys.append(b"warm-%d" % i)
        while True:
            try:
                p.produce(tp.topic, partition=tp.partition, key=keys[-1], value=b"warm")
                break
            except BufferError:
                p.poll(0.05)
    p.flush(30)
    deadline = time.monotonic() + WARM_UP_SECONDS
    late = arrivals
    while time.monotonic() < deadline:
        check_interrupted()
        late = [a for a in arrivals if not all(k in a.got for k in keys)]
        if not late:
            break
        time.sleep(0.1)
    log(f"partitions: lone records: {len(tps)} warm-up records (one a partition) "
        + ("arrived at both consumers" if not late else
           f"not all arrived at {len(late)} consumer(s)")
        + f" in {time.monotonic() - t0:.1f} s, before the timing starts")
    time.sleep(0.5)


class Arrivals:
    """A consumer of `tps` (from their offsets) on a thread: when each lone record's key came,
    and where each partition ends."""

    def __init__(self, bootstrap: str, tps: list):
        self.got: dict[bytes, float] = {}
        self.ends: dict = {}
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-lone",
                           "enable.auto.commit": False,
                           "fetch.wait.max.ms": LONE_FETCH_WAIT_MS, "fetch.min.bytes": 1})
        self.c.assign(tps)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            for m in self.c.consume(1, 0.1):
                if m.error() is None:
                    self.got.setdefault(m.key(), time.monotonic())
                    self.ends[(m.topic(), m.partition())] = m.offset() + 1

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(10)
        self.c.close()


def lone_summary(sent: dict, got: dict, asked: int) -> dict:
    """p50 and p99 (ms) of produce-to-arrival over the records that arrived."""
    ms = [1000 * (got[k] - sent[k]) for k in got if k in sent]
    return {"asked": asked, "sent": len(sent), "arrived": len(ms),
            "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
            "max_ms": max(ms) if ms else None}


def relay(b: Bench, src, lay: Layout, tag: str) -> dict:
    args, res = b.args, b.res
    dst = res.broker(f"dest-relay-p{lay.partitions}-{tag}", b.work)
    prefix = f"relay{tag}_"
    create_topics(dst.bootstrap, {prefix + t: n for t, n in lay.topics.items()})
    spec = os.path.join(b.work, f"relay-p{lay.partitions}-{tag}.json")
    with open(spec, "w") as f:
        json.dump(lay.topics, f)
    logfile = os.path.join(b.work, f"relay-p{lay.partitions}-{tag}.log")
    meter = WatermarkMeter(dst.bootstrap, None, tps=lay.tps(prefix),
                           exact=args.broker == "kafka")
    margs = _with(args, meter_interval=meter_interval(args, lay.partitions))
    log(f"partitions: relay over {lay.label}: starting")
    started = time.monotonic()
    proc = res.popen(bench_mode("_relay_many", src.bootstrap, dst.bootstrap, spec, prefix,
                                args.records_small), log_path=logfile)
    cpu = CpuWatch(proc.pid, lambda p: "relay", [src, dst])
    try:
        end = measure(meter, args.records_small, proc, cpu, started, margs)
        code = res.stop_proc(proc)
        meter.final()
        if end["ended"] == "process exited with 0":
            end["ended"] = "complete" if meter.count >= args.records_small else "relay short"
    finally:
        if proc.returncode is None:
            res.stop_proc(proc, 15)
        meter.close()
        res.stop_broker(dst)
    r = run_result("relay", meter, args.records_small, started, end, code, SIZES["small"],
                   None, baseline=True)
    r.update(partitions=lay.partitions, topics=len(lay.topics),
             startup_seconds=(meter.first_at - started) if meter.first_at else None)
    return r


def summarise(rows: list, partitions: int, against: int | None) -> dict:
    """Per repeat: diode over N against the relay over N, and against diode over M."""
    out = []
    for run_no in sorted({r["run"] for r in rows}):
        mine = [r for r in rows if r["run"] == run_no]
        relay_n = next((r for r in mine if r["baseline"]), None)
        diode_n = next((r for r in mine if not r["baseline"] and r["partitions"] == partitions),
                       None)
        diode_m = next((r for r in mine if not r["baseline"] and r["partitions"] == against),
                       None) if against else None
        out.append({"run": run_no,
                    "against_relay": ratio(diode_n, relay_n),
                    "against_partitions": ratio(diode_n, diode_m)})
    return {"runs": out}


def ratio(a: dict | None, base: dict | None) -> float | None:
    if a is None or base is None or a["missing"] or base["missing"] or not rate(base)[0]:
        return None
    return rate(a)[0] / rate(base)[0]


def fmt_ms(v) -> str:
    return "-" if v is None else f"{v:,.0f}"


def fmt_s(v) -> str:
    return "-" if v is None else f"{v:.1f}"
