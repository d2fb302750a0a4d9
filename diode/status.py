"""`diode status [TOPOLOGY]`: the running launches at a glance.

Every launch running on this host is found in the process table, whoever started it and from
wherever (a launch of the systemd unit, run directory /run/diode/SIDE-NAME, as well as one
started by hand), and a run directory given by name is read directly (diode.runtime.launches);
its supervisor's status file gives every worker's state, pid, CPUs and restarts, and the
workers' metrics (textfiles, or the side's Prometheus endpoint when the textfiles are off), read
twice a moment apart, give their rates.
Per launch: the workers (state, pid, pinned CPUs and the CPU each last ran on, restarts,
records/s or datagrams/s, bytes/s, CPU % of one core, and why one is in backoff, exited or
fatal), per side the records it counted since its workers started and a second (read and sent
on the sender, received and written on the receiver), the link (age of the sender's
last heartbeat, whether the sender said it stopped cleanly, sender sessions, datagrams the
socket dropped and the receiver rejected), the key ids the receiver accepts, the
destination (backlog, journal), the missing
ranges reported in the last hour, the resend tickets (open, the oldest's age, closed and the mean
time to repair), per source topic how far behind it the receiver is, what it
still holds and the missing records at risk, and per source partition the incarnations (topic
ids) the receiver holds state for, as of its writers' last checkpoints. A launch whose run
directory this user may not read is shown with where it runs and why no more. Exit 1 when
nothing runs, or a run directory named has no launch running (`--json` prints `[]` when
nothing runs, so a script reads one shape either way).
"""

import json
import sys
import time
import urllib.request
from pathlib import Path

from diode.accounting import reasons
from diode.errors import DiodeError
from diode.runtime import launches, statedir
from diode.runtime.metrics import read_counter, samples

RATE_OF = {"kafka_reader": "records", "packer": "datagrams", "udp_sender": "datagrams",
           "udp_reader": "datagrams", "unpacker": "records", "kafka_writer": "records"}
BYTES_OF = ("packer", "udp_sender", "udp_reader")  # the stages that count datagram bytes
# Per side, what its records are counted as (cumulative, since each worker started) and by
# which stage: read and sent on the sender, received and written on the receiver.
COUNTED = {"sender": (("read", "kafka_reader"), ("sent", "udp_sender")),
           "receiver": (("received", "unpacker"), ("written", "kafka_writer"))}


def _texts(entry: dict, topology) -> list[str]:
    """The launch's metrics as Prometheus text: its workers' textfiles, else its endpoints."""
    texts = list(launches.worker_metrics(entry["run_dir"]).values())
    if texts or topology is None:
        return texts
    for side in entry["sides"]:
        listen = getattr(topology, side).metrics_listen
        if listen:
            try:
                with urllib.request.urlopen(f"http://{listen}/metrics", timeout=5) as r:
                    texts.append(r.read().decode())
            except OSError:
                pass
    return texts


def _per_worker(texts: list[str], name: str) -> dict:
    """(side, stage, index) -> the metric's value, summed over samples."""
    out: dict = {}
    names = (f"diode_{name}", f"diode_{name}_total")
    for full, labels, value in samples(texts):
        if full in names:
            key = tuple(labels.get(k, "") for k in ("side", "stage", "index"))
            out[key] = out.get(key, 0.0) + value
    return out


def per_topic(texts, name: str, label: str = "topic") -> dict:
    """topic (or the value of `label`) -> the metric's value summed over workers (its samples
    labelled by topic)."""
    out: dict = {}
    for full, labels, value in samples(texts):
        if full == f"diode_{name}" and label in labels:
            out[labels[label]] = out.get(labels[label], 0.0) + value
    return out


def snapshot(entry: dict, topology=None) -> dict:
    texts = _texts(entry, topology)
    return {"t": time.monotonic(), "texts": texts,
            **{m: _per_worker(texts, m) for m in ("records", "datagrams", "bytes",
                                                  "cpu_seconds")}}


def count(number: float) -> str:
    """A count with its thousands apart: 1 234 567."""
    return f"{number:,.0f}".replace(",", " ")


