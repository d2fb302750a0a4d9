"""A source partition is known by its incarnation (its topic id), not by its name: a topic deleted
and recreated starts again at offset 0, and its records are new records, never duplicates of the
old topic's. What the old incarnation leaves open is reported once as "source-reset"."""

import time
import uuid

from confluent_kafka import Uuid

from diode.accounting.ordering import (MAX_RETIRED, Missing, PartitionState,
                                       SourcePartition)
from diode.kafka import identity, lineage
from diode.kafka.refresh import Identities
from diode.link import runs
from diode.link.records import NO_INCARNATION, Record

OLD, NEW = b"\x01" * 16, b"\x02" * 16


def chain(offsets, incarnation, prev=-1, per_run=1):
    recs = []
    for o in offsets:
        recs.append(Record("t", 0, o, 0, 0, None, b"%d" % o, (), prev, incarnation))
        prev = o
    return [runs.Run.decode(runs.from_records(recs[i:i + per_run]))
            for i in range(0, len(recs), per_run)]


def offs(writes):
    return [o for run in writes for o in run.offsets]


def offer(source, run, now=0.0):
    """What a writer does with a run: the state of its incarnation (a new one is adopted)."""
    state = source.find(run.incarnation)
    if state is None:
        state = PartitionState(wait=1.0, incarnation=run.incarnation)
        source.adopt(state, now)
    return state.offer(run, now)


def test_a_recreated_topics_records_are_written_not_taken_for_duplicates():
    """The issue's loss: offsets 0..4 of the new topic were dropped as copies of the old's."""
    source = SourcePartition()
    for run in chain(range(5), OLD):
        offer(source, run)
    written = []
    for run in chain(range(5), NEW):
        written += offer(source, run, now=0.5).writes
    assert offs(written) == list(range(5))
    assert source.current.incarnation == NEW
    assert [s.incarnation for s in source.retired] == [OLD]


def test_copies_of_the_old_incarnations_records_are_still_duplicates():
    """A journal replay or a duplicated datagram of the old topic after the switch."""
    source = SourcePartition()
    old = chain(range(5), OLD)
    for run in old:
        offer(source, run)
    for run in chain(range(3), NEW):
        offer(source, run)
    again = [u for run in old for u in [offer(source, run).writes]]
    assert all(not w for w in again)
    assert source.find(OLD).duplicates == 5
    assert source.find(NEW).duplicates == 0


def test_what_the_old_incarnation_leaves_open_is_reported_once_as_source_reset():
    """A gap waiting for its predecessor when the new incarnation appears: reported after the
    wait (its late records may still come) as source-reset, and the waiting records written.
    A tail the sender claimed to have sent is resolved as any claim: lost on the link."""
    source = SourcePartition()
    runs_old = chain(range(10), OLD)
    for run in runs_old[:3] + runs_old[6:8]:    # 3, 4, 5 lost on the link; 8, 9 in flight
        offer(source, run)
    old = source.current
    old.heartbeat(0, 9, now=0.0)                # the sender says it sent up to 9
    offer(source, chain(range(2), NEW)[0], now=0.2)
    u = old.expire(0.5)                         # before the wait: nothing yet
    assert not u.missing and not u.writes
    late = old.offer(runs_old[8], 0.6)          # a late record of the old topic: written
    assert offs(late.writes) == []              # (it waits behind the gap, as before)
    u = old.expire(1.3)
    assert u.missing == [Missing(3, 5, "source-reset"), Missing(9, 9, "tail")]
    assert offs(u.writes) == [6, 7, 8]
    assert old.retired and not old.busy
    assert old.expire(5.0).missing == []         # once


def test_the_records_the_sender_never_read_before_the_source_went_away_are_reported():
    """The sender's retired claim: its chain, the last it sent and the last its source held."""
    source = SourcePartition()
    for run in chain(range(100), OLD, per_run=10):
        offer(source, run)
    old = source.current
    offer(source, chain(range(1), NEW)[0], now=0.0)
    old.heartbeat(0, 99, now=0.0)
    old.source_ended(1499)                      # 1400 records never read by the sender
    u = old.expire(1.0)
    assert u.missing == [Missing(100, 1499, "source-reset")]


def test_a_retired_claim_of_an_incarnation_never_seen_reports_from_where_its_sender_stood():
    """A receiver down the whole life of the old topic hears of it only from the sender's
    retired claim: chain from 40, 60 sent, the source held up to 79."""
    state = PartitionState(wait=1.0, incarnation=OLD, resumed=True)
    state.heartbeat(40, 60, now=0.0)
    state.source_ended(79)
    state.retire(0.0)
    u = state.expire(1.0)
    assert [(m.first, m.last) for m in u.missing] == [(40, 60), (61, 79)]
    assert {m.reason for m in u.missing} <= {"receiver-down", "source-reset"}


def test_an_end_told_after_the_retirement_is_still_reported():
    state = PartitionState(wait=1.0, incarnation=OLD)
    state.offer(chain(range(3), OLD, per_run=3)[0], 0.0)
    state.retire(0.0)
    assert state.expire(1.0).missing == []
    state.source_ended(9)
    assert state.busy
    assert state.expire(2.0).missing == [Missing(3, 9, "source-reset")]


def test_a_checkpoint_keeps_the_incarnation_and_its_retirement():
    state = PartitionState(wait=1.0, incarnation=OLD)
    state.offer(chain(range(3), OLD, per_run=3)[0], 0.0)
    state.retire(0.0)
    state.source_ended(9)
    saved = state.checkpoint()
    back = PartitionState.restore(saved, 1.0, incarnation=OLD)
    assert back.incarnation == OLD and back.retiring is not None and back.source_end == 9
    assert back.expire(100.0).missing == []  # the wait starts again after a restart
    assert back.expire(101.0).missing == [Missing(3, 9, "source-reset")]
    assert PartitionState.restore(back.checkpoint(), 1.0, incarnation=OLD).retired


