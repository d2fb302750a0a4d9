"""`diode tune`'s decision: instances per stage and a core for each worker, from each stage's
CPU cost per record, a target rate and the machine's cores. Pure: no clock, no I/O.

The rule (the CPU guidance, docs/tuning.md):

- a stage's load at the target is rate × cost: that many cores' worth of work, shared by its
  instances; each instance's share must stay under the utilisation limit (70 % of a core by
  default), so a stage gets ceil(load / limit) instances. udp_sender and udp_reader are one
  process each (one socket, one flow on the link): their load alone bounds the rate;
- the UDP reader gets a core to itself, away from the NIC's interrupt cores when there is
  one to spare: a datagram it does not read in time is lost;
- the other workers are packed onto the remaining cores, heaviest first, onto the least loaded
  core (busy cores count with the load they already carry), each core under the limit;
- each side is decided for its own machine, or both together when they share one (a link on
  loopback); when the target does not fit, the highest rate that does (found by bisection) and
  the stage or resource that stops it are reported.
"""

import math
from dataclasses import dataclass, field

from diode.runtime.topology import PIPELINES, SINGLE_INSTANCE

UTILISATION = 0.7
MAX_INSTANCES = 64
# what a decision places: one side's stages, or both sides' on one machine
STAGES = {**PIPELINES, "both": PIPELINES["sender"] + PIPELINES["receiver"]}


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
    side: str                  # "sender", "receiver" or "both" (one machine)
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
    for stage in STAGES[side]:
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
    best, bottleneck = max_rate(side, costs, machine, limit)
    if plans is not None:
        return Decision(side, rate, True, plans, core_load, best, bottleneck)
    at_best, best_load, _ = place(side, costs, best, machine, limit) if best > 0 else ({}, {},
                                                                                    "")
    return Decision(side, rate, False, at_best or {}, best_load, best, why or bottleneck)


def max_rate(side: str, costs: dict, machine: Machine, limit: float) -> tuple[float, str]:
    """The highest rate that places (records/s, to 0.5 %), and what fails just above it."""
    total = sum(costs[s] for s in STAGES[side]) * 1e-6
    high = limit * len(machine.cores) / max(total, 1e-12) * 1.01  # above anything that fits
    low = 0.0
    while high - low > max(1.0, high * 0.005):
        mid = (low + high) / 2
        if place(side, costs, mid, machine, limit)[0] is not None:
            low = mid
        else:
            high = mid
    return low, place(side, costs, high, machine, limit)[2]
