"""Whole topologies against embedded brokers: what an operator sees."""

import random
import signal
import socket
import threading
import time

import psutil

from tests.conftest import (RECENT_MS, committed_offsets, consume, create_topic,
                            headers_of, only_on, produce, source_coordinates, topic_id, topics,
                            wait_for, write_topology)

SENDER, RECEIVER = 3, 3  # default worker processes per side


def test_records_arrive_intact_with_provenance(tmp_path, brokers, launch):
    src, dst = brokers
    create_topic(src.bootstrap, "src", 3)
    sent = []
    for i in range(300):
        r = {"value": f"value-{i}-".encode() * random.randint(1, 40),
             "key": None if i % 7 == 0 else f"key-{i % 13}".encode(),
             "headers": [("trace", f"t{i}".encode()), ("empty", None)] if i % 2 else [],
             "timestamp": RECENT_MS + i, "partition": i % 3}
        sent.append(r)
    produce(src.bootstrap, "src", sent)
    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap, compression="zstd")
    d = launch(topo, workers=SENDER + RECEIVER)

    got = consume(dst.bootstrap, "dst_src", 300, idle=1)
    assert len(got) == 300, d.output()
    assert topics(dst.bootstrap)["dst_src"] == 3  # created with the source's partition count
    by_value = {m.value(): m for m in got}
    source_id = topic_id(src.bootstrap, "src").encode()
    for r in sent:
        m = by_value[r["value"]]
        h = m.headers() or []
        assert m.key() == r["key"]
        assert h[:-5] == [(k, v) for k, v in r["headers"]]  # own headers first, in order
        assert m.timestamp()[1] == r["timestamp"]
        # receiver.written.at.header: when the receiver wrote it (for end-to-end latency)
        assert 0 <= time.time() * 1000 - int(h[-1][1]) < 60_000 and h[-1][0] == "writtenAt"
        assert m.partition() == r["partition"]  # same partition number
        prov = headers_of(m)
        assert prov["sourceTopic"] == b"src"
        assert prov["sourcePartition"] == str(r["partition"]).encode()
        # the incarnation: the source topic's id, as Kafka's tools print it
        assert prov["sourceTopicId"] == source_id
    coords = source_coordinates(got)
    assert sorted(coords) == sorted(set(coords))
    # Each source partition's offsets arrive complete: 100 records, offsets 0..99.
    for p in range(3):
        assert sorted(o for t, pp, o in coords if pp == p) == list(range(100))

    # The sent prefix is committed to the source cluster's consumer group (lag tools see it).
    assert committed_offsets(src.bootstrap, "diode-test", "src", 3, [100, 100, 100]) == \
        [100, 100, 100]
    assert d.stop() == 0


def test_topics_by_regex_and_new_partitions_are_picked_up_while_running(tmp_path, brokers,
                                                                         launch):
    src, dst = brokers
    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                          sender={"topics": [], "topics.regex": ["metrics-.*"]},
                          receiver={"topic.prefix": "", "topic.rename": {"metrics-b": "renamed"}})
    launch(topo, workers=SENDER + RECEIVER)
    # "other" first: by the time the matching topics' records arrive, the sender has seen it
    # in the same listing or an earlier one (and left it out), and its record was there
    create_topic(src.bootstrap, "other", 1)
    produce(src.bootstrap, "other", [{"value": b"not replicated"}])
    create_topic(src.bootstrap, "metrics-a", 2)
    create_topic(src.bootstrap, "metrics-b", 1)
    produce(src.bootstrap, "metrics-a", [{"value": b"a%d" % i, "partition": i % 2}
                                         for i in range(10)])
    produce(src.bootstrap, "metrics-b", [{"value": b"b%d" % i} for i in range(5)])
    assert sorted(m.value() for m in consume(dst.bootstrap, "metrics-a", 10)) == sorted(
        b"a%d" % i for i in range(10))
    assert len(consume(dst.bootstrap, "renamed", 5)) == 5
    assert "other" not in topics(dst.bootstrap)


