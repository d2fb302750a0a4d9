"""Throughput benchmark: diode end to end, and each side alone, against plain Kafka processes.

Run with ./scripts/bench (it installs .venv first). Everything runs on 127.0.0.1 (or, with
--path veth, the receiving side on a second host of the two-host test bed: diode.testbed), on
embedded brokers (--broker: Apache Kafka by default, or Tansu): per record size, a source broker
with N
records pre-produced to a 4-partition topic before anything is timed, and a fresh destination
broker for every measurement. --mode picks what is measured (docs/performance.md):

- e2e (default): `diode launch` (both sides) against a one-process relay (consume -> produce);
- sender: `diode launch --side sender` into a UDP sink that only counts, against a plain
  consumer; timed until the consumer group's committed offsets reach the end of the topic;
- receiver: one sender run's datagrams captured to a file, then replayed at
  `diode launch --side receiver`, against a plain producer writing the same records;
- all: the three, one after the other, per record size;
- memory: `--side receiver` and `--side sender` with `diode link-sim` between them reordering
  --reorder of the datagrams, --records records of --record-bytes: every diode process's RSS
  once a second until the last record arrived, and whether it stayed flat after warm-up
  (scripts/benchlib/memory.py);
- writer: a kafka_writer made in this process (no broker) holding --partitions N partitions
  (1 000 and 10 000 when not given), --busy of them with a run waiting: CPU per call of its
  expiry, an idle turn, its metrics and a checkpoint (scripts/benchlib/writer_cost.py);
- startup: startup's parts alone on two brokers of --broker's kind, over --partitions N of
  --topics T (10 000 of 2 000 when not given): the sender's PartitionWatcher's first look, a
  metadata look, the receiver's Preparer creating as many destination topics (and asked
  again), the MetadataSync following them (scripts/benchlib/startup.py).

--partitions N [--topics T] (issue 36) measures e2e with the records spread over N partitions
of T topics, the sender picking them by sender.topics.regex: the copy rate against the relay on
the same partitions (and, with --against-partitions M, against diode over M partitions in the
same repeat), the startup to the first record written, both sides idle, a lone record's latency
and every worker's RSS (scripts/benchlib/spread.py).

Progress is read from offsets, never by consuming the records (scripts/benchlib/meter.py):
destination watermarks, or committed offsets. --verify adds one exact count of distinct
records after each run. CPU seconds are read with psutil for every process: diode's workers by
their process titles, the baseline process, and apart from them the brokers, the bench's meter,
the sink or replayer and py-spy. --profile runs py-spy on every diode worker. A table per mode
and, with --json FILE, one JSON line with every figure. Speed is never asserted anywhere: this
is a measurement, not a test.

The subprocess modes (_relay, _relay_many, _consume, _produce, _sink, _replay, _live) are this file run
again.
"""

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time

from benchlib import (baselines, e2e, iperf, memory, net, receiver, report, sender, spread,
                      startup, udp, writer_cost)
from benchlib.profile import py_spy
from benchlib.resources import INTERRUPTED, Bench, Resources, check_interrupted, log
from benchlib.workload import SIZES, Source, create_topic, preproduce, warm_up_offsets

from diode import testbed
from diode.kafka.brokers import KINDS
from diode.link import path as link_path

MODES = {"e2e": e2e, "sender": sender, "receiver": receiver}
# the modes with a run of their own (not per record size): module, and how it prints
OWN_MODES = {"memory": (memory, report.print_memory),
             "partitions": (spread, report.print_partitions),
             "writer": (writer_cost, writer_cost.print_table),
             "startup": (startup, None)}
