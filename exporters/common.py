"""Small helpers shared by the human-readable exporters."""

from __future__ import annotations

import re

from envdoctor.redact import REPR_BYTE
from envdoctor.units import format_bytes

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any

# System facts in display order, with their labels.
SYSTEM_ROWS = (
    ("os", "OS"), ("kernel", "Kernel"), ("python_version", "Python"), ("python_executable", "Interpreter"),
    ("cpu_model", "CPU"), ("cpu_logical", "Logical CPUs"), ("cpu_affinity", "CPUs in affinity"),
    ("cpu_quota", "CPU quota (cgroup)"), ("memory_total_bytes", "Memory"), ("memory_available_bytes", "Memory available"),
    ("shm_size_bytes", "/dev/shm size"), ("shm_free_bytes", "/dev/shm free"),
    ("driver_version", "NVIDIA driver"), ("driver_cuda_version", "Driver CUDA version"),
    ("torch_version", "torch"), ("torch_dir", "torch read from"), ("torch_cuda_version", "torch CUDA build"),
    ("cudnn_version", "cuDNN"),
)


def describe(key: str, value: Any, system: dict[str, Any] | None = None) -> str:
    if value is None:
        if key == "cpu_quota":
            return "none"
        if key == "cudnn_version" and (system or {}).get("torch_cuda_version"):
            return "unknown (no cuDNN package or header next to torch)"  # a CUDA build: not "none"
        if key in ("torch_cuda_version", "cudnn_version") and (system or {}).get("torch_version"):
            return "none (CPU-only build)"  # the probe ran: None means torch was built without it
        return "unknown"
    if key.endswith("_bytes") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format_bytes(value)
    if key == "cpu_quota" and isinstance(value, (int, float)):
        return f"{value:g} CPUs"
    return str(value)


def system_rows(system: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) pairs for the system section, GPUs and unavailable items included."""
    rows = [(label, describe(key, system[key], system)) for key, label in SYSTEM_ROWS if key in system]
    gpus = system.get("gpus")
    for gpu in gpus if isinstance(gpus, list) else []:
        if not isinstance(gpu, dict):
            continue
        total = gpu.get("memory_total_bytes")
        size = format_bytes(total) if isinstance(total, (int, float)) and not isinstance(total, bool) else "?"
        cc = f", sm {gpu['compute_capability']}" if gpu.get("compute_capability") else ""
        rows.append((f"GPU {gpu.get('index')}", f"{gpu.get('name')} ({size}{cc}) {gpu.get('uuid') or ''}".strip()))
    unavailable = system.get("unavailable")
    if isinstance(unavailable, dict) and "gpus" in unavailable:
        rows.append(("GPUs", f"none found: {unavailable['gpus']}"))
    return rows


# --------------------------------------------------------------------------- escaping
# Every value a user or a target controls (an environment variable, a file name, a
# plug-in's message) is escaped for the format it goes into, here and only here.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ufffe\uffff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _spell(match: "re.Match[str]") -> str:
    code = ord(match.group(0))
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: Any) -> str:
    """`text` with control characters (ESC, BEL, CR, C1, bidi overrides) and lone surrogates
    spelled as \\xNN / \\uNNNN: nothing raw reaches a terminal, and every character
    is one XML 1.0 and UTF-8 accept. Newlines and tabs stay."""
    text = text if isinstance(text, str) else str(text)
    return REPR_BYTE.sub(r"\\x\1", _SURROGATE.sub(_spell, _CONTROL.sub(_spell, text)))


def one_line(text: Any) -> str:
    """printable(), with newlines and tabs as spaces (table cells, attributes)."""
    return printable(text).replace("\r", " ").replace("\n", " ").replace("\t", " ")


_MD_SPECIAL = re.compile(r"([\\|<*\[\]`#~])|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def markdown_text(text: Any) -> str:
    """Text for a Markdown table cell or paragraph: one line, markup characters escaped
    (a value like `[x](javascript:...)`, `<img>`, `|` or `**` shows as written)."""
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), one_line(text)).strip() or " "


def markdown_code(text: Any) -> str:
    """An inline code span holding `text` exactly, however many backticks it contains."""
    text = one_line(text)
    run = max((len(r) for r in re.findall(r"`+", text)), default=0)
    fence = "`" * (run + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_fence(lines: list[str]) -> str:
    """A fence for a code block that none of `lines` can close."""
    run = max((len(r) for line in lines for r in re.findall(r"`{3,}|~{3,}", line)), default=0)
    return "`" * max(3, run + 1)
