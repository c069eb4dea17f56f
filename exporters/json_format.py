"""JSON report, schema `envdoctor.report/v1` (envdoctor/schema/report-v1.json).

The same document `serve` will answer on /report. Facts keep their types: bytes
as integers, fractions as floats, lists as lists.
"""

from __future__ import annotations

import json
import math

from envdoctor.export import Exporter
from envdoctor.model import Report

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any


def plain(value: Any) -> Any:
    """`value` as strict JSON data: NaN and infinities become null (JSON has no such
    numbers, and many parsers reject the `NaN` Python would write), keys become
    strings, tuples lists, anything else its text."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    return str(value)


def render(report: Report, options) -> str:
    return json.dumps(plain(report.to_dict()), indent=2, sort_keys=False, allow_nan=False) + "\n"


EXPORTER = Exporter(name="json", render=render, content_type="application/json", extension="json",
                    help="one JSON object, schema envdoctor.report/v1")
