"""diode.accounting.ordering.PartitionState: source order, no duplicates, and exactly the missing
records."""

import random

from hypothesis import given, settings, strategies as st

from diode.link import runs
from diode.accounting.ordering import Missing, PartitionState
from diode.link.records import RESEND, Record


def chain(offsets, start_chain=True, per_run=1):
    """Runs of one partition as the sender sends them, `per_run` records each: each run names
    the predecessor of its first record."""
    recs, prev = [], -1 if start_chain else None
    for o in offsets:
        recs.append(Record("t", 0, o, 0, 0, None, b"%d" % o, (),
                           prev if prev is not None else o - 1))
        prev = o
    return [runs.Run.decode(runs.from_records(recs[i:i + per_run]))
            for i in range(0, len(recs), per_run)]


def resent(run):
    return runs.Run.decode(runs.from_records(run.records(), prev=RESEND))


def offs(writes):
    """The offsets written, in the order written."""
    return [o for run in writes for o in run.offsets]


def feed(state, records, t=0.0):
    writes, missing, filled = [], [], []
    for r in records:
        u = state.offer(r, t)
        writes += u.writes
        missing += u.missing
        filled += u.filled
    return writes, missing, filled


def through_link(runs_sent, rng, dup, swap):
    """What a duplicating, reordering link delivers of `runs_sent`."""
    stream = []
    for r in runs_sent:
        stream.append(r)
        if rng.random() < dup:
            stream.append(r)
    for i in range(len(stream) - 1):
        if rng.random() < swap:
            stream[i], stream[i + 1] = stream[i + 1], stream[i]
    return stream


def settle(state, stream, last_sent):
    """Feed `stream`, then a heartbeat claiming `last_sent`, and wait: (writes, missing,
    filled)."""
    writes, missing, filled = feed(state, stream)
    state.heartbeat(0, last_sent, now=0.0)
    u = state.expire(1.0)
    return writes + u.writes, missing + u.missing, filled + u.filled


def test_in_order_records_are_written_at_once():
    s = PartitionState(wait=1.0)
    writes, missing, _ = feed(s, chain(range(10)))
    assert offs(writes) == list(range(10)) and missing == []


def test_reordered_records_are_written_in_source_order():
    s = PartitionState(wait=1.0)
    recs = chain(range(20))
    shuffled = recs[:1] + random.Random(3).sample(recs[1:], 19)
    writes, missing, _ = feed(s, shuffled)
    assert offs(writes) == list(range(20)) and missing == []


def test_duplicates_are_dropped():
    s = PartitionState(wait=1.0)
    recs = chain(range(10))
    writes, _, _ = feed(s, recs + recs[3:7] + recs[:1])
    assert offs(writes) == list(range(10))
    assert s.duplicates == 5


def test_gap_reported_exactly_after_the_wait_with_non_contiguous_offsets():
    s = PartitionState(wait=1.0)
    offsets = [0, 1, 5, 6, 9, 12, 13]  # compacted topic: offsets 2-4, 7-8, 10-11 do not exist
    recs = chain(offsets)
    lost = {5, 6, 12}
    writes, missing, _ = feed(s, [r for r in recs if r.first not in lost], t=0.0)
    assert offs(writes) == [0, 1] and missing == []
    u = s.expire(0.5)
    assert u.writes == [] and u.missing == []  # still waiting for reordering
    u = s.expire(1.0)
    assert offs(u.writes) == [9, 13]
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
    assert offs(u.writes) == list(range(4, 10))


def test_a_receiver_joining_a_running_chain_reports_nothing_before_it():
    s = PartitionState(wait=1.0)
    feed(s, chain(range(100, 110), start_chain=False))
    u = s.expire(1.0)
    assert u.missing == [] and offs(u.writes) == list(range(100, 110))


def test_late_record_fills_its_reported_gap_and_is_written():
    s = PartitionState(wait=1.0)
    recs = chain(range(10))
    feed(s, recs[:3] + recs[5:])
    assert s.expire(1.0).missing == [Missing(3, 4, "gap")]
    writes, missing, filled = feed(s, [recs[4], recs[4], recs[3]], t=2.0)
    assert offs(writes) == [4, 3] and filled == [4, 3]
    assert s.gaps == [] and s.duplicates == 1


