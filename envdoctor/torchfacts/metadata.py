"""What torch's and its companions' files say, read as text: never imported.

- torch/version.py: `__version__`, `cuda`, `hip`, `git_version`... written by
  torch's build as plain assignments; parsed with `ast` (no code runs, so a
  target's torch, even a broken or foreign one, can be read safely).
- *.dist-info/METADATA: name, version and Requires-Dist of torch and of the
  `nvidia-*` wheels that carry CUDA's libraries (cudnn, nccl, cublas...). Only
  the header block is read (the description after it can be 40 KB).
- cudnn_version.h (shipped by nvidia-cudnn-cu* and by distro packages):
  CUDNN_MAJOR / CUDNN_MINOR / CUDNN_PATCHLEVEL, the version torch reports.
- torch/onnx/_constants.py: the default export opset (the constant the probe reads).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from envdoctor.paths import read_head  # also used as metadata.read_head by torchfacts

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any

MAX_TEXT = 256 * 1024  # a version.py or METADATA header is a few KB; a larger file is not one
# nvidia-ml-py (NVML's bindings) and the cuDNN frontend carry no CUDA library (helper-86)
_NVIDIA = re.compile(r"^(nvidia[-_](?!ml[-_]py$|cudnn[-_]frontend$).+|cuda[-_]toolkit|cuda[-_]bindings|triton|"
                     r"pytorch[-_]triton.*)$", re.I)


def _read_text(path: Path, limit: int = MAX_TEXT) -> str | None:
    data = read_head(path, limit)
    return None if data is None else data.decode("utf-8", "replace")


def assigned_constants(path: Path) -> dict[str, Any] | None:
    """The module-level `NAME = constant` (and `NAME: T = constant`) assignments of a
    Python file, found by parsing it: nothing in it runs. None when unreadable."""
    text = _read_text(path)
    if text is None:
        return None
    import ast  # here: a warm start reads these facts from the cache and never parses (~1.5 ms)

    try:
        tree = ast.parse(text, str(path))
    except (SyntaxError, ValueError):
        return None
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, (str, int, bool, type(None))):
            found[target.id] = value.value
    return found


def version_py(torch_dir: Path) -> dict[str, Any] | None:
    """The constants torch/version.py assigns, or None when it cannot be read."""
    found = assigned_constants(torch_dir / "version.py")
    return found if found is not None and isinstance(found.get("__version__"), str) else None


def onnx_default_opset(torch_dir: Path) -> int | None:
    """torch.onnx.export's default opset: ONNX_DEFAULT_OPSET in torch/onnx/_constants.py
    (torch 1.x .. 2.13 keep it there), read as the probe reads it."""
    found = assigned_constants(torch_dir / "onnx" / "_constants.py") or {}
    for name in ("ONNX_DEFAULT_OPSET", "onnx_default_opset"):
        value = found.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def onnx_max_opset(torch_dir: Path) -> int | None:
    """The newest opset torch.onnx.export can write: ONNX_MAX_OPSET in torch/onnx/_constants.py
    (23 in torch 2.13). A fix naming onnxruntime's newest opset above it cannot be followed."""
    value = (assigned_constants(torch_dir / "onnx" / "_constants.py") or {}).get("ONNX_MAX_OPSET")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_metadata(dist_info: Path) -> dict[str, Any] | None:
    """Name, Version and Requires-Dist from a dist-info's METADATA header."""
    text = _read_text(dist_info / "METADATA", 64 * 1024)
    if text is None:
        return None
    out: dict[str, Any] = {"requires": []}
    for line in text.splitlines():
        if not line.strip():
            break  # end of the header block; the long description follows
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key in ("name", "version") and key not in out:
            out[key] = value
        elif key == "requires-dist":
            out["requires"].append(value)
    return out if "name" in out and "version" in out else None


def dist_infos(site_dir: Path) -> dict[str, Path]:
    """Every *.dist-info folder in a site directory, by normalised distribution name."""
    found: dict[str, Path] = {}
    try:
        names = sorted(p.name for p in site_dir.iterdir())
    except OSError:
        return found
    for name in names:
        if name.endswith(".dist-info"):
            dist = name[: -len(".dist-info")].rsplit("-", 1)[0]
            found.setdefault(_normalise(dist), site_dir / name)
    return found


def dist_info_of(site_dir: Path, name: str, version: str) -> Path | None:
    """The *.dist-info of distribution `name` whose version is `version` (its local part,
    '+cu130', aside), else the first of that name: a leftover torch-2.12.0.dist-info beside
    2.13.0's decided the cuDNN torch was built for (helper-86)."""
    wanted, base = _normalise(name), version.split("+", 1)[0]
    found = []
    try:
        names = sorted(p.name for p in site_dir.iterdir())
    except OSError:
        return None
    for entry in names:
        if entry.endswith(".dist-info"):
            dist, _, dist_version = entry[: -len(".dist-info")].rpartition("-")
            if _normalise(dist) == wanted:
                if dist_version.split("+", 1)[0] == base:
                    return site_dir / entry
                found.append(site_dir / entry)
    return found[0] if found else None


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def metadata_files(site_dir: Path) -> list[Path]:
    """The METADATA files the facts are read from: torch's and the CUDA library wheels'."""
    return [path / "METADATA" for name, path in dist_infos(site_dir).items() if name == "torch" or _NVIDIA.match(name)]


def cuda_packages(site_dir: Path) -> dict[str, str]:
    """Versions of the CUDA library wheels next to torch: nvidia-cudnn-cu12 -> 9.1.0.70 ..."""
    out: dict[str, str] = {}
    for name, path in dist_infos(site_dir).items():
        if _NVIDIA.match(name):
            meta = read_metadata(path)
            if meta is not None:
                out[_normalise(meta["name"])] = meta["version"]
    return out


def pinned(requires: list[str], prefix: str) -> str | None:
    """The version torch's wheel pins a dependency to: 'nvidia-cudnn-cu13==9.20.0.48; ...' -> '9.20.0.48'."""
    for req in requires:
        m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*==\s*([^;,\s]+)", req)
        if m and _normalise(m.group(1)).startswith(prefix):
            return m.group(2)
    return None


def cudnn_number(major: int, minor: int, patch: int) -> int:
    """The integer torch.backends.cudnn.version() returns (CUDNN_VERSION)."""
    return major * 10000 + minor * 100 + patch if major >= 9 else major * 1000 + minor * 100 + patch


def cudnn_from_header(path: Path) -> int | None:
    text = _read_text(path, 64 * 1024)
    if text is None:
        return None
    parts = {}
    for key in ("MAJOR", "MINOR", "PATCHLEVEL"):
        m = re.search(rf"#define\s+CUDNN_{key}\s+(\d+)", text)
        if m is None:
            return None
        parts[key] = int(m.group(1))
    return cudnn_number(parts["MAJOR"], parts["MINOR"], parts["PATCHLEVEL"])


def cudnn_from_version(version: str) -> int | None:
    """'9.1.0.70' (the nvidia-cudnn-cu12 wheel's version) -> 90100."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    return cudnn_number(int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None
