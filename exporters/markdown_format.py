"""Markdown report, fit to paste into a bug report or a pull request: a one-line
verdict, the system facts (like torch's collect_env), the results table, and the
fix for every warn/fail under it."""

from __future__ import annotations

from envdoctor.export import Exporter
from envdoctor.model import Report, Status

from .common import system_rows
from .text_format import ORDER

ICON = {Status.OK: "✅ ok", Status.WARN: "⚠️ warn", Status.FAIL: "❌ fail", Status.ERROR: "💥 error", Status.SKIP: "⏭️ skip"}


def _cell(text: str) -> str:
    """Table cells may not hold pipes or newlines."""
    return text.replace("|", "\\|").replace("\n", " ").strip() or " "


def render(report: Report, options) -> str:
    counts = report.counts()
    lines = [
        f"## envdoctor report: {report.host}",
        "",
        f"envdoctor {report.version}, target `{report.target}`, {report.started_at}: "
        + ", ".join(f"{counts[s.value]} {s.value}" for s in (Status.OK, Status.WARN, Status.FAIL, Status.ERROR, Status.SKIP)),
        "",
        "### System",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {_cell(label)} | {_cell(value)} |" for label, value in system_rows(report.system)]
    lines += ["", "### Checks", "", "| status | check | summary |", "|---|---|---|"]
    ordered = sorted(report.results, key=lambda r: (ORDER[r.status], r.check))
    lines += [f"| {ICON[r.status]} | `{r.check}` | {_cell(r.summary)} |" for r in ordered]
    fixes = [r for r in ordered if r.status in (Status.FAIL, Status.WARN) and r.remediation]
    if fixes:
        lines += ["", "### Fixes", ""]
        for r in fixes:
            # a fix that offers alternatives ("docker ...; Kubernetes: ...") gets one line each
            steps = [step.strip() for line in r.remediation.splitlines() for step in line.split("; ") if step.strip()]
            lines += [f"- `{r.check}` ({r.status.value}):", "", "  ```", *(f"  {step}" for step in steps), "  ```"]
    return "\n".join(lines) + "\n"


EXPORTER = Exporter(name="markdown", render=render, content_type="text/markdown; charset=utf-8", extension="md",
                    help="Markdown for a bug report")
