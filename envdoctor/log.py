"""One logger for the long-running modes: one logfmt line per event on stderr.

`serve` and `exec` log events (a run finished, a target appeared, a config was
reloaded, a fix was applied) as `ts=... level=info msg="..." key=value`, the form
node_exporter and most log pipelines read. Every line passes through redaction
first: a value of a secret-looking or unknown variable, of envdoctor's own
environment or of any target's the caller registers, never reaches a log.
A closed or broken stderr drops the line; logging never takes the process down.

Nor does a stderr that nobody reads (a stuck journald, a `tee` that stopped, a pipe
whose reader sleeps): once its pipe was full, a write blocked for good, holding the
lock every thread logs through, and serve's runs, its stop on SIGTERM included,
waited on it (helper-70). A line now waits at most STALL_SECONDS for room (a pipe
or a terminal is written through a non-blocking copy of its descriptor), and while
the stream stays full the next ones are dropped at once and counted; the first
line that gets through again says how many were lost, and why (a full disk too).
A line cut short starts the next one on a line of its own.
"""

from __future__ import annotations

import os
import re
import select
import stat
import sys
import threading
import time

from envdoctor import redact

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import IO, Any, Iterable, Mapping

_LOCK = threading.Lock()
_BARE = re.compile(r"^[A-Za-z0-9_./:@+-]+$")
_extra_secrets: set[str] = set()
_stream: IO[str] | None = None
_min_level = "info"
STALL_SECONDS = 0.25  # the longest a line waits for a full stderr to take it
_CHUNK = select.PIPE_BUF  # a pipe takes this much whole, or none of it
_stalled = False  # the last write found no room: drop lines at once until there is
_dropped = 0  # lines dropped since, reported by the next one written
_torn = False  # a line was cut short by a stall: the next starts on a line of its own
_drop_reason = ""  # why the last line was dropped, for the count's line
_copy: tuple[tuple[int, int, int, int], int] | None = None  # (what fd 2 was, its non-blocking copy)
LEVELS = ("debug", "info", "warn", "error")


def configure(level: str = "info", stream: IO[str] | None = None) -> None:
    global _min_level, _stream
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    _min_level, _stream = level, stream


def patience(seconds: float) -> None:
    """How long a line may wait for room in a full stderr (STALL_SECONDS). serve keeps the
    default: its runs and its stop must not wait on a reader. exec's lines come before the
    job starts and cannot be said later: it waits longer (helper-77: with a reader 2 s
    behind, its verdict and `starting` lines were dropped, and the job started)."""
    global STALL_SECONDS
    STALL_SECONDS = seconds


def settle(seconds: float) -> None:
    """Before the process becomes something else (exec's job): say how many lines were dropped,
    waiting up to `seconds` for room, since no later line can; not again after a line already
    waited its patience in vain (helper-82: a stderr nobody read delayed the job twice, 10 s):
    then only if there is room now."""
    global _dropped
    if not _dropped:
        return
    stream = _stream or sys.stderr
    try:
        fd = stream.fileno()
        with _LOCK:
            target = _nonblocking(fd)
            if _dropped and _room(target, 0 if _stalled else seconds):
                os.write(target, (b"\n" if _torn else b"") + _lost_line())
                _dropped = 0
    except (OSError, ValueError, AttributeError):
        pass


def _lost_line() -> bytes:
    """The line that says how many lines were dropped, and why (call under _LOCK; format_line
    takes it, so the line is made here)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    return f'ts={stamp}Z level=warn msg="log lines dropped" count={_dropped} reason="{_drop_reason}"\n'.encode()


def protect(envs: Iterable[Mapping[str, str]]) -> None:
    """Also keep the secret values of these environments (a target's) out of every line."""
    values = redact.secret_values(envs)
    with _LOCK:
        _extra_secrets.update(values)


MAX_VALUE_CHARS = 1000  # of one value (the message too): a 100 KB NCCL_DEBUG made 200 KB lines


def _cut(text: str) -> str:
    """`text`, or its start and how much more there was. Called after redaction, so a cut
    never leaves the tail of a secret that redaction would have masked whole."""
    if len(text) <= MAX_VALUE_CHARS:
        return text
    return f"{text[:MAX_VALUE_CHARS]}... ({len(text) - MAX_VALUE_CHARS} more characters)"


def _quote(value: Any) -> str:
    text = _cut(redact.writable("" if value is None else str(value)))  # an undecodable byte as \xff, as reports show it
    text = "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)
    if text and _BARE.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# envdoctor's own names (a check id, a target label `pid:123`): never a variable's secret,
# and masking a coincidence would hide which check a line is about.
_PUBLIC_FIELDS = frozenset({"check", "target"})


def format_line(level: str, message: str, fields: Mapping[str, Any], now: float | None = None) -> str:
    """`ts=... level=... msg="..." k=v ...`, every value redacted and quoted as logfmt needs."""
    with _LOCK:
        secrets = set(_extra_secrets)
    scrub = redact.Scrubber(sorted(secrets | set(redact.secret_values([os.environ])), key=len, reverse=True))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now if now is not None else time.time()))
    parts = [f"ts={stamp}Z", f"level={level}", f"msg={_quote(scrub.text(message))}"]
    for key, value in fields.items():
        key = re.sub(r"[^A-Za-z0-9_]", "_", str(key)) or "_"
        if key in _PUBLIC_FIELDS:
            text = "" if value is None else str(value)
        elif redact.looks_secret(key) and value not in (None, ""):
            text = redact.MASK
        else:
            text = scrub.text("" if value is None else str(value))
        parts.append(f"{key}={_quote(text)}")
    return " ".join(parts)


