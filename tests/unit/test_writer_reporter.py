"""The writer's missing-range reporter (diode.writer.reporter) tells what ordering decided: a
range missing, with its ticket opened; its fill, once, with the ticket closed; a source-reset
range closed expired at once; a resent run cut by the tickets it fills. Each event as
diode.kafka.messages defines it, with the reason's meaning in the log (diode.accounting
.reasons)."""

import json
import logging

from diode.accounting import reasons
from diode.kafka.messages import MISSING_RECORDS_EVENT, TICKET_HEADER
from diode.accounting.ordering import Missing, PartitionState, SourcePartition, Update
from diode.writer.reporter import Reporter
from tests.unit.writer_fakes import LOG, metrics, run, settings


def reporter(topic="missing"):
    emitted = []
    r = Reporter(settings(**{"missing.records.topic": topic}), metrics(), LOG,
                 lambda *event: emitted.append(event))
    return r, emitted


def events(emitted) -> list:
    out = [json.loads(value) for _, _, value, _ in emitted]
    for e in out:  # exactly the defined fields of its type
        assert list(e) == list(MISSING_RECORDS_EVENT[e["type"]].names), e
    return [(e["type"], e["reason"], e["firstOffset"], e["lastOffset"], e.get("ticket"))
            for e in out]


def test_a_missing_range_is_reported_once_with_its_ticket_and_its_fill_closes_it(caplog):
    r, emitted = reporter()
    state = PartitionState(0.0, frontier=4)
    with caplog.at_level(logging.WARNING, LOG.name):
        r.apply("t", 0, state, Update([], [Missing(5, 9, reasons.GAP)], []))
    ticket = Reporter.ticket("t", 0, state, 5, 9)
    assert events(emitted) == [("missing", "gap", 5, 9, ticket)]
    assert "missing t[0] offsets 5..9 (lost on the link)" in caplog.text
    assert r.metrics.get("missing_records") == 5 and len(state.tickets) == 1
    state.gaps = []  # (ordering took the range out of its gaps: every record arrived)
    r.apply("t", 0, state, Update([], [], [5, 6, 7, 8, 9]))
    source = SourcePartition()
    source.current = state
    r.report_fills({("t", 0): source})
    r.report_fills({("t", 0): source})  # (once)
    assert events(emitted)[1:] == [("filled", "late", 5, 9, None),
                                   ("closed", "filled", 5, 9, ticket)]
    assert r.metrics.get("tickets_closed", reason="filled") == 1 and not state.tickets


def test_a_source_reset_range_closes_its_ticket_expired_at_once():
    r, emitted = reporter()
    state = PartitionState(0.0, frontier=4)
    r.apply("t", 0, state, Update([], [Missing(5, 6, reasons.SOURCE_RESET)], []))
    assert [e[:2] for e in events(emitted)] == [("missing", "source-reset"),
                                                ("closed", "expired")]
    assert not state.tickets


def test_without_a_missing_records_topic_it_is_logged_and_counted_only():
    r, emitted = reporter(topic="")
    r.refused("t", 0, 3, "Broker: Message size too large", None)
    assert emitted == [] and r.metrics.get("refused_records") == 1
    assert r.metrics.get("missing_ranges") == 1


def test_a_resent_run_is_cut_where_its_ticket_changes():
    r, _ = reporter()
    state = PartitionState(0.0)
    state.open_ticket(0, 1, 0)
    state.open_ticket(3, 5, 0)
    parts = r.cut_by_ticket(run(0, 5), state)  # 0 1 | 2 | 3 4
    assert [list(p.offsets) for p, _ in parts] == [[0, 1], [2], [3, 4]]
    assert [dict(extra).get(TICKET_HEADER) for _, extra in parts] == [
        Reporter.ticket("t", 0, state, 0, 1).encode(), None,
        Reporter.ticket("t", 0, state, 3, 5).encode()]