def test_sender_workers_killed_mid_stream_lose_no_record(tmp_path, brokers, launch):
    """SIGKILL packers, the udp_sender and readers while 30 000 records stream: all arrive."""
    src, dst = brokers
    total = 30000
    create_topic(src.bootstrap, "src", 4)
    topo = write_topology(
        tmp_path, src.bootstrap, dst.bootstrap,
        sender={"stages": {"kafka_reader": {"instances": 2}, "packer": {"instances": 2}},
                "inflight.timeout.seconds": 5},
        supervisor={"restart.max": 20})
    d = launch(topo, workers=5 + RECEIVER)

    def stream():
        for start in range(0, total, 1000):
            produce(src.bootstrap, "src", [{"value": b"r%06d" % i + b"." * 100,
                                            "partition": i % 4}
                                           for i in range(start, start + 1000)])
            time.sleep(0.05)  # (pacing: the stream lasts while the workers are killed)

    producer = threading.Thread(target=stream, daemon=True)
    producer.start()
    killed = []
    for victim in ["sender/packer-0", "sender/udp_sender-0", "sender/kafka_reader-1",
                   "sender/packer-1", "sender/kafka_reader-0", "sender/udp_sender-0"]:
        time.sleep(0.4)  # (pacing: the kills are spread over the stream)
        w = d.wait_workers(5 + RECEIVER)  # the previous victim is back
        w[victim].send_signal(signal.SIGKILL)
        killed.append(victim)
    producer.join()

    got = consume(dst.bootstrap, "dst_src", total, timeout=120, distinct=lambda m: m.value(),
                  idle=2)
    values = {m.value()[:7] for m in got}
    missing = total - len(values)
    assert missing == 0, f"{missing} records lost after killing {killed}\n{d.output()}"
    assert len(got) == total  # what was sent again was recognised and dropped
    assert "rewound" in d.output()  # the readers re-sent what was in flight
    assert d.stop() == 0


