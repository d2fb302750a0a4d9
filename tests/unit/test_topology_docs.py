"""docs/topology.md is generated from the settings registry and must not drift from it."""

from pathlib import Path

from diode.runtime import topology

ROOT = Path(__file__).parents[2]


def test_topology_reference_is_up_to_date():
    """Regenerate with: diode docs > docs/topology.md"""
    assert (ROOT / "docs" / "topology.md").read_text() == topology.reference_markdown()
