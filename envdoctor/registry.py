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
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from envdoctor.check import Check

GROUP = "envdoctor.checks"
BUILTIN_MODULE_PREFIX = "envdoctor.checks."
DISABLE_AUTOLOAD_VAR = "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD"


@dataclass(frozen=True)
class LoadFailure:
    """An entry point that did not give us a usable Check."""

    name: str  # the entry point's name, normally the check id
    value: str  # "module:attr"
    distribution: str
    reason: str


@dataclass
class Registry:
    checks: dict[str, Check]
    failures: list[LoadFailure]
    origins: dict[str, str]  # check id -> distribution that provides it

    def get(self, check_id: str) -> Check | None:
        return self.checks.get(check_id)

    @property
    def ids(self) -> list[str]:
        return sorted(self.checks)


def _is_builtin(ep: EntryPoint) -> bool:
    return ep.value.startswith(BUILTIN_MODULE_PREFIX)


def _distribution_name(ep: EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return getattr(dist, "name", None) or "unknown"


def load(autoload_plugins: bool | None = None) -> Registry:
    if autoload_plugins is None:
        autoload_plugins = os.environ.get(DISABLE_AUTOLOAD_VAR, "") in ("", "0")
    checks: dict[str, Check] = {}
    origins: dict[str, str] = {}
    failures: list[LoadFailure] = []
    seen_values: set[str] = set()
    for ep in sorted(entry_points(group=GROUP), key=lambda e: (not _is_builtin(e), e.name)):
        if ep.value in seen_values:  # the same distribution found twice on sys.path
            continue
        seen_values.add(ep.value)
        if not autoload_plugins and not _is_builtin(ep):
            continue
        dist = _distribution_name(ep)
        try:
            obj = ep.load()
        except BaseException as exc:  # a plug-in's import may raise anything, even SystemExit
            failures.append(LoadFailure(ep.name, ep.value, dist, f"import failed: {type(exc).__name__}: {exc}"))
            continue
        if not isinstance(obj, Check):
            failures.append(LoadFailure(ep.name, ep.value, dist, f"{ep.value} is a {type(obj).__name__}, not an envdoctor.check.Check"))
            continue
        if obj.id in checks:
            failures.append(LoadFailure(ep.name, ep.value, dist, f"check id {obj.id!r} is already provided by {origins[obj.id]}"))
            continue
        checks[obj.id] = obj
        origins[obj.id] = dist
    return Registry(checks, failures, origins)
