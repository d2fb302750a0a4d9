"""Stages driven step by step in this process, wired with in-memory (inproc) ZeroMQ sockets."""

import dataclasses
import socket
import struct
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import zmq

from diode.kafka import identity
from diode.link import admission, crypto, runs, wire
from diode.runtime import messages, transport
from diode.runtime.metrics import Metrics
from diode.link.records import NO_INCARNATION, Record, partition_owner
from diode.runtime.topology import from_dict
from diode.runtime.wiring import WorkerSpec
from diode.writer.destination import Entry
from diode.runtime.worker import Secrets, StageContext, stage_class
from tests.conftest import free_port
from stages import udp_reader
from stages.unpacker import ToWriter

MASTER = crypto.master_key_from_password(b"pw", b"salt")


def topology(**receiver_stages):
    return from_dict({
        "link": {"port": free_port(socket.SOCK_DGRAM), "bind.address": "127.0.0.1",
                 "datagram.size.bytes": 1472},
        "security": {"password.env": "X", "salt": "salt"},
        "sender": {"kafka": {"bootstrap.servers": "x:1"}, "topics": ["t"],
                   "stages": {"packer": {"instances": 1}}},
        "receiver": {"kafka": {"bootstrap.servers": "x:1"},
                     "journal.dir": tempfile.mkdtemp(prefix="diode-test-journal-"),
                     "stages": {k: {"instances": v} for k, v in receiver_stages.items()}},
    })


def make_stage(zctx, t, side, stage, index=0):
    spec = WorkerSpec(side, stage, index, ())
    ctx = StageContext(t, spec, "inproc", Secrets(1, MASTER), zctx,
                       Metrics({"stage": stage}))
    s = stage_class(stage)(ctx)
    s.open()
    return s


def sink(zctx, side, stage, index=0, purpose="in"):
    return transport.pull(zctx, f"inproc://{side}-{stage}-{index}.{purpose}", 1000)


def source(zctx, side, stage, index=0):
    return transport.push(zctx, [f"inproc://{side}-{stage}-{index}.in"], 1000)


def records(n, topic="t", partition=0):
    """A chain of records, as a reader reads them."""
    return [Record(topic, partition, i, 1000 + i, 1, b"k%d" % i, b"v%d" % i * 10,
                   (("h", b"x"),), i - 1) for i in range(n)]


def valid_datagram(recs, session=1):
    sealer = wire.Sealer(crypto.SessionCipher(1, MASTER, session), "none")
    return sealer.seal(runs.encode_records(recs, {"t": 1, "u": 4}))


def writer_messages(sock):
    """What an unpacker sent a writer: (records, claims, beats) per message (marks and
    notices left out)."""
    out = []
    for frames in transport.drain(sock):
        batch = messages.Batch.decode(frames[0])
        found = transport.split(batch.lengths, frames[1])
        assert len(batch.origins) == len(found)
        if found or batch.claims or batch.beats:
            out.append(([r for f in found for r in runs.Run.decode(f).records()], batch.claims,
                        batch.beats))
    return out


def datagrams_message(*datagrams, first=0):
    """What the udp_reader sends an unpacker: datagrams read just now, at journal positions."""
    lengths, body = transport.join(list(datagrams))
    return [messages.Data(False, list(range(first, first + len(datagrams))), time.monotonic(),
                          lengths).encode(), body]


def datagrams_in(frames) -> list:
    """The datagrams of a message from the udp_reader (none in a mark or a notice)."""
    message = messages.from_udp_reader(frames[0])
    return transport.split(message.lengths, frames[1]) \
        if isinstance(message, messages.Data) else []


def unpacker_with_writers(zctx, writers: int):
    """An unpacker wired to `writers` in-memory writer sinks: (unpacker, sinks, its input)."""
    t = topology(kafka_writer=writers)
    sinks = [sink(zctx, "receiver", "kafka_writer", i) for i in range(writers)]
    u = make_stage(zctx, t, "receiver", "unpacker")
    return u, sinks, source(zctx, "receiver", "unpacker")


