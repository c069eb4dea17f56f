"""Discovery within a deadline: a process whose /proc files hang the scan is left out.

Discovery reads /proc/N/maps and environ of the node's processes, and such a read waits
for the process's memory-map lock: a process in uninterruptible sleep (a job stuck in a
driver or on a dead NFS mount, with a thread waiting to map memory) can keep it waiting
for good, as it keeps `ps` waiting. Read on the scheduler's own thread, that stopped every
run of the daemon for good.

So each scan is a bounded call on the watchdog. When one does not return in time:
- stuck on one process's files (that read alone has lasted half the timeout): the
  process is left out, logged, named by /healthz (`discovery:pid:N`), and the scan starts
  again without it, ATTEMPTS scans a run at most; the process is examined again once
  the read returns. At most MAX_HUNG processes are left out so at once: each keeps a
  worker thread, and the watchdog starts no call at all past 64 stuck ones.
- otherwise (a step of its own, such as listing /proc, or a scan that is merely slow):
  the run fails saying where it was, and no scan is started beside it. The next run
  looks again: stuck on one process by then, that one is left out and the scans go on;
  stuck in the same step, the run fails naming it; returned, all is as before. A scan
  is never started again beside one that has not returned (helper-100: each run left
  one more thread behind, until the watchdog refused every call, the node's too).
The announce directories, any job's to write and perhaps on a network mount, are read
under a bound and a key of their own (BoundedAnnouncements): a hang there costs neither
the scan nor the jobs announced before.
"""

from __future__ import annotations

import itertools
import time

from envdoctor import log
from envdoctor.serve.discovery import DiscoveryFailed, Found
from envdoctor.watchdog import DONE, RAISED, Watchdog, describe_exception

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Callable, Container

KEY = "discovery"  # with the scan's number: the watchdog key of each scan
# numbered across the process: schedulers share the default watchdog (tests make many), and a
# scan of another under the same key would be answered "stuck" without running
_SCANS = itertools.count(1)
ATTEMPTS = 3
MAX_HUNG = 16
BLAME_SHARE = 0.5  # a process is blamed when the read of its files alone lasted this share of the timeout


class Progress:
    """Where a scan is: discover()'s `reading` is told each step's name, then each pid."""

    __slots__ = ("step", "pid", "since", "timeout", "started")

    def __init__(self, timeout: float) -> None:
        self.step = "starting"
        self.pid: int | None = None
        self.since = self.started = time.monotonic()
        self.timeout = timeout

    def __call__(self, what: int | str) -> None:
        self.since = time.monotonic()  # first: a new pid is never seen with the last one's time (helper-104)
        if isinstance(what, int):
            self.pid = what
        else:
            self.step, self.pid = what, None

    def stuck_on(self) -> int | None:
        """The process whose files it has been reading for BLAME_SHARE of its timeout, if any."""
        pid = self.pid
        return pid if pid is not None and time.monotonic() - self.since >= BLAME_SHARE * self.timeout else None

    def stuck_in_step(self) -> bool:
        return self.pid is None and time.monotonic() - self.since >= BLAME_SHARE * self.timeout

    def where(self) -> str:
        """What /healthz and the errors call it: `pid:N` only for a read that has lasted."""
        pid = self.stuck_on()
        return f"pid:{pid}" if pid is not None else self.step if self.pid is None else "slow scan"