def test_a_restarted_sender_chain_resends_and_is_deduplicated():
    s = PartitionState(wait=1.0)
    feed(s, chain(range(10)))
    # the sender restarts from its committed offset 6: a new chain, records 6..14
    writes, missing, _ = feed(s, chain(range(6, 15)), t=1.0)
    assert offs(writes) == list(range(10, 15))
    assert missing == [] and s.duplicates == 4


def test_pending_memory_is_bounded():
    s = PartitionState(wait=60.0, max_pending=100)
    recs = chain(range(1000))
    writes, missing, _ = feed(s, recs[:1] + recs[2:])  # record 1 never comes
    assert s.pending_records <= 100
    assert missing == [Missing(1, 1, "gap")]  # resolved early rather than hold more
    assert offs(writes) == [0] + list(range(2, 1000))


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
    writes, missing, _ = settle(PartitionState(wait=1.0),
                                through_link(arrived, rng, dup, swap), offsets[-1])
    assert sorted(offs(writes)) == sorted({r.first for r in arrived})
    assert len(offs(writes)) == len(set(offs(writes)))
    absent = set(offsets) - {r.first for r in arrived}
    reported = {o for m in missing for o in range(m.first, m.last + 1)} & set(offsets)
    assert reported == absent
    # ranges only span offsets between the chain's records, never beyond what was sent
    assert all(m.last <= offsets[-1] for m in missing)


def test_resent_records_fill_reported_gaps_and_are_written_even_when_unknown():
    s = PartitionState(wait=1.0)
    recs = chain(range(10))
    feed(s, recs[:3] + recs[5:])
    assert s.expire(1.0).missing == [Missing(3, 4, "gap")]
    resent_ = [resent(r) for r in (recs[3], recs[4], recs[8])]
    writes, missing, filled = feed(s, resent_, t=5.0)
    assert offs(writes) == [3, 4, 8]  # 8 was not known missing: written anyway
    assert filled == [3, 4] and s.gaps == [] and s.frontier == 9


def test_a_chain_start_arriving_after_the_wait_is_written_not_taken_for_duplicates():
    """Two packers: the datagram with the chain's first records comes last and late, before
    any heartbeat: its records are still written, once, and nothing is reported missing."""
    s = PartitionState(wait=1.0)
    recs = chain(range(20))
    w1, m1, _ = feed(s, recs[10:], t=0.0)
    u = s.expire(1.0)  # nothing tells where the chain began: join at 10
    assert offs(u.writes) == list(range(10, 20)) and u.missing == []
    w2, m2, filled = feed(s, recs[:10] + recs[:3], t=2.0)
    assert offs(w2) == list(range(10)) and filled == [] and m2 == []
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
    assert missing == [] and offs(writes) == [10, 11, 12, 13, 14]
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
    _, _, filled = feed(s, [resent(r) for r in recs[3:5]], t=1.0)
    assert filled == [3, 4] and s.wait == 0.5


def cut(offsets, rng, start_chain=True):
    """One chain of `offsets` cut into runs of random lengths, as a reader's batches are."""
    out, i = [], 0
    while i < len(offsets):
        n = rng.randint(1, 8)
        recs = [Record("t", 0, o, 0, 0, b"k", b"%d" % o, (), p)
                for o, p in zip(offsets[i:i + n], [offsets[i - 1] if i else -1,
                                                   *offsets[i:i + n - 1]])]
        if i == 0 and not start_chain:
            recs[0] = recs[0]._replace(prev_offset=offsets[0] - 1)
        out.append(runs.Run.decode(runs.from_records(recs)))
        i += n
    return out


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 200), seed=st.integers(0, 10_000), loss=st.floats(0, 0.5),
       dup=st.floats(0, 0.3), swap=st.floats(0, 0.4), rewind=st.one_of(st.none(), st.floats(0, 1)),
       gaps=st.lists(st.integers(0, 199), max_size=20))
