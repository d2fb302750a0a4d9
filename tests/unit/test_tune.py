"""diode.tune: the decision behind `diode tune`, on synthetic costs: enough instances for the
target with every core under the limit, the UDP reader alone on a core away from the NIC's
interrupts, and, when the target cannot be met, the highest rate that can and what stops it."""

import time
import pytest
import yaml

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


def topology_for(host="10.0.0.2", rate_mbps=0):
    from diode.runtime import topology
    return topology.from_dict({"link": {"host": host, "port": 4000,
                                        "datagram.size.bytes": 8972, "rate.mbps": rate_mbps},
                               "security": {"password.file": "p", "salt": "s"},
                               "sender": {"kafka": {"bootstrap.servers": "a:1"},
                                          "topics": ["t"]},
                               "receiver": {"kafka": {"bootstrap.servers": "b:1"}}})


def measured(costs=None, records=200_000, datagrams=5000, wire_bytes=8972):
    from diode.tune import Measured, Window
    costs = costs or {**SENDER, **RECEIVER}
    w = Window(8972, 10.0, records, datagrams, datagrams * wire_bytes, 0,
               {s: c * records * 1e-6 for s, c in costs.items()}, {})
    return Measured(200, records / 10, records / datagrams, costs, costs,
                    dict.fromkeys(costs, 0.0), "embedded tansu", [w])


FACTS = {"sysctl": {"net.core.rmem_max": 212992, "net.core.wmem_max": 212992,
                    "net.core.netdev_max_backlog": 1000}, "device": "eth0", "qdisc": "fq_codel"}


def test_the_advice_has_every_stage_of_both_sides_and_the_sysctls_too_small():
    from diode.tune import advise, table
    t = topology_for(rate_mbps=1000)
    a = advise(t, measured(), 100_000, Machine(cores=(0, 1, 2, 3)), FACTS)
    assert a["measured"]["records_per_datagram"] == 40
    assert set(a["stages"]) == set(SENDER) | set(RECEIVER) and a["fits"]
    for stage, p in a["stages"].items():
        assert p["instances"] >= 1 and p["cores"] and p["cost_us_per_record"] > 0
        assert a["topology"][p["side"]][stage]["instances"] == p["instances"]
    assert {c["name"] for c in a["sysctl"]} == {"net.core.rmem_max", "net.core.wmem_max"}
    text = table(a)
    # the columns say what they count, in which unit
    assert all(h in text.splitlines()[1] for h in ("CPU µs per record", "CPU µs per datagram",
                                                   "cores busy at target", "on CPUs"))
    assert "fits: up to about" in text and "sysctl -w net.core.rmem_max=" in text
    assert "tc qdisc replace dev eth0 root fq" in text  # pacing by the kernel, not a loop
    worse = advise(t, measured(), 1_000_000, Machine(cores=(0, 1)), FACTS)
    assert not worse["fits"] and not worse["sides"]["receiver"]["fits"]
    assert 0 < worse["max_rate"] < 1_000_000 and worse["bottleneck"]
    assert "does NOT fit: at most" in table(worse)


@pytest.mark.parametrize("side,stages,sysctls", [
    ("receiver", RECEIVER, {"net.core.rmem_max"}),
    ("sender", SENDER, {"net.core.wmem_max"})])
def test_one_side_is_planned_alone_on_its_own_host(side, stages, sysctls):
    """--side: the plan, the sysctls and the topology change are that side's only, on this
    machine as its host (even with the link on loopback); the other side's stages, which ran
    only to feed or drain it, are not planned, and its section of the file is left alone."""
    from diode.tune import advise, edit, table
    a = advise(topology_for(host="127.0.0.1", rate_mbps=1000), measured(), 100_000,
               Machine(cores=(0, 1, 2, 3)), FACTS, side=side)
    assert set(a["stages"]) == set(stages) and set(a["sides"]) == {side}
    assert not a["shared_machine"] and a["side"] == side
    assert set(a["topology"]) == {side} and set(a["topology"][side]) == set(stages)
    assert {c["name"] for c in a["sysctl"]} == sysctls
    assert (a["pacing"] is not None) == (side == "sender")
    assert f"the {side} side only" in table(a).splitlines()[0]
    text = "sender:\n  topics: [t]\nreceiver:\n  topic.prefix: x.\n"
    other = "receiver" if side == "sender" else "sender"
    new = edit.proposed_text(text, a["topology"])
    assert yaml.safe_load(new)[other] == yaml.safe_load(text)[other]
    assert set(yaml.safe_load(new)[side]["stages"]) == set(stages)


