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


def _set_all(cpus: set[int]) -> int:
    """Every thread of this process allowed `cpus`; how many took it."""
    done = 0
    for tid in _thread_ids():
        try:
            os.sched_setaffinity(tid, cpus)
            done += 1
        except OSError:  # the thread ended since the listing, or the kernel refuses
            pass
    return done


class OneCpu:
    """`with OneCpu():` runs the block with every thread of this process on one CPU
    (the one the caller is on), then gives every thread back the CPUs the caller had.
    A no-op where affinity cannot be set (not Linux) or only one CPU is allowed."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.allowed: set[int] | None = None  # what is given back at the end; None: nothing was pinned
        self.cpu: int | None = None

    def __enter__(self) -> "OneCpu":
        if not self.enabled or not hasattr(os, "sched_setaffinity"):
            return self
        try:
            allowed = set(os.sched_getaffinity(0))
        except OSError:
            return self
        if len(allowed) < 2:
            return self
        cpu = current_cpu(allowed)
        affinity.narrowed(frozenset(allowed))  # before: what the node's checks read is its CPUs, not the run's one
        if _set_all({cpu}):
            self.allowed, self.cpu = allowed, cpu
        else:
            affinity.narrowed(None)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.allowed is not None:
            _set_all(self.allowed)
            self.allowed = None
            affinity.narrowed(None)
