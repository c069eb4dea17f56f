"""Find every check through the `envdoctor.checks` entry-point group.

Built-ins register through this same group (see pyproject.toml), so a third-party
check is loaded, listed, configured and run exactly like ours. A plug-in that
fails to import is recorded, not fatal: it shows up as an `error` row naming the
entry point, and the other checks run. ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1 loads
only envdoctor's own checks (as pytest's PYTEST_DISABLE_PLUGIN_AUTOLOAD does),
for when a broken plug-in must be ruled out.
"""

from __future__ import annotations

import os
import sys
from collections import namedtuple
from pathlib import Path

# importlib.metadata only on a cache miss: importing it is a seventh of a warm start
from envdoctor.entrypoints import EntryPoint, entry_points
from envdoctor.record import Record

from envdoctor.check import Check
from envdoctor.errors import STOP_SIGNALS

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable

GROUP = "envdoctor.checks"
BUILTIN_PREFIX = "envdoctor."
BUILTIN_MODULE_PREFIX = "envdoctor.checks."
DISABLE_AUTOLOAD_VAR = "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD"

# envdoctor's own checks that never run in exec, by entry point (each one's own `modes`
# says so; tests/test_registry_modes.py holds the two together). exec's pre-flight does not
# import them: ~4-5 ms of every container start. Their ids stay known (Registry.not_imported).
NOT_IN_EXEC = {
    "envdoctor.checks.dist_master_port:CHECK": "dist.master_port",
    "envdoctor.checks.memory_cache_growth:CHECK": "memory.cache_growth",
    "envdoctor.checks.onnx_opset:CHECK": "onnx.opset",
    "envdoctor.checks.preflight_live:CHECK": "preflight.live",
    "envdoctor.checks.torch_pin_memory:CHECK": "torch.pin_memory",
}
# Those that never run in serve, which the daemon does not import: their code stayed
# resident for weeks on every node, ~0.5 MiB of the daemon's RSS (measured over 64
# sleepers after 12 runs, two pairs alternately: RssAnon 20.8-20.9 against 21.4-21.5 MiB).
NOT_IN_SERVE = {
    "envdoctor.checks.dist_consistency:CHECK": "dist.consistency",
    "envdoctor.checks.dist_master_port:CHECK": "dist.master_port",
    "envdoctor.checks.onnx_opset:CHECK": "onnx.opset",
    "envdoctor.checks.preflight_live:CHECK": "preflight.live",
    "envdoctor.checks.torch_pin_memory:CHECK": "torch.pin_memory",
}
NOT_IN = {"exec": NOT_IN_EXEC, "serve": NOT_IN_SERVE}


class LoadFailure(namedtuple("LoadFailure", (
        "name",  # str: the entry point's name, normally the check id
        "value",  # str: "module:attr"
        "distribution",  # str
        "reason",  # str
        "row",  # str = "": the id its error row carries, when `name` is taken (see _row_ids)
), defaults=("",))):
    """An entry point that did not give us a usable Check."""

    __slots__ = ()

    @property
    def ids(self) -> frozenset[str]:
        """What --only, --skip and the config may call it: its entry point's name and its row's id."""
        return frozenset((self.name, self.row or self.name))


class Registry(Record):
    def __init__(
        self,
        checks: dict[str, Check],
        failures: list[LoadFailure],
        origins: dict[str, str],  # check id -> distribution that provides it
        # Plug-ins installed but not imported (ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1): their ids may
        # still be configured and skipped, or that advice broke every config that set them up.
        left_out: frozenset[str] = frozenset(),
        # envdoctor's checks that never run in the mode a load was for, not imported (NOT_IN)
        not_imported: frozenset[str] = frozenset(),
    ) -> None:
        self.checks = checks
        self.failures = failures
        self.origins = origins
        self.left_out = left_out
        self.not_imported = not_imported

    def get(self, check_id: str) -> Check | None:
        return self.checks.get(check_id)

    @property
    def ids(self) -> list[str]:
        return sorted(self.checks)

    @property
    def failure_ids(self) -> set[str]:
        return {i for f in self.failures for i in f.ids}

    @property
    def unloaded_ids(self) -> set[str]:
        """Ids that name no runnable check but are no typo either: plug-ins that failed to
        load, those left out, and (a load for exec or serve) envdoctor's checks that never
        run there; the config may set them up, --skip may name them."""
        return self.failure_ids | self.left_out | self.not_imported

    def failures_selected(self, only: Iterable[str] = (), skip: Iterable[str] = (),
                          disabled: Callable[[str], bool] = lambda _id: False) -> list[LoadFailure]:
        """The failures a run shows as rows: named by --only (when given), not by --skip, and
        not switched off in the config, by either of their ids."""
        only, skip = set(only), set(skip)
        return [f for f in self.failures
                if (not only or f.ids & only) and not f.ids & skip and not any(disabled(i) for i in f.ids)]


