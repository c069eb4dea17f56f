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
- each torch file they name is still the file that was mapped: the inode the maps
  line gives is the one a stat through /proc/N/root finds at that path (a `pip
  install` over a running job fails this, and maps is read again, where it shows
  `(deleted)`); a comparison with the maps line itself, not with a stat taken later,
  which a replacement between the read and that stat would have made the reference;
- the stack moves at exec: address-space randomisation is on, for the node
  (kernel.randomize_va_space) and for the process (no ADDR_NO_RANDOMIZE in its
  personality); otherwise its maps is read every run, as before;
- they were read less than RECHECK_SECONDS ago (a torch library loaded later, such
  as a lazily loaded CUDA one, is seen within that time).

Discovery reads /proc only (it never stats a file a process's mount namespace may
hold on a hung network mount): the stat comparison is done by `confirmed`, inside
the target's bounded torch facts.

The torch facts read from the files those lines name are kept with them (`facts`):
they are a function of the process image, of the files it mapped (what the lines
and their confirmation stand for) and of a few files it did not map (the site
directory a `pip install` beside torch changes, version.py, the venv's pyvenv.cfg),
whose stamps are compared every run. Working them out again every run (the folder
from the lines, a copy of the installation's facts, the interpreter and its venv)
was a tenth of a run's CPU over 64 torch processes. Read afresh with the lines: when
a mapped file is replaced, at another image, and at least every RECHECK_SECONDS.

A process with no torch (a `sleep` a selector picked, a JAX job NVML lists) is kept
too (`absent`): that answer took a read of its maps and a search of its PATH and its
interpreter's site directories, a quarter of a run's CPU over 64 such processes, and
it holds while the same image runs (start time and stack start, as above), the site
directories it searched are unchanged (a `pip install torch` there changes one), and
for less than RECHECK_SECONDS (a library that loads libtorch later is seen within that
time; a python process that imports torch is found by discovery's own read of its maps
in the next run).
"""

from __future__ import annotations

import os
import threading
import time

from envdoctor.record import Record

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable

RECHECK_SECONDS = 120.0  # 8 runs at the default 15 s interval


class _Entry(Record):
    def __init__(
        self,
        identity: tuple[bytes, bytes],  # (start time, stack start) from /proc/N/stat
        lines: str,
        read_at: float,
    ) -> None:
        self.identity = identity
        self.lines = lines
        self.read_at = read_at
        self.inodes: dict[str, int] | None = None  # mapped_inodes(lines), parsed on first use
        self.facts: tuple[Any, Any] | None = None  # (the torch facts these lines gave, their files' key)


class _Absent(Record):
    def __init__(
        self,
        identity: tuple[bytes, bytes],
        reason: str,
        searched: tuple[str, ...],
        key: Any,  # what the searched directories were when it was kept
        read_at: float,
    ) -> None:
        self.identity = identity
        self.reason = reason
        self.searched = searched
        self.key = key
        self.read_at = read_at


def mapped_inodes(lines: str) -> dict[str, int]:
    """{path: the inode mapped} for each file the maps lines name that was not deleted
    since (a `(deleted)` line already says what a check of it would find)."""
    found: dict[str, int] = {}
    for line in lines.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and not parts[5].endswith(" (deleted)"):
            try:
                found.setdefault(parts[5], int(parts[4]))
            except ValueError:
                found.setdefault(parts[5], -1)  # garbage never matches: maps is read again
    return found


_UNSEEN = object()


def _inode(path: Any) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


class TorchMaps:
    """Per-daemon memory of torch processes' maps lines (see the module's docstring)."""

    def __init__(self, recheck_seconds: float = RECHECK_SECONDS, clock: Callable[[], float] = time.monotonic):
        self._entries: dict[int, _Entry] = {}
        self._absent: dict[int, _Absent] = {}  # processes with no torch (`absent`)
        self._lock = threading.Lock()
        self._recheck = recheck_seconds
        self._clock = clock
        self._seen: dict[tuple[Any, str], int | None] = {}  # this run's inodes, per view and path (new_run)
        self.reads = 0  # maps files read, for tests and benchmarks
        self.stats = 0  # torch files stat'ed by `confirmed`, likewise

    def new_run(self) -> None:
        """Forget the inodes the last run found: a file replaced since is seen in this one."""
        self._seen = {}

    def lines(self, pid: int, identity: tuple[bytes, bytes], read: Callable[[], str | None],
              exec_visible: Callable[[], bool] = lambda: True) -> str | None:
        """The process's torch lines: remembered ones while they may still be trusted,
        else `read()`'s (None: no libtorch mapped, nothing remembered). `exec_visible()`:
        whether an exec would move the process's stack; if not, nothing is remembered."""
        with self._lock:
            entry = self._entries.get(pid)
            if entry is not None and entry.identity == identity and self._clock() - entry.read_at < self._recheck:
                return entry.lines
        self.reads += 1
        lines = read()
        # a stack start of 0 is hidden (no ptrace access): an exec could not be seen either
        keep = lines is not None and identity[1] != b"0" and exec_visible()
        with self._lock:
            if keep:
                self._entries[pid] = _Entry(identity, lines, self._clock())
            else:
                self._entries.pop(pid, None)
        return lines

    def confirmed(self, pid: int, lines: str, seen_by: Callable[[str], Any],
                  view: Callable[[], Any] = lambda: None) -> bool:
        """Whether `lines` (as `lines()` gave them) still describe the process's torch files:
        every file they name is still the inode that was mapped. False forgets them: the
        caller reads maps itself, and the next run again.

        `view()`: what decides which file a path names for the process (`Roots.file_view`),
        or None. Processes with the same view share this run's stat of each path: a CUDA
        build maps ~30 torch files, stat'ed through /proc/N/root for each of a job's
        processes every run (a third of the stat calls of a run over 64 of them)."""
        with self._lock:
            entry = self._entries.get(pid)
            if entry is None or entry.lines is not lines:
                return True  # not ours to judge: read by the caller this run
        if entry.inodes is None:
            entry.inodes = mapped_inodes(lines)
        where = view() if len(entry.inodes) > 2 else None  # a few syscalls: worth it only over more files
        seen = self._seen

        def inode_now(path: str) -> int | None:
            key = (where, path)
            found = seen.get(key, _UNSEEN) if where is not None else _UNSEEN
            if found is _UNSEEN:
                self.stats += 1
                found = _inode(seen_by(path))
                if where is not None:
                    seen[key] = found
            return found

        if all(inode_now(path) == inode for path, inode in entry.inodes.items()):
            return True
        with self._lock:
            if self._entries.get(pid) is entry:
                del self._entries[pid]
        return False

    def facts(self, pid: int, lines: str, work_out: Callable[[], Any], copy: Callable[[Any], Any],
              files_key: Callable[[Any], Any]) -> Any:
        """`work_out()`'s facts for the lines `confirmed` has just confirmed, worked out once
        for those lines and kept with them while `files_key(facts)` (the files they come
        from that are not mapped) is unchanged; `copy` makes what a caller may change of
        them. Lines not remembered here (read by the caller this run) are worked out every time."""
        with self._lock:
            entry = self._entries.get(pid)
            kept = None if entry is None or entry.lines is not lines else entry.facts
        if entry is not None and entry.lines is not lines:
            entry = None
        if kept is not None and files_key(kept[0]) == kept[1]:
            return copy(kept[0])
        facts = work_out()  # an exception is the caller's, and nothing is kept
        if entry is None:
            return facts
        key = files_key(facts)
        with self._lock:
            entry.facts = (facts, key)
        return copy(facts)

    def absent(self, pid: int, identity: tuple[bytes, bytes], work_out: Callable[[], Any],
               searched_key: Callable[[tuple[str, ...]], Any], exec_visible: Callable[[], bool]) -> Any:
        """`work_out()`'s torch facts for a process serve found no torch lines in. When it
        raised NoTorch, that answer is kept and raised again, without working it out, while
        the same image runs (`identity`: start time and stack start), `searched_key` of the
        directories it searched is unchanged and for less than RECHECK_SECONDS. Kept only
        where an exec would be seen (`exec_visible()`, as for the lines)."""
        from envdoctor.torchfacts import NoTorch

        with self._lock:
            entry = self._absent.get(pid)
        if (entry is not None and entry.identity == identity and self._clock() - entry.read_at < self._recheck
                and searched_key(entry.searched) == entry.key):
            raise NoTorch(entry.reason, entry.searched)
        read_at = self._clock()
        try:
            facts = work_out()
        except NoTorch as exc:
            keep = bool(identity[0]) and identity[1] != b"0" and exec_visible()
            # the directories' key after the search: one changed during it is seen at the recheck
            kept = _Absent(identity, str(exc), exc.searched, searched_key(exc.searched), read_at) if keep else None
            with self._lock:
                if kept is not None:
                    self._absent[pid] = kept
                else:
                    self._absent.pop(pid, None)
            raise
        with self._lock:
            self._absent.pop(pid, None)
        return facts

    def keep_only(self, pids: set[int]) -> None:
        """Forget processes that are gone (or no longer looked at)."""
        with self._lock:
            for pid in [p for p in self._entries if p not in pids]:
                del self._entries[pid]
            for pid in [p for p in self._absent if p not in pids]:
                del self._absent[pid]

    def __len__(self) -> int:
        return len(self._entries)
