"""Entry points of envdoctor's groups, without importing importlib.metadata when nothing changed.

Why: importing importlib.metadata (it pulls in email, zipfile, csv...) and scanning
every distribution costs 12-17 ms, about a seventh of a warm `envdoctor check`.
The table changes only when a distribution is installed, removed or rewritten,
and each of those adds, removes or rewrites a *.dist-info (or *.egg-info) folder's
entry_points.txt in a directory on sys.path. So the table of every `envdoctor.*`
group is cached (envdoctor.diskcache), keyed on the interpreter, each sys.path
entry (a zip or egg file: its mtime), and the name of every distribution folder in
it with the mtime and size of its entry_points.txt: a hit costs one directory
listing per path entry and a few stat() calls. A miss,
or ENVDOCTOR_NO_CACHE=1, asks importlib.metadata as before.

The entry points handed out here have what the registry uses of
importlib.metadata.EntryPoint: name, value, group, dist.name and load().
"""

from __future__ import annotations

import importlib
import os
import sys
from types import SimpleNamespace

from envdoctor import diskcache

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any

SCHEMA = "envdoctor.entry-points-cache/v1"
PREFIX = "envdoctor."


class EntryPoint:
    """name = module:attr in a group, and the distribution that declared it.
    (A plain class: a dataclass costs ~0.4 ms to create at import, on every start.)"""

    __slots__ = ("name", "value", "group", "dist_name")

    def __init__(self, name: str, value: str, group: str, dist_name: str | None = None):
        self.name, self.value, self.group, self.dist_name = name, value, group, dist_name

    def __repr__(self) -> str:
        return f"EntryPoint(name={self.name!r}, value={self.value!r}, group={self.group!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EntryPoint) and (self.name, self.value, self.group) == (other.name, other.value, other.group)

    def __hash__(self) -> int:
        return hash((self.name, self.value, self.group))

    @property
    def dist(self) -> Any:
        return SimpleNamespace(name=self.dist_name) if self.dist_name else None

    @property
    def module(self) -> str:
        return self.value.partition(":")[0].strip()

    def load(self) -> Any:
        """The object named by `module:attr.attr`, as importlib.metadata loads it."""
        module, _, attrs = self.value.partition(":")
        obj = importlib.import_module(module.strip())
        for part in attrs.strip().split("."):
            if part:
                obj = getattr(obj, part)
        return obj


def _cwd() -> str | None:
    """The working directory, or None when it was removed under us (getcwd raises then:
    every command run from a deleted directory broke here, before any check ran)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def _search_path() -> list[str]:
    """sys.path with '' spelled as the working directory it means (python -c); '' and
    relative entries are left out when that directory is gone (they name nothing then)."""
    cwd = _cwd()
    if cwd is None:
        return [os.path.normpath(p) for p in sys.path if os.path.isabs(p)]
    return [os.path.normpath(os.path.join(cwd, p)) if p else cwd for p in sys.path]  # = abspath, getcwd once


def _fingerprint() -> list[Any]:
    key: list[Any] = [sys.executable, sys.version]
    for entry in _search_path():
        try:
            st = os.stat(entry)
            listing = os.scandir(entry) if os.path.isdir(entry) else None
        except OSError:
            key.append([entry, None])
            continue
        files = []
        if listing is not None:
            with listing:
                for item in listing:
                    if item.name.endswith((".dist-info", ".egg-info")):
                        try:
                            ep = os.stat(os.path.join(item.path, "entry_points.txt"))
                            files.append([item.name, ep.st_mtime_ns, ep.st_size])
                        except OSError:
                            files.append([item.name, None])
        # a folder is keyed on its distributions, not its own mtime: the working
        # directory ('' on sys.path) changes all the time, our cache folder included
        key.append([entry, None if listing is not None else st.st_mtime_ns, sorted(files)])
    return key


def _live() -> dict[str, list[list[str | None]]]:
    from importlib.metadata import entry_points

    table: dict[str, list[list[str | None]]] = {}
    found: Any = entry_points()  # 3.10-3.11 SelectableGroups, 3.12+ EntryPoints: both have .groups and .select
    for group in sorted(g for g in found.groups if g.startswith(PREFIX)):
        for ep in found.select(group=group):
            dist = getattr(getattr(ep, "dist", None), "name", None)
            table.setdefault(group, []).append([ep.name, ep.value, dist])
    return table


def _is_table(table: Any) -> bool:
    """What _live() writes: each group a list of [name, value, distribution or None] rows."""
    return all(isinstance(rows, list) and all(
        isinstance(row, list) and len(row) in (2, 3) and isinstance(row[0], str) and isinstance(row[1], str)
        and (len(row) == 2 or row[2] is None or isinstance(row[2], str)) for row in rows) for rows in table.values())


def _cache_file() -> Any:
    # one file per interpreter and search path: `python -c` ('' first) and the
    # `envdoctor` script (its bin/ first) do not evict each other's entry
    # (the working directory is left out of the name, or every directory the
    # command is run from would leave a file behind; it stays in the fingerprint)
    cwd = _cwd()
    key = "\0".join([sys.executable, *(p for p in _search_path() if p != cwd)])
    return diskcache.entry_file("entry-points", key)


def entry_points(group: str) -> list[EntryPoint]:
    """The installed entry points of `group` (one of envdoctor's), in discovery order."""
    if not group.startswith(PREFIX):
        raise ValueError(f"only envdoctor's groups are cached, not {group!r}")
    table = None
    if diskcache.enabled():
        key = _fingerprint()
        path = _cache_file()
        table = diskcache.read(path, SCHEMA, key)
        if table is not None and not _is_table(table):
            table = None  # a damaged entry (helper-93: a group's rows an int, and every command a traceback): read again
        if table is None:
            table = _live()
            diskcache.write(path, SCHEMA, key, table)
    else:
        table = _live()
    rows = table.get(group) or []
    return [EntryPoint(str(r[0]), str(r[1]), group, r[2] if len(r) > 2 else None) for r in rows
            if isinstance(r, list) and len(r) >= 2]
