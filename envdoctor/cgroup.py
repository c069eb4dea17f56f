"""How much CPU a process's cgroups allow it: cgroup v1 CFS quota and cgroup v2 cpu.max.

A container's CPU limit is a CFS quota, not fewer CPUs: `nproc`, `os.cpu_count()`
and the affinity mask still show every core of the host, and OpenMP, MKL and
torch size their thread pools from those. This module finds the quota the way
the kernel applies it:

1. `<procfs>/<pid>/cgroup` names the process's cgroup in each hierarchy
   (`4:cpu,cpuacct:/docker/abc` for v1, `0::/system.slice/x.scope` for v2). The
   kernel writes these paths relative to the *reader's* cgroup namespace.
2. A mount table says where each hierarchy is mounted and which part of it the
   mount shows (mountinfo's `root` field, also relative to the reader's cgroup
   namespace). The reader's own table (`<procfs>/self/mountinfo`) is tried first,
   its mount points resolved against the configured roots (`/sys/...` under the
   sysfs root, anything else under the rootfs root), so the same code reads this
   host, a host mounted at /host, or a fixture tree. When that view cannot see the
   target's cgroup directory (the reader lacks the mount), the target's own table
   is tried, its mount points resolved through `<procfs>/<pid>/root`.
3. From the target's cgroup directory up to the top of the mount, every level's
   `cpu.cfs_quota_us`/`cpu.cfs_period_us` (v1) or `cpu.max` (v2) is read; the
   kernel enforces every level, so the tightest one wins. Hosts with both (hybrid
   v1 + v2 mounts) are searched in both; v2 levels without the cpu controller
   simply have no cpu.max.

`cpu_limit(roots, pid)` and `effective_cpus(roots, pid)` never raise for missing
or unreadable files: they report what they could not read in `notes`, so the
system-facts section and `cpu.threads` can show a partial answer. The parsers
take text and raise ParseError (and nothing else) on anything that is not what
the kernel writes.
"""

from __future__ import annotations

import functools
import re
from collections import namedtuple
from pathlib import Path, PurePosixPath

from envdoctor.affinity import affinity, online_cpus
from envdoctor.paths import Roots, read_text
from envdoctor.errors import ParseError

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable

    Shared = Callable[[str, Callable[[], Any]], Any]  # a memo for one moment: key, compute -> value

# The kernel prints at most 20 digits for a u64; refusing longer runs keeps int()
# away from Python's 4300-digit guard and from absurd inputs.
_MAX_DIGITS = 20
_DEVICE = re.compile(r"^\d+:\d+$")
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")



# --------------------------------------------------------------------------- parsers


def _int(text: str, what: str) -> int:
    text = text.strip()
    digits = text[1:] if text.startswith("-") else text
    if not digits or not digits.isascii() or not digits.isdigit() or len(digits) > _MAX_DIGITS:
        raise ParseError(f"{what}: {text!r} is not an integer")
    return int(text)


class CgroupEntry(namedtuple("CgroupEntry", (
        "hierarchy",  # int: 0 is the cgroup v2 unified hierarchy
        "controllers",  # tuple[str, ...]: empty for v2; "name=systemd" for named v1 hierarchies
        "path",  # str: relative to the reader's cgroup namespace, starts with "/"
))):
    """One line of /proc/N/cgroup: `hierarchy-id:controllers:path`."""

    __slots__ = ()

    @property
    def is_v2(self) -> bool:
        return self.hierarchy == 0 and not self.controllers


def parse_proc_cgroup(text: str) -> tuple[CgroupEntry, ...]:
    """Parse /proc/N/cgroup. A path may itself contain ':', so only the first two split."""
    if not isinstance(text, str):
        raise ParseError(f"cgroup file must be text, got {type(text).__name__}")
    return _parse_proc_cgroup(text)


