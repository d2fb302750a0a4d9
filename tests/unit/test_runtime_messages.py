"""The messages between the pipeline's processes (diode.runtime.messages) and the replay-request
protocol (diode.runtime.replays): each message comes back as it was sent, typed; a restarted
worker asks for a replay, asks again until it is answered, and trusts a stream's marks only
once a replay that began after it started is noticed there."""

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import zmq

from diode.runtime import messages, replays, transport
from diode.runtime.wiring import WorkerSpec

ROOT = Path(__file__).parents[2]
INC = bytes(range(16))


@pytest.mark.parametrize("message", [
    messages.Runs(1, 7 << 32 | 3, [5, 100]),
    messages.Heartbeat({"reader": 0, "time_ms": 1, "partitions": [["t", 0, INC, 0, 4, 4, False]]}),
    messages.SourceLook({"reader": 0, "time_ms": 5, "partitions": [], "topics": []}),
    messages.DigestBatch({"reader": 0, "resend": True, "partitions": [("t", 0, INC, 0, 9, 10,
                                                                       b"d")]}),
    messages.MetadataLook({"reader": 0, "whole": True, "topics": [], "groups": []}),
], ids=lambda m: type(m).__name__)
def test_what_a_reader_sends_a_packer_comes_back_as_its_kind(message):
    got = messages.from_reader(message.encode())
    assert type(got) is type(message) and got == message


@pytest.mark.parametrize("message", [
    messages.Data(True, [0, 1500], 12.5, [1400, 80]),
    messages.Mark(3000, 13.0),
    messages.Notice(11.0),
], ids=lambda m: type(m).__name__)
def test_what_the_udp_reader_sends_an_unpacker_comes_back_as_its_kind(message):
    got = messages.from_udp_reader(message.encode())
    assert type(got) is type(message) and got == message


def test_a_batch_comes_back_with_every_part_typed():
    claim = messages.Claim("t", 3, INC, 0, 41, 50, False, 12.0, True, 1, 1764111600000,
                           1764111500000)
    batch = messages.Batch(
        2, [messages.Origin(1500, 12.0, False), messages.Origin(3000, 12.5, True)], [claim],
        [{"reader": 1, "session": "01"}], messages.Mark(4500, 13.0), [11.0], [10, 20],
        [messages.Heard(1, 1764111600000), messages.SourceLook({"partitions": []}),
         messages.DigestBatch({"partitions": []}), messages.MetadataLook({"topics": []})])
    got = messages.Batch.decode(batch.encode())
    assert got == batch
    assert [messages.Origin(*o).replayed for o in got.origins] == [False, True]
    assert type(got.claims[0]) is messages.Claim and got.claims[0].last_sent == 41
    assert type(got.mark) is messages.Mark and got.mark.position == 4500
    assert [type(s) for s in got.sources] == [type(s) for s in batch.sources]
    assert messages.Batch.decode(batch._replace(mark=None).encode()).mark is None


def test_datagrams_and_acknowledgements_come_back():
    d = messages.Datagrams([[(0, 77, 5)], []], [1400, 300])
    assert messages.Datagrams.decode(d.encode()) == d
    a = messages.Acks([(77, 5), (78, 2)])
    assert messages.Acks.decode(a.encode()) == a


def test_no_module_but_messages_pickles_a_frame():
    """Every frame between processes is built and read in diode.runtime.messages: a stage that
    called transport.dumps or loads itself would be a message defined where it is used."""
    found = []
    for path in sorted([*(ROOT / "stages").rglob("*.py"), *(ROOT / "diode").rglob("*.py")]):
        if path == ROOT / "diode" / "runtime" / "messages.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("dumps", "loads") and \
                    isinstance(node.value, ast.Name) and node.value.id == "transport":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


# -- the replay-request protocol ---------------------------------------------------------------

@pytest.fixture
def reader_control():
    """The udp_reader's control endpoint, as it binds it, and a context to ask from."""
    zctx = zmq.Context()  # (its own: an inproc endpoint is unbound with its context)
    endpoint = "inproc://test-messages-replay-control"
    control = transport.pull(zctx, endpoint, 64)

    def ctx(incarnation):
        return SimpleNamespace(zmq=zctx, incarnation=incarnation,
                               spec=WorkerSpec("receiver", "kafka_writer", 0, ()),
                               peers=lambda purpose: [endpoint])
    yield control, ctx
    zctx.destroy(linger=0)


def test_a_first_start_asks_nothing_and_trusts_every_stream(reader_control):
    control, ctx = reader_control
    request = replays.ReplayRequest(ctx(1), streams=2, now=100.0)
    request.tick(200.0)
    assert request.settled and request.trusts(0) and request.trusts(1)
    assert replays.waiting(control, 0.0) == []


def test_a_restart_asks_again_until_every_stream_notices_a_replay_after_it(reader_control):
    control, ctx = reader_control
    request = replays.ReplayRequest(ctx(2), streams=2, now=100.0)
    assert replays.waiting(control, 100.0) == ["receiver/kafka_writer-0"]
    request.tick(100.5)  # too soon to ask again
    assert replays.waiting(control, 0.0) == []
    request.tick(101.0)
    # (a replay that began after this ask covers it: the reader need not replay again)
    assert replays.waiting(control, 101.5) == []
    assert not request.noticed(99.0, 0)  # a replay from before this start: not this one's
    assert not request.trusts(0)
    assert request.noticed(100.0, 0)
    assert request.trusts(0) and not request.trusts(1) and not request.settled
    request.tick(102.0)
    assert replays.waiting(control, 0.0) == ["receiver/kafka_writer-0"]
    request.noticed(101.0, 1)
    assert request.settled
    request.tick(200.0)
    assert replays.waiting(control, 0.0) == []
