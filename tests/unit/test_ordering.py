"""diode.ordering.PartitionState: source order, no duplicates, and exactly the missing records."""

import random

from hypothesis import given, settings, strategies as st

from diode.ordering import Missing, PartitionState
from diode.records import RESEND, Record


def chain(offsets, start_chain=True):
    """Records of one partition as the sender sends them: each names its predecessor."""
    out, prev = [], -1 if start_chain else None
    for o in offsets:
        out.append(Record("t", 0, o, 0, 0, None, b"%d" % o, (), prev if prev is not None else o - 1))
        prev = o
    return out


def feed(state, records, t=0.0):
    writes, missing, filled = [], [], []
    for r in records:
        u = state.offer(r, t)
        writes += u.writes
        missing += u.missing
        filled += u.filled
    return writes, missing, filled


def test_in_order_records_are_written_at_once():
    s = PartitionState(wait=1.0)
    writes, missing, _ = feed(s, chain(range(10)))
    assert [r.offset for r in writes] == list(range(10)) and missing == []


def test_reordered_records_are_written_in_source_order():
    s = PartitionState(wait=1.0)
    recs = chain(range(20))
    shuffled = recs[:1] + random.Random(3).sample(recs[1:], 19)
    writes, missing, _ = feed(s, shuffled)
    assert [r.offset for r in writes] == list(range(20)) and missing == []


def test_duplicates_are_dropped():
    s = PartitionState(wait=1.0)
    recs = chain(range(10))
    writes, _, _ = feed(s, recs + recs[3:7] + recs[:1])
    assert [r.offset for r in writes] == list(range(10))
    assert s.duplicates == 5


def test_gap_reported_exactly_after_the_wait_with_non_contiguous_offsets():
    s = PartitionState(wait=1.0)
    offsets = [0, 1, 5, 6, 9, 12, 13]  # compacted topic: offsets 2-4, 7-8, 10-11 do not exist
    recs = chain(offsets)
    lost = {5, 6, 12}
    writes, missing, _ = feed(s, [r for r in recs if r.offset not in lost], t=0.0)
    assert [r.offset for r in writes] == [0, 1] and missing == []
    u = s.expire(0.5)
    assert u.writes == [] and u.missing == []  # still waiting for reordering
    u = s.expire(1.0)
    assert [r.offset for r in u.writes] == [9, 13]
    # exactly the absent records' offsets, as ranges of the chain
    assert u.missing == [Missing(2, 6, "gap"), Missing(10, 12, "gap")]


def test_tail_loss_is_reported_from_heartbeats():
    s = PartitionState(wait=1.0)
    feed(s, chain(range(5))[:3])  # 3 and 4 lost, nothing after them
    s.heartbeat(0, 4, now=2.0)
    assert s.expire(2.5).missing == []
    assert s.expire(3.0).missing == [Missing(3, 4, "tail")]
    s.heartbeat(0, 4, now=4.0)  # nothing new: nothing reported twice
    assert s.expire(6.0).missing == []


def test_everything_lost_from_the_chain_start_is_reported():
    s = PartitionState(wait=1.0)
    recs = chain(range(10))
    feed(s, recs[4:])  # the first datagram, 0..3, was lost: no record says where the chain began
    s.heartbeat(0, 9, now=0.0)
    u = s.expire(1.0)
    assert u.missing == [Missing(0, 3, "gap")]
    assert [r.offset for r in u.writes] == list(range(4, 10))


def test_a_receiver_joining_a_running_chain_reports_nothing_before_it():
    s = PartitionState(wait=1.0)
    feed(s, chain(range(100, 110), start_chain=False))
    u = s.expire(1.0)
    assert u.missing == [] and [r.offset for r in u.writes] == list(range(100, 110))


def test_late_record_fills_its_reported_gap_and_is_written():
    s = PartitionState(wait=1.0)
    recs = chain(range(10))
    feed(s, recs[:3] + recs[5:])
    assert s.expire(1.0).missing == [Missing(3, 4, "gap")]
    writes, missing, filled = feed(s, [recs[4], recs[4], recs[3]], t=2.0)
    assert [r.offset for r in writes] == [4, 3] and filled == [4, 3]
    assert s.gaps == [] and s.duplicates == 1


def test_a_restarted_sender_chain_resends_and_is_deduplicated():
    s = PartitionState(wait=1.0)
    feed(s, chain(range(10)))
    # the sender restarts from its committed offset 6: a new chain, records 6..14
    writes, missing, _ = feed(s, chain(range(6, 15)), t=1.0)
    assert [r.offset for r in writes] == list(range(10, 15))
    assert missing == [] and s.duplicates == 4


def test_pending_memory_is_bounded():
    s = PartitionState(wait=60.0, max_pending=100)
    recs = chain(range(1000))
    writes, missing, _ = feed(s, recs[:1] + recs[2:])  # record 1 never comes
    assert len(s.pending) <= 100
    assert missing == [Missing(1, 1, "gap")]  # resolved early rather than hold more
    assert [r.offset for r in writes] == [0] + list(range(2, 1000))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 300), seed=st.integers(0, 10_000),
       loss=st.floats(0, 0.5), dup=st.floats(0, 0.2), swap=st.floats(0, 0.3),
       gaps=st.lists(st.integers(0, 299), max_size=20))
