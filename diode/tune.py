"""`diode tune`'s decision: instances per stage and a core for each worker, from each stage's
CPU cost per record, a target rate and the machine's cores.

The rule (the CPU guidance, docs/tuning.md):

- a stage's load at the target is rate × cost: that many cores' worth of work, shared by its
  instances; each instance's share must stay under the utilisation limit (70 % of a core by
  default), so a stage gets ceil(load / limit) instances. udp_sender and udp_reader are one
  process each (one socket, one flow on the link): their load alone bounds the rate;
- the UDP reader gets a core to itself, away from the NIC's interrupt cores when there is
  one to spare: a datagram it does not read in time is lost;
- the other workers are packed onto the remaining cores, heaviest first, onto the least loaded
  core (busy cores count with the load they already carry), each core under the limit;
- each side is decided for its own machine; when the target does not fit, the highest rate
  that does (found by bisection) and the stage or resource that stops it are reported.
"""

import math
import dataclasses
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field

from diode import topology as topo
from diode.errors import DiodeError
from diode.topology import PIPELINES, SINGLE_INSTANCE, SIDES

UTILISATION = 0.7
MAX_INSTANCES = 64


@dataclass(frozen=True)
class Machine:
    cores: tuple               # logical CPUs this side may use
    busy: dict = field(default_factory=dict)  # core -> fraction already used by others
    irq_cores: tuple = ()      # where the NIC's interrupts land (may be unknown: empty)


@dataclass
class StagePlan:
    stage: str
    cost_us: float             # CPU µs per record
    load: float                # cores' worth of work at the rate
    instances: int
    cores: list                # one core per instance


@dataclass
class Decision:
    side: str
    rate: float                # records/s asked for
    fits: bool
    stages: dict               # stage -> StagePlan (at `rate` when it fits, else at max_rate)
    core_load: dict            # core -> utilisation with the plan
    max_rate: float            # the highest rate that fits on this machine
    bottleneck: str            # the stage (or "cores") that stops a higher rate


def _instances(stage: str, load: float, limit: float) -> int | None:
    """Instances of a stage for its load; None when one instance of a single-instance stage
    cannot carry it."""
    if stage in SINGLE_INSTANCE:
        return 1 if load <= limit else None
    return max(1, math.ceil(load / limit - 1e-9))


def place(side: str, costs: dict, rate: float, machine: Machine,
          limit: float = UTILISATION) -> tuple[dict | None, dict, str]:
    """(stage -> StagePlan, core -> load, why not) at `rate`; None plans when it does not fit,
    with the stage or "cores" that failed."""
    plans = {}
    for stage in PIPELINES[side]:
        load = rate * costs[stage] * 1e-6
        n = _instances(stage, load, limit)
        if n is None or n > MAX_INSTANCES:
            return None, {}, stage
        plans[stage] = StagePlan(stage, costs[stage], load, n, [])
    core_load = {c: machine.busy.get(c, 0.0) for c in machine.cores}
    free = [c for c in machine.cores if core_load[c] + 1e-9 < limit]
    if "udp_reader" in plans:  # its own core, away from the NIC's interrupts if possible
        quiet = [c for c in free if c not in machine.irq_cores] or free
        if not quiet:
            return None, {}, "cores"
        own = min(quiet, key=lambda c: (core_load[c], c))
        reader = plans["udp_reader"]
        if core_load[own] + reader.load > limit:
            return None, {}, "udp_reader"
        reader.cores = [own]
        core_load[own] += reader.load
        if len(machine.cores) > 1:  # nothing else on it, when there is anywhere else
            free.remove(own)
    work = sorted(((p.load / p.instances, p.stage) for p in plans.values() if not p.cores
                   for _ in range(p.instances)), reverse=True)
    for share, stage in work:
        core = min(free, key=lambda c: (core_load[c], c)) if free else None
        if core is None or core_load[core] + share > limit + 1e-9:
            return None, {}, "cores"
        core_load[core] += share
        plans[stage].cores.append(core)
    return plans, core_load, ""


def decide(side: str, costs: dict, rate: float, machine: Machine,
           limit: float = UTILISATION) -> Decision:
    """The plan for `side` at `rate`, or, when it does not fit, the plan at the highest rate
    that does, with what stops it."""
    plans, core_load, why = place(side, costs, rate, machine, limit)
    best, bottleneck = _max_rate(side, costs, machine, limit)
    if plans is not None:
        return Decision(side, rate, True, plans, core_load, best, bottleneck)
    at_best, best_load, _ = place(side, costs, best, machine, limit) if best > 0 else ({}, {},
                                                                                    "")
    return Decision(side, rate, False, at_best or {}, best_load, best, why or bottleneck)