def byte_rate(per_second: float) -> str:
    """Bytes a second in decimal units: 950 B/s, 12.3 MB/s."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if per_second >= size:
            return f"{per_second / size:.1f} {unit}/s"
    return f"{per_second:.0f} B/s"


def _side_counts(side: str, workers: list, after: dict, dt: float, before: dict) -> dict:
    """The side's records as each counting stage counted them, in all and a second."""
    out = {}
    for what, stage in COUNTED[side]:
        keys = [k for k in after["records"] if k[0] == side and k[1] == stage]
        out[f"records_{what}"] = int(sum(after["records"][k] for k in keys))
        out[f"records_{what}_per_second"] = round(sum(
            max(0.0, after["records"][k] - before["records"].get(k, 0.0)) for k in keys) / dt, 1)
    stage = "udp_sender" if side == "sender" else "udp_reader"
    out["bytes_per_second"] = round(sum(w.get("bytes_per_second", 0.0) for w in workers
                                        if w["side"] == side and w["stage"] == stage), 1)
    return out


def launch_status(entry: dict, before: dict, after: dict, topology=None) -> dict:
    """What `diode status` shows of one launch, from two snapshots (and its topology's
    checkpoints)."""
    import psutil
    if entry.get("unreadable"):
        return unreadable(entry)
    dt = max(1e-6, after["t"] - before["t"])
    status = launches.read_status(entry["run_dir"]) or {}
    workers = []
    for w in status.get("workers", []):
        key = (w["side"], w["stage"], str(w["index"]))
        metric = RATE_OF.get(w["stage"], "records")
        rate = max(0.0, after[metric].get(key, 0.0) - before[metric].get(key, 0.0)) / dt
        cpu = max(0.0, after["cpu_seconds"].get(key, 0.0) -
                  before["cpu_seconds"].get(key, 0.0)) / dt
        try:
            on = psutil.Process(w["pid"]).cpu_num() if w["pid"] else None
        except psutil.Error:
            on = None
        moved = {f"{metric}_per_second": round(rate, 1)}
        if w["stage"] in BYTES_OF:
            moved["bytes_per_second"] = round(max(0.0, after["bytes"].get(key, 0.0) -
                                                  before["bytes"].get(key, 0.0)) / dt, 1)
        workers.append({**w, "on_cpu": on, **moved, "cpu_percent": round(100 * cpu, 1)})
    texts = after["texts"]

    def total(name, **labels):
        return read_counter(texts, name, **labels)

    receiver = "receiver" in entry["sides"]
    heartbeat = [v for full, _, v in samples(texts)
                 if full == "diode_link_heartbeat_age_seconds"]
    sessions = [v for full, _, v in samples(texts) if full == "diode_sessions_active"]
    return {
        "pid": entry["pid"], "topology": entry["topology"], "name": entry["name"],
        "sides": entry["sides"], "run_dir": entry["run_dir"],
        "up_seconds": round(time.time() - entry["started"]),
        "workers": workers,
        "keys": status.get("keys"),
        "link": {"heartbeat_age_seconds": min(heartbeat) if heartbeat else None,
                 "sender_stopped": total("sender_stopped") > 0,
                 "sessions": int(max(sessions)) if sessions else None,
                 "socket_drops": int(total("socket_drops")),
                 "rejected": int(total("rejects", side="receiver")),
                 "missing_records": int(total("missing_records")),
                 "expired_records": int(total("missing_expired_records")),
                 "missing_ranges": int(total("missing_ranges"))} if receiver else None,
        "destination": {"backlog_records": int(total("backlog_records")),
                        "journal_bytes": int(total("journal_bytes")),
                        "journal_unforwarded_bytes": int(total("journal_unforwarded_bytes"))}
        if receiver else None,
        "tickets": {"open": int(total("tickets_open")),
                    "oldest_age_seconds": max(_per_worker(after["texts"],
                                                          "ticket_oldest_age_seconds").values(),
                                              default=0.0),
                    **{f"closed_{how}": int(total("tickets_closed", reason=how))
                       for how in reasons.TICKET_CLOSED},
                    "repair_seconds": total("ticket_repair_seconds")}
        if receiver else None,
        "missing_last_hour": {"ranges": int(total("missing_ranges_last_hour")),
                              "records": int(total("missing_records_last_hour"))}
        if receiver else None,
        "source": {t: {"lag_records": int(lag), "held_records": int(held.get(t, 0)),
                       "missing_at_risk_records": int(risk.get(t, 0))}
                   for lag, held, risk in [(per_topic(texts, "source_lag_records"),
                                            per_topic(texts, "source_held_records"),
                                            per_topic(texts, "missing_at_risk_records"))]
                   for t, lag in sorted(lag.items())} if receiver else None,
        "metadata": {"topics": per_topic(after["texts"], "metadata_synced_timestamp_seconds"),
                     "groups": per_topic(after["texts"], "group_synced_timestamp_seconds",
                                         "group")} if receiver else None,
        "source_state": statedir.held(topology.resolve(topology.receiver.journal_dir))
        if receiver and topology is not None and topology.receiver.journal_enabled else None,
        "sender": {**_side_counts("sender", workers, after, dt, before),
                   "inflight_records": int(total("inflight_records")),
                   "dead_letter_records": int(total("dead_letter_records"))}
        if "sender" in entry["sides"] else None,
        "receiver": _side_counts("receiver", workers, after, dt, before) if receiver else None,
    }


