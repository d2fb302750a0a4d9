"""What a run reports, the table per mode, the medians and the profiles' top frames."""

import os
import statistics
import sys

TITLES = {
    "e2e": "e2e: diode end to end against the one-process relay (from launch until the last "
           "record is in the destination)",
    "sender": "sender alone: `diode launch --side sender` into a counting UDP sink, against a "
              "plain consumer (from launch until the group's committed offsets reach the end)",
    "receiver": "receiver alone: a captured link replayed at `diode launch --side receiver`, "
                "against a plain producer (from the first datagram / record until the last "
                "record is in the destination)",
    "memory": "memory: every diode process's RSS over one stream through a reordering "
              "link-sim (from launch until the last record is in the destination)",
}


def run_result(system: str, meter, expected: int, started: float, end: dict, code,
               value_size: int, verify: dict | None = None, baseline: bool = False) -> dict:
    """What every measured run reports. `meter` counted progress; `verify` (--verify) is the
    exact count of distinct records read back after the run."""
    finished = meter.last_at or started
    received = min(meter.count, expected) if verify is None else verify["distinct"]
    cpu = end["cpu"]
    return {
        "system": system,
        "baseline": baseline,
        "expected": expected,
        "received": received,
        "counted": meter.count,
        "missing": expected - received,
        "duplicates": None if verify is None else verify["total"] - verify["distinct"],
        "seconds": finished - started,
        "seconds_first_to_last": (meter.last_at - meter.first_at) if meter.first_at else None,
        "value_bytes": received * value_size,
        "cpu_seconds": sum(cpu["per_process"].values()),
        # from the first records seen to the last: the cost per record without startup
        "steady_cpu_seconds": sum(cpu["per_process"].values()) - sum(
            end.get("cpu_first", cpu)["per_process"].values()),
        # (none when the meter first saw most of the records at once: a cold broker's first
        # answer came late, and the steady figures would describe a few records)
        "steady_records": _steady(meter.count - end.get("count_first", meter.count), expected),
        "cpu_per_process": cpu["per_process"],
        "broker_cpu_seconds": cpu["brokers"],
        "apart_cpu_seconds": cpu["apart"],
        "ended": end["ended"],
        "exit_code": code,
        "meter_tail_reads": getattr(meter, "tail_reads", None),
    }


def _steady(records: int, expected: int) -> int:
    return records if records >= expected / 2 else 0


def rate(r) -> tuple[float, float]:
    if not r["seconds"] or r["seconds"] <= 0:
        return 0.0, 0.0
    return r["received"] / r["seconds"], r["value_bytes"] / r["seconds"] / 1e6


def summarise(sizes: dict) -> dict:
    """Per size and system: median records/s and MB/s over the complete runs (over every run
    when none was complete)."""
    out = {}
    for size_name, rows in sizes.items():
        by_system: dict = {}
        for r in rows:
            by_system.setdefault(r["system"], []).append(r)
        out[size_name] = {}
        for system, runs in by_system.items():
            complete = [r for r in runs if not r["missing"]] or runs
            out[size_name][system] = {
                "baseline": runs[0]["baseline"],
                "records_per_second": statistics.median(rate(r)[0] for r in complete),
                "mb_per_second": statistics.median(rate(r)[1] for r in complete),
                "runs": [rate(r)[0] for r in runs],
                "steady_us_per_record": statistics.median(
                    [1e6 * r["steady_cpu_seconds"] / r["steady_records"] for r in complete
                     if r.get("steady_records")] or [0.0]),
                "incomplete_runs": sum(1 for r in runs if r["missing"]),
            }
    return out


def _baseline_of(rows, r):
    return next((b for b in rows if b["baseline"] and b.get("run") == r.get("run")), None)


