"""What only a real Apache Kafka broker shows: transactions, compaction, SASL/SCRAM over TLS,
an idempotent producer across a destination broker crash."""

import os
import signal
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from diode.link.linksim import Faults, FaultSettings
from tests.conftest import (client, committed_offsets, consume, create_topic, headers_of,
                            produce, source_coordinates, wait_for, write_topology)
from tests.integration.conftest import Link
from tests.integration.test_hostile_link import missing_offsets, settle

SENDER, RECEIVER = 3, 3
FAST_HEARTBEATS = {"sender": {"heartbeat.interval.ms": 300},
                   "receiver": {"reorder.wait.ms": 500, "missing.records.topic": "missing"}}


def end_offsets(cluster, topic: str, partitions: int) -> list:
    c = Consumer(client(cluster, **{"group.id": "ends"}))
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)]
    finally:
        c.close()


def test_transactional_source_replicates_committed_records_only_without_false_gaps(
        tmp_path, start_brokers, launch):
    """Committed and aborted transactions: offsets have holes (aborted records, commit and abort
    markers). The sender reads committed records only (librdkafka's default isolation.level);
    the chain of offsets tells the receiver the holes are not losses; lag tools see the whole
    topic as consumed."""
    src, dst = start_brokers("kafka", "source", "destination")
    create_topic(src.bootstrap, "src", 2)
    tx = Producer(client(src.bootstrap, **{"transactional.id": "diode-test-tx",
                                           "linger.ms": 5}))
    tx.init_transactions(30)
    committed, aborted = [], []

    def transaction(n: int, commit: bool):
        tx.begin_transaction()
        values = [b"tx%02d-%03d" % (n, i) for i in range(25)]
        for i, v in enumerate(values):
            tx.produce("src", value=v, partition=i % 2)
        if commit:
            tx.commit_transaction(30)
            committed.extend(values)
        else:
            tx.abort_transaction(30)
            aborted.extend(values)

    for n, commit in enumerate([True, False, True, True, False, True]):
        transaction(n, commit)
    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap, **FAST_HEARTBEATS)
    d = launch(topo, workers=SENDER + RECEIVER)
    transaction(6, False)  # while it runs, too; the topic ends with a commit marker
    transaction(7, True)

    got = consume(dst.bootstrap, "dst_src", len(committed), idle=2)
    assert sorted(m.value() for m in got) == sorted(committed)  # nothing aborted, no copy
    coords = source_coordinates(got)
    for p in range(2):
        offsets = [o for _, pp, o in coords if pp == p]
        assert offsets == sorted(offsets)  # in source order
        assert offsets[-1] + 1 > len(offsets)  # holes: markers and aborted records
    # several heartbeats after the records: a gap would have passed its reorder wait by then
    beats = d.metric("heartbeats", "kafka_writer")
    wait_for(lambda: d.metric("heartbeats", "kafka_writer") >= beats + 5, 30,
             "five more heartbeats at the writer")
    missing, events = missing_offsets(dst.bootstrap, timeout=3)
    assert [e for e in events if e["type"] == "missing"] == [] and missing == set()
    assert d.metric("missing_records", "kafka_writer") == 0
    # The consumer group has consumed the whole topic (no lag of 1 on the final marker).
    ends = end_offsets(src.bootstrap, "src", 2)
    assert committed_offsets(src.bootstrap, "diode-test", "src", 2, ends) == ends
    assert d.stop() == 0


