"""Every thread of the daemon kept on one CPU while a run lasts, and let go after.

Why: a run hands work from thread to thread hundreds of times. Each check goes to a
watchdog thread and its answer comes back (so a hung read cannot hang the run), and
each target goes to a pool thread. The interpreter's lock lets only one of those
threads run at a time anyway. But left to the kernel, each handoff wakes the other
thread on another, idle CPU: an inter-processor interrupt, a CPU leaving its idle
state, cold caches; on a virtual machine each wakeup is also a trip to the
hypervisor. Measured with `benchmarks/serve_run_cpu.py` over 64 processes: on a
2-CPU VM, 85 ms of CPU a run on one CPU against 99-107 ms spread; on a 16-CPU GPU
node 144 against 202 ms (README, "Running the monitor"). Kept on the CPU the run started
on, a handoff is a plain switch there.

Letting go has to leave the daemon as free as if it had never asked. The kernel
remembers the last CPUs a thread asked for and, when its cpuset changes later, gives
it only those of them the cpuset allows (measured here, kernel 6.18: a process that
asked for CPU 0 in a cpuset of CPU 0 stayed on CPU 0 after the cpuset grew to 0-1).
Given back "the CPUs it had", a daemon in a Kubernetes shared pool would never use
CPUs the pool gained later. So a thread nobody narrowed (its CPUs were all its cpuset
allows) is given every CPU the machine may have, and follows its cpuset again; a
thread someone narrowed (`taskset`, systemd's CPUAffinity=) gets its own CPUs back;
and a thread someone moved while the run lasted (an admin's `taskset -a -p`, a cpuset
that dropped the run's CPU) is left where they put it, or set free if what they left
is exactly its cpuset (helper-63).

What the node's checks read as this process's CPUs (its affinity) stays what it was
allowed, not the one CPU of the run (`affinity.narrowed`): serve's node target is read
from the daemon's own process.

Only for the length of a run (~0.1 s every interval): between runs the daemon's
threads (the HTTP server's among them) may run anywhere they were allowed to, and
a CPU the training job keeps busy is not the daemon's for good. Where the kernel
refuses (a seccomp profile, a thread that just ended), nothing changes.
"""

from __future__ import annotations

import os
import threading

from envdoctor import affinity

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from types import TracebackType


def _thread_ids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        return []


def current_cpu(allowed: set[int]) -> int:
    """The CPU this thread is running on (field 39 of /proc/thread-self/stat), if it is
    one of `allowed`; else the lowest allowed."""
    try:
        with open("/proc/thread-self/stat", "rb") as f:
            cpu = int(f.read().rsplit(b")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return min(allowed)
    return cpu if cpu in allowed else min(allowed)


_possible: frozenset[int] | None = None


def possible_cpus() -> frozenset[int]:
    """Every CPU the machine may ever have (/sys/devices/system/cpu/possible): asked for,
    the kernel gives a thread those its cpuset allows, now and after the cpuset changes."""
    global _possible
    if _possible is None:
        try:
            with open("/sys/devices/system/cpu/possible") as f:
                _possible = affinity.parse_cpulist(f.read())
        except (OSError, ValueError):
            _possible = frozenset()
        if not _possible:
            _possible = frozenset(range(max(os.cpu_count() or 1, 1)))
    return _possible


def _get(tid: int) -> set[int] | None:
    try:
        return set(os.sched_getaffinity(tid))
    except OSError:  # the thread ended
        return None


def _set(tid: int, cpus: set[int] | frozenset[int]) -> bool:
    try:
        os.sched_setaffinity(tid, cpus)
        return True
    except OSError:  # the thread ended, or the kernel refuses
        return False


def cpuset_cpus() -> set[int] | None:
    """The CPUs this thread's cpuset allows, asked of the kernel: ask for every CPU, see
    what it gives. Leaves the calling thread free (not narrowed); None if refused."""
    if not _set(0, possible_cpus()):
        return None
    return _get(0)


class OneCpu:
    """`with OneCpu():` runs the block with every thread of this process on one CPU
    (the one the caller is on), then lets each go as the module says. A no-op where
    affinity cannot be set (not Linux) or only one CPU is allowed."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.cpu: int | None = None  # the run's CPU; None: nothing was pinned
        self._before: dict[int, set[int]] = {}  # each thread's CPUs before the run
        self._caller: set[int] = set()  # the caller's, for threads started during the run

    def __enter__(self) -> "OneCpu":
        if not self.enabled or not hasattr(os, "sched_setaffinity"):
            return self
        caller = _get(0)
        if caller is None or len(caller) < 2:
            return self
        before = {tid: cpus for tid in _thread_ids() for cpus in [_get(tid)] if cpus is not None}
        cpu = current_cpu(caller)
        affinity.narrowed(frozenset(caller))  # before: what the node's checks read is its CPUs, not the run's one
        pinned = [tid for tid in before if _set(tid, {cpu})]
        if not pinned:
            affinity.narrowed(None)
            return self
        self.cpu, self._before, self._caller = cpu, before, caller
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.cpu is None:
            return
        try:
            self._let_go()
        finally:
            self.cpu = None
            self._before = {}
            affinity.narrowed(None)

    def _let_go(self) -> None:
        pin = {self.cpu}
        me = threading.get_native_id()
        mine_now = _get(0)
        free = cpuset_cpus()  # what the cpuset allows now (this frees the caller meanwhile)
        for tid in _thread_ids():
            now = mine_now if tid == me else _get(tid)
            if now is None:
                continue
            before = self._before.get(tid, self._caller)  # a thread started during the run: the caller's
            if now != pin:  # someone moved it while the run lasted
                if free is not None and now == free:
                    _set(tid, possible_cpus())  # the cpuset's doing: follow the cpuset again
                elif tid == me:
                    _set(tid, now)  # the probe freed the caller: back to what they set
            elif free is not None and before == free:
                _set(tid, possible_cpus())  # nobody narrowed it: free, following its cpuset
            else:
                _set(tid, before)  # narrowed by someone (or the cpuset unknown): as it was
