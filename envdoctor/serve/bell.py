"""A pipe one thread waits on and any thread rings: how serve's sleeping threads are woken.

serve's accept loop and main thread sleep until something happens, never on a timer
(a wake of a thread that slept costs up to ~2.4 ms of CPU on a VM: serve.mainbell).
A pipe is what select() waits on beside sockets and the signal wakeup fd.
"""

from __future__ import annotations

import os
import select


class Bell:
    def __init__(self) -> None:
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def fileno(self) -> int:
        """The end to wait on (select, a selector)."""
        return self._r

    def ring(self) -> None:
        try:
            os.write(self._w, b"\0")
        except OSError:  # full (it is ringing already), or closed
            pass

    def drain(self) -> None:
        """Hear every ring so far: the next wait sleeps again."""
        try:
            while os.read(self._r, 512):
                pass
        except OSError:  # empty (EAGAIN), or closed
            pass

    def wait(self, seconds: float | None) -> None:
        """Until rung (or a byte is written to the write end) or `seconds` pass; drains."""
        try:
            select.select([self._r], [], [], seconds)
        except (OSError, ValueError):  # closed
            return
        self.drain()

    def close(self) -> None:
        for fd in (self._r, self._w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._r = self._w = -1