def test_compacted_source_loss_is_reported_exactly_for_the_records_that_exist(
        tmp_path, start_brokers, launch):
    """A compacted topic after the log cleaner ran: its offsets are sparse. With 5 % of the
    datagrams lost, the missing report covers exactly the surviving records that did not
    arrive: no false alarm for offsets compaction removed."""
    brokers = start_brokers("kafka", "source", "destination",
                            config={"log.cleaner.backoff.ms": 200})
    src = brokers[0]
    create_topic(src.bootstrap, "src", 2, config={
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0", "delete.retention.ms": "100"})
    produced = 0
    for round_ in range(6):  # each round rewrites every key; segments roll between rounds
        produce(src.bootstrap, "src", [{"key": b"k%03d" % k, "value": b"r%d-%03d" % (round_, k)
                                        + b"." * 40, "partition": k % 2} for k in range(400)])
        produced += 400
        time.sleep(0.3)  # (segment.ms is 100: the segment rolls, as the cleaner needs)

    def surviving():
        got = consume(src.bootstrap, "src", 1, timeout=10, idle=1)
        return got if len(got) < produced * 0.6 else None
    existing = {("src", m.partition(), m.offset())
                for m in wait_for(surviving, 60, "the log cleaner to compact src")}

    lk = Link(tmp_path, brokers, launch, Faults(FaultSettings(loss=0.05, seed=11)),
              link={"datagram.size.bytes": 600})
    try:
        arrived, reported, _ = settle(lk, existing)
    finally:
        lk.close()
    assert lk.sim.faults.counts.dropped > 0, "nothing was lost: the test proves nothing"
    absent = existing - arrived
    assert absent and arrived <= existing
    assert reported & existing == absent  # every lost record, and only those that existed
    assert not reported & arrived


@pytest.fixture
def scram_clusters(start_brokers):
    """A source with SASL_SSL (SCRAM over TLS) and a destination with SASL_PLAINTEXT."""
    src, = start_brokers("kafka", "source", users={"high": "source-secret-1"}, tls=True)
    dst, = start_brokers("kafka", "destination", users={"low": "destination-secret-2"})
    return src, dst


def test_sasl_scram_on_both_sides_with_secrets_from_a_file_and_the_environment(
        tmp_path, scram_clusters, launch, monkeypatch):
    src, dst = scram_clusters
    (tmp_path / "source.password").write_text("source-secret-1\n")
    monkeypatch.setenv("DIODE_TEST_DESTINATION_PASSWORD", "destination-secret-2")
    create_topic(src.client_config(), "src", 2)
    produce(src.client_config(), "src", [{"value": b"secret-%d" % i, "partition": i % 2}
                                         for i in range(500)])
    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap, sender={"kafka": {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "high", "sasl.password": "${file:source.password}",
        "ssl.ca.location": src.ca_file}}, receiver={"kafka": {
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "low", "sasl.password": "${env:DIODE_TEST_DESTINATION_PASSWORD}"}})
    text = topo.read_text()
    assert "source-secret-1" not in text and "destination-secret-2" not in text
    d = launch(topo, workers=SENDER + RECEIVER)
    got = consume(dst.client_config(), "dst_src", 500, idle=1)
    assert sorted(m.value() for m in got) == sorted(b"secret-%d" % i for i in range(500))
    assert d.stop() == 0
    out = d.output()
    assert "source-secret-1" not in out and "destination-secret-2" not in out


def test_a_wrong_or_unreadable_kafka_secret_is_a_clear_error(tmp_path, scram_clusters, launch,
                                                             monkeypatch):
    import subprocess
    import sys
    src, dst = scram_clusters
    sasl = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "low"}
    # written out in the file: refused before anything starts
    literal = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                             receiver={"kafka": {**sasl, "sasl.password": "destination-secret-2"}})
    r = subprocess.run([sys.executable, "-m", "diode", "check", str(literal)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "receiver.kafka.sasl.password: a secret must not be written in the topology" in \
        r.stderr and "destination-secret-2" not in r.stderr
    # named but not there: the receiver says which, and starts nothing
    monkeypatch.delenv("DIODE_TEST_UNSET", raising=False)
    unset = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                           receiver={"kafka": {**sasl, "sasl.password": "${env:DIODE_TEST_UNSET}"}})
    d = launch(unset, side="receiver")
    assert d.proc.wait(30) == 1
    assert "DIODE_TEST_UNSET" in d.output() and "Traceback" not in d.output()
    # a wrong password: the destination refuses to authenticate, the writer says so
    monkeypatch.setenv("DIODE_TEST_WRONG", "not-the-password")
    wrong = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                           receiver={"kafka": {**sasl, "sasl.password": "${env:DIODE_TEST_WRONG}"}})
    d = launch(wrong, side="receiver", workers=RECEIVER)
    wait_for(lambda: "Authentication failed" in d.output(), 30, "an authentication error")
    assert "not-the-password" not in d.output()


def test_idempotent_producer_writes_each_record_once_in_order_across_a_destination_crash(
        tmp_path, start_brokers, launch):
    """receiver.kafka enable.idempotence=true; the destination broker is killed (SIGKILL) while
    records stream and started again 3 s later with its data: every record is written exactly
    once, in source order."""
    src, dst = start_brokers("kafka", "source", "destination")
    total, partitions = 20000, 2
    create_topic(src.bootstrap, "src", partitions)
    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                          receiver={"kafka": {"enable.idempotence": True,
                                              "request.timeout.ms": 2000}})
    d = launch(topo, workers=SENDER + RECEIVER)

    def stream():
        for start in range(0, total, 500):
            produce(src.bootstrap, "src", [{"value": b"%06d" % i, "partition": i % partitions}
                                           for i in range(start, start + 500)])
            time.sleep(0.05)  # (pacing: the stream lasts across the crash)
    producer = threading.Thread(target=stream, daemon=True)
    producer.start()
    wait_for(lambda: len(consume(dst.bootstrap, "dst_src", 2000, timeout=5)) >= 2000, 60,
             "records to arrive before the crash")
    dst.pause()  # in-flight produce requests time out and are sent again...
    acknowledged = d.metric("records", "kafka_writer")
    time.sleep(5)  # (longer than request.timeout.ms: the pause under test)
    dst.resume()  # ...and the broker, thawed, receives both
    wait_for(lambda: d.metric("records", "kafka_writer") > acknowledged, 60,
             "the thawed broker to acknowledge writes")
    os.kill(dst.proc.pid, signal.SIGKILL)
    dst.proc.wait()
    time.sleep(3)  # (the crash under test: 3 s down)
    dst.start()
    producer.join()
    got = consume(dst.bootstrap, "dst_src", total, timeout=120, idle=3)
    coords = source_coordinates(got)
    assert len(coords) == len(set(coords)) == total, d.output()[-3000:]
    for p in range(partitions):
        offsets = [int(headers_of(m)["sourceOffset"]) for m in got if m.partition() == p]
        assert offsets == list(range(total // partitions))
    assert d.stop() == 0
    # Every batch in the destination's log carries a producer id: the writes were idempotent.
    ids = {b["producerId"] for p in range(partitions) for b in log_batches(dst, f"dst_src-{p}")}
    assert ids and -1 not in ids


def log_batches(broker, directory: str) -> list:
    """The record batches of a partition's log files, as Kafka's DumpLogSegments tool sees
    them: {"baseOffset": ..., "producerId": ...}."""
    import re
    import subprocess

    from diode.kafka import maven
    from diode.jars import KAFKA
    files = sorted(str(f) for f in (broker.dir / "data" / directory).glob("*.log"))
    r = subprocess.run(["java", "-cp", ":".join(maven.jars(KAFKA)),
                        "kafka.tools.DumpLogSegments", "--files", ",".join(files)],
                       capture_output=True, text=True, timeout=120, check=True)
    return [{"baseOffset": int(m[0]), "producerId": int(m[1])} for m in re.findall(
        r"baseOffset: (\d+) .*?producerId: (-?\d+)", r.stdout)]
