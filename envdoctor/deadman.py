"""The last resort when a check never lets go of Python's interpreter lock.

The watchdog bounds a check that blocks (a hung read, a lock, a sleep) because a
blocked call releases the interpreter lock and the waiting thread wakes at its
deadline. A plug-in stuck inside one C call that holds the lock (a catastrophic
regular expression: `re.match(r'(a+)+$', 'a' * 40 + 'b')` runs for hours in
`_sre`) stops every Python thread: no deadline is noticed, no signal handler
runs, SIGTERM is ignored, and `check` or `serve` hangs for good.

No Python thread can see that, so the kernel does: a CPU-time timer
(ITIMER_PROF) that a heartbeat from Python re-arms every second. Once the process
has spent WEDGED_SECONDS of CPU with no Python thread running, the timer's SIGPROF
reaches faulthandler's C handler, which writes every thread's stack to stderr
(naming the stuck plug-in's file and line) and hands the signal on to its default
action, which ends the process. A service manager then restarts `serve` (the systemd
unit restarts on failure; a DaemonSet always). If no CPU is spent at all (a C call
that blocks holding the lock) or the dump itself blocks, SIGALRM ends the process
BACKSTOP_SECONDS of real time after the last beat.

Why CPU time and not a wall clock (faulthandler's dump_traceback_later, before
2026-11-27): a process that is stopped burns no CPU. `kill -STOP`, `docker pause`, a
cgroup freeze (`systemctl freeze`), a debugger or a paused VM stopped the heartbeat
and the wall clock went on, so on thaw the watchdog found 20 s gone and ended a
healthy daemon (helper-89). Stopped for less than BACKSTOP_SECONDS, it now goes on.
Armed only by envdoctor's own commands, never in a training script (`preflight()`,
`attach()`), whose process is the user's; never where SIGPROF or SIGALRM already has
a use (a sampling profiler's), which the deadman then leaves alone.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading

WEDGED_SECONDS = 20.0  # CPU seconds spent with no Python thread running: the interpreter is wedged
BEAT_SECONDS = 1.0
BACKSTOP_SECONDS = 300.0  # real time after the last beat: ends a wedge that burns no CPU, or a dump that blocks

_dump_fd: int | None = None
_dump_on_sigprof: bool | None = None  # decided at the first beat: is SIGPROF ours to use?
_armed = False  # beat() since the last disarm(): refresh() re-arms only then
_backstop_after = BACKSTOP_SECONDS  # the last beat's backstop, which refresh() keeps
_lock = threading.Lock()  # beat, refresh and disarm from several threads (serve's)


def _open_dump_fd() -> int:
    """Where the stacks go: stderr, reopened as a new non-blocking description of the same
    file or pipe. Written through fd 2 itself, a full pipe nobody reads blocked the dump,
    and the process never reached its exit (seen: stuck in anon_pipe_write). A new
    description's O_NONBLOCK leaves fd 2's own writes blocking, as the rest expects.
    /dev/null when stderr is closed; fd 2 as it is when it cannot be reopened (a socket)."""
    try:
        return os.open("/proc/self/fd/2", os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:  # stderr is closed
        return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return 2


def _claim_sigprof(fd: int) -> bool:
    """faulthandler's C handler on SIGPROF: the stacks, then the default action (the end).
    Only if nothing else has a use for SIGPROF or its timer (a sampling profiler)."""
    if signal.getsignal(signal.SIGPROF) != signal.SIG_DFL or signal.getitimer(signal.ITIMER_PROF)[0]:
        return False
    try:
        faulthandler.register(signal.SIGPROF, file=fd, all_threads=True, chain=True)
    except (RuntimeError, ValueError, OSError):
        return False
    return True


def _backstop(seconds: float) -> None:
    """SIGALRM, left at its default action, ends the process in the kernel, with no Python
    and no write: the end when no CPU is spent (a C call blocked holding the lock) or the
    dump blocks (stderr a socket nobody reads, which cannot be reopened non-blocking; seen
    stuck in sock_alloc_send_pskb). Only while no one else has a use for SIGALRM."""
    if signal.getsignal(signal.SIGALRM) == signal.SIG_DFL:
        signal.setitimer(signal.ITIMER_REAL, seconds)


def beat(backstop_seconds: float | None = None) -> None:
    """Python is running: push both deadlines away again (arming them at the first beat).
    `backstop_seconds`: the real-time backstop from now, when the next beat may come later
    than BEAT_SECONDS (serve's idle main thread: BACKSTOP_SECONDS plus its wait, so a
    daemon stopped for less than BACKSTOP_SECONDS goes on, helper-105)."""
    with _lock:
        _beat(BACKSTOP_SECONDS if backstop_seconds is None else backstop_seconds)


def refresh() -> None:
    """beat(), from any thread, only while armed: serve's request handlers and runs call it,
    because its main thread sleeps while the daemon is idle (serve.mainbell), and a
    disarmed deadman (the daemon stopping) must stay so."""
    with _lock:
        if _armed:
            _beat(_backstop_after)


def _beat(backstop_seconds: float) -> None:
    global _dump_fd, _dump_on_sigprof, _armed, _backstop_after
    _armed = True
    _backstop_after = backstop_seconds
    if _dump_fd is None:
        _dump_fd = _open_dump_fd()
        # a plug-in that crashes the interpreter (SIGSEGV in its C code) is named by its stack
        # too, where it ended `check` or `serve` without a word (helper-85)
        try:
            faulthandler.enable(file=_dump_fd, all_threads=True)
        except (RuntimeError, ValueError, OSError):
            pass
    if _dump_on_sigprof is None:
        _dump_on_sigprof = _claim_sigprof(_dump_fd)
    if _dump_on_sigprof:
        signal.setitimer(signal.ITIMER_PROF, WEDGED_SECONDS)
    _backstop(backstop_seconds)


def disarm() -> None:
    """Both timers off, SIGPROF given back: the command is done with its plug-ins."""
    global _dump_on_sigprof, _armed
    with _lock:
        _armed = False
        if _dump_on_sigprof:
            signal.setitimer(signal.ITIMER_PROF, 0)
            faulthandler.unregister(signal.SIGPROF)
        _dump_on_sigprof = None
        _backstop(0)


class Heartbeat:
    """A thread that beats every BEAT_SECONDS until stopped (for commands whose main
    thread is busy running the checks); `with Heartbeat():` arms and disarms."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="envdoctor-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(BEAT_SECONDS):
            beat()

    def __enter__(self) -> "Heartbeat":
        beat()
        try:
            self._thread.start()
        except RuntimeError:  # can't start new thread: then no heartbeat either, and nothing armed
            disarm()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=BEAT_SECONDS + 1)
        disarm()
