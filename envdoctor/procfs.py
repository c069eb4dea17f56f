"""Readers for the /proc files that describe another process.

These take text or bytes, not paths, so they can be property-tested on any input;
the context does the reading, under the configured procfs root.
"""

from __future__ import annotations

from envdoctor.errors import ParseError


def parse_environ(data: bytes) -> dict[str, str]:
    """Parse /proc/N/environ (NUL-separated NAME=value) into a dict.

    Entries without '=' do occur (a program may scribble over its own environ
    block) and are dropped; bytes that are not UTF-8 are kept as U+FFFD so a
    value can never make the reader fail. Later duplicates win, as getenv does
    not guarantee either, and the last is what most shells export.
    """
    if not isinstance(data, (bytes, bytearray)):
        raise ParseError(f"environ must be bytes, got {type(data).__name__}")
    env: dict[str, str] = {}
    for entry in bytes(data).split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if not sep or not name:
            continue
        env[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env
