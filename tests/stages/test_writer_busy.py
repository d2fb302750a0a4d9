"""The kafka_writer looks only at the partitions with something waiting (diode.writer.held): a
partition that becomes busy (a run waiting for its predecessor, a heartbeat's claim, a retired
incarnation, a state restored from a checkpoint) has what waits reported when it is due, and
one left with nothing waiting leaves the set, so a writer with many idle partitions does no work
for them per tick. Its metrics' sums, kept as the partitions change, are those of every state."""

import math
import time

import pytest

from diode.accounting.ordering import PartitionState
from diode.kafka import identity
from diode.runtime import checkpoints, messages
from tests.stages.test_stages import make_stage, topology
from tests.unit.writer_fakes import run

OLD, NEW = b"\x01" * 16, b"\x02" * 16
IDLE = 200  # idle partitions beside the busy ones


@pytest.fixture
def writer(zctx, caplog):
    caplog.set_level("WARNING")
    w = make_stage(zctx, topology(unpacker=1, kafka_writer=1), "receiver", "kafka_writer")
    yield w
    w.close()


def offer(w, r, clock=0.0, incarnation=OLD):
    r.incarnation = incarnation
    r.origin = (1, clock, False)
    w._offer(r)


def with_idle(w):
    """IDLE partitions written up to offset 4, nothing waiting: out of the set after a pass."""
    for p in range(IDLE):
        offer(w, run(0, 5, partition=p, topic="idle", partitions=IDLE))
    w._expire(0.0)
    assert not w.held.busy


def missing(caplog) -> list:
    """The missing ranges logged, without their reason."""
    return [r.getMessage().split(" (")[0] for r in caplog.records
            if r.getMessage().startswith("missing")]


def test_a_run_waiting_for_its_predecessor_is_reported_when_due_and_leaves_the_set(
        writer, caplog):
    with_idle(writer)
    offer(writer, run(0, 3, partition=1))
    offer(writer, run(5, 2, partition=1), clock=1.0)  # (3 and 4 lost)
    assert list(writer.held.busy) == [("t", 1)]
    writer._expire(1.0)  # (not due yet: stays)
    assert list(writer.held.busy) == [("t", 1)] and not missing(caplog)
    writer._expire(100.0)
    assert missing(caplog) == ["missing t[1] offsets 3..4"]
    assert not writer.held.busy
    assert [list(e.run.offsets) for e in writer.dest.backlog if e.run.topic == "t"] == \
        [[0, 1, 2], [5, 6]]


def test_a_claimed_tail_is_reported_when_due_and_the_partition_leaves_the_set(writer, caplog):
    with_idle(writer)
    offer(writer, run(0, 3, partition=2))
    writer._expire(0.0)
    assert not writer.held.busy
    writer._claim(messages.Claim("t", 2, OLD, 0, 6, 6, False, 1.0, True, 0, 1000, 1000))
    assert list(writer.held.busy) == [("t", 2)]
    writer._expire(100.0)
    assert missing(caplog) == ["missing t[2] offsets 3..6"]
    assert not writer.held.busy


def test_a_retired_incarnation_is_reported_as_source_reset_then_leaves_the_set(writer, caplog):
    with_idle(writer)
    offer(writer, run(0, 3, partition=3))
    # (held to 9)
    writer._claim(messages.Claim("t", 3, OLD, 0, 2, 9, True, 1.0, True, 0, 1000, 1000))
    offer(writer, run(0, 2, partition=3, prev=-1), clock=1.0, incarnation=NEW)
    assert ("t", 3) in writer.held.busy
    writer._expire(100.0)
    writer._expire(200.0)
    assert missing(caplog) == ["missing t[3] offsets 3..9"]
    assert writer.metrics.get("missing_records") == 7
    assert not writer.held.busy


def test_states_restored_from_a_checkpoint_with_something_waiting_are_busy(zctx, caplog):
    caplog.set_level("WARNING")
    t = topology(unpacker=1, kafka_writer=1)
    waiting = PartitionState(1.0, frontier=4, incarnation=OLD)
    waiting.retire(0.0)  # (a retirement the restart must finish)
    waiting.source_ended(9)
    idle = PartitionState(1.0, frontier=4, incarnation=OLD)
    entry = {"destination": "t", "incarnation": identity.text(OLD), "current": True}
    checkpoints.save(t.resolve(t.receiver.journal_dir), 0, 0,
                     [["t", 0, {**waiting.checkpoint(), **entry}]] +
                     [["t", p, {**idle.checkpoint(), **entry}] for p in range(1, IDLE)],
                     1, 1000, sync=False)
    w = make_stage(zctx, t, "receiver", "kafka_writer")
    try:
        assert len(w.sources) == IDLE
        w._expire(0.0)   # (the restored retirement's wait starts)
        assert list(w.held.busy) == [("t", 0)]
        w._expire(100.0)
        assert missing(caplog) == ["missing t[0] offsets 5..9"]
        assert not w.held.busy
    finally:
        w.close()


