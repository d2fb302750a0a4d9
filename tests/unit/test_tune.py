"""diode.tune: the decision behind `diode tune`, on synthetic costs: enough instances for the
target with every core under the limit, the UDP reader alone on a core away from the NIC's
interrupts, and, when the target cannot be met, the highest rate that can and what stops it."""

import pytest

from diode.tune import Machine, decide

RECEIVER = {"udp_reader": 1.0, "unpacker": 6.0, "kafka_writer": 9.0}   # µs per record
SENDER = {"kafka_reader": 4.0, "packer": 5.0, "udp_sender": 1.0}


def test_instances_cover_the_load_and_every_core_stays_under_the_limit():
    d = decide("receiver", RECEIVER, 150_000, Machine(cores=tuple(range(8))))
    assert d.fits
    # unpacker 0.9 cores of work -> 2 instances, writer 1.35 -> 2
    assert {s: p.instances for s, p in d.stages.items()} == \
        {"udp_reader": 1, "unpacker": 2, "kafka_writer": 2}
    assert all(load <= 0.7 + 1e-9 for load in d.core_load.values())
    reader_core = d.stages["udp_reader"].cores[0]
    others = [c for s, p in d.stages.items() if s != "udp_reader" for c in p.cores]
    assert reader_core not in others
    assert d.max_rate > 150_000


def test_the_reader_avoids_the_nic_interrupt_cores_and_busy_cores_count():
    m = Machine(cores=(0, 1, 2, 3), irq_cores=(0, 1), busy={2: 0.5})
    d = decide("receiver", RECEIVER, 50_000, m)
    assert d.fits and d.stages["udp_reader"].cores == [3]
    assert d.core_load[2] <= 0.7 + 1e-9


def test_an_impossible_target_names_the_highest_rate_and_the_limiting_stage():
    # one udp_reader at 1 µs per record carries at most 0.7 / 1e-6 = 700 000 records/s
    d = decide("receiver", RECEIVER, 1_000_000, Machine(cores=tuple(range(64))))
    assert not d.fits and d.bottleneck == "udp_reader"
    assert 690_000 <= d.max_rate <= 700_000
    assert d.stages and all(load <= 0.7 + 1e-9 for load in d.core_load.values())


def test_cores_run_out_before_any_stage_does():
    d = decide("sender", SENDER, 200_000, Machine(cores=(0, 1)))
    assert not d.fits and d.bottleneck == "cores"
    # 10 µs per record on two cores at 70 %: at most 140 000 records/s, less with packing
    assert 0 < d.max_rate <= 140_000
    assert decide("sender", SENDER, d.max_rate, Machine(cores=(0, 1))).fits


def test_a_one_core_machine_shares_its_core_and_says_how_far_it_goes():
    one = Machine(cores=(0,))
    d = decide("receiver", RECEIVER, 20_000, one)
    assert d.fits and set(c for p in d.stages.values() for c in p.cores) == {0}
    assert d.core_load[0] == pytest.approx(20_000 * 16e-6)
    big = decide("receiver", RECEIVER, 100_000, one)
    assert not big.fits and big.bottleneck == "cores"
    assert 40_000 <= big.max_rate <= 43_750  # 0.7 / 16 µs


INTERRUPTS = """           CPU0       CPU1       CPU2       CPU3
 28:          0          0 PCI-MSIX   0-edge      virtio0-config
 38:          0     103104          0          0 PCI-MSIX   1-edge      virtio2-input.0
 39:      78465          0          0          0 PCI-MSIX   2-edge      virtio2-output.0
 50:          0          0        12          0 PCI-MSIX   1-edge      eth1-rx-0
 51:          0          0          0        40 PCI-MSIX   2-edge      eth1-tx-0
LOC:    9340354    9316139    9316139    9316139   Local timer interrupts
"""


def test_nic_interrupt_cores_are_where_its_receive_interrupts_land():
    from diode.tune import irq_cores
    assert irq_cores("eth0", INTERRUPTS, "virtio2") == (1,)
    assert irq_cores("eth1", INTERRUPTS) == (2,)
    assert irq_cores("lo", INTERRUPTS) == ()


def test_sysctls_too_small_for_the_rate_are_named_with_the_value_to_set():
    from diode.tune import sysctl_advice
    now = {"net.core.rmem_max": 4 << 20, "net.core.wmem_max": 4 << 20,
           "net.core.netdev_max_backlog": 1000}
    # 1 Gbit/s of 8972-byte datagrams: 125 MB/s, ~14 000 datagrams/s
    advice = {name: wanted for name, _, wanted, _ in sysctl_advice("receiver", 125e6, 14000,
                                                                   now)}
    assert advice == {"net.core.rmem_max": 31_250_000}
    advice = {name: wanted for name, _, wanted, _ in sysctl_advice("sender", 125e6, 140000, now)}
    assert advice == {"net.core.wmem_max": 6_250_000, "net.core.netdev_max_backlog": 1400}
    assert sysctl_advice("receiver", 1e6, 100, now) == []


def test_the_advice_has_every_stage_of_both_sides_and_the_sysctls_too_small():
    from diode import topology
    from diode.tune import Measured, advise, table
    t = topology.from_dict({"link": {"host": "127.0.0.1", "port": 4000,
                                     "datagram.size.bytes": 8972},
                            "security": {"password.file": "p", "salt": "s"},
                            "sender": {"kafka": {"bootstrap.servers": "a:1"}, "topics": ["t"]},
                            "receiver": {"kafka": {"bootstrap.servers": "b:1"}}})
    m = Measured(200, 20000, 200000, 5000, {**SENDER, **RECEIVER}, "embedded tansu")
    facts = {"sysctl": {"net.core.rmem_max": 212992, "net.core.wmem_max": 212992,
                        "net.core.netdev_max_backlog": 1000}}
    a = advise(t, m, 100_000, Machine(cores=(0, 1, 2, 3)), facts)
    assert a["records_per_datagram"] == 40
    for side, stages in (("sender", SENDER), ("receiver", RECEIVER)):
        s = a["sides"][side]
        assert set(s["stages"]) == set(stages) and s["fits"]
        assert all(p["instances"] >= 1 and p["cores"] for p in s["stages"].values())
    assert {c["name"] for c in a["sysctl"]} == {"net.core.rmem_max", "net.core.wmem_max"}
    text = table(a)
    assert "fits at 100,000 records/s" in text and "sysctl -w net.core.rmem_max=" in text
    worse = advise(t, m, 1_000_000, Machine(cores=(0, 1)), facts)
    assert not worse["sides"]["receiver"]["fits"]
    assert "does not fit: at most" in table(worse)
