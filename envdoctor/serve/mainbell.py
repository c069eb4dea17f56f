"""The daemon's main thread, asleep until a signal, a stop or a run to watch over.

Why: the main thread runs Python's signal handlers (SIGTERM, SIGHUP) and beats the
deadman (envdoctor.deadman). It used to wake every second to do both, and each wake
of a thread that had slept for a second cost ~2.4 ms of CPU on the 2-CPU VM this was
measured on (a cold thread, cold caches; `Event.wait(1.0)` in a loop): half of serve's
CPU budget (0.5 % of a core) spent by a daemon with nothing to do. Now:

- a signal wakes it at once, whichever thread the kernel handed it to: Python's
  C-level handler writes to the wakeup fd (signal.set_wakeup_fd), which it waits on;
- while a run is in progress or calls are stuck (a check that may be spending CPU in
  Python), it beats every deadman.BEAT_SECONDS, as before: a check that burns CPU
  must not look like a wedged interpreter;
- otherwise it beats every IDLE_BEAT_SECONDS. An idle daemon spends no CPU, so the
  CPU-time deadline does not move; the real-time backstop is pushed that much further;
  the request handlers beat for the CPU they spend (deadman.refresh).
"""

from __future__ import annotations

import signal

from envdoctor.serve.bell import Bell

IDLE_BEAT_SECONDS = 60.0


class MainBell(Bell):
    """`with MainBell() as bell:` in the main thread, which then hears signals on it too;
    `bell.ring()` from any thread."""

    def __init__(self) -> None:
        super().__init__()
        self._previous: int | None = None

    def __enter__(self) -> "MainBell":
        try:
            self._previous = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        except ValueError:  # not the main thread (a test's daemon): signals are not ours to hear
            self._previous = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.set_wakeup_fd(self._previous)
        self.close()
