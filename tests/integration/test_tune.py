"""`diode tune` on the demo topology, as an operator runs it: it measures every stage of both
sides here, proposes instances and cores that keep every core under the limit, writes them into
the file keeping its comments, and runs the plan to set what it achieves against the prediction.
How fast this machine is (and what else runs on it) decides the figures, so the tests check what
the command reports and derives from them, never a speed."""

import json
import shutil
import socket
import subprocess
import sys
import threading

import yaml

from diode.runtime import topology
from tests.conftest import ROOT, wait_for

SIDES = {"kafka_reader": "sender", "packer": "sender", "udp_sender": "sender",
         "udp_reader": "receiver", "unpacker": "receiver", "kafka_writer": "receiver"}
STAGES = set(SIDES)


def test_tune_measures_the_demo_topology_writes_the_plan_and_proves_it(tmp_path):
    path = tmp_path / "topology.yaml"
    shutil.copy(ROOT / "topology.yaml", path)
    r = subprocess.run([sys.executable, "-m", "diode", "tune", str(path), "--rate", "2000",
                        "--record-size", "200", "--seconds", "4", "--json", "--write",
                        "--verify"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    advice = json.loads(r.stdout)
    assert advice["bottleneck"] and "sysctl" in advice
    assert all(w["records"] > 0 for w in advice["measured"]["windows"])
    # measured on embedded brokers: no source to count, and it says what to give
    assert advice["partitions"]["partitions"] is None
    assert "--partitions N" in advice["partitions"]["why"]
    if advice["max_rate"] == 0:  # other work holds every core at the limit: it says so (and
        # plans no stage)
        assert r.returncode == 1 and "verify" not in advice, r.stderr[-2000:]
        assert "other processes already keep every core" in advice["not_verified"]
        return
    assert set(advice["stages"]) == STAGES
    for stage, p in advice["stages"].items():
        assert p["cost_us_per_record"] > 0, (stage, advice)  # every stage did work
        assert p["instances"] >= 1 and p["cores"]
        assert p["side"] == SIDES[stage]
    # the plan ran: records crossed, none was lost, and what it achieved is set against the
    # prediction; the exit status says whether the plan fits and was achieved
    v = advice["verify"]
    assert v["achieved"] > 0 and v["missing"] == 0, (v, r.stderr[-2000:])
    assert set(v["errors"]) == {"rate", "total load", "busiest core"} and v["cores"]
    assert r.returncode == (0 if advice["fits"] and v["within"] else 1), r.stderr[-2000:]
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


def test_live_advice_reads_a_running_launch_found_by_its_topology(tmp_path, start_brokers):
    """A launch registers itself; `diode tune --live TOPOLOGY` finds it, reads every worker's
    counters while records flow and gives each stage, on its side, its load, its cost per
    record and advice; with nothing running it says so (exit 1)."""
    from diode.soak import traffic
    from tests.conftest import Launched, create_topic, write_topology
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
        wait_for(lambda: d.metric("records", "kafka_writer") > 0, 60,
                 "records written to the destination")
        r = live(path, "--json", "--seconds", "4")
        assert r.returncode == 0, r.stderr[-3000:]
        advice = json.loads(r.stdout)
        assert set(advice["stages"]) == STAGES
        assert advice["records_per_second"]["sender"] > 0
        assert advice["records_per_second"]["receiver"] > 0
        for stage, s in advice["stages"].items():
            assert s["side"] == SIDES[stage], (stage, s)
            assert s["instances"] == 1 and s["load"] > 0 and s["advice"], (stage, s)
        assert advice["stages"]["kafka_writer"]["cost_us_per_record"] > 0
        assert "kafka_writer" in live(path, "--seconds", "1").stdout  # the table
    finally:
        if flow is not None:
            flow.stop(timeout=5)
        d.stop()
    assert live(path).returncode == 1  # it unregistered when it stopped


class Trap:
    """A port where a cluster would be, that never answers: it counts the connections made to
    it (a client of that cluster, even one that gave up, connects first)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self):
        self.done.set()
        self.thread.join()
        self.sock.close()


def test_the_receiving_host_measures_its_side_with_the_source_cluster_never_asked(
        tmp_path, start_brokers):
    """On a host across a diode only its own cluster answers: `diode tune --side receiver`
    measures and plans the receiver's stages on the destination cluster alone (at both ends of
    the pipeline it runs), never connects to the source cluster, and leaves no topic behind."""
    from tests.conftest import topics, write_topology
    own, = start_brokers("tansu", "destination")
    trap = Trap()
    try:
        path = write_topology(tmp_path, trap.address, own.bootstrap)
        r = subprocess.run([sys.executable, "-m", "diode", "tune", str(path), "--side",
                            "receiver", "--rate", "1000", "--record-size", "200", "--seconds",
                            "1", "--partitions", "1000", "--json"], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    finally:
        trap.close()
    # (exit 1: no rate fits on a machine this busy; its advice is printed all the same)
    assert r.returncode in (0, 1) and r.stdout.strip(), r.stderr[-3000:]
    advice = json.loads(r.stdout)
    assert advice["measured"]["brokers"] == "the receiver's cluster alone", r.stderr[-2000:]
    assert all(w["records"] > 0 for w in advice["measured"]["windows"])
    assert set(advice["topology"]) == {"receiver"} and set(advice["sides"]) == {"receiver"}
    assert trap.connections == 0  # the source cluster: never asked
    # the partition count it cannot read there is given: what it changes on this side
    p = advice["partitions"]
    assert (p["partitions"], p["from"]) == (1000, "--partitions")
    assert p["kafka_writer"]["partitions_each"] == -(-1000 // p["kafka_writer"]["instances"])
    assert p["checkpoint"]["seconds"] > 0
    if advice["max_rate"] > 0:  # (else other work holds every core at the limit: no plan)
        assert set(advice["stages"]) == {"udp_reader", "unpacker", "kafka_writer"}
        assert all(p["cost_us_per_record"] > 0 for p in advice["stages"].values()), advice
    assert not [t for t in topics(own.bootstrap) if t.startswith("diode-tune-")]


def test_the_sending_hosts_bench_runs_on_the_source_cluster_alone(tmp_path, start_brokers):
    """The reverse, at the bench (the measurement itself is the one above): `--side sender`
    runs the pipeline with the source cluster at both ends, the copies under a prefix of the
    bench's own, never asks the destination cluster, and deletes what it made. The partition
    count it plans for is the sender's topics' there."""
    from diode.tune.command import partition_advice
    from diode.tune.measure import Bench
    from tests.conftest import create_topic, topics, write_topology
    own, = start_brokers("tansu", "source")
    create_topic(own.bootstrap, "src", 3)  # (the topology's sender.topics)
    create_topic(own.bootstrap, "other", 2)
    trap = Trap()
    try:
        path = write_topology(tmp_path, own.bootstrap, trap.address)
        with Bench(topology.load(path), yaml.safe_load(path.read_text()),
                   side="sender") as bench:
            made, topic, _ = bench.topology({"sender": {}, "receiver": {}})
            data = yaml.safe_load(made.read_text())
            assert bench.where == "the sender's cluster alone"
            assert data["sender"]["kafka"] == data["receiver"]["kafka"] == \
                {"bootstrap.servers": own.bootstrap}
            assert data["receiver"]["topic.prefix"].startswith("diode-tune-")
            assert topic in topics(own.bootstrap)
            p = partition_advice(topology.load(path), None, bench, {})
            assert (p["partitions"], p["from"]) == (3, "the sender's topics on the source "
                                                       "cluster")
    finally:
        trap.close()
    assert trap.connections == 0  # the destination cluster: never asked
    assert not [t for t in topics(own.bootstrap) if t.startswith("diode-tune-")]