def test_exact_accounting_for_runs_cut_anew_by_a_rewound_sender(n, seed, loss, dup, swap, rewind,
                                                               gaps):
    """Runs of many records, lost, duplicated and reordered whole, and a sender that rewinds and
    sends a tail again as a new chain cut differently: every record that arrived is written
    once; exactly the records that never arrived are reported missing."""
    rng = random.Random(seed)
    offsets = [o for o in range(n + len(gaps)) if o not in set(gaps)][:n]
    first, *rest = cut(offsets, rng)
    # (the chain's first run arrives: a receiver that never saw where a chain began joins it
    # wherever it first hears of it, see test_a_receiver_joining_a_running_chain...)
    arrived_runs = [first] + [r for r in rest if rng.random() >= loss]
    if rewind is not None:  # a new chain from some offset on, nothing of it lost
        arrived_runs += cut(offsets[int(rewind * (len(offsets) - 1)):], rng)
    s = PartitionState(wait=1.0)
    writes, missing, filled = settle(s, through_link(arrived_runs, rng, dup, swap), offsets[-1])
    arrived = {o for r in arrived_runs for o in r.offsets}
    assert sorted(offs(writes)) == sorted(arrived)
    reported = {o for m in missing for o in range(m.first, m.last + 1)} & set(offsets)
    assert reported - set(filled) == set(offsets) - arrived
    assert s.pending_records == 0 and not s.pending


def test_a_run_overlapping_the_frontier_writes_only_its_new_records():
    s = PartitionState(wait=1.0)
    feed(s, chain(range(10), per_run=5))
    writes, missing, _ = feed(s, chain(range(7, 14), per_run=7), t=1.0)  # a new chain from 7
    assert offs(writes) == [10, 11, 12, 13] and missing == [] and s.duplicates == 3
    assert [w.prev for w in writes] == [9]  # the part written keeps its place in the chain


def test_record_columns_survive_cutting_a_run():
    recs = [Record("t", 2, o, 1000 + o, 1, None if o % 3 == 0 else b"k%d" % o, b"v" * o,
                   (("h", b"x"),) if o % 2 else (), o - 1) for o in range(1, 9)]
    r = runs.Run.decode(runs.from_records(recs, partition_count=4))
    a, b = r.split_at(3)
    assert a.records() + b.records() == recs
    t = r.take([1, 4, 6])
    assert [(x.offset, x.key, x.value, x.headers, x.timestamp) for x in t.records()] == \
        [(x.offset, x.key, x.value, x.headers, x.timestamp) for x in (recs[1], recs[4], recs[6])]
    assert t.prev == recs[0].offset


def test_arrival_times_of_written_runs_are_not_kept_while_an_early_run_waits():
    """A run that came early waits for its predecessors, and thousands of reordered runs
    before it are written meanwhile: what the state remembers stays bounded by what waits."""
    s = PartitionState(wait=60.0)
    recs = chain(range(20_002))
    feed(s, recs[:1] + recs[-1:])  # the last came first: it waits for all the others
    for i in range(1, 19_998, 2):  # pairs arriving swapped: each waits a moment, then goes
        feed(s, [recs[i + 1], recs[i]])
    assert len(s.pending) == 1 and len(s._arrivals) <= 2 * len(s.pending) + 64
    writes, _, _ = feed(s, recs[19_999:20_001])  # the ones before it: all go, in order
    assert offs(writes) == [19_999, 20_000, 20_001] and s.pending_records == 0


def test_an_earlier_chains_records_arriving_after_a_new_chain_start_are_written_not_dropped():
    """A fresh receiver, a sender that rewound: the new chain's first run comes before the old
    chain's records. They were never written: they are written, not taken for duplicates
    (found by the property test above: they were dropped without a word)."""
    s = PartitionState(wait=1.0)
    old = chain(range(6), per_run=5)   # [0..4] starting a chain, then [5]
    new = chain([5])                   # the rewound sender's chain starts at 5
    writes, missing, _ = feed(s, [old[1], new[0], old[0]])
    writes += s.expire(2.0).writes
    assert sorted(offs(writes)) == [0, 1, 2, 3, 4, 5] and missing == []

def test_what_an_earlier_chain_lost_below_a_new_chain_start_is_reported_after_the_wait():
    """As above, but part of the old chain is lost: the old chain's start shows that it sent
    every offset up to the new chain's start (a sender restarts from committed offsets, never
    past what it sent), so what did not come within the wait is reported, exactly, and a
    restart in the meantime does not forget it (found by the property test above: 2 and 3 went
    silently)."""
    s = PartitionState(wait=1.0)
    old = chain(range(4), per_run=2)   # [0, 1] starting a chain, then [2, 3]: lost
    new = chain(range(4, 10), per_run=3)
    writes, missing, _ = feed(s, [new[0], old[0], new[1]], t=0.0)
    assert sorted(offs(writes)) == [0, 1, 4, 5, 6, 7, 8, 9] and missing == []
    assert s.expire(0.5).missing == []  # still within the wait
    s = restarted(s)
    s.expire(10.0)  # the wait starts again after a restart
    assert s.expire(10.5).missing == []
    assert s.expire(11.0).missing == [Missing(2, 3, "gap")]
    writes, _, filled = feed(s, old[1:], t=12.0)  # late after all: a fill, written once
    assert offs(writes) == [2, 3] and filled == [2, 3]