def event(level: str, message: str, **fields: Any) -> None:
    """Log one event, if `level` is at or above the configured level."""
    if level not in LEVELS or LEVELS.index(level) < LEVELS.index(_min_level):
        return
    line = format_line(level, message, fields)
    stream = _stream or sys.stderr
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is an OSError and a ValueError
        fd = None
    try:
        with _LOCK:
            if fd is None:  # not a file (a test's StringIO): it cannot block
                stream.write(line + "\n")
                stream.flush()
            else:
                _write_line(fd, line)
    except (OSError, ValueError, AttributeError):
        pass  # a closed stderr must not take a daemon or a job down


def _write_line(fd: int, line: str) -> None:
    """Write one line to `fd` without ever blocking for long (call under _LOCK)."""
    global _stalled, _dropped, _torn, _drop_reason
    data = (line + "\n").encode("utf-8", "backslashreplace")
    target = _nonblocking(fd)
    if _stalled and not _room(target, 0):
        _dropped += 1
        return
    if _dropped:  # room again: say what was lost first
        data = _lost_line() + data
    if _torn:
        data = b"\n" + data
    written = 0
    deadline = time.monotonic() + STALL_SECONDS
    blocking = target == fd  # a file, or a socket (journald's stream): poll says when a write will not wait
    while written < len(data):
        try:
            if blocking and not _room(target, max(0.0, deadline - time.monotonic())):
                raise BlockingIOError
            written += os.write(target, data[written:written + _CHUNK])
            continue
        except BlockingIOError:  # full: wait for room, not past the deadline
            if not blocking and _room(target, max(0.0, deadline - time.monotonic())):
                continue
            _stalled, _drop_reason = True, "stderr was not being read"
        except OSError as exc:  # a full disk, a reader gone: this line is lost, counted, and the next starts clean
            _drop_reason = (exc.strerror or str(exc)).replace('"', "'")
        _dropped, _torn = _dropped + 1, _torn or written > 0
        return
    _stalled, _dropped, _torn = False, 0, False  # all of it went: what was lost is said


def _nonblocking(fd: int) -> int:
    """A descriptor that writes to what `fd` names without blocking: for a pipe or a terminal,
    a second opening of it (/proc/self/fd/N) with O_NONBLOCK, which only ours carries. On
    a terminal poll() says "writable" while any room is left, not room for a line, so a
    blocking write still slept there (helper-73: a pty nobody read hung serve and its stop).
    Setting O_NONBLOCK on `fd` itself would change it for every process sharing it (the
    shell's terminal). Anything else (a file, a socket) is `fd` itself: a file does not
    block, and a socket's poll() means room."""
    global _copy
    try:
        st = os.fstat(fd)
    except OSError:
        return fd
    key = (fd, st.st_dev, st.st_ino, st.st_rdev)
    if _copy is not None:
        kept, copy = _copy
        ours = _still_ours(copy, kept)
        if ours and kept == key:
            return copy
        if ours:
            os.close(copy)  # fd 2 names something else now: a copy of that is made below
        _copy = None  # else someone closed ours (a daemon's closerange) and its number may be theirs: not closed
    if not (stat.S_ISFIFO(st.st_mode) or (stat.S_ISCHR(st.st_mode) and os.isatty(fd))):
        return fd
    try:
        copy = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:  # no /proc, or a pipe whose reader is gone (ENXIO): as it is
        return fd
    _copy = (key, copy)
    return copy


def _still_ours(copy: int, key: tuple[int, int, int, int]) -> bool:
    """Whether descriptor `copy` is still the non-blocking copy made for `key`: a program may
    close descriptors it did not open, and the number then names its next file (helper-77:
    log lines went into that file, or closing "ours" closed the program's pipe)."""
    try:
        st = os.fstat(copy)
        return (st.st_dev, st.st_ino, st.st_rdev) == key[1:] and not os.get_blocking(copy)
    except OSError:
        return False


def _room(fd: int, seconds: float) -> bool:
    """Whether `fd` has room for a write now, waiting up to `seconds` (a regular file always
    has). Raises OSError for a closed or broken descriptor."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    for _, events in poller.poll(seconds * 1000):
        if events & (select.POLLERR | select.POLLNVAL):
            raise OSError("stderr is closed or broken")
        return bool(events & select.POLLOUT)
    return False
