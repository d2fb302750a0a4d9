"""--mode sender: the sender side alone (`diode launch --side sender`, its link pointed at a UDP
sink that only counts) against a plain consumer reading the same topic. Both are timed from
the start of the process until their consumer group's committed offsets reach the end of the
source topic (CommitMeter): diode's kafka_reader commits only what was handed to the kernel, so
that is "every record sent". capture() is the same run with a sink that keeps every datagram,
for the receiver alone."""

import os
import signal
import time

from . import net
from .cpu import CpuWatch, diode_label
from .launch import SENDER_COMMIT_INTERVAL_MS, DiodeLaunch, group_id, link_figures, topology
from .meter import CommitMeter, measure
from .profile import Profiler
from .report import rate, run_result
from .resources import Bench, bench_mode, log, read_json, read_line
from .workload import Source


def run(b: Bench, s: Source) -> list:
    rows = []
    for run_no in range(1, b.args.repeat + 1):
        if not b.args.skip_baseline:
            rows.append({**consumer(b, s, str(run_no)), "run": run_no})
            log(f"sender baseline {s.size_name}: {rate(rows[-1])[0]:,.0f} records/s")
        r = {**diode(b, s, str(run_no), b.args.rate_mbps), "run": run_no}
        rows.append(r)
        log(f"sender diode {s.size_name}: {rate(r)[0]:,.0f} records/s")
    return rows


def capture(b: Bench, s: Source) -> tuple[str, dict]:
    """Every datagram of one sender run in a file (udp.py's format), for the receiver alone.
    Rerun paced at --paced-mbps if the sink's socket dropped any (the capture must be whole)."""
    path = os.path.join(b.work, f"capture-{s.size_name}.bin")
    r = diode(b, s, "capture", b.args.rate_mbps, capture_to=path)
    paced = 400.0 if b.args.paced_mbps == "relay" else float(b.args.paced_mbps)
    if (r["sink_socket_drops"] or r["missing"]) and paced:
        log(f"capture {s.size_name}: the sink dropped {r['sink_socket_drops']} datagrams: "
            f"capturing again paced at {paced:g} Mbit/s")
        r = diode(b, s, "capture-paced", paced, capture_to=path)
    if r["sink_socket_drops"] or r["missing"]:
        raise RuntimeError(f"capture {s.size_name}: {r['sink_socket_drops']} datagrams dropped, "
                           f"{r['missing']} records not sent: the receiver runs would be short")
    log(f"capture {s.size_name}: {r['sink']['datagrams']} datagrams, "
        f"{r['sink']['bytes'] / 1e6:.1f} MB in {path}")
    return path, r


def diode(b: Bench, s: Source, tag: str, rate_mbps: float, capture_to: str | None = None):
    args, res = b.args, b.res
    name = f"sender-{s.size_name}-{tag}"
    sink = res.popen(res.low_host(bench_mode("_sink", "--bind", res.link_host,
                                             *(["--capture", capture_to] if capture_to else []))),
                     log_path=os.path.join(b.work, f"sink-{name}.log"), pipes=True)
    line = read_line(sink, "port ", 15)
    if line is None:
        raise RuntimeError(f"the UDP sink did not start (log: sink-{name}.log)")
    port = int(line.split()[1])
    cfg = topology(b, f"bench-{name}", s.broker.bootstrap, s.broker.bootstrap, s.topic,
                   "unused_", port, os.path.join(b.work, f"run-{name}"), rate_mbps,
                   {"sender.offset.commit.interval.ms": SENDER_COMMIT_INTERVAL_MS})
    launch = DiodeLaunch(b, cfg, name, side="sender")
    meter = CommitMeter(s.broker.bootstrap, group_id(cfg), s.topic)
    log(f"sender diode {s.size_name} {tag}: launching --side sender into a UDP sink on "
        f"port {port} ({'unpaced' if not rate_mbps else f'{rate_mbps:g} Mbit/s'})")
    proc = launch.start()
    cpu = CpuWatch(proc.pid, diode_label, [s.broker], {"sink": [sink.pid]})
    prof = Profiler(b, name, cpu) if b.profile_dir and not capture_to else None
    try:
        end = measure(meter, s.count, proc, cpu, launch.started, args,
                      prof and (lambda: prof.watch(proc.pid)))
        if prof is not None:
            b.profiles.append(prof.stop())
        launch.stop()
        meter.final()
        drops = net.udp_socket_drops(port, res.link_host, sink.pid)
        sink.send_signal(signal.SIGTERM)
        sink_stats = read_json(sink, "stats ", 15)
    finally:
        launch.stop()
        meter.close()
        res.stop_proc(sink, 10)
    launch.report_failure(end["ended"])
    metrics = launch.metrics()
    r = run_result("diode sender" + (f"@{rate_mbps:g}Mb/s" if rate_mbps else ""), meter,
                   s.count, launch.started, end, launch.code, s.value_size)
    figures = link_figures(metrics)
    r.update(figures, rate_mbps=rate_mbps, metrics=metrics, sink=sink_stats,
             sink_socket_drops=drops)
    r["notes"] = [
        (f"datagrams sent {figures['datagrams_sent']:.0f}, the sink got "
        f"{sink_stats.get('datagrams', '?')} ({sink_stats.get('bytes', 0) / 1e6:.1f} MB)"),
        f"sink socket drops: {'?' if drops is None else drops}",
        f"reader rewinds: {figures['rewinds']:.0f}"]
    return r


def consumer(b: Bench, s: Source, tag: str) -> dict:
    args, res = b.args, b.res
    group = f"bench-consumer-{s.size_name}-{tag}"
    logfile = os.path.join(b.work, f"consumer-{s.size_name}-{tag}.log")
    meter = CommitMeter(s.broker.bootstrap, group, s.topic)
    log(f"sender baseline {s.size_name}: starting the plain consumer")
    started = time.monotonic()
    proc = res.popen(bench_mode("_consume", s.broker.bootstrap, s.topic, group, s.count,
                                SENDER_COMMIT_INTERVAL_MS), log_path=logfile)
    cpu = CpuWatch(proc.pid, lambda p: "consumer", [s.broker])
    try:
        end = measure(meter, s.count, proc, cpu, started, args)
        code = res.stop_proc(proc)
        meter.final()
    finally:
        if proc.returncode is None:
            res.stop_proc(proc, 15)
        meter.close()
    if end["ended"] != "complete":
        with open(logfile, errors="replace") as f:
            log(f"sender baseline {s.size_name}: {end['ended']}; log: " + f.read()[-2000:])
    return run_result("consumer", meter, s.count, started, end, code, s.value_size,
                      baseline=True)