# -- restarts --------------------------------------------------------------------------------

def restarted(state, wait=1.0):
    """The state a restarted writer resumes from its checkpoint (through JSON, as saved)."""
    import json
    return PartitionState.restore(json.loads(json.dumps(state.checkpoint())), wait)


def live(run):
    run.origin = (0, 0.0, False)
    return run


def replayed(run):
    run.origin = (0, 0.0, True)
    return run


def test_a_restarted_state_drops_what_was_written_and_reports_what_came_while_down():
    before = PartitionState(1.0)
    sent = chain(range(20))
    feed(before, sent[:10])
    state = restarted(before)
    # the journal replays what arrived before the restart: written already, dropped
    writes, missing, _ = feed(state, [replayed(r) for r in sent[5:10]], t=5.0)
    assert not writes and not missing and state.duplicates == 5
    # records 10..14 were sent while no receiver read; live ones from 15 on show the gap
    writes, missing, _ = feed(state, [live(r) for r in sent[15:]], t=5.0)
    assert not writes
    u = state.expire(6.5)
    assert u.missing == [Missing(10, 14, "receiver-down")] and offs(u.writes) == \
        list(range(15, 20))


def test_after_a_restart_a_gap_among_replayed_records_is_the_link_s_not_the_restart_s():
    before = PartitionState(1.0)
    sent = chain(range(20))
    feed(before, sent[:5])
    state = restarted(before)
    feed(state, [replayed(r) for r in sent[7:10]], t=1.0)   # 5, 6 lost on the link
    feed(state, [live(r) for r in sent[10:12]], t=1.0)      # live records continue
    u = state.expire(2.5)
    assert u.missing == [Missing(5, 6, "gap")]
    # live records followed on without a gap: a later loss is the link's again
    feed(state, [live(r) for r in sent[14:]], t=3.0)
    assert state.expire(4.5).missing == [Missing(12, 13, "gap")]


def test_a_heartbeat_after_a_restart_reports_the_tail_sent_while_down():
    before = PartitionState(1.0)
    feed(before, chain(range(10)))
    state = restarted(before)
    state.heartbeat(0, 14, now=2.0, live=True)
    assert state.expire(3.5).missing == [Missing(10, 14, "receiver-down")]


def test_after_a_restart_every_tail_claimed_before_the_first_live_record_is_receiver_down():
    """The sender's heartbeats claim what its kernel took, which it may learn late: two claims
    after a restart can both name records sent while no receiver read."""
    before = PartitionState(1.0)
    sent = chain(range(30))
    feed(before, sent[:10])
    state = restarted(before)
    state.heartbeat(0, 14, now=2.0, live=True)
    state.heartbeat(0, 19, now=2.5, live=True)
    assert state.expire(3.0).missing == [Missing(10, 14, "receiver-down")]
    assert state.expire(3.5).missing == [Missing(15, 19, "receiver-down")]
    # a live record written: from then on a tail that does not come is the link's
    writes, missing, _ = feed(state, [live(r) for r in sent[20:22]], t=4.0)
    assert offs(writes) == [20, 21] and not missing
    state.heartbeat(0, 24, now=4.0, live=True)
    assert state.expire(5.0).missing == [Missing(22, 24, "tail")]


def test_a_partition_first_seen_by_a_restarted_receiver_reports_what_came_while_down():
    """No checkpoint of this partition (the writer that owned it never wrote one) and nothing
    at the destination: the journal replays what arrived, then live records show the gap."""
    state = PartitionState(1.0, resumed=True)
    sent = chain(range(20))
    writes, missing, _ = feed(state, [replayed(r) for r in sent[:6]], t=1.0)
    assert offs(writes) == list(range(6)) and not missing
    feed(state, [live(r) for r in sent[12:]], t=1.0)
    assert state.expire(2.5).missing == [Missing(6, 11, "receiver-down")]
    # and on a first start (not resumed) the same gap is the link's
    first = PartitionState(1.0)
    feed(first, sent[:6] + sent[12:], t=1.0)
    assert first.expire(2.5).missing == [Missing(6, 11, "gap")]


