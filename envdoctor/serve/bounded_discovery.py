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
- stuck before any process (the announce directory on a dead mount, NVML, listing
  /proc): the run fails naming the step, and no scan is started again while that one
  is stuck (a new one would only hang beside it, a thread a run).
- merely slow (the timeout is too short for the node): the run fails saying so; no
  process is blamed for it.
"""

from __future__ import annotations

import time

from envdoctor import log
from envdoctor.serve.discovery import DiscoveryFailed, Found
from envdoctor.watchdog import DONE, RAISED, Watchdog, describe_exception

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
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
        self._stuck_step: tuple[tuple[str, int], str] | None = None  # a scan stuck before any process, and where
        self._scans = 0

    def find(self, scan: Callable[[set[int], Progress], Found], timeout: float) -> Found:
        """`scan(processes to leave out, progress)`'s targets, each scan within `timeout`.
        Raises DiscoveryFailed with the reason when no scan answered."""
        self._forget_returned()
        if self._stuck_step is not None:
            raise DiscoveryFailed(f"discovery is still stuck {self._stuck_step[1]} since an earlier run; "
                                  "no scan is started again until that one returns")
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
            reading_for = time.monotonic() - progress.since
            pid = progress.pid
            if pid is None:
                self._stuck_step = (key, progress.step)
                raise DiscoveryFailed(f"discovery did not return within {timeout:g} s: stuck {progress.step} "
                                      f"({outcome.where or 'where unknown'})")
            if reading_for < BLAME_SHARE * timeout:
                raise DiscoveryFailed(f"discovery took longer than its {timeout:g} s, and no one process held it up (the "
                                      f"last read began {reading_for:.2g} s before the end): the scan is slow for "
                                      "this timeout; raise `timeout` in the config")
            self.hung[pid] = key
            log.event("warn", "process not examined: a read of its /proc files hung", target=f"pid:{pid}",
                      seconds=f"{reading_for:.3g}", where=outcome.where,
                      reason="a process in uninterruptible sleep (D state) holding its memory-map lock does this; "
                             "it is examined again once the read returns")
        raise DiscoveryFailed(f"reads of {ATTEMPTS} processes' /proc files hung this run (pids "
                              f"{_pids(dict(list(self.hung.items())[-ATTEMPTS:]))}); the next run goes on without them")

    def _forget_returned(self) -> None:
        """Processes and steps whose stuck read has returned since."""
        if not self.hung and self._stuck_step is None:
            return
        stuck = self.watchdog.stuck()
        if self._stuck_step is not None and self._stuck_step[0] not in stuck:
            self._stuck_step = None
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
        step = self._stuck_step
        if step is not None and step[0] == key:
            return (KEY, step[1])
        return None


def _pids(hung: dict[int, object]) -> str:
    return ", ".join(map(str, sorted(hung)))
