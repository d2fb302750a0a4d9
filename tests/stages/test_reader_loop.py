"""A kafka_reader and a kafka_resender driven turn by turn (diode.runtime.worker.Stage.step)
against a real source broker, their packer and acknowledgements played by the test: the order
of what a reader hands on at its start and at its stop, what a reader killed as its topic is
recreated tells after its restart, a resend that ends by itself, and what its heartbeats claim
with sender.heartbeat.claims.max (diode.kafka.claims)."""

import json
import os
import socket
import tempfile
import time

import pytest
import zmq
from confluent_kafka import Consumer, TopicPartition

from diode.kafka import identity
from diode.runtime import messages, transport
from diode.runtime.metrics import Metrics
from diode.runtime.topology import from_dict
from diode.runtime.wiring import WorkerSpec
from diode.runtime.worker import Secrets, StageContext
from stages import kafka_reader, kafka_resender
from tests.conftest import create_topic, free_port, only_on, produce, recreate, topic_id
from tests.stages.test_stages import MASTER, sink

pytestmark = pytest.mark.integration  # (a broker is started)

RECORDS = 50


def reader_topology(bootstrap: str, **sender):
    return from_dict({
        "link": {"port": free_port(socket.SOCK_DGRAM), "bind.address": "127.0.0.1"},
        "security": {"password.env": "X", "salt": "salt"},
        # (heartbeats often enough that one would fall due while the reader stops)
        "sender": {"kafka": {"bootstrap.servers": bootstrap}, "topics": ["t"],
                   "heartbeat.interval.ms": 50, **sender},
        "receiver": {"kafka": {"bootstrap.servers": "x:1"},
                     "journal.dir": tempfile.mkdtemp(prefix="diode-test-journal-")},
    })


def open_reader(zctx, t, cls):
    spec = WorkerSpec("sender", "kafka_reader", 0, ())
    s = cls(StageContext(t, spec, "inproc", Secrets(1, MASTER), zctx,
                         Metrics({"stage": "kafka_reader"})))
    s.open()
    return s


def turns(reader, out, acks, until, seconds=30) -> tuple[list, bool]:
    """Turns of `reader` until `until(handed)` or its loop ends; what it handed its packer,
    decoded, each Runs acknowledged at once as the udp_sender would; whether it went on."""
    handed, going = [], True
    deadline = time.monotonic() + seconds
    while going and not until(handed):
        assert time.monotonic() < deadline, [type(m).__name__ for m in handed]
        going = reader.step()
        for frames in transport.drain(out, 1000):
            m = messages.from_reader(frames[0])
            handed.append(m)
            if type(m) is messages.Runs:
                acks.send(messages.Acks([(m.msg_id, sum(m.counts))]).encode())
    return handed, going


def records(handed) -> int:
    return sum(sum(m.counts) for m in handed if type(m) is messages.Runs)