def test_what_the_destination_holds_is_neither_written_again_nor_reported():
    """Recovered from provenance headers (no checkpoint): up to 10 written, 11..12 reported
    missing before the restart."""
    state = PartitionState(1.0)
    state.written_up_to(10)
    state.reported([[11, 12]])
    sent = chain(range(20))
    writes, missing, filled = feed(state, [live(r) for r in sent], t=0.0)
    u = state.expire(2.0)
    assert offs(writes + u.writes) == list(range(11, 20))
    assert filled == [11, 12]          # late records fill the range reported before
    assert not missing and not u.missing
    assert state.duplicates == 11


def test_a_checkpoint_keeps_gaps_for_late_fills_and_its_size_is_bounded():
    state = PartitionState(0.0)
    sent = chain(range(0, 6000, 2), per_run=1)  # every other offset lost
    feed(state, [live(r) for r in chain([0])])
    for r in sent[1:]:
        r.prev = r.offsets[0] - 1  # (each run names a lost predecessor)
    feed(state, sent[1:], t=0.0)
    state.expire(1.0)
    saved = state.checkpoint()
    assert len(saved["gaps"]) == 1000 and saved["gaps"][-1] == [5997, 5997]
    again = restarted(state, wait=0.0)
    late = chain([5997], start_chain=False)
    _, _, filled = feed(again, late)
    assert filled == [5997]


def test_reported_gaps_expire_once_as_the_source_log_start_passes_them():
    """PartitionState.source_starts: the parts of the reported gaps newly below the source's
    log start, each once; at_risk: those within the margin above it."""
    s = PartitionState(0.0)
    s.gaps = [[10, 19], [30, 39], [50, 59]]
    assert s.at_risk(100) == 30 and s.at_risk(35) == 15  # (10..19, 30..34)
    assert s.source_starts(15) == [[10, 14]]
    assert s.source_starts(15) == [] and s.source_starts(12) == []  # once; never back
    assert s.source_starts(35) == [[15, 19], [30, 34]]
    assert s.at_risk(100) == 15 and s.at_risk(1) == 1  # 35..39, 50..59; then 35 alone
    assert s.gaps == [[10, 19], [30, 39], [50, 59]]  # (still fillable: a late record may come)
    assert PartitionState.restore(s.checkpoint(), 0.0).source_starts(35) == []


# -- where a chain starts: a lost head (issue 34) --------------------------------------------

# Sender times (ms) of one reader's heartbeats: the receiver heard one before the chain began
# (the reader sends one before it reads anything); the chain's first heartbeat came after.
BEFORE, NAMING, LATER = 1_000, 2_000, 3_000


def beat(state, last, now, sent=NAMING, heard=BEFORE, start=0, live=True):
    """A heartbeat of the chain starting at `start`, heard at the reader's clock `now`."""
    state.heartbeat(start, last, now=now, live=live, sent=sent, heard=heard)


def test_a_lost_chain_head_is_reported_when_the_heartbeat_naming_its_start_comes_first():
    s = PartitionState(wait=1.0)
    sent = chain(range(10), per_run=4)       # [0..3] starts the chain: lost
    beat(s, 9, now=0.0)
    writes, missing, _ = feed(s, sent[1:], t=0.1)
    u = s.expire(1.1)
    assert offs(writes + u.writes) == list(range(4, 10))
    assert missing + u.missing == [Missing(0, 3, "gap")]


def test_a_lost_chain_head_is_reported_when_the_heartbeat_comes_after_the_run_was_written():
    """The issue's silent loss: the next run waited and was written before any heartbeat named
    where the chain started (every second against a half-second wait); the head stayed unknown
    and the heartbeat was ignored."""
    s = PartitionState(wait=1.0)
    sent = chain(range(10), per_run=4)
    feed(s, sent[1:], t=0.0)
    u = s.expire(1.0)                        # nothing says where the chain began: written
    assert offs(u.writes) == list(range(4, 10)) and u.missing == []
    beat(s, 9, now=1.5)
    assert s.expire(2.0).missing == []       # (the heartbeat waits too)
    assert s.expire(2.5).missing == [Missing(0, 3, "gap")]
    beat(s, 9, now=3.0)
    assert s.expire(5.0).missing == []       # once


