"""The torch lines of each torch process's /proc/N/maps, kept from one run to the next.

Why: serve needs them every run, for discovery (a python process with libtorch
mapped is a workload) and for the torch facts (which torch folder, and whether its
files were replaced on disk since they were mapped). Reading a process's maps makes
the kernel print every mapping: ~0.2 ms for a CPU build of torch (350 lines), a few
ms for a CUDA build (~1 MiB), and it was the largest single cost of a run over 64
torch processes. What those lines say changes only when the process maps another
torch file, execs, or a mapped file is replaced; so they are read once and then
trusted while:
- the process is the one they were read from: the same pid, start time and stack
  start (/proc/N/stat; the stack moves at every exec under ASLR);
- each torch file they name is still the file it was when they were read (device,
  inode, size and mtime, by stat through /proc/N/root: a `pip install` over a
  running job fails this, and maps is read again, where it shows `(deleted)`);
- they were read less than RECHECK_SECONDS ago (a torch library loaded later, such
  as a lazily loaded CUDA one, is seen within that time).

Discovery reads /proc only (it never stats a file a process's mount namespace may
hold on a hung network mount): the stat comparison is done by `confirmed`, inside
the target's bounded torch facts.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from envdoctor.torchfacts import locate

RECHECK_SECONDS = 120.0  # 8 runs at the default 15 s interval


@dataclass
class _Entry:
    identity: tuple[bytes, bytes]  # (start time, stack start) from /proc/N/stat
    lines: str
    read_at: float
    files: tuple[tuple[str, Any], ...] | None = None  # (path, stat key) once confirmed after the read


def _stat_key(path: os.PathLike[str] | str) -> Any:
    try:
        st = os.stat(path)
    except OSError as exc:
        return ("missing", exc.errno)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class TorchMaps:
    """Per-daemon memory of torch processes' maps lines (see the module's docstring)."""

    def __init__(self, recheck_seconds: float = RECHECK_SECONDS, clock: Callable[[], float] = time.monotonic):
        self._entries: dict[int, _Entry] = {}
        self._lock = threading.Lock()
        self._recheck = recheck_seconds
        self._clock = clock
        self.reads = 0  # maps files read, for tests and benchmarks

    def lines(self, pid: int, identity: tuple[bytes, bytes], read: Callable[[], str | None]) -> str | None:
        """The process's torch lines: remembered ones while they may still be trusted,
        else `read()`'s (None: no libtorch mapped, nothing remembered)."""
        with self._lock:
            entry = self._entries.get(pid)
            # a stack start of 0 is hidden (no ptrace access): an exec could not be seen
            if (entry is not None and entry.identity == identity and identity[1] != b"0"
                    and self._clock() - entry.read_at < self._recheck):
                return entry.lines
        self.reads += 1
        lines = read()
        with self._lock:
            if lines is None:
                self._entries.pop(pid, None)
            else:
                self._entries[pid] = _Entry(identity, lines, self._clock())
        return lines

    def confirmed(self, pid: int, lines: str, seen_by: Callable[[str], Any]) -> bool:
        """Whether `lines` (as `lines()` gave them) still describe the process's torch files.
        The first call after a read records what the files are; later calls compare.
        False forgets them: the caller reads maps itself, and the next run again."""
        with self._lock:
            entry = self._entries.get(pid)
            if entry is None or entry.lines is not lines:
                return True  # not ours to judge: read by the caller this run
            files = entry.files
        paths = list(locate.mapped(lines))
        now = tuple((p, _stat_key(seen_by(p))) for p in paths)
        with self._lock:
            if files is None:
                entry.files = now
                return True
            if now == files:
                return True
            if self._entries.get(pid) is entry:
                del self._entries[pid]
        return False

    def keep_only(self, pids: set[int]) -> None:
        """Forget processes that are gone (or no longer looked at)."""
        with self._lock:
            for pid in [p for p in self._entries if p not in pids]:
                del self._entries[pid]

    def __len__(self) -> int:
        return len(self._entries)
