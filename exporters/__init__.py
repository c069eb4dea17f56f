"""Output forms, one file per format; installed as envdoctor.exporters.

Each format module exposes `EXPORTER = envdoctor.export.Exporter(...)` and is
registered in the `envdoctor.exporters` entry-point group (see pyproject.toml),
the same way a third-party format would be. They receive reports that are already
redacted (envdoctor.pipeline does that once), so no exporter needs to know about
secrets.
"""

from __future__ import annotations

from envdoctor.export import ExportOptions, Exporter, get, names, render

__all__ = ["ExportOptions", "Exporter", "get", "names", "render", "FORMATS"]

FORMATS = ("text", "json", "markdown", "junit", "prometheus")  # the built-ins, for tests and docs