def _max_rate(side: str, costs: dict, machine: Machine, limit: float) -> tuple[float, str]:
    """The highest rate that places (records/s, to 0.5 %), and what fails just above it."""
    total = sum(costs[s] for s in PIPELINES[side]) * 1e-6
    high = limit * len(machine.cores) / total * 1.01  # above anything that can fit
    low = 0.0
    while high - low > max(1.0, high * 0.005):
        mid = (low + high) / 2
        if place(side, costs, mid, machine, limit)[0] is not None:
            low = mid
        else:
            high = mid
    return low, place(side, costs, high, machine, limit)[2]


# -- the machine ---------------------------------------------------------------------------------

SYSCTLS = ("net.core.rmem_max", "net.core.wmem_max", "net.core.netdev_max_backlog")


def irq_cores(device: str, interrupts: str, virtio: str = "") -> tuple:
    """The cores that took the receive interrupts of `device` (its lines in /proc/interrupts,
    by name or, for virtio, by its virtioN name), from the counts: where they actually land."""
    lines = interrupts.splitlines()
    if not lines or not device:
        return ()
    cpus = [int(c[3:]) for c in lines[0].split()]
    names = tuple(n for n in (device, virtio) if n)
    cores = set()
    for line in lines[1:]:
        fields = line.split()
        if not fields or not fields[0].rstrip(":").isdigit():
            continue
        label = fields[-1]
        if not label.startswith(names) or any(w in label for w in ("config", "tx", "output")):
            continue
        for cpu, count in zip(cpus, fields[1:1 + len(cpus)]):
            if count.isdigit() and int(count) > 0:
                cores.add(cpu)
    return tuple(sorted(cores))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def read_machine(host: str, sample_seconds: float = 0.5) -> tuple[Machine, dict]:
    """This machine as `diode tune` sees it: the cores this process may use, how busy each is
    (others' load over `sample_seconds`), the cores of the NIC's receive interrupts for the
    device the link's host is reached by, and the network sysctls. Facts it cannot read are
    left out (the report says so), never guessed."""
    import psutil
    from diode import pacing
    cores = tuple(sorted(os.sched_getaffinity(0)))
    percent = psutil.cpu_percent(interval=sample_seconds, percpu=True)
    busy = {c: percent[c] / 100 for c in cores if c < len(percent)}
    facts = {"logical_cores": len(cores), "physical_cores": psutil.cpu_count(logical=False),
             "busy": busy, "device": None, "qdisc": None, "irq_cores": (),
             "sysctl": {name: _sysctl(name) for name in SYSCTLS}}
    try:
        egress = pacing.probe_egress(host)
        facts.update(device=egress.device, qdisc=egress.qdisc, mtu=egress.mtu)
    except (OSError, ValueError, LookupError, subprocess.SubprocessError) as exc:
        facts["device_error"] = str(exc)
    device = facts["device"] or ""
    virtio = os.path.basename(os.path.realpath(f"/sys/class/net/{device}/device")) \
        if device else ""
    facts["irq_cores"] = irq_cores(device, _read("/proc/interrupts"),
                                   virtio if virtio.startswith("virtio") else "")
    return Machine(cores, busy, facts["irq_cores"]), facts


def _sysctl(name: str) -> int | None:
    text = _read("/proc/sys/" + name.replace(".", "/")).strip()
    return int(text) if text.isdigit() else None


def sysctl_advice(side: str, bytes_per_second: float, datagrams_per_second: float,
                  current: dict) -> list:
    """(sysctl, value now, value to set, why) for each one too small for the rate:
    the receiver's socket buffer holds a quarter second of the link (a reader held up that long
    loses nothing), the sender's 50 ms, the device backlog 10 ms of datagrams."""
    wanted = {"net.core.netdev_max_backlog": (max(1000, int(datagrams_per_second * 0.01)),
                                              "10 ms of datagrams queued per core")}
    if side == "receiver":
        wanted["net.core.rmem_max"] = (max(4 << 20, int(bytes_per_second * 0.25)),
                                       "a quarter second of the link in the socket buffer")
    else:
        wanted["net.core.wmem_max"] = (max(1 << 20, int(bytes_per_second * 0.05)),
                                       "50 ms of the link in the socket buffer")
    return [(name, current.get(name), value, why) for name, (value, why) in wanted.items()
            if current.get(name) is not None and current[name] < value]


# -- measuring -----------------------------------------------------------------------------------

MEASURE_SECONDS = 12.0
WARMUP_SECONDS = 4.0


