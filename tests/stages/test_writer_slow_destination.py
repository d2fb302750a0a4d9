"""A kafka_writer driven step by step against a real destination broker that stops answering
(SIGSTOP: its socket still accepts, nothing comes back), as a slow or hung cluster looks to a
client: no step waits on it, the records are held, and written once it answers."""

import socket
import tempfile
import time

import pytest

from diode.link import runs
from diode.link.records import partition_owner
from diode.runtime import messages, transport
from diode.runtime.topology import from_dict
from diode.runtime.worker import SLOW_STEP_SECONDS
from tests.conftest import consume, free_port, source_coordinates
from tests.stages.test_stages import make_stage, records, source

pytestmark = pytest.mark.integration  # (a broker of each kind is started)


def writer_topology(bootstrap: str):
    return from_dict({
        "link": {"port": free_port(socket.SOCK_DGRAM), "bind.address": "127.0.0.1"},
        "security": {"password.env": "X", "salt": "salt"},
        "sender": {"kafka": {"bootstrap.servers": "x:1"}, "topics": ["t"]},
        "receiver": {"kafka": {"bootstrap.servers": bootstrap},
                     "missing.records.topic": "missing",
                     "journal.dir": tempfile.mkdtemp(prefix="diode-test-journal-"),
                     "stages": {"kafka_writer": {"instances": 2}}},
    })


def test_a_writer_holds_its_records_without_waiting_while_the_destination_is_frozen(
        zctx, start_brokers, broker_kind):
    [dst] = start_brokers(broker_kind, "destination")
    w = make_stage(zctx, writer_topology(dst.bootstrap), "receiver", "kafka_writer", index=0)
    feed = source(zctx, "receiver", "kafka_writer", 0)
    mine = next(p for p in range(8) if partition_owner("t", p, 2) == 0)
    recs = records(300, partition=mine)
    longest = 0.0
    try:
        dst.pause()
        for start in range(0, len(recs), 100):  # three runs, one after the other
            lengths, body = transport.join([runs.from_records(recs[start:start + 100], 8)])
            feed.send_multipart([messages.Batch(
                0, [messages.Origin(start, time.monotonic(), False)], [], [], None, [], lengths,
                []).encode(), body])
        # until the destination has failed to answer at least once
        deadline = time.monotonic() + 60
        while w.metrics.get("errors", reason="recovery") < 1:
            assert time.monotonic() < deadline, "the destination was never found silent"
            began = time.monotonic()
            w.step()
            longest = max(longest, time.monotonic() - began)
        assert w.dest.produced == 0 and w.dest.backlog_records == len(recs)  # held, nothing dropped
    finally:
        dst.resume()
    assert longest < SLOW_STEP_SECONDS, f"a step waited {longest:.1f} s on the destination"
    deadline = time.monotonic() + 60
    while w.metrics.get("records") < len(recs):  # acknowledged by the destination
        assert time.monotonic() < deadline, (w.dest.produced, w.dest.backlog_records)
        w.step()
    w.close()
    written = consume(dst.bootstrap, "t", len(recs), idle=1.0)
    assert source_coordinates(written) == [("t", mine, r.offset) for r in recs]
    assert [m.value() for m in written] == [r.value for r in recs]