def test_exact_accounting_over_a_lossy_reordering_duplicating_link(n, seed, loss, dup, swap,
                                                                  gaps):
    """Whatever the link does: every record written once, in order of its chain; the missing
    ranges cover exactly the records that never arrived (and no offset that does not exist)."""
    rng = random.Random(seed)
    offsets = [o for o in range(n + len(gaps)) if o not in set(gaps)][:n]  # non-contiguous
    recs = chain(offsets)
    arrived = [r for r in recs if rng.random() >= loss]
    stream = []
    for r in arrived:
        stream.append(r)
        if rng.random() < dup:
            stream.append(r)
    for i in range(len(stream) - 1):
        if rng.random() < swap:
            stream[i], stream[i + 1] = stream[i + 1], stream[i]
    s = PartitionState(wait=1.0)
    writes, missing, _ = feed(s, stream)
    s.heartbeat(0, offsets[-1], now=0.0)
    u = s.expire(1.0)
    writes += u.writes
    missing += u.missing
    assert sorted(r.offset for r in writes) == sorted({r.offset for r in arrived})
    assert len(writes) == len({r.offset for r in writes})
    absent = set(offsets) - {r.offset for r in arrived}
    reported = {o for m in missing for o in range(m.first, m.last + 1)} & set(offsets)
    assert reported == absent
    # ranges only span offsets between the chain's records, never beyond what was sent
    assert all(m.last <= offsets[-1] for m in missing)


def test_resent_records_fill_reported_gaps_and_are_written_even_when_unknown():
    from diode.records import RESEND
    s = PartitionState(wait=1.0)
    recs = chain(range(10))
    feed(s, recs[:3] + recs[5:])
    assert s.expire(1.0).missing == [Missing(3, 4, "gap")]
    resent = [r._replace(prev_offset=RESEND) for r in (recs[3], recs[4], recs[8])]
    writes, missing, filled = feed(s, resent, t=5.0)
    assert [r.offset for r in writes] == [3, 4, 8]  # 8 was not known missing: written anyway
    assert filled == [3, 4] and s.gaps == [] and s.frontier == 9


def test_a_chain_start_arriving_after_the_wait_is_written_not_taken_for_duplicates():
    """Two packers: the datagram with the chain's first records comes last and late, before
    any heartbeat: its records are still written, once, and nothing is reported missing."""
    s = PartitionState(wait=1.0)
    recs = chain(range(20))
    w1, m1, _ = feed(s, recs[10:], t=0.0)
    u = s.expire(1.0)  # nothing tells where the chain began: join at 10
    assert [r.offset for r in u.writes] == list(range(10, 20)) and u.missing == []
    w2, m2, filled = feed(s, recs[:10] + recs[:3], t=2.0)
    assert [r.offset for r in w2] == list(range(10)) and filled == [] and m2 == []
    assert s.duplicates == 3


def test_a_gap_filled_late_by_the_chain_makes_the_wait_twice_what_it_needed_up_to_the_max():
    s = PartitionState(wait=0.5, max_wait=2.0)
    recs = chain(range(40))
    feed(s, recs[:3] + recs[5:10], t=0.0)
    assert s.expire(0.5).missing == [Missing(3, 4, "gap")]  # a false alarm: 3, 4 were late
    _, _, filled = feed(s, [recs[3], recs[4]], t=0.7)
    assert filled == [3, 4] and s.wait == 1.4  # twice the 0.7 s they needed
    feed(s, recs[12:15], t=1.0)  # 10, 11 late again, but within the longer wait
    assert s.expire(1.9).missing == []
    writes, missing, _ = feed(s, recs[10:12], t=1.95)
    assert missing == [] and [r.offset for r in writes] == [10, 11, 12, 13, 14]
    feed(s, recs[16:18], t=2.0)  # 15 late past even the longer wait: reported ...
    assert s.expire(3.0).missing == []
    assert s.expire(3.5).missing == [Missing(15, 15, "gap")]
    feed(s, recs[15:16], t=3.6)  # ... and filled: longer again, up to the maximum only
    assert s.wait == 2.0
    feed(s, recs[19:21], t=4.0)
    assert s.expire(6.0).missing == [Missing(18, 18, "gap")]
    feed(s, recs[18:19], t=7.0)
    assert s.wait == 2.0


def test_an_operator_resend_does_not_make_the_wait_longer():
    s = PartitionState(wait=0.5, max_wait=2.0)
    recs = chain(range(10))
    feed(s, recs[:3] + recs[5:], t=0.0)
    assert s.expire(0.5).missing == [Missing(3, 4, "gap")]
    resent = [r._replace(prev_offset=RESEND) for r in recs[3:5]]
    _, _, filled = feed(s, resent, t=1.0)
    assert filled == [3, 4] and s.wait == 0.5