def _is_builtin(ep: EntryPoint) -> bool:
    return ep.value.startswith(BUILTIN_MODULE_PREFIX)


def unimported_check(check_id: str) -> Check | None:
    """One of envdoctor's own checks that a load for a mode left out (NOT_IN), imported now,
    or None for any other id. Not for running: serve gives each target a row saying that
    it does not run there when a config's `only` names it (a config shared with `check`),
    as it did when it imported every check."""
    for table in NOT_IN.values():
        for value, known_id in table.items():
            if known_id == check_id:
                import importlib

                module, _, attr = value.partition(":")
                obj = getattr(importlib.import_module(module), attr, None)
                return obj if isinstance(obj, Check) else None
    return None


def _distribution_name(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None)
    if name is None and _is_builtin(ep):
        return "envdoctor"  # declared in the source checkout's pyproject.toml
    return name or "unknown"


def _source_checkout_entry_points(group: str) -> list[EntryPoint]:
    """Built-in entry points declared in pyproject.toml, when envdoctor runs from its
    source checkout (installed or not): the same declarations an install registers,
    read where they are written, so a checkout needs no install to find its checks."""
    import envdoctor

    here = Path(envdoctor.__file__).resolve().parent
    pyproject = here.parent / "pyproject.toml"
    if not (here.parent / "checks" / "__init__.py").is_file() or not pyproject.is_file():
        return []
    try:
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover
            import tomli as tomllib
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        if data.get("project", {}).get("name") != "envdoctor":
            return []
        table = data["project"]["entry-points"].get(group, {})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    return [EntryPoint(name, value, group) for name, value in table.items()
            if isinstance(value, str) and value.startswith(BUILTIN_PREFIX)]


def entry_points_of(group: str) -> list[EntryPoint]:
    """Every entry point of `group`, built-ins first then by name, each (name, value) once.
    By name and value: two names for one object (a format's alias) are two entry points,
    and keyed on the value alone the second vanished without a word."""
    seen: set[tuple[str, str]] = set()
    out: list[EntryPoint] = []
    for ep in sorted([*_source_checkout_entry_points(group), *entry_points(group=group)],
                     key=lambda e: (not e.value.startswith(BUILTIN_PREFIX), e.name)):
        if (ep.name, ep.value) not in seen:  # the same distribution found twice on sys.path, or installed and checked out
            seen.add((ep.name, ep.value))
            out.append(ep)
    return out


PLUGIN_IMPORT_TIMEOUT = 5.0  # seconds all plug-in imports of one load may take together


def load_bounded(eps: list[EntryPoint], timeout: float = PLUGIN_IMPORT_TIMEOUT) -> dict[str, Any]:
    """Import plug-in entry points on the watchdog, all at once, under one deadline.

    A plug-in whose import blocks (a module that reads a FIFO, waits on a lock, or
    hangs on a dead network mount at import time) must not hang `check`, `checks`
    or `serve`: it becomes an Exception saying where it is stuck. Returns
    {entry point value: the object, or the exception (BaseException included) it
    raised or a TimeoutError}. A plug-in still stuck from an earlier load is not
    imported again. Built-ins are not passed here: they import in the caller's
    thread, as any module does.
    """
    import time

    from envdoctor.watchdog import RAISED, default_watchdog

    watchdog = default_watchdog()
    deadline = time.monotonic() + timeout
    # keyed by module: a module stuck importing for one entry point is stuck for all of them
    pending = [(ep, watchdog.start(("plugin-import", ep.module), ep.load)) for ep in eps]
    loaded: dict[str, Any] = {}
    for ep, call in pending:
        outcome = call.wait(deadline)
        if outcome.ok:
            loaded[ep.value] = outcome.value
        elif outcome.kind == RAISED:
            loaded[ep.value] = outcome.error
        else:
            at = f" (stuck at {outcome.where})" if outcome.where else ""
            what = (f"its import did not finish within {timeout:.3g} s" if outcome.kind == "timed_out"
                    else "its import is still stuck from an earlier attempt")
            loaded[ep.value] = TimeoutError(f"{what}{at}; {DISABLE_AUTOLOAD_VAR}=1 runs without plug-ins")
    return loaded


