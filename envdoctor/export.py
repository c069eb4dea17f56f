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

from envdoctor.record import Record, Value

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping

    from envdoctor.check import Check
    from envdoctor.model import Report

GROUP = "envdoctor.exporters"


class ExportOptions(Record):
    def __init__(
        self,
        catalog: Mapping[str, "Check"] | None = None,  # id -> Check, for metric declarations
        fail_on: str = "fail",
        color: bool = False,  # text only: ANSI colour (the CLI decides: a terminal and no NO_COLOR)
        width: int = 120,  # text only
        title: str = "envdoctor",  # compact only: who speaks ("envdoctor preflight", "envdoctor exec")
        notes: tuple[str, ...] = (),  # compact only: lines under the summary (a config that was ignored)
    ) -> None:
        self.catalog = {} if catalog is None else catalog
        self.fail_on = fail_on
        self.color = color
        self.width = width
        self.title = title
        self.notes = notes


class Exporter(Value):
    def __init__(
        self,
        name: str,  # what --format takes
        render: Callable[["Report", ExportOptions], str],
        content_type: str = "text/plain; charset=utf-8",
        extension: str = "txt",  # for files written in this format
        help: str = "",  # one line for --help
    ) -> None:
        self.name = name
        self.render = render
        self.content_type = content_type
        self.extension = extension
        self.help = help


class FormatError(ValueError):
    """A format could not give the report; the message says which and why (one line, exit 2)."""


class UnknownFormat(FormatError):
    """No exporter of that name, or it could not be loaded; the message says which."""


PLUGIN_RENDER_TIMEOUT = 10.0  # seconds a plug-in format may take to render one report


def names() -> list[str]:
    """Every registered format name, built-ins first (loads no exporter module)."""
    from envdoctor.registry import entry_points_of, plugins_enabled

    builtins_only = not plugins_enabled()
    return list(dict.fromkeys(ep.name for ep in entry_points_of(GROUP)
                              if not builtins_only or ep.value.startswith("envdoctor.")))


def get(name: str) -> Exporter:
    """The exporter registered as `name`; UnknownFormat with the choices otherwise."""
    from envdoctor.errors import STOP_SIGNALS
    from envdoctor.registry import entry_points_of, load_bounded

    for ep in entry_points_of(GROUP):
        if ep.name != name:
            continue
        try:
            # a plug-in exporter imports under a bound, as plug-in checks do
            obj: Any = ep.load() if ep.value.startswith("envdoctor.") else load_bounded([ep])[ep.value]
            if isinstance(obj, BaseException):
                raise obj
        except STOP_SIGNALS:  # the user's SIGTERM or Ctrl-C while a built-in format imports
            raise
        except BaseException as exc:  # a plug-in's import may raise anything
            raise UnknownFormat(f"format {name!r} ({ep.value}) could not be loaded: {type(exc).__name__}: {exc}") from None
        if not isinstance(obj, Exporter):
            raise UnknownFormat(f"format {name!r}: {ep.value} is a {type(obj).__name__}, not an envdoctor.export.Exporter")
        return obj
    raise UnknownFormat(f"unknown format {name!r}; choose from {', '.join(names())}")


def render(name: str, report: "Report", options: ExportOptions | None = None) -> str:
    """The report in format `name`. A plug-in's render runs in a forked child under a
    deadline (envdoctor.forked), as exec's pre-flight does: one that raises (SystemExit
    too), hangs, wedges the interpreter in C, calls os._exit or returns anything but text
    is a FormatError naming it, and nothing has been written yet. In a thread, os._exit(0)
    ended envdoctor with exit 0 and no report, and a wedge took the deadman's 20 s."""
    exporter = get(name)
    options = options or ExportOptions()
    module = getattr(exporter.render, "__module__", None) or "?"
    if module.startswith("envdoctor."):
        return exporter.render(report, options)
    from envdoctor import forked
    from envdoctor.redact import writable

    def in_child(send: Any) -> dict[str, str]:
        value = exporter.render(report, options)
        if not isinstance(value, str):
            return {"not_text": type(value).__name__}
        return {"text": str.__str__(value)}  # a plain str: a subclass's own encode() never runs

    outcome = forked.call(in_child, PLUGIN_RENDER_TIMEOUT, what="its render process", quiet=True)
    where = f"format {name!r} ({module})"
    if outcome.kind == forked.TIMED_OUT:
        raise FormatError(f"{where} did not render within {PLUGIN_RENDER_TIMEOUT:g} s (its process was killed)")
    if outcome.kind != forked.DONE:
        raise FormatError(f"{where} broke while rendering: {outcome.error}")
    answer = outcome.value if isinstance(outcome.value, dict) else {}
    if "text" not in answer:
        raise FormatError(f"{where} returned {answer.get('not_text', '?')}, not text (a bug in the plug-in)")
    return writable(answer["text"])  # lone surrogates spelled \xNN, as in every other output