def test_a_lost_chain_head_is_reported_from_a_heartbeat_long_after_and_filled_if_it_comes():
    s = PartitionState(wait=1.0)
    sent = chain(range(100), per_run=4)
    writes, _, _ = feed(s, sent[1:10], t=0.0)
    writes += s.expire(1.0).writes
    writes += feed(s, sent[10:], t=30.0)[0]  # the chain goes on
    beat(s, 99, now=60.0, sent=LATER)        # (its earlier heartbeats were lost)
    u = s.expire(61.0)
    assert offs(writes) == list(range(4, 100))
    assert u.missing == [Missing(0, 3, "gap")] and u.writes == []
    w, m, filled = feed(s, sent[:1], t=62.0)  # the lost datagram was only late
    assert offs(w) == [0, 1, 2, 3] and filled == [0, 1, 2, 3] and m == [] and s.gaps == []


def test_a_chain_of_one_datagram_lost_whole_is_reported_from_its_heartbeats():
    s = PartitionState(wait=1.0)
    beat(s, 3, now=0.0)                      # [0..3], all the chain sent, never came
    assert s.expire(0.5).missing == []
    assert s.expire(1.0).missing == [Missing(0, 3, "tail")]
    beat(s, 3, now=1.5, sent=LATER)
    assert s.expire(3.0).missing == []


def test_the_reader_heard_before_the_chain_only_after_its_first_claim_still_accounts_it():
    """Heartbeats cross different unpackers: the writer may hear the reader's earlier one
    (before the chain) after one naming the chain; the next heartbeat says so."""
    s = PartitionState(wait=1.0)
    sent = chain(range(10), per_run=4)
    feed(s, sent[1:], t=0.0)
    beat(s, 9, now=0.2, sent=NAMING, heard=NAMING)   # nothing earlier heard yet
    assert s.expire(1.2).missing == []
    beat(s, 9, now=1.5, sent=LATER, heard=BEFORE)    # the earlier one is known now
    assert s.expire(2.5).missing == [Missing(0, 3, "gap")]


def test_a_receiver_joining_a_running_chain_reports_nothing_before_it_whatever_comes_first():
    """Started while the sender was mid-chain, the receiver's first heartbeat of the reader
    names the chain: it did not see it start, and nothing before the first record or tail it
    resolves is reported, whether a heartbeat (it reported 0..1000 as a gap) or a run comes
    first."""
    sent = chain(range(1001, 1011), start_chain=False, per_run=5)
    for heartbeat_first in (True, False):
        s = PartitionState(wait=1.0)
        if heartbeat_first:
            beat(s, 1000, now=0.0, sent=NAMING, heard=NAMING)
        writes, missing, _ = feed(s, sent, t=0.1)
        if not heartbeat_first:
            beat(s, 1000, now=0.2, sent=NAMING, heard=NAMING)
        u = s.expire(1.2)
        beat(s, 1010, now=1.5, sent=LATER, heard=NAMING)
        missing += u.missing + s.expire(3.0).missing
        assert offs(writes + u.writes) == list(range(1001, 1011)), heartbeat_first
        assert missing == [], heartbeat_first
    idle = PartitionState(wait=1.0)  # an idle partition: heartbeats alone, nothing reported
    beat(idle, 1000, now=0.0, sent=NAMING, heard=NAMING)
    beat(idle, 1000, now=1.0, sent=LATER, heard=NAMING)
    assert idle.expire(5.0).missing == []


def test_a_restart_between_the_run_and_the_heartbeat_keeps_the_head_to_account():
    s = PartitionState(wait=1.0)
    sent = chain(range(15), per_run=4)
    feed(s, sent[1:3], t=0.0)
    s.expire(1.0)                            # 4..11 written, 0..3 unknown
    s = restarted(s)
    writes, _, _ = feed(s, [live(r) for r in sent[3:]], t=2.0)
    beat(s, 14, now=2.5, live=True)          # (the writer kept what it heard: BEFORE)
    u = s.expire(3.5)
    assert offs(writes) == [12, 13, 14]
    assert u.missing == [Missing(0, 3, "gap")]


