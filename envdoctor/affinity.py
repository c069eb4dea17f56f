"""Which CPUs a process may run on, and how many the machine has online.

The affinity mask (what `taskset` and a cpuset cgroup set) bounds how many threads
can run at once; OpenMP and BLAS runtimes size their default pools from it. It is
read from `sched_getaffinity` when the procfs root is this machine's live /proc,
and otherwise from `Cpus_allowed_list` in `<procfs>/<pid>/status`, which carries
the same mask, so fixture trees and `--path.procfs=/host/proc` work too.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from envdoctor.errors import ParseError
from envdoctor.paths import read_text

# Linux builds with at most 8192 CPUs (NR_CPUS); anything far beyond is not a cpu list.
MAX_CPU = 1 << 16


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse a kernel cpu list ("0-3,8,10-11", as in Cpus_allowed_list or
    /sys/devices/system/cpu/online) into the set of CPU numbers.

    An empty list (a cpuset with no CPUs, seen in cpuset.cpus of a fresh cgroup)
    is the empty set. Ranges must be ascending and within MAX_CPU.
    """
    if not isinstance(text, str):
        raise ParseError(f"cpu list must be text, got {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        return frozenset()
    cpus: set[int] = set()
    for part in stripped.split(","):
        part = part.strip()
        first, dash, last = part.partition("-")
        try:
            lo = _cpu_number(first)
            hi = _cpu_number(last) if dash else lo
        except ParseError:
            raise ParseError(f"{text!r} is not a cpu list like '0-3,8': bad element {part!r}") from None
        if hi < lo:
            raise ParseError(f"{text!r} is not a cpu list: range {part!r} runs backwards")
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def _cpu_number(text: str) -> int:
    text = text.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 30:
        raise ParseError(f"{text[:40]!r} is not a CPU number")
    value = int(text)
    if value >= MAX_CPU:
        raise ParseError(f"CPU number {value} is beyond {MAX_CPU}")
    return value


def parse_status_cpus_allowed(text: str) -> frozenset[int]:
    """The CPUs in the `Cpus_allowed_list:` line of /proc/N/status."""
    if not isinstance(text, str):
        raise ParseError(f"status must be text, got {type(text).__name__}")
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == "Cpus_allowed_list":
            return parse_cpulist(value)
    raise ParseError("no Cpus_allowed_list line in the status file")


@functools.lru_cache(maxsize=16)
def _is_live_procfs(procfs: Path) -> bool:
    """Whether `procfs` is this machine's live /proc (then the kernel is asked directly).
    Kept per root: resolving both paths took longer than the question it settles."""
    try:
        return Path(procfs).resolve() == Path("/proc").resolve() and Path("/proc/self").exists()
    except OSError:
        return False


# What this process may run on while serve keeps a run's threads on one CPU
# (serve.onecpu): that narrowing is the daemon's own, for the length of a run, and
# the node's CPUs are what it was narrowed from.
_own_while_narrowed: frozenset[int] | None = None


def narrowed(allowed: frozenset[int] | None) -> None:
    """Say that this process's threads are narrowed from `allowed` for now (None: no longer)."""
    global _own_while_narrowed
    _own_while_narrowed = allowed


def affinity(procfs: Path, pid: int | None) -> frozenset[int]:
    """The CPUs `pid` (None: this process) may run on.

    Raises OSError when the process cannot be examined (gone, or not ours to read)
    and ParseError when its status file does not say.
    """
    own = _own_while_narrowed
    if own is not None and (pid is None or pid == os.getpid()):
        return own
    if _is_live_procfs(procfs):
        return frozenset(os.sched_getaffinity(0 if pid is None else pid))
    who = "self" if pid is None else str(pid)
    return parse_status_cpus_allowed(read_text(Path(procfs) / who / "status"))


def online_cpus(sysfs: Path) -> int | None:
    """How many CPUs the machine has online (sysfs devices/system/cpu/online); None when unknown."""
    try:
        text = read_text(Path(sysfs) / "devices" / "system" / "cpu" / "online")
        count = len(parse_cpulist(text))
    except (OSError, ParseError):
        return None
    return count or None
