"""deploy/prometheus: the rules load, every rule is exercised by `promtool test rules`
(silent cases included), and every alert carries what an on-call engineer needs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent.parent / "deploy/prometheus"
RULES = HERE / "envdoctor.rules.yml"
TESTS = HERE / "envdoctor.rules.test.yml"


def _promtool():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; scripts/test.sh installs it)")
    return promtool


def _rules():
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_rules():
    proc = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in proc.stdout


def test_promtool_rule_tests_pass():
    proc = subprocess.run([_promtool(), "test", "rules", str(TESTS)], capture_output=True, text=True, timeout=60, cwd=HERE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_rule_is_exercised_and_seen_both_firing_and_silent():
    cases = yaml.safe_load(TESTS.read_text())["tests"]
    fired, silent, recorded = set(), set(), set()
    for case in cases:
        for t in case.get("alert_rule_test", []):
            (fired if t["exp_alerts"] else silent).add(t["alertname"])
        for t in case.get("promql_expr_test", []):
            if t["exp_samples"]:
                recorded.add(t["expr"])
    alerts = {r["alert"] for r in _rules() if "alert" in r}
    records = {r["record"] for r in _rules() if "record" in r}
    assert alerts - fired == set(), "alerts never seen firing in a test"
    assert alerts - silent == set(), "alerts never seen staying silent in a test"
    assert records - recorded == set(), "recording rules never checked against samples"


def test_every_alert_has_severity_summary_description_and_an_explain_runbook():
    """A check's alert points at `envdoctor explain`; one about serve itself at where its
    settings or its state are read; one about a hung process at where it is named and how
    to look at it on the node."""
    for rule in (r for r in _rules() if "alert" in r):
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule["alert"]
        runbook = rule["annotations"]["runbook"]
        if "envdoctor_targets_overflow_total" in rule["expr"]:
            assert "Running the monitor" in runbook and "max_targets" in runbook, rule["alert"]
            assert "## Running the monitor" in (HERE.parents[1] / "README.md").read_text()
        elif "envdoctor_targets_hung" in rule["expr"]:  # no check examines a hung process: where it is named, and how to look
            assert "/healthz" in runbook and "ps -o pid,stat,wchan" in runbook, rule["alert"]
        else:
            assert "envdoctor explain" in runbook, rule["alert"]
