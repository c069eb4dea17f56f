"""Compact: one summary line, then one line per warn/fail/error result with its fix.

For a log rather than a terminal: what preflight() prints to the training
script's stderr and what `envdoctor exec` writes before the job starts, where a
table would be noise and an ok row says nothing. Loudest first (fail, error,
warn), each line self-contained (status, check, summary, fix) so a grep of the
job's log finds the whole story. `ExportOptions.title` names the caller
("envdoctor preflight"); `ExportOptions.notes` are printed under the summary
(a config that was ignored, for example).
"""

from __future__ import annotations

from envdoctor.export import Exporter
from envdoctor.model import Report, Status

from .common import one_line  # a log line gets no raw control character

RANK = {Status.FAIL: 0, Status.ERROR: 1, Status.WARN: 2}
TALLY = (Status.FAIL, Status.ERROR, Status.WARN, Status.OK, Status.SKIP)


def render(report: Report, options) -> str:
    counts = report.counts()
    tally = ", ".join(f"{counts[s.value]} {s.value}" for s in TALLY if counts[s.value])
    title = getattr(options, "title", "") or "envdoctor"
    target = f" {report.target}" if report.target not in ("", "self") else ""  # --pid N, node: say whose
    count = len(report.results)
    lines = [f"{title}{target}: {count} check{'' if count == 1 else 's'}: {tally or 'none run'}"]
    lines += [f"  note: {one_line(note)}" for note in getattr(options, "notes", ())]
    for r in sorted((r for r in report.results if r.status in RANK), key=lambda r: (RANK[r.status], r.check)):
        lines.append(f"  {r.status.value.upper():5} {one_line(r.check)}: {one_line(r.summary)}"
                     + (f" | fix: {one_line(r.remediation)}" if r.remediation else ""))
    return "\n".join(lines) + "\n"


EXPORTER = Exporter(name="compact", render=render, content_type="text/plain; charset=utf-8", extension="log",
                    help="one line per problem with its fix, and a summary line (for logs)")
