"""A packer driven step by step while the source cluster stops answering (SIGSTOP), with a
record too large to cross that must go to the dead-letter topic there: no step waits on the
cluster (the topic is created from a thread), the records after it keep crossing, and the dead
letter is written and acknowledged once the cluster answers."""

import socket
import tempfile
import time

import pytest

from diode.link import crypto, runs, wire
from diode.link.records import Record
from diode.runtime import messages, transport
from diode.runtime.topology import from_dict
from diode.runtime.worker import SLOW_STEP_SECONDS
from tests.conftest import consume, free_port, headers_of
from tests.stages.test_stages import MASTER, make_stage, packer_step, sink, source

pytestmark = pytest.mark.integration  # (a broker of each kind is started)


def packer_topology(bootstrap: str):
    return from_dict({
        "link": {"port": free_port(socket.SOCK_DGRAM), "bind.address": "127.0.0.1",
                 "datagram.size.bytes": 1472},
        "security": {"password.env": "X", "salt": "salt"},
        "sender": {"kafka": {"bootstrap.servers": bootstrap}, "topics": ["t"],
                   "dead.letter.topic": "too-big", "max.record.bytes": 4096},
        "receiver": {"kafka": {"bootstrap.servers": "x:1"},
                     "journal.dir": tempfile.mkdtemp(prefix="diode-test-journal-")},
    })


def test_a_dead_letter_never_holds_the_packer_while_the_source_cluster_is_frozen(
        zctx, start_brokers, broker_kind):
    [src] = start_brokers(broker_kind, "source")
    out = sink(zctx, "sender", "udp_sender")
    acks = sink(zctx, "sender", "kafka_reader", 0, purpose="acks")
    p = make_stage(zctx, packer_topology(src.bootstrap), "sender", "packer")
    feed = source(zctx, "sender", "packer")
    big = Record("t", 0, 0, 1000, 1, b"big", b"X" * 5000, (("h", b"v"),), -1)
    small = [Record("t", 0, i, 1000 + i, 1, b"k%d" % i, b"v%d" % i, (), i - 1)
             for i in range(1, 101)]
    keyring = crypto.Keyring(1, MASTER)
    crossed, longest = [], 0.0
    try:
        src.pause()
        feed.send_multipart([messages.Runs(0, 7, [1]).encode(), runs.from_records([big])])
        feed.send_multipart([messages.Runs(0, 8, [100]).encode(), runs.from_records(small)])
        deadline = time.monotonic() + 3  # (the topic's creation waits up to 15 s meanwhile)
        while time.monotonic() < deadline:
            began = time.monotonic()
            sent = packer_step(p, out)
            longest = max(longest, time.monotonic() - began)
            for dg, _ in sent:
                crossed += wire.open_datagram(dg, keyring)[0]
        assert crossed == small  # the records after the dead letter were not held up
        assert not transport.drain(acks)  # the dead letter is not acknowledged before written
    finally:
        src.resume()
    assert longest < SLOW_STEP_SECONDS, f"a step waited {longest:.1f} s on the source cluster"
    acked = []
    deadline = time.monotonic() + 60
    while not acked:
        assert time.monotonic() < deadline, "the dead letter was never acknowledged"
        p.step()
        acked = [a for frames in transport.drain(acks)
                 for a in messages.Acks.decode(frames[0]).acks]
    assert acked == [(7, 1)]
    p.close()
    dead = consume(src.bootstrap, "too-big", 1)
    assert dead[0].value() == b"X" * 5000 and dead[0].key() == b"big"
    h = headers_of(dead[0])
    assert (h["sourceTopic"], h["sourcePartition"], h["sourceOffset"]) == (b"t", b"0", b"0")
