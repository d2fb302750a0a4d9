"""The link as it is deployed: two hosts, datagrams that fit the MTU (diode.testbed).

This host is the sending host: the source broker and `diode launch --side sender`. The receiving
host is a network namespace joined by a veth pair of MTU 1500: the destination broker and
`--side receiver` run there, and the link runs over the pair's addresses, never 127.0.0.1.
`link.datagram.size.bytes` is left `auto`: 1472 on this path, and no datagram is fragmented on
the way (the receiving host's kernel reassembles none). The first test, which restarts the
receiver (its writers then read back what the destination holds), runs on Apache Kafka and on
Tansu; the others are about the path alone and run on Tansu.
"""

import json
import random
import socket
import subprocess
import sys
import threading

import pytest

from diode.kafka.brokers import free_port
from diode.link.linksim import Faults, FaultSettings, LinkSim
from tests.conftest import (ROOT, consume, create_topic, only_on, produce, read_until,
                            source_coordinates, wait_for, write_topology)

RECEIVER_WORKERS, SENDER_WORKERS = 3, 3


def ip_counters(bed, table: str = "Ip") -> dict:
    """The receiving host's kernel counters of /proc/net/snmp (its namespace's own)."""
    lines = [ln.split() for ln in subprocess.run(bed.run_in(["cat", "/proc/net/snmp"]),
                                                  capture_output=True, text=True,
                                                  check=True).stdout.splitlines()
             if ln.startswith(f"{table}:")]
    return dict(zip(lines[0][1:], map(int, lines[1][1:])))


def two_hosts(bed, start_brokers, broker_kind) -> tuple:
    """(source broker on this host, destination broker on the receiving host)."""
    src, = start_brokers(broker_kind, "source")
    dst, = start_brokers(broker_kind, "destination", host=bed.low, where=bed.run_in([]))
    create_topic(src.bootstrap, "src", 2)
    return src, dst


def two_host_topology(tmp_path, bed, src, dst, link=None):
    """Both sides' topology: the link to the receiving host over the pair, its size auto; the
    receiver binds link.host (auto) and admits the sending host's address alone."""
    port = free_port(socket.SOCK_DGRAM)
    topo = write_topology(
        tmp_path, src.bootstrap, dst.bootstrap,
        link={"host": bed.low, "port": port, "bind.address": "auto",
              "source.addresses": [bed.high],
              "datagram.size.bytes": "auto", "rate.mbps": 100, **(link or {})},
        receiver={"missing.records.topic": "missing", "reorder.wait.ms": 500,
                  "checkpoint.interval.ms": 500},
        sender={"heartbeat.interval.ms": 300})
    return topo, port


def records(n: int, start: int = 0) -> list:
    """Values of 50 B to 4 KiB (some cross in several datagrams), over 2 partitions."""
    rng = random.Random(start)
    return [{"value": b"%06d." % i + rng.randbytes(rng.choice((50, 200, 1400, 4000))),
             "partition": i % 2} for i in range(start, start + n)]


