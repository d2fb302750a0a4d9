"""The events a kafka_writer really writes to the missing-records topic are the ones
diode.kafka.messages defines (docs/events.md is generated from there): a range lost, its
resend filling it, its ticket closed, and a record the destination refused, each read back from
the destination broker with exactly the defined fields."""

import json
import socket
import tempfile
import time

import pytest

from diode.kafka import messages as events
from diode.link import runs
from diode.link.records import RESEND
from diode.runtime import messages, transport
from diode.runtime.topology import from_dict
from tests.conftest import consume, free_port
from tests.stages.test_stages import make_stage, records, source

pytestmark = pytest.mark.integration  # (a broker is started)


def send(feed, frames: list, position: int, clock: float) -> None:
    """Runs as an unpacker hands them on, with the reader's mark: its clock at `clock`."""
    lengths, body = transport.join(frames)
    feed.send_multipart([messages.Batch(
        0, [messages.Origin(position, clock, False)] * len(frames), [], [],
        messages.Mark(position, clock), [], lengths, []).encode(), body])


def test_every_event_the_writer_writes_has_exactly_the_defined_fields(zctx, start_brokers):
    [dst] = start_brokers("tansu", "destination")
    t = from_dict({
        "link": {"port": free_port(socket.SOCK_DGRAM), "bind.address": "127.0.0.1"},
        "security": {"password.env": "X", "salt": "salt"},
        "sender": {"kafka": {"bootstrap.servers": "x:1"}, "topics": ["t"]},
        "receiver": {"kafka": {"bootstrap.servers": dst.bootstrap},
                     "missing.records.topic": "missing", "reorder.wait.ms": 100,
                     "journal.dir": tempfile.mkdtemp(prefix="diode-test-journal-")}})
    w = make_stage(zctx, t, "receiver", "kafka_writer")
    feed = source(zctx, "receiver", "kafka_writer", 0)
    recs = records(20)
    now = time.monotonic()
    send(feed, [runs.from_records(recs[:5]), runs.from_records(recs[10:])], 1, now)
    send(feed, [], 2, now + 1.0)  # the reorder wait is over: offsets 5..9 are missing
    deadline = time.monotonic() + 30
    while w.metrics.get("missing_ranges") < 1:
        assert time.monotonic() < deadline, (w.dest.produced, w.dest.backlog_records)
        w.step()
    send(feed, [runs.from_records(recs[5:10], prev=RESEND)], 3, now + 1.1)  # resent
    while w.metrics.get("records") < 20:
        assert time.monotonic() < deadline, (w.dest.produced, w.dest.backlog_records)
        w.step()
    refused = [("sourceTopic", b"t"), ("sourcePartition", b"0"), ("sourceOffset", b"20")]
    w.dest.refused(refused, "dst_t", "Broker: Message size too large")  # as a delivery report says
    while w.dest.event_queue:
        assert time.monotonic() < deadline, w.dest.event_queue
        w.step()
    w.close()
    written = [json.loads(m.value()) for m in consume(dst.bootstrap, "missing", 4, timeout=20)]
    assert [(e["type"], e["reason"], e["firstOffset"], e["lastOffset"]) for e in written] == [
        ("missing", "gap", 5, 9), ("filled", "late", 5, 9), ("closed", "filled", 5, 9),
        ("missing", "refused: Broker: Message size too large", 20, 20)]
    for e in written:  # the fields, in their order, of the event of that type
        assert list(e) == list(events.MISSING_RECORDS_EVENT[e["type"]].names), e
    gap, _, closed, refusal = written
    assert gap["ticket"] == closed["ticket"] and len(gap["ticket"]) == 20
    assert refusal["ticket"] is None  # a refused record is no ticket

