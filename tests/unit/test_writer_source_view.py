"""The writer's source view (diode.writer.source_view): the lag and the records at risk per
source topic from the sender's newest look, a reported range the source deleted said expired
with its ticket, and writer 0's metadata handed to the sync newest first."""

import json

from diode.accounting.ordering import PartitionState, SourcePartition
from diode.link.records import NO_INCARNATION
from diode.writer.reporter import Reporter
from diode.writer.source_view import SourceView
from tests.unit.writer_fakes import LOG, metrics, settings


class Sync:
    busy = False

    def __init__(self):
        self.handed = []

    def take(self):
        return []

    def hand(self, topics, groups):
        self.handed.append((topics, groups))


def view(state: PartitionState | None = None):
    emitted, sources = [], {}
    if state is not None:
        sources[("t", 0)] = SourcePartition()
        sources[("t", 0)].current = state
    s = settings(**{"missing.records.topic": "missing"})
    m = metrics()
    reporter = Reporter(s, m, LOG, lambda *e: emitted.append(e))
    return SourceView(s, m, LOG, sources=sources, owns=lambda t, p: p == 0, reporter=reporter,
                      emit=lambda *e: emitted.append(e), sync=Sync()), emitted


def look(time_ms: int, log_start: int, end: int) -> dict:
    return {"time_ms": time_ms, "partitions": [("t", 0, NO_INCARNATION, log_start, end),
                                               ("t", 1, NO_INCARNATION, 0, 99)],
            "topics": [("t", 86_400_000, -1, "delete")]}


def test_lag_and_expired_ranges_come_from_the_senders_newest_look():
    state = PartitionState(0.0, frontier=49, incarnation=NO_INCARNATION)
    state.gaps = [[20, 29]]
    state.open_ticket(20, 29, 0)
    v, emitted = view(state)
    v.source(look(2000, 0, 100))
    v.source(look(1000, 25, 100))  # an older look (a journal replay): ignored
    v.export()
    assert v.metrics.get("source_lag_records", topic="t") == 50   # 50..99, partition 0 only
    assert v.metrics.get("source_held_records", topic="t") == 100
    assert emitted == []
    v.source(look(3000, 25, 100))  # the source deleted 0..24: 20..24 can never be resent
    [(_, _, value, _)] = emitted
    event = json.loads(value)
    assert (event["reason"], event["firstOffset"], event["lastOffset"]) == ("expired", 20, 24)
    assert event["ticket"] == Reporter.ticket("t", 0, state, 20, 29)
    assert v.metrics.get("missing_expired_records") == 5


def test_the_newest_metadata_is_handed_to_the_sync():
    v, _ = view()
    v.metadata({"time_ms": 2000, "topics": [("t", "new")], "groups": [("g", "t", 0, b"i", 7)]})
    v.metadata({"time_ms": 1000, "topics": [("t", "old")], "groups": []})
    assert v.sync.handed == [({"t": ("new",)}, {("g", "t", 0): (b"i", 7)})]


def test_the_lag_counted_again_only_where_something_changed_is_the_whole_count():
    """The writer counts again at each export only the partitions whose look or states changed
    (diode.writer.held) and those with tickets open: after every change the gauges are those of
    a view that counts every partition every time (a change missed would leave them stale)."""
    from diode.writer.held import Held
    from tests.unit.writer_fakes import run

    sources = {}
    held = Held(sources)
    s = settings(**{"missing.records.topic": "missing"})

    def made(changed):
        m = metrics()
        return SourceView(s, m, LOG, sources=sources, owns=lambda t, p: True,
                          reporter=Reporter(s, m, LOG, lambda *e: None), emit=lambda *e: None,
                          changed=changed, touched=held.touched)

    kept, whole = made(held.take_changed), made(None)
    old, new = bytes(range(16)), bytes(range(1, 17))
    for tp in (("a", 0), ("a", 1), ("b", 0)):
        sources[tp] = SourcePartition()
        sources[tp].current = PartitionState(0.0, frontier=9, incarnation=old)

    def looked(time_ms, *partitions):
        for v in (kept, whole):
            v.source({"time_ms": time_ms, "partitions": list(partitions),
                      "topics": [("a", 86_400_000, -1, "delete")]})

    def same():
        for v in (kept, whole):
            held.sums()  # (as the writer's metrics do first)
            v.export()
        series = {k: v for k, v in whole.metrics.gauges.items() if k[1]}
        assert {k: v for k, v in kept.metrics.gauges.items() if k[1]} == series
        return {(k[0], k[1][0][1]): v for k, v in series.items()}

    looked(1000, ("a", 0, old, 0, 100), ("a", 1, old, 0, 50), ("b", 0, old, 5, 20))
    assert same()[("source_lag_records", "a")] == 90 + 40
    state = sources[("a", 0)].current  # 10..19 written
    r = run(10, 10)
    r.origin = (1, 0.0, False)
    state.offer(r, 0.0)
    held.offered(("a", 0), state.busy)
    assert same()[("source_lag_records", "a")] == 80 + 40
    looked(2000, ("a", 1, old, 0, 60))  # (the source grew)
    assert same()[("source_lag_records", "a")] == 80 + 50
    looked(2500, ("a", 1, old, 0, 60))  # (the same look again: nothing to count)
    assert same()[("source_lag_records", "a")] == 80 + 50
    state.gaps = [[30, 39]]  # reported missing, a ticket open: at risk within the margin
    state.open_ticket(30, 39, 0)
    held.touched(("a", 0))
    assert same()[("missing_at_risk_records", "a")] == 10
    looked(3000, ("a", 0, old, 35, 100))  # the source deleted 0..34: 35..39 at risk
    assert same()[("missing_at_risk_records", "a")] == 5
    sources[("b", 0)].adopt(PartitionState(0.0, incarnation=new), 0.0)  # recreated
    held.touched(("b", 0))
    assert same()[("source_lag_records", "b")] == 0  # (its look is of the old one: counts 0)
    assert same()[("source_held_records", "b")] == 15  # (as it was: no partition counts)
    looked(4000, ("b", 0, new, 0, 7))
    assert same()[("source_lag_records", "b")] == 7
