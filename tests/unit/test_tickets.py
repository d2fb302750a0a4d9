"""Resend tickets (diode.accounting.tickets): ids, open and closed as a partition's gaps are
filled or expire, the low side's book of them, and manifests that cannot be altered."""

import copy
import os

from diode.accounting import tickets
from diode.accounting.ordering import PartitionState
from diode.accounting.tickets import Closed, Open
from tests.unit.test_ordering import chain, feed, resent


def test_a_ticket_id_names_exactly_its_range():
    a = tickets.ticket_id("AAAAAAAAAAAAAAAAAAAAAQ", "t", 0, 10, 19)
    assert a == tickets.ticket_id("AAAAAAAAAAAAAAAAAAAAAQ", "t", 0, 10, 19)
    others = {tickets.ticket_id("AAAAAAAAAAAAAAAAAAAAAg", "t", 0, 10, 19),
              tickets.ticket_id("AAAAAAAAAAAAAAAAAAAAAQ", "u", 0, 10, 19),
              tickets.ticket_id("AAAAAAAAAAAAAAAAAAAAAQ", "t", 1, 10, 19),
              tickets.ticket_id("AAAAAAAAAAAAAAAAAAAAAQ", "t", 0, 9, 19),
              tickets.ticket_id("AAAAAAAAAAAAAAAAAAAAAQ", "t", 0, 10, 20)}
    assert a not in others and len(others) == 5 and len(a) == 20


def lossy_state():
    """A partition whose records 3..4 and 8 were lost: two tickets open."""
    state = PartitionState(0.0)
    runs = chain(range(10))
    feed(state, [r for r in runs if r.offsets[0] not in (3, 4, 8)])
    u = state.expire(1.0)
    assert [(m.first, m.last) for m in u.missing] == [(3, 4), (8, 8)]
    for m in u.missing:
        assert state.open_ticket(m.first, m.last, 1000) == []
    return state, runs


def test_a_ticket_closes_filled_when_its_last_record_comes():
    state, runs = lossy_state()
    assert state.open_ticket(3, 4, 5000) == []  # reported again (a restart): the same ticket
    assert state.tickets == [Open(3, 4, 1000, None), Open(8, 8, 1000, None)]
    _, _, filled = feed(state, [resent(runs[3])])
    assert filled == [3] and state.settle_tickets(3, 3) == []  # 4 is still missing
    assert state.ticket_at(4) == Open(3, 4, 1000, None) and state.ticket_at(5) is None
    _, _, filled = feed(state, [resent(runs[4])])
    assert state.settle_tickets(4, 4) == [Closed(3, 4, 1000, "filled")]
    assert state.tickets == [Open(8, 8, 1000, None)]
    assert state.checkpoint()["tickets"] == [[8, 8, 1000, None, None]]  # (the JSON's format)
    again = PartitionState.restore(state.checkpoint(), 0.0)  # kept across a restart
    assert again.tickets == [Open(8, 8, 1000, None)]
    feed(again, [resent(runs[8])])
    assert again.settle_tickets(8, 8) == [Closed(8, 8, 1000, "filled")] and again.tickets == []


def test_a_ticket_closes_expired_when_the_source_deletes_what_is_left():
    state, runs = lossy_state()
    feed(state, [resent(runs[3])])
    state.settle_tickets(3, 3)
    assert state.source_starts(5) == [[4, 4]]
    assert state.settle_tickets(4, 4) == [Closed(3, 4, 1000, "expired")]
    assert state.source_starts(8) == [] and state.tickets == [Open(8, 8, 1000, None)]


def test_a_ticket_on_a_compacted_topic_closes_once_what_the_source_holds_arrived():
    """A range reported missing may hold offsets that never were records (compacted away, a
    transaction's markers): a resend that read the range says how many records it holds."""
    state = PartitionState(0.0)
    state.gaps = [[10, 19]]
    state.open_ticket(10, 19, 1000)
    state.source_holds(10, 19, 4)  # 10, 13, 15, 18 exist
    state.source_holds(10, 18, 3)  # (another range: no ticket of it)
    for offset in (10, 13, 15):
        state._fill(offset)
        assert state.settle_tickets(offset, offset) == []
    state._fill(18)
    assert state.settle_tickets(18, 18) == [Closed(10, 19, 1000, "filled")]
    assert state.gaps == [[11, 12], [14, 14], [16, 17], [19, 19]]  # (never to come)


def test_open_tickets_are_bounded_per_partition():
    state = PartitionState(0.0, max_gaps=2)
    assert state.open_ticket(1, 1, 1) == [] and state.open_ticket(3, 3, 2) == []
    assert state.open_ticket(5, 6, 3) == [Closed(1, 1, 1, "untracked")]
    assert [(t.first, t.last) for t in state.tickets] == [(3, 3), (5, 6)]


def test_tickets_are_at_risk_by_their_records_timestamps_and_the_retention():
    """due_by: a ticket whose last record before it has timestamp T is deleted by retention
    from T + retention.ms on; at_risk counts those due before the horizon, once."""
    state = PartitionState(0.0)
    state.gaps = [[10, 19], [500, 509], [900, 909]]
    for first, last, ts in ((10, 19, 1_000), (500, 509, 50_000), (900, 909, None)):
        state.last_timestamp = ts
        state.open_ticket(first, last, 0)
    assert state.due_by(deadline_ms=40_000, retention_ms=30_000) == [[10, 19]]
    assert state.due_by(deadline_ms=90_000, retention_ms=30_000) == [[10, 19], [500, 509]]
    assert state.at_risk(100) == 10  # by offsets alone: 10..19 is near the log start
    due = state.due_by(90_000, 30_000)
    assert state.at_risk(100, due) == 20 and state.at_risk(0, due) == 20  # (10..19 once)
    again = PartitionState.restore(state.checkpoint(), 0.0)
    assert again.due_by(90_000, 30_000) == due and again.last_timestamp is None


