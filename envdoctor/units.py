"""Byte sizes as people write them ("16g", "1GiB", "64M") and as we print them.

Docker and Kubernetes accept several spellings (`--shm-size=16g`, `sizeLimit: 1Gi`),
and config files should accept what users paste from them. Bare suffixes follow
Docker: k/m/g are powers of 1024. Explicit SI suffixes (kB, MB, GB) are powers of 1000.
"""

from __future__ import annotations

import re

from envdoctor.errors import ParseError

_BINARY = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
_SI = {"kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4, "pb": 1000**5}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
MAX_SIZE = 2**63 - 1  # what a signed 64-bit byte count holds; beyond it a size is a typo
MAX_DIGITS = 30  # longer numbers are refused before int() sees them (int() refuses > 4300 digits)


def parse_int(text: str, what: str = "value") -> int:
    """An integer written in decimal (surrounding blanks and a sign allowed), or ParseError:
    "not an integer" for anything else, numbers too long for int() included."""
    if not isinstance(text, str):
        raise ParseError(f"{what} {text!r} is not an integer")
    stripped = text.strip()
    digits = stripped[1:] if stripped[:1] in "+-" else stripped
    if not digits or not digits.isascii() or not digits.isdigit():
        raise ParseError(f"{what} {text!r} is not an integer")
    if len(digits.lstrip("0")) > MAX_DIGITS:
        raise ParseError(f"{what} {stripped[:20]!r}... ({len(digits)} digits) is not a plausible integer")
    return int(stripped)


def parse_size(text: str | int) -> int:
    """Return the number of bytes in `text`; raise ParseError when it is not a size."""
    if isinstance(text, bool):
        raise ParseError(f"{text!r} is not a size")
    if isinstance(text, int):
        if text < 0:
            raise ParseError(f"size {text} is negative")
        if text > MAX_SIZE:
            raise ParseError(f"size {text} is beyond {MAX_SIZE} bytes")
        return text
    if not isinstance(text, str):
        raise ParseError(f"{text!r} is not a size")
    match = _SIZE.match(text)
    if not match:
        raise ParseError(f"{text!r} is not a size like '64m', '16GiB' or '1048576'")
    number, unit = match.groups()
    if len(number) > MAX_DIGITS:
        raise ParseError(f"{text[:24]!r}... is too long to be a size")
    unit = unit.lower()
    if unit.endswith("ib"):  # KiB, MiB, GiB: binary, spelled out
        unit = unit[:-2]
    elif len(unit) == 2 and unit.endswith("i"):  # Ki, Mi, Gi: Kubernetes quantities
        unit = unit[:-1]
    multiplier = _BINARY.get(unit) or _SI.get(unit)
    if multiplier is None:
        raise ParseError(f"{text!r} has an unknown unit {match.group(2)!r}; use k, m, g, t (powers of 1024) or kB, MB, GB")
    whole, _, fraction = number.partition(".")
    size = int(whole) * multiplier + (int(fraction) * multiplier) // 10 ** len(fraction) if fraction else int(whole) * multiplier
    if size > MAX_SIZE:
        raise ParseError(f"{text!r} is beyond {MAX_SIZE} bytes")
    return size


def format_bytes(n: int | float) -> str:
    """Human form in binary units, exact where it can be: 67108864 -> '64 MiB'."""
    n = float(n)
    if n != n or n in (float("inf"), float("-inf")):
        return f"{n} B"  # a broken reading shows as such, not as a crash
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            text = f"{n:.0f}" if n == int(n) else f"{n:.1f}"
            return f"{text} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def docker_size(n: int) -> str:
    """The spelling docker's --shm-size accepts, rounded up to whole GiB or MiB."""
    gib = 1024**3
    if n >= gib:
        return f"{-(-n // gib)}g"
    return f"{-(-n // 1024**2)}m"


def k8s_size(n: int) -> str:
    """The spelling of a Kubernetes quantity (sizeLimit), rounded up to Gi or Mi."""
    gib = 1024**3
    if n >= gib:
        return f"{-(-n // gib)}Gi"
    return f"{-(-n // 1024**2)}Mi"