@dataclass
class Measured:
    record_bytes: int
    rate: float                # records/s the measurement ran at
    records: int               # records written while it was measured
    datagrams: int             # datagrams sent meanwhile
    cost_us: dict              # stage -> CPU µs per record (all its instances)
    brokers: str               # where it ran: "embedded tansu", "configured clusters", ...


def measure(t, record_bytes: int, seconds: float = MEASURE_SECONDS) -> Measured:
    """Each stage's CPU per record on this machine, with the topology's own settings (datagram
    size, cipher, compression, FEC, fragmenting): the pipeline runs for real, one instance per
    stage, on embedded brokers, paced at half of what diode.capacity estimates its receiver
    takes (so that nothing saturates and drops); each worker's CPU time (librdkafka's threads
    included) over the records written meanwhile. The brokers' own CPU is not counted."""
    import copy
    import shutil
    import tempfile
    from pathlib import Path

    import psutil
    import yaml

    from diode import brokers as embedded
    from diode import capacity
    from diode.soak import traffic
    from diode.soak.run import Counters, Launch

    one = {side: {stage: {"instances": 1} for stage in PIPELINES[side]} for side in PIPELINES}
    raw = yaml.safe_load(Path(t.path).read_text()) if t.path != "<memory>" else {}
    estimate = capacity.measure_receiver(t, record_bytes)
    estimate = dataclasses.replace(estimate, instances=dict.fromkeys(estimate.instances, 1))
    datagrams_per_second = estimate.max_datagrams_per_second()[0] / 2
    per_record_bytes = estimate.datagram_bytes / estimate.records_per_datagram
    rate = datagrams_per_second * estimate.records_per_datagram
    if t.link.rate_mbps:
        rate = min(rate, t.link.rate_mbps * 1e6 / 8 / per_record_bytes * 0.8)
    work = Path(tempfile.mkdtemp(prefix="diode-tune-"))
    started, launches = [], {}
    try:
        src, dst = (embedded.make_broker("tansu", name, f"127.0.0.1:{embedded.free_port()}",
                                         str(work / f"{name}.log")) for name in ("source",
                                                                                  "destination"))
        embedded.start_all([src, dst])
        started += [src, dst]
        topic = "diode-tune"
        from confluent_kafka.admin import AdminClient
        from diode.kafka import create_topic
        create_topic(AdminClient(src.client_config()), topic, 4)
        port = embedded.free_port(socket.SOCK_DGRAM)
        data = copy.deepcopy(raw)
        data.pop("brokers", None)
        data.setdefault("sender", {}).update(
            topics=[topic], **{"start.position": "earliest", "kafka": {
                "bootstrap.servers": src.bootstrap}, "stages": one["sender"]})
        data["sender"].pop("topics.regex", None)
        data.setdefault("receiver", {}).update(
            **{"kafka": {"bootstrap.servers": dst.bootstrap}, "stages": one["receiver"],
               "journal.dir": str(work / "journal")})
        link = data.setdefault("link", {})
        link.update(host="127.0.0.1", port=port, **{"bind.address": "127.0.0.1",
                                                     "rate.mbps": round(
                                                         rate * per_record_bytes * 8 / 1e6 * 1.1,
                                                         1)})
        sec = data.setdefault("security", {})
        for key in ("password.file", "key.file"):
            if sec.get(key):
                sec[key] = t.resolve(sec[key])
        if not (sec.get("password.file") and Path(sec["password.file"]).exists()) and \
                not sec.get("key.file") and not sec.get("password.env"):
            (work / "password").write_text("diode tune\n")
            sec["password.file"] = str(work / "password")
        data.setdefault("supervisor", {}).pop("run.dir", None)
        path = work / "topology.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        topo.load(path)
        for side in ("receiver", "sender"):
            launches[side] = Launch(side, path, work / f"run-{side}", work / f"{side}.log")
            launches[side].wait_ready(len(PIPELINES[side]))
        records = traffic.Records([topic], 4, [(record_bytes, 1.0)], seed=1)
        flow = traffic.Traffic(src.client_config(), records, rate).start()
        written = Counters([work / "run-receiver"], "kafka_writer", ("records",))
        sent = Counters([work / "run-sender"], "udp_sender", ("datagrams",))
        time.sleep(WARMUP_SECONDS)
        before = (_cpu_by_stage(launches, psutil), written.sample()["records"],
                  sent.sample()["datagrams"])
        time.sleep(seconds)
        after = (_cpu_by_stage(launches, psutil), written.sample()["records"],
                 sent.sample()["datagrams"])
        flow.stop(timeout=5)
        n = after[1] - before[1]
        if n <= 0:
            raise DiodeError(f"no record crossed while measuring (logs in {work})")
        cost = {stage: (after[0].get(stage, 0.0) - before[0].get(stage, 0.0)) / n * 1e6
                for stage in after[0]}
        return Measured(record_bytes, rate, int(n), int(after[2] - before[2]), cost,
                        "embedded tansu")
    finally:
        for launch in launches.values():
            if launch.alive():
                launch.stop()
        for b in started:
            b.stop()
        shutil.rmtree(work, ignore_errors=True)


