"""`diode tune` on the demo topology: it measures every stage of both sides on this machine and
proposes instances and cores that keep every core under the limit, or says how far it goes."""

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_tune_measures_the_demo_topology_and_proposes_a_plan():
    r = subprocess.run([sys.executable, "-m", "diode", "tune", "topology.yaml", "--rate", "2000",
                        "--record-size", "200", "--json"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    advice = json.loads(r.stdout[r.stdout.index("{"):])
    stages = {s for side in advice["sides"].values() for s in side["stages"]}
    assert stages == {"kafka_reader", "packer", "udp_sender", "udp_reader", "unpacker",
                      "kafka_writer"}
    for side in advice["sides"].values():
        assert side["max_rate"] > 0 and side["bottleneck"]
        for p in side["stages"].values():
            assert p["cost_us_per_record"] > 0, advice  # every stage did work
    # 2000 records/s of 200 bytes is light work for any machine that runs the tests
    assert r.returncode == 0 and all(s["fits"] for s in advice["sides"].values())
