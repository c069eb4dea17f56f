"""Markdown report, fit to paste into a bug report or a pull request: a one-line
verdict, the system facts (like torch's collect_env), the results table, and the
fix for every warn/fail under it."""

from __future__ import annotations

from envdoctor.export import Exporter
from envdoctor.model import Report, Status, fix_clauses

from .common import markdown_code, markdown_fence, markdown_text, one_line, system_rows
from .text_format import ORDER

ICON = {Status.OK: "✅ ok", Status.WARN: "⚠️ warn", Status.FAIL: "❌ fail", Status.ERROR: "💥 error", Status.SKIP: "⏭️ skip"}


def render(report: Report, options) -> str:
    counts = report.counts()
    lines = [
        f"## envdoctor report: {markdown_text(report.host)}",
        "",
        f"envdoctor {markdown_text(report.version)}, target {markdown_code(report.target)}, {markdown_text(report.started_at)}: "
        + ", ".join(f"{counts[s.value]} {s.value}" for s in (Status.OK, Status.WARN, Status.FAIL, Status.ERROR, Status.SKIP)),
        "",
        "### System",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {markdown_text(label)} | {markdown_text(value)} |" for label, value in system_rows(report.system)]
    lines += ["", "### Checks", "", "| status | check | summary |", "|---|---|---|"]
    ordered = sorted(report.results, key=lambda r: (ORDER[r.status], r.check))
    lines += [f"| {ICON[r.status]} | {markdown_code(r.check)} | {markdown_text(r.summary)} |" for r in ordered]
    fixes = [r for r in ordered if r.status in (Status.FAIL, Status.WARN) and r.remediation]
    if fixes:
        lines += ["", "### Fixes", ""]
        for r in fixes:
            # a fix that offers alternatives ("docker ...; Kubernetes: ...") gets one line each
            steps = [one_line(step).strip() for line in r.remediation.splitlines() for step in fix_clauses(line) if step.strip()]
            fence = markdown_fence(steps)  # longer than any run of backticks in the fix: the fix cannot close it
            lines += [f"- {markdown_code(r.check)} ({r.status.value}):", "", f"  {fence}", *(f"  {step}" for step in steps),
                      f"  {fence}"]
    return "\n".join(lines) + "\n"


EXPORTER = Exporter(name="markdown", render=render, content_type="text/markdown; charset=utf-8", extension="md",
                    help="Markdown for a bug report")