@functools.lru_cache(maxsize=256)
def _parse_proc_cgroup(text: str) -> tuple[CgroupEntry, ...]:
    """Kept by text: the processes of a node sit in a few cgroups, and serve parses each
    one's file every run (a dozen lines on a v1 host, ~50 us). The entries are frozen."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if "\0" in line:
            raise ParseError(f"cgroup line {number} holds a NUL byte")
        parts = line.split(":", 2)
        if len(parts) != 3:
            raise ParseError(f"cgroup line {number}: {line!r} is not 'hierarchy:controllers:path'")
        hierarchy = _int(parts[0], f"cgroup line {number} hierarchy id")
        if hierarchy < 0:
            raise ParseError(f"cgroup line {number}: negative hierarchy id {hierarchy}")
        controllers = tuple(c for c in parts[1].split(",") if c)
        path = parts[2]
        if not path.startswith("/"):
            raise ParseError(f"cgroup line {number}: path {path!r} is not absolute")
        entries.append(CgroupEntry(hierarchy, controllers, path))
    return tuple(entries)


class Mount(namedtuple("Mount", (
        "mount_id",  # int
        "parent_id",  # int
        "root",  # str: the part of the file system this mount shows ("/" or "/docker/abc")
        "mount_point",  # str
        "fstype",  # str
        "source",  # str
        "super_options",  # tuple[str, ...]: for cgroup v1: the controllers ("rw", "cpu", "cpuacct")
))):
    """One line of /proc/N/mountinfo (the fields this module needs)."""

    __slots__ = ()


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\040, \\011, \\012, \\134."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo_line(line: str) -> Mount:
    """Parse one mountinfo line:
    `36 35 98:0 /root /mnt rw,noatime master:1 - ext3 /dev/root rw,errors=continue`."""
    if "\0" in line:
        raise ParseError("mountinfo line holds a NUL byte")
    fields = line.split()
    try:
        sep = fields.index("-", 6)
    except ValueError:
        raise ParseError(f"mountinfo line {line!r} has no ' - ' separator after six fields") from None
    after = fields[sep + 1:]
    if not 1 <= len(after) <= 3:
        raise ParseError(f"mountinfo line {line!r} needs 'fstype source options' after ' - '")
    mount_id = _int(fields[0], "mountinfo mount id")
    parent_id = _int(fields[1], "mountinfo parent id")
    if mount_id < 0 or parent_id < 0:
        raise ParseError(f"mountinfo line {line!r} has a negative id")
    if not _DEVICE.match(fields[2]):
        raise ParseError(f"mountinfo line {line!r}: {fields[2]!r} is not major:minor")
    mount_point = _unescape(fields[4])
    if not mount_point.startswith("/"):
        raise ParseError(f"mountinfo line {line!r}: mount point {mount_point!r} is not absolute")
    return Mount(
        mount_id=mount_id,
        parent_id=parent_id,
        root=_unescape(fields[3]),
        mount_point=mount_point,
        fstype=after[0],
        source=_unescape(after[1]) if len(after) > 1 else "",
        super_options=tuple(o for o in (after[2].split(",") if len(after) > 2 else ()) if o),
    )


def parse_mountinfo(text: str) -> tuple[Mount, ...]:
    """Every mount of a mountinfo file. Processes in one mount namespace have the same
    table, and serve reads it for each of them every run (cpu.threads, shm.size, memory):
    a table seen recently is parsed once (immutable Mounts, so sharing is safe; a huge or
    hostile file is never kept)."""
    if not isinstance(text, str):
        raise ParseError(f"mountinfo must be text, got {type(text).__name__}")
    if len(text) <= _MEMO_TEXT_LIMIT:
        return _parse_mountinfo_memo(text)
    return _parse_mountinfo(text)


_MEMO_TEXT_LIMIT = 256 * 1024  # a container's table is a few KiB; a host's with many pods, tens


def _parse_mountinfo(text: str) -> tuple[Mount, ...]:
    return tuple(parse_mountinfo_line(line) for line in text.splitlines() if line.strip())


@functools.lru_cache(maxsize=8)
def _parse_mountinfo_memo(text: str) -> tuple[Mount, ...]:
    return _parse_mountinfo(text)


def parse_cpu_max(text: str) -> tuple[int | None, int]:
    """Parse cgroup v2 cpu.max: `max 100000` (no limit) or `200000 100000`
    (200 ms of CPU per 100 ms period = 2 CPUs). Returns (quota_us or None, period_us).
    A lone quota takes the kernel's default period of 100000 us."""
    if not isinstance(text, str):
        raise ParseError(f"cpu.max must be text, got {type(text).__name__}")
    tokens = text.split()
    if not 1 <= len(tokens) <= 2:
        raise ParseError(f"cpu.max {text!r} is not '<quota|max> <period>'")
    quota = None if tokens[0] == "max" else _int(tokens[0], "cpu.max quota")
    period = _int(tokens[1], "cpu.max period") if len(tokens) == 2 else 100000
    if quota is not None and quota <= 0:
        raise ParseError(f"cpu.max quota {quota} is not positive")
    if period <= 0:
        raise ParseError(f"cpu.max period {period} is not positive")
    return quota, period


