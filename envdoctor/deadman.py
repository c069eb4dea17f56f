"""The last resort when a check never lets go of Python's interpreter lock.

The watchdog bounds a check that blocks (a hung read, a lock, a sleep) because a
blocked call releases the interpreter lock and the waiting thread wakes at its
deadline. A plug-in stuck inside one C call that holds the lock (a catastrophic
regular expression: `re.match(r'(a+)+$', 'a' * 40 + 'b')` runs for hours in
`_sre`) stops every Python thread: no deadline is noticed, no signal handler
runs, SIGTERM is ignored, and `check` or `serve` hangs for good.

Only a thread that needs no interpreter lock can see that: faulthandler's
watchdog, a C thread. A heartbeat from Python re-arms it every second; when no
Python thread has run for WEDGED_SECONDS, it writes every thread's stack to
stderr (naming the stuck plug-in's file and line) and ends the process with exit
status 1; if even that write cannot finish, SIGALRM ends it BACKSTOP_SECONDS
later. A service manager then restarts `serve` (the systemd unit restarts on
failure; a DaemonSet always). Armed only by envdoctor's own commands, never in a
training script (`preflight()`, `attach()`), whose process is the user's.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading

WEDGED_SECONDS = 20.0  # no Python thread ran for this long: the interpreter is wedged
BEAT_SECONDS = 1.0

_dump_fd: int | None = None


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


BACKSTOP_SECONDS = 10.0  # after the dump's deadline: SIGALRM ends a process whose dump cannot finish


def _backstop(seconds: float) -> None:
    """SIGALRM, left at its default action, ends the process in the kernel, with no Python
    and no write: the end when even the dump blocks (stderr a socket nobody reads, which
    cannot be reopened non-blocking; seen stuck in sock_alloc_send_pskb). Only while no
    one else has a use for SIGALRM."""
    if signal.getsignal(signal.SIGALRM) == signal.SIG_DFL:
        signal.setitimer(signal.ITIMER_REAL, seconds)


def beat() -> None:
    """Python is running: push the deadline WEDGED_SECONDS away again."""
    global _dump_fd
    if _dump_fd is None:
        _dump_fd = _open_dump_fd()
        # a plug-in that crashes the interpreter (SIGSEGV in its C code) is named by its stack
        # too, where it ended `check` or `serve` without a word (helper-85)
        try:
            faulthandler.enable(file=_dump_fd, all_threads=True)
        except (RuntimeError, ValueError, OSError):
            pass
    try:
        faulthandler.dump_traceback_later(WEDGED_SECONDS, exit=True, file=_dump_fd)
    except RuntimeError:  # no thread can be started (`ulimit -u`): no stack, but the backstop still ends a wedge
        pass
    _backstop(WEDGED_SECONDS + BACKSTOP_SECONDS)


def disarm() -> None:
    faulthandler.cancel_dump_traceback_later()
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
