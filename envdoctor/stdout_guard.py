"""What plug-ins print goes to stderr while they are imported and run, not into the report.

`check -f json`, `-f prometheus` and `serve --once` write their report on stdout, and a
plug-in that prints there (a debug `print()`, a library's banner at import, a write to
descriptor 1) landed inside it: JSON that no longer parses, an exposition promtool
refuses (helper-85). Descriptor 1 is pointed at descriptor 2 for that time, so what
they say is still seen, and given back before the report is written.
"""

from __future__ import annotations

import fcntl
import os
import sys

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from types import TracebackType


class PluginsPrintToStderr:
    """`with PluginsPrintToStderr():` descriptor 1 is stderr's (or /dev/null where stderr is
    closed) inside the block, and stdout again after it. Where stdout is closed there is
    nothing to keep clean, and nothing changes."""

    def __init__(self) -> None:
        self._saved: int | None = None

    def __enter__(self) -> "PluginsPrintToStderr":
        _flush()  # what is ours already goes where it was meant to
        try:
            os.fstat(2)  # asked first: with stderr closed, the copy below would take number 2
            stderr_open = True
        except OSError:
            stderr_open = False
        try:
            os.fstat(1)
            saved = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)  # above the three standard ones (helper-87)
        except OSError:  # stdout closed: no report on it to spoil
            return self
        try:
            if stderr_open:
                os.dup2(2, 1)
            else:  # what they print is dropped
                devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.dup2(devnull, 1)
                finally:
                    os.close(devnull)
        except OSError:
            os.close(saved)
            return self
        self._saved = saved
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._saved is None:
            return
        _flush()  # what they printed and Python still holds goes to stderr, not into the report
        try:
            os.dup2(self._saved, 1)
        finally:
            os.close(self._saved)
            self._saved = None


def _flush() -> None:
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except (OSError, ValueError):
        pass