def parse_cfs_quota(text: str) -> int | None:
    """Parse cgroup v1 cpu.cfs_quota_us: -1 means no limit, otherwise microseconds per period."""
    quota = _int(text, "cpu.cfs_quota_us")
    if quota == -1:
        return None
    if quota <= 0:
        raise ParseError(f"cpu.cfs_quota_us {quota} is neither -1 nor positive")
    return quota


def parse_cfs_period(text: str) -> int:
    period = _int(text, "cpu.cfs_period_us")
    if period <= 0:
        raise ParseError(f"cpu.cfs_period_us {period} is not positive")
    return period


# --------------------------------------------------------------------------- lookup


class CpuLimit(namedtuple("CpuLimit", (
        "quota_cpus",  # float | None: None: no quota (or none could be read: see source)
        "source",  # str: "cgroup v1", "cgroup v2", "none" (looked, found no quota), "unknown" (could not look)
        "path",  # str: the file that sets the limit, as opened ("" when none)
        "notes",  # tuple[str, ...] = (): what could not be read, and why
), defaults=((),))):
    """The tightest CPU quota over the target's cgroups."""

    __slots__ = ()

    def to_facts(self) -> dict:
        return {"quota_cpus": self.quota_cpus, "quota_source": self.source, "quota_path": self.path}


class EffectiveCpus(namedtuple("EffectiveCpus", (
        "cpus",  # float | None: None when nothing could be read
        "affinity",  # int | None: CPUs in the affinity mask
        "online",  # int | None: CPUs the machine has online
        "quota",  # CpuLimit
        "limited_by",  # str: "cgroup quota", "affinity", "online CPUs", "unknown"
        "notes",  # tuple[str, ...] = ()
), defaults=((),))):
    """How many CPUs the target can really use: min(affinity, quota)."""

    __slots__ = ()


def _who(pid: int | None) -> str:
    return "self" if pid is None else str(pid)


def _read(path: Path) -> str:
    return read_text(path)


def proc_cgroup_key(pid: int | None) -> str:
    """The run memo's name (`shared`) for the text of /proc/N/cgroup: serve's discovery has
    read it for the process's container labels, and puts it there for cpu_limit."""
    return f"proc.cgroup:{pid}"


def _relative(cgroup_path: str, mount_root: str) -> tuple[str, ...] | None:
    """The cgroup's path components below a mount that shows `mount_root`, or None
    when the cgroup is not inside what the mount shows."""
    parts = PurePosixPath(cgroup_path).parts[1:]
    root = PurePosixPath(mount_root).parts[1:] if mount_root.startswith("/") else None
    if root is None:
        return None
    if tuple(parts[: len(root)]) != tuple(root):
        return None
    # Both are shown relative to the reader's cgroup namespace: a cgroup outside it starts
    # with `..` (kernel cgroup-v2.rst, "Namespace"), and so does a mount of it, so the
    # prefix still matches (helper-96: a DaemonSet in its own cgroup namespace lost every
    # job's quota). What stays outside the mount after its root is not reachable through it.
    below = tuple(parts[len(root):])
    return None if ".." in below else below


def _matches(mount: Mount, entry: CgroupEntry, controller: str = "cpu") -> bool:
    if entry.is_v2:
        return mount.fstype == "cgroup2"
    return mount.fstype == "cgroup" and controller in mount.super_options


class _View:
    """A mount table and how to turn its mount points into paths we can open."""

    def __init__(self, name: str, mountinfo: Path, resolve):
        self.name, self.mountinfo, self.resolve = name, mountinfo, resolve


def _views(roots: Roots, pid: int | None) -> list[_View]:
    def under_roots(mount_point: str) -> Path:
        if mount_point == "/sys" or mount_point.startswith("/sys/"):
            return Path(roots.sysfs) / mount_point[len("/sys"):].lstrip("/")
        return Path(roots.rootfs) / mount_point.lstrip("/")

    views = [_View("reader", roots.proc(None, "mountinfo"), under_roots)]
    if pid is not None:
        views.append(_View("target", roots.proc(pid, "mountinfo"), lambda mp: roots.seen_by(pid, mp)))
    return views