SUBPROCESS_MODES = {"_relay": baselines.relay_main, "_relay_many": baselines.relay_many_main,
                    "_consume": baselines.consume_main,
                    "_produce": baselines.produce_main, "_sink": udp.sink_main,
                    "_replay": udp.replay_main, "_live": baselines.live_main}


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n")[0])
    ap.add_argument("--mode", default="e2e", choices=(*MODES, "all", "memory", "writer", "startup"),
                    help="what to measure (default e2e): diode end to end against a relay, "
                         "the sender alone against a plain consumer, the receiver alone "
                         "against a plain producer, or all three; or memory: every diode "
                         "process's RSS over one stream through a reordering link-sim; "
                         "writer: a kafka_writer's CPU per call over --partitions partitions "
                         "(no broker); startup: startup's parts alone over --partitions "
                         "partitions of --topics topics")
    ap.add_argument("--records-small", type=int, default=None,
                    help="records of 100-byte values (default 200000; 50000 with --partitions)")
    ap.add_argument("--records-large", type=int, default=20000,
                    help="records of 10 KiB values (default 20000)")
    ap.add_argument("--sizes", default="small,large", help="which sizes to run: small,large")
    ap.add_argument("--records", type=int, default=1000000,
                    help="memory mode: records streamed (default 1000000)")
    ap.add_argument("--record-bytes", type=int, default=100,
                    help="memory mode: value bytes per record (default 100)")
    ap.add_argument("--reorder", type=float, default=0.02,
                    help="memory mode: share of datagrams link-sim holds back 5 ms, so that "
                         "later ones overtake them (default 0.02); it loses none")
    ap.add_argument("--broker", default="kafka", choices=KINDS,
                    help="embedded broker kind for both clusters (default kafka: Apache Kafka)")
    ap.add_argument("--compression", default="none", choices=("none", "gzip", "zstd", "lz4"))
    ap.add_argument("--null-keys", action="store_true",
                    help="records as a producer makes them by default: no key and no header "
                         "(else a key and one header each)")
    ap.add_argument("--compressible", action="store_true",
                    help="values half random, half a repeated pattern (about 2:1), instead of "
                         "random bytes (incompressible)")
    ap.add_argument("--datagram-bytes", default="1472",
                    help="link.datagram.size.bytes (default 1472: an Ethernet frame's, as a "
                         "real link runs; auto: what diode picks for the path, 65000 on "
                         "loopback)")
    ap.add_argument("--path", default="loopback", choices=("loopback", "veth"),
                    help="loopback (default): both sides on 127.0.0.1; veth: the receiving "
                         "side (sink or receiver, destination broker) on the other host of "
                         "the two-host test bed, across a veth pair of --mtu (needs root; "
                         "sender and receiver modes)")
    ap.add_argument("--mtu", type=int, default=1500, help="the veth pair's MTU (default 1500)")
    ap.add_argument("--no-offload", action="store_true",
                    help="UDP GSO and GRO off (link.gso.enabled, link.gro.enabled false; the "
                         "replayer sends one datagram per call)")
    ap.add_argument("--no-anchor", action="store_true",
                    help="sender and receiver modes: skip the iperf3 UDP run on the same path")
    ap.add_argument("--rate-mbps", type=float, default=0.0,
                    help="link.rate.mbps of the first diode run (0: unpaced); in receiver mode "
                         "the replayer's pace (0: as fast as the receiver's socket is read)")
    ap.add_argument("--paced-mbps", default="relay",
                    help="link.rate.mbps of the rerun (e2e: of each unpaced run that lost "
                         "records or datagrams, by default at the relay's rate of the same "
                         "repeat; receiver: of the capture when it lost datagrams, 400 by "
                         "default) (Mbit/s, 'relay', or 0: no rerun)")
    ap.add_argument("--receive-buffer", type=int, default=0,
                    help="link.receive.buffer.bytes (default: net.core.rmem_max)")
    ap.add_argument("--readers", type=int, default=1)
    ap.add_argument("--packers", type=int, default=2)
    ap.add_argument("--unpackers", type=int, default=2)
    ap.add_argument("--writers", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override a topology setting, e.g. --set sender.max.inflight.records=5000 "
                         "or --set supervisor.queue.max.messages=256 (repeatable)")
    ap.add_argument("--repeat", type=int, default=2,
                    help="measure each system this many times, alternating (default 2); the "
                         "summary gives medians")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--live", action="store_true",
                    help="e2e: each run reads a new empty topic that a producer fills at full "
                         "speed while the system runs (live traffic), instead of draining the "
                         "pre-produced backlog; timed from the producer's start")
    ap.add_argument("--live-wait", type=float, default=5.0,
                    help="seconds between starting the system and starting the producer with "
                         "--live (default 5)")
    ap.add_argument("--verify", action="store_true",
                    help="after each run, read the destination once and count distinct records "
                         "by their sourcePartition/sourceOffset headers (e2e, receiver)")
    ap.add_argument("--profile", nargs="?", const="", metavar="DIR",
                    help="py-spy record every diode worker during the measured run: collapsed "
                         "stacks and speedscope files in DIR (default: a new temp dir), and the "
                         "top frames by self time per stage")
    ap.add_argument("--meter-interval", type=float, default=0.1,
                    help="seconds between two readings of offsets (default 0.1)")
    ap.add_argument("--first-timeout", type=float, default=None,
                    help="seconds the first record may take to arrive (default 60; 600 with "
                         "--partitions: a startup over thousands of partitions is measured)")
    ap.add_argument("--idle-timeout", type=float, default=None,
                    help="seconds without a new record before a run counts as ended (lossy); "
                         "longer than sender.inflight.timeout.seconds (30) so a reader's rewind "
                         "can still complete the run (default 35; 300 with --partitions, where "
                         "the writer may wait minutes for its topics mid-copy)")
    spread.add_arguments(ap)
    ap.add_argument("--busy", type=int, default=10,
                    help="--mode writer: partitions with a run waiting (default 10)")
    ap.add_argument("--startup-skip", default="", metavar="PART,...",
                    help="--mode startup: parts not measured, of " + ",".join(startup.PARTS))
    ap.add_argument("--json", metavar="FILE", help="append one JSON line with every figure")
    ap.add_argument("--keep", action="store_true",
                    help="keep the work dir (logs, metrics, captures)")
    args = ap.parse_args(argv)
    if not args.receive_buffer:
        args.receive_buffer = net.rmem_max() or 4 * 1024 * 1024
    if args.datagram_bytes != "auto":
        try:
            args.datagram_bytes = int(args.datagram_bytes)
        except ValueError:
            ap.error(f"--datagram-bytes: a number or auto, not {args.datagram_bytes!r}")
    if args.path == "veth" and args.mode not in ("sender", "receiver"):
        ap.error("--path veth measures one side alone: --mode sender or --mode receiver")
    if args.mode in ("writer", "startup"):
        check_partition_modes(ap, args)
    else:
        spread.check_arguments(ap, args)
    if args.idle_timeout is None:
        args.idle_timeout = 300.0 if args.partitions else 35.0
    if args.first_timeout is None:
        args.first_timeout = 600.0 if args.partitions else 60.0
    if args.records_small is None:
        args.records_small = 50000 if args.partitions else 200000
    return args


