"""--mode memory: every diode worker's resident memory over one long stream through a link that
reorders, to show it stays flat (a measurement, not a test: nothing is asserted).

--records records of --record-bytes values are pre-produced to a source topic. The receiver and
the sender are then launched as two `diode launch --side` processes with `diode link-sim`
between them (listening where the sender's link points, forwarding to the receiver's port),
holding back --reorder of the datagrams (5 ms, so later ones overtake them) and losing none, so
every record must arrive. Once a second, from the launch until the last record is in the
destination (WatermarkMeter), the RSS of every diode process is read with psutil, each named by
its process title (`diode: receiver/kafka_writer-0` -> receiver/kafka_writer-0).

Warm-up ends at the meter's reading that first saw WARM_UP of the records arrive (a sample is
taken there, and at the reading that saw the last record). Some workers' RSS is a sawtooth (the
kafka_writer's swings by up to 30 MiB from one second to the next), so one reading lands
anywhere on it; each figure is therefore a peak. Per worker: the RSS after warm-up (the highest
sample while the next WARM_UP of the records arrived), at the end (the highest while the last
WARM_UP arrived), the max and the min from warm-up to the end, the change from after-warm-up
to end, and "flat" when the end and the max both stay within FLAT of the after-warm-up value
("grew" when either is above it, "shrank" when the end is below it). A worker whose pid
changed (restarted) is reported as such: its RSS started again from nothing. The link is paced
(RATE_MBPS unless --rate-mbps) so that the receiver's socket buffer does not overflow: the
stream must arrive whole."""

import json
import os
import socket
import time
from pathlib import Path

import psutil

from diode.kafka.brokers import free_port

from . import net
from .cpu import CpuWatch, diode_label
from .launch import REPO, DiodeLaunch, link_figures, topology
from .meter import WatermarkMeter, measure, verify_distinct
from .report import run_result
from .resources import Bench, log
from .workload import Source, create_topic, preproduce

SAMPLE_SECONDS = 1.0  # RSS read this often
WARM_UP = 0.10        # warm-up: until this share has arrived; also the windows' width
FLAT = 0.10           # "flat": end and max within this of the after-warm-up RSS
RATE_MBPS = 30.0      # link.rate.mbps unless --rate-mbps: unpaced, the 4 MiB receive buffer of
#                       this machine overflows (records lost, not what is measured here); at 30,
#                       1 M records of 100 B take about 45 s: a few samples in each window


def labeller(side: str):
    """diode_label, with the side put before the supervisor's (workers' titles carry it)."""
    def label(p: psutil.Process) -> str:
        name = diode_label(p)
        return name if "/" in name else f"{side}/{name}"
    return label


class TwoSides:
    """The two launches as measure() sees one system: poll() is set when either side exited,
    snapshot() is the CPU of both sides' processes (and the brokers and link-sim, apart)."""

    def __init__(self, launches: list, cpus: list):
        self.launches, self.cpus = launches, cpus
        self.returncode = None

    def poll(self):
        for launch in self.launches:
            code = launch.proc.poll()
            if code is not None:
                self.returncode = f"{code} ({launch.side})"
                return self.returncode
        return None

    def snapshot(self) -> dict:
        out = {"per_process": {}, "brokers": {}, "apart": {}}
        for cpu in self.cpus:
            snap = cpu.snapshot()
            for key in out:
                out[key].update(snap[key])
        out["per_process"] = dict(sorted(out["per_process"].items()))
        return out