@only_on("tansu")  # (the receiver refuses them before any broker is asked)
def test_garbage_datagrams_crash_nothing_and_write_nothing(tmp_path, brokers, launch):
    src, dst = brokers
    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap)
    d = launch(topo, side="receiver", workers=RECEIVER)
    pids = {name: p.pid for name, p in d.workers().items()}
    port = int(topo.read_text().split("port: ")[1].split()[0])
    rng = random.Random(7)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    valid_header = b"\xd1\x0d\x03\x01\x01\x00\x00\x00" + bytes(20)
    sent = 0
    for i in range(3000):
        kind = i % 4
        if kind == 0:
            dg = rng.randbytes(rng.randint(0, 1400))
        elif kind == 1:
            dg = valid_header[:rng.randint(0, 27)]  # truncated header
        elif kind == 2:
            dg = valid_header + rng.randbytes(rng.randint(0, 1400))  # forged, no valid tag
        else:
            # versions 1 and 2 (before runs, before incarnations), and a future version
            dg = (b"\xd1\x0d" + bytes([1 + i % 16 // 8]) if i % 8 == 3 else b"\xd1\x0d\x09") \
                + rng.randbytes(100)
        s.sendto(dg, ("127.0.0.1", port))
        sent += 1
        if i % 200 == 0:
            time.sleep(0.01)  # (pacing: the socket's buffer is not what is tested)

    def rejected():
        return d.metric("rejects", "udp_reader") + d.metric("rejects", "unpacker")
    wait_for(lambda: d.metric("datagrams", "udp_reader") >= sent and rejected() >= sent, 30,
             "every datagram counted and rejected")
    assert d.metric("datagrams", "udp_reader") == sent
    assert rejected() == sent
    assert d.metric("rejects", "unpacker", reason="auth_failed") >= 700
    assert d.metric("rejects", "udp_reader", reason="bad_version") == 750
    assert d.metric("records", "kafka_writer") == 0
    assert not [t for t in topics(dst.bootstrap) if not t.startswith("__")]
    assert {name: p.pid for name, p in d.workers().items()} == pids  # nothing restarted

    # ... and the receiver still works: a real sender's records arrive.
    create_topic(src.bootstrap, "src", 1)
    produce(src.bootstrap, "src", [{"value": b"after the garbage"}])
    launch(topo, side="sender", workers=SENDER)
    assert [m.value() for m in consume(dst.bootstrap, "dst_src", 1)] == [b"after the garbage"]


def test_sender_started_before_its_source_cluster_waits_and_loses_nothing(tmp_path, launch,
                                                                         broker_kind):
    """A source broker that is down: clear errors, no crash, replication once it is up."""
    from diode.kafka.brokers import make_broker
    from tests.conftest import free_port
    sp = free_port()
    dst = make_broker(broker_kind, "destination", f"127.0.0.1:{free_port()}").start()
    try:
        topo = write_topology(tmp_path, f"127.0.0.1:{sp}", dst.bootstrap)
        d = launch(topo, workers=SENDER + RECEIVER)
        wait_for(lambda: d.metric("errors", "kafka_reader", reason="metadata") >= 1, 60,
                 "the sender to report that it cannot read the source cluster")
        workers = {name: p.pid for name, p in d.workers().items()}
        src = make_broker(broker_kind, "source", f"127.0.0.1:{sp}").start()
        try:
            create_topic(src.bootstrap, "src", 2)
            produce(src.bootstrap, "src", [{"value": b"late %d" % i, "partition": i % 2}
                                           for i in range(100)])
            assert len(consume(dst.bootstrap, "dst_src", 100, timeout=60)) == 100
            assert {name: p.pid for name, p in d.workers().items()} == workers  # no restart
            assert d.stop() == 0
        finally:
            src.stop()
    finally:
        dst.stop()


@only_on("tansu")  # (the receiver refuses it before any broker is asked)
def test_wrong_password_is_rejected_and_writes_nothing(tmp_path, brokers, launch):
    src, dst = brokers
    create_topic(src.bootstrap, "src", 1)
    produce(src.bootstrap, "src", [{"value": b"secret %d" % i} for i in range(50)])
    receiver_topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap)
    sender_dir = tmp_path / "sender"
    sender_dir.mkdir()
    sender_topo = write_topology(sender_dir, src.bootstrap, dst.bootstrap)
    sender_topo.write_text(sender_topo.read_text().replace(
        str(sender_topo.read_text().split("port: ")[1].split()[0]),
        receiver_topo.read_text().split("port: ")[1].split()[0], 1))
    (sender_dir / "password").write_text("another password\n")
    d = launch(receiver_topo, side="receiver", workers=RECEIVER)
    launch(sender_topo, side="sender", workers=SENDER)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not d.metric("rejects", "unpacker"):
        time.sleep(0.2)
    assert d.metric("rejects", "unpacker", reason="auth_failed") >= 1
    assert d.metric("records", "kafka_writer") == 0
    assert "dst_src" not in topics(dst.bootstrap)


def test_a_5_mib_record_crosses_a_1472_byte_datagram_link_intact(tmp_path, brokers, launch):
    src, dst = brokers
    create_topic(src.bootstrap, "src", 1)
    big = random.Random(1).randbytes(5 * 1024 * 1024)
    produce(src.bootstrap, "src", [{"value": b"small before"},
                                   {"value": big, "key": b"big", "headers": [("h", b"v")]},
                                   {"value": b"small after"}])
    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap, compression="zstd",
                          link={"datagram.size.bytes": 1472, "rate.mbps": 400})
    d = launch(topo, workers=SENDER + RECEIVER)
    got = consume(dst.bootstrap, "dst_src", 3, timeout=60, idle=1)
    assert [m.value() for m in got] == [b"small before", big, b"small after"]
    assert got[1].key() == b"big" and got[1].headers()[0] == ("h", b"v")
    assert d.metric("reassembled_records", "unpacker") == 1
    assert d.metric("fragments", "unpacker") > 5 * 1024 * 1024 / 1472


def test_record_over_the_record_limit_goes_to_the_dead_letter_topic(tmp_path, brokers,
                                                                     launch):
    src, dst = brokers
    create_topic(src.bootstrap, "src", 1)
    produce(src.bootstrap, "src", [{"value": b"small before"}, {"value": b"X" * 5000},
                                   {"value": b"small after"}])
    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                          link={"datagram.size.bytes": 1472},
                          sender={"dead.letter.topic": "too-big", "max.record.bytes": 4096})
    d = launch(topo, workers=SENDER + RECEIVER)
    got = consume(dst.bootstrap, "dst_src", 2, idle=1)
    assert [m.value() for m in got] == [b"small before", b"small after"]
    dead = consume(src.bootstrap, "too-big", 1)
    assert dead[0].value() == b"X" * 5000
    h = headers_of(dead[0])
    assert (h["sourceTopic"], h["sourcePartition"], h["sourceOffset"]) == (b"src", b"0", b"1")
    assert "src[0]@1 (5000 bytes) is larger than sender.max.record.bytes" in d.output()
    # The record was handled, so the committed offset moves past it.
    assert committed_offsets(src.bootstrap, "diode-test", "src", 1, [3]) == [3]