def print_mode(mode: str, result: dict, value_bytes: dict, broker: str, file=sys.stdout):
    def p(line=""):
        print(line, file=file)

    p()
    p("== " + TITLES[mode])
    p("records/s and MB/s (value bytes) over that time; steady: first record to last; ratio: "
      "records/s against the baseline of the same run; µs/rec: CPU per record, startup "
      "included; steady µs: from the first records seen to the last.")
    p(f"{'size':<13} {'system':<20} {'records':>8} {'missing':>7} {'seconds':>7} "
      f"{'records/s':>10} {'MB/s':>6} {'steady/s':>9} {'CPU s':>6} {'µs/rec':>6} "
      f"{'steady µs':>9} {'ratio':>5}")
    for size_name, rows in result["sizes"].items():
        for r in rows:
            base = _baseline_of(rows, r)
            rps, mbps = rate(r)
            ratio = ""
            if base and r is not base and rate(base)[0]:
                ratio = f"{rps / rate(base)[0]:.2f}"
            steady = r["seconds_first_to_last"]
            steady = f"{r['received'] / steady:,.0f}" if steady else "-"
            per_rec = 1e6 * r["cpu_seconds"] / r["received"] if r["received"] else 0.0
            steady_us = (f"{1e6 * r['steady_cpu_seconds'] / r['steady_records']:.1f}"
                         if r.get("steady_records") else "-")
            label = f"{size_name} {value_bytes[size_name]} B"
            p(f"{label:<13} {r['system']:<20} {r['received']:>8} {r['missing']:>7} "
              f"{r['seconds']:>7.1f} {rps:>10,.0f} {mbps:>6.1f} {steady:>9} "
              f"{r['cpu_seconds']:>6.1f} {per_rec:>6.0f} {steady_us:>9} {ratio:>5}")
    summary = result.get("summary", {})
    if any(len(m["runs"]) > 1 for by_system in summary.values() for m in by_system.values()):
        p()
        p("medians over the complete runs (records/s, MB/s, ratio of medians):")
        for size_name, by_system in summary.items():
            base = next((m for m in by_system.values() if m["baseline"]), None)
            for system, m in by_system.items():
                ratio = ""
                if base and not m["baseline"] and base["records_per_second"]:
                    ratio = f"  ratio {m['records_per_second'] / base['records_per_second']:.2f}"
                    if base["steady_us_per_record"]:
                        ratio += (", steady CPU per record "
                                  f"{m['steady_us_per_record'] / base['steady_us_per_record']:.2f}"
                                  "x")
                p(f"  {size_name:<6} {system:<20} {m['records_per_second']:>10,.0f} records/s "
                  f"{m['mb_per_second']:>6.1f} MB/s {m['steady_us_per_record']:>5.1f} µs/rec "
                  "steady (runs: " + ", ".join(f"{x:,.0f}" for x in m["runs"]) + ")"
                  + (f" {m['incomplete_runs']} incomplete" if m["incomplete_runs"] else "")
                  + ratio)
    p()
    p("CPU per process: seconds (µs per record, % of one core over the run):")
    for size_name, rows in result["sizes"].items():
        for r in rows:
            p(f"  {size_name:<5} {r['system']:<20} " + _per_process(r, r["cpu_per_process"]))
            helpers = {**{f"{broker} {k}": v for k, v in r["broker_cpu_seconds"].items()},
                       **r["apart_cpu_seconds"]}
            notes = ["apart: " + _per_process(r, helpers)]
            notes += r.get("notes", [])
            if r["duplicates"]:
                notes.append(f"duplicates: {r['duplicates']}")
            if r["ended"] != "complete":
                notes.append(f"ended: {r['ended']}")
            p(f"  {'':<5} {'':<20} " + "; ".join(notes))
    p()


def _per_process(r, cpu: dict) -> str:
    def one(name, sec):
        us = f"{1e6 * sec / r['received']:.1f} µs" if r["received"] else "- µs"
        core = f"{100 * sec / r['seconds']:.0f}%" if r["seconds"] > 0 else "-"
        return f"{name} {sec:.2f} ({us}, {core})"
    return ", ".join(one(k, v) for k, v in cpu.items())


