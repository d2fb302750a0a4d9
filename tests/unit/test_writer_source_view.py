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
