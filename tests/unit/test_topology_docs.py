"""docs/topology.md and docs/metrics.md are generated from the settings registry and the
metrics catalog and must not drift from them."""

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
