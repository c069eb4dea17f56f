"""example-csv: a third-party output form, one file plus one entry point.

One line per result: check,target,status,summary (RFC 4180 quoting).
"""

import csv
import io

from envdoctor.export import Exporter


def render(report, options) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["check", "target", "status", "summary"])
    for r in report.results:
        writer.writerow([r.check, r.target, r.status.value, r.summary])
    return out.getvalue()


EXPORTER = Exporter(name="example-csv", render=render, content_type="text/csv; charset=utf-8", extension="csv",
                    help="one CSV line per result")
