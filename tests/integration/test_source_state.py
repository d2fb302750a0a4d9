"""The source's state across the link (wire.KIND_SOURCE): what the receiver knows of its source
without seeing it. Each source partition's log start and end, and each topic's retention, come
every sender.source.state.interval.ms; the receiver exports, per topic, how far behind the
source it is and how much the source still holds, and `diode status` shows both. On Apache
Kafka and on Tansu."""

import json
import subprocess
import sys

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.conftest import (ROOT, client, consume, create_topic, listening, missing_event,
                            produce, source_coordinates, wait_for, write_topology)


def test_the_receiver_knows_how_far_behind_its_source_it_is(tmp_path, start_brokers,
                                                            broker_kind, launch):
    src, dst = start_brokers(broker_kind, "source", "destination")
    create_topic(src.bootstrap, "src", 2, {"retention.ms": "86400000"})
    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                          link={"rate.mbps": 2},  # 800 KB take about 3 s: a visible lag
                          sender={"source.state.interval.ms": 300})
    diode = launch(topo)
    sent = [{"value": b"%05d" % i + bytes(2000), "partition": i % 2} for i in range(400)]
    produce(src.bootstrap, "src", sent)
    lags = []

    def caught_up():
        lags.append(diode.metric("source_lag_records", "kafka_writer", topic="src"))
        return lags[-1] == 0 and diode.metric("records", "kafka_writer") == 400
    wait_for(caught_up, 60, "the receiver to catch up with its source")
    assert max(lags) > 0  # behind while the paced link carried the backlog
    assert len(consume(dst.bootstrap, "dst_src", 400, timeout=30)) == 400
    held = diode.metric("source_held_records", "kafka_writer", topic="src")
    assert held == 400, held
    status = subprocess.run([sys.executable, "-m", "diode", "status", str(topo)],
                            capture_output=True, text=True, cwd=ROOT).stdout
    assert "source src: 0 records behind, 400 still held there" in status, status
    if broker_kind == "kafka":  # (Tansu has no DeleteRecords)
        admin = AdminClient(client(src.bootstrap))
        for future in admin.delete_records([TopicPartition("src", 0, 150)]).values():
            future.result(30)
        wait_for(lambda: diode.metric("source_held_records", "kafka_writer",
                                      topic="src") == 250, 20, "the deleted records to show")
    assert diode.stop() == 0