def event(kind, first, last, reason="gap", **more):
    tid = tickets.ticket_id("AAAAAAAAAAAAAAAAAAAAAQ", "t", 0, *more.pop("range", (first, last)))
    return {"type": kind, "sourceTopic": "t", "sourcePartition": 0,
            "sourceTopicId": "AAAAAAAAAAAAAAAAAAAAAQ", "firstOffset": first, "lastOffset": last,
            "reason": reason, "detectedAt": 1000, "ticket": tid, **more}


def test_the_book_folds_the_missing_records_topic():
    book = tickets.Book()
    for e in [event("missing", 3, 4), event("missing", 3, 4),  # (a report again: one ticket)
              event("missing", 8, 8), event("missing", 20, 29),
              event("filled", 3, 4, "late"),
              event("closed", 3, 4, "filled", state="filled", closedAt=61000),
              event("missing", 20, 24, "expired", range=(20, 29)),
              {"type": "heartbeat"}, event("missing", 40, 41, ticket=None)]:
        book.add(e)
    assert [(t.first, t.state) for t in book.select()] == [(3, "filled"), (8, "open"),
                                                          (20, "open")]
    assert [t.first for t in book.select("open")] == [8, 20]
    assert book.select("open")[1].at_risk  # partly expired
    closed = book.select("closed")
    assert len(closed) == 1 and closed[0].age_seconds(10**9) == 60.0
    m = tickets.manifest_of(book.select("open"), 5, "demo")
    assert m["missing"] == [{"topic": "t", "partition": 0, "topicId": "AAAAAAAAAAAAAAAAAAAAAQ",
                             "ranges": [[8, 8], [20, 29]],
                             "tickets": [t.id for t in book.select("open")]}]


def test_a_manifest_altered_widened_or_forged_is_refused():
    key, other = os.urandom(32), os.urandom(32)
    book = tickets.Book()
    book.add(event("missing", 8, 8))
    book.add(event("missing", 20, 29))
    good = tickets.sign(tickets.manifest_of(book.select("open"), 5, "demo"), key, 0)
    assert tickets.check(good, {0: key}) is None
    assert tickets.check(good, {0: other, 1: key}) is not None  # signed with key id 0
    rotated = tickets.sign(tickets.manifest_of(book.select("open"), 5, "demo"), key, 1)
    assert tickets.check(rotated, {0: other, 1: key}) is None   # (a rotation: either key)

    widened = copy.deepcopy(good)
    widened["missing"][0]["ranges"][1] = [20, 99]
    assert "does not match" in tickets.check(widened, {0: key})
    # widened and signed again by someone holding the key: the MAC checks (it proves who made
    # the manifest, not what it asks for); the ticket no longer names the range
    resigned = tickets.sign({k: v for k, v in widened.items() if k != "auth"}, key, 0)
    assert tickets.check(resigned, {0: key}) is None
    assert tickets.out_of_bounds(resigned) == [
        f"t[0] 20..99 is not the range of its ticket {good['missing'][0]['tickets'][1]} "
        "(wider than the range reported missing, or another)"]

    text = bytearray(tickets._body(good))
    text[text.index(b"29")] = ord("3")  # one byte changed
    import json
    changed = {**json.loads(bytes(text)), "auth": good["auth"]}
    assert "does not match" in tickets.check(changed, {0: key})

    forged = tickets.sign({k: v for k, v in good.items() if k != "auth"}, other, 0)
    assert "does not match" in tickets.check(forged, {0: key})
    unsigned = {k: v for k, v in good.items() if k != "auth"}
    assert "not signed" in tickets.check(unsigned, {0: key})


def test_each_range_of_a_ticketed_entry_is_bounded_by_its_own_ticket():
    """A ticket id names exactly one range: a range with no ticket of its own (more ranges than
    tickets) or with another range's ticket is out of bounds; an entry that names no tickets
    (diode verify's) is not bounded by any. Ticket ids are not keyed, so this binds a manifest
    edited by hand, not one whose ids were recomputed (docs/verification.md)."""
    book = tickets.Book()
    book.add(event("missing", 8, 8))
    book.add(event("missing", 20, 29))
    m = tickets.manifest_of(book.select("open"), 5, "demo")
    assert tickets.out_of_bounds(m) == []
    one_more = copy.deepcopy(m)
    one_more["missing"][0]["ranges"].append([0, 1000])
    assert tickets.out_of_bounds(one_more) == [
        "t[0]: 3 range(s) but 2 ticket(s); each range must name the ticket it came from"]
    swapped = copy.deepcopy(m)
    swapped["missing"][0]["tickets"].reverse()
    assert len(tickets.out_of_bounds(swapped)) == 2
    recomputed = copy.deepcopy(one_more)
    recomputed["missing"][0]["tickets"].append(
        tickets.ticket_id("AAAAAAAAAAAAAAAAAAAAAQ", "t", 0, 0, 1000))
    assert tickets.out_of_bounds(recomputed) == []  # (what a key holder can do: docs)
    untracked = {"missing": [{"topic": "t", "partition": 0, "ranges": [[0, 1000]]}]}
    assert tickets.out_of_bounds(untracked) == []
