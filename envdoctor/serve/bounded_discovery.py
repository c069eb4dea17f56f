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
under a bound and a key of their own (bounded_announcements): a hang there costs the
announcements, not the scan.
"""

from __future__ import annotations

import time

from envdoctor import log
from envdoctor.serve.discovery import DiscoveryFailed, Found
from envdoctor.watchdog import DONE, RAISED, Watchdog, describe_exception

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Callable

KEY = "discovery"  # with the scan's number: the watchdog key of each scan
ATTEMPTS = 3
MAX_HUNG = 16
BLAME_SHARE = 0.5  # a process is blamed when the read of its files alone lasted this share of the timeout


class Progress:
    """Where a scan is: discover()'s `reading` is told each step's name, then each pid."""

    __slots__ = ("step", "pid", "since")

    def __init__(self) -> None:
        self.step = "starting"
        self.pid: int | None = None
        self.since = time.monotonic()

    def __call__(self, what: int | str) -> None:
        if isinstance(what, int):
            self.pid = what
        else:
            self.step, self.pid = what, None
        self.since = time.monotonic()


class BoundedDiscovery:
    """One daemon's bounded scans, and the processes and steps they are stuck on."""

    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog
        self.hung: dict[int, tuple[str, int]] = {}  # pid -> the stuck scan that was reading its files
        self._late: tuple[tuple[str, int], Progress] | None = None  # a scan past its timeout that blamed no process yet
        self._scans = 0

    def find(self, scan: Callable[[set[int], Progress], Found], timeout: float) -> Found:
        """`scan(processes to leave out, progress)`'s targets, each scan within `timeout`.
        Raises DiscoveryFailed with the reason when no scan answered."""
        self._forget_returned()
        self._judge_late(timeout)
        for _ in range(ATTEMPTS):
            if len(self.hung) >= MAX_HUNG:
                raise DiscoveryFailed(f"reads of {len(self.hung)} processes' /proc files are stuck (pids "
                                      f"{_pids(self.hung)}): no scan is started until one returns (each holds a thread)")
            self._scans += 1
            key = (KEY, self._scans)
            progress = Progress()
            leave_out = set(self.hung)
            outcome = self.watchdog.call(key, lambda: scan(leave_out, progress), timeout)
            if outcome.kind == DONE:
                return outcome.value
            if outcome.kind == RAISED and isinstance(outcome.error, DiscoveryFailed):
                raise outcome.error
            if outcome.kind == RAISED:  # a bug, or the watchdog refusing a call (too many stuck): said as discovery's
                raise DiscoveryFailed(f"discovery failed: {describe_exception(outcome.error)}")
            if not self._blame(key, progress, timeout, outcome.where):
                # Not one process's read (yet): the scan is slow, or stuck in a step of its own.
                # It is not started again beside itself: the next run judges it (_judge_late).
                self._late = (key, progress)
                what = (f"stuck {progress.step}" if progress.pid is None
                        else f"reading process {progress.pid}'s files for {time.monotonic() - progress.since:.2g} s")
                raise DiscoveryFailed(f"discovery did not return within {timeout:g} s ({what}); no scan is started "
                                      "beside it: a later run names the process or step it stays stuck on, or goes "
                                      "on once it returns (if it keeps happening, the node is slow for `timeout`)")
        raise DiscoveryFailed(f"reads of {ATTEMPTS} processes' /proc files hung in one run (pids "
                              f"{_pids(dict(list(self.hung.items())[-ATTEMPTS:]))}); they are left out while their "
                              "reads are stuck")

    def _blame(self, key: tuple[str, int], progress: Progress, timeout: float, where: str) -> bool:
        """Leave out the process a stuck scan has been reading for BLAME_SHARE of the timeout; False if none."""
        reading_for = time.monotonic() - progress.since
        pid = progress.pid
        if pid is None or reading_for < BLAME_SHARE * timeout:
            return False
        self.hung[pid] = key
        log.event("warn", "process not examined: a read of its /proc files hung", target=f"pid:{pid}",
                  seconds=f"{reading_for:.3g}", where=where,
                  reason="a process in uninterruptible sleep (D state) holding its memory-map lock does this; "
                         "it is examined again once the read returns")
        return True

    def _judge_late(self, timeout: float) -> None:
        """A scan that ran past its timeout in an earlier run and has not returned: now stuck
        on one process (left out; scans go on without it), stuck in a step (the run fails,
        naming it), or still moving (the run fails; no second scan beside it)."""
        if self._late is None:
            return
        key, progress = self._late
        if self._blame(key, progress, timeout, ""):
            self._late = None
            return
        if progress.pid is None and time.monotonic() - progress.since >= BLAME_SHARE * timeout:
            raise DiscoveryFailed(f"discovery is still stuck {progress.step} since an earlier run; no scan is "
                                  "started again until that one returns")
        raise DiscoveryFailed("discovery from an earlier run is still going, past its timeout (now "
                              + (f"{progress.step}" if progress.pid is None else f"reading process {progress.pid}'s files")
                              + "); no second scan is started beside it")

    def _forget_returned(self) -> None:
        """Processes and scans whose stuck read has returned since."""
        if not self.hung and self._late is None:
            return
        stuck = self.watchdog.stuck()
        if self._late is not None and self._late[0] not in stuck:
            self._late = None
        for pid, key in list(self.hung.items()):
            if key not in stuck:
                del self.hung[pid]
                log.event("info", "process examined again: the hung read of its /proc files returned", target=f"pid:{pid}")

    def hung_labels(self) -> set[str]:
        return {f"pid:{pid}" for pid in list(self.hung)}

    def name(self, key: object) -> tuple[str, str] | None:
        """What /healthz calls a stuck scan: the process or the step it is stuck on (its
        number means nothing to a reader); None for a key that is not one of ours."""
        for pid, hung_key in list(self.hung.items()):  # an HTTP thread asks: a copy in one step
            if hung_key == key:
                return (KEY, f"pid:{pid}")
        late = self._late
        if late is not None and late[0] == key:
            return (KEY, late[1].step if late[1].pid is None else f"pid:{late[1].pid}")
        return None


ANNOUNCEMENTS_KEY = ("discovery.announcements",)


def bounded_announcements(watchdog: Watchdog, timeout: float) -> Callable[[list[str], Path], list[int]]:
    """announced_pids within `timeout`, under a key of its own: the announce directory is
    any job's to write and may sit on a network mount. A read of it that hangs costs the
    announcements (discovery notes why, /healthz names `discovery.announcements`), not the
    scan, and it is not started again while it is stuck."""
    from envdoctor.announce import announced_pids

    def read(dirs: list[str], procfs: Path) -> list[int]:
        return watchdog.call(ANNOUNCEMENTS_KEY, lambda: announced_pids(dirs, procfs), timeout).unwrap()

    return read


def _pids(hung: dict[int, object]) -> str:
    return ", ".join(map(str, sorted(hung)))
