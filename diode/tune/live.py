"""`diode tune --live`: which stage of a running launch to widen or narrow, from its own
metrics (each worker's metrics file and the supervisor's status, diode.runtime.launches), read twice
some seconds apart:

- a stage's load is the CPU its instances used per second (cores' worth); it needs
  ceil(load / limit) instances to keep each under the utilisation limit: more than it has is
  "widen", fewer is "narrow" (a core freed). udp_reader and udp_sender cannot be widened:
  over the limit, they bound the rate;
- an instance far above its siblings carries more partitions (they are split by hash);
- output blocked: the time a stage's next stage took nothing (backpressure): the next stage
  is the slower; queued: the messages waiting at its output now;
- datagrams the receiver's socket dropped, the journal's unforwarded bytes and the writers'
  backlog say where records wait.

`advise` is pure: two snapshots in, the advice out.
"""

import math
import time
from pathlib import Path

from diode.runtime import launches
from diode.errors import DiodeError
from diode.runtime.metrics import read_counter
from diode.runtime.topology import PIPELINES, SINGLE_INSTANCE
from diode.tune.decide import UTILISATION

# per worker, the metrics read (counters and gauges alike: read_counter sums samples)
WORKER_METRICS = ("cpu_seconds", "output_blocked_seconds", "output_queue_messages", "records",
                  "datagrams")
SIDE_METRICS = {"socket_drops": ("receiver", "udp_reader"),
                "journal_unforwarded_bytes": ("receiver", "udp_reader"),
                "backlog_records": ("receiver", "kafka_writer"),
                "pending_records": ("receiver", "kafka_writer"),
                "inflight_records": ("sender", "kafka_reader")}
BLOCKED = 0.3  # a stage whose output waits this share of the time is held up by the next


def snapshot(run_dir: str) -> dict:
    """What the launch's workers say now: {"t", "workers": {name: {side, stage, index, pid?,
    metric: value}}, "totals": {metric: sum}}."""
    status = launches.read_status(run_dir) or {}
    pids = {w["name"]: w for w in status.get("workers", [])}
    workers, totals = {}, {}
    for name, text in launches.worker_metrics(run_dir).items():
        side, stage, index = launches.split_name(name)
        w = {"side": side, "stage": stage, "index": index,
             "state": pids.get(name, {}).get("state", "running"),
             "restarts": pids.get(name, {}).get("restarts", 0),
             **{m: read_counter(text, m) for m in WORKER_METRICS}}
        workers[name] = w
        for metric, (s, st) in SIDE_METRICS.items():
            if (side, stage) == (s, st):
                totals[metric] = totals.get(metric, 0.0) + read_counter(text, metric)
    return {"t": time.monotonic(), "workers": workers, "totals": totals,
            "sides": status.get("sides", [])}


def _need(stage: str, load: float, limit: float) -> int | None:
    if stage in SINGLE_INSTANCE:
        return 1 if load <= limit else None
    return max(1, math.ceil(load / limit - 1e-9))


