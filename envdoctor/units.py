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


def parse_size(text: str | int) -> int:
    """Return the number of bytes in `text`; raise ParseError when it is not a size."""
    if isinstance(text, bool):
        raise ParseError(f"{text!r} is not a size")
    if isinstance(text, int):
        if text < 0:
            raise ParseError(f"size {text} is negative")
        return text
    if not isinstance(text, str):
        raise ParseError(f"{text!r} is not a size")
    match = _SIZE.match(text)
    if not match:
        raise ParseError(f"{text!r} is not a size like '64m', '16GiB' or '1048576'")
    number, unit = match.groups()
    unit = unit.lower()
    if unit.endswith("ib"):  # KiB, MiB, GiB: binary, spelled out
        unit = unit[:-2]
    elif len(unit) == 2 and unit.endswith("i"):  # Ki, Mi, Gi: Kubernetes quantities
        unit = unit[:-1]
    multiplier = _BINARY.get(unit) or _SI.get(unit)
    if multiplier is None:
        raise ParseError(f"{text!r} has an unknown unit {match.group(2)!r}; use k, m, g, t (powers of 1024) or kB, MB, GB")
    return int(float(number) * multiplier)


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