@only_on("tansu")  # (the reader's loop decides it, not the broker)
def test_a_reader_beats_before_its_first_record_and_after_its_last_and_a_resend_ends(
        zctx, start_brokers, broker_kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (a reader's lineage memory: <run dir>/state, here inproc/)
    [src] = start_brokers(broker_kind, "source")
    create_topic(src.bootstrap, "t", 1)
    produce(src.bootstrap, "t", [{"value": b"r%d" % i} for i in range(RECORDS)])
    t = reader_topology(src.bootstrap)
    out = sink(zctx, "sender", "packer")
    r = open_reader(zctx, t, kafka_reader.Stage)
    acks = transport.push(zctx, ["inproc://sender-kafka_reader-0.acks"], 1000)
    try:
        running, _ = turns(r, out, acks, lambda h: records(h) == RECORDS)
        kinds = [type(m) for m in running]
        # The first heartbeat goes before any record (diode.accounting.ordering).
        assert kinds.index(messages.Heartbeat) < kinds.index(messages.Runs), kinds
        r.stop()
        stopping, going = turns(r, out, acks, lambda h: False)
    finally:
        r.close()
    assert not going
    # Stopped: nothing more read; the acknowledged records committed, then said in exactly
    # STOPPING_BEATS heartbeats marked stopping, naming the last offset sent, and no other.
    assert not records(stopping)
    beats = [m.beat for m in stopping if type(m) is messages.Heartbeat]
    assert [b["stopping"] for b in beats] == [True] * kafka_reader.Stage.STOPPING_BEATS, beats
    assert all([p[:2] + p[3:5] for p in b["partitions"]] == [["t", 0, 0, RECORDS - 1]]
               for b in beats), beats
    c = Consumer({"bootstrap.servers": src.bootstrap, "group.id": f"diode-{t.name}"})
    try:
        assert c.committed([TopicPartition("t", 0)], timeout=10)[0].offset == RECORDS
    finally:
        c.close()

    # A resend of offsets 10..19 reads them, hands their digest, and ends by itself.
    zctx2 = zmq.Context()
    try:
        out = sink(zctx2, "sender", "packer")
        cls = kafka_resender.Stage.for_ranges({("t", 0): [[10, 19]]})
        rs = open_reader(zctx2, t, cls)
        acks = transport.push(zctx2, ["inproc://sender-kafka_reader-0.acks"], 1000)
        try:
            handed, going = turns(rs, out, acks, lambda h: False)
        finally:
            rs.close()
    finally:
        zctx2.destroy(linger=0)
    assert not going and records(handed) == 10
    assert not [m for m in handed if type(m) is messages.Heartbeat]
    [digests] = [m.batch for m in handed if type(m) is messages.DigestBatch]
    assert digests["resend"] and [d[:2] + d[3:6] for d in digests["partitions"]] == \
        [("t", 0, 10, 19, 10)]


def claimed(beat) -> dict:
    """partition -> the last offset sent, of what a heartbeat claims."""
    return {p[1]: p[4] for p in beat["partitions"]}


@only_on("tansu")  # (the reader's claims, not the broker)
def test_heartbeats_claim_what_changed_at_once_the_rest_in_turn_and_all_when_stopping(
        zctx, start_brokers, broker_kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    partitions, most = 6, 1
    k = partitions // most  # (each partition claimed at least every K heartbeats)
    [src] = start_brokers(broker_kind, "source")
    create_topic(src.bootstrap, "t", partitions)
    produce(src.bootstrap, "t", [{"value": b"r%d" % i, "partition": i % partitions}
                                 for i in range(RECORDS)])
    t = reader_topology(src.bootstrap, topics=["t"], **{"heartbeat.claims.max": most})
    out = sink(zctx, "sender", "packer")
    r = open_reader(zctx, t, kafka_reader.Stage)
    acks = transport.push(zctx, ["inproc://sender-kafka_reader-0.acks"], 1000)

    def beats(handed):
        return [m.beat for m in handed if type(m) is messages.Heartbeat]
    try:
        turns(r, out, acks, lambda h: records(h) == RECORDS)
        last = {p: RECORDS // partitions - 1 + (p < RECORDS % partitions) for p in
                range(partitions)}
        # (its look at the source has found every partition's end, which each claim names:
        # finding them changes every claim at once, when the look comes; Tansu lists an end
        # short, the look after the reader's fetches saw it gives it whole)
        turns(r, out, acks, lambda h: not r.tracker.inflight and all(
            r.lineage.ends.get(("t", p)) == last[p] + 1 for p in range(partitions)))
        # idle: every heartbeat names at most `most` partitions, and any K in a row all of them
        idle, _ = turns(r, out, acks, lambda h: len(beats(h)) >= 3 * k + 2)
        idle = [claimed(b) for b in beats(idle)][2:]  # (the first may still name what was sent)
        assert all(len(c) <= most for c in idle), idle
        for i in range(len(idle) - k + 1):
            window = {}
            for c in idle[i:i + k]:
                window.update(c)
            assert window == last, (i, idle)
        # idle, what a restart needs to know is not written again (diode.kafka.lineage)
        written = os.stat(r.memory).st_mtime_ns
        turns(r, out, acks, lambda h: len(beats(h)) >= 3)
        assert os.stat(r.memory).st_mtime_ns == written
        # new records of a partition just claimed: named in the next heartbeats, not K later
        p = next(iter(idle[-1]))
        produce(src.bootstrap, "t", [{"value": b"late", "partition": p}])
        sent, _ = turns(r, out, acks, lambda h: records(h) == 1)
        # (the first heartbeat after the reader took the acknowledgement: nothing in flight)
        after, _ = turns(r, out, acks, lambda h: any(
            b["counters"]["inflight"] == 0 for b in beats(h)))
        [first] = [b for b in beats(after) if b["counters"]["inflight"] == 0]
        assert claimed(first).get(p) == last[p] + 1, (p, first)
        with open(r.memory) as f:  # (and what a restart needs to know, at once)
            assert [e[4] for e in json.load(f)["partitions"] if e[1] == p] == [last[p] + 1]
        last[p] += 1
        r.stop()
        stopping, going = turns(r, out, acks, lambda h: False)
    finally:
        r.close()
    assert not going
    stopped = beats(stopping)
    assert stopped and all(b["stopping"] and claimed(b) == last for b in stopped), stopped


@only_on("tansu")  # (what the reader remembers is its own doing, not the broker's)
def test_a_reader_killed_as_its_topic_is_recreated_claims_the_old_end_it_had_seen(
        zctx, start_brokers, broker_kind, tmp_path, monkeypatch):
    """A reader killed once it has seen its partition's end (on Tansu, librdkafka kills it as
    the topic is deleted) and started again after the topic was recreated: its heartbeats'
    retired claim names the end of the old incarnation it had seen, so the receiver reports
    what never crossed of it as source-reset. It had recorded what it knew only at its
    heartbeats: killed between a look and its next heartbeat, it claimed an end it had not
    seen yet, and the records past it were lost without a report."""
    monkeypatch.chdir(tmp_path)  # (a reader's lineage memory: <run dir>/state, here inproc/)
    [src] = start_brokers(broker_kind, "source")
    create_topic(src.bootstrap, "t", 1)
    old = topic_id(src.bootstrap, "t")
    produce(src.bootstrap, "t", [{"value": b"old%d" % i} for i in range(RECORDS)])
    looks = {"identity.check.interval.ms": 50, "source.state.interval.ms": 50}
    # Its first heartbeat goes before it has looked at anything; the next not before the kill.
    t = reader_topology(src.bootstrap, **looks, **{"heartbeat.interval.ms": 600_000})
    out = sink(zctx, "sender", "packer")
    r = open_reader(zctx, t, kafka_reader.Stage)
    acks = transport.push(zctx, ["inproc://sender-kafka_reader-0.acks"], 1000)

    def saw_the_end(handed):  # (what it sends across of its look at the source)
        return any(type(m) is messages.SourceLook and m.state["partitions"] and
                   m.state["partitions"][0][4] == RECORDS for m in handed)
    try:
        turns(r, out, acks, saw_the_end)
    finally:
        r.close()  # killed: no stop, no heartbeat after the first
    recreate(src.bootstrap, "t", 1)
    produce(src.bootstrap, "t", [{"value": b"new%d" % i} for i in range(10)])

    zctx2 = zmq.Context()
    try:
        out = sink(zctx2, "sender", "packer")
        again = open_reader(zctx2, reader_topology(src.bootstrap, **looks), kafka_reader.Stage)
        acks = transport.push(zctx2, ["inproc://sender-kafka_reader-0.acks"], 1000)

        def beat_after_the_new_records(handed):
            kinds = [type(m) for m in handed]
            return records(handed) == 10 and messages.Heartbeat in kinds[
                max(i for i, k in enumerate(kinds) if k is messages.Runs):]
        try:
            handed, _ = turns(again, out, acks, beat_after_the_new_records)
        finally:
            again.close()
    finally:
        zctx2.destroy(linger=0)
    retired = {(p[0], p[1], identity.text(p[2]), p[5]) for m in handed
               if type(m) is messages.Heartbeat for p in m.beat["partitions"] if p[6]}
    assert retired == {("t", 0, old, RECORDS - 1)}, retired


class Positions:
    """A consumer whose position() calls are recorded (the partitions asked, each call)."""

    def __init__(self, consumer):
        self.consumer, self.asked = consumer, []

    def position(self, tps):
        self.asked.append({(tp.topic, tp.partition) for tp in tps})
        return self.consumer.position(tps)

    def __getattr__(self, name):
        return getattr(self.consumer, name)


@only_on("tansu")  # (what the reader sends of its looks is its own doing, not the broker's)
def test_an_idle_reader_sends_its_source_whole_only_in_turn_and_then_what_changed(
        zctx, start_brokers, broker_kind, tmp_path, monkeypatch):
    """The source's state (wire.KIND_SOURCE) goes across whole every SOURCE_WHOLE_LOOKS looks
    and, between, only the partitions whose log start or end changed: an idle reader of 10 000
    partitions sent them all every 10 s (and its packer encoded them). Its commits ask the
    consumer's position of no partition whose end is what was sent, where they asked them all
    every second (a third of a core at 10 000)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(kafka_reader, "SOURCE_WHOLE_LOOKS", 3)
    partitions = 3
    [src] = start_brokers(broker_kind, "source")
    create_topic(src.bootstrap, "t", partitions)
    produce(src.bootstrap, "t", [{"value": b"r%d" % i, "partition": i % partitions}
                                 for i in range(RECORDS)])
    last = {p: RECORDS // partitions - 1 + (p < RECORDS % partitions) for p in range(partitions)}
    t = reader_topology(src.bootstrap, **{"identity.check.interval.ms": 50,
                                          "source.state.interval.ms": 50,
                                          "offset.commit.interval.ms": 50})
    out = sink(zctx, "sender", "packer")
    r = open_reader(zctx, t, kafka_reader.Stage)
    r.consumer = Positions(r.consumer)
    acks = transport.push(zctx, ["inproc://sender-kafka_reader-0.acks"], 1000)

    def looks(handed):
        return [{p[1]: p[4] for p in m.state["partitions"]} for m in handed
                if type(m) is messages.SourceLook]
    whole = {p: last[p] + 1 for p in range(partitions)}  # (each partition's end)
    try:
        turns(r, out, acks, lambda h: records(h) == RECORDS)
        turns(r, out, acks, lambda h: whole in looks(h))
        # idle: of 9 looks, the 3 in turn go, whole; the others send nothing
        first = r.source_looks
        idle, _ = turns(r, out, acks, lambda h: r.source_looks >= first + 9)
        wholes = sum(1 for n in range(first, r.source_looks) if n % 3 == 0)
        assert looks(idle) == [whole] * wholes, (first, r.source_looks, looks(idle))
        # idle commits (one per heartbeat here) ask the consumer for no position: every end is
        # what was sent
        r.consumer.asked = []
        turns(r, out, acks, lambda h: sum(type(m) is messages.Heartbeat for m in h) >= 10)
        assert r.consumer.asked == []
        # a record in partition 1: the next look that is not whole names it alone
        monkeypatch.setattr(kafka_reader, "SOURCE_WHOLE_LOOKS", 10 ** 9)
        produce(src.bootstrap, "t", [{"value": b"late", "partition": 1}])
        changed, _ = turns(r, out, acks, lambda h: any(1 in look for look in looks(h)))
        assert [look for look in looks(changed) if 1 in look] == [{1: whole[1] + 1}]
    finally:
        r.close()
