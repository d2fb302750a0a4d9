"""deploy/prometheus/diode-rules.yml: Prometheus' own tools check the rules and run their unit
tests (diode-rules.test.yml), the rules read only metrics diode exports, and every alert says
how grave it is, what to do, where its runbook is, and is tested both ways."""

import re
import shutil
import subprocess

import pytest
import yaml

from diode.runtime.metrics import CATALOG, exported_name
from tests.conftest import ROOT

RULES = ROOT / "deploy" / "prometheus" / "diode-rules.yml"
TESTS = ROOT / "deploy" / "prometheus" / "diode-rules.test.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed "
                                    "(./scripts/install installs Debian's prometheus package)")


def alerts() -> list:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


@needs_promtool
def test_promtool_checks_the_rules_and_their_unit_tests_pass():
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in check.stdout
    test = subprocess.run([PROMTOOL, "test", "rules", str(TESTS)], capture_output=True,
                          text=True, timeout=120)
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout


def test_the_rules_read_only_metrics_diode_exports():
    exported = {exported_name(n, m.kind) if m.kind != "histogram" else f"diode_{n}"
                for n, m in CATALOG.items()}
    read = {name for r in alerts() for name in re.findall(r"\bdiode_[a-z_]+", r["expr"])}
    assert read and read <= exported, read - exported
    # the label values they select on are those diode gives
    states = set(re.findall(r'state="([a-z]+)"', RULES.read_text()))
    assert states and all(s in CATALOG["worker_state"].help for s in states)
    assert 'reason!="fragments_lost"' in RULES.read_text() and \
        "fragments_lost" in CATALOG["rejects"].reasons


def test_every_alert_has_a_severity_a_runbook_and_a_test_that_fires_it_and_one_that_does_not():
    docs = (ROOT / "docs" / "alerts.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", docs, re.M)}
    cases = [c for t in yaml.safe_load(TESTS.read_text())["tests"] for c in t["alert_rule_test"]]
    for rule in alerts():
        name = rule["alert"]
        assert "for" in rule, name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        notes = rule["annotations"]
        assert {"summary", "description", "runbook"} <= set(notes), name
        assert "{{ $labels." in notes["summary"], name  # it names the launch or the worker
        page, anchor = notes["runbook"].split("#")
        assert page == "docs/alerts.md" and anchor in anchors, (name, anchor)
        severity = rule["labels"]["severity"]
        assert any(c["alertname"] == name and any(a["exp_labels"]["severity"] == severity
                                                  for a in c["exp_alerts"]) for c in cases), \
            f"no test fires {name} ({severity})"
        assert any(c["alertname"] == name and not c["exp_alerts"] for c in cases), \
            f"no test shows {name} silent"
