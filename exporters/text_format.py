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

from .common import printable, system_rows

STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.ERROR: "bold magenta", Status.SKIP: "dim"}
ORDER = {Status.FAIL: 0, Status.ERROR: 1, Status.WARN: 2, Status.OK: 3, Status.SKIP: 4}


def _text(value, style: str = "") -> Text:
    """A cell that prints exactly what it holds: a Text, never markup (a value like
    `[/bold]` or a file named `[x].onnx` shows as written), control characters escaped."""
    return Text(printable(value), style=style)


# A table cell is read on a terminal: past this, the rest is said, not printed. A plug-in's
# 20 MB summary kept rich wrapping it for minutes (helper-39); -f json carries all of it.
# Long enough for every variable a summary quotes whole (a 40,000-character RANK); 64 Ki
# characters wrap in about 60 ms.
CELL_CHARS = 65536


def _cell(value: str) -> Text:
    text = printable(value)
    if len(text) > CELL_CHARS:
        text = f"{text[:CELL_CHARS]}… ({len(text) - CELL_CHARS} more characters; -f json has them all)"
    return Text(text)


def render(report: Report, options) -> str:
    buffer = io.StringIO()
    # Every cell is a Text already: no markup to parse, no :emoji: codes to look up (their
    # table's import alone was 2 ms of every report; a column header is a str).
    console = Console(file=buffer, force_terminal=options.color, no_color=not options.color,
                      width=options.width, highlight=False, soft_wrap=False, markup=False, emoji=False)
    console.print(_text(f"envdoctor {report.version} on {report.host}, target {report.target}, {report.started_at}", "bold"))

    facts = Table(show_header=False, box=None, pad_edge=False)
    facts.add_column(style="dim", no_wrap=True)
    facts.add_column()
    for label, value in system_rows(report.system):
        facts.add_row(_text(label), _text(value))
    console.print(facts)
    console.print()

    table = Table(show_lines=False, expand=False)
    # overflow="fold": a narrow terminal wraps long paths and commands instead of cutting them with "…"
    table.add_column("status", no_wrap=True)
    table.add_column("check", overflow="fold")
    table.add_column("summary", ratio=3, overflow="fold")
    table.add_column("fix", ratio=2, overflow="fold")
    for r in sorted(report.results, key=lambda r: (ORDER[r.status], r.check)):
        table.add_row(Text(r.status.value.upper(), style=STYLE[r.status]), _text(r.check), _cell(r.summary),
                      _cell(r.remediation))
    console.print(table)

    counts = report.counts()
    line = ", ".join(f"{counts[s.value]} {s.value}" for s in (Status.OK, Status.WARN, Status.FAIL, Status.ERROR, Status.SKIP))
    console.print(_text(f"{line} in {report.duration_seconds:.2f} s. `envdoctor explain ID` says more about a check."))
    # rich pads every line of the system facts to the widest value: ~60 trailing blanks a
    # line in a log or a pasted report (helper-91)
    return "\n".join(line.rstrip(" ") for line in buffer.getvalue().split("\n"))


EXPORTER = Exporter(name="text", render=render, content_type="text/plain; charset=utf-8", extension="txt",
                    help="a table for a terminal (the default)")