def print_profiles(profiles: list, directory: str, file=sys.stdout) -> None:
    print(f"\nprofiles (py-spy, 100 Hz, samples of running threads) in {directory}: "
          "per run, each worker's collapsed stacks (.txt) and speedscope file; self time per "
          "stage, top frames:", file=file)
    for prof in profiles:
        names = ", ".join(os.path.basename(f) for f in prof["files"]) or "no files"
        print(f"\n  {prof['run']}: {names}", file=file)
        for stage, s in prof["stages"].items():
            print(f"    {stage} ({s['samples']} samples):", file=file)
            for frame, n in s["top_self"]:
                print(f"      {100 * n / max(1, s['samples']):5.1f}%  {frame}", file=file)


def print_memory(result: dict, file=sys.stdout) -> None:
    """--mode memory: per diode process, RSS after warm-up, at the end, the max, the change."""
    def p(line=""):
        print(line, file=file)

    r = result["run"]
    mem = r["memory"]
    warm = mem["warm_up"]
    mib = 1 << 20
    p()
    p("== " + TITLES["memory"])
    p(f"{result['records']:,} records of {result['record_bytes']} B, link paced at "
      f"{r['rate_mbps']:g} Mbit/s; link-sim holds back {100 * result['reorder']:g} % of "
      f"datagrams and loses none; RSS read every {result['sample_seconds']:g} s")
    p(f"delivered {r['received']:,} of {r['expected']:,} ({r['missing']} missing) in "
      f"{r['seconds']:.1f} s ({rate(r)[0]:,.0f} records/s); ended: {r['ended']}")
    if warm is None:
        p("no sample after warm-up: no figures")
        return
    share = f"{100 * result['warm_up_share']:g} %"
    p(f"warm-up: until {share} of the records had arrived ({warm['records']:,} at "
      f"{warm['seconds']:.1f} s); {warm['samples_after']} samples after it. After warm-up: the "
      f"peak while the next {share} arrived ({warm['samples_warm_window']} samples); end: the "
      f"peak while the last {share} arrived ({warm['samples_end_window']} samples); flat: end "
      f"and max within {100 * result['flat_within']:g} % of after-warm-up")
    p(f"{'process':<28} {'warm-up MiB':>11} {'end MiB':>8} {'max MiB':>8} {'min MiB':>8} "
      f"{'change':>7} {'max':>7}  verdict")
    for name, w in mem["workers"].items():
        end = "-" if w["end_bytes"] is None else f"{w['end_bytes'] / mib:.1f}"
        change = "-" if w["change_pct"] is None else f"{w['change_pct']:+.1f}%"
        p(f"{name:<28} {w['warm_up_bytes'] / mib:>11.1f} {end:>8} {w['max_bytes'] / mib:>8.1f} "
          f"{w['min_bytes'] / mib:>8.1f} {change:>7} {w['max_pct']:>+6.1f}%  {w['verdict']}")
    sim = r.get("link_sim", {})
    p(f"link-sim: {sim.get('received', '?')} datagrams, {sim.get('reordered', '?')} held back, "
      f"{sim.get('dropped', '?')} dropped; socket drops: link-sim {r['socket_drops']['link_sim']}, "
      f"receiver {r['socket_drops']['receiver']}; reader rewinds: {r['rewinds']:.0f}")
    if r.get("duplicates"):
        p(f"duplicates: {r['duplicates']}")
    p()


def print_anchor(found: dict, path: str) -> None:
    """The iperf3 line under the tables (benchlib.iperf)."""
    size = found.get("datagram_bytes")
    if "error" in found:
        print(f"\nanchor (iperf3 UDP, {size}-byte datagrams, {path}): none: {found['error']}")
        return
    print(f"\nanchor (iperf3 -u -b 0 -l {size}, {path}, {found.get('seconds', 5)} s): sent "
          f"{found['sender_mbps']:,.0f} Mbit/s, received {found['receiver_mbps']:,.0f} Mbit/s "
          f"({found['datagrams_per_second']:,.0f} datagrams/s, {found['lost_percent']:.1f} % "
          f"lost)")


