"""diode.soak.report: memory slopes that tell growth from restarts and warm-up, latency per
minute weighted by records, plots that are written and readable with or without data, and a
report.md that says the verdict, why, and every fault."""

import matplotlib.image

from diode.soak import report

MIB = 2 ** 20
KINDS = ("throughput", "latency", "backlog", "rss", "cpu")


def timeline(workers, seconds=3600, step=10):
    """Samples every `step` s; `workers` maps a title to f(t) -> (pid, rss bytes), or None
    while the worker is absent."""
    out = []
    for t in range(0, seconds + 1, step):
        ws = {}
        for title, f in workers.items():
            if (sample := f(t)) is not None:
                ws[title] = {"pid": sample[0], "rss": sample[1], "cpu": 20.0 + t % 7}
        out.append({"t": float(t), "produced": 1000 * t, "delivered": 990 * t, "missing": t,
                    "backlog": 9 * t, "restarts": 0, "workers": ws})
    return out


def test_memory_slopes_see_growth_not_restarts_or_warm_up():
    mem = report.memory(timeline({
        "receiver/flat": lambda t: (1, 50 * MIB),
        "receiver/leak": lambda t: (2, 50 * MIB + 10 * MIB * t / 3600),
        # warm-up: 30 MiB in its first minute, flat after
        "receiver/warm": lambda t: (3, 20 * MIB + min(t, 60) * MIB // 2),
        # killed at 20 min, absent 30 s, then a second life that starts small and stays flat
        "receiver/killed": lambda t: (4, 80 * MIB) if t < 1200 else
        None if t < 1230 else (5, 40 * MIB),
        # seen in 5 samples only: too few to fit
        "sender/brief": lambda t: (6, 30 * MIB + t * MIB) if t < 50 else None,
    }))
    assert abs(mem["receiver/flat"]["slope_mb_per_h"]) < 1
    assert 9 <= mem["receiver/leak"]["slope_mb_per_h"] <= 11
    assert abs(mem["receiver/warm"]["slope_mb_per_h"]) < 1
    assert mem["receiver/warm"]["max_mb"] == 50
    killed = mem["receiver/killed"]
    assert killed["incarnations"] == 2 and abs(killed["slope_mb_per_h"]) < 1
    assert killed["start_mb"] == 80 and killed["end_mb"] == 40
    assert mem["sender/brief"]["slope_mb_per_h"] is None
    assert report.memory_verdict(mem, 5) == ["receiver/leak grew 10.0 MB/h (limit 5)"]
    assert report.memory_verdict(mem, 20) == []


def test_an_outages_high_water_mark_is_not_growth_but_a_leak_between_faults_is():
    """Every 10 minutes a destination outage (60 s): the writer's backlog raises its RSS by
    30 MiB, which the allocator keeps (flat afterwards), once; a leaking worker grows 12 MiB/h
    in every quiet stretch, whatever the faults do."""
    faults = [{"kind": "destination-stop", "start": 600.0 * k, "at": 600.0 * k,
               "ended": 600.0 * k + 60, "duration": 60.0} for k in range(1, 6)]

    def stepped(t):
        return 1, 60 * MIB + (30 * MIB if t > 620 else 0) + (MIB * (t % 600 < 60) * 5)

    mem = report.memory(timeline({
        "receiver/stepped": stepped,
        "receiver/leak": lambda t: (2, 50 * MIB + 12 * MIB * t / 3600),
    }), faults)
    assert abs(mem["receiver/stepped"]["slope_mb_per_h"]) < 1
    assert mem["receiver/stepped"]["max_mb"] == 95
    assert 11 <= mem["receiver/leak"]["slope_mb_per_h"] <= 13
    # 6 quiet stretches of 9.5 min less the first's warm-up (the last ends at the hour)
    assert 45 <= mem["receiver/leak"]["quiet_minutes"] <= 55
    assert report.memory_verdict(mem, 10) == ["receiver/leak grew 12.0 MB/h (limit 10)"]
    # everything under a fault: nothing to judge
    busy = [{"kind": "link-loss", "start": 0.0, "at": 0.0, "ended": 3600.0, "duration": 3600.0}]
    assert report.memory(timeline({"receiver/leak": lambda t: (2, t * MIB)}), busy)[
        "receiver/leak"]["slope_mb_per_h"] is None


def test_latency_per_minute_weights_buckets_by_records():
    buckets = [{"t": 0, "p50": 10, "p99": 100, "count": 300},
               {"t": 30, "p50": 20, "p99": 200, "count": 100},
               {"t": 60, "p50": 5, "p99": 50, "count": 10},
               {"t": 120, "p50": None, "p99": None, "count": 0}]
    assert report.latency_per_minute(buckets) == [
        {"minute": 0, "count": 400, "p50": 12.5, "p99": 125.0},
        {"minute": 1, "count": 10, "p50": 5.0, "p99": 50.0}]
    assert report.latency_per_minute([]) == []


FAULTS = [{"kind": "link-loss", "start": 60, "end": 120, "duration": 60, "loss": 0.02,
           "at": 60.1, "ended": 120.3},
          {"kind": "kill-worker", "start": 300, "end": 300, "duration": 0, "side": "receiver",
           "at": 300, "ended": 300.1, "victim": "receiver/unpacker-0"},
          {"kind": "receiver-restart", "start": 600, "end": 605, "duration": 5, "at": 600,
           "ended": 611},
          {"kind": "destination-pause", "start": 900, "end": 930, "duration": 30},  # scheduled
          {"kind": "link-down", "start": 1500, "end": 1520, "duration": 20, "at": 1500,
           "ended": None}]  # still running when the soak was interrupted


def test_plots_are_written_and_readable_with_faults(tmp_path):
    # an hour sampled every second, 20 workers (one restarted): about a second to plot
    lat = [{"t": float(t), "p50": 12.0, "p99": 80.0 if t < 1800 else 3000.0, "count": 100}
           for t in range(0, 3600, 10)]
    tl = timeline({f"receiver/w-{i}": (lambda t, i=i: (i + 100 * (t > 1200), (40 + i) * MIB))
                   for i in range(20)}, step=1)
    images = report.plot(tmp_path, tl, lat, FAULTS)
    assert set(images) == set(KINDS)
    for file in images.values():
        assert matplotlib.image.imread(tmp_path / file).shape[:2] == (500, 1200)


def test_plots_without_data_are_still_written(tmp_path):
    images = report.plot(tmp_path, timeline({}, seconds=0), [], [])
    assert set(images) == set(KINDS)
    for file in images.values():
        assert matplotlib.image.imread(tmp_path / file).shape[:2] == (500, 1200)


def test_report_md_says_the_verdict_why_and_shows_every_fault(tmp_path):
    rep = {"command": "diode soak --duration 1h", "passed": False, "duration": 3600,
           "started_at": "2025-01-01T10:00:00+00:00", "rate": 1000, "produced": 3600000,
           "silent_loss": 3, "failures": ["silent_loss: 3 (must be 0)",
                                          "receiver/leak grew 14.2 MB/h (limit 10)"],
           "faults": FAULTS, "memory_judged": True,
           "memory": {"receiver/leak": {"start_mb": 50.0, "end_mb": 64.2, "max_mb": 64.2,
                                        "quiet_minutes": 40.0, "slope_mb_per_h": 14.2,
                                        "incarnations": 1}},
           "latency_overall": {"p50": 12.0, "p99": 85.0, "max": 900}}
    images = {name: f"{name}.png" for name in KINDS}
    md = open(report.write_markdown(tmp_path, rep, images)).read()
    assert md.startswith("# Soak report: FAILED")
    assert "- silent_loss: 3 (must be 0)" in md and "grew 14.2 MB/h (limit 10)" in md
    assert "```\ndiode soak --duration 1h\n```" in md
    assert "| silent_loss | 3 | 0 |" in md and "| produced | 3600000 |  |" in md
    for f in FAULTS:
        assert f"| {f['kind']} |" in md
    assert "| 1:00 | link-loss | 60.2 s | loss=0.02 |" in md
    assert "| 15:00 | destination-pause | 30.0 s |" in md  # scheduled times only
    assert "| receiver/leak | 50.0 | 64.2 | 64.2 | 14.2 | 40.0 | 1 |" in md
    assert "p50 12.0 ms, p99 85.0 ms" in md
    for name in KINDS:
        assert f"![{name}]({name}.png)" in md
    rep.update(passed=True, failures=[], silent_loss=0)
    md = open(report.write_markdown(tmp_path, rep, {})).read()
    assert md.startswith("# Soak report: PASSED") and "Failed because" not in md


# the soak started at epoch T0; its fault log as diode.soak.run keeps it (at, ended: seconds
# since the start; epoch: when it began)
T0 = 1_800_000_000.0
LOGGED = [{"kind": "link-loss", "start": 10, "end": 12, "duration": 2, "loss": 0.01,
           "at": 10.0, "ended": 12.0, "epoch": T0 + 10},
          {"kind": "link-reorder", "start": 40, "end": 42, "duration": 2, "probability": 0.05,
           "at": 40.0, "ended": 42.0, "epoch": T0 + 40},
          {"kind": "receiver-restart", "start": 60, "end": 62, "duration": 2, "at": 60.0,
           "ended": 70.0, "epoch": T0 + 60},  # down 2 s, back 8 s later
          {"kind": "kill-worker", "start": 100, "end": 100, "duration": 0, "side": "sender",
           "at": 100.0, "ended": 100.1, "epoch": T0 + 100}]


def missing(topic, partition, first, last, sent_from, sent_until, reported=None):
    """A range as the audit finds it (sent: seconds since T0)."""
    return {"topic": topic, "partition": partition, "first": first, "last": last,
            "records": last - first + 1, "reported": last - first + 1 if reported is None
            else reported, "reason": "gap", "sent_from_ms": int((T0 + sent_from) * 1000),
            "sent_until_ms": int((T0 + sent_until) * 1000)}


def test_each_missing_range_is_tied_to_the_fault_that_ran_when_it_was_sent():
    ranges = [missing("t", 0, 100, 104, 11.0, 11.2),     # during the link loss
              missing("t", 1, 7, 7, 13.5, 13.5),         # just after it: within the margin
              missing("t", 2, 500, 519, 68.0, 69.0),     # the receiver not back yet
              missing("t", 0, 900, 900, 99.0, 99.0),     # sent just before the kill
              missing("t", 3, 40, 49, 41.0, 41.5, 0),    # during a reorder only: unexplained
              missing("t", 3, 70, 71, 30.0, 30.0)]       # nothing ran: unexplained
    found = report.attribute(ranges, LOGGED, margin=2.0, t0=T0)
    assert [[f["kind"] for f in r["faults"]] for r in found] == [
        ["link-loss"], ["link-loss"], ["receiver-restart"], ["kill-worker"], [], []]
    assert found[0]["faults"] == [{"kind": "link-loss", "at": 10.0, "until": 12.0}]
    assert found[2]["sent_at"] == 68.0 and found[2]["sent_until"] == 69.0
    assert found[4]["during"] == [{"kind": "link-reorder", "at": 40.0, "until": 42.0}]
    assert found[5]["during"] == []
    # the margin widens every window: 4 s more and the last two are still unexplained
    assert [bool(r["faults"]) for r in report.attribute(ranges, LOGGED, 4.0, T0)] == \
        [True, True, True, True, False, False]

    # within a wide margin, several: the likeliest cause first (the nearest to the send times)
    assert [f["kind"] for f in report.attribute([ranges[2]], LOGGED, 40.0, T0)[0]["faults"]] \
        == ["receiver-restart", "kill-worker"]
    # (and of two that overlap them, the one that overlaps them longest)
    both = [{**LOGGED[0], "kind": "link-down", "ended": 11.0},
            {**LOGGED[0], "kind": "sender-restart", "ended": 20.0}]
    assert [f["kind"] for f in report.attribute([missing("t", 0, 1, 9, 10.5, 15.0)], both, 2.0,
                                                T0)[0]["faults"]] == ["sender-restart",
                                                                      "link-down"]

    m = report.missing_by_fault(found, LOGGED)
    assert (m["ranges"], m["records"]) == (6, 5 + 1 + 20 + 1 + 10 + 2)
    assert [(b["kind"], b["ranges"], b["records"]) for b in m["by_fault"]] == [
        ("link-loss", 2, 6), ("receiver-restart", 1, 20), ("kill-worker", 1, 1)]
    assert (m["unexplained"]["ranges"], m["unexplained"]["records"]) == (2, 12)
    assert [x["first"] for x in m["unexplained"]["examples"]] == [40, 70]


def test_report_md_ties_losses_to_faults_and_makes_an_unexplained_one_stand_out(tmp_path):
    found = report.attribute([missing("t", 0, 100, 104, 11.0, 11.2),
                              missing("t", 3, 40, 49, 41.0, 41.5, 0)], LOGGED, 2.0, T0)
    rep = {"command": "diode soak", "passed": False, "faults": LOGGED, "fault_margin": 2.0,
           "failures": ["unexplained_loss: 10 (must be 0)"],
           "missing": report.missing_by_fault(found, LOGGED)}
    md = open(report.write_markdown(tmp_path, rep, {})).read()
    assert "## Missing records and the faults that caused them" in md
    assert "15 records in 2 ranges were not written" in md and "(within 2 s)" in md
    assert "| link-loss | 0:10 | 0:12 | 1 | 5 |" in md
    assert "| receiver-restart | 1:00 | 1:10 | 0 | 0 |" in md
    assert "| **unexplained** (no fault that may lose records) | | | **1** | **10** |" in md
    assert "**10 records lost with no fault to explain them**" in md
    assert "| t | 3 | 40-49 | 10 | 0:41-0:41 | 0 | link-reorder 0:40-0:42 |" in md
    rep["missing"] = report.missing_by_fault(found[:1], LOGGED)
    md = open(report.write_markdown(tmp_path, rep, {})).read()
    assert "| **unexplained** (no fault that may lose records) | | | **0** | **0** |" in md
    assert "with no fault to explain them" not in md