def check_partition_modes(ap, args) -> None:
    """--mode writer takes --partitions and --busy; --mode startup --partitions, --topics and
    --startup-skip (a list of its parts); neither takes --against-partitions."""
    if args.against_partitions is not None or (args.mode == "writer" and args.topics):
        ap.error(f"--mode {args.mode} takes --partitions" +
                 (" and --topics" if args.mode == "startup" else " and --busy"))
    if args.mode == "writer" and args.partitions is not None and args.partitions < 1:
        ap.error("--partitions: at least 1")
    if args.mode == "writer" and not 0 <= args.busy <= (args.partitions or args.busy):
        ap.error("--busy: between 0 and --partitions")
    if args.mode == "startup":
        args.partitions = args.partitions or startup.DEFAULT_PARTITIONS
        args.topics = args.topics or spread.default_topics(args.partitions)
        try:
            spread.layout(args.partitions, args.topics)
        except ValueError as e:
            ap.error(f"--partitions/--topics: {e}")
    skip = [p.strip() for p in args.startup_skip.split(",") if p.strip()]
    if set(skip) - set(startup.PARTS):
        ap.error(f"--startup-skip: parts of {','.join(startup.PARTS)}, not "
                 f"{','.join(sorted(set(skip) - set(startup.PARTS)))}")
    args.startup_skip = skip


def setup(args) -> Bench:
    if args.profile is not None and not py_spy():
        raise SystemExit("--profile needs py-spy: ./scripts/bench installs it into .venv when "
                         "given --profile (or: .venv/bin/python -m pip install py-spy)")
    b = Bench(args, Resources(args.broker), tempfile.mkdtemp(prefix="diode-bench-"))
    if not args.keep:
        b.res.dirs.append(b.work)
    if args.path == "veth":
        b.res.bed = testbed.up(testbed.plan("diode-bench", args.mtu))
        log(f"test bed: the receiving host is {b.res.bed.low} in namespace {b.res.bed.name}, "
            f"across a veth pair of MTU {args.mtu}")
    if args.profile is not None:
        b.profile_dir = args.profile or tempfile.mkdtemp(
            prefix=f"diode-bench-profiles-{time.strftime('%Y%m%d-%H%M%S')}-")
        os.makedirs(b.profile_dir, exist_ok=True)
    return b


def datagram_bytes(b: Bench) -> int:
    """The datagram size the runs use (what `auto` picks on this path)."""
    if b.args.datagram_bytes != "auto":
        return b.args.datagram_bytes
    return link_path.toward(b.res.link_host).unfragmented(b.res.link_host) or 1472


