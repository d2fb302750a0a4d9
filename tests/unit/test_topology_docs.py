"""docs/topology.md, docs/metrics.md and docs/events.md are generated from the settings registry,
the metrics catalog and the events' definitions and must not drift from them."""

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
    from diode.kafka import messages as events
    assert (ROOT / "docs" / "events.md").read_text() == events.reference_markdown()


def test_every_reason_the_receiver_reports_has_its_row():
    """A reason the code reports (diode.accounting.ordering's, the writer's) that the table of
    reasons lacks would reach an operator unexplained."""
    import re
    from diode.kafka import messages as events
    code = "".join((ROOT / p).read_text() for p in ("diode/accounting/ordering.py",
                                                     "stages/kafka_writer.py"))
    reported = set(re.findall(r'Missing\([^)]*?"([a-z-]+)"\)', code)) | \
        set(re.findall(r'_reason\("([a-z-]+)"', code)) | \
        set(re.findall(r'self\._(?:event|publish)\("[a-z]+", [^"]*"([a-z-]+)"', code)) | \
        set(re.findall(r'return "([a-z-]+)" if', code))
    assert reported >= {"gap", "tail", "receiver-down", "source-reset", "expired", "late"}, \
        reported
    assert reported <= {r.name for r in events.REASONS}, reported