class BoundedDiscovery:
    """One daemon's bounded scans, and the processes and steps they are stuck on."""

    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog
        self.hung: dict[int, tuple[str, int]] = {}  # pid -> the scan stuck reading its files now
        self._abandoned: dict[tuple[str, int], Progress] = {}  # scans past their timeout that have not returned
        self._late: tuple[str, int] | None = None  # an abandoned scan that blamed no process: none starts beside it
        self._said: set[int] = set()  # processes said hung and not yet examined again

    def find(self, scan: Callable[[set[int], Progress], Found], timeout: float, grace: float = 0.0,
             known: Container[str] = ()) -> Found:
        """`scan(processes to leave out, progress)`'s targets, each scan within `timeout`
        (+ `grace`: what a step bounded on its own, the announcements, may take of it).
        `known`: the labels the caller examined before (it says `target gone` for those).
        Raises DiscoveryFailed with the reason when no scan answered."""
        self._refresh()
        self._judge_late()
        blamed: list[int] = []
        for _ in range(ATTEMPTS):
            if len(self._abandoned) >= MAX_HUNG:  # each holds a thread, whichever process it waits on now
                raise DiscoveryFailed(f"{len(self._abandoned)} scans are stuck on processes' /proc files (pids "
                                      f"{_pids(self.hung)}): no scan is started until one returns (each holds a thread)")
            key = (KEY, next(_SCANS))
            progress = Progress(timeout)
            leave_out = set(self.hung)
            outcome = self.watchdog.call(key, lambda lo=leave_out, p=progress: scan(lo, p), timeout + grace)
            if outcome.kind == DONE:
                self._settle(outcome.value, known)
                return outcome.value
            if outcome.kind == RAISED and isinstance(outcome.error, DiscoveryFailed):
                raise outcome.error
            if outcome.kind == RAISED:  # a bug, or the watchdog refusing a call (too many stuck): said as discovery's
                raise DiscoveryFailed(f"discovery failed: {describe_exception(outcome.error)}")
            self._abandoned[key] = progress
            self._refresh()
            pid = progress.stuck_on()
            if pid is not None:
                blamed.append(pid)
            else:
                # Not one process's read (yet): the scan is slow, or stuck in a step of its own.
                # It is not started again beside itself: the next run judges it (_judge_late).
                self._late = key
                raise DiscoveryFailed(f"discovery did not return within {timeout + grace:g} s ({_doing(progress)}); no scan "
                                      "is started beside it: a later run names the process or step it stays stuck "
                                      "on, or goes on once it returns (if it keeps happening, the node is slow for "
                                      "`timeout`)")
        raise DiscoveryFailed(f"reads of {ATTEMPTS} processes' /proc files hung in one run (pids "
                              f"{_pids(dict.fromkeys(blamed))}); they are left out while their reads are stuck")

    def _judge_late(self) -> None:
        """A scan that ran past its timeout in an earlier run, blamed nobody and has not
        returned: now stuck on one process (left out, and scans go on without it), stuck
        in a step (the run fails, naming it), or still moving (the run fails; no second
        scan beside it)."""
        late = self._late
        progress = None if late is None else self._abandoned.get(late)
        if progress is None or progress.stuck_on() is not None:
            self._late = None
            return
        if progress.stuck_in_step():
            raise DiscoveryFailed(f"discovery is still stuck {progress.step} since an earlier run; no scan is "
                                  "started again until that one returns")
        raise DiscoveryFailed(f"discovery from an earlier run is still going, past its timeout ({_doing(progress)}); "
                              "no second scan is started beside it")

    def _refresh(self) -> None:
        """Which processes the scans that did not return are stuck on now: a scan that has
        returned is forgotten, and one that moved on from a process frees it (helper-101:
        a process whose read had returned stayed left out, counted and alerted on, while the
        same scan waited on another)."""
        if not self._abandoned:
            return
        stuck = self.watchdog.stuck()
        hung: dict[int, tuple[str, int]] = {}
        for key, progress in list(self._abandoned.items()):
            if key not in stuck:
                del self._abandoned[key]
                continue
            pid = progress.stuck_on()
            if pid is not None:
                hung[pid] = key
        for pid in hung.keys() - self._said:  # said once, until it is examined again (helper-102: a read
            self._said.add(pid)  # that outlasts each scan was said hung and "examined again" every run)
            log.event("warn", "process not examined: a read of its /proc files hung", target=f"pid:{pid}",
                      seconds=f"{time.monotonic() - self._abandoned[hung[pid]].since:.3g}",
                      reason="a process in uninterruptible sleep (D state) holding its memory-map lock does this; "
                             "it is examined again once the read returns")
        self.hung = hung  # swapped whole: HTTP threads read it

    def _settle(self, found: Found, known: Container[str]) -> None:
        """After a scan that answered, each process said hung that no scan waits on any more
        is closed with one line: examined again, or gone (the caller's `target gone` for a
        target it knew; here for one it never examined, helper-103)."""
        if not self._said:
            return
        examined = {t.pid for t in found.targets}
        for pid in list(self._said):
            if pid in self.hung:
                continue
            self._said.discard(pid)
            label = f"pid:{pid}"
            if pid in examined:
                if label in known:  # one never examined before is the caller's `target appeared` (helper-104)
                    log.event("info", "process examined again: the hung read of its /proc files returned", target=label)
            elif label not in known:
                log.event("info", "process no longer hung: the read of its /proc files returned, and it is not a "
                          "target (now)", target=label)

    def hung_labels(self) -> set[str]:
        return {f"pid:{pid}" for pid in list(self.hung)}

    def name(self, key: object) -> tuple[str, float] | None:
        """What /healthz calls a stuck scan: the process or step it is stuck on, or `slow
        scan` (its number means nothing to a reader), and since when (time.time()) it has
        been there, not the scan's own age (helper-103); None for a key that is not ours."""
        progress = self._abandoned.get(key)  # type: ignore[call-overload]
        if progress is None:
            return None
        since = progress.since
        where = progress.where()
        if where == "slow scan":  # moving from process to process: how long the scan has run (helper-104)
            since = progress.started
        return f"{KEY}:{where}", time.time() - (time.monotonic() - since)