def run_until(stage, cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        stage.step()


def test_unpacker_forwards_valid_records_and_counts_every_reject(zctx):
    u, writers, feed = unpacker_with_writers(zctx, 2)
    good = valid_datagram(records(20, partition=0) + records(5, topic="u", partition=3))
    wrong_key = wire.Sealer(crypto.SessionCipher(1, b"k" * 32, 9), "none").seal(b"x")
    flipped = bytearray(good)
    flipped[40] ^= 1
    feed.send_multipart(datagrams_message(b"", b"garbage" * 10, good[:20], bytes(flipped),
                                          wrong_key, good[:-1], good, good))  # the last: replay
    run_until(u, lambda: u.metrics.get("rejects", reason="replayed") == 1)
    got = []
    for w in writers:
        for recs, claims, beats in writer_messages(w):
            got += recs
            assert not claims and not beats
    assert sorted(got) == sorted(records(20) + records(5, topic="u", partition=3))
    rejects = {r: u.metrics.get("rejects", reason=r)
               for r in ("truncated", "bad_magic", "auth_failed")}
    assert rejects == {"truncated": 2, "bad_magic": 1, "auth_failed": 3}
    u.close()


def test_unpacker_sends_each_partition_to_its_owning_writer(zctx):
    u, writers, feed = unpacker_with_writers(zctx, 3)
    recs = [r for p in range(6) for r in records(4, partition=p)]
    feed.send_multipart(datagrams_message(valid_datagram(recs)))
    run_until(u, lambda: u.metrics.get("records") == 24)
    owners = {}
    for i, w in enumerate(writers):
        for recs, _, _ in writer_messages(w):
            for r in recs:
                owners.setdefault(r.partition, set()).add(i)
    assert sorted(owners) == list(range(6))
    assert all(len(v) == 1 for v in owners.values())
    assert len({min(v) for v in owners.values()}) > 1  # spread over writers


def test_the_sources_state_crosses_to_the_writers_owning_its_partitions(zctx):
    """A reader's look at its source (wire.KIND_SOURCE), sealed by a packer as it would send
    it: each partition's log start and end reach the writer owning it, with the settings of
    the topics it names and no others."""
    p, feed, out = packer_wired(zctx)
    inc = bytes(range(16))
    state = {"reader": 0, "time_ms": 5, "cluster": "c",
             "partitions": [["t", i, inc, 10 * i, 100 + i] for i in range(6)] +
                           [["u", 0, inc, 0, 7]],
             "topics": [["t", 3600000, -1, "delete"], ["u", -2, -2, ""]]}
    feed.send_multipart([messages.SourceLook(state).encode()])
    sent = []
    deadline = time.monotonic() + 5
    while not sent and time.monotonic() < deadline:
        sent = [bytes(d) for d, _ in packer_step(p, out)]
    assert [wire.parse_header(d).kind for d in sent] == [wire.KIND_SOURCE]
    u, writers, to_unpacker = unpacker_with_writers(zctx, 3)
    to_unpacker.send_multipart(datagrams_message(*sent))
    got = []
    deadline = time.monotonic() + 5
    while len(got) < 7 and time.monotonic() < deadline:
        u.step()
        for i, w in enumerate(writers):
            for frames in transport.drain(w):
                for side in messages.Batch.decode(frames[0]).sources:
                    source = side.state
                    named = {e[0] for e in source["partitions"]}
                    assert {t[0] for t in source["topics"]} == named
                    got += [(i, e) for e in source["partitions"]]
    assert sorted(e for _, e in got) == sorted(tuple(e) for e in state["partitions"])
    assert all(i == partition_owner(e[0], e[1], 3) for i, e in got)
    u.close()


def test_the_sources_metadata_crosses_whole_in_as_many_datagrams_as_it_needs(zctx):
    """Reader 0's metadata (wire.KIND_METADATA) for 300 topics and 200 group positions, more
    than a datagram holds: sealed by a packer in several datagrams, each within the datagram
    size, it reaches writer 0, and only it, whole."""
    p, feed, out = packer_wired(zctx)
    inc = bytes(range(16))
    meta = {"reader": 0, "time_ms": 5, "cluster": "c", "whole": True,
            "topics": [(f"topic-{i}", inc, 1 + i % 7, {"cleanup.policy": "compact",
                                                       "retention.ms": str(1000 * i)})
                       for i in range(300)],
            "groups": [(f"g{i % 5}", f"topic-{i}", i % 3, inc, 10 * i) for i in range(200)]}
    feed.send_multipart([messages.MetadataLook(meta).encode()])
    sent = []
    deadline = time.monotonic() + 5
    while not sent and time.monotonic() < deadline:
        sent = [bytes(d) for d, _ in packer_step(p, out)]
    assert len(sent) > 5 and all(len(d) <= 1472 for d in sent)
    assert {wire.parse_header(d).kind for d in sent} == {wire.KIND_METADATA}
    u, writers, to_unpacker = unpacker_with_writers(zctx, 3)
    to_unpacker.send_multipart(datagrams_message(*sent))
    got = [[] for _ in writers]
    deadline = time.monotonic() + 5
    while sum(map(len, got)) < len(sent) and time.monotonic() < deadline:
        u.step()
        for i, w in enumerate(writers):
            for frames in transport.drain(w):
                got[i] += messages.Batch.decode(frames[0]).sources
    assert not got[1] and not got[2]
    assert all(isinstance(m, messages.MetadataLook) for m in got[0])
    assert [t for m in got[0] for t in m.meta["topics"]] == meta["topics"]
    assert [g for m in got[0] for g in m.meta["groups"]] == meta["groups"]
    u.close()


def test_udp_reader_routes_by_key_and_drops_what_is_not_ours(zctx):
    t = topology(unpacker=2)
    unpackers = [sink(zctx, "receiver", "unpacker", i) for i in range(2)]
    r = make_stage(zctx, t, "receiver", "udp_reader")
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sealer = wire.Sealer(crypto.SessionCipher(1, MASTER, 5), "none")
    datagrams = [sealer.seal(b"payload %d" % i) for i in range(10)]  # routing keys 1..10
    for dg in datagrams + [b"", b"xx", b"\xd1\x0d\x07" + bytes(40)]:
        s.sendto(dg, ("127.0.0.1", t.link.port))
    run_until(r, lambda: r.metrics.get("datagrams") == 13)
    r.step()
    routed = [[bytes(d) for frames in transport.drain(u) for d in datagrams_in(frames)]
              for u in unpackers]
    for i in range(2):  # by the routing key's lane: keys that step evenly spread too
        assert sorted(routed[i]) == sorted(
            dg for dg in datagrams if udp_reader.lane(wire.parse_header(dg).routing_key) % 2 == i)
    assert all(routed)  # (keys 1..10 reach both)
    assert r.metrics.get("rejects", reason="truncated") == 2
    assert r.metrics.get("rejects", reason="bad_version") == 1
    r.close()


@pytest.mark.parametrize("gro", [True, False])
@pytest.mark.parametrize("kernel", [True, False])
def test_udp_reader_reads_nothing_from_an_address_not_admitted(zctx, monkeypatch, kernel, gro):
    """link.source.addresses 127.0.0.1: datagrams from 127.0.0.2, even sealed with the link's
    key, never reach an unpacker; the kernel drops them unread, or the reader (where the kernel
    refuses the filter) before it looks at them, both counted in source_filtered_datagrams."""
    if not kernel:
        def refuse(sock, option, prog):
            raise OSError(1, "Operation not permitted")
        monkeypatch.setattr(admission, "attach", refuse)
    t = topology(unpacker=1)
    t = dataclasses.replace(t, link=dataclasses.replace(t.link, source_addresses=["127.0.0.1"],
                                                        gro_enabled=gro))
    unpacker = sink(zctx, "receiver", "unpacker")
    r = make_stage(zctx, t, "receiver", "udp_reader")
    sealer = wire.Sealer(crypto.SessionCipher(1, MASTER, 5), "none")
    ours = [sealer.seal(b"ours %d" % i) for i in range(10)]
    for address, datagrams in (("127.0.0.2", [sealer.seal(b"flood")] * 30 + [b"junk"] * 10),
                               ("127.0.0.1", ours)):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((address, 0))
            for dg in datagrams:
                s.sendto(dg, ("127.0.0.1", t.link.port))
    run_until(r, lambda: r.metrics.get("datagrams") == 10)
    r.step()
    r.sample_metrics()
    assert [bytes(d) for frames in transport.drain(unpacker) for d in datagrams_in(frames)] \
        == ours
    assert r.metrics.get("source_filtered_datagrams") == 40
    assert r.metrics.get("source_filter") == (admission.KERNEL if kernel else admission.READER)
    assert r.metrics.get("rejects", reason="bad_magic") == 0  # (the junk was never looked at)
    r.close()


def test_a_flood_of_datagrams_not_ours_ends_the_udp_readers_step(zctx):
    """A step reads at most as many datagrams as it forwards at once, however many it drops:
    reading until the socket is empty, a flood that never empties it kept the reader in one
    step, beating no heartbeat, until the supervisor killed it (every record meanwhile lost)."""
    t = topology(unpacker=1)
    sink(zctx, "receiver", "unpacker")
    r = make_stage(zctx, t, "receiver", "udp_reader")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(1000):
            s.sendto(b"not ours" * 20, ("127.0.0.1", t.link.port))
    time.sleep(0.1)
    r.step()
    assert r.metrics.get("datagrams") == udp_reader.BATCH_DATAGRAMS
    run_until(r, lambda: r.metrics.get("rejects", reason="bad_magic") == 1000)
    r.close()


def reader_stream(sock, stream: list) -> None:
    """What the udp_reader sent an unpacker, in order, onto `stream`: ("data", replayed, the
    journal position after its last datagram), ("mark", position), ("notice", started)."""
    for frames in transport.drain(sock):
        m = messages.from_udp_reader(frames[0])
        if isinstance(m, messages.Data):
            last = transport.split(m.lengths, frames[1])[-1]
            stream.append(("data", m.replayed,
                           m.positions[-1] + udp_reader.RECORD_HEADER + len(last)))
        elif isinstance(m, messages.Mark):
            stream.append(("mark", m.position))
        else:
            stream.append(("notice", m.started))


def test_the_udp_readers_marks_follow_what_it_forwarded_through_a_replay_and_a_stop(zctx):
    """A mark claims only positions already forwarded in its stream (a writer checkpoints up
    to it), while the unpacker is behind and what is read waits in the journal too; a replay
    asked for is answered at the reader's next turn, and no mark goes out until the replay has
    gone on; the last turn of a stopping reader marks where it got."""
    t = topology(unpacker=1)
    t = dataclasses.replace(t, supervisor=dataclasses.replace(t.supervisor,
                                                              queue_max_messages=1))
    unpacker = transport.pull(zctx, "inproc://receiver-unpacker-0.in", 1)  # (soon behind)
    r = make_stage(zctx, t, "receiver", "udp_reader")
    sealer = wire.Sealer(crypto.SessionCipher(1, MASTER, 5), "none")
    stream = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for i in range(12):  # (a message a turn: the queue and the outbox fill)
            for j in range(3):
                s.sendto(sealer.seal(b"payload %d %d" % (i, j)), ("127.0.0.1", t.link.port))
            time.sleep(udp_reader.MARK_SECONDS)
            r.step()
    assert r.metrics.get("datagrams") == 36 and r.cursor < r.end  # (waiting in the journal)
    run_until(r, lambda: reader_stream(unpacker, stream) or stream[-1:] == [("mark", r.end)])
    ask = transport.push(zctx, ["inproc://receiver-udp_reader-0.control"], 4)
    asked = time.monotonic()
    ask.send(messages.ReplayAsk(asked, "receiver/unpacker-0").encode())
    r.step()
    assert r.replay_started >= asked  # (answered at once: a Notice on its way)
    run_until(r, lambda: reader_stream(unpacker, stream) or stream[-1] == ("mark", r.end) and
              any(e[0] == "notice" and e[1] >= asked for e in stream))
    replay = stream[[e[0] == "notice" and e[1] >= asked for e in stream].index(True):]
    assert ("data", True, r.end) in replay  # (the journal again, from its start)
    assert [e for e in replay if e[0] == "mark"][0] == ("mark", r.end)
    held = 0  # (the highest position forwarded so far in the stream)
    for event in stream:
        if event[0] == "data":
            held = max(held, event[2])
        elif event[0] == "mark":
            assert event[1] <= held, stream
    assert len({e for e in stream if e[0] == "mark"}) >= 2  # (marks as it caught up)
    stopped = len(stream)
    r.stop()
    assert r.step() is False
    reader_stream(unpacker, stream)
    assert stream[stopped:] == [("mark", r.end)]
    ask.close(linger=0)
    r.close()


def test_a_udp_reader_with_its_journal_full_and_everything_forwarded_waits(zctx):
    """With its journal at receiver.journal.max.bytes it reads nothing (the kernel drops what
    comes), and with nothing left to forward it waits for the journal to be released, as it
    waits for datagrams, instead of turning without pause (a core burnt for as long as a
    destination outage lasts)."""
    t = topology(unpacker=1)
    t = dataclasses.replace(t, receiver=dataclasses.replace(
        t.receiver, journal_max_bytes=1 << 17, journal_segment_bytes=1 << 16))
    unpacker = sink(zctx, "receiver", "unpacker")  # (taking everything)
    r = make_stage(zctx, t, "receiver", "udp_reader")
    sealer = wire.Sealer(crypto.SessionCipher(1, MASTER, 5), "none")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(80):
            s.sendto(sealer.seal(bytes(1000)), ("127.0.0.1", t.link.port))
    run_until(r, lambda: r.metrics.get("journal_full"))
    assert r.cursor == r.end  # (everything read has gone on)
    steps, cpu = 0, time.process_time()
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        r.step()
        steps += 1
    assert steps < 50, f"{steps} steps in 0.5 s: the loop spins on a full journal"
    assert time.process_time() - cpu < 0.1
    assert transport.drain(unpacker, 1000)  # (what it forwarded, and its marks)
    r.close()


def packer_wired(zctx):
    """A packer between a feed (as from a kafka_reader) and a sink (as a udp_sender)."""
    out = sink(zctx, "sender", "udp_sender")
    return make_stage(zctx, topology(), "sender", "packer"), source(zctx, "sender", "packer"), out


def packer_step(p, out) -> list:
    """One step of the packer: [(datagram, what it acknowledges)] it sent the udp_sender."""
    p.step()
    sent = []
    for frames in transport.drain(out):
        message = messages.Datagrams.decode(frames[0])
        found = transport.split(message.lengths, frames[1])
        assert len(message.carried) == len(found)
        sent += zip(found, message.carried)
    return sent


def test_packer_fills_datagrams_and_reports_what_each_carries(zctx):
    p, feed, out = packer_wired(zctx)
    recs = records(500)
    feed.send_multipart([messages.Runs(0, 77, [300]).encode(), runs.from_records(recs[:300])])
    feed.send_multipart([messages.Runs(0, 78, [200]).encode(), runs.from_records(recs[300:])])
    got, acks = [], {}
    keyring = crypto.Keyring(1, MASTER)
    deadline = time.monotonic() + 5
    while len(got) < 500 and time.monotonic() < deadline:
        for dg, tags in packer_step(p, out):
            assert len(dg) <= 1472
            decoded, _ = wire.open_datagram(dg, keyring)
            got += decoded
            assert sum(n for _, _, n in tags) == len(decoded)
            for reader, msg_id, n in tags:
                acks[msg_id] = acks.get(msg_id, 0) + n
    assert got == recs  # in order, each once
    assert acks == {77: 300, 78: 200}
    assert p.metrics.get("datagrams") > 10  # 500 records of ~40 bytes do not fit in one


def test_a_packer_waits_out_its_linger_in_the_poll_not_in_empty_turns(zctx):
    """A few records wait batch.linger.ms (5) for more, then leave in one datagram; the loop
    waits for input until then, not turning without waiting for the linger's last
    millisecond (a busy wait: the wait left was rounded down to 0 ms, ~100 turns)."""
    p, feed, out = packer_wired(zctx)
    feed.send_multipart([messages.Runs(0, 1, [3]).encode(), runs.from_records(records(3))])
    sent, turns = [], 0
    while not sent and turns < 1000:
        sent = packer_step(p, out)
        turns += 1
    assert [len(wire.open_datagram(dg, crypto.Keyring(1, MASTER))[0]) for dg, _ in sent] == [3]
    assert turns <= 5, f"{turns} turns while 3 records lingered"
    p.close()


def test_packer_seals_a_readers_heartbeat_after_what_it_holds(zctx):
    p, feed, out = packer_wired(zctx)
    recs = records(5)
    claim = ["t", 0, bytes(range(16)), 0, 4, 4, False]
    beat = {"reader": 0, "time_ms": 1, "interval_ms": 1000, "partitions": [claim],
            "cluster": "c", "counters": {"records": 5, "rewinds": 0, "inflight": 0}}
    feed.send_multipart([messages.Runs(0, 77, [5]).encode(), runs.from_records(recs)])
    feed.send_multipart([messages.Heartbeat(beat).encode()])
    keyring = crypto.Keyring(1, MASTER)
    kinds, beats = [], []
    deadline = time.monotonic() + 5
    while not beats and time.monotonic() < deadline:
        for dg, tags in packer_step(p, out):
            h, payload = wire.unseal(dg, keyring)
            kinds.append(h.kind)
            if h.kind == wire.KIND_HEARTBEAT:
                assert tags == []  # (a heartbeat acknowledges no record)
                beats.append(wire.decode_heartbeat(payload))
    assert kinds == [wire.KIND_DATA, wire.KIND_HEARTBEAT]
    assert [list(c) for c in beats[0]["partitions"]] == [claim]
    assert beats[0]["cluster"] == "c"


def test_a_heartbeat_of_many_claims_fills_its_datagrams_each_claim_once_with_its_named_time(
        zctx):
    """A heartbeat of 1 000 idle partitions crosses in about as many datagrams as its bytes
    need (163 when each claim was given room for a topic's settings it does not carry: the
    receiver opened five times the datagrams), every claim once, in order, with when its chain
    was first named; topic names longer than the first ones measured still fit a datagram."""
    p, feed, out = packer_wired(zctx)
    inc = bytes(range(16))
    claims = [[f"t{p_ // 5:03d}", p_ % 5, inc, 0, 4, 4, False] for p_ in range(900)]
    claims += [["x" * 200, p_, inc, 0, 4, 4, False] for p_ in range(100)]  # (longer, after)
    named = [1000 + i // 7 for i in range(len(claims))]
    beat = {"reader": 0, "time_ms": 5000, "interval_ms": 1000, "partitions": claims,
            "named_ms": named, "cluster": "c", "counters": {"records": 5}}
    feed.send_multipart([messages.Heartbeat(beat).encode()])
    keyring = crypto.Keyring(1, MASTER)
    got, got_named, sizes = [], [], []
    deadline = time.monotonic() + 5
    while len(got) < len(claims) and time.monotonic() < deadline:
        for dg, _ in packer_step(p, out):
            sizes.append(len(dg))
            h, payload = wire.unseal(dg, keyring)
            b = wire.decode_heartbeat(payload)
            got += [list(c) for c in b["partitions"]]
            got_named += b["named_ms"]
    assert got == claims and got_named == named
    assert max(sizes) <= 1472
    assert len(sizes) <= sum(sizes) // (1472 * 0.8) + 1, sizes  # (filled, not a fifth full)
    p.close()


def test_a_stopping_readers_heartbeat_crosses_marked_stopping(zctx):
    """A reader's last heartbeats, as it stops cleanly, are marked stopping in their header
    (authenticated): the unpacker hands the writers the beat with that mark, and a beat not so
    marked without it."""
    p, feed, out = packer_wired(zctx)
    beat = {"reader": 0, "time_ms": 1, "interval_ms": 1000, "partitions": [],
            "cluster": "c", "counters": {}}
    feed.send_multipart([messages.Heartbeat(beat).encode()])
    feed.send_multipart([messages.Heartbeat({**beat, "stopping": True}).encode()])
    sealed: list = []
    deadline = time.monotonic() + 5
    while len(sealed) < 2 and time.monotonic() < deadline:
        sealed += [dg for dg, _ in packer_step(p, out)]
    keyring = crypto.Keyring(1, MASTER)
    assert [wire.unseal(d, keyring)[0].flags for d in sealed] == [0, wire.FLAG_STOPPING]
    u, writers, unpacker_feed = unpacker_with_writers(zctx, 1)
    unpacker_feed.send_multipart(datagrams_message(*map(bytes, sealed)))
    run_until(u, lambda: u.metrics.get("heartbeats") == 2)
    beats = [b for _, _, bs in writer_messages(writers[0]) for b in bs]
    assert [b["stopping"] for b in beats] == [False, True]
    u.close()


def test_writer_reports_a_clean_stop_once_and_a_silence_after_the_sender_came_back(
        zctx, caplog):
    """Writer 0 takes the sender for stopped once every reader's newest heartbeat says so:
    logged once, and no silent link is reported however long it stays stopped; a heartbeat
    not so marked says it is back, and a silence after that is reported."""
    caplog.set_level("INFO")
    w = make_stage(zctx, topology(unpacker=1, kafka_writer=1), "receiver", "kafka_writer")
    feed = source(zctx, "receiver", "kafka_writer", 0)

    seen = {"beats": 0, "last": None}  # heartbeats taken so far, the newest's clock

    def beats(clock, *stopping):
        sent = [{"reader": r, "time_ms": 1764111600000, "interval_ms": 1000,
                 "partitions": [], "cluster": "c", "counters": {}, "session": "01",
                 "seen": clock, "stopping": s} for r, s in enumerate(stopping)]
        feed.send_multipart([messages.Batch(0, [], [], sent, messages.Mark(0, clock), [], [],
                                            []).encode(), b""])
        seen["beats"] += len(sent)
        seen["last"] = clock
        run_until(w, lambda: w.metrics.get("heartbeats") >= seen["beats"])

    def quiet_until(clock):
        """The reader's clock (its marks) moves on to `clock` with no heartbeat."""
        feed.send_multipart([messages.Batch(0, [], [], [], messages.Mark(0, clock), [], [],
                                            []).encode(), b""])
        run_until(w, lambda: w.metrics.get("link_heartbeat_age_seconds") >=
                  clock - seen["last"])

    beats(100.0, False, False)
    beats(101.0, True, False)  # (reader 1 still reads)
    assert w.metrics.get("sender_stopped") == 0
    beats(101.5, True, True)
    assert w.metrics.get("sender_stopped") == 1
    quiet_until(200.0)  # long past three heartbeat intervals
    assert w.metrics.get("link_silent") == 0
    beats(201.0, False, False)
    assert w.metrics.get("sender_stopped") == 0
    quiet_until(300.0)
    assert w.metrics.get("link_silent") == 1
    said = [r.getMessage() for r in caplog.records]
    assert sum("the sender stopped (clean stop) at 2025-11-25 23:00:00 UTC" in m
               for m in said) == 1, said
    assert sum("the sender is back" in m for m in said) == 1, said
    assert sum("no heartbeat from the sender for 99 s" in m for m in said) == 1, said
    w.close()


def test_udp_sender_keeps_acknowledgements_until_its_reader_is_there(zctx, tmp_path):
    """At start the udp_sender may send before its reader's acknowledgement socket exists (ipc,
    as launched). The acknowledgements wait for it: dropped, they would stall the reader until
    its inflight timeout and make it read and send everything again."""
    t = topology()
    link = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    link.bind(("127.0.0.1", t.link.port))
    run_dir = str(tmp_path)
    s = stage_class("udp_sender")(StageContext(t, WorkerSpec("sender", "udp_sender", 0, ()),
                                               run_dir, Secrets(1, MASTER), zctx,
                                               Metrics({"stage": "udp_sender"})))
    s.open()
    feed = transport.push(zctx, [s.ctx.bound("in")], 10)  # as a packer reaches it
    lengths, body = transport.join([b"one", b"two"])
    feed.send_multipart([messages.Datagrams([[(0, 77, 5)], [(0, 78, 2)]], lengths).encode(),
                         body])
    run_until(s, lambda: s.metrics.get("datagrams") == 2)
    for _ in range(3):
        s.step()  # no reader yet
    acks = transport.pull(zctx, s.ctx.peers("acks")[0], 10)  # the reader's, as it binds it
    got = []
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        s.step()
        got += [messages.Acks.decode(f[0]).acks for f in transport.drain(acks)]
    assert got == [[(77, 5), (78, 2)]]
    assert link.recv(100) == b"one"
    link.close()


def _unpacker_for_fuzzing():
    ctx = zmq.Context.instance()
    t = topology(kafka_writer=2)
    return make_stage(ctx, t, "receiver", "unpacker")


HOSTILE = None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_hostile_datagrams_never_raise_never_yield_records_and_are_all_counted(data):
    """Random, truncated, bit-flipped, replayed and wrong-key datagrams, straight into the
    unpacker's per-datagram path: nothing escapes, nothing is written, every one is counted."""
    global HOSTILE
    if HOSTILE is None:
        HOSTILE = _unpacker_for_fuzzing()
        HOSTILE.seen = valid_datagram(records(3), session=4242)
        HOSTILE.unpack(HOSTILE.seen, [ToWriter() for _ in range(2)],
                       messages.Origin(0, 0.0, False))  # accepted once
    u = HOSTILE
    good = u.seen
    kind = data.draw(st.sampled_from(["random", "truncated", "flipped", "replayed",
                                      "wrong_key", "forged_header"]))
    if kind == "random":
        dg = data.draw(st.binary(max_size=2000))
    elif kind == "truncated":
        dg = good[:data.draw(st.integers(0, len(good) - 1))]
    elif kind == "flipped":
        pos = data.draw(st.integers(0, len(good) * 8 - 1))
        flipped = bytearray(good)
        flipped[pos // 8] ^= 1 << (pos % 8)
        dg = bytes(flipped)
    elif kind == "replayed":
        dg = good
    elif kind == "wrong_key":
        dg = wire.Sealer(crypto.SessionCipher(1, data.draw(st.binary(min_size=32, max_size=32)),
                                              data.draw(st.integers(0, 2**64 - 1))),
                         "none").seal(data.draw(st.binary(max_size=500)))
    else:  # a valid-looking header of any kind, cipher, compression and key id
        header = wire.Header(data.draw(st.integers(0, 255)), 1, data.draw(st.integers(0, 255)),
                             data.draw(st.integers(0, 255)), data.draw(st.integers(0, 2**64 - 1)),
                             data.draw(st.integers(0, 2**64 - 1)), 0).pack()
        dg = header + data.draw(st.binary(max_size=500))
    before = sum(v for (name, _), v in u.metrics.counters.items() if name == "rejects")
    msgs = [ToWriter() for _ in range(2)]
    u.unpack(dg, msgs, messages.Origin(1, 0.0, False))  # must not raise
    assert all(not m.runs and not m.claims and not m.beats for m in msgs)
    after = sum(v for (name, _), v in u.metrics.counters.items() if name == "rejects")
    assert after == before + 1
    assert u.metrics.get("rejects", reason="internal_error") == 0


def test_writer_counts_and_drops_runs_it_cannot_decode_or_does_not_own(zctx):
    """A run comes from an authenticated sender; one that is malformed, or of a partition
    another writer owns, is counted and dropped, never written, and the writer keeps going."""
    t = topology(kafka_writer=2)
    w = make_stage(zctx, t, "receiver", "kafka_writer", index=0)
    feed = source(zctx, "receiver", "kafka_writer", 0)
    mine = next(p for p in range(8) if partition_owner(b"t", p, 2) == 0)
    theirs = next(p for p in range(8) if partition_owner(b"t", p, 2) == 1)
    good = runs.from_records(records(3, partition=mine), 8)
    broken = bytearray(good)
    struct.pack_into("<q", broken, runs.HEADER_BYTES + 1 + 8, 0)  # offsets 0, 0, 2
    origin = messages.Origin(0, time.monotonic(), False)
    lengths, body = transport.join([b"garbage", bytes(broken),
                                    runs.from_records(records(3, partition=theirs), 8), good])
    feed.send_multipart([messages.Batch(0, [origin] * 4, [], [], None, [], lengths,
                                        []).encode(), body])
    run_until(w, lambda: w.metrics.get("rejects", reason="misrouted") == 1, timeout=15)
    assert w.metrics.get("rejects", reason="decode_failed") == 2
    # the good run waits for its destination (there is none to read or write here)
    assert w.dest.produced == 0 and w.dest.backlog_records == 3
    w.close()


class FillingProducer:
    """A producer whose queue holds `room` records and sends `per_poll` of them at each poll:
    produce raises BufferError while it is full, as librdkafka's does."""

    def __init__(self, room, per_poll):
        self.room, self.per_poll, self.queued, self.sent = room, per_poll, 0, []

    def produce(self, topic, value=None, key=None, partition=-1, timestamp=None, headers=None):
        if self.queued >= self.room:
            raise BufferError("Local: Queue full")
        self.queued += 1
        self.sent.append((topic, partition, key, value, timestamp, headers))

    def poll(self, timeout=0):
        self.queued = max(0, self.queued - self.per_poll)
        return 0

    def flush(self, timeout=None):
        self.queued = 0
        return 0

    def __len__(self):
        return self.queued


@pytest.mark.parametrize("room, per_poll", [(1000, 1000), (7, 3), (1, 1)])
def test_writer_resumes_a_run_where_a_full_queue_stopped_it(zctx, room, per_poll):
    """Each record once, in order, with its own headers and provenance, however often the
    producer's queue fills in the middle of a run (null keys, a tombstone, one partly
    produced already)."""
    w = make_stage(zctx, topology(kafka_writer=1), "receiver", "kafka_writer")
    w.dest.producer.flush(0)
    w.dest.producer = FillingProducer(room, per_poll)
    w.dest.dest_partitions["t"] = 8
    recs = [Record("t", 0, i, 1000 + i, 1, None, None if i == 5 else b"v%d" % i,
                   (("h", b"%d" % i),) if i % 3 else (), i - 1) for i in range(40)]
    for a, b in ((0, 13), (13, 14), (14, 40)):
        w.dest.backlog.append(Entry(runs.Run.decode(runs.from_records(recs[a:b], 8))))
        w.dest.backlog_records += b - a
    run_until(w, lambda: not w.dest.backlog)
    sent = w.dest.producer.sent
    assert [(t, p, k, v, ts) for t, p, k, v, ts, _ in sent] == \
        [("t", 0, r.key, r.value, r.timestamp) for r in recs]
    for (*_, headers), r in zip(sent, recs):
        own, provenance, stamp = headers[:len(r.headers)], headers[len(r.headers):-1], headers[-1]
        assert tuple(own) == r.headers and stamp[0] == "writtenAt"
        assert dict(provenance) == {"sourceTopic": b"t", "sourcePartition": b"0",
                                    "sourceOffset": b"%d" % r.offset,
                                    "sourceTopicId": identity.text(NO_INCARNATION).encode()}
    assert w.dest.produced == 40 and w.dest.backlog_records == 0
    w.close()


class StuckProducer(FillingProducer):
    """A destination that takes `room` records and then nothing: poll waits its timeout, as
    librdkafka's does when nothing is delivered (delivery reports for errors only)."""

    def __init__(self, room):
        super().__init__(room, 0)

    def poll(self, timeout=0):
        time.sleep(timeout)
        return 0


def test_a_writer_whose_producer_queue_is_full_waits_instead_of_spinning(zctx):
    """The destination takes nothing more and no input comes: each step waits (for input, or
    for the producer), so the worker does not burn a core while the destination is behind."""
    w = make_stage(zctx, topology(kafka_writer=1), "receiver", "kafka_writer")
    w.dest.producer.flush(0)
    w.dest.producer = StuckProducer(room=3)
    w.dest.dest_partitions["t"] = 8
    w.dest.backlog.append(Entry(runs.Run.decode(runs.from_records(records(40), 8))))
    w.dest.backlog_records += 40
    steps, cpu = 0, time.process_time()
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        w.step()
        steps += 1
    assert w.dest.produced == 3 and w.dest.backlog_records == 37  # held, in order, nothing dropped
    assert steps < 200, f"{steps} steps in 0.5 s: the loop spins on a full queue"
    assert time.process_time() - cpu < 0.25
    w.close()


def test_the_receiver_exports_the_bounds_its_alerts_compare_with(zctx):
    """DiodeJournalFull divides diode_journal_bytes by the journal's bound, and
    DiodeTicketPastHorizon compares the oldest ticket's age with the resend horizon: each stage
    exports its setting, as the topology gives it."""
    t = topology(unpacker=1, kafka_writer=1)
    r = make_stage(zctx, t, "receiver", "udp_reader")
    assert r.metrics.get("journal_max_bytes") == t.receiver.journal_max_bytes == 1 << 30
    r.close()
    w = make_stage(zctx, t, "receiver", "kafka_writer")
    assert w.metrics.get("resend_horizon_seconds") == 86400  # receiver.resend.horizon.ms 24 h
    w.close()
