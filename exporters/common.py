"""Small helpers shared by the human-readable exporters."""

from __future__ import annotations

from typing import Any

from envdoctor.units import format_bytes

# System facts in display order, with their labels.
SYSTEM_ROWS = (
    ("os", "OS"), ("kernel", "Kernel"), ("python_version", "Python"), ("python_executable", "Interpreter probed"),
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
    if key.endswith("_bytes") and isinstance(value, (int, float)):
        return format_bytes(value)
    if key == "cpu_quota":
        return f"{value:g} CPUs"
    return str(value)


def system_rows(system: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, text) pairs for the system section, GPUs and unavailable items included."""
    rows = [(label, describe(key, system[key], system)) for key, label in SYSTEM_ROWS if key in system]
    for gpu in system.get("gpus") or []:
        cc = f", sm {gpu['compute_capability']}" if gpu.get("compute_capability") else ""
        rows.append((f"GPU {gpu.get('index')}", f"{gpu.get('name')} ({format_bytes(gpu.get('memory_total_bytes') or 0)}{cc}) {gpu.get('uuid') or ''}".strip()))
    unavailable = system.get("unavailable") or {}
    if "gpus" in unavailable:
        rows.append(("GPUs", f"none found: {unavailable['gpus']}"))
    return rows