def advise(before: dict, after: dict, limit: float = UTILISATION) -> dict:
    """From two snapshots of one launch: per stage its load, instances and what to do; per
    side its rate; and notes on drops and queues."""
    dt = after["t"] - before["t"]
    if dt <= 0:
        raise ValueError("the snapshots must be apart in time")
    stages: dict = {}
    records = {}
    for name, w in after["workers"].items():
        b = before["workers"].get(name)
        if b is None or w["restarts"] != b["restarts"]:
            continue  # restarted between the snapshots: its counters began again
        util = max(0.0, w["cpu_seconds"] - b["cpu_seconds"]) / dt
        blocked = max(0.0, w["output_blocked_seconds"] - b["output_blocked_seconds"]) / dt
        s = stages.setdefault(w["stage"], {"side": w["side"], "instances": 0, "load": 0.0,
                                           "busiest": 0.0, "blocked": 0.0, "queued": 0,
                                           "records": 0.0})
        s["queued"] += int(w.get("output_queue_messages", 0))
        s["instances"] += 1
        s["load"] += util
        s["busiest"] = max(s["busiest"], util)
        s["blocked"] = max(s["blocked"], min(1.0, blocked))
        s["records"] += max(0.0, w["records"] - b["records"]) / dt
    for side, first, last in (("sender", "kafka_reader", None),
                              ("receiver", None, "kafka_writer")):
        counted = stages.get(first or last)
        if counted:
            records[side] = counted["records"]
    notes = []
    for stage, s in stages.items():
        order = PIPELINES[s["side"]]
        rate = records.get(s["side"], 0.0)
        # (below 100 records/s the idle loops would be most of it)
        s["cost_us_per_record"] = round(s["load"] / rate * 1e6, 2) if rate >= 100 else None
        need = _need(stage, s["load"], limit)
        if need is None:
            s["advice"] = (f"at {s['load']:.0%} of a core: one process only (one socket), so "
                           "it bounds the rate")
        elif need > s["instances"]:
            s["advice"] = f"widen to {need} instances"
        elif need < s["instances"]:
            s["advice"] = f"narrow to {need} instances (frees a core)"
        else:
            s["advice"] = "keep"
        s["want"] = need
        if s["instances"] > 1 and s["busiest"] > limit and s["load"] / s["instances"] < limit:
            notes.append(f"{s['side']}/{stage}: one instance at {s['busiest']:.0%} of a core "
                         f"while the stage averages {s['load'] / s['instances']:.0%}: its "
                         "partitions carry more (partitions are split by hash); more "
                         "partitions, or fewer instances, even it out")
        i = order.index(stage)
        if s["blocked"] >= BLOCKED and i + 1 < len(order):
            notes.append(f"{s['side']}/{stage} waited on {order[i + 1]} {s['blocked']:.0%} of "
                         f"the time: {order[i + 1]} is the slower")
    t0, t1 = before["totals"], after["totals"]
    drops = t1.get("socket_drops", 0) - t0.get("socket_drops", 0)
    if drops > 0:
        notes.append(f"the receiver's socket dropped {drops:.0f} datagrams in {dt:.0f} s "
                     "(reported missing): the udp_reader fell behind, or the socket buffer is "
                     "too small for the link's bursts (net.core.rmem_max; diode tune names the "
                     "value)")
    queued = t1.get("journal_unforwarded_bytes", 0)
    if queued > 0 and queued >= t0.get("journal_unforwarded_bytes", 0):
        notes.append(f"{queued / 2 ** 20:.1f} MiB of datagrams wait in the journal for the "
                     "unpackers and writers (growing or steady): they are behind the link")
    backlog = t1.get("backlog_records", 0)
    if backlog > 0 and backlog >= t0.get("backlog_records", 0):
        notes.append(f"{backlog:.0f} records wait for the destination cluster: it takes them "
                     "slower than the link brings them")
    return {"seconds": round(dt, 1), "utilisation": limit,
            "records_per_second": {k: round(v) for k, v in records.items()},
            "stages": {k: {**v, "load": round(v["load"], 3), "busiest": round(v["busiest"], 3),
                           "blocked": round(v["blocked"], 3), "records": round(v["records"])}
                       for k, v in stages.items()},
            "socket_drops": drops, "notes": notes}


def find(topology: str | None, run_dir: str | None) -> str:
    """The run directory of the launch to read: `run_dir`, or the one running launch (of
    `topology`, if given); DiodeError naming what is running when that is not one."""
    if run_dir:
        if not Path(run_dir, launches.METRICS_DIR).is_dir():
            raise DiodeError(f"{run_dir} has no {launches.METRICS_DIR}/: not a launch's run "
                             "directory")
        return run_dir
    found = launches.running(topology)
    if not found:
        raise DiodeError("no diode launch is running" + (f" for {topology}" if topology else "")
                         + " (none in the process table); start one, or give its --run-dir")
    if len(found) > 1:
        listed = "; ".join(f"pid {e['pid']} {e['topology']} ({'+'.join(e['sides'])}) "
                           f"run dir {e['run_dir']}" for e in found)
        raise DiodeError(f"{len(found)} launches are running: {listed}. Name one with "
                         "--run-dir")
    return found[0]["run_dir"]


def table(advice: dict) -> str:
    lines = [f"over {advice['seconds']:g} s: " + ", ".join(
        f"{side} {r:,} records/s".replace(",", " ")
        for side, r in advice["records_per_second"].items()),
        # (CPU: the stage's, all instances together, and its busiest instance's; blocked: the
        # share of the time the next stage took nothing; queued: messages waiting for it)
        f"{'stage':<24} {'instances':>9}  {'CPU % of one core':>17}  "
        f"{'busiest instance CPU %':>22}  {'% of time blocked':>17}  {'messages queued':>15}  "
        f"{'CPU µs per record':>17}  {'records/s':>9}  advice"]
    for side in PIPELINES:
        for stage in PIPELINES[side]:
            s = advice["stages"].get(stage)
            if s is None:
                continue
            cost = "-" if s["cost_us_per_record"] is None else f"{s['cost_us_per_record']:.2f}"
            rate = f"{s['records']:,.0f}".replace(",", " ") if s["records"] else "-"
            lines.append(f"{side + '/' + stage:<24} {s['instances']:>9}  {s['load']:>17.0%}  "
                         f"{s['busiest']:>22.0%}  {s['blocked']:>17.0%}  {s['queued']:>15}  "
                         f"{cost:>17}  {rate:>9}  {s['advice']}")
    lines += [f"- {n}" for n in advice["notes"]]
    return "\n".join(lines)
