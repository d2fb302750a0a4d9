"""A heartbeat's claim says when its chain was first named (diode.kafka.claims), and the
receiver tells a chain it saw start from one it joined by that time (diode.accounting.ordering,
"Where a chain starts"), not by the heartbeat that happens to carry the claim: with
sender.heartbeat.claims.max an idle partition is claimed only every K heartbeats, and a receiver
started while that rotation went round took its chain for one it saw start, reporting what was
sent of it before the receiver started as missing. A heartbeat of an older sender, which does
not say it, is taken as before."""

from diode.link import crypto, wire
from diode.runtime import messages
from tests.stages.test_stages import (MASTER, datagrams_message, run_until,
                                      unpacker_with_writers, writer_messages)
from tests.stages.test_writer_busy import OLD, missing, offer, writer  # noqa: F401 (a fixture)
from tests.unit.writer_fakes import run

HEARD, NAMED_BEFORE, NAMED_AFTER, NOW = 5000, 1000, 6000, 7000  # sender times, ms


def test_the_unpacker_hands_on_when_each_chain_was_first_named_or_for_an_older_sender_the_beat(
        zctx):
    claims = [("t", p, OLD, 0, 9, 9, False) for p in range(3)]
    beat = {"reader": 0, "time_ms": NOW, "interval_ms": 1000, "cluster": "c",
            "partitions": claims, "counters": {}}
    sealer = wire.Sealer(crypto.SessionCipher(1, MASTER, 1), "none")
    new = sealer.seal(wire.encode_heartbeat(
        {**beat, "named_ms": [NAMED_BEFORE, NAMED_AFTER, NAMED_BEFORE]}), wire.KIND_HEARTBEAT)
    older = sealer.seal(wire.encode_heartbeat(beat), wire.KIND_HEARTBEAT)
    u, writers, feed = unpacker_with_writers(zctx, 1)
    try:
        feed.send_multipart(datagrams_message(new, older))
        run_until(u, lambda: u.metrics.get("heartbeats") == 2)
        got = [c for _, cs, _ in writer_messages(writers[0]) for c in cs]
    finally:
        u.close()
    assert [(c.partition, c.sent, c.named) for c in got] == [
        (0, NOW, NAMED_BEFORE), (1, NOW, NAMED_AFTER), (2, NOW, NAMED_BEFORE),
        (0, NOW, NOW), (1, NOW, NOW), (2, NOW, NOW)]


def claim(partition: int, named: int) -> messages.Claim:
    """Partition `partition`'s chain, records 0..9 sent, in a heartbeat sent NOW."""
    return messages.Claim("t", partition, OLD, 0, 9, 9, False, 1.0, True, 0, NOW, named)


def test_a_chain_named_before_the_reader_was_first_heard_is_joined_one_named_after_seen_start(
        writer, caplog):  # noqa: F811 (the fixture)
    writer._heard(0, HEARD)  # (the receiver first heard the reader then)
    writer._claim(claim(1, NAMED_BEFORE))  # (an idle partition's turn came: joined)
    writer._claim(claim(2, NAMED_AFTER))   # (a chain started since: seen start)
    writer._claim(claim(3, NOW))           # (an older sender: the beat's own time)
    writer._expire(100.0)
    assert missing(caplog) == ["missing t[2] offsets 0..9", "missing t[3] offsets 0..9"]
    offer(writer, run(10, 3, partition=1, prev=9), clock=100.0)  # (the next records)
    writer._expire(200.0)
    assert missing(caplog) == ["missing t[2] offsets 0..9", "missing t[3] offsets 0..9"]
    assert [list(e.run.offsets) for e in writer.dest.backlog if e.run.partition == 1] == \
        [[10, 11, 12]]
    # The claim of a partition all written leaves nothing waiting: no expiry pass looks at it.
    writer._claim(claim(1, NAMED_BEFORE)._replace(last_sent=12))
    assert ("t", 1) not in writer.held.busy


def test_a_claim_that_changes_only_what_a_checkpoint_keeps_is_saved_by_the_next_one(
        writer):  # noqa: F811 (the fixture)
    """The claim of a partition all written leaves nothing for the expiry, but what it says of
    the chain (when it was first named, its reader heard) is what a restart needs to tell a
    chain it saw start: the next checkpoint compares that partition, not only every 300 s."""
    writer._heard(0, HEARD)
    offer(writer, run(0, 10, partition=1), clock=1.0)
    writer._expire(2.0)
    writer.held.take_unsaved()  # (as the checkpoint before took them)
    writer._claim(claim(1, NAMED_BEFORE))  # (records 0..9, all written: nothing waits)
    assert ("t", 1) not in writer.held.busy
    assert ("t", 1) in writer.held.take_unsaved()
    writer._claim(claim(1, NAMED_BEFORE))  # (the same again: nothing new to save)
    assert ("t", 1) not in writer.held.take_unsaved()