def test_sigterm_drains_and_leaves_no_process_behind(tmp_path, launch, broker_kind):
    """With embedded brokers started by the launch itself, as the demo does; workers pinned."""
    from tests.conftest import free_port
    sp, dp = free_port(), free_port()
    topo = write_topology(
        tmp_path, f"127.0.0.1:{sp}", f"127.0.0.1:{dp}",
        brokers=[{"name": "source", "kind": broker_kind, "side": "sender",
                  "listen": f"127.0.0.1:{sp}"},
                 {"name": "destination", "kind": broker_kind, "side": "receiver",
                  "listen": f"127.0.0.1:{dp}"}],
        receiver={"stages": {"unpacker": {"cpus": [1]}, "kafka_writer": {"cpus": [0, 1]}}})
    d = launch(topo, workers=SENDER + RECEIVER)
    workers = d.workers()
    assert workers["receiver/unpacker-0"].cpu_affinity() == [1]  # pinned as the topology says
    assert workers["receiver/kafka_writer-0"].cpu_affinity() == [0, 1]
    create_topic(f"127.0.0.1:{sp}", "src", 1)
    produce(f"127.0.0.1:{sp}", "src", [{"value": b"v%d" % i} for i in range(100)])
    assert len(consume(f"127.0.0.1:{dp}", "dst_src", 100)) == 100
    everything = d.ps.children(recursive=True)
    assert len(everything) == SENDER + RECEIVER + 2  # workers and two brokers
    assert d.stop(signal.SIGTERM, timeout=60) == 0
    gone, alive = psutil.wait_procs(everything, timeout=5)
    assert alive == []
    assert "draining" in d.output()
    assert "did not drain" not in d.output()  # every worker finished its drain, none was killed


@only_on("tansu")  # (the supervisor's doing: no broker takes part)
def test_a_worker_that_keeps_dying_stops_the_side_loudly(tmp_path, brokers, launch):
    src, dst = brokers
    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                          supervisor={"restart.max": 2, "restart.window.seconds": 60})
    d = launch(topo, side="receiver", workers=RECEIVER)
    everything = d.ps.children(recursive=True)
    for _ in range(3):
        victim = d.wait_workers(RECEIVER)["receiver/unpacker-0"]
        victim.kill()
        wait_for(lambda: d.proc.poll() is not None or
                 d.workers().get("receiver/unpacker-0", victim).pid != victim.pid, 30,
                 "the supervisor to restart the unpacker or give up")
    assert d.proc.wait(30) == 1
    assert "receiver/unpacker-0 keeps dying" in d.output()
    gone, alive = psutil.wait_procs(everything, timeout=5)
    assert alive == []


def test_check_reports_every_error_at_once(tmp_path):
    import subprocess
    import sys
    bad = tmp_path / "bad.yaml"
    bad.write_text("link:\n  prot: 3456\n  datagram.size.bytes: 70000\n"
                   "sender:\n  stages:\n    udp_sender: {instances: 2}\n"
                   "security:\n  cipher: none\n")
    r = subprocess.run([sys.executable, "-m", "diode", "check", str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    for expected in ["link.prot: unknown key (did you mean port?)",
                     "link.datagram.size.bytes: must be between 256 and 65507",
                     "sender.stages.udp_sender.instances: must be 1",
                     "security.cipher: none sends records unauthenticated",
                     "sender.kafka.bootstrap.servers: required",
                     "sender: name at least one topic"]:
        assert expected in r.stderr
    good = write_topology(tmp_path, "127.0.0.1:1", "127.0.0.1:2",
                          sender={"stages": {"packer": {"instances": 2, "cpus": [0]}}})
    r = subprocess.run([sys.executable, "-m", "diode", "check", str(good)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "diode: sender/packer-1" in r.stdout and "ipc://" in r.stdout
    # librdkafka settings pass through unchanged, and check asks librdkafka about them
    typo = write_topology(tmp_path, "127.0.0.1:1", "127.0.0.1:2",
                          receiver={"kafka": {"lingr.ms": 5}})
    r = subprocess.run([sys.executable, "-m", "diode", "check", str(typo)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert 'receiver.kafka: No such configuration property: "lingr.ms"' in r.stderr


@only_on("tansu")  # (the link's port: no broker takes part)
def test_link_port_in_use_is_a_clear_error(tmp_path, brokers, launch):
    src, dst = brokers
    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap)
    port = int(topo.read_text().split("port: ")[1].split()[0])
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", port))
    try:
        d = launch(topo, side="receiver")
        assert d.proc.wait(60) == 1
    finally:
        taken.close()
    out = d.output()
    assert f"cannot bind udp 127.0.0.1:{port}" in out and "Address already in use" in out
    assert "Traceback" not in out
