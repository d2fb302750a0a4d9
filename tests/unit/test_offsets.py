"""diode.kafka.offsets.SentTracker: commit only the longest fully sent prefix of each partition."""

import random

from hypothesis import given, settings, strategies as st

from diode.kafka.offsets import SentTracker

A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


def recs(tp, *offsets):
    return [(tp, offsets[-1], len(offsets))]


def test_nothing_is_committed_before_acknowledgements():
    t = SentTracker()
    t.dispatched(1, recs(A0, 0, 1, 2))
    assert t.positions() == {}
    assert t.take_changed() == {}
    assert t.inflight == 3


def test_in_order_acks_advance_past_each_message():
    t = SentTracker()
    t.dispatched(1, recs(A0, 0, 1, 2))
    t.dispatched(2, recs(A0, 3, 4))
    t.acknowledged(1, 3)
    assert t.positions() == {A0: 3}
    t.acknowledged(2, 2)
    assert t.positions() == {A0: 5}
    assert t.inflight == 0


def test_out_of_order_acks_wait_for_the_prefix():
    t = SentTracker()
    t.dispatched(1, recs(A0, 0, 1))
    t.dispatched(2, recs(A0, 2, 3))
    t.dispatched(3, recs(A0, 4))
    t.acknowledged(3, 1)
    t.acknowledged(2, 2)
    assert t.positions() == {}  # message 1 is still out: a crash must re-send from 0
    t.acknowledged(1, 2)
    assert t.positions() == {A0: 5}


def test_partial_acks_hold_the_position():
    t = SentTracker()
    t.dispatched(1, recs(A0, 10, 11, 12, 13))
    t.acknowledged(1, 1)
    t.acknowledged(1, 2)
    assert t.positions() == {}
    assert t.inflight == 1
    t.acknowledged(1, 1)
    assert t.positions() == {A0: 14}
    assert t.inflight == 0


def test_over_acknowledgement_does_not_go_negative():
    t = SentTracker()
    t.dispatched(1, recs(A0, 0, 1))
    t.dispatched(2, recs(A0, 2))
    t.acknowledged(1, 5)
    assert t.inflight == 1
    assert t.positions() == {A0: 2}


def test_offsets_with_gaps_commit_past_the_last_record():
    """Compaction and transaction markers leave holes: commit after the last record sent."""
    t = SentTracker()
    t.dispatched(1, recs(A0, 5, 9, 40))
    t.acknowledged(1, 3)
    assert t.positions() == {A0: 41}


def test_message_spanning_partitions():
    t = SentTracker()
    t.dispatched(1, recs(A0, 0, 1) + recs(B0, 7) + recs(A1, 3))
    t.dispatched(2, recs(B0, 8, 9))
    t.dispatched(3, recs(A0, 2))
    t.acknowledged(3, 1)
    t.acknowledged(2, 2)
    assert t.positions() == {}  # every partition waits for message 1
    t.acknowledged(1, 2)
    assert t.positions() == {}  # a partly sent message holds all its partitions
    t.acknowledged(1, 2)
    assert t.positions() == {A0: 3, B0: 10, A1: 4}


def test_a_slow_partition_does_not_hold_back_others():
    t = SentTracker()
    t.dispatched(1, recs(A0, 0))
    t.dispatched(2, recs(B0, 0, 1))
    t.acknowledged(2, 2)
    assert t.positions() == {B0: 2}


def test_acks_for_unknown_messages_are_ignored():
    t = SentTracker()
    t.dispatched(1, recs(A0, 0, 1))
    t.acknowledged(99, 2)
    t.acknowledged(-1, 1)
    assert t.positions() == {}
    assert t.inflight == 2
    t.acknowledged(1, 2)
    t.acknowledged(1, 2)  # a duplicate ack after completion
    assert t.positions() == {A0: 2}
    assert t.inflight == 0


def test_take_changed_returns_only_changes():
    t = SentTracker()
    t.dispatched(1, recs(A0, 0))
    t.dispatched(2, recs(B0, 0))
    t.acknowledged(1, 1)
    assert t.take_changed() == {A0: 1}
    assert t.take_changed() == {}
    t.acknowledged(2, 1)
    assert t.take_changed() == {B0: 1}
    t.dispatched(3, recs(A0, 1, 2))
    t.acknowledged(3, 2)
    assert t.take_changed() == {A0: 3}
    assert t.positions() == {A0: 3, B0: 1}


def test_retry_reports_failed_commits_again():
    t = SentTracker()
    t.dispatched(1, recs(A0, 0) + recs(B0, 0))
    t.acknowledged(1, 2)
    assert t.take_changed() == {A0: 1, B0: 1}
    t.retry([A0, ("never", 0)])  # an unknown partition has nothing to commit
    assert t.take_changed() == {A0: 1}
    assert t.take_changed() == {}


def test_reset_keeps_positions_and_forgets_inflight():
    t = SentTracker()
    t.dispatched(1, recs(A0, 0, 1))
    t.acknowledged(1, 2)
    t.dispatched(2, recs(A0, 2, 3))
    t.dispatched(3, recs(B0, 0))
    t.acknowledged(2, 1)
    t.reset()
    assert t.inflight == 0
    assert t.positions() == {A0: 2}
    # late acks of messages sent before the rewind change nothing
    t.acknowledged(2, 1)
    t.acknowledged(3, 1)
    assert t.positions() == {A0: 2}
    assert t.inflight == 0
    # the records read again after the rewind are tracked afresh
    t.dispatched(4, recs(A0, 2, 3))
    t.acknowledged(4, 2)
    assert t.positions() == {A0: 4}


# -- against a model ---------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from([A0, A1, B0]), min_size=1, max_size=6),
                min_size=1, max_size=12),
       st.randoms(use_true_random=False))
def test_positions_match_a_model_under_any_ack_order(messages, rnd: random.Random):
    """Each message holds records of some partitions; acks arrive in pieces, in any order.
    After every ack the position of each partition is one past the last record of the
    longest run of fully acknowledged messages holding it, from the start."""
    t = SentTracker()
    next_offset = {A0: 0, A1: 0, B0: 0}
    contents = []   # per message: its records' (partition, offset)
    for msg_id, tps in enumerate(messages):
        records = []
        for tp in tps:
            records.append((tp, next_offset[tp]))
            next_offset[tp] += 1
        contents.append(records)
        t.dispatched(msg_id, [(tp, max(o for p, o in records if p == tp),
                               sum(p == tp for p, _ in records)) for tp in dict.fromkeys(tps)])

    pieces = []
    for msg_id, records in enumerate(contents):
        n = len(records)
        while n:
            k = rnd.randint(1, n)
            pieces.append((msg_id, k))
            n -= k
    rnd.shuffle(pieces)

    remaining = [len(r) for r in contents]
    committed = {}
    for msg_id, k in pieces:
        t.acknowledged(msg_id, k)
        remaining[msg_id] -= k
        expected = {}
        for tp in (A0, A1, B0):
            for i, records in enumerate(contents):
                mine = [o for p, o in records if p == tp]
                if not mine:
                    continue
                if remaining[i]:
                    break
                expected[tp] = mine[-1] + 1
        assert t.positions() == expected
        assert t.inflight == sum(remaining)
        changed = t.take_changed()
        assert changed == {tp: p for tp, p in expected.items() if committed.get(tp) != p}
        committed = expected
    # everything acknowledged: every partition committed to its end
    assert t.positions() == {tp: n for tp, n in next_offset.items() if n}