def test_verifying_one_sides_plan_runs_the_other_as_one_instance_each_and_leaves_it_out():
    from diode.tune import advise
    from diode.tune.command import verify
    from diode.tune.measure import Window
    a = advise(topology_for(), measured(), 10_000, Machine(cores=(0, 1, 2, 3)), FACTS,
               side="receiver")
    ran = {}

    class Bench:
        def window(self, stages, rate, mix, seconds):
            ran.update(stages)
            busy = {f"{side}/{stage}-0": RECEIVER.get(stage, 50.0) * rate * seconds * 1e-6
                    for side in ("sender", "receiver") for stage in stages[side]}
            return Window(8972, seconds, int(rate * seconds), 100, 0, 0, {}, busy)
    v = verify(Bench(), a, [(200, 1.0)], seconds=10)
    assert ran["sender"] == {stage: {"instances": 1} for stage in SENDER}
    assert ran["receiver"] == a["topology"]["receiver"]
    assert all(core.startswith("receiver:") for core in v["cores"])
    assert v["within"], v  # the sender's workers (50 µs a record each here) not counted


def test_the_link_pacing_bounds_the_rate_it_can_carry():
    from diode.tune import advise
    # 8972 + 28 bytes a datagram, 40 records each: 225 bytes of wire a record; 100 Mbit/s
    # carries about 55 500 records/s however many cores there are
    a = advise(topology_for(rate_mbps=100), measured(), 80_000,
               Machine(cores=tuple(range(16))), FACTS)
    assert not a["fits"] and a["bottleneck"] == "link.rate.mbps"
    assert 55_000 <= a["max_rate"] <= 56_000


def test_both_sides_on_one_machine_are_placed_together():
    """A link on loopback: sender and receiver share this machine's cores, so they are placed
    together: the UDP reader keeps a core to itself from every other worker of both sides."""
    from diode.tune import advise
    a = advise(topology_for(host="127.0.0.1"), measured(), 20_000, Machine(cores=(0, 1)),
               FACTS)
    assert a["shared_machine"] and set(a["sides"]) == {"both"}
    reader = a["stages"]["udp_reader"]["cores"]
    others = {c for s, p in a["stages"].items() if s != "udp_reader" for c in p["cores"]}
    assert len(reader) == 1 and reader[0] not in others
    assert sum(a["sides"]["both"]["core_load"].values()) == pytest.approx(20_000 * 26e-6)


def test_a_stage_cost_splits_into_its_per_record_and_per_datagram_parts():
    from diode.tune.measure import Window, fit
    # the packer: 2 µs a record and 50 µs a datagram; the writer: 9 µs a record only
    def window(records, datagrams):
        return Window(8972, 10, records, datagrams, 0, 0,
                      {"packer": (2 * records + 50 * datagrams) * 1e-6,
                       "kafka_writer": 9 * records * 1e-6}, {})
    per_record, per_datagram = fit(window(100_000, 2_500), window(100_000, 20_000))
    assert per_record["packer"] == pytest.approx(2) and per_datagram["packer"] == pytest.approx(50)
    assert per_record["kafka_writer"] == pytest.approx(9)
    assert per_datagram["kafka_writer"] == pytest.approx(0, abs=1e-9)


def test_sampled_sizes_become_a_small_mix_of_sizes_and_weights():
    from diode.tune.measure import size_mix
    mix = size_mix([100] * 700 + [1000] * 200 + [10_000] * 100, buckets=8)
    assert mix == [(100, pytest.approx(0.7)), (1000, pytest.approx(0.2)),
                   (10_000, pytest.approx(0.1))]
    spread = size_mix(list(range(16, 1016)), buckets=4)  # many sizes: four shares by rank
    assert [s for s, _ in spread] == [140, 390, 640, 890]  # (16..265 averages 140.5)
    assert all(w == pytest.approx(0.25) for _, w in spread)
    assert size_mix([3, 5]) == [(16, 1.0)]  # never under the traffic's 16 bytes