def test_records_cross_two_hosts_at_the_mtu_and_a_receiver_restart(tmp_path, testbed,
                                                                    start_brokers, broker_kind,
                                                                    launch):
    """Every record arrives intact over the pair, in datagrams of at most 1472 bytes (none
    fragmented); the receiving host's receiver stopped and started again: what was sent
    meanwhile is reported as receiver-down, the rest arrives."""
    bed = testbed
    src, dst_broker = two_hosts(bed, start_brokers, broker_kind)
    dst = dst_broker.bootstrap
    topo, _ = two_host_topology(tmp_path, bed, src, dst_broker)
    reassembled = ip_counters(bed).get("ReasmReqds", 0)
    received = ip_counters(bed, "Udp")["InDatagrams"]
    receiver = launch(topo, side="receiver", workers=RECEIVER_WORKERS, where=bed.run_in([]))
    sender = launch(topo, side="sender", workers=SENDER_WORKERS)
    sent = records(600)
    produce(src.bootstrap, "src", sent)
    got = consume(dst, "dst_src", 600, timeout=90, idle=1.0)
    assert sorted(m.value() for m in got) == sorted(r["value"] for r in sent), \
        receiver.output()[-3000:]
    assert "datagrams up to 1472 bytes (auto: MTU 1500 of" in subprocess.run(
        [sys.executable, "-m", "diode", "check", str(topo), "--side", "sender", "--no-measure"],
        capture_output=True, text=True, cwd=ROOT).stdout
    assert ip_counters(bed, "Udp")["InDatagrams"] - received > 600 // 3  # they came over UDP
    assert ip_counters(bed).get("ReasmReqds", 0) == reassembled  # and none in fragments
    # many datagrams per call (GSO, GRO): fewer send calls than datagrams
    assert sender.metric("udp_offload", "udp_sender") == 1
    assert receiver.metric("udp_offload", "udp_reader") == 1
    assert sender.metric("syscalls", "udp_sender") < sender.metric("datagrams", "udp_sender")

    assert receiver.stop() == 0
    produce(src.bootstrap, "src", records(300, 600))  # sent while no receiver reads
    wait_for(lambda: sender.metric("records", "kafka_reader") >= 900, 60,
             "the sender to read the records produced while no receiver reads")
    receiver = launch(topo, side="receiver", workers=RECEIVER_WORKERS, where=bed.run_in([]))
    produce(src.bootstrap, "src", records(300, 900))
    written, missing = {}, {}

    def take(m):
        if m.topic() == "missing":
            e = json.loads(m.value())
            if e["type"] == "missing":
                for o in range(e["firstOffset"], e["lastOffset"] + 1):
                    missing[(e["sourcePartition"], o)] = e["reason"]
        else:
            h = dict(m.headers())
            key = (int(h["sourcePartition"]), int(h["sourceOffset"]))
            written[key] = written.get(key, 0) + 1
    everything = {(p, o) for p in range(2) for o in range(600)}
    read_until(dst, ("dst_src", "missing"), take,
               lambda: everything <= set(written) | set(missing), timeout=90)
    assert everything <= set(written) | set(missing), (len(written), len(missing))
    assert not set(written) & set(missing) and max(written.values()) == 1
    assert set(missing.values()) <= {"receiver-down"}
    assert all((p, o) in written for p in range(2) for o in range(450, 600))  # after the restart
    assert sender.stop() == 0 and receiver.stop() == 0


def records_cross(tmp_path, bed, start_brokers, broker_kind, launch, link: dict) -> tuple:
    """Both sides launched over the pair with `link` settings, 200 records produced: every
    one arrives. Returns the (sender, receiver) launches, still running."""
    src, dst = two_hosts(bed, start_brokers, broker_kind)
    topo, _ = two_host_topology(tmp_path, bed, src, dst, link=link)
    receiver = launch(topo, side="receiver", workers=RECEIVER_WORKERS, where=bed.run_in([]))
    sender = launch(topo, side="sender", workers=SENDER_WORKERS)
    sent = records(200)
    produce(src.bootstrap, "src", sent)
    got = consume(dst.bootstrap, "dst_src", 200, timeout=90, idle=1.0)
    assert sorted(m.value() for m in got) == sorted(r["value"] for r in sent)
    return sender, receiver


@only_on("tansu")  # (the path's doing, not the broker's)
def test_without_segmentation_offload_the_same_records_cross(tmp_path, testbed, start_brokers,
                                                              broker_kind, launch):
    """link.gso.enabled and link.gro.enabled false (as where the kernel refuses them): one
    datagram per call, and the same records arrive."""
    sender, receiver = records_cross(tmp_path, testbed, start_brokers, broker_kind, launch,
                                     {"gso.enabled": False, "gro.enabled": False})
    assert sender.metric("udp_offload", "udp_sender") == 0
    assert receiver.metric("udp_offload", "udp_reader") == 0
    assert sender.metric("syscalls", "udp_sender") == sender.metric("datagrams", "udp_sender")
    assert sender.stop() == 0 and receiver.stop() == 0


@only_on("tansu")  # (the path's doing, not the broker's)
def test_datagrams_the_path_fragments_cross_when_allowed(tmp_path, testbed, start_brokers,
                                                        broker_kind, launch):
    """8000-byte datagrams over an MTU of 1500 with link.allow.fragmentation: the kernel
    refuses GSO batches of segments longer than the MTU (EMSGSIZE), so the sender goes on one
    datagram per call, says so, and every record arrives, in fragments reassembled there."""
    reassembled = ip_counters(testbed).get("ReasmReqds", 0)
    sender, receiver = records_cross(tmp_path, testbed, start_brokers, broker_kind, launch,
                                     {"datagram.size.bytes": 8000, "allow.fragmentation": True})
    assert sender.metric("udp_offload", "udp_sender") == 0
    assert "UDP_SEGMENT refused for" in sender.output()
    assert ip_counters(testbed).get("ReasmReqds", 0) > reassembled  # they came in fragments
    assert sender.stop() == 0 and receiver.stop() == 0


