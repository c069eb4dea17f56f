"""Output forms, one file per format; installed as envdoctor.exporters.

Each format module has `render(report, options) -> str`. They receive reports that
are already redacted (envdoctor.pipeline does that once), so no exporter needs to
know about secrets.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Mapping

from envdoctor.check import Check
from envdoctor.model import Report

FORMATS = ("text", "json", "markdown", "junit", "prometheus")


@dataclass
class ExportOptions:
    catalog: Mapping[str, Check] = field(default_factory=dict)  # id -> Check, for metric declarations
    fail_on: str = "fail"
    color: bool = False  # text only: ANSI colour (the CLI decides: a terminal and no NO_COLOR)
    width: int = 120  # text only


def render(fmt: str, report: Report, options: ExportOptions | None = None) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    module = importlib.import_module(f"envdoctor.exporters.{fmt}_format")
    return module.render(report, options or ExportOptions())
