"""The built-in checks keep the shape issue 7 asked for: short functions (a check is
short rules with their fixes), gather + judge, and modes declared in each file."""

from __future__ import annotations

import ast
from pathlib import Path

from envdoctor.registry import load

CHECKS = Path(__file__).resolve().parent.parent / "checks"
LONGEST = 60


def test_no_function_in_checks_is_longer_than_60_lines():
    long = []
    for path in sorted(CHECKS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > LONGEST:
                long.append(f"{path.name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long


def test_every_builtin_is_gather_and_judge_with_declared_modes():
    registry = load(autoload_plugins=False)
    for check in registry.checks.values():
        assert check.gather is not None and check.judge is not None and check.run is None, check.id
        source = (CHECKS / (check.id.replace(".", "_") + ".py")).read_text()
        assert "modes=" in source and "intrusive" in source, f"{check.id} does not declare modes and intrusive"