def plugins_enabled() -> bool:
    return os.environ.get(DISABLE_AUTOLOAD_VAR, "") in ("", "0")


def load(autoload_plugins: bool | None = None, importing: Callable[[list[EntryPoint]], None] | None = None,
         import_timeout: float = PLUGIN_IMPORT_TIMEOUT, listed: list[EntryPoint] | None = None,
         for_mode: str | None = None) -> Registry:
    """Every check. `importing` is told the plug-in entry points before their imports start,
    so a caller that may be killed during them (exec's pre-flight) can name them;
    `import_timeout` bounds those imports together (a caller with a smaller budget);
    `listed`: entry_points_of(GROUP) as the caller has just read it (exec's pre-flight
    child, moments before), not listed again (a directory scan and a stat per
    distribution, ~2 ms of every container start); `for_mode` ("exec", "serve"): envdoctor's
    checks that never run in that mode (NOT_IN) are not imported, only named in `not_imported`."""
    if autoload_plugins is None:
        autoload_plugins = plugins_enabled()
    checks: dict[str, Check] = {}
    origins: dict[str, str] = {}
    failures: list[LoadFailure] = []
    seen: set[tuple[str, str]] = set()
    eps = entry_points_of(GROUP) if listed is None else listed
    left_for_mode = NOT_IN.get(for_mode or "", {})
    not_imported = {left_for_mode[ep.value]: ep for ep in eps if _is_builtin(ep) and ep.value in left_for_mode}
    third_party = [ep for ep in eps if not _is_builtin(ep)] if autoload_plugins else []
    if third_party and importing is not None:
        importing(third_party)
    plugins = load_bounded(third_party, import_timeout) if third_party else {}
    for ep in eps:
        if (ep.name, ep.value) in seen:  # the same distribution found twice on sys.path
            continue
        seen.add((ep.name, ep.value))
        if not autoload_plugins and not _is_builtin(ep):
            continue
        if _is_builtin(ep) and left_for_mode.get(ep.value) in not_imported:
            continue
        dist = _distribution_name(ep)
        try:
            obj = plugins[ep.value] if ep.value in plugins else ep.load()
            if isinstance(obj, BaseException):
                raise obj
        except (*STOP_SIGNALS, KeyboardInterrupt):  # the user's SIGTERM or Ctrl-C during a built-in's import:
            # not its failure. KeyboardInterrupt too: a daemon serve re-executed has Python's own
            # SIGINT handler until it installs its own, and a Ctrl-C then was recorded as the
            # import's failure while the daemon went on (helper-105)
            raise
        except BaseException as exc:  # a plug-in's import may raise anything, even SystemExit
            failures.append(LoadFailure(ep.name, ep.value, dist, f"import failed: {type(exc).__name__}: {exc}"))
            continue
        if not isinstance(obj, Check):
            failures.append(LoadFailure(ep.name, ep.value, dist, f"{ep.value} is a {type(obj).__name__}, not an envdoctor.check.Check"))
            continue
        if obj.id in checks or obj.id in not_imported:
            provider = origins[obj.id] if obj.id in checks else _distribution_name(not_imported[obj.id])
            failures.append(LoadFailure(ep.name, ep.value, dist, f"check id {obj.id!r} is already provided by {provider}"))
            continue
        checks[obj.id] = obj
        origins[obj.id] = dist
    # each by its entry point's name and by the row id a failure of it would have (DIST:NAME),
    # which the README tells a user to switch off: that variable must not be "unknown" then
    left_out = frozenset() if autoload_plugins else frozenset(
        name for ep in eps if not _is_builtin(ep) for name in (ep.name, f"{_distribution_name(ep)}:{ep.name}"))
    return Registry(checks, _row_ids(failures, set(checks) | set(not_imported)), origins, left_out - set(checks),
                    frozenset(not_imported))


def _row_ids(failures: list[LoadFailure], taken: set[str]) -> list[LoadFailure]:
    """One row per id: a failure named like a loaded check (a plug-in registering `shm.size`)
    or like an earlier failure gets `distribution:name`, else its entry point. Two rows with
    one id were two Prometheus series with the same labels, and the textfile collector kept
    only one of them: the plug-in's error could hide the built-in's verdict."""
    out = []
    for failure in failures:
        for candidate in (failure.name, f"{failure.distribution}:{failure.name}", f"{failure.distribution}:{failure.value}"):
            row = candidate
            if candidate not in taken:
                break
        taken.add(row)
        out.append(failure._replace(row=row) if row != failure.name else failure)
    return out
