"""`diode soak` as an operator runs it: a one-minute soak of the demo topology on Apache Kafka
with a fault of every kind passes, record by record, and leaves its report; bad input is refused
before anything starts."""

import json
import re
import signal
import subprocess
import sys
import time

import psutil
import yaml

from diode.runtime import launches
from diode.soak.schedule import LOSSY
from tests.conftest import ROOT, wait_for

KINDS = {"link-loss", "link-burst", "link-reorder", "link-duplicate", "link-corrupt",
         "link-delay", "link-down", "kill-worker", "sender-restart", "receiver-restart",
         "destination-pause", "destination-stop", "source-pause"}
# What must not reach a soak's output off a terminal (its own logs have it)
CHATTER = {
    "librdkafka": re.compile(r"%\d\|\d+\.\d+\||rdkafka"),
    "Spark's progress bars": re.compile(r"\[Stage \d+"),
    "Spark's and its JVM's log": re.compile(
        r"log4j|setLogLevel|\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARN|ERROR) |^WARNING: ", re.M),
    "an Apache Kafka broker's log": re.compile(
        r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\] (TRACE|DEBUG|INFO|WARN|ERROR) ", re.M),
    "a Tansu broker's log": re.compile(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z\s+(TRACE|DEBUG|INFO|WARN|ERROR) "),
    "diode's INFO log": re.compile(r" INFO +diode\."),
}


def soak(*args, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diode", "soak", "--no-view", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _log_says(out, text: str) -> bool:
    log = out / "soak.log"
    return log.exists() and text in log.read_text()


def _written(out) -> float:
    """Records the soak's receiver has written (its launch found by its topology file)."""
    return sum(c["records"] for e in launches.running(str(out / "topology-receiver.yaml"))
               for c in launches.worker_counters(e["run_dir"], ("records",),
                                                 "kafka_writer").values())


def test_one_minute_soak_with_every_fault_passes_record_by_record(tmp_path):
    """The shortest soak the built-in schedule takes (schedule.MIN_DEFAULT_SECONDS): every kind
    of fault still runs, each for a shorter while."""
    out = tmp_path / "report"
    r = soak("--duration", "1m", "--rate", "400", "--sizes", "100:0.7,1000:0.25,20000:0.05",
             "--report", out, "--seed", "3")
    rep = json.loads((out / "report.json").read_text())
    assert r.returncode == 0 and rep["passed"], (rep["failures"], r.stderr[-5000:])
    assert rep["produced"] > 0  # (how many this machine produced in 1 min is not tested)
    assert rep["delivered"] + rep["missing_reported"] == rep["produced"]
    for invariant in ("silent_loss", "false_missing", "duplicates", "corrupted",
                      "unexplained_loss"):
        assert rep[invariant] == 0, invariant
    # every kind of fault ran, and the lossy ones did lose (and report) records
    assert {f["kind"] for f in rep["faults"]} == KINDS
    assert rep["missing_reported"] > 0 and rep["missing_reasons"]
    # every missing record is tied to a fault that may lose records, running when it was sent
    ranges = json.loads((out / "missing-ranges.json").read_text())
    assert sum(r["records"] for r in ranges) == rep["produced"] - rep["delivered"]
    assert all(r["faults"] and {f["kind"] for f in r["faults"]} <= LOSSY for r in ranges), \
        [r for r in ranges if not r["faults"]][:5]
    assert rep["missing"]["unexplained"]["records"] == 0
    assert sum(b["records"] for b in rep["missing"]["by_fault"]) == rep["missing"]["records"]
    # off a terminal: the soak's own lines, none of the brokers', librdkafka's or Spark's
    for what, pattern in CHATTER.items():
        found = [line for line in (r.stdout + r.stderr).splitlines() if pattern.search(line)]
        assert not found, (what, found[:5])
    assert (out / "spark.log").exists()
    assert "embedded kafka broker" in (out / "soak.log").read_text()  # there, not on stderr
    assert all(f.get("ended") is not None for f in rep["faults"])
    assert rep["worker_restarts"] >= 2  # the two kills
    assert rep["memory"] and rep["latency"]
    # the sender's digests prove the content without the source: nothing altered, and the
    # ranges that lost records to the faults are incomplete, not altered
    assert rep["digests"]["verified"] > 0 and rep["digests"]["altered"] == 0, rep["digests"]
    md = (out / "report.md").read_text()
    for name in ("throughput", "latency", "backlog", "rss", "cpu"):
        png = out / f"{name}.png"
        assert png.stat().st_size > 10000 and png.name in md
    assert "PASSED" in md and "## Missing records and the faults that caused them" in md


def test_bad_input_is_refused_before_anything_starts(tmp_path):
    faults = tmp_path / "faults.yaml"
    cases = [
        ("kind: link-flood", ["--duration", "2m"], "unknown"),
        ("kind: link-loss\n    duration: 30s\n  - at: 110s\n    kind: link-down\n"
         "    duration: 20s", ["--duration", "2m"], "after the soak"),
    ]
    for entry, extra, says in cases:
        faults.write_text(f"faults:\n  - at: 10s\n    {entry}\n")
        r = soak("--faults", faults, "--report", tmp_path / "never", *extra, timeout=60)
        assert r.returncode == 2 and says in r.stderr, r.stderr
        assert not (tmp_path / "never").exists()  # (made before the first broker starts)
    r = soak("--rate", "10000", "--sizes", "100000", "--report", tmp_path / "never", timeout=60)
    assert r.returncode == 2 and "link.rate.mbps" in r.stderr, r.stderr  # above the link's pace
    unpaced = yaml.safe_load((ROOT / "topology.yaml").read_text())
    unpaced["link"]["rate.mbps"] = 0
    unpaced["security"]["password.file"] = str(faults)
    (tmp_path / "unpaced.yaml").write_text(yaml.safe_dump(unpaced))
    r = soak(tmp_path / "unpaced.yaml", "--rate", "2000000", "--sizes", "100", "--report",
             tmp_path / "never", timeout=60)
    assert r.returncode == 2 and "at most" in r.stderr, r.stderr  # above what can be produced
    r = soak("--rate", "fast", "--report", tmp_path / "never", timeout=60)
    assert r.returncode == 2 and "--rate" in r.stderr, r.stderr
    assert not (tmp_path / "never").exists()


def test_ctrl_c_stops_every_process_and_still_reports_what_ran(tmp_path):
    out = tmp_path / "report"
    proc = subprocess.Popen([sys.executable, "-m", "diode", "soak", "--no-view", "--duration",
                             "10m", "--rate", "300", "--report", str(out)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not _log_says(out, "sides up"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.5)
    wait_for(lambda: _written(out) > 2000, 180, "2000 records written by the soak's receiver")
    started = psutil.Process(proc.pid).children(recursive=True)
    assert len(started) >= 5  # brokers, link-sim, the two launches and their workers
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert not [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    rep = json.loads((out / "report.json").read_text())
    assert not rep["passed"] and any("interrupted" in f for f in rep["failures"])
    assert rep["produced"] > 2000 and rep["silent_loss"] == 0 and rep["duplicates"] == 0
    assert (out / "report.md").exists() and (out / "throughput.png").exists()