def _mounts(view: _View, notes: list[str], cache: dict) -> tuple[Mount, ...] | None:
    if view.mountinfo not in cache:
        try:
            cache[view.mountinfo] = parse_mountinfo(_read(view.mountinfo))
        except OSError as exc:
            notes.append(f"cannot read {view.mountinfo}: {exc.strerror or exc}")
            cache[view.mountinfo] = None
        except ParseError as exc:
            notes.append(f"cannot parse {view.mountinfo}: {exc}")
            cache[view.mountinfo] = None
    return cache[view.mountinfo]


def _locate(entry: CgroupEntry, views: list[_View], notes: list[str],
            cache: dict | None = None, controller: str = "cpu") -> tuple[Path, tuple[str, ...]] | None:
    """(mount directory, components below it) of the entry's cgroup in the first view that can see it."""
    cache = {} if cache is None else cache
    for view in views:
        mounts = _mounts(view, notes, cache)
        if mounts is None:
            continue
        candidates: dict[tuple[str, tuple[str, ...]], int] = {}  # one stat per distinct place, not per mount line
        for mount in mounts:
            if not _matches(mount, entry, controller):
                continue
            rel = _relative(entry.path, mount.root)
            if rel is not None:
                key = (mount.mount_point, rel)
                candidates[key] = min(candidates.get(key, 0), -len(mount.root))
        for (mount_point, rel), _ in sorted(candidates.items(), key=lambda c: c[1]):
            base = view.resolve(mount_point)
            if base.joinpath(*rel).is_dir():
                return base, rel
    return None


def _level_limit(directory: Path, v2: bool, notes: list[str]) -> tuple[float, Path] | None:
    """The quota set at one cgroup level, in CPUs, or None when that level sets none."""
    try:
        if v2:
            file = directory / "cpu.max"
            quota, period = parse_cpu_max(_read(file))
        else:
            file = directory / "cpu.cfs_quota_us"
            quota = parse_cfs_quota(_read(file))
            if quota is None:
                return None
            period = parse_cfs_period(_read(directory / "cpu.cfs_period_us"))
    except FileNotFoundError:
        return None  # a v2 level without the cpu controller, or the v2 root: no limit here
    except OSError as exc:
        notes.append(f"cannot read {directory}: {exc.strerror or exc}")
        return None
    except ParseError as exc:
        notes.append(f"ignoring {directory}: {exc}")
        return None
    if quota is None:
        return None
    return quota / period, file


def cpu_limit(roots: Roots, pid: int | None, shared: Shared | None = None) -> CpuLimit:
    """The tightest CPU quota on the cgroup path of `pid` (None: this process), v1 and v2.

    Never raises for unreadable or malformed files: source is "unknown" and notes
    say why when nothing could be looked at, "none" when every hierarchy was
    searched and none sets a quota.

    `shared(key, compute)`, when given, is a memo for this moment (serve: one run's node
    facts). Processes whose /proc/N/cgroup says the same are in the same cgroups, and
    when our own mount table shows them, their quota is one answer, looked up once.
    """
    cgroup_file = roots.proc(pid, "cgroup")
    try:
        text = _read(cgroup_file) if shared is None else shared(proc_cgroup_key(pid), lambda: _read(cgroup_file))
        entries = parse_proc_cgroup(text)
    except OSError as exc:
        return CpuLimit(None, "unknown", "", (f"cannot read {cgroup_file}: {exc.strerror or exc}",))
    except ParseError as exc:
        return CpuLimit(None, "unknown", "", (f"cannot parse {cgroup_file}: {exc}",))

    # dict.fromkeys: a repeated line (a corrupt or hostile file) is looked up once, not once per copy
    relevant = list(dict.fromkeys(e for e in entries if e.is_v2 or "cpu" in e.controllers))
    if not relevant:
        return CpuLimit(None, "unknown", "", (f"{cgroup_file} lists no cpu or unified cgroup hierarchy",))
    views = _views(roots, pid)
    if shared is not None and pid is not None:
        # the reader's own view names no path of the target's, so its answer is every such process's
        seen = shared(f"cgroup.cpu_limit:{text}", lambda: _limit_over(relevant, views[:1], complete=True))
        if seen is not None:
            return seen
    return _limit_over(relevant, views)


