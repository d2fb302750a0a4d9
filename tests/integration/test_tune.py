"""`diode tune` on the demo topology, as an operator runs it: it measures every stage of both
sides here, proposes instances and cores that keep every core under the limit, writes them into
the file keeping its comments, and its short bench achieves what it predicted."""

import json
import shutil
import subprocess
import sys
import time

import yaml

from diode.runtime import topology
from tests.conftest import ROOT

STAGES = {"kafka_reader", "packer", "udp_sender", "udp_reader", "unpacker", "kafka_writer"}


def test_tune_measures_the_demo_topology_writes_the_plan_and_proves_it(tmp_path):
    path = tmp_path / "topology.yaml"
    shutil.copy(ROOT / "topology.yaml", path)
    r = subprocess.run([sys.executable, "-m", "diode", "tune", str(path), "--rate", "2000",
                        "--record-size", "200", "--json", "--write", "--verify"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    advice = json.loads(r.stdout)
    assert set(advice["stages"]) == STAGES
    for stage, p in advice["stages"].items():
        assert p["cost_us_per_record"] > 0, (stage, advice)  # every stage did work
        assert p["instances"] >= 1 and p["cores"]
    assert advice["max_rate"] > 2000 and advice["bottleneck"] and "sysctl" in advice
    # 2000 records/s of 200 bytes is light work for any machine that runs the tests
    assert advice["fits"] and r.returncode == 0, (advice.get("verify"), r.stderr[-2000:])
    v = advice["verify"]
    assert v["within"] and v["missing"] == 0 and abs(v["errors"]["rate"]) <= 0.25
    # the plan is in the file, its comments kept, and it is still a valid topology
    text = path.read_text()
    assert "# The demo topology: both sides of the diode on this machine" in text
    assert text != (ROOT / "topology.yaml").read_text()
    planned = topology.load(path)
    for stage, p in advice["stages"].items():
        settings = planned.stage(p["side"], stage)
        assert settings.instances == p["instances"] and set(settings.cpus) == set(p["cores"])
    assert yaml.safe_load(text)["brokers"] == yaml.safe_load(
        (ROOT / "topology.yaml").read_text())["brokers"]


def test_live_advice_reads_a_running_launch_found_by_its_topology(tmp_path, start_brokers,
                                                                   monkeypatch):
    """A launch registers itself; `diode tune --live TOPOLOGY` finds it, reads every worker's
    metrics while records flow and gives each stage its load and advice; with nothing running
    it says so (exit 1)."""
    from diode.soak import traffic
    from tests.conftest import Launched, create_topic, write_topology
    monkeypatch.setenv("DIODE_STATE_DIR", str(tmp_path / "state"))
    src, dst = start_brokers("tansu", "source", "destination")
    path = write_topology(tmp_path, src.bootstrap, dst.bootstrap)
    create_topic(src.bootstrap, "src", 4)

    def live(*args):
        return subprocess.run([sys.executable, "-m", "diode", "tune", "--live", *map(str, args)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)

    nothing = live(path)
    assert nothing.returncode == 1 and "no diode launch is running" in nothing.stderr
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    d = Launched(path, run_dir)
    flow = None
    try:
        d.wait_workers(6)
        d.wait_ready(6)
        flow = traffic.Traffic(src.client_config(), traffic.Records(["src"], 4, [(200, 1)], 1),
                               3000).start()
        time.sleep(3)
        r = live(path, "--json", "--seconds", "4")
        assert r.returncode == 0, r.stderr[-3000:]
        advice = json.loads(r.stdout)
        assert set(advice["stages"]) == STAGES
        assert 2000 <= advice["records_per_second"]["receiver"] <= 4000
        for stage, s in advice["stages"].items():
            assert s["instances"] == 1 and s["load"] > 0 and s["advice"], (stage, s)
        assert advice["stages"]["kafka_writer"]["cost_us_per_record"] > 0
        assert "kafka_writer" in live(path, "--seconds", "1").stdout  # the table
    finally:
        if flow is not None:
            flow.stop(timeout=5)
        d.stop()
    assert live(path).returncode == 1  # it unregistered when it stopped
