"""The few exceptions the engine defines, each with one meaning.

Parsers of untrusted text (env vars, cgroup files, /proc/N/environ, sizes) raise
ParseError and nothing else, so callers can turn any bad input into a result with
a reason. Unavailable means "this does not apply here" and becomes a `skip`;
anything else a check raises becomes an `error`.
"""

from __future__ import annotations


class EnvdoctorError(Exception):
    """Base class for envdoctor's own errors."""


class ParseError(EnvdoctorError, ValueError):
    """Input text that does not mean what it should; the message says what and why."""


class Unavailable(EnvdoctorError):
    """Something a check needs is not here (no GPU, no torch, no permission).

    The runner turns it into a `skip` result with this message as the reason and
    `hint` (what would make it apply, if anything) as the fix column, so a row
    stays one short reason rather than a paragraph.
    """

    def __init__(self, reason: str, hint: str = ""):
        super().__init__(reason)
        self.hint = hint


def short_reason(reason: str | None, limit: int = 80) -> str:
    """The first clause of a long Unavailable reason (NVML's are paragraphs), for a
    one-line summary; the facts keep it whole."""
    text = reason or ""
    return text.split(": ", 1)[0] if len(text) > limit else text


class ConfigError(EnvdoctorError):
    """A bad config file, key or value: the message names file, line and key."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None, key: str | None = None):
        self.file, self.line, self.key = file, line, key
        where = ""
        if file:
            where = f"{file}:{line}: " if line else f"{file}: "
        if key:
            where += f"{key}: "
        super().__init__(where + message)


class UsageError(EnvdoctorError):
    """Bad command-line usage (a --pid that does not exist, an unknown check id)."""


class OutputError(EnvdoctorError):
    """A report or file could not be written (a full disk, no such directory, a FIFO
    with no reader): one line naming the file and why. Not bad usage: exit 74."""


class Terminated(SystemExit):
    """SIGTERM arrived: the CLI's handler raises this (exit 128 + 15), not a bare SystemExit,
    so code that contains what a plug-in raises (SystemExit included) can still tell the
    user's signal apart and let it end the command."""


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C), raised by the CLI's handler; see Terminated."""


STOP_SIGNALS = (Terminated, Interrupted)
