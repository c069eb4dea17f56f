"""Terminal report: system facts, then one table row per result (status, check,
summary, fix). Colour only on a terminal; NO_COLOR is respected (the CLI decides
`options.color`, and rich itself honours NO_COLOR)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table
from rich.text import Text

from envdoctor.export import Exporter
from envdoctor.model import Report, Status

from .common import system_rows

STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.ERROR: "bold magenta", Status.SKIP: "dim"}
ORDER = {Status.FAIL: 0, Status.ERROR: 1, Status.WARN: 2, Status.OK: 3, Status.SKIP: 4}


def render(report: Report, options) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=options.color, no_color=not options.color,
                      width=options.width, highlight=False, soft_wrap=False)
    console.print(Text(f"envdoctor {report.version} on {report.host}, target {report.target}, {report.started_at}", style="bold"))

    facts = Table(show_header=False, box=None, pad_edge=False)
    facts.add_column(style="dim", no_wrap=True)
    facts.add_column()
    for label, value in system_rows(report.system):
        facts.add_row(label, value)
    console.print(facts)
    console.print()

    table = Table(show_lines=False, expand=False)
    # overflow="fold": a narrow terminal wraps long paths and commands instead of cutting them with "…"
    table.add_column("status", no_wrap=True)
    table.add_column("check", overflow="fold")
    table.add_column("summary", ratio=3, overflow="fold")
    table.add_column("fix", ratio=2, overflow="fold")
    for r in sorted(report.results, key=lambda r: (ORDER[r.status], r.check)):
        table.add_row(Text(r.status.value.upper(), style=STYLE[r.status]), r.check, r.summary, r.remediation)
    console.print(table)

    counts = report.counts()
    line = ", ".join(f"{counts[s.value]} {s.value}" for s in (Status.OK, Status.WARN, Status.FAIL, Status.ERROR, Status.SKIP))
    console.print(f"{line} in {report.duration_seconds:.2f} s. `envdoctor explain ID` says more about a check.")
    return buffer.getvalue()


EXPORTER = Exporter(name="text", render=render, content_type="text/plain; charset=utf-8", extension="txt",
                    help="a table for a terminal (the default)")
