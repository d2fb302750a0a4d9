"""`diode tune` and the source's partition count (issue 36, diode.tune.partitions): what the
count changes for the topology's own settings (each reader's heartbeat claims and how often an
idle partition is named, the writers' share of the partitions, a checkpoint's cost), read from
the settings as loaded, so that the advice follows sender.heartbeat.claims.max's meaning
whatever its default is."""

import dataclasses
import math

from diode.runtime import topology
from diode.runtime.settings import SenderSettings
from diode.tune import partitions


def topology_with(sender=None, receiver=None):
    return topology.from_dict({
        "link": {"host": "10.0.0.2", "port": 4000},
        "security": {"password.file": "p", "salt": "s"},
        "sender": {"kafka": {"bootstrap.servers": "a:1"}, "topics": ["t"], **(sender or {})},
        "receiver": {"kafka": {"bootstrap.servers": "b:1"}, **(receiver or {})}})


def test_every_heartbeat_names_every_partition_of_its_reader_with_claims_max_0():
    t = topology_with({"heartbeat.claims.max": 0, "heartbeat.interval.ms": 500,
                       "stages": {"kafka_reader": {"instances": 2}}})
    a = partitions.advise(t, 1001, "--partitions")
    assert a["kafka_reader"] == {"instances": 2, "partitions_each": 501}
    assert a["heartbeat"]["unchanged_claims"] == 501
    assert (a["heartbeat"]["every_heartbeats"], a["heartbeat"]["every_seconds"]) == (1, 0.5)
    assert "every heartbeat names every partition" in "\n".join(partitions.lines(a))


def test_claims_max_n_names_each_idle_partition_every_ceil_share_over_n_heartbeats():
    t = topology_with({"heartbeat.claims.max": 300, "heartbeat.interval.ms": 1000,
                       "stages": {"kafka_reader": {"instances": 2}}})
    a = partitions.advise(t, 10_000, "--partitions")
    h = a["heartbeat"]
    assert (h["claims_max"], h["unchanged_claims"]) == (300, 300)
    assert h["every_heartbeats"] == math.ceil(5000 / 300) == 17
    assert h["every_seconds"] == 17.0
    assert "at least every 17 heartbeat(s) (17 s)" in "\n".join(partitions.lines(a))
    # fewer partitions than the slice: every one in every heartbeat
    small = partitions.advise(t, 100, "--partitions")["heartbeat"]
    assert (small["unchanged_claims"], small["every_heartbeats"]) == (50, 1)


def test_the_advice_follows_the_settings_default_and_the_planned_instances():
    default = next(f.default for f in dataclasses.fields(SenderSettings)
                   if f.name == "heartbeat_claims_max")
    unset = partitions.advise(topology_with(), 2000, "source")["heartbeat"]
    given = partitions.advise(topology_with({"heartbeat.claims.max": default}), 2000,
                              "source")["heartbeat"]
    assert unset == given and unset["claims_max"] == default
    planned = partitions.advise(topology_with(), 2000, "source", readers=4, writers=3)
    assert planned["kafka_reader"]["partitions_each"] == 500
    assert planned["kafka_writer"] == {"instances": 3, "partitions_each": 667}


def test_a_checkpoints_cost_is_measured_and_set_against_the_interval():
    t = topology_with(receiver={"checkpoint.interval.ms": 2000})
    cost = partitions.checkpoint_cost(200)
    assert cost > 0
    a = partitions.advise(t, 200, "--partitions", cost)
    assert a["checkpoint"] == {"interval_seconds": 2.0, "seconds": cost,
                               "writer_share": cost / 2.0}
    assert "checkpoint of its 200 partitions" in "\n".join(partitions.lines(a))
    assert "seconds" not in partitions.advise(t, 200, "--partitions")["checkpoint"]
