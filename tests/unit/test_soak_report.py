"""diode.soak.report: memory slopes that tell growth from restarts and warm-up, latency per
minute, plots that are written and readable, and a report.md that says the verdict and why."""

import matplotlib.image

from diode.soak import report

MIB = 2 ** 20


def timeline(workers, seconds=3600, step=10):
    """Samples every `step` s; `workers` maps a title to f(t) -> (pid, rss bytes)."""
    out = []
    for t in range(0, seconds + 1, step):
        ws = {}
        for title, f in workers.items():
            pid, rss = f(t)
            ws[title] = {"pid": pid, "rss": rss, "cpu": 20.0}
        out.append({"t": float(t), "produced": 1000 * t, "delivered": 990 * t, "missing": t,
                    "backlog": 9 * t, "restarts": 0, "workers": ws})
    return out


def test_memory_slopes_see_growth_not_restarts_or_warm_up():
    mem = report.memory(timeline({
        "receiver/flat": lambda t: (1, 50 * MIB),
        "receiver/leak": lambda t: (2, 50 * MIB + 10 * MIB * t / 3600),
        # warm-up: 30 MiB in its first minute, flat after
        "receiver/warm": lambda t: (3, 20 * MIB + min(t, 60) * MIB // 2),
        # killed at 20 min: its second life starts small and stays flat
        "receiver/killed": lambda t: (4, 80 * MIB) if t < 1200 else (5, 40 * MIB),
    }))
    assert abs(mem["receiver/flat"]["slope_mb_per_h"]) < 1
    assert 9 <= mem["receiver/leak"]["slope_mb_per_h"] <= 11
    assert abs(mem["receiver/warm"]["slope_mb_per_h"]) < 1
    killed = mem["receiver/killed"]
    assert killed["incarnations"] == 2 and abs(killed["slope_mb_per_h"]) < 1
    assert killed["start_mb"] == 80 and killed["end_mb"] == 40
    assert report.memory_verdict(mem, 5) == ["receiver/leak grew 10.0 MB/h (limit 5)"]


def test_latency_per_minute_weights_buckets_by_records():
    buckets = [{"t": 0, "p50": 10, "p99": 100, "count": 300},
               {"t": 30, "p50": 20, "p99": 200, "count": 100},
               {"t": 60, "p50": 5, "p99": 50, "count": 10}]
    assert report.latency_per_minute(buckets) == [
        {"minute": 0, "count": 400, "p50": 12.5, "p99": 125.0},
        {"minute": 1, "count": 10, "p50": 5.0, "p99": 50.0}]


def test_plots_are_written_and_readable_with_and_without_data(tmp_path):
    faults = [{"kind": "link-loss", "start": 60, "end": 120, "duration": 60, "at": 60.1,
               "ended": 120.3},
              {"kind": "kill-worker", "start": 300, "end": 300, "duration": 0, "at": 300},
              {"kind": "receiver-restart", "start": 600, "end": 605, "duration": 5, "at": 600,
               "ended": 611}]
    lat = [{"t": float(t), "p50": 12.0, "p99": 80.0, "count": 100} for t in range(0, 3600, 10)]
    tl = timeline({f"receiver/w-{i}": (lambda t, i=i: (i, (40 + i) * MIB)) for i in range(20)})
    images = report.plot(tmp_path, tl, lat, faults)
    assert set(images) == {"throughput", "latency", "backlog", "rss", "cpu"}
    for file in images.values():
        assert matplotlib.image.imread(tmp_path / file).shape[:2] == (500, 1200)
    empty = report.plot(tmp_path / ".", tl[:1], [], [])
    assert (tmp_path / empty["latency"]).stat().st_size > 0


def test_report_md_says_the_verdict_why_and_shows_every_fault(tmp_path):
    rep = {"command": "diode soak --duration 1h", "passed": False, "duration": 3600,
           "rate": 1000, "silent_loss": 3, "failures": ["silent_loss: 3 (must be 0)"],
           "faults": [{"kind": "link-down", "start": 60, "duration": 10, "at": 60,
                       "ended": 70}, {"kind": "destination-stop", "start": 90,
                                      "duration": 20, "at": 90, "ended": 112}],
           "memory": {}, "memory_judged": True}
    md = open(report.write_markdown(tmp_path, rep, {"rss": "rss.png"})).read()
    assert "FAILED" in md and "silent_loss: 3 (must be 0)" in md
    assert "link-down" in md and "destination-stop" in md and "![rss](rss.png)" in md
    assert "diode soak --duration 1h" in md
    rep.update(passed=True, failures=[], silent_loss=0)
    assert "PASSED" in open(report.write_markdown(tmp_path, rep, {})).read()
