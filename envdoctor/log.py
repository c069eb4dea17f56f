"""One logger for the long-running modes: one logfmt line per event on stderr.

`serve` and `exec` log events (a run finished, a target appeared, a config was
reloaded, a fix was applied) as `ts=... level=info msg="..." key=value`, the form
node_exporter and most log pipelines read. Every line passes through redaction
first: a value of a secret-looking or unknown variable, of envdoctor's own
environment or of any target's the caller registers, never reaches a log.
A closed or broken stderr drops the line; logging never takes the process down.
"""

from __future__ import annotations

import os
import re
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
LEVELS = ("debug", "info", "warn", "error")


def configure(level: str = "info", stream: IO[str] | None = None) -> None:
    global _min_level, _stream
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    _min_level, _stream = level, stream


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
        with _LOCK:
            stream.write(line + "\n")
            stream.flush()
    except (OSError, ValueError, AttributeError):
        pass  # a closed stderr must not take a daemon or a job down