def test_retired_incarnations_are_bounded_but_never_dropped_while_they_have_something_to_say():
    source = SourcePartition()
    for i in range(MAX_RETIRED + 3):
        source.adopt(PartitionState(wait=1.0, incarnation=bytes([i + 1]) * 16), 0.0)
    assert len(source.retired) > MAX_RETIRED  # each still retiring (its wait not over)
    for state in source.retired:
        state.expire(2.0)
    source.prune()
    assert len(source.retired) == MAX_RETIRED
    assert source.retired[-1].incarnation == bytes([MAX_RETIRED + 2]) * 16


def test_the_text_form_is_kafkas():
    u = uuid.uuid4()
    kafka = Uuid(int.from_bytes(u.bytes[:8], "big", signed=True),
                 int.from_bytes(u.bytes[8:], "big", signed=True))
    assert identity.from_uuid(kafka) == u.bytes
    # as Kafka's tools print a topic id: URL-safe base64 (librdkafka uses + and /)
    assert identity.text(u.bytes) == str(kafka).replace("+", "-").replace("/", "_")
    assert identity.parse(identity.text(u.bytes)) == identity.parse(str(kafka)) == u.bytes
    assert identity.parse("not an id") is None and identity.parse(b"\xff" * 22) is None
    assert identity.from_uuid(None) == NO_INCARNATION


def test_committed_offsets_name_their_incarnation():
    text = identity.metadata(OLD, "1700000000000")
    assert identity.from_metadata(text) == (OLD, "1700000000000")
    assert identity.from_metadata(identity.metadata(NEW)) == (NEW, "")
    assert identity.from_metadata(None) == (None, "")
    assert identity.from_metadata("someone else's metadata") == (None, "")


def test_an_identity_without_a_topic_id_depends_on_the_cluster_topic_and_mark():
    a = identity.fallback("cluster", "t", "5@1700000000000")
    assert a != NO_INCARNATION and len(a) == 16
    assert a == identity.fallback("cluster", "t", "5@1700000000000")
    assert len({a, identity.fallback("other", "t", "5@1700000000000"),
                identity.fallback("cluster", "u", "5@1700000000000"),
                identity.fallback("cluster", "t", "0@1800000000000")}) == 4


def test_the_watcher_tells_a_recreated_topic_from_a_gone_one():
    ids = Identities()
    assert ids.update({"a": OLD, "b": OLD}) == ({}, [])
    assert ids.update({"a": NEW, "b": OLD}) == ({"a": (OLD, NEW)}, [])   # recreated
    assert ids.update({"a": NEW}) == ({}, ["b"])                         # deleted
    assert ids.update({"a": NEW, "b": OLD}) == ({}, [])                  # back as it was
    assert ids.update({"a": NEW}) == ({}, ["b"])
    assert ids.update({"a": NEW, "b": NEW}) == ({"b": (OLD, NEW)}, [])   # back recreated


# -- the sender's side: diode.kafka.lineage -------------------------------------------------------

def test_a_recreated_topic_becomes_retired_claims_that_move_on_as_what_was_in_flight_is_sent():
    line = lineage.Lineage()
    line.confirmed({"t": OLD}, {("t", 0): 500, ("t", 1): 40}, started=0.0)
    # partition 0 read up to 199 and sent up to 149, messages 7 (to 179) and 8 (to 199) in
    # flight; partition 1 assigned at the beginning, nothing read
    line.depart(("t", 0), 100, 199, 149, 100, [(7, 179), (8, 199)])
    line.depart(("t", 1), None, None, -1, lineage.OFFSET_BEGINNING, [])
    assert line.recreate("t", OLD) == 2
    assert "t" in line.recreated and not line.ends and not line.departed
    sent = {7}
    claims = {c[1]: c for c in line.claims(lambda m: m in sent)}
    assert claims[0] == ["t", 0, OLD, 100, 179, 499, True]  # message 7 is sent by now
    assert claims[1] == ["t", 1, OLD, 0, -1, 39, True]      # the whole partition never read
    sent.add(8)
    assert line.claims(lambda m: m in sent)[0][4] == 199
    line.lost_inflight()                                     # (after a rewind: never sent)
    assert line.claims(lambda m: True)[0][4] == 199


def test_a_topic_found_as_it_was_is_read_again_and_its_ends_taken_from_fetches_too():
    line = lineage.Lineage()
    line.depart(("t", 0), 0, 9, 9, 0, [])
    line.fetched_now({("t", 0): 1000})   # what the reader's fetches saw
    line.confirmed({"t": OLD}, {("t", 0): 991}, started=time.monotonic() + 1)
    assert not line.departed               # the same incarnation: simply read again
    assert line.ends[("t", 0)] == 1000     # (a broker may list the end short, Tansu does)
    assert line.wants_fetched()


def test_a_restarted_reader_starts_from_what_it_remembered():
    line = lineage.Lineage()
    line.confirmed({"t": OLD}, {("t", 0): 50}, started=0.0)
    memory = line.memory([["t", 0, 0, 30, 20, 0]])
    again = lineage.Lineage()
    again.restore(memory)
    assert again.departed[("t", 0)][:4] == (0, 30, 20, 0) and again.remembered == {"t": OLD}
    again.recreate("t", OLD)
    assert again.claims(lambda m: True) == [["t", 0, OLD, 0, 20, 49, True]]