def unreadable(entry: dict) -> dict:
    """What can be shown of a launch whose run directory this user may not read: where it
    runs and how to see more."""
    try:
        group = f" ({Path(entry['run_dir']).group()})"
    except (OSError, KeyError):
        group = ""
    return {"pid": entry["pid"], "topology": entry["topology"], "name": entry["name"],
            "sides": entry["sides"], "run_dir": entry["run_dir"],
            "up_seconds": round(time.time() - entry["started"]), "workers": [],
            "unreadable": f"{entry['unreadable']}: run diode status as root, or as a member "
                          f"of the run directory's group{group}",
            **dict.fromkeys(("keys", "link", "destination", "tickets", "missing_last_hour",
                             "source", "metadata", "source_state", "sender", "receiver"))}


def _age(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def render(s: dict) -> str:
    lines = [f"{s['name'] or Path(s['topology']).stem} ({s['topology']}): "
             f"{'+'.join(s['sides'])}, supervisor pid {s['pid']}, up {_age(s['up_seconds'])}, "
             f"run dir {s['run_dir']}"]
    if s.get("unreadable"):
        return "\n".join([*lines, f"  cannot read its run directory: {s['unreadable']}"])
    lines.append(f"  {'worker':<26} {'state':<9} {'pid':>7} {'cpus':<7} {'on':>3} "
                 f"{'restarts':>8} {'rate':>20} {'bytes':>10} {'CPU % of one core':>17}")
    for w in s["workers"]:
        cpus = ",".join(map(str, w["cpus"])) or "all"
        on = "-" if w["on_cpu"] is None else str(w["on_cpu"])
        unit = next(k for k in w if k.endswith("_per_second") and k != "bytes_per_second")
        rate = f"{count(w[unit])} {unit.removesuffix('_per_second')}/s"
        moved = byte_rate(w["bytes_per_second"]) if "bytes_per_second" in w else "-"
        lines.append(f"  {w['name']:<26} {w['state']:<9} {w['pid'] or '-':>7} {cpus:<7} "
                     f"{on:>3} {w['restarts']:>8} {rate:>20} {moved:>10} "
                     f"{w['cpu_percent']:>16.0f}%")
        if w.get("message"):  # why it is in backoff, exited or fatal
            lines.append(f"    {w['message']}")
    if s.get("receiver") is not None:
        r = s["receiver"]
        lines.append(f"  receiver, since its workers started: {count(r['records_received'])} "
                     f"records received ({count(r['records_received_per_second'])} records/s, "
                     f"{byte_rate(r['bytes_per_second'])} of datagrams), "
                     f"{count(r['records_written'])} written "
                     f"({count(r['records_written_per_second'])} records/s)")
    if s["link"] is not None:
        k = s["link"]
        age = "never" if k["heartbeat_age_seconds"] is None else \
            f"{k['heartbeat_age_seconds']:.1f} s ago"
        stopped = "the sender stopped (clean stop), " if k.get("sender_stopped") else ""
        lines.append(f"  link: {stopped}last heartbeat {age}, {k['sessions'] or 0} sender "
                     f"session(s); "
                     f"{k['socket_drops']} datagrams dropped by the socket, {k['rejected']} "
                     f"rejected; {k['missing_records']} records reported missing in all "
                     f"({k['missing_ranges']} ranges), {k['expired_records']} of them expired "
                     f"at the source")
        if s.get("keys"):
            lines.append(f"  keys: the receiver accepts key id(s) "
                         f"{', '.join(map(str, s['keys']['accepted']))} (current "
                         f"{s['keys']['current']})")
        d = s["destination"]
        lines.append(f"  destination: {d['backlog_records']} records waiting for the cluster; "
                     f"journal {d['journal_bytes'] / 2 ** 20:.1f} MiB "
                     f"({d['journal_unforwarded_bytes'] / 2 ** 20:.1f} MiB not yet forwarded)")
        m = s["missing_last_hour"]
        lines.append(f"  missing in the last hour: {m['ranges']} ranges, {m['records']} records")
        t = s["tickets"]
        repaired = f", {t['repair_seconds'] / t['closed_filled']:.0f} s to repair on average" \
            if t["closed_filled"] else ""
        lines.append(f"  resend tickets: {t['open']} open"
                     + (f" (the oldest {_age(t['oldest_age_seconds'])} old)" if t["open"] else "")
                     + f"; closed {t['closed_filled']} filled{repaired}, {t['closed_expired']} "
                     f"expired, {t['closed_untracked']} untracked (diode tickets)")
        for topic, src in (s.get("source") or {}).items():
            lines.append(f"  source {topic}: {src['lag_records']} records behind, "
                         f"{src['held_records']} still held there (as the sender last looked); "
                         f"{src['missing_at_risk_records']} missing records at risk")
        now = time.time()
        for kind, what in (("topics", "metadata of {} synced"),
                           ("groups", "group {} offsets synced")):
            for name, at in sorted(((s.get("metadata") or {}).get(kind) or {}).items()):
                lines.append(f"  {what.format(name)} {_age(max(0.0, now - at))} ago")
    if s.get("source_state") is not None:
        held = s["source_state"]
        lines.append(f"  state held for {len(held)} source partition(s), as of the last "
                     "checkpoints:" if held else "  state held: none checkpointed yet")
        lines += [f"    {line}" for line in statedir.held_lines(held)]
    if s["sender"] is not None:
        r = s["sender"]
        lines.append(f"  sender, since its workers started: {count(r['records_read'])} records "
                     f"read ({count(r['records_read_per_second'])} records/s), "
                     f"{count(r['records_sent'])} sent ({count(r['records_sent_per_second'])} "
                     f"records/s, {byte_rate(r['bytes_per_second'])} of datagrams)")
        lines.append(f"  sender: {count(r['inflight_records'])} records sent, not yet "
                     f"committed; {count(r['dead_letter_records'])} to the dead-letter topic")
    return "\n".join(lines)


def main(args) -> int:
    from diode.runtime import topology as topo
    found = launches.running(args.topology, args.run_dir or ())
    idle = [d for d in args.run_dir or ()
            if not any(Path(e["run_dir"]).resolve() == Path(d).resolve() for e in found)]
    for run_dir in idle:
        print(f"diode status: {launches.not_running(run_dir)}", file=sys.stderr)
    if not found:
        if args.json:
            print("[]")  # a script reads the same shape whether or not anything runs
        if not args.run_dir:
            print("diode status: no diode launch is running" +
                  (f" for {args.topology}" if args.topology else "") +
                  " (none in the process table; a launch in a run directory this user cannot "
                  "see the process of: --run-dir DIR)", file=sys.stderr)
        return 1
    topologies = {}
    for e in found:
        try:
            topologies[e["pid"]] = topo.load(e["topology"])
        except (OSError, DiodeError):
            topologies[e["pid"]] = None
    before = {e["pid"]: snapshot(e, topologies[e["pid"]]) for e in found}
    time.sleep(args.seconds)
    out = [launch_status(e, before[e["pid"]], snapshot(e, topologies[e["pid"]]),
                         topologies[e["pid"]]) for e in found]
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print("\n\n".join(render(s) for s in out))
    return 1 if idle else 0


def add_parser(sub) -> None:
    p = sub.add_parser("status", help="the running launches at a glance: workers, link, "
                       "destination, missing ranges (exit 1: none runs)")
    p.add_argument("topology", nargs="?", help="only the launches of this topology file")
    p.add_argument("--run-dir", action="append", metavar="DIR",
                   help="only the launch running in this run directory, read there even when "
                   "its process is not visible to this user (again for more than one)")
    p.add_argument("--seconds", type=float, default=1.0,
                   help="how long to watch for the rates (default 1)")
    p.add_argument("--json", action="store_true",
                   help="the same as JSON, a list of launches (`[]` when none runs); rates and "
                   "counts under keys that name their unit")
    p.set_defaults(func=main)