def anchor(b: Bench) -> dict:
    size = datagram_bytes(b)
    log(f"anchor: iperf3 UDP, {size}-byte datagrams to {b.res.link_host}, {iperf.SECONDS} s")
    found = {"datagram_bytes": size, **iperf.measure(b, size)}
    if "error" in found:
        log(f"anchor: {found['error']}")
    else:
        log(f"anchor: iperf3 sent {found['sender_mbps']:,.0f} Mbit/s, received "
            f"{found['receiver_mbps']:,.0f} Mbit/s ({found['lost_percent']:.1f} % lost)")
    return found


def measure_all(b: Bench, modes: list, sizes: list, results: dict) -> None:
    args, res = b.args, b.res
    counts = {"small": args.records_small, "large": args.records_large}
    for size_name in sizes:
        n, size = counts[size_name], SIZES[size_name]
        src = res.broker(f"source-{size_name}", b.work)  # fresh per size
        topic = f"bench-{size_name}"
        create_topic(src.bootstrap, topic)
        secs, ends = preproduce(src.bootstrap, topic, n, size, args.compressible,
                                args.null_keys)
        log(f"pre-produced {n} records of {size} B to {topic} in {secs:.1f} s")
        if set(modes) & {"sender", "receiver"}:  # the modes that commit offsets
            warm_up_offsets(src.bootstrap, topic)
        s = Source(size_name, size, n, src, topic, ends)
        for mode in modes:
            check_interrupted()
            rows = MODES[mode].run(b, s)
            results["modes"][mode]["sizes"][size_name] = rows
        res.stop_broker(src)


def main(argv) -> int:
    if argv and argv[0] in SUBPROCESS_MODES:
        return SUBPROCESS_MODES[argv[0]](argv[1:])
    args = parse_args(argv)
    b = setup(args)

    def on_signal(signum, frame):
        INTERRUPTED.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    modes = list(MODES) if args.mode == "all" else [args.mode]
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    if args.mode in OWN_MODES:  # their own streams, not the sizes
        sizes = []
    workers = {"kafka_reader": args.readers, "packer": args.packers, "udp_sender": 1,
               "udp_reader": 1, "unpacker": args.unpackers, "kafka_writer": args.writers}
    results = {
        "broker": args.broker,
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "rmem_max": net.rmem_max(),
                    "load_average": os.getloadavg()},
        "settings": {"compression": args.compression, "compressible": args.compressible,
                     "null_keys": args.null_keys,
                     "cipher": "aes-256-gcm", "datagram_bytes": args.datagram_bytes,
                     "path": args.path, "mtu": args.mtu if args.path == "veth" else None,
                     "offload": not args.no_offload,
                     "receive_buffer_bytes": args.receive_buffer, "workers": workers,
                     "verify": args.verify, "meter_interval_seconds": args.meter_interval},
        "value_bytes": {s: SIZES[s] for s in sizes},
        "modes": {mode: {"sizes": {}} for mode in modes if mode in MODES},
    }
    log(f"{os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f}), Python "
        f"{platform.python_version()}, {args.broker} brokers, "
        f"modes {', '.join(modes)}, work dir {b.work}")
    log("diode workers: " + ", ".join(f"{k}×{v}" for k, v in workers.items())
        + f"; aes-256-gcm, compression {args.compression}, datagrams {args.datagram_bytes} B, "
          f"receive buffer {args.receive_buffer} B")
    try:
        if args.mode in OWN_MODES:
            results["modes"][args.mode] = OWN_MODES[args.mode][0].run(b)
        else:
            if set(modes) & {"sender", "receiver"} and not args.no_anchor:
                results["anchor"] = anchor(b)
            measure_all(b, modes, sizes, results)
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        return 130
    finally:
        # A second Ctrl-C must not leave brokers or diode processes behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        b.res.close()
    for mode, result in results["modes"].items():
        if mode in OWN_MODES:
            if OWN_MODES[mode][1] is not None:
                OWN_MODES[mode][1](result)
            continue
        result["summary"] = report.summarise(result["sizes"])
        report.print_mode(mode, result, results["value_bytes"], args.broker)
    if "anchor" in results:
        report.print_anchor(results["anchor"], args.path)
    if "e2e" in results["modes"]:  # where the JSON line had them before there were modes
        results["sizes"] = results["modes"]["e2e"]["sizes"]
        results["summary"] = results["modes"]["e2e"]["summary"]
    if b.captures:
        results["captures"] = b.captures
    if b.profile_dir is not None:
        results["profiles"] = b.profiles
        report.print_profiles(b.profiles, b.profile_dir)
        log(f"profiles written to {b.profile_dir}")
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(results, sort_keys=True) + "\n")
        log(f"JSON line appended to {args.json}")
    if args.keep:
        log(f"work dir kept: {b.work}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