def tickets(topology, *which) -> list:
    """`diode tickets --json` on the low side."""
    r = subprocess.run([sys.executable, "-m", "diode", "tickets", str(topology), "--json",
                        *which], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_missing_ranges_at_risk_then_expired_as_the_source_deletes_them(
        tmp_path, start_brokers, broker_kind, launch):
    """Records sent while no receiver read are reported missing, each range a ticket, and at
    risk: their timestamps are an hour old and the topic keeps records a day, so retention
    deletes them within receiver.resend.horizon.ms (24 h; the margin in offsets is 0 here). Once
    the source deletes them (DeleteRecords, as retention would) they are reported once more as
    expired, part by part as the log start passes them (the first part while the receiver runs,
    the rest while it is stopped), and the ticket closes as expired. Tansu deletes nothing:
    there they stay at risk."""
    src, dst = start_brokers(broker_kind, "source", "destination")
    create_topic(src.bootstrap, "src", 2, {"retention.ms": "86400000"})
    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                          sender={"source.state.interval.ms": 300,
                                  "heartbeat.interval.ms": 300},
                          receiver={"missing.records.topic": "missing",
                                    "reorder.wait.ms": 300, "resend.margin.records": 0})
    receiver = listening(launch(topo, side="receiver"))  # (what is sent before is not heard)
    sender = launch(topo, side="sender")

    def batch(first):
        return [{"value": b"%05d" % i, "partition": i % 2} for i in range(first, first + 100)]
    produce(src.bootstrap, "src", batch(0))  # offsets 0..49 of each partition
    wait_for(lambda: receiver.metric("records", "kafka_writer") == 100, 60, "the first 100")
    assert receiver.stop() == 0
    produce(src.bootstrap, "src", batch(100))  # 50..99: sent while no receiver reads
    wait_for(lambda: sender.metric("records", "kafka_reader") >= 200, 30, "them sent")
    receiver = launch(topo, side="receiver")
    wait_for(lambda: receiver.output().count("listening on udp") == 2, 60,
             "the receiver reading again")  # (what comes now waits in its socket, journal)
    produce(src.bootstrap, "src", batch(200))
    events: list = []

    def reported():
        events[:] = [missing_event(m)[0] for m in consume(dst.bootstrap, "missing", 1,
                                                           timeout=5, idle=1.0)]
        return {(e["sourcePartition"], e["firstOffset"], e["lastOffset"], e["reason"])
                for e in events} >= {(0, 50, 99, "receiver-down"), (1, 50, 99, "receiver-down")}
    wait_for(reported, 90, "the records sent while no receiver read reported missing")
    wait_for(lambda: receiver.metric("missing_at_risk_records", "kafka_writer",
                                     topic="src") == 100, 30, "100 records at risk")
    assert {(t["partition"], t["first"], t["last"]) for t in tickets(topo, "--open")} == \
        {(0, 50, 99), (1, 50, 99)}
    if broker_kind == "tansu":  # (no DeleteRecords)
        assert receiver.metric("missing_expired_records", "kafka_writer") == 0
        return
    admin = AdminClient(client(src.bootstrap))

    def delete_below(offset, partition=0):
        for future in admin.delete_records([TopicPartition("src", partition,
                                                           offset)]).values():
            future.result(30)

    delete_below(80)  # the log start passes 50..79 while the receiver runs
    wait_for(lambda: receiver.metric("missing_at_risk_records", "kafka_writer",
                                     topic="src") == 70, 30, "the records below 80 not at risk")
    assert receiver.metric("missing_expired_records", "kafka_writer") == 30
    assert receiver.stop() == 0
    delete_below(120)  # and the rest while it is stopped
    receiver = launch(topo, side="receiver")
    wait_for(lambda: receiver.metric("missing_expired_records", "kafka_writer") == 20, 60,
             "80..99 expired, seen after the restart")
    wait_for(lambda: receiver.metric("missing_at_risk_records", "kafka_writer",
                                     topic="src") == 50, 30, "partition 1's still at risk")

    def expired():
        return [e for e in events if e["type"] == "missing" and e["reason"] == "expired"]
    wait_for(lambda: reported() and len(expired()) == 2, 30, "the expired ranges reported")
    assert sorted((e["sourcePartition"], e["firstOffset"], e["lastOffset"])
                  for e in expired()) == [(0, 50, 79), (0, 80, 99)]
    # the ticket of 0's range closes as expired once nothing of it is left to resend
    ticket = next(e["ticket"] for e in events if e["type"] == "missing" and
                  e["sourcePartition"] == 0 and e["reason"] == "receiver-down")
    assert {e.get("ticket") for e in expired()} == {ticket}
    closed = wait_for(lambda: tickets(topo, "--closed"), 30, "the expired ticket closed")
    assert [(t["ticket"], t["state"]) for t in closed] == [(ticket, "expired")]
    assert [(t["partition"], t["state"]) for t in tickets(topo, "--open")] == [(1, "open")]
    assert receiver.metric("tickets_closed", "kafka_writer", reason="expired") == 1
    status = subprocess.run([sys.executable, "-m", "diode", "status", str(topo)],
                            capture_output=True, text=True, cwd=ROOT).stdout
    assert "0 records behind" in status
    assert "resend tickets: 1 open" in status and "0 filled, 1 expired" in status, status

    # partition 1's ticket, its first 10 offsets deleted since: `diode resend --dry-run` says
    # so, and the resend sends the 40 records left of it (the whole partition was skipped when
    # its first range began below the log start)
    delete_below(60, partition=1)
    manifest = tmp_path / "manifest.json"
    r = subprocess.run([sys.executable, "-m", "diode", "tickets", str(topo), "--manifest",
                        str(manifest)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    tid, = {e["topicId"] for e in json.loads(manifest.read_text())["missing"]}

    def resend(*extra):
        return subprocess.run([sys.executable, "-m", "diode", "resend", str(manifest),
                               "--topology", str(topo), "--run-dir", str(tmp_path / "resend"),
                               *extra], capture_output=True, text=True, cwd=ROOT, timeout=120)
    r = resend("--dry-run")
    assert r.returncode == 1, r.stderr[-2000:]
    assert f"{'src[1]':<28} {tid:<22} {'50..99':<23} {40:>8}  10 offset(s) expired (the " \
        "source's log starts at 60)" in r.stdout.splitlines(), r.stdout
    r = resend()
    assert r.returncode == 1 and "resend complete" in r.stderr, r.stderr[-3000:]
    assert "src[1]: 1 range(s) reach below the source's log start 60: 10 offset(s) expired, " \
        "not resent" in r.stderr
    got = consume(dst.bootstrap, "dst_src", 240, timeout=30)  # 200 written, 40 resent
    resent = {o for _, p, o in source_coordinates(got) if p == 1 and 50 <= o < 100}
    assert resent == set(range(60, 100))


def produce_in_transactions(bootstrap: str, topic: str, first: int, n: int) -> None:
    """n records, each in a transaction of its own: each commit marker takes an offset, so the
    records sit at every other offset, as on a compacted topic."""
    p = Producer(client(bootstrap, **{"transactional.id": f"diode-test-{first}"}))
    p.init_transactions(30)
    for i in range(first, first + n):
        p.begin_transaction()
        p.produce(topic, value=b"%05d" % i)
        p.commit_transaction(30)


def test_a_resent_ticket_whose_range_holds_offsets_without_records_closes_filled(
        tmp_path, start_brokers, broker_kind, launch):
    """A range reported missing may hold offsets that are not records (transaction markers
    here; compaction does the same): `diode resend` reads it through and says how many records
    the source holds in it, and the ticket closes filled once they have all arrived, though
    the other offsets never come."""
    src, dst = start_brokers(broker_kind, "source", "destination")
    create_topic(src.bootstrap, "src", 1)
    topo = write_topology(tmp_path, src.bootstrap, dst.bootstrap,
                          sender={"heartbeat.interval.ms": 300},
                          receiver={"missing.records.topic": "missing",
                                    "reorder.wait.ms": 300})
    receiver = listening(launch(topo, side="receiver"))  # (what is sent before is not heard)
    sender = launch(topo, side="sender")
    produce_in_transactions(src.bootstrap, "src", 0, 10)  # offsets 0, 2, ... 18
    wait_for(lambda: receiver.metric("records", "kafka_writer") == 10, 60, "the first 10")
    assert receiver.stop() == 0
    produce_in_transactions(src.bootstrap, "src", 10, 10)  # 20, 22, ... 38: none received
    wait_for(lambda: sender.metric("records", "kafka_reader") >= 20, 30, "them sent")
    receiver = launch(topo, side="receiver")
    wait_for(lambda: receiver.output().count("listening on udp") == 2, 60, "the receiver")
    produce_in_transactions(src.bootstrap, "src", 20, 5)
    opened = wait_for(lambda: tickets(topo, "--open"), 60, "the ticket of what was missed")
    assert [(t["first"], t["last"], t["reason"]) for t in opened] == \
        [(19, 38, "receiver-down")]  # 10 records and 10 markers
    manifest = tmp_path / "manifest.json"
    r = subprocess.run([sys.executable, "-m", "diode", "tickets", str(topo), "--manifest",
                        str(manifest)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "diode", "resend", str(manifest), "--topology",
                        str(topo), "--run-dir", str(tmp_path / "resend")], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and "resend complete" in r.stderr, r.stderr[-3000:]
    closed = wait_for(lambda: tickets(topo, "--closed"), 30, "the ticket closed")
    assert [(t["ticket"], t["state"]) for t in closed] == [(opened[0]["ticket"], "filled")]
    assert len(consume(dst.bootstrap, "dst_src", 25, timeout=30, idle=1)) == 25