def test_the_metrics_sums_are_those_of_every_state(writer):
    with_idle(writer)
    offer(writer, run(0, 5, partition=0, topic="idle", partitions=IDLE))  # 5 duplicates
    for p, n in ((4, 3), (5, 2), (6, 6)):
        offer(writer, run(0, n, partition=p))
    offer(writer, run(7, 2, partition=4))  # (3..6 lost)
    writer._claim(messages.Claim("t", 5, OLD, 0, 3, 3, False, 0.0, True, 0, 1000, 1000))
    writer._expire(100.0)  # (t[4]'s gap and t[5]'s tail reported: tickets open)
    offer(writer, run(9, 1, partition=6, prev=8))  # (waits for 6..8)
    writer.sample_metrics()
    states = [s for source in writer.sources.values() for s in source.states()]
    opened = [t.opened for s in states for t in s.tickets]
    assert writer.metrics.get("duplicates") == sum(s.duplicates for s in states) == 5
    assert writer.metrics.get("pending_records") == sum(s.pending_records for s in states) == 1
    assert writer.metrics.get("tickets_open") == len(opened) == 2
    offer(writer, run(6, 4, partition=6, prev=5))  # (6..9 written: the waiting 9 a duplicate)
    writer.sample_metrics()
    states = [s for source in writer.sources.values() for s in source.states()]
    assert writer.metrics.get("duplicates") == sum(s.duplicates for s in states) == 6
    assert writer.metrics.get("pending_records") == sum(s.pending_records for s in states) == 0


def test_runs_that_come_in_order_leave_nothing_for_the_expiry_to_look_at(writer, caplog):
    """Records spread thin over many partitions come a run per partition per datagram: one
    that continues its chain leaves nothing waiting, and its partition is not looked at by the
    next expiry pass (every partition offered a run was, until then); one that waits for its
    predecessor is, and is reported when due."""
    with_idle(writer)
    for p in range(IDLE):
        offer(writer, run(5, 2, partition=p, topic="idle", partitions=IDLE))
    assert not writer.held.busy
    offer(writer, run(9, 1, partition=3, topic="idle", partitions=IDLE), clock=1.0)  # (7, 8)
    assert list(writer.held.busy) == [("idle", 3)]
    writer._expire(100.0)
    assert missing(caplog) == ["missing idle[3] offsets 7..8"] and not writer.held.busy
    writer.sample_metrics()  # (what they hold is counted again all the same)
    assert writer.metrics.get("pending_records") == 0 and writer.metrics.get("duplicates") == 0


def test_an_idle_writer_waits_long_for_input_and_its_expiry_waits_for_something_waiting(
        writer, caplog):
    """With nothing waiting, to produce or to acknowledge and no question outstanding, a turn
    waits for input up to IDLE_WAIT_MS (no later than the next checkpoint), where it turned
    every POLL_MS, and the expiry timer is parked: it ran at every turn for nothing. A run that
    comes in order leaves it parked; a partition that gets something waiting (a heartbeat's
    claim of records not come) wakes it, and what is missing is reported when due."""
    writer.marks = [messages.Mark(0, 0.0)]
    now = time.monotonic()
    writer.recovery.next_checkpoint = now + 60
    writer.timers.run(now)
    assert writer.expiry.due == math.inf
    assert writer.before_input(now) == writer.IDLE_WAIT_MS
    writer.recovery.next_checkpoint = now + 0.3
    assert 300 <= writer.before_input(now) <= 301  # (its ceiling in ms)
    offer(writer, run(0, 3, partition=2))  # (a new state: looked at once)
    writer.timers.run(time.monotonic())
    offer(writer, run(3, 1, partition=2))  # (in order: nothing waits)
    assert writer.expiry.due == math.inf and writer.before_input(now) == 0  # (to produce)
    writer._claim(messages.Claim("t", 2, OLD, 0, 6, 6, False, 1.0, True, 0, 1000, 1000))
    assert writer.expiry.due <= now
    writer.marks = [messages.Mark(0, 100.0)]
    writer.timers.run(time.monotonic())
    assert missing(caplog) == ["missing t[2] offsets 4..6"]
    assert not writer.held.busy and writer.expiry.due == math.inf


def test_the_senders_heartbeats_wake_a_parked_expiry_for_the_link_watch(writer):
    """Writer 0 parks its expiry before the sender's first heartbeat when nothing waits; the
    heartbeats wake it, and the link's silence (looked at on its passes) is reported."""
    writer.marks = [messages.Mark(0, 0.0)]
    writer.timers.run(time.monotonic())
    assert writer.expiry.due == math.inf
    beat = {"reader": 0, "time_ms": 1764111600000, "interval_ms": 1000, "partitions": [],
            "cluster": "c", "counters": {}, "session": "01", "seen": 1.0, "stopping": False}
    writer._batch(messages.Batch(0, [], [], [beat], None, [], [], []), [None, b""])
    writer.marks = [messages.Mark(0, 10.0)]  # (no heartbeat for 9 s: three intervals are 3)
    writer.timers.run(time.monotonic())
    assert writer.metrics.get("link_heartbeat_age_seconds") == 9.0
    assert writer.metrics.get("link_silent") == 1
