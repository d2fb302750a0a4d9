"""docs/topology.md, docs/metrics.md and docs/events.md are generated from the settings registry,
the metrics catalog and the events' definitions and must not drift from them."""

import re
from pathlib import Path

from diode.runtime import topology

ROOT = Path(__file__).parents[2]


def test_topology_reference_is_up_to_date():
    """Regenerate with: diode docs > docs/topology.md"""
    assert (ROOT / "docs" / "topology.md").read_text() == topology.reference_markdown()


def test_metrics_reference_is_up_to_date():
    """Regenerate with: diode docs --metrics > docs/metrics.md"""
    from diode.runtime import metrics
    assert (ROOT / "docs" / "metrics.md").read_text() == metrics.reference_markdown()


def test_events_reference_is_up_to_date():
    """Regenerate with: diode docs --events > docs/events.md"""
    from diode.kafka import messages
    assert (ROOT / "docs" / "events.md").read_text() == messages.reference_markdown()


def test_the_settings_reference_lists_the_missing_records_events_fields_as_defined():
    """receiver.missing.records.topic's row in docs/topology.md names the events' fields from
    their definitions (diode.kafka.messages), every one of them: the list written there by hand
    went stale once."""
    from diode.kafka import messages
    row = next(line for line in (ROOT / "docs" / "topology.md").read_text().splitlines()
               if line.startswith("| `receiver.missing.records.topic`"))
    assert messages.missing_records_fields() in row
    named = set(re.findall(r"\b[a-z][A-Za-z]+\b", messages.missing_records_fields()))
    assert {n for e in messages.MISSING_RECORDS for n in e.names} <= named


def test_every_reason_the_receiver_reports_has_its_row():
    """A reason the code reports (decided in diode.accounting.ordering, told by the writer's
    rooms, each naming it from diode.accounting.reasons) that the table of reasons lacks would
    reach an operator unexplained."""
    from diode.accounting import reasons
    paths = [ROOT / "diode" / "accounting" / "ordering.py", ROOT / "stages" / "kafka_writer.py",
             *sorted((ROOT / "diode" / "writer").glob("*.py"))]
    code = "".join(p.read_text() for p in paths)
    reported = {getattr(reasons, name) for name in re.findall(r"\breasons\.([A-Z_]+)\b", code)}
    assert reported >= {"gap", "tail", "receiver-down", "source-reset", "expired", "late"}, \
        reported
    assert reported <= {r.name for r in reasons.REASONS}, reported
