"""How an output form declares itself, and how one is found by name.

An exporter is one file exposing `EXPORTER = Exporter(...)`, registered in the
`envdoctor.exporters` entry-point group exactly like a check (the built-ins in
envdoctor's own pyproject.toml), so a third party adds a format with one file and
one entry point, and `--format`'s choices come from the registrations, not from a
list kept by hand. Looking a format up loads only that one module: `check -f json`
never imports rich or prometheus_client.

Every exporter receives a report that is already redacted (pipeline.execute).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from envdoctor.check import Check
    from envdoctor.model import Report

GROUP = "envdoctor.exporters"


@dataclass
class ExportOptions:
    catalog: Mapping[str, "Check"] = field(default_factory=dict)  # id -> Check, for metric declarations
    fail_on: str = "fail"
    color: bool = False  # text only: ANSI colour (the CLI decides: a terminal and no NO_COLOR)
    width: int = 120  # text only


@dataclass(frozen=True)
class Exporter:
    name: str  # what --format takes
    render: Callable[["Report", ExportOptions], str]
    content_type: str = "text/plain; charset=utf-8"
    extension: str = "txt"  # for files written in this format
    help: str = ""  # one line for --help


class UnknownFormat(ValueError):
    """No exporter of that name, or it could not be loaded; the message says which."""


def names() -> list[str]:
    """Every registered format name, built-ins first (loads no exporter module)."""
    from envdoctor.registry import entry_points_of, plugins_enabled

    builtins_only = not plugins_enabled()
    return list(dict.fromkeys(ep.name for ep in entry_points_of(GROUP)
                              if not builtins_only or ep.value.startswith("envdoctor.")))


def get(name: str) -> Exporter:
    """The exporter registered as `name`; UnknownFormat with the choices otherwise."""
    from envdoctor.registry import entry_points_of

    for ep in entry_points_of(GROUP):
        if ep.name != name:
            continue
        try:
            obj: Any = ep.load()
        except BaseException as exc:  # a plug-in's import may raise anything
            raise UnknownFormat(f"format {name!r} ({ep.value}) could not be loaded: {type(exc).__name__}: {exc}") from None
        if not isinstance(obj, Exporter):
            raise UnknownFormat(f"format {name!r}: {ep.value} is a {type(obj).__name__}, not an envdoctor.export.Exporter")
        return obj
    raise UnknownFormat(f"unknown format {name!r}; choose from {', '.join(names())}")


def render(name: str, report: "Report", options: ExportOptions | None = None) -> str:
    return get(name).render(report, options or ExportOptions())
