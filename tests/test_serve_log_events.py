"""README's table of serve's log events is what the code logs: an operator matches `msg`
on the whole text, so a message missing from the table, shortened there or listed under
another level is an alert that never fires (helper-112 found three such)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LEVELS = ("info", "warn", "error")


def _logged() -> list[tuple[str, str, str]]:
    """(level, msg, where) of every log.event call under envdoctor/serve; a level that is
    not a literal (chosen at run time) is given as '?'. Debug events are not documented."""
    found = []
    for path in sorted((REPO / "envdoctor" / "serve").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "event"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "log"):
                level, msg = node.args[0], node.args[1]
                assert isinstance(msg, ast.Constant), f"{path.name}:{node.lineno}: a msg made at run time"
                found.append((level.value if isinstance(level, ast.Constant) else "?", msg.value,
                              f"{path.name}:{node.lineno}"))
    return found


def _table() -> dict[str, str]:
    """The README events table: each level's row, as its text."""
    text = (REPO / "README.md").read_text()
    rows = dict(re.findall(r"^\| (info|warn|error) \| (.*) \|$", text, re.M))
    assert set(rows) == set(LEVELS), rows.keys()
    return rows


def _documented(row: str) -> set[str]:
    return set(re.findall(r"`([^`]+)`", row))


def test_every_event_serve_logs_is_in_the_readme_table_whole_and_at_its_level():
    rows = _table()
    logged = _logged()
    assert len(logged) > 20  # the scan found serve's calls
    missing = []
    for level, msg, where in logged:
        if level == "debug":
            continue
        levels = [lv for lv in LEVELS if msg in _documented(rows[lv])]
        if not levels or (level != "?" and level not in levels):
            missing.append(f"{where}: {level} {msg!r}")
    assert not missing, missing


def test_the_table_names_no_event_that_serve_does_not_log():
    """The other way: a documented msg that nothing logs is an alert on nothing. Backticked
    words in the table that are not messages (settings, flags, metrics) are told apart by
    their shape: a message has a space in it."""
    logged = {msg for _, msg, _ in _logged()} | {"log lines dropped"}  # envdoctor/log.py's own line
    for level in LEVELS:
        for name in _documented(_table()[level]):
            if " " in name and not name.startswith(("max_targets", "--")):
                assert name in logged, f"README lists {level} {name!r}, which serve never logs"


def test_log_lines_dropped_is_a_warning_as_the_table_says():
    from envdoctor import log

    assert b' level=warn msg="log lines dropped" count=' in log._lost_line()
    assert "log lines dropped" in _documented(_table()["warn"])