def print_partitions(result: dict, file=sys.stdout) -> None:
    """--partitions: per run, the copy's rate and its ratios, startup, idle, a lone record's
    latency and the largest worker; then every worker's RSS and idle share."""
    def p(line=""):
        print(line, file=file)

    mib = 1 << 20
    p()
    p(f"== partitions: {result['records']:,} records of {result['value_bytes']} B spread over "
      + " and over ".join(lay["label"] for lay in result["layouts"])
      + ", Apache Kafka or Tansu as --broker; both sides launched, sender.topics.regex")
    p(f"copied: from launch until the last record is in the destination; ratio: against the "
      f"relay on the same partitions (relay) and against diode over the other layout of the "
      f"same repeat (layout); startup: launch to the first record seen in the destination; "
      f"idle: both sides, {result['idle_seconds']:g} s after the copy, % of one core; lone: "
      f"{result['lone_records']} records, one every {result['lone_interval_ms']:g} ms, "
      "produce to arrival, p50/p99 ms (arrived/sent)")
    p(f"{'run':>3} {'partitions':>10} {'system':<6} {'missing':>7} {'copied s':>8} "
      f"{'records/s':>10} {'relay':>5} {'layout':>6} {'startup s':>9} {'idle %':>6} "
      f"{'lone p50/p99 ms':>16} {'arrived':>9} {'largest RSS':>24}")
    ratios = {s["run"]: s for s in result["summary"]["runs"]}
    for r in result["rows"]:
        s = ratios.get(r["run"], {})
        mine = not r["baseline"] and r["partitions"] == result["layouts"][0]["partitions"]
        rel = s.get("against_relay") if mine else None
        lay = s.get("against_partitions") if mine else None
        lone = r.get("lone") or {}
        rss = r.get("rss_bytes") or {}
        big = max(rss.items(), key=lambda kv: kv[1]) if rss else None
        idle = r.get("idle_core")
        cells = ["-" if rel is None else f"{rel:.2f}", "-" if lay is None else f"{lay:.2f}",
                 "-" if r.get("startup_seconds") is None else f"{r['startup_seconds']:.1f}",
                 "-" if idle is None else f"{100 * idle:.1f}",
                 _ms(lone.get("p50_ms")) + "/" + _ms(lone.get("p99_ms")),
                 f"{lone['arrived']}/{lone['sent']}" if lone.get("sent") else "-",
                 f"{big[0]} {big[1] / mib:.0f} MiB" if big else "-"]
        p(f"{r['run']:>3} {r['partitions']:>10} {r['system']:<6} {r['missing']:>7} "
          f"{r['seconds']:>8.1f} {rate(r)[0]:>10,.0f} {cells[0]:>5} {cells[1]:>6} "
          f"{cells[2]:>9} {cells[3]:>6} {cells[4]:>16} {cells[5]:>9} {cells[6]:>24}")
    for r in result["rows"]:
        if r["baseline"]:
            continue
        peak = r.get("rss_peak_bytes") or {}
        p(f"  run {r['run']}, {r['partitions']} partitions: RSS MiB at the end (peak): " +
          ", ".join(f"{k} {v / mib:.0f}" + (f" ({peak[k] / mib:.0f})" if k in peak else "")
                    for k, v in (r.get("rss_bytes") or {}).items()))
        src = (r.get("lone") or {}).get("source") or {}
        p(f"  {'':>{len(str(r['run'])) + 4}}  lone record at the source (Kafka alone): p50/p99 "
          f"{_ms(src.get('p50_ms'))}/{_ms(src.get('p99_ms'))} ms; load average "
          f"{(r.get('load_average') or [0])[0]:.1f}")
        p(f"  {'':>{len(str(r['run'])) + 4}}  idle % of a core: " + ", ".join(
            f"{k} {100 * v:.2f}" for k, v in (r.get("idle_per_process") or {}).items()))
        if r["ended"] != "complete":
            p(f"  ended: {r['ended']}")
    p()


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f}"
