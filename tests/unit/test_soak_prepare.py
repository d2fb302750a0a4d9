"""diode.soak.run.Soak.prepare: what a soak of an operator's own topology may inject is decided
before anything starts: clusters that are not the topology's embedded brokers cannot be paused
or stopped, so the built-in schedule leaves those faults out and a schedule that asks for them
is refused."""

import argparse

import pytest
import yaml

from diode.errors import DiodeError
from diode.soak.run import Soak
from diode.soak.schedule import KINDS


def args(tmp_path, **extra):
    (tmp_path / "password").write_text("soak password\n")
    topology = tmp_path / "topology.yaml"
    topology.write_text(yaml.safe_dump({
        "name": "mine", "link": {"host": "127.0.0.1", "port": 4000, "rate.mbps": 100},
        "security": {"password.file": "password", "salt": "s"},
        "sender": {"kafka": {"bootstrap.servers": "10.1.1.1:9092"}, "topics": ["a"]},
        "receiver": {"kafka": {"bootstrap.servers": "10.2.2.2:9092"}, "topic.prefix": "x_"}}))
    base = dict(topology=str(topology), duration="10m", rate="1000", sizes="200", topics=2,
                partitions=2, faults=None, report=str(tmp_path / "r"), seed=1,
                broker_kind=None, max_rss_slope=20.0, fault_margin=10.0, format="auto",
                no_view=True)
    return argparse.Namespace(**{**base, **extra})


def test_external_clusters_leave_broker_faults_out_of_the_built_in_schedule(tmp_path):
    plan = Soak(args(tmp_path)).prepare()
    kinds = {f.kind for f in plan.faults}
    assert kinds == set(KINDS) - {"destination-pause", "destination-stop", "source-pause"}
    assert plan.brokers == {} and len(plan.topics) == 2
    assert not (tmp_path / "r").exists()  # nothing started, nothing written


def test_a_schedule_that_pauses_an_external_cluster_is_refused(tmp_path):
    faults = tmp_path / "faults.yaml"
    faults.write_text("faults:\n  - {at: 1m, kind: destination-pause}\n")
    with pytest.raises(DiodeError, match="destination cluster is not an embedded broker"):
        Soak(args(tmp_path, faults=str(faults))).prepare()


def test_one_cluster_without_a_prefix_is_refused(tmp_path):
    a = args(tmp_path)
    data = yaml.safe_load(open(a.topology))
    data["receiver"] = {"kafka": {"bootstrap.servers": "10.1.1.1:9092"}}
    open(a.topology, "w").write(yaml.safe_dump(data))
    with pytest.raises(DiodeError, match="back into the topics it reads"):
        Soak(a).prepare()