@only_on("tansu")  # (the link's faults decide it, not the broker)
def test_five_percent_loss_between_the_hosts_is_reported_exactly(tmp_path, testbed,
                                                                 start_brokers, broker_kind,
                                                                 launch):
    """link-sim on the sending host drops 5 % of the datagrams on their way to the receiving
    host: what is reported missing is exactly what did not arrive."""
    bed = testbed
    src, dst_broker = two_hosts(bed, start_brokers, broker_kind)
    dst = dst_broker.bootstrap
    topo, port = two_host_topology(tmp_path, bed, src, dst_broker)
    sim = LinkSim((bed.high, 0), (bed.low, port), Faults(FaultSettings(loss=0.05, seed=23)))
    stop = threading.Event()
    thread = threading.Thread(target=sim.run, args=(stop.is_set,), daemon=True)
    thread.start()
    (tmp_path / "sender").mkdir()
    sender_topo = write_topology(tmp_path / "sender", src.bootstrap, dst,
                                 link={"host": bed.high, "port": sim.port,
                                       "datagram.size.bytes": "auto", "rate.mbps": 100},
                                 sender={"heartbeat.interval.ms": 300})
    try:
        receiver = launch(topo, side="receiver", workers=RECEIVER_WORKERS, where=bed.run_in([]))
        sender = launch(sender_topo, side="sender", workers=SENDER_WORKERS)
        total = 3000
        produce(src.bootstrap, "src", [{"value": b"%05d" % i + b"." * 300, "partition": i % 2}
                                       for i in range(total)])
        sent = {("src", p, o) for p in range(2) for o in range(total // 2)}
        written, reported = set(), set()

        def take(m):
            if m.topic() == "missing":
                e = json.loads(m.value())
                span = {(e["sourceTopic"], e["sourcePartition"], o)
                        for o in range(e["firstOffset"], e["lastOffset"] + 1)}
                if e["type"] == "missing":
                    reported.update(span)
                else:
                    reported.difference_update(span)
            else:
                written.update(source_coordinates([m]))
        read_until(dst, ("dst_src", "missing"), take, lambda: sent <= written | reported,
                   timeout=120)
        assert sim.faults.counts.dropped > 0, "nothing dropped: the test proves nothing"
        assert reported == sent - written, (len(reported), len(sent - written),
                                            receiver.output()[-3000:])
        assert sender.stop() == 0 and receiver.stop() == 0
    finally:
        stop.set()
        thread.join(5)
        sim.close()


@pytest.mark.parametrize("mtu", [1500])
def test_the_sender_sizes_its_datagrams_to_the_path(tmp_path, testbed, mtu):
    """auto: the MTU of the device toward link.host, less 28 bytes; the receiving host finds
    the same size toward its own address. A size the path fragments is warned of, with what it
    costs, unless link.allow.fragmentation says it is meant."""
    for size, allow, warned in ((65000, False, True), (65000, True, False),
                                ("auto", False, False)):
        topo = write_topology(tmp_path, "127.0.0.1:9", "127.0.0.1:9",
                              link={"host": testbed.low, "datagram.size.bytes": size,
                                    "allow.fragmentation": allow})
        checked = subprocess.run([sys.executable, "-m", "diode", "check", str(topo), "--side",
                                  "sender", "--no-measure"], capture_output=True, text=True,
                                 cwd=ROOT)
        assert checked.returncode == 0, checked.stderr
        said = (f"warning: link.datagram.size.bytes 65000 is larger than the path to "
                f"{testbed.low} carries whole (MTU {mtu} on {testbed.high_device}: {mtu - 28} "
                "bytes): each datagram crosses as 44 IP fragments")
        assert (said in checked.stderr) == warned, checked.stderr
    from diode.link import path
    toward = path.toward(testbed.low)
    assert (toward.device, toward.mtu) == (testbed.high_device, mtu)
    assert toward.unfragmented(testbed.low) == mtu - 28
    there = subprocess.run(testbed.run_in(
        [sys.executable, "-c", "from diode.link import path; "
         f"p = path.toward('{testbed.low}'); print(p.device, p.mtu)"]),
        capture_output=True, text=True, cwd=ROOT)
    assert there.stdout.split() == [testbed.low_device, str(mtu)], there.stderr