TOPOLOGY = """\
# the demo's topology, as an operator keeps it
name: demo
link:
  host: 127.0.0.1   # loopback
  port: 3456
sender:
  topics: [diode]
  stages:
    kafka_reader: {instances: 1}
    packer: {instances: 1}    # was enough for 10 000/s
receiver:
  topics.prefix: dest_
brokers:
  - {name: source, kind: tansu, side: sender, listen: "127.0.0.1:19092"}
"""


def test_the_plan_is_written_into_the_file_keeping_its_comments_and_layout(tmp_path):
    from diode.tune import edit
    plan = {"sender": {"kafka_reader": edit.stage_settings(1, [0]),
                       "packer": edit.stage_settings(2, [0, 1]),
                       "udp_sender": edit.stage_settings(1, [1])},
            "receiver": {"udp_reader": edit.stage_settings(1, [1]),
                         "unpacker": edit.stage_settings(1, [0]),
                         "kafka_writer": edit.stage_settings(2, [0, 0])}}
    new = edit.proposed_text(TOPOLOGY, plan)
    assert "# the demo's topology, as an operator keeps it" in new
    assert "host: 127.0.0.1   # loopback" in new
    packer = next(line for line in new.splitlines() if "packer:" in line)
    assert packer.startswith("    packer: {instances: 2, cpus: [0, 1], pin.per.instance: true}")
    assert packer.endswith("# was enough for 10 000/s")  # its comment stays on its line
    assert "    kafka_reader: {instances: 1, cpus: [0]}" in new
    assert '  - {name: source, kind: tansu, side: sender, listen: "127.0.0.1:19092"}' in new
    # a stage the file did not name, and a side without stages, get them
    data = yaml.safe_load(new)
    assert data["sender"]["stages"]["udp_sender"] == {"instances": 1, "cpus": [1]}
    assert data["receiver"]["stages"]["kafka_writer"] == {"instances": 2, "cpus": [0]}
    assert data["receiver"]["topics.prefix"] == "dest_"
    d = edit.diff("t.yaml", TOPOLOGY, new)
    assert "-    packer: {instances: 1}" in d and "+    packer: {instances: 2" in d
    path = tmp_path / "t.yaml"
    path.write_text(TOPOLOGY)
    path.chmod(0o640)
    edit.write(path, new)
    assert path.read_text() == new and path.stat().st_mode & 0o777 == 0o640
    # written once more, nothing changes: the plan is already there
    assert edit.proposed_text(new, plan) == new
    fewer = {"sender": {"packer": edit.stage_settings(1, [1])}}
    assert "pin.per.instance" not in edit.proposed_text(new, fewer).split("packer:")[1] \
        .splitlines()[0]


def snapshot(t, workers, **totals):
    """A launch's metrics as diode.tune.live.snapshot reads them."""
    out = {}
    for name, (cpu, blocked, records) in workers.items():
        side, rest = name.split("/")
        stage, index = rest.rsplit("-", 1)
        out[name] = {"side": side, "stage": stage, "index": int(index), "state": "running",
                     "restarts": 0, "cpu_seconds": cpu, "output_blocked_seconds": blocked,
                     "output_queue_messages": 4 if blocked else 0, "records": records,
                     "datagrams": 0}
    return {"t": t, "workers": out, "totals": totals, "sides": ["sender", "receiver"]}


