"""diode.tune.capacity: what this machine's receiver takes, and `diode check`'s warning from it."""

import pytest

from diode.runtime import topology
from diode.tune.capacity import ReceiverCapacity, check_rate, measure_receiver
from diode.tune.decide import UTILISATION


def topo(rate_mbps=400.0, **stages):
    return topology.from_dict({
        "link": {"port": 9999, "datagram.size.bytes": 8972, "rate.mbps": rate_mbps},
        "security": {"password.env": "X", "salt": "salt"},
        "compression": "zstd",
        "sender": {"kafka": {"bootstrap.servers": "x:1"}, "topics": ["t"]},
        "receiver": {"kafka": {"bootstrap.servers": "x:1"},
                     "stages": {k: {"instances": v} for k, v in stages.items()}},
    })


def capacity(cost, instances, cores=2):
    return ReceiverCapacity(1024, 8, 8972, cost, instances, cores)


def test_the_slowest_stage_for_its_instances_sets_the_rate():
    c = capacity({"udp_reader": 5, "unpacker": 30, "kafka_writer": 60},
                 {"udp_reader": 1, "unpacker": 2, "kafka_writer": 1}, cores=8)
    rate, limit = c.max_datagrams_per_second()
    assert limit == "kafka_writer" and rate == pytest.approx(UTILISATION / 60e-6)
    c.instances["kafka_writer"] = 4  # four writers: now the unpackers limit
    rate, limit = c.max_datagrams_per_second()
    assert limit == "unpacker" and rate == pytest.approx(UTILISATION * 2 / 30e-6)


def test_check_holds_the_receiver_to_the_utilisation_diode_tune_plans_for():
    """One figure: a receiver `diode tune` sized for a rate (every core under its 70 %) is not
    then warned of by `diode check` for that rate (which held it to 60 % before)."""
    c = capacity({"udp_reader": 5, "unpacker": 30, "kafka_writer": 60},
                 {"udp_reader": 1, "unpacker": 2, "kafka_writer": 1}, cores=8)
    rate, _ = c.max_datagrams_per_second()
    assert UTILISATION == 0.7 and rate == pytest.approx(0.7 / 60e-6)
    lines, _ = check_rate(topo(), c)
    assert "with every core under 70%" in lines[0]


def test_cores_shared_by_every_stage_set_the_rate_on_a_small_machine():
    c = capacity({"udp_reader": 5, "unpacker": 30, "kafka_writer": 60},
                 {"udp_reader": 1, "unpacker": 4, "kafka_writer": 4}, cores=1)
    rate, limit = c.max_datagrams_per_second()
    assert limit == "cores" and rate == pytest.approx(UTILISATION / 95e-6)
    mbps, _ = c.max_mbps()
    assert round(mbps) == round(rate * (8972 + 28) * 8 / 1e6)


def test_a_rate_above_the_measured_capacity_is_warned_about_with_the_remedy():
    c = capacity({"udp_reader": 5, "unpacker": 30, "kafka_writer": 600},
                 {"udp_reader": 1, "unpacker": 1, "kafka_writer": 1})
    mbps, _ = c.max_mbps()  # about 72 Mbit/s
    lines, warning = check_rate(topo(rate_mbps=100), c)
    assert "limited by kafka_writer" in lines[0]
    assert warning and "link.rate.mbps 100" in warning and "kafka_writer" in warning
    assert check_rate(topo(rate_mbps=mbps * 0.9), c)[1] is None


def test_measuring_this_machine_runs_the_receivers_own_code():
    c = measure_receiver(topo(unpacker=2), record_bytes=512, datagrams=60)
    assert set(c.cost_us) == {"udp_reader", "unpacker", "kafka_writer"}
    assert all(us > 0 for us in c.cost_us.values())
    assert 10 < c.records_per_datagram < 8972 / 512  # random values: no compression gain
    assert c.instances["unpacker"] == 2


def test_diode_check_measures_the_receiver_and_warns_only_above_it(tmp_path):
    import subprocess
    import sys
    from tests.conftest import write_topology

    def check(rate, *extra):
        path = write_topology(tmp_path, "127.0.0.1:1", "127.0.0.1:2",
                              link={"rate.mbps": rate})
        return subprocess.run([sys.executable, "-m", "diode", "check", str(path), "--timeout",
                               "0.5", *extra], capture_output=True, text=True)

    r = check(1_000_000)  # a terabit of 1 KiB records: no 2-core receiver takes that
    assert r.returncode == 0, r.stderr
    assert "receiver capacity on this machine, records of 1024 bytes" in r.stdout
    assert "warning: link.rate.mbps 1e+06 exceeds what this machine's receiver" in r.stderr
    r = check(1, "--record-bytes", "4096")  # 1 Mbit/s: any receiver takes it
    exceeds = "warning: link.rate.mbps"  # (the clusters, not there, are warned of too)
    assert "records of 4096 bytes" in r.stdout and exceeds not in r.stderr
    r = check(1_000_000, "--no-measure")
    assert "receiver capacity" not in r.stdout and exceeds not in r.stderr
    r = check(1_000_000, "--side", "sender")  # the sender's host has no receiver to measure
    assert "receiver capacity" not in r.stdout
