"""JSON report, schema `envdoctor.report/v1` (envdoctor/schema/report-v1.json).

The same document `serve` will answer on /report. Facts keep their types: bytes
as integers, fractions as floats, lists as lists.
"""

from __future__ import annotations

import json

from envdoctor.export import Exporter
from envdoctor.model import Report


def render(report: Report, options) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False, default=str) + "\n"


EXPORTER = Exporter(name="json", render=render, content_type="application/json", extension="json",
                    help="one JSON object, schema envdoctor.report/v1")
