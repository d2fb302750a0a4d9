"""--mode e2e: diode end to end (both sides, one `diode launch`) against the one-process relay,
each writing to a fresh destination broker, timed from the start of the process until the last
record is in the destination topic (WatermarkMeter).

With --live, each run reads a new, empty source topic instead of the pre-produced backlog: the
system starts, waits --live-wait seconds, and a producer process (`_live`) then writes the
records at full speed while it runs; the clock and the CPU count from the producer's start."""

import dataclasses
import os
import socket
import time

from diode.kafka.brokers import free_port

from . import net
from .cpu import CpuWatch, diode_label
from .launch import DiodeLaunch, link_figures, topology
from .meter import WatermarkMeter, measure, verify_distinct
from .profile import Profiler
from .report import rate, run_result
from .resources import Bench, bench_mode, log
from .workload import Source, create_topic


def live_source(b: Bench, s: Source, tag: str) -> Source:
    """With --live, a new empty source topic for one run; else the pre-produced one."""
    if not b.args.live:
        return s
    topic = f"{s.topic}-live-{tag}"
    create_topic(s.broker.bootstrap, topic)
    return dataclasses.replace(s, topic=topic, ends={})


def go_live(b: Bench, s: Source, cpu, started: float) -> float:
    """With --live: let the system start, then produce its records while it runs. Returns
    when the clock starts (the producer's start; the launch's otherwise)."""
    if not b.args.live:
        return started
    time.sleep(b.args.live_wait)
    cpu.rebase()  # startup is not what a live run measures
    started = time.monotonic()
    proc = b.res.popen(bench_mode("_live", s.broker.bootstrap, s.topic, s.count, s.value_size,
                                  int(b.args.compressible), int(b.args.null_keys)),
                       log_path=os.path.join(b.work, f"live-{s.topic}.log"))
    cpu.add_apart("producer", proc.pid)
    return started


def run(b: Bench, s: Source) -> list:
    """--repeat runs of each system, alternating; an unpaced diode run that loses records or
    datagrams is rerun paced (--paced-mbps: by default at the rate the relay reached in the
    same repeat, framing included: a link paced to what the alternative achieves)."""
    args = b.args
    rows = []
    for run_no in range(1, args.repeat + 1):
        base = None
        if not args.skip_baseline:
            base = {**relay(b, s, str(run_no)), "run": run_no}
            rows.append(base)
            log(f"e2e baseline {s.size_name}: {rate(base)[0]:,.0f} records/s")
        r = {**diode(b, s, args.rate_mbps, str(run_no)), "run": run_no}
        rows.append(r)
        log(f"e2e diode {s.size_name}: {rate(r)[0]:,.0f} records/s, {r['missing']} missing")
        link_loss = r["datagrams_sent"] - r["datagrams_received"]
        paced = paced_mbps(args.paced_mbps, base, s)
        if (r["missing"] > 0 or link_loss > 0) and paced and not args.rate_mbps:
            log(f"e2e diode {s.size_name}: {r['missing']} records missing, {link_loss:.0f} "
                f"datagrams lost on the link: rerunning paced at {paced:,.0f} Mbit/s")
            r = {**diode(b, s, paced, f"{run_no}paced"), "run": run_no}
            rows.append(r)
            log(f"e2e diode {s.size_name} paced: {rate(r)[0]:,.0f} records/s, "
                f"{r['missing']} missing")
    return rows


def paced_mbps(setting: str, base: dict | None, s: Source) -> float:
    """--paced-mbps as a rate: a number, 0 (no rerun), or "relay": the relay's records/s of
    this repeat as link bits (value, key, header and provenance bytes plus about 5 % framing)."""
    if setting != "relay":
        return float(setting)
    if base is None or not rate(base)[0]:
        return 400.0
    per_record = s.value_size + 64  # key, one header, the run's columns and the datagram's share
    return rate(base)[0] * per_record * 8 * 1.05 / 1e6


