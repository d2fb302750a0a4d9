"""The receiver's stages held back by the stage after them (a writer behind its destination):
they take nothing more, wait for room in few turns instead of turning every millisecond, and
hand everything on once room comes."""

import dataclasses
import socket
import time

from diode.link import crypto, runs, wire
from diode.runtime import messages, transport
from tests.stages.test_stages import (MASTER, datagrams_in, datagrams_message, make_stage,
                                      records, run_until, topology, writer_messages)
from stages import udp_reader

HELD_SECONDS = 0.5
MAX_HELD_TURNS = 50  # a turn waits up to Stage.POLL_MS (50 ms): ~10; a 1 ms sleep loop: ~400


def small_queues(t):
    """Every ZeroMQ queue of the topology one message deep: the next stage soon behind."""
    return dataclasses.replace(t, supervisor=dataclasses.replace(t.supervisor,
                                                                 queue_max_messages=1))


def held_turns(stage) -> int:
    """The stage's turns over HELD_SECONDS, nothing coming and the next stage taking nothing."""
    turns, deadline = 0, time.monotonic() + HELD_SECONDS
    while time.monotonic() < deadline:
        stage.step()
        turns += 1
    return turns


def fill_unpacker(zctx, datagrams: int) -> list:
    """Datagrams of 5 records each (one partition's chain) fed to an unpacker; the records."""
    feed = transport.push(zctx, ["inproc://receiver-unpacker-0.in"], 1000)
    sealer = wire.Sealer(crypto.SessionCipher(1, MASTER, 3), "none")
    sent = records(5 * datagrams)
    for i in range(datagrams):
        payload = runs.encode_records(sent[5 * i:5 * i + 5], {"t": 1})
        feed.send_multipart(datagrams_message(sealer.seal(payload), first=i))
    feed.close()
    return sent


def test_an_unpacker_whose_writer_is_behind_waits_for_it_and_then_hands_on_every_record(zctx):
    t = small_queues(topology(kafka_writer=1))
    writer = transport.pull(zctx, "inproc://receiver-kafka_writer-0.in", 1)  # (taking nothing)
    u = make_stage(zctx, t, "receiver", "unpacker")
    sent = fill_unpacker(zctx, 40)
    run_until(u, lambda: u.outs[0].pending)  # (the writer's queue is full)
    turns = held_turns(u)
    assert turns < MAX_HELD_TURNS, f"{turns} turns in {HELD_SECONDS} s while the writer " \
        f"took nothing: the unpacker spins"
    got = []
    run_until(u, lambda: got.extend(r for recs, _, _ in writer_messages(writer) for r in recs)
              or len(got) >= len(sent))
    assert got == sent  # (each once, in order)
    u.close()


def test_a_udp_reader_whose_unpacker_is_behind_waits_journals_what_comes_and_forwards_it_all(
        zctx):
    t = small_queues(topology(unpacker=1))
    unpacker = transport.pull(zctx, "inproc://receiver-unpacker-0.in", 1)  # (taking nothing)
    r = make_stage(zctx, t, "receiver", "udp_reader")
    sealer = wire.Sealer(crypto.SessionCipher(1, MASTER, 5), "none")
    datagrams = [sealer.seal(b"payload %d" % i) for i in range(81)]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for datagram in datagrams[:80]:
            s.sendto(datagram, ("127.0.0.1", t.link.port))
        run_until(r, lambda: r.metrics.get("datagrams") == 80 and r.outs[0].pending)
        turns = held_turns(r)
        assert turns < MAX_HELD_TURNS, f"{turns} turns in {HELD_SECONDS} s while the " \
            f"unpacker took nothing: the udp_reader spins"
        end = r.end
        s.sendto(datagrams[80], ("127.0.0.1", t.link.port))
        run_until(r, lambda: r.end > end)  # (read into the journal while held back)
    got = []
    run_until(r, lambda: got.extend(bytes(d) for frames in transport.drain(unpacker)
                                    for d in datagrams_in(frames)) or len(got) >= 81)
    assert sorted(got) == sorted(datagrams)  # (each once)
    assert r.metrics.get("datagrams") == 81
    r.close()


def test_the_unpackers_wait_wakes_for_room_not_only_at_its_timeout(zctx):
    """Room made while the unpacker waits is taken in that same turn's wait (POLLOUT), not at
    the end of a sleep: its next turn sends what waited."""
    t = small_queues(topology(kafka_writer=1))
    writer = transport.pull(zctx, "inproc://receiver-kafka_writer-0.in", 1)
    u = make_stage(zctx, t, "receiver", "unpacker")
    fill_unpacker(zctx, 40)
    run_until(u, lambda: u.outs[0].pending)
    assert transport.wait_for_room(u.outs, 0) is False  # (the writer takes nothing)
    assert transport.drain(writer)
    assert transport.wait_for_room(u.outs, 1000) is True
    u.close()


def test_an_idle_udp_reader_marks_only_to_move_the_clock_and_seldom(zctx):
    """With nothing coming, a mark only moves the writers' clock: one every IDLE_MARK_SECONDS
    (each wakes every unpacker and every writer), where one went at every turn; a datagram
    forwarded is marked at once again."""
    t = topology(unpacker=1)
    unpacker = transport.pull(zctx, "inproc://receiver-unpacker-0.in", 1000)
    r = make_stage(zctx, t, "receiver", "udp_reader")
    r.step()
    transport.drain(unpacker)
    seconds, began = 1.0, time.monotonic()
    while time.monotonic() < began + seconds:
        r.step()
    marks = [m for m in (messages.from_udp_reader(f[0]) for f in transport.drain(unpacker))
             if isinstance(m, messages.Mark)]
    assert len(marks) <= seconds / udp_reader.IDLE_MARK_SECONDS + 1, \
        f"{len(marks)} marks in {seconds} s with nothing forwarded"
    assert marks and all(m.position == r.end for m in marks)
    sealer = wire.Sealer(crypto.SessionCipher(1, MASTER, 5), "none")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(sealer.seal(b"payload"), ("127.0.0.1", t.link.port))
        run_until(r, lambda: r.metrics.get("datagrams") == 1)
    end = r.end
    run_until(r, lambda: any(isinstance(m, messages.Mark) and m.position == end for m in (
        messages.from_udp_reader(f[0]) for f in transport.drain(unpacker))), timeout=1.0)
    r.close()
