"""A stopping kafka_writer driven turn by turn against a real destination broker: what it holds
when it is asked to stop, records still waiting for what the destination holds (a slow
destination) and then for their destination topic to be created, is written and acknowledged
before it says it is done, and its last checkpoint records them as written."""

import socket
import tempfile
import time

import pytest

from diode.link import runs
from diode.runtime import checkpoints, messages, transport
from diode.runtime.topology import from_dict
from tests.conftest import consume, free_port, source_coordinates
from tests.stages.test_stages import make_stage, records, source

pytestmark = pytest.mark.integration  # (a broker is started)


def test_a_stopping_writer_writes_what_waits_for_its_destination_topic_before_it_is_done(
        zctx, start_brokers):
    [dst] = start_brokers("tansu", "destination")
    journal = tempfile.mkdtemp(prefix="diode-test-journal-")
    t = from_dict({
        "link": {"port": free_port(socket.SOCK_DGRAM), "bind.address": "127.0.0.1"},
        "security": {"password.env": "X", "salt": "salt"},
        "sender": {"kafka": {"bootstrap.servers": "x:1"}, "topics": ["t"]},
        "receiver": {"kafka": {"bootstrap.servers": dst.bootstrap}, "journal.dir": journal,
                     "stages": {"unpacker": {"instances": 1},
                                "kafka_writer": {"instances": 1}}}})
    w = make_stage(zctx, t, "receiver", "kafka_writer")
    feed = source(zctx, "receiver", "kafka_writer", 0)
    recs = records(50)
    lengths, body = transport.join([runs.from_records(recs, 1)])
    now = time.monotonic()
    dst.pause()  # (what the destination holds is read slowly: the records wait for it)
    try:
        feed.send_multipart([messages.Batch(
            0, [messages.Origin(7, now, False)], [], [], messages.Mark(8, now), [], lengths,
            []).encode(), body])
        w.stop()  # (the batch came just before; the destination topic "t" does not exist yet)
        quiet = time.monotonic() + 1.5
        while time.monotonic() < quiet:
            assert w.step(), "the writer stopped with its records unwritten"
        assert w.finish_by is not None and w.dest.backlog_records == len(recs)  # finishing
    finally:
        dst.resume()
    deadline = time.monotonic() + 60
    while w.step():
        assert time.monotonic() < deadline, "the writer never finished stopping"
    assert w.metrics.get("records") == len(recs) and w.dest.backlog_records == 0
    [saved] = checkpoints.load_all(journal)
    [(topic, partition, state)] = saved["partitions"]
    assert (topic, partition, state["frontier"]) == ("t", 0, recs[-1].offset)  # (the last)
    w.close()
    written = consume(dst.bootstrap, "t", len(recs), idle=1.0)
    assert source_coordinates(written) == [("t", 0, r.offset) for r in recs]