def test_a_restart_keeps_a_joined_chain_joined():
    """Heard first mid-chain, then restarted: the chain's heartbeats after the restart, now
    after the earliest heard of its reader, are still of a chain this receiver did not see
    start."""
    s = PartitionState(wait=1.0)
    sent = chain(range(100, 110), start_chain=False, per_run=5)
    beat(s, 99, now=0.0, sent=NAMING, heard=NAMING)
    feed(s, sent[:1], t=0.1)
    s.expire(1.2)
    s = restarted(s)
    feed(s, [live(r) for r in sent[1:]], t=2.0)
    beat(s, 109, now=2.5, sent=LATER, heard=NAMING)
    assert s.expire(4.0).missing == []


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 120), seed=st.integers(0, 10_000), loss=st.floats(0, 0.5),
       dup=st.floats(0, 0.2), swap=st.floats(0, 0.3), when=st.sampled_from(
           ["before", "with", "after", "long after"]), head_lost=st.booleans())
def test_exact_accounting_of_a_chain_seen_start_whatever_is_lost_and_when_heartbeats_come(
        n, seed, loss, dup, swap, when, head_lost):
    """A chain that starts while the receiver runs, cut in runs, any of them lost (its first
    one on purpose, or not), duplicated, reordered; the heartbeat naming its start before the
    runs, with them, after they were written, or long after: exactly the records that never
    came are reported missing, and every one that came is written once."""
    rng = random.Random(seed)
    runs_sent = cut(list(range(n)), rng)
    arrived = [r for i, r in enumerate(runs_sent)
               if not (head_lost and i == 0) and rng.random() >= loss]
    stream = through_link(arrived, rng, dup, swap)
    beat_at = {"before": -0.1, "with": 0.5, "after": 1.5, "long after": 30.0}[when]
    s = PartitionState(wait=1.0)
    writes, missing, filled = [], [], []
    events = [(0.0, "run", r) for r in stream] + [(beat_at, "beat", None)] + \
        [(t, "expire", None) for t in (1.0, beat_at + 1.0, 40.0)]
    for t, what, run in sorted(events, key=lambda e: e[0]):  # (stable: runs before the beat)
        if what == "beat":
            beat(s, n - 1, now=t, sent=LATER)
            continue
        u = s.offer(run, t) if what == "run" else s.expire(t)
        writes, missing, filled = writes + u.writes, missing + u.missing, filled + u.filled
    got = {o for r in arrived for o in r.offsets}
    assert sorted(offs(writes)) == sorted(got)
    reported = [o for m in missing for o in range(m.first, m.last + 1)]
    assert len(reported) == len(set(reported))       # each once
    assert set(reported) == set(range(n)) - got
    assert {m.reason for m in missing} <= {"gap", "tail"}


def test_a_chain_started_while_down_is_receiver_down_when_its_heartbeat_comes_after_a_live_record():
    """A partition first seen by a restarted receiver (its chain started while no receiver
    read): the first live record waited out the reorder wait before any heartbeat named where
    the chain began (a paced link queues the heartbeats behind the records) and was written;
    the head the heartbeat then accounts was sent while the receiver was down, as it would be
    had the heartbeat come first. CI found it reported "gap" (test_source_identity)."""
    for first_heartbeat in (False, True):
        s = PartitionState(wait=1.0, resumed=True)
        sent = chain(range(12), per_run=4)      # [0..3] sent while no receiver read
        writes, _, _ = feed(s, [live(r) for r in sent[1:2]], t=0.0)
        if first_heartbeat:
            beat(s, 7, now=0.1)
        u = s.expire(1.0)
        writes += u.writes
        if not first_heartbeat:
            assert u.missing == []               # nothing says where the chain began: written
            beat(s, 7, now=1.5)
            u = s.expire(2.5)
        assert offs(writes) == [4, 5, 6, 7]
        assert u.missing == [Missing(0, 3, "receiver-down")], first_heartbeat
        # from then on, a loss is the link's
        feed(s, [live(sent[2])], t=3.0)
        beat(s, 11, now=3.0)
        s = restarted(s) if first_heartbeat else s
        assert s.expire(4.5).missing == [] and s.down_to in (-1, 3)
    # the same head lost on the link while the receiver ran (not resumed) stays a gap
    s = PartitionState(wait=1.0)
    feed(s, [live(r) for r in chain(range(8), per_run=4)[1:]], t=0.0)
    s.expire(1.0)
    beat(s, 7, now=1.5)
    assert s.expire(2.5).missing == [Missing(0, 3, "gap")]