class RssSampler:
    """RSS of every diode process under the launches' pids, by label, every SAMPLE_SECONDS."""

    def __init__(self, roots: dict):  # side -> pid of its `diode launch`
        self.roots = {side: psutil.Process(pid) for side, pid in roots.items()}
        self.samples: list = []   # {"seconds", "records", "rss": {label: bytes}}
        self.pids: dict = {}      # label -> every pid seen with it
        self.next_at = 0.0

    def maybe_sample(self, started: float, records: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self.next_at:
            return
        self.next_at = now + SAMPLE_SECONDS
        rss = {}
        for side, root in self.roots.items():
            label = labeller(side)
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for p in procs:
                try:
                    with p.oneshot():
                        name, value = label(p), p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                if name.endswith("/launch"):
                    continue  # not a diode process (a title not set yet)
                rss[name] = value
                seen = self.pids.setdefault(name, [])
                if p.pid not in seen:
                    seen.append(p.pid)
        self.samples.append({"seconds": round(now - started, 2), "records": records,
                             "rss": rss})

    def figures(self, expected: int) -> dict:
        """Per worker: RSS after warm-up and at the end (each the peak of its window), the max
        and min after warm-up, the change, the verdict; and when warm-up ended."""
        window = WARM_UP * expected
        first = next((i for i, s in enumerate(self.samples) if s["records"] >= window), None)
        out = {"warm_up": None, "workers": {}}
        if first is None:
            return out
        after = self.samples[first:]
        warm = [s for s in after if s["records"] <= 2 * window] or after[:1]
        last = after[-1]["records"]
        end = [s for s in after if s["records"] >= last - window]
        out["warm_up"] = {"seconds": after[0]["seconds"], "records": after[0]["records"],
                          "samples_after": len(after), "samples_warm_window": len(warm),
                          "samples_end_window": len(end)}
        for name in sorted(after[0]["rss"]):
            def peak(samples, name=name):
                values = [s["rss"][name] for s in samples if name in s["rss"]]
                return max(values) if values else None
            start, final, top = peak(warm), peak(end), peak(after)
            restarted = len(self.pids.get(name, [])) > 1
            row = {"warm_up_bytes": start, "end_bytes": final, "max_bytes": top,
                   "min_bytes": min(s["rss"][name] for s in after if name in s["rss"]),
                   "change_pct": None if final is None else 100 * (final - start) / start,
                   "max_pct": 100 * (top - start) / start, "restarted": restarted}
            if restarted or final is None or name not in after[-1]["rss"]:
                row["verdict"] = "restarted" if restarted else "exited"
            elif top > (1 + FLAT) * start or final > (1 + FLAT) * start:
                row["verdict"] = "grew"
            else:
                row["verdict"] = "shrank" if final < (1 - FLAT) * start else "flat"
            out["workers"][name] = row
        return out


def run(b: Bench) -> dict:
    args, res = b.args, b.res
    n, size = args.records, args.record_bytes
    src = res.broker("source-memory", b.work)
    topic = "bench-memory"
    create_topic(src.bootstrap, topic)
    secs, ends = preproduce(src.bootstrap, topic, n, size, args.compressible,
                            args.null_keys)
    log(f"pre-produced {n} records of {size} B to {topic} in {secs:.1f} s")
    s = Source("memory", size, n, src, topic, ends)
    try:
        return stream(b, s)
    finally:
        res.stop_broker(src)


def stream(b: Bench, s: Source) -> dict:
    args, res = b.args, b.res
    dst = res.broker("dest-memory", b.work)
    prefix = "m_"
    dest_topic = prefix + s.topic
    create_topic(dst.bootstrap, dest_topic)
    rate_mbps = args.rate_mbps or RATE_MBPS
    receiver_port, sim_port = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_DGRAM)
    cfgs = {side: topology(b, f"bench-memory-{side}", s.broker.bootstrap, dst.bootstrap,
                           s.topic, prefix, port, os.path.join(b.work, f"run-memory-{side}"),
                           rate_mbps)
            for side, port in (("receiver", receiver_port), ("sender", sim_port))}
    receiver = DiodeLaunch(b, cfgs["receiver"], "memory-receiver", side="receiver")
    sender = DiodeLaunch(b, cfgs["sender"], "memory-sender", side="sender")
    sim_report = os.path.join(b.work, "link-sim.json")
    meter = WatermarkMeter(dst.bootstrap, dest_topic)
    sim = None
    verify = None
    log(f"memory: launching --side receiver on udp {receiver_port}, link-sim on {sim_port} "
        f"(reorder {args.reorder:g}, nothing lost), then --side sender "
        f"(link paced at {rate_mbps:g} Mbit/s)")
    try:
        receiver.start()
        wait_bound(receiver_port, args.first_timeout, receiver)
        sim = res.popen([str(REPO / ".venv/bin/diode"), "link-sim",
                         "--listen", f"127.0.0.1:{sim_port}",
                         "--forward", f"127.0.0.1:{receiver_port}",
                         "--reorder", str(args.reorder), "--seed", "1", "--report", sim_report],
                        log_path=os.path.join(b.work, "link-sim.log"))
        wait_bound(sim_port, 15, None)
        sender.start()
        started = sender.started
        cpus = [CpuWatch(sender.proc.pid, labeller("sender"), [s.broker]),
                CpuWatch(receiver.proc.pid, labeller("receiver"), [dst], {"link-sim": [sim.pid]})]
        both = TwoSides([sender, receiver], cpus)
        rss = RssSampler({"sender": sender.proc.pid, "receiver": receiver.proc.pid})

        def tick():  # also at the reading that first saw WARM_UP, and at the one that saw all
            warm = not rss.samples or rss.samples[-1]["records"] < WARM_UP * s.count
            rss.maybe_sample(started, meter.count, force=meter.count >= s.count or (
                warm and meter.count >= WARM_UP * s.count))

        end = measure(meter, s.count, both, both, started, args, tick)
        drops = {"link_sim": net.udp_socket_drops(sim_port),
                 "receiver": net.udp_socket_drops(receiver_port)}
        sender.stop()
        res.stop_proc(sim, 10)
        receiver.stop()
        meter.final()
        if args.verify:
            verify = verify_distinct(dst.bootstrap, dest_topic)
    finally:
        sender.stop()
        if sim is not None and sim.returncode is None:
            res.stop_proc(sim, 10)
        receiver.stop()
        meter.close()
        res.stop_broker(dst)
    for launch in (sender, receiver):
        launch.report_failure(end["ended"])
    sim_counts = json.loads(Path(sim_report).read_text())["counts"] \
        if os.path.exists(sim_report) else {}
    sim_counts.pop("dropped_indexes", None)
    metrics = {**sender.metrics(), **receiver.metrics()}
    r = run_result("diode", meter, s.count, started, end, f"{sender.code}/{receiver.code}",
                   s.value_size, verify)
    r.update(link_figures(metrics), metrics=metrics, link_sim=sim_counts, socket_drops=drops,
             rate_mbps=rate_mbps, memory=rss.figures(s.count), samples=rss.samples)
    return {"records": s.count, "record_bytes": s.value_size, "reorder": args.reorder,
            "sample_seconds": SAMPLE_SECONDS, "warm_up_share": WARM_UP, "flat_within": FLAT,
            "run": r}


def wait_bound(port: int, timeout: float, launch) -> None:
    """Until a socket is bound to 127.0.0.1:`port` (the receiver's, link-sim's)."""
    deadline = time.monotonic() + timeout
    while net.udp_socket(port) is None:
        if launch is not None and launch.proc.poll() is not None:
            raise RuntimeError(f"diode {launch.tag} exited with {launch.proc.returncode} "
                               f"(log: {launch.logfile})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing bound udp port {port} within {timeout:.0f} s")
        time.sleep(0.1)
