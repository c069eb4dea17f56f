"""onnx's limits read from its files, and the probe model written without onnx.

Why: `import onnx` costs about 60 ms of CPU on top of onnxruntime's own import
(numpy is shared), a fifth of a cold `envdoctor check`, and the onnx.opset check
needs only three numbers from it and one tiny model to offer onnxruntime.

- onnx's version is in its dist-info METADATA; the highest ai.onnx opset and IR
  version of that release are in onnx's own table, `VERSION_TABLE` in
  onnx/helper.py (release, IR version, ai.onnx opset, ...), read with `ast`.
  When a file is missing, or the release is not in the table (a development
  build), `onnx_limits` answers None and the caller imports onnx as before.
- `tiny_model(opset, ir_version)` is the Identity model onnx.helper would build,
  encoded by hand in protobuf's wire format (byte for byte the same: a test
  compares them).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from pathlib import Path

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes | int | str) -> bytes:
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    data = payload.encode("utf-8") if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _float_vector(name: str) -> bytes:
    """ValueInfoProto: `name`, a float tensor of shape [1]."""
    shape = _field(2, _field(1, _field(1, 1)))  # TensorShapeProto.dim[0].dim_value = 1
    tensor = _field(1, 1) + shape  # TypeProto.Tensor: elem_type FLOAT (1), shape
    return _field(1, name) + _field(2, _field(1, tensor))  # name, type.tensor_type


def tiny_model(opset: int, ir_version: int, also: dict[str, int] | None = None) -> bytes:
    """ModelProto of y = Identity(x) at ai.onnx `opset` and `ir_version`; `also` imports
    more domains at the versions given (ai.onnx.ml, say), which nothing in it uses."""
    node = _field(1, "x") + _field(2, "y") + _field(4, "Identity")
    graph = _field(1, node) + _field(2, "envdoctor_probe") + _field(11, _float_vector("x")) + _field(12, _float_vector("y"))
    imports = _field(8, _field(1, "") + _field(2, opset))
    for domain, version in (also or {}).items():
        imports += _field(8, _field(1, domain) + _field(2, version))
    return _field(1, ir_version) + _field(7, graph) + imports


def _package_dir(name: str) -> Path | None:
    """Where `import name` would find the package, without running it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _dist_version(site: Path, name: str) -> str | None:
    try:
        entries = [p for p in os.listdir(site) if p.lower().startswith(name + "-") and p.endswith(".dist-info")]
    except OSError:
        return None
    for entry in sorted(entries):
        try:
            with open(site / entry / "METADATA", "rb") as fh:
                head = fh.read(16 * 1024).decode("utf-8", "replace")
        except OSError:
            continue
        m = re.search(r"^Version:\s*(\S+)", head, re.M)
        if m:
            return m.group(1)
    return None


def version_table(helper_py: Path) -> list[tuple[Any, ...]] | None:
    """onnx/helper.py's VERSION_TABLE as data (it is a literal list of tuples)."""
    try:
        tree = ast.parse(helper_py.read_bytes(), str(helper_py))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "VERSION_TABLE" and node.value is not None:
            try:
                table = ast.literal_eval(node.value)
            except ValueError:
                return None
            return [tuple(row) for row in table if isinstance(row, tuple) and len(row) >= 3]
    return None


def onnx_limits() -> dict[str, Any] | None:
    """{"onnx_version", "onnx_max_opset", "onnx_max_ir_version"} from onnx's files, or None."""
    pkg = _package_dir("onnx")
    if pkg is None:
        return None
    version = _dist_version(pkg.parent, "onnx")
    table = version_table(pkg / "helper.py")
    if not version or not table:
        return None
    release = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if release is None:
        return None
    exact = [row for row in table if row[0] == version]
    # a patch release without its own row has its minor release's limits (1.23.2 -> 1.23.0)
    same_minor = [row for row in table if str(row[0]).startswith(f"{release.group(1)}.{release.group(2)}.")]
    row = (exact or same_minor or [None])[-1]
    if row is None or not isinstance(row[1], int) or not isinstance(row[2], int):
        return None
    return {"onnx_version": version, "onnx_max_opset": row[2], "onnx_max_ir_version": row[1]}