def diode(b: Bench, s: Source, rate_mbps: float, tag: str) -> dict:
    args, res = b.args, b.res
    s = live_source(b, s, f"diode{tag}")
    dst = res.broker(f"dest-diode-{s.size_name}-{tag}", b.work)
    prefix = f"d{tag}_"
    dest_topic = prefix + s.topic
    create_topic(dst.bootstrap, dest_topic)
    udp_port = free_port(socket.SOCK_DGRAM)
    name = f"e2e-{s.size_name}-{tag}"
    cfg = topology(b, f"bench-{name}", s.broker.bootstrap, dst.bootstrap, s.topic, prefix,
                   udp_port, os.path.join(b.work, f"run-{name}"), rate_mbps)
    launch = DiodeLaunch(b, cfg, name)
    meter = WatermarkMeter(dst.bootstrap, dest_topic)
    drops0 = net.udp_rcvbuf_errors()
    socket_drops = []
    log(f"e2e diode {s.size_name}: launching "
        f"({'unpaced' if not rate_mbps else f'{rate_mbps:g} Mbit/s'})")
    proc = launch.start()
    cpu = CpuWatch(proc.pid, diode_label, [s.broker, dst])
    prof = Profiler(b, name, cpu) if b.profile_dir else None
    started = go_live(b, s, cpu, launch.started)

    def tick():
        if prof is not None:
            prof.watch(proc.pid)
        d = net.udp_socket_drops(udp_port)
        if d is not None:
            socket_drops.append(d)

    verify = None
    try:
        end = measure(meter, s.count, proc, cpu, started, args, tick)
        if prof is not None:
            b.profiles.append(prof.stop())
        drops1 = net.udp_rcvbuf_errors()
        launch.stop()
        for broker in (s.broker, dst):
            if not broker.alive():
                log(f"embedded broker {broker.name} is not running any more "
                    f"(exit {broker.proc.poll()})")
        meter.final()  # anything the drain flushed
        if args.verify:
            verify = verify_distinct(dst.bootstrap, dest_topic)
    finally:
        launch.stop()  # error or Ctrl-C: stop it while its brokers still run
        meter.close()
        res.stop_broker(dst)
    launch.report_failure(end["ended"])
    metrics = launch.metrics()
    system = "diode" if not rate_mbps else f"diode@{rate_mbps:g}Mb/s"
    r = run_result(system, meter, s.count, started, end, launch.code, s.value_size, verify)
    figures = link_figures(metrics)
    drops = max(socket_drops) if socket_drops else None
    r.update(figures, rate_mbps=rate_mbps, metrics=metrics, udp_socket_drops=drops,
             kernel_udp_rcvbuf_drops=drops1 - drops0 if drops0 >= 0 <= drops1 else None)
    r["notes"] = [
        (f"datagrams sent {figures['datagrams_sent']:.0f}, "
        f"received {figures['datagrams_received']:.0f}"),
        (f"receive-buffer drops: {'?' if drops is None else drops} "
        f"(machine-wide {r['kernel_udp_rcvbuf_drops']})"),
        f"reader rewinds: {figures['rewinds']:.0f}"]
    return r


def relay(b: Bench, s: Source, tag: str) -> dict:
    args, res = b.args, b.res
    s = live_source(b, s, f"relay{tag}")
    dst = res.broker(f"dest-relay-{s.size_name}-{tag}", b.work)
    dest_topic = f"relay{tag}_" + s.topic
    create_topic(dst.bootstrap, dest_topic)
    logfile = os.path.join(b.work, f"relay-{s.size_name}-{tag}.log")
    meter = WatermarkMeter(dst.bootstrap, dest_topic)
    log(f"e2e baseline {s.size_name}: starting the relay")
    started = time.monotonic()
    proc = res.popen(bench_mode("_relay", s.broker.bootstrap, dst.bootstrap, s.topic,
                                dest_topic, s.count), log_path=logfile)
    cpu = CpuWatch(proc.pid, lambda p: "relay", [s.broker, dst])
    started = go_live(b, s, cpu, started)
    verify = None
    try:
        end = measure(meter, s.count, proc, cpu, started, args)
        code = res.stop_proc(proc)
        meter.final()
        if end["ended"] == "process exited with 0":  # it flushed and left between two ticks
            end["ended"] = "complete" if meter.count >= s.count else "relay finished short"
        if args.verify:
            verify = verify_distinct(dst.bootstrap, dest_topic)
    finally:
        if proc.returncode is None:  # error or Ctrl-C: stop it while its brokers still run
            res.stop_proc(proc, 15)
        meter.close()
        res.stop_broker(dst)
    if end["ended"] != "complete":
        with open(logfile, errors="replace") as f:
            log(f"e2e baseline {s.size_name}: {end['ended']}; log: " + f.read()[-2000:])
    return run_result("baseline", meter, s.count, started, end, code, s.value_size, verify,
                      baseline=True)