def test_live_advice_widens_the_hot_stage_narrows_the_idle_one_and_names_the_slow_one():
    from diode.tune import live
    before = snapshot(0.0, {"receiver/udp_reader-0": (0, 0, 0),
                            "receiver/unpacker-0": (0, 0, 0), "receiver/unpacker-1": (0, 0, 0),
                            "receiver/kafka_writer-0": (0, 0, 0)},
                      socket_drops=10, journal_unforwarded_bytes=0, backlog_records=0)
    # over 10 s: the writer busy 9.5 s (95 %), the unpackers 1 s each and blocked on it 6 s,
    # the reader at 20 %; 100 000 records written; 250 datagrams dropped
    after = snapshot(10.0, {"receiver/udp_reader-0": (2, 0, 0),
                            "receiver/unpacker-0": (1, 6, 50_000),
                            "receiver/unpacker-1": (1, 6, 50_000),
                            "receiver/kafka_writer-0": (9.5, 0, 100_000)},
                     socket_drops=260, journal_unforwarded_bytes=50 << 20, backlog_records=0)
    a = live.advise(before, after)
    assert a["records_per_second"] == {"receiver": 10_000}
    s = a["stages"]
    assert s["kafka_writer"]["advice"] == "widen to 2 instances"
    assert s["kafka_writer"]["cost_us_per_record"] == pytest.approx(95)
    assert s["unpacker"]["advice"] == "narrow to 1 instances (frees a core)"
    assert s["udp_reader"]["advice"] == "keep"
    assert s["unpacker"]["queued"] == 8 and s["kafka_writer"]["queued"] == 0
    notes = "\n".join(a["notes"])
    assert "unpacker waited on kafka_writer 60% of the time" in notes
    assert "dropped 250 datagrams" in notes and "50.0 MiB of datagrams wait" in notes
    hot = snapshot(10.0, {"receiver/udp_reader-0": (8, 0, 0)})
    cold = snapshot(0.0, {"receiver/udp_reader-0": (0, 0, 0)})
    assert "bounds the rate" in live.advise(cold, hot)["stages"]["udp_reader"]["advice"]
    text = live.table(a)
    assert "widen to 2 instances" in text and "receiver 10 000 records/s" in text
    assert all(h in text.splitlines()[1] for h in (
        "CPU % of one core", "busiest instance", "% of time blocked", "messages queued",
        "CPU µs per record", "records/s"))


def test_live_finds_no_launch_and_says_so(tmp_path):
    from diode.errors import DiodeError
    from diode.tune import live
    with pytest.raises(DiodeError, match="no diode launch is running for"):
        live.find(str(tmp_path / "never-launched.yaml"), None)


def test_a_machine_whose_cores_other_work_holds_at_the_limit_fits_no_rate_and_says_why():
    """Nothing is left to plan on: max rate 0, and diode tune names the cores' load instead of
    verifying a plan at 0 records/s."""
    from diode.tune.command import busy_cores
    m = Machine(cores=(0, 1), busy={0: 0.9, 1: 0.75})
    d = decide("sender", SENDER, 1000, m)
    assert not d.fits and d.max_rate == 0
    assert busy_cores(m, 0.6) == ("no rate fits on this machine now: other processes already "
                                  "keep every core this process may use at or over 60% (0: "
                                  "90%, 1: 75%); run diode tune when they are done, or on the "
                                  "host the side will run on")


def test_a_window_is_sampled_after_the_workers_metrics_are_written_again(tmp_path):
    """A measured window counts the records of the metrics files written in it: a sample read
    before the workers wrote theirs again (about once a second, later on a busy machine) would
    see the same count twice, and a 1 s window "no record crossed" (issue 36's CI)."""
    import os
    import threading
    from diode.tune.measure import _rewritten
    receiver, sender = tmp_path / "run-receiver", tmp_path / "run-sender"
    files = [receiver / "metrics" / "receiver-kafka_writer-0.prom",
             receiver / "metrics" / "receiver-kafka_writer-1.prom",
             sender / "metrics" / "sender-udp_sender-0.prom"]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("old\n")
        os.utime(f, (time.time() - 0.6, time.time() - 0.6))
    since = time.time()

    def write_each_later():  # (as a worker writes its metrics: a whole file renamed in place)
        for f in files:
            time.sleep(0.15)
            f.with_suffix(".tmp").write_text("new\n")
            os.replace(f.with_suffix(".tmp"), f)
    t = threading.Thread(target=write_each_later)
    t.start()
    at = _rewritten([(receiver, "kafka_writer"), (sender, "udp_sender")], since, limit=5)
    seen = [f.read_text() for f in files]  # (as a sample then would read them)
    t.join()
    assert seen == ["new\n"] * 3, "sampled before every worker wrote its metrics again"
    assert since <= at == max(os.stat(f).st_mtime for f in files[:2])