def _doing(progress: Progress) -> str:
    if progress.pid is None:
        return f"stuck {progress.step}"
    return f"reading process {progress.pid}'s files for {time.monotonic() - progress.since:.2g} s"


ANNOUNCEMENTS_KEY = "discovery.announcements"  # with the reader's number (schedulers share the default watchdog)
_READERS = itertools.count(1)


class BoundedAnnouncements:
    """announced_pids within a bound, under a key of its own: the announce directory is any
    job's to write and may sit on a network mount. A read of it that hangs costs neither
    the scan nor the jobs announced before: until the directory answers again, the pids
    its last answer gave are kept while the same processes run under them (their start
    times say so), so a dead mount does not log them gone and throw their memory history
    away (helper-101). Said once when it starts and when it ends; /healthz names
    `discovery.announcements` while the read is stuck, and it is not started again then."""

    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog
        self.timeout = 1.0  # set by the caller for each run
        self._last: dict[int, int | None] = {}  # pid -> its start time, from the last answer
        self._failing = False
        self._key = (ANNOUNCEMENTS_KEY, next(_READERS))

    def read(self, dirs: list[str], procfs: Path) -> list[int]:
        from envdoctor.announce import announced_pids, start_ticks

        def read_and_keep() -> list[int]:
            pids = announced_pids(dirs, procfs)
            # kept here, on the worker: an answer that comes after the bound still counts for
            # the next run (helper-102: a slow directory's late answers were thrown away, and a
            # job announced after it slowed was never found)
            self._last = {pid: start_ticks(procfs, pid) for pid in pids}
            return pids

        outcome = self.watchdog.call(self._key, read_and_keep, self.timeout)
        if outcome.kind == DONE:
            if self._failing:
                log.event("info", "announcements read again")
                self._failing = False
            return outcome.value
        if not self._failing:
            log.event("warn", "announcements not read; the last ones are kept while their processes run",
                      reason=outcome.describe() if outcome.kind != RAISED else describe_exception(outcome.error),
                      dirs=", ".join(dirs))
            self._failing = True
        return [pid for pid, ticks in self._last.items() if ticks is not None and start_ticks(procfs, pid) == ticks]


def _pids(hung: dict[int, object]) -> str:
    return ", ".join(map(str, sorted(hung)))