def _limit_over(relevant: list[CgroupEntry], views: list[_View], complete: bool = False) -> CpuLimit | None:
    """The tightest quota over every relevant hierarchy, as `views` show them. complete:
    None unless every hierarchy was visible (the caller then asks the target's own view)."""
    notes: list[str] = []
    mount_tables: dict[Path, object] = {}  # each mountinfo read and parsed once per call, however many entries
    best: tuple[float, Path, str] | None = None
    looked_at: list[CgroupEntry] = []
    for entry in relevant:
        located = _locate(entry, views, notes, mount_tables)
        version = "cgroup v2" if entry.is_v2 else "cgroup v1"
        if located is None:
            if complete:
                return None
            notes.append(f"{version} cgroup {entry.path} is not visible through any mount")
            continue
        looked_at.append(entry)
        base, rel = located
        for depth in range(len(rel), -1, -1):  # from the target's cgroup up to the mount's top
            found = _level_limit(base.joinpath(*rel[:depth]), entry.is_v2, notes)
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], found[1], version)
    if best is not None:
        return CpuLimit(best[0], best[2], str(best[1]), tuple(notes))
    # "none" only when every hierarchy that can hold a quota was looked at: one that could not be
    # found may hold it. Where the cpu controller is on v1, the unified (v2) hierarchy holds no cpu
    # controller (a v1 container's "0::/" with no cgroup2 mounted: helper-98)
    on_v1 = any(not e.is_v2 for e in relevant)
    needed = [e for e in relevant if not (on_v1 and e.is_v2)]
    return CpuLimit(None, "none" if looked_at and all(e in looked_at for e in needed) else "unknown", "", tuple(notes))


def effective_cpus(roots: Roots, pid: int | None, shared: Shared | None = None) -> EffectiveCpus:
    """CPUs the target can use at once: the smaller of its affinity mask and its cgroup
    quota (falling back to the online count when the mask cannot be read). `shared`:
    see cpu_limit."""
    notes: list[str] = []
    try:
        mask: int | None = len(affinity(Path(roots.procfs), pid)) or None
    except (OSError, ParseError) as exc:
        mask = None
        notes.append(f"affinity of {_who(pid)} unknown: {getattr(exc, 'strerror', None) or exc}")
    def read_online() -> int | None:
        return online_cpus(Path(roots.sysfs))

    online = read_online() if shared is None else shared("cgroup.online_cpus", read_online)
    limit = cpu_limit(roots, pid, shared)
    notes.extend(limit.notes)

    candidates: list[tuple[float, str]] = []
    if mask is not None:
        candidates.append((float(mask), "affinity"))
    elif online is not None:
        candidates.append((float(online), "online CPUs"))
    if limit.quota_cpus is not None:
        candidates.append((limit.quota_cpus, "cgroup quota"))
    if not candidates:
        return EffectiveCpus(None, mask, online, limit, "unknown", tuple(notes))
    # On a tie the quota is named: it is the limit people forget.
    cpus, limited_by = min(candidates, key=lambda c: (c[0], c[1] != "cgroup quota"))
    return EffectiveCpus(cpus, mask, online, limit, limited_by, tuple(notes))


def cgroup_dirs(roots: Roots, pid: int | None, controller: str) -> tuple[list[tuple[str, Path, tuple[str, ...]]], list[str]]:
    """Where the target's cgroups for `controller` are, by the same resolution as the CPU
    quota: [(version, mount directory, components below it)], plus notes on what could
    not be seen. The v2 entry comes whenever the unified hierarchy is there (it may or
    may not hold the controller; the caller reads the files it needs)."""
    notes: list[str] = []
    cgroup_file = roots.proc(pid, "cgroup")
    try:
        entries = parse_proc_cgroup(_read(cgroup_file))
    except OSError as exc:
        return [], [f"cannot read {cgroup_file}: {exc.strerror or exc}"]
    except ParseError as exc:
        return [], [f"cannot parse {cgroup_file}: {exc}"]
    views = _views(roots, pid)
    found = []
    for entry in dict.fromkeys(entries):  # a repeated line is looked up once
        if not (entry.is_v2 or controller in entry.controllers):
            continue
        located = _locate(entry, views, notes, controller=controller)
        version = "cgroup v2" if entry.is_v2 else "cgroup v1"
        if located is None:
            notes.append(f"{version} cgroup {entry.path} is not visible through any mount")
            continue
        found.append((version, located[0], located[1]))
    return found, notes