def _cpu_by_stage(launches: dict, psutil) -> dict:
    """stage -> CPU seconds (user + system, all threads) of its live workers."""
    out: dict = {}
    for launch in launches.values():
        for title, proc in launch.workers().items():
            stage = title.split("/")[1].rsplit("-", 1)[0]
            try:
                out[stage] = out.get(stage, 0.0) + sum(proc.cpu_times()[:2])
            except psutil.Error:
                pass
    return out


# -- the command ---------------------------------------------------------------------------------

def advise(t, measured: Measured, rate: float, machine: Machine, facts: dict,
           limit: float = UTILISATION) -> dict:
    """What `diode tune` prints (and --json gives): per side its decision, and the sysctls."""
    per_datagram = measured.records / max(1, measured.datagrams)
    wire_bytes = t.link.datagram_size_bytes / max(per_datagram, 1e-9)
    out = {"record_bytes": measured.record_bytes, "rate": rate,
           "measured_at": round(measured.rate), "records_per_datagram": round(per_datagram, 2),
           "utilisation": limit, "machine": {k: v for k, v in facts.items() if k != "busy"},
           "sides": {}, "sysctl": []}
    for side in SIDES:
        costs = {s: measured.cost_us.get(s, 0.0) for s in PIPELINES[side]}
        d = decide(side, costs, rate, machine, limit)
        out["sides"][side] = {
            "fits": d.fits, "max_rate": round(d.max_rate), "bottleneck": d.bottleneck,
            "stages": {s: {"cost_us_per_record": round(costs[s], 3),
                           "load_at_target": round(rate * costs[s] * 1e-6, 3),
                           "instances": p.instances, "cores": sorted(set(p.cores))}
                       for s, p in d.stages.items()}}
        out["sysctl"] += [{"name": n, "now": now, "set": want, "why": why, "side": side}
                          for n, now, want, why in sysctl_advice(
                              side, rate * wire_bytes, rate / max(per_datagram, 1e-9),
                              facts.get("sysctl", {}))]
    return out


def table(advice: dict) -> str:
    lines = [f"{'stage':<14} {'µs/record':>10} {'load at target':>15} {'instances':>10}  cores"]
    for side, s in advice["sides"].items():
        lines.append(f"{side}: " + (f"fits at {advice['rate']:,.0f} records/s" if s["fits"]
                                    else f"does not fit: at most {s['max_rate']:,} records/s "
                                    f"here, limited by {s['bottleneck']}"))
        for stage, p in s["stages"].items():
            lines.append(f"  {stage:<12} {p['cost_us_per_record']:>10.2f} "
                         f"{p['load_at_target']:>15.2f} {p['instances']:>10}  "
                         f"{','.join(map(str, p['cores']))}")
    for c in advice["sysctl"]:
        lines.append(f"{c['side']}: sysctl -w {c['name']}={c['set']}  (now {c['now']}: "
                     f"{c['why']})")
    return "\n".join(lines)


def main(args) -> int:
    import json
    t = topo.load(args.topology)
    rate = float(args.rate)
    if rate <= 0:
        raise DiodeError(f"--rate {args.rate}: records per second, above 0")
    print(f"diode tune: measuring each stage's CPU per record with records of "
          f"{args.record_size} bytes (about {MEASURE_SECONDS + WARMUP_SECONDS:.0f} s)",
          flush=True)
    measured = measure(t, args.record_size)
    machine, facts = read_machine(t.link.host)
    advice = advise(t, measured, rate, machine, facts, args.utilisation)
    print(json.dumps(advice, indent=1) if args.json else table(advice))
    return 0 if all(s["fits"] for s in advice["sides"].values()) else 1


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="measure each stage's CPU per record here and say how many "
                       "instances of each, on which cores, a rate needs (exit 1: it does not fit)")
    p.add_argument("topology")
    p.add_argument("--rate", required=True, help="target records per second")
    p.add_argument("--record-size", type=int, default=200, help="value bytes (default 200)")
    p.add_argument("--utilisation", type=float, default=UTILISATION,
                   help=f"highest load of any core (default {UTILISATION})")
    p.add_argument("--json", action="store_true", help="the same as JSON")
    p.set_defaults(func=main)
