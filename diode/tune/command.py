"""`diode tune TOPOLOGY --rate R`: measure each stage here, decide instances and cores, show the
plan and the topology change, write it (--write), prove it with a short bench (--verify);
`diode tune --live` advises a running launch from its metrics. docs/tuning.md."""

import ipaddress
import json
import socket
import sys
import time
from pathlib import Path

import yaml

from diode.runtime import topology as topo
from diode.errors import DiodeError
from diode.link.path import IPV4_UDP
from diode.runtime.topology import PIPELINES, SIDES
from diode.tune import edit, live, partitions
from diode.tune.decide import UTILISATION, Machine, decide
from diode.tune.machine import pacing_advice, read_machine, sysctl_advice
from diode.tune.measure import (MEASURE_SECONDS, WARMUP_SECONDS, Bench, Measured, measure,
                                one_instance)

VERIFY_SECONDS = 15.0
VERIFY_TOLERANCE = 0.25


def shares_machine(host: str) -> bool:
    """Whether the link's host is this machine (loopback): then both sides share its cores."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def advise(t, measured: Measured, rate: float, machine: Machine, facts: dict,
           limit: float = UTILISATION, shared: bool | None = None,
           side: str | None = None) -> dict:
    """What `diode tune` prints (--json gives it whole): per stage its costs, load, instances
    and cores; the highest rate and what bounds it; the sysctls too small; the topology's new
    stage settings. Of `side` alone when given (this machine is that side's host)."""
    sides = SIDES if side is None else (side,)
    shared = side is None and (shares_machine(t.link.host) if shared is None else shared)
    costs = measured.cost_us
    windows = measured.windows
    wire = (sum(w.bytes + IPV4_UDP * w.datagrams for w in windows[:1])
            / max(1, windows[0].records)) if windows else 0.0
    decisions = {"both": decide("both", costs, rate, machine, limit)} if shared else \
        {s: decide(s, costs, rate, machine, limit) for s in sides}
    out = {"rate": rate, "record_bytes": round(measured.record_bytes, 1),
           "utilisation": limit, "shared_machine": shared, "side": side or "both",
           "measured": {"rate": round(measured.rate), "brokers": measured.brokers,
                        "records_per_datagram": round(measured.records_per_datagram, 2),
                        "wire_bytes_per_record": round(wire, 1),
                        "windows": [{"datagram_bytes": w.datagram_bytes, "seconds":
                                     round(w.seconds, 1), "records": w.records,
                                     "datagrams": w.datagrams, "missing": w.missing}
                                    for w in windows]},
           "machine": {k: v for k, v in facts.items() if k != "busy"},
           "stages": {}, "sides": {}, "sysctl": [], "topology": {s: {} for s in sides}}
    for name, d in decisions.items():
        out["sides"][name] = {"fits": d.fits, "max_rate": round(d.max_rate),
                              "bottleneck": d.bottleneck,
                              "core_load": {str(c): round(v, 3) for c, v in
                                            sorted(d.core_load.items())}}
        for stage, p in d.stages.items():
            side = "sender" if stage in PIPELINES["sender"] else "receiver"
            out["stages"][stage] = {
                "side": side, "cost_us_per_record": round(costs[stage], 3),
                "per_record_us": round(measured.per_record_us.get(stage, 0.0), 3),
                "cost_us_per_datagram": round(measured.per_datagram_us.get(stage, 0.0), 3),
                "load_at_target": round(rate * costs[stage] * 1e-6, 3),
                "instances": p.instances, "cores": sorted(set(p.cores))}
            out["topology"][side][stage] = edit.stage_settings(p.instances, p.cores)
    limits = {name: (d.max_rate, d.bottleneck) for name, d in decisions.items()}
    if t.link.rate_mbps and wire:
        link_rate = t.link.rate_mbps * 1e6 / 8 / wire
        out["link"] = {"rate_mbps": t.link.rate_mbps, "max_rate": round(link_rate)}
        limits["link"] = (link_rate, "link.rate.mbps")
    where = min(limits, key=lambda k: limits[k][0])
    out["max_rate"] = round(limits[where][0])
    out["bottleneck"] = limits[where][1]
    out["fits"] = all(d.fits for d in decisions.values()) and rate <= limits[where][0]
    per_datagram = measured.records_per_datagram
    for s in sides:
        out["sysctl"] += [{"name": n, "now": now, "set": want, "why": why, "side": s}
                          for n, now, want, why in sysctl_advice(
                              s, rate * wire, rate / max(per_datagram, 1e-9),
                              facts.get("sysctl", {}))]
    out["pacing"] = pacing_advice(facts, t.link.rate_mbps) if "sender" in sides else None
    return out


def table(advice: dict) -> str:
    """The plan as a table, then what bounds it and what to change on the machine."""
    a = advice
    lines = [f"{a['rate']:,.0f} records/s of {a['record_bytes']:g} bytes, measured here at "
             f"{a['measured']['rate']:,} records/s ({a['measured']['records_per_datagram']:g} "
             f"per datagram) on {a['measured']['brokers']}; every core under "
             f"{a['utilisation']:.0%}" + ("; both sides share this machine" if
                                          a["shared_machine"] else "") +
             (f"; the {a['side']} side only" if a.get("side", "both") != "both" else ""),
             # (a stage's CPU time per record and per datagram; its load at the target rate
             # in cores, all its instances together; the CPUs its workers are pinned to)
             f"{'stage':<24} {'CPU µs per record':>17}  {'CPU µs per datagram':>19}  "
             f"{'cores busy at target':>20}  {'instances':>9}  on CPUs"]
    for side in SIDES:
        for stage in PIPELINES[side]:
            p = a["stages"].get(stage)
            if p is None:
                continue
            lines.append(f"{side + '/' + stage:<24} {p['cost_us_per_record']:>17.2f}  "
                         f"{p['cost_us_per_datagram']:>19.1f}  {p['load_at_target']:>20.2f}  "
                         f"{p['instances']:>9}  {','.join(map(str, p['cores']))}")
    if a["fits"]:
        lines.append(f"fits: up to about {a['max_rate']:,} records/s here (then "
                     f"{a['bottleneck']} is the limit)")
    else:
        lines.append(f"does NOT fit: at most about {a['max_rate']:,} records/s here, limited "
                     f"by {a['bottleneck']}; the plan above is for that rate")
    for c in a["sysctl"]:
        lines.append(f"{c['side']}: sysctl -w {c['name']}={c['set']}  (now {c['now']}: "
                     f"{c['why']})")
    if a.get("pacing"):
        lines.append(f"sender: {a['pacing']}")
    p = a.get("partitions")
    if p is not None:
        lines += partitions.lines(p) if p["partitions"] is not None else \
            [f"partitions: not known ({p['why']})"]
    return "\n".join(lines)


# -- --verify ------------------------------------------------------------------------------------

def _core_of(title: str, settings: dict) -> list:
    """The cores a worker ("receiver/unpacker-1") runs on under `settings` of its stage."""
    index = int(title.rsplit("-", 1)[1])
    cpus = settings["cpus"]
    return [cpus[index % len(cpus)]] if settings.get("pin.per.instance") else list(cpus)


def verify(bench: Bench, advice: dict, mix: list, seconds: float = VERIFY_SECONDS) -> dict:
    """Run the proposed topology at the rate it was planned for (the target, or the highest
    rate that fits) and compare: records/s achieved against asked, and each core's load (the
    pipeline's workers' CPU, by the core each is pinned to) against predicted."""
    rate = min(advice["rate"], advice["max_rate"])
    # (a side not planned, with --side, runs one instance of each stage and is not compared)
    stages = {side: advice["topology"].get(side) or one_instance(side) for side in SIDES}
    window = bench.window(stages, rate, mix, seconds)
    measured_core: dict = {}
    for title, cpu in window.worker_cpu.items():
        side, rest = title.split("/")
        if side not in advice["topology"]:
            continue
        stage = rest.rsplit("-", 1)[0]
        cores = _core_of(title, stages[side][stage])
        for c in cores:  # a worker on several cores: its load shared among them
            key = c if advice["shared_machine"] else f"{side}:{c}"
            measured_core[key] = measured_core.get(key, 0.0) + cpu / window.seconds / len(cores)
    predicted_core: dict = {}
    for stage, p in advice["stages"].items():
        settings = stages[p["side"]][stage]
        share = rate * p["cost_us_per_record"] * 1e-6 / p["instances"]
        for i in range(p["instances"]):
            cores = _core_of(f"{p['side']}/{stage}-{i}", settings)
            for c in cores:
                key = c if advice["shared_machine"] else f"{p['side']}:{c}"
                predicted_core[key] = predicted_core.get(key, 0.0) + share / len(cores)
    achieved = window.rate
    busiest = max(predicted_core, key=predicted_core.get)
    checks = {"rate": achieved / rate - 1,
              "total load": sum(measured_core.values()) / sum(predicted_core.values()) - 1,
              "busiest core": measured_core.get(busiest, 0.0) / predicted_core[busiest] - 1}
    return {"rate": rate, "achieved": round(achieved), "missing": window.missing,
            "seconds": round(window.seconds, 1),
            "cores": {str(c): {"predicted": round(predicted_core.get(c, 0.0), 3),
                               "measured": round(measured_core.get(c, 0.0), 3)}
                      for c in sorted(set(predicted_core) | set(measured_core), key=str)},
            "errors": {k: round(v, 3) for k, v in checks.items()},
            "within": all(abs(v) <= VERIFY_TOLERANCE for v in checks.values())
            and window.missing == 0}


def busy_cores(machine, limit: float) -> str:
    """Why no rate fits: what else runs here already holds every core at the limit."""
    loads = ", ".join(f"{c}: {machine.busy.get(c, 0.0):.0%}" for c in machine.cores)
    return (f"no rate fits on this machine now: other processes already keep every core "
            f"this process may use at or over {limit:.0%} ({loads}); run diode tune when "
            f"they are done, or on the host the side will run on")


def verify_table(v: dict) -> str:
    lines = [f"verify: asked {v['rate']:,.0f} records/s, achieved {v['achieved']:,} over "
             f"{v['seconds']:g} s ({v['errors']['rate']:+.0%}), {v['missing']} reported missing",
             f"  {'CPU':<12} {'predicted % busy':>16} {'measured % busy':>15}"]
    for core, c in v["cores"].items():
        lines.append(f"  {core:<12} {c['predicted']:>16.1%} {c['measured']:>15.1%}")
    lines.append(f"  total load {v['errors']['total load']:+.0%}, busiest core "
                 f"{v['errors']['busiest core']:+.0%} against the prediction: " +
                 ("within" if v["within"] else "NOT within") +
                 f" {VERIFY_TOLERANCE:.0%}")
    return "\n".join(lines)


# -- the command ---------------------------------------------------------------------------------

def measurable_rate(t, mix: list) -> float:
    """The highest rate a measurement runs at: half of what this machine's receiver was
    estimated to take (diode.tune.capacity, its own code without brokers) and half of what this
    process can produce, so that the pipeline measured is busy but never saturated (a
    saturated stage's cost per record is not its cost at the rate). Costs measured below the
    target are a little higher per record than at it (smaller batches): the plan errs on the
    safe side."""
    from diode.soak.traffic import Records, cost_per_record, mean_size
    from diode.tune.capacity import measure_receiver
    limits = [0.5 / cost_per_record(Records(["tune"], 8, mix, 1), 5000)]
    try:
        est = measure_receiver(t, int(mean_size(mix)))
        limits.append(0.5 * est.max_datagrams_per_second()[0] * est.records_per_datagram)
    except ValueError:  # records larger than a datagram: fragments; the producer bounds it
        pass
    return min(limits)


def _rate(text: str, mean_size: float) -> float:
    from diode.soak.traffic import Rate
    return Rate.parse(text, mean_size).records_per_second


def partition_advice(t, given: int | None, bench: Bench, plan: dict) -> dict:
    """diode.tune.partitions' advice for the partition count given (--partitions), else the
    source's (read where the measurement ran on the topology's own source cluster), with the
    instances the plan proposes; {"partitions": None, "why": ...} when there is no count."""
    if given is not None:
        count, where = given, "--partitions"
    elif bench.started or bench.side == "receiver":
        why = ("the receiving host does not reach the source cluster" if bench.side ==
               "receiver" else "measured on embedded brokers of its own, not on the topology's "
               "source cluster")
        return {"partitions": None, "why": f"{why}; --partitions N says what N changes"}
    else:
        try:
            count, where = partitions.count(t), "the sender's topics on the source cluster"
        except DiodeError as exc:  # (it answered the measurement: a lapse, not a reason to fail)
            return {"partitions": None, "why": str(exc)}
    readers, writers = (plan.get(side, {}).get(stage, {}).get("instances")
                        or t.stage(side, stage).instances
                        for side, stage in (("sender", "kafka_reader"),
                                            ("receiver", "kafka_writer")))
    return partitions.advise(t, count, where, partitions.checkpoint_cost(-(-count // writers))
                             if count else None, readers=readers, writers=writers)


def main(args) -> int:
    if args.live:
        return _live(args)
    if not args.topology:
        raise DiodeError("diode tune: give the topology (or --live for a running launch)")
    if args.rate is None:
        raise DiodeError("diode tune: --rate is required (records/s, or Mbit/s as 50mbps)")
    if args.partitions is not None and args.partitions < 0:
        raise DiodeError(f"diode tune: --partitions {args.partitions}: 0 or more")
    t = topo.for_this_host(topo.load(args.topology))
    text = Path(args.topology).read_text()
    raw = yaml.safe_load(text)
    say = (lambda m: print(f"diode tune: {m}", file=sys.stderr, flush=True)) if args.json \
        else (lambda m: print(f"diode tune: {m}", flush=True))
    side = None if args.side == "both" else args.side
    if args.sample and side == "receiver":
        raise DiodeError("--sample reads the sender's topics on the source cluster, which "
                         "--side receiver never asks (the receiving host does not reach it): "
                         "give --record-size, or sample on the sending host")
    if args.sample:
        say("sampling record sizes from the source topics")
        from diode.tune.measure import sample_sizes
        mix = sample_sizes(t)
    else:
        if args.record_size < 16:
            raise DiodeError(f"--record-size {args.record_size}: at least 16 bytes")
        mix = [(args.record_size, 1.0)]
    from diode.soak.traffic import mean_size
    rate = _rate(args.rate, mean_size(mix))
    machine, facts = read_machine(t.link.host)
    at = min(rate, measurable_rate(t, mix))
    with Bench(t, raw, args.broker_kind, side=side) as bench:
        say(f"measuring {f'the {side} side' if side else 'each stage'} at {at:,.0f} records/s "
            f"of {mean_size(mix):.0f} bytes on {bench.where} (about "
            f"{2 * (args.seconds + WARMUP_SECONDS + 4):.0f} s)")
        measured = measure(t, raw, mix, at, bench, args.seconds, say)
        advice = advise(t, measured, rate, machine, facts, args.utilisation, side=side)
        advice["partitions"] = partition_advice(t, args.partitions, bench, advice["topology"])
        new = edit.proposed_text(text, advice["topology"])
        advice["diff"] = edit.diff(args.topology, text, new)
        if args.verify and advice["max_rate"] < 1:
            # (every core is at the limit with what else runs here: no plan to run)
            advice["not_verified"] = busy_cores(machine, args.utilisation)
            say(f"not verifying: {advice['not_verified']}")
        elif args.verify:
            say(f"verifying the plan: {VERIFY_SECONDS:.0f} s of the proposed topology")
            advice["verify"] = verify(bench, advice, mix)
    if args.write and advice["diff"]:
        edit.write(args.topology, new)
    if args.json:
        print(json.dumps(advice, indent=1))
    else:
        print(table(advice))
        print(advice["diff"] or "the topology already has this plan", end="")
        if args.write and advice["diff"]:
            print(f"written to {args.topology}")
        if "verify" in advice:
            print(verify_table(advice["verify"]))
    ok = advice["fits"] and advice.get("verify", {}).get("within", True)
    return 0 if ok else 1


def _live(args) -> int:
    run_dir = live.find(args.topology, args.run_dir)
    first = live.snapshot(run_dir)
    time.sleep(args.seconds)
    advice = live.advise(first, live.snapshot(run_dir), args.utilisation)
    if not advice["stages"]:
        raise DiodeError(f"no worker metrics in {run_dir}/metrics")
    print(json.dumps(advice, indent=1) if args.json else live.table(advice))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "tune", help="measure each stage's CPU here and say how many instances of each, on "
        "which cores, a rate needs (exit 1: it does not fit); --live advises a running launch")
    p.add_argument("topology", nargs="?", help="the topology file (with --live: which launch)")
    p.add_argument("--rate", help="target records per second (50000) or Mbit/s (400mbps)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--record-size", type=int, default=200,
                      help="record bytes to measure with (default 200)")
    size.add_argument("--sample", action="store_true", help="sample record sizes from the "
                      "sender's topics on the source cluster instead")
    p.add_argument("--side", choices=("sender", "receiver", "both"), default="both",
                   help="measure and plan that side only, on this host, its host: only that "
                   "side's cluster is asked (at both ends of the pipeline measured), the "
                   "other's never (across a diode each host reaches its own); default both, "
                   "which needs both clusters or embedded brokers")
    p.add_argument("--partitions", type=int, default=None, metavar="N",
                   help="the source partitions to plan for (default: the sender's topics' on "
                   "the source cluster, when the measurement runs there): what heartbeats, "
                   "writers and checkpoints cost at that count")
    p.add_argument("--utilisation", type=float, default=UTILISATION,
                   help=f"highest load of any core (default {UTILISATION})")
    p.add_argument("--write", action="store_true", help="apply the plan to the topology file, "
                   "keeping its comments and layout")
    p.add_argument("--verify", action="store_true", help="run the proposed topology briefly and "
                   "compare achieved with predicted rate and per-core load (exit 1 beyond 25 %%)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--broker-kind", choices=("kafka", "tansu"), help="embedded brokers to "
                   "measure on when the topology's clusters do not answer (default: the "
                   "topology's brokers: kind, else tansu)")
    p.add_argument("--seconds", type=float, default=None,
                   help=f"measurement window (default {MEASURE_SECONDS:g}; with --live 5)")
    p.add_argument("--live", action="store_true", help="advise a running launch from its "
                   "metrics: which stage to widen or narrow")
    p.add_argument("--run-dir", help="with --live: the launch's run directory (default: the "
                   "one running launch)")
    p.set_defaults(func=_defaults_then_main)


def _defaults_then_main(args) -> int:
    if args.seconds is None:
        args.seconds = 5.0 if args.live else MEASURE_SECONDS
    return main(args)
