"""--mode receiver: the receiver side alone (`diode launch --side receiver`) fed a captured
link (one sender run's datagrams, sender.capture) by a replayer at its UDP port, against a plain
producer writing the same records from memory. Both write to a fresh destination broker and are
timed from the first datagram (or record) sent until the last record is in the destination
(WatermarkMeter); CPU counts from that moment too, so neither side's start-up is in it."""

import os
import socket
import time

from diode.kafka.brokers import free_port

from . import net, sender
from .cpu import CpuWatch, diode_label
from .launch import DiodeLaunch, link_figures, topology
from .meter import WatermarkMeter, measure, verify_distinct
from .profile import Profiler
from .report import rate, run_result
from .resources import Bench, bench_mode, log, read_json, read_line, tell
from .workload import Source, create_topic


def run(b: Bench, s: Source) -> list:
    path, cap = sender.capture(b, s)
    b.captures[s.size_name] = {k: cap[k] for k in ("sink", "seconds", "datagrams_sent",
                                                   "rate_mbps", "cpu_per_process")}
    rows = []
    try:
        for run_no in range(1, b.args.repeat + 1):
            if not b.args.skip_baseline:
                rows.append({**producer(b, s, str(run_no)), "run": run_no})
                log(f"receiver baseline {s.size_name}: {rate(rows[-1])[0]:,.0f} records/s")
            r = {**diode(b, s, path, str(run_no), b.args.rate_mbps), "run": run_no}
            rows.append(r)
            log(f"receiver diode {s.size_name}: {rate(r)[0]:,.0f} records/s, "
                f"{r['missing']} missing")
    finally:
        if not b.args.keep:
            os.remove(path)
    return rows


def diode(b: Bench, s: Source, capture: str, tag: str, rate_mbps: float) -> dict:
    args, res = b.args, b.res
    name = f"receiver-{s.size_name}-{tag}"
    dst = res.broker(f"dest-{name}", b.work, low=True)
    prefix = f"r{tag}_"
    dest_topic = prefix + s.topic
    create_topic(dst.bootstrap, dest_topic)
    port = free_port(socket.SOCK_DGRAM)
    cfg = topology(b, f"bench-{name}", s.broker.bootstrap, dst.bootstrap, s.topic, prefix, port,
                   os.path.join(b.work, f"run-{name}"), 0)
    launch = DiodeLaunch(b, cfg, name, side="receiver")
    meter = WatermarkMeter(dst.bootstrap, dest_topic)
    log(f"receiver diode {s.size_name} {tag}: launching --side receiver, replaying "
        f"{os.path.basename(capture)} "
        + (f"at {rate_mbps:g} Mbit/s" if rate_mbps else "as fast as its socket is read"))
    proc = launch.start()
    replayer = res.popen(bench_mode("_replay", capture, port, "--rate-mbps", rate_mbps,
                                    "--queue-limit", args.receive_buffer // 2,
                                    "--host", res.link_host, "--netns-pid", proc.pid,
                                    *(["--no-gso"] if args.no_offload else [])),
                         log_path=os.path.join(b.work, f"replay-{name}.log"), pipes=True)
    cpu = CpuWatch(proc.pid, diode_label, [dst], {"replayer": [replayer.pid]})
    prof = Profiler(b, name, cpu) if b.profile_dir else None
    verify = replay = None
    try:
        if read_line(replayer, "ready", args.first_timeout) is None:
            raise RuntimeError(f"the receiver did not bind udp port {port} within "
                               f"{args.first_timeout:.0f} s (log: {launch.logfile})")
        if prof is not None:
            for _ in range(5):  # every worker profiled before the first datagram
                prof.watch(proc.pid)
                time.sleep(0.1)
        cpu.rebase()
        started = time.monotonic()
        tell(replayer, "go")
        end = measure(meter, s.count, proc, cpu, started, args,
                      prof and (lambda: prof.watch(proc.pid)))
        if prof is not None:
            b.profiles.append(prof.stop())
        replay = read_json(replayer, "done ", 10 if end["ended"] == "complete" else 1)
        drops = net.udp_socket_drops(port, res.link_host, proc.pid)
        launch.stop()
        meter.final()
        if args.verify:
            verify = verify_distinct(dst.bootstrap, dest_topic)
    finally:
        res.stop_proc(replayer, 10)
        launch.stop()
        meter.close()
        res.stop_broker(dst)
    launch.report_failure(end["ended"])
    metrics = launch.metrics()
    r = run_result("diode receiver" + (f"@{rate_mbps:g}Mb/s" if rate_mbps else ""), meter,
                   s.count, started, end, launch.code, s.value_size, verify)
    figures = link_figures(metrics)
    r.update(figures, rate_mbps=rate_mbps, metrics=metrics, replay=replay,
             udp_socket_drops=drops)
    replay = replay or {}
    r["notes"] = [
        (f"datagrams replayed {replay.get('datagrams', '?')} (the receiver's socket was full "
        f"{replay.get('queue_waits', '?')} times), received {figures['datagrams_received']:.0f}"),
        f"receive-buffer drops: {'?' if drops is None else drops}"]
    return r


def producer(b: Bench, s: Source, tag: str) -> dict:
    args, res = b.args, b.res
    dst = res.broker(f"dest-producer-{s.size_name}-{tag}", b.work, low=True)
    dest_topic = f"producer{tag}_" + s.topic
    create_topic(dst.bootstrap, dest_topic)
    logfile = os.path.join(b.work, f"producer-{s.size_name}-{tag}.log")
    meter = WatermarkMeter(dst.bootstrap, dest_topic)
    log(f"receiver baseline {s.size_name}: starting the plain producer (loads the records)")
    proc = res.popen(bench_mode("_produce", s.broker.bootstrap, dst.bootstrap, s.topic,
                                dest_topic, s.count), log_path=logfile, pipes=True)
    verify = None
    try:
        if read_line(proc, "ready", 300) is None:
            raise RuntimeError(f"the plain producer did not load the records (log: {logfile})")
        cpu = CpuWatch(proc.pid, lambda p: "producer", [dst])
        cpu.rebase()
        started = time.monotonic()
        tell(proc, "go")
        end = measure(meter, s.count, proc, cpu, started, args)
        code = res.stop_proc(proc)
        meter.final()
        if args.verify:
            verify = verify_distinct(dst.bootstrap, dest_topic)
    finally:
        if proc.returncode is None:
            res.stop_proc(proc, 15)
        meter.close()
        res.stop_broker(dst)
    if end["ended"] != "complete":
        with open(logfile, errors="replace") as f:
            log(f"receiver baseline {s.size_name}: {end['ended']}; log: " + f.read()[-2000:])
    return run_result("producer", meter, s.count, started, end, code, s.value_size, verify,
                      baseline=True)
