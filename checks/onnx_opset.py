"""ONNX opsets: what the installed onnx and onnxruntime support, what torch exports
by default, and what the given .onnx models need.

What it reads
  - the installed onnx package: its version, the highest ai.onnx opset it knows
    (onnx.defs.onnx_opset_version()) and its IR version;
  - the installed onnxruntime, if any: its version and the highest ai.onnx opset
    and IR version it loads. onnxruntime has no public getter for these, so the
    check asks onnxruntime itself: it offers it a one-node model stamped with an
    impossible opset (and another with an impossible IR version) and reads the
    limit from the refusal ("Current official support for domain
    ai.onnx is till opset N", "max supported IR version: N"): the same rule
    onnxruntime applies to every model it loads. If that message cannot be read,
    it falls back to the highest since_version among onnxruntime's ai.onnx
    operator schemas, which may count an opset still under development; the
    facts say which way was used (onnxruntime_max_opset_source);
  - torch's default export opset, from the torch probe (torch is never imported
    in envdoctor's own process);
  - ALLOW_RELEASED_ONNX_OPSET_ONLY in the target's environment (onnxruntime's
    switch for running opsets still under development; any value but 0 or 1
    makes it refuse every model);
  - each model given with --onnx FILE (or the `files` config key): its IR
    version, its opset_import, and every Resize/Upsample node, including nodes in
    If/Loop/Scan bodies and in model-local functions. Weights stored as external
    data are not read.

Why it matters (PITFALLS 7)
  ONNX's Upsample and Resize did not match PyTorch's interpolation until opset 11:
  Resize-11 added coordinate_transformation_mode and nearest_mode, which the
  exporter needs to express F.interpolate's align_corners / half-pixel rules. A
  model exported at opset 9 or 10 with an upsampling layer runs without any error
  and gives different numbers (torch.onnx even only warns). The other way round, a
  model stamped with an opset (or IR version) newer than the installed onnxruntime
  knows is refused at load time, on the serving machine, after the export
  "worked".

Statuses
  fail   a model with a linear or cubic Resize/Upsample below opset 11 (`min_opset`); a Resize/Upsample
         whose mode onnxruntime refuses (anything but 'nearest', 'linear', 'cubic'); a model whose
         opset, ai.onnx.ml opset or IR version (in the model or any of its functions) is
         beyond what the installed onnxruntime loads; a model below opset 7 with an
         operator onnxruntime has no CPU kernel for at its version (Relu at opset 1); a
         model using a domain it imports no opset of; a model that uses
         an ai.onnx operator its opset does not define (Gelu, from opset 20, at 13), or
         defines only as deprecated where onnxruntime refuses it (Upsample from opset 10,
         Scatter from 11), where the graph can run it (onnxruntime: "No Op registered",
         "is deprecated in domain_version");
         ALLOW_RELEASED_ONNX_OPSET_ONLY set to something other than 0 or 1.
  error  a given file that does not exist, cannot be read or is not an ONNX model.
  warn   a nearest Resize/Upsample below opset 11 (it matches PyTorch for whole-number
         scale factors, measured through onnxruntime; other sizes may round otherwise);
         torch's default export opset is below 11 or beyond what onnxruntime runs;
         a model above onnxruntime's released opset that loads only because
         ALLOW_RELEASED_ONNX_OPSET_ONLY=0; an operator onnx deprecates at the model's
         opset when no onnxruntime is installed to say whether it refuses it; an opset
         below 7, the oldest onnxruntime supports, when its kernel registry cannot be read;
         an operator of a domain onnxruntime defines nothing in (it loads only with a
         custom-op library registered).
  ok     otherwise; the facts list the versions and each model's opsets.

How to fix
  Re-export with an explicit opset: torch.onnx.export(model, args, "model.onnx",
  opset_version=17) (11 or later for Resize; no higher than the runtime's limit or
  torch's own newest, ONNX_MAX_OPSET),
  or upgrade the runtime: pip install -U onnxruntime.
"""

from __future__ import annotations

import functools
import os
import re
import stat
import sys
from collections import deque
from collections import namedtuple
from pathlib import Path
from collections.abc import Mapping

from envdoctor.check import Check, Metric
from envdoctor.errors import ParseError, Unavailable
from envdoctor.model import Finding, Result, Status, verdict

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, BinaryIO

DEFAULT_DOMAINS = ("", "ai.onnx")  # both spell the default operator set
ONNX_DOMAINS = (*DEFAULT_DOMAINS, "ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.training")  # onnx's own
INTERPOLATION_OPS = ("Resize", "Upsample")
RELEASED_ONLY_VAR = "ALLOW_RELEASED_ONNX_OPSET_ONLY"
PREFERRED_OPSET = 17  # what fixes suggest: widely supported, well past 11
EXAMPLES = 3  # node names shown per model


# -- facts ----------------------------------------------------------------------------


class InterpolationNode(namedtuple("InterpolationNode", (
        "op",  # str
        "where",  # str: node name, prefixed by the graph it sits in when that is a subgraph
        "opset",  # int | None
        "mode",  # str = "nearest": its `mode` attribute (nearest, the default; linear/bilinear; cubic)
        "function",  # str | None = None: "domain:name" of the model-local function it sits in, if any
), defaults=("nearest", None))):
    """A Resize or Upsample node, where it sits, and the ai.onnx opset in force there."""

    __slots__ = ()


class ModelInfo(namedtuple("ModelInfo", (
        "ir_version",  # int
        "opsets",  # Mapping[str, int]: domain -> version; the default domain is spelled "ai.onnx"
        "nodes",  # int
        "interpolation",  # tuple[InterpolationNode, ...] = ()
        "uses_default_domain",  # bool = True
        "called",  # frozenset[str] = frozenset(): "domain:op_type" the main graph calls, directly or through functions
        "unknown_ops",  # tuple[UnknownOp, ...] = (): ai.onnx operators the opset in force there does not define
        "functions",  # frozenset[str] = frozenset(): "domain:name" of the model's own functions
        "highest",  # Mapping[str, int] = {}: each domain's highest version the model or any function imports
), defaults=((), True, frozenset(), (), frozenset(), {}))):
    """What one .onnx file declares: its IR version, opsets and interpolation nodes."""

    __slots__ = ()

    def live_interpolation(self) -> tuple[InterpolationNode, ...]:
        """The interpolation nodes that can run: not those in a local function no node calls
        (helper-52: onnxruntime loads a model whose unused function holds a mode it refuses)."""
        return tuple(n for n in self.interpolation if n.function is None or n.function in self.called)

    @property
    def opset(self) -> int | None:
        """The model's ai.onnx opset (None when it imports none)."""
        return self.opsets.get("ai.onnx")


class UnknownOp(namedtuple("UnknownOp", (
        "op",  # str
        "where",  # str: the first node of that operator, as InterpolationNode names it
        "opset",  # int: the ai.onnx opset in force there
        "since",  # int | None: the first opset that defines it (None: no opset does)
        "function",  # str | None: "domain:name" of the model-local function it sits in, if any
        "deprecated",  # int | None = None: the opset whose schema deprecates it (onnx's), when that is why
), defaults=(None,))):
    """An ai.onnx operator used where the model's opset does not define it: onnxruntime refuses
    to load the model ("No Op registered"; helper-76: Gelu, defined from opset 20, at 13), or
    defines it only as deprecated, which onnxruntime refuses too ("Op registered for Upsample
    is deprecated in domain_version of 11"; helper-80, helper-82)."""

    __slots__ = ()


class ModelFile(namedtuple("ModelFile", (
        "path",  # str
        "info",  # ModelInfo | None = None
        "problem",  # str | None = None: why it could not be used, when info is None
        "unreadable",  # bool = False: the file is missing or unreadable (not: read, and not a model)
        "missing_data",  # tuple[str, ...] = (): external data files the weights live in that are missing or short
), defaults=(None, None, False, ()))):
    __slots__ = ()


class RuntimeFacts(namedtuple("RuntimeFacts", (
        "version",  # str | None = None
        "max_opset",  # int | None = None: highest ai.onnx opset it loads (released opsets)
        "max_opset_source",  # str | None = None: "load_refusal" or "schema_registry"
        "dev_opset",  # int | None = None: highest ai.onnx since_version in its schemas
        "max_ir_version",  # int | None = None
        "reason",  # str | None = None: why some of the above are None
        "deprecated",  # tuple[str, ...] | None = None: "Op:opset" of its schemas that deprecate an ai.onnx op
        "ml_max_opset",  # int | None = None: highest ai.onnx.ml opset it loads (released)
        "domains",  # tuple[str, ...] | None = None: the operator domains its schemas define
        "cpu_kernels",  # Mapping[str, list[list[int]]] | None = None: ai.onnx op -> [first, last] opset of each CPU kernel
        "other_schemas",  # Mapping[str, Mapping[str, list[list[int]]]] | None = None: domain (not ai.onnx) -> op ->
                          # [since_version, 1 if deprecated else 0] of each of its schemas
), defaults=(None, None, None, None, None, None, None, None, None, None, None))):
    """The installed onnxruntime and the limits it enforces when loading a model."""

    __slots__ = ()


class OnnxFacts(namedtuple("OnnxFacts", (
        "onnx_version",  # str
        "onnx_max_opset",  # int
        "onnx_max_ir_version",  # int
        "runtime",  # RuntimeFacts
        "torch_default_opset",  # int | None = None
        "torch_reason",  # str | None = None: why torch_default_opset is None
        "released_only",  # str | None = None: ALLOW_RELEASED_ONNX_OPSET_ONLY in the target's env
        "models",  # tuple[ModelFile, ...] = ()
        "torch_max_opset",  # int | None = None: the newest opset torch.onnx.export writes (ONNX_MAX_OPSET)
), defaults=(None, None, None, (), None))):
    __slots__ = ()


# -- parsing a model (untrusted bytes) ------------------------------------------------


def _clean(text: str, limit: int = 60) -> str:
    """A node or graph name from a file, safe to print on one line."""
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# onnxruntime's Resize/Upsample take these modes, spelled so (case counts), or none (nearest);
# it refuses to load a model with any other (seen with onnxruntime 1.32: 'NEAREST', 'bilinear',
# '' and an integer-typed mode each fail the session's creation).
LOADABLE_MODES = ("nearest", "linear", "cubic")
_STRING_ATTRIBUTE = 3  # onnx.AttributeProto.STRING


def _mode(node: Any) -> str:
    """A Resize/Upsample node's interpolation mode, as its attribute spells it ("nearest"
    when it has none; "<not text>" when the attribute is not a string)."""
    for attr in node.attribute:
        if attr.name == "mode":
            if attr.type != _STRING_ATTRIBUTE:
                return "<not text>"
            return _clean(attr.s.decode("utf-8", "replace"), 20)
    return "nearest"


def parse_model(data: bytes) -> ModelInfo:
    """Read the opset facts of a serialised ONNX ModelProto; raise ParseError for anything else."""
    import onnx

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError, or worse on hostile input
        raise ParseError(f"not an ONNX model: the protobuf does not decode ({exc})") from None
    try:
        return _model_info(model)
    except ParseError:
        raise
    except Exception as exc:  # a decoded but nonsensical message must still end as ParseError
        raise ParseError(f"not a usable ONNX model: {type(exc).__name__}: {exc}") from None


def _imports(model: Any) -> tuple[dict[str, int], dict[str, int]]:
    """(the model's opset per domain, each domain's highest version in the model or any of its
    functions). A domain imported twice: onnxruntime takes the last entry; it checks every
    function's imports against its limits too, called or not (helper-95)."""
    opsets: dict[str, int] = {}
    highest: dict[str, int] = {}
    for entry in model.opset_import:
        domain = "ai.onnx" if entry.domain in DEFAULT_DOMAINS else _clean(entry.domain)
        if entry.version <= 0:
            raise ParseError(f"opset_import for domain {domain!r} has version {entry.version}")
        opsets[domain] = entry.version
        highest[domain] = max(highest.get(domain, 0), entry.version)  # each entry is held to the limits
    for function in model.functions:
        for entry in function.opset_import:
            domain = "ai.onnx" if entry.domain in DEFAULT_DOMAINS else _clean(entry.domain)
            highest[domain] = max(highest.get(domain, 0), entry.version)
    return opsets, highest


def _model_info(model: Any) -> ModelInfo:
    if model.ir_version <= 0:
        raise ParseError("not an ONNX model: it has no ir_version (an empty file, or another kind of protobuf)")
    if not model.HasField("graph"):
        raise ParseError("not an ONNX model: it has no graph")
    opsets, highest = _imports(model)
    if not opsets:
        if model.ir_version >= 3:
            raise ParseError(f"IR version {model.ir_version} model declares no opset_import")
        opsets["ai.onnx"] = 1  # before IR 3 a model without opset_import meant opset 1
    default = opsets.get("ai.onnx")

    # Walk the main graph, every subgraph held in a node attribute (If branches,
    # Loop and Scan bodies) and model-local functions, without recursion so a
    # deeply nested file cannot exhaust the stack.
    queue: deque[tuple[Any, int | None, str, str | None]] = deque([(model.graph.node, default, "", None)])
    for function in model.functions:
        fopset = default
        for entry in function.opset_import:
            if entry.domain in DEFAULT_DOMAINS:
                fopset = entry.version
        queue.append((function.node, fopset, f"function {_clean(function.name)}/", f"{function.domain}:{function.name}"))
    interpolation: list[InterpolationNode] = []
    unknown: dict[tuple[str, int | None, str | None], UnknownOp | None] = {}  # per op, opset and scope
    # onnxruntime resolves no model-local function in ONNX's own domains (helper-95: one in ""
    # or ai.onnx.ml was refused, "No Op registered"); in any other domain it does
    local = {f"{function.domain}:{function.name}" for function in model.functions if function.domain not in ONNX_DOMAINS}
    calls: dict[str | None, set[str]] = {}  # scope (None: the main graph) -> "domain:op_type" its nodes call
    nodes = 0
    uses_default = False
    while queue:
        graph_nodes, opset, scope, fkey = queue.popleft()
        for index, node in enumerate(graph_nodes):
            nodes += 1
            calls.setdefault(fkey, set()).add(f"{node.domain}:{node.op_type}")
            name = f"{scope}{_clean(node.name) or f'{node.op_type}#{index}'}"
            if node.domain in DEFAULT_DOMAINS:
                uses_default = True
                if node.op_type in INTERPOLATION_OPS:
                    interpolation.append(InterpolationNode(node.op_type, _clean(name, 120), opset, _mode(node), fkey))
                key = (node.op_type, opset, fkey)
                if key not in unknown and opset is not None and f"{node.domain}:{node.op_type}" not in local:
                    since = _defined_since(node.op_type, opset)  # memoised per op, opset and scope: None when defined
                    unknown[key] = None if since == 0 else UnknownOp(_clean(node.op_type), _clean(name, 120), opset,
                                                                     since, fkey, _deprecated_at(node.op_type, opset))
            for attr in node.attribute:
                if attr.HasField("g"):
                    queue.append((attr.g.node, opset, f"{name}.{_clean(attr.name)}/", fkey))
                for sub in attr.graphs:
                    queue.append((sub.node, opset, f"{name}.{_clean(attr.name)}/", fkey))
    known = tuple(op for op in unknown.values() if op is not None)
    return ModelInfo(model.ir_version, opsets, nodes, tuple(interpolation), uses_default, _reachable(calls), known,
                     frozenset(local), highest)


def _schema_at(op_type: str, version: int) -> Any:
    """onnx's schema of an ai.onnx operator in force at opset `version`, or None."""
    from onnx import defs

    try:
        return defs.get_schema(op_type, version, "")  # the newest schema up to `version` (onnx 1.14 has this form)
    except defs.SchemaError:
        return None


def _deprecated_at(op_type: str, opset: int) -> int | None:
    """The opset whose schema deprecates `op_type`, when that schema is the one in force at `opset`."""
    schema = _schema_at(op_type, opset)
    return schema.since_version if schema is not None and schema.deprecated else None


def _defined_since(op_type: str, opset: int) -> int | None:
    """0 when the ai.onnx opset `opset` defines `op_type`, not as deprecated (or this onnx
    does not know that opset yet: nothing to say); else the first opset that does, or None."""
    from onnx import defs

    def defined(version: int) -> bool:
        schema = _schema_at(op_type, version)
        return schema is not None and not schema.deprecated

    newest = defs.onnx_opset_version()
    if opset > newest or defined(opset):
        return 0
    return next((version for version in range(opset + 1, newest + 1) if defined(version)), None)


def _reachable(calls: Mapping[str | None, set[str]]) -> frozenset[str]:
    """The local functions the main graph can run: those it calls, those they call, and so on
    (helper-53: a function called only from a function nothing calls was counted as run)."""
    seen: set[str] = set()
    todo = list(calls.get(None, ()))
    while todo:
        key = todo.pop()
        if key not in seen:
            seen.add(key)
            todo.extend(calls.get(key, ()))
    return frozenset(seen)


# Field numbers from onnx.proto: what the weight-free reader below keeps or drops.
_MODEL_GRAPH = 7
_GRAPH_WEIGHTS = (5, 15)  # GraphProto.initializer, GraphProto.sparse_initializer
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


class _Wire:
    """Just enough of protobuf's wire format to walk a message's fields and step over values."""

    def __init__(self, stream: BinaryIO):
        self.f = stream

    def tell(self) -> int:
        return self.f.tell()

    def _truncated(self) -> ParseError:
        return ParseError(f"not an ONNX model: truncated or corrupt protobuf at byte {self.tell()}")

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.f.read(1)
            if not byte:
                raise self._truncated()
            value |= (byte[0] & 0x7F) << shift
            if byte[0] < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise self._truncated()

    def key(self) -> tuple[int, int]:
        key = self.varint()
        number, wire_type = key >> 3, key & 7
        if number == 0 or wire_type not in (_VARINT, _I64, _LEN, _I32):
            raise ParseError(f"not an ONNX model: bad protobuf field key {key} at byte {self.tell()}")
        return number, wire_type

    def length(self, end: int) -> int:
        n = self.varint()
        if self.tell() + n > end:
            raise self._truncated()
        return n

    def skip(self, wire_type: int, end: int) -> None:
        if wire_type == _VARINT:
            self.varint()
            return
        n = 8 if wire_type == _I64 else 4 if wire_type == _I32 else self.length(end)
        if self.tell() + n > end:
            raise self._truncated()
        self.f.seek(n, 1)

    def raw(self, wire_type: int, end: int) -> bytes:
        """The value's encoding as it stands in the file (length prefix included)."""
        start = self.tell()
        self.skip(wire_type, end)
        stop = self.tell()
        self.f.seek(start)
        data = self.f.read(stop - start)
        if len(data) != stop - start:
            raise self._truncated()
        return data


_SMALL_TENSOR = 64 * 1024  # an initializer whose data lives in another file is a few hundred bytes


def strip_weights(stream: BinaryIO, size: int, small_initializers: list[bytes] | None = None) -> bytes:
    """A serialised ModelProto, read from `stream`, minus its graph's initializers.

    The weights are most of a model file and none of its opset facts: stepping
    over them keeps a 1 GiB model from costing 2 GiB of memory and seconds of
    protobuf decoding. Every other field is copied as it stands, so what comes
    out decodes (with onnx) to the same model without weights. Raises ParseError
    when the bytes are not a well-formed protobuf message.
    """
    wire = _Wire(stream)
    out = bytearray()
    while wire.tell() < size:
        number, wire_type = wire.key()
        if number != _MODEL_GRAPH or wire_type != _LEN:
            out += _varint_bytes(number << 3 | wire_type) + wire.raw(wire_type, size)
            continue
        graph_bytes = wire.length(size)
        end = wire.tell() + graph_bytes
        kept = bytearray()
        while wire.tell() < end:
            field_number, field_type = wire.key()
            if field_number in _GRAPH_WEIGHTS and field_type == _LEN:
                n = wire.length(end)
                if small_initializers is not None and n <= _SMALL_TENSOR:
                    data = wire.f.read(n)  # small: it may point at an external data file
                    if len(data) != n:
                        raise wire._truncated()
                    small_initializers.append(data)
                else:
                    wire.f.seek(n, 1)
            else:
                kept += _varint_bytes(field_number << 3 | field_type) + wire.raw(field_type, end)
        if wire.tell() != end:
            raise wire._truncated()
        out += _varint_bytes(_MODEL_GRAPH << 3 | _LEN) + _varint_bytes(len(kept)) + kept
    if wire.tell() != size:
        raise wire._truncated()
    return bytes(out)


def read_model(path: Path) -> ModelFile:
    """Read and parse one file; every failure becomes a ModelFile with a problem, never an exception."""
    shown = str(path)
    try:
        if path.exists() and not path.is_dir() and not path.is_file():
            # a FIFO or device would block open() or read() forever
            return ModelFile(shown, problem="is not a regular file (a pipe or device?)", unreadable=True)
        small: list[bytes] = []
        with path.open("rb") as stream:
            stripped = strip_weights(stream, os.fstat(stream.fileno()).st_size, small)
    except FileNotFoundError:
        return ModelFile(shown, problem="does not exist", unreadable=True)
    except IsADirectoryError:
        return ModelFile(shown, problem="is a directory, not an .onnx file", unreadable=True)
    except PermissionError:
        return ModelFile(shown, problem="cannot be read: permission denied", unreadable=True)
    except OSError as exc:
        return ModelFile(shown, problem=f"cannot be read: {exc.strerror or exc}", unreadable=True)
    except ParseError as exc:
        return ModelFile(shown, problem=str(exc))
    try:
        info = parse_model(stripped)
    except ParseError as exc:
        return ModelFile(shown, problem=str(exc))
    return ModelFile(shown, info=info, missing_data=missing_external_data(path, small))


_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL


def missing_external_data(model_path: Path, tensors: list[bytes]) -> tuple[str, ...]:
    """The external data files (weights saved beside the model, `save_as_external_data`)
    that are missing, unreadable or shorter than the model says: onnxruntime fails
    to load such a model, however right its opset is."""
    import onnx

    problems: dict[str, None] = {}
    for data in tensors:
        tensor = onnx.TensorProto()
        try:
            tensor.ParseFromString(data)
        except Exception:  # not a tensor after all: the model's parse judges the file
            continue
        if tensor.data_location != _EXTERNAL:
            continue
        entries = {e.key: e.value for e in tensor.external_data}
        location = entries.get("location", "")
        name = _clean(tensor.name) or "a tensor"
        if not location:
            problems.setdefault(f"{name}: stored externally but names no file")
            continue
        target = model_path.parent / location
        try:
            offset = int(entries.get("offset") or 0) if len(entries.get("offset") or "") <= 20 else None
            length = int(entries.get("length") or 0) if len(entries.get("length") or "") <= 20 else None
        except ValueError:
            offset = length = None
        try:
            st = target.stat()
        except OSError as exc:
            problems.setdefault(f"{_clean(location, 120)} (for {name}): {exc.strerror or 'cannot be read'}")
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.setdefault(f"{_clean(location, 120)} (for {name}): not a regular file")
        elif offset is None or length is None:
            problems.setdefault(f"{_clean(location, 120)} (for {name}): offset or length is not a number")
        elif st.st_size < offset + length:
            problems.setdefault(f"{_clean(location, 120)} (for {name}): {st.st_size} bytes, the model needs {offset + length}")
    return tuple(problems)


# -- the installed onnxruntime ---------------------------------------------------------

_REFUSED_OPSET = re.compile(r"support for domain ai\.onnx is till opset (\d+)")
_REFUSED_ML_OPSET = re.compile(r"support for domain ai\.onnx\.ml is till opset (\d+)")
ML_DOMAIN = "ai.onnx.ml"
OLDEST_OPSET = 7  # onnxruntime: "All versions of ONNX Runtime support ONNX opsets from ONNX v1.2.1+ (opset version 7 and higher)"
_REFUSED_IR = re.compile(r"max supported IR version: (\d+)")
_IMPOSSIBLE = 1_000_000  # an opset / IR version no runtime will ever claim


def _tiny_model(opset: int, ir_version: int, also: dict[str, int] | None = None) -> bytes:
    # the bytes onnx.helper would build, written without importing onnx (~60 ms of a cold run)
    from envdoctor.onnxfacts import tiny_model

    return tiny_model(opset, ir_version, also)


def _refusal(ort: Any, model: bytes, pattern: re.Pattern[str]) -> int | None:
    """Offer onnxruntime a model it must refuse and read the limit it names."""
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: the probe is expected to be refused
    try:
        ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        match = pattern.search(str(exc))
        return int(match.group(1)) if match else None
    return None  # accepted (ALLOW_RELEASED_ONNX_OPSET_ONLY=0 in our own environment)


def _schemas(ort: Any) -> tuple[int | None, tuple[str, ...] | None, tuple[str, ...] | None, dict[str, Any] | None]:
    """(highest since_version among onnxruntime's ai.onnx schemas, the "Op:opset" of those
    that deprecate their operator, every domain it has schemas for, the other domains'
    schemas), from its schema registry (a private but long-lived API).
    Its deprecations are its own: onnx 1.19 deprecates GroupNormalization-18, which
    onnxruntime 1.32 still runs; Upsample-10 and Scatter-11 it refuses."""
    try:
        from onnxruntime.capi import _pybind_state

        every = _pybind_state.get_all_operator_schema()
        schemas = [s for s in every if s.domain in DEFAULT_DOMAINS]
        deprecated = tuple(sorted(f"{s.name}:{s.since_version}" for s in schemas if getattr(s, "deprecated", False)))
        domains = tuple(sorted({s.domain or "ai.onnx" for s in every}))
        others: dict[str, dict[str, list[list[int]]]] = {}
        for schema in every:
            if schema.domain not in DEFAULT_DOMAINS:
                others.setdefault(schema.domain, {}).setdefault(schema.name, []).append(
                    [schema.since_version, int(bool(getattr(schema, "deprecated", False)))])
    except Exception:
        return None, None, None, None
    return (max((s.since_version for s in schemas), default=None), deprecated, domains,
            {d: {op: sorted(v) for op, v in sorted(ops.items())} for d, ops in sorted(others.items())})


def _cpu_kernels() -> dict[str, list[list[int]]] | None:
    """ai.onnx operator -> the opset ranges onnxruntime's CPU kernels implement, from its
    kernel registry (private like the schema registry): whether an old model's operators
    have an implementation at all (helper-95: Relu(1) has none, Identity(1) has)."""
    try:
        from onnxruntime.capi import _pybind_state

        table: dict[str, set[tuple[int, int]]] = {}
        for kernel in _pybind_state.get_all_opkernel_def():
            if kernel.provider == "CPUExecutionProvider" and kernel.domain in DEFAULT_DOMAINS:
                table.setdefault(kernel.op_name, set()).add(tuple(kernel.version_range))
    except Exception:
        return None
    return {op: [list(r) for r in sorted(ranges)] for op, ranges in sorted(table.items())}


TELEMETRY_VAR = "ORT_DISABLE_TELEMETRY"


def _import_without_telemetry() -> Any:
    """`import onnxruntime` with ORT_DISABLE_TELEMETRY=1 for the import, which is when it
    reads it (unless the user set it). Otherwise its first session saves a telemetry
    device id under ~/.cache/Microsoft, creating a missing home, and warns in colour on
    stderr when the home is read-only: a checker should leave no trace of its own there."""
    if sys.modules.get("onnxruntime") is not None:  # imported already (None there means: cannot be)
        return sys.modules["onnxruntime"]
    users = TELEMETRY_VAR in os.environ
    if not users:
        os.environ[TELEMETRY_VAR] = "1"
    try:
        import onnxruntime
    finally:
        if not users:
            os.environ.pop(TELEMETRY_VAR, None)
    return onnxruntime


def probe_runtime() -> RuntimeFacts:
    """Ask the installed onnxruntime what it loads; its absence is a fact, not an error."""
    try:
        ort = _import_without_telemetry()
    except ImportError as exc:
        return RuntimeFacts(reason=f"onnxruntime is not installed ({exc}): cannot tell whether it runs these models")
    except Exception as exc:
        return RuntimeFacts(reason=f"onnxruntime cannot be imported: {type(exc).__name__}: {exc}")
    version = getattr(ort, "__version__", None)
    dev, deprecated, domains, others = _schemas(ort)
    kernels = _cpu_kernels()
    released = ir = ml = None
    notes = []
    try:
        released = _refusal(ort, _tiny_model(_IMPOSSIBLE, 7), _REFUSED_OPSET)
        ir = _refusal(ort, _tiny_model(7, _IMPOSSIBLE), _REFUSED_IR)
        ml = _refusal(ort, _tiny_model(OLDEST_OPSET, 7, {ML_DOMAIN: _IMPOSSIBLE}), _REFUSED_ML_OPSET)
    except Exception as exc:  # SessionOptions missing in a stripped build, onnx helper trouble
        notes.append(f"could not probe onnxruntime's limits: {type(exc).__name__}: {exc}")
    if released is not None:
        return RuntimeFacts(version, released, "load_refusal", dev, ir, "; ".join(notes) or None, deprecated, ml, domains,
                            kernels, others)
    if dev is not None:
        notes.append("opset limit taken from onnxruntime's operator schemas (may count an opset under development)")
        return RuntimeFacts(version, dev, "schema_registry", dev, ir, "; ".join(notes), deprecated, ml, domains,
                            kernels, others)
    notes.append(f"onnxruntime {version} did not reveal the highest opset it runs")
    return RuntimeFacts(version, None, None, None, ir, "; ".join(notes), deprecated, ml, domains, kernels, others)


@functools.lru_cache(maxsize=1)
def runtime_facts() -> RuntimeFacts:
    """probe_runtime(), once per process: the installed runtime does not change under us."""
    return probe_runtime()


# -- gathering --------------------------------------------------------------------------


def _model_paths(ctx: Any) -> list[Path]:
    """--onnx files and the `files` config key, each once, in the order given."""
    seen: dict[str, Path] = {}
    configured = ctx.settings["files"] or []
    if isinstance(configured, (str, Path)):
        configured = [configured]
    for path in [*ctx.onnx_files, *configured]:
        seen.setdefault(str(path), Path(path))
    return list(seen.values())


def _torch_default_opset(ctx: Any) -> tuple[int | None, str | None, int | None]:
    """(torch.onnx.export's default opset or None, why None, the newest opset it writes or None)."""
    try:
        facts = ctx.torch
    except Unavailable as exc:
        return None, f"torch facts unavailable: {exc}", None
    except Exception as exc:  # a broken or hung probe costs the torch part only, not the files and the runtime
        return None, f"torch facts unavailable (the torch probe failed: {exc})", None
    value, newest = (facts.get("onnx_default_opset"), facts.get("onnx_max_opset")) if isinstance(facts, Mapping) else (None, None)
    newest = newest if isinstance(newest, int) and not isinstance(newest, bool) else None
    if isinstance(value, bool) or not isinstance(value, int):
        return None, "the torch probe did not report torch.onnx's default opset", newest
    return value, None, newest


STACK_CACHE_SCHEMA = "envdoctor.onnx-stack-cache/v5"  # v2: deprecated schemas; v3: ai.onnx.ml, domains; v4-5: kernels, schemas


def _install_stamp() -> list[Any]:
    """Where onnx and onnxruntime are installed and when they last changed, found
    without importing them (find_spec locates a top-level package without running it)."""
    import importlib.util

    stamp: list[Any] = [sys.executable]
    for name in ("onnx", "onnxruntime"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        origin = spec.origin if spec and spec.origin else None
        try:
            mtime = os.stat(origin).st_mtime_ns if origin else None
            parent = os.stat(os.path.dirname(os.path.dirname(origin))).st_mtime_ns if origin else None
        except OSError:
            mtime = parent = None
        stamp.append([name, origin, mtime, parent])  # parent: site-packages changes on (un)install
    return stamp


def _stack_from_imports() -> dict[str, Any]:
    from envdoctor.onnxfacts import onnx_limits

    limits = onnx_limits()  # onnx's own release table, read from its files; None: ask onnx itself
    if limits is None:
        import onnx

        limits = {"onnx_version": onnx.__version__, "onnx_max_opset": onnx.defs.onnx_opset_version(),
                  "onnx_max_ir_version": onnx.IR_VERSION}
    return {**limits, "runtime": runtime_facts()._asdict()}


def _is_stack(facts: Mapping[str, Any]) -> bool:
    """What _stack_from_imports writes: onnx's version and limits, and the runtime's facts."""
    runtime = facts.get("runtime")
    def whole(value: Any) -> bool:  # JSON true is no opset (helper-95), nor is a 400-digit number (helper-94)
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31

    if not (isinstance(facts.get("onnx_version"), str) and whole(facts.get("onnx_max_opset"))
            and whole(facts.get("onnx_max_ir_version")) and isinstance(runtime, dict)
            and set(runtime) == set(RuntimeFacts._fields)):  # what _stack_from_imports writes: every field
        return False
    numbers = all(runtime.get(k) is None or whole(runtime[k])
                  for k in ("max_opset", "dev_opset", "max_ir_version", "ml_max_opset"))
    words = all(runtime.get(k) is None or isinstance(runtime[k], str) for k in ("version", "max_opset_source", "reason"))
    lists = all(runtime.get(k) is None or (isinstance(runtime[k], list) and all(isinstance(d, str) for d in runtime[k]))
                for k in ("deprecated", "domains"))
    kernels = runtime.get("cpu_kernels")
    ranges = kernels is None or (isinstance(kernels, dict) and all(
        isinstance(spans, list) and all(isinstance(r, list) and len(r) == 2 and all(map(whole, r)) for r in spans)
        for spans in kernels.values()))
    others = runtime.get("other_schemas")
    schemas = others is None or (isinstance(others, dict) and all(
        isinstance(ops, dict) and all(isinstance(v, list) and all(
            isinstance(e, list) and len(e) == 2 and all(map(whole, e)) for e in v) for v in ops.values())
        for ops in others.values()))
    return numbers and words and lists and ranges and schemas


def stack_facts() -> dict[str, Any]:
    """onnx's and onnxruntime's versions and limits, from the disk cache when the
    installation has not changed: importing both costs ~0.2-0.5 s, which a warm
    `envdoctor check` without model files should not pay."""
    from envdoctor import diskcache

    if not diskcache.enabled():
        return _stack_from_imports()
    stamp = _install_stamp()
    path = diskcache.entry_file("onnx-stack", repr(stamp))
    cached = diskcache.read(path, STACK_CACHE_SCHEMA, stamp)
    if cached is not None and _is_stack(cached):  # a damaged entry is a miss (helper-93: an error row every run)
        return cached
    facts = _stack_from_imports()
    diskcache.write(path, STACK_CACHE_SCHEMA, stamp, facts)
    return facts


def gather(ctx: Any) -> OnnxFacts:
    released_only, _ = ctx.env_var(RELEASED_ONLY_VAR)
    torch_opset, torch_reason, torch_max = _torch_default_opset(ctx)
    paths = _model_paths(ctx)
    stack = _stack_from_imports() if paths else stack_facts()  # reading models imports onnx anyway
    return OnnxFacts(
        onnx_version=stack["onnx_version"],
        onnx_max_opset=stack["onnx_max_opset"],
        onnx_max_ir_version=stack["onnx_max_ir_version"],
        runtime=RuntimeFacts(**stack["runtime"]),
        torch_default_opset=torch_opset,
        torch_reason=torch_reason,
        released_only=released_only,
        models=tuple(read_model(p) for p in paths),
        torch_max_opset=torch_max,
    )


# -- judging ---------------------------------------------------------------------------


def _suggested_opset(min_opset: int, runtime_max: int | None) -> int:
    target = max(PREFERRED_OPSET, min_opset)
    if runtime_max is not None:
        target = min(target, runtime_max)
    return max(target, min_opset)


def _exportable(facts: OnnxFacts, opset: int) -> int:
    """`opset`, or torch's newest when it cannot write that one: a fix naming onnxruntime's
    opset 28 failed with 'Unsupported onnx_opset_version: 28' on torch 2.13 (helper-42)."""
    return min(opset, facts.torch_max_opset) if facts.torch_max_opset is not None else opset


def _rule_model_unusable(model: ModelFile, facts: OnnxFacts, min_opset: int) -> list[Finding]:
    """A file that is not a model, or a model that imports no ai.onnx opset: nothing else can be judged."""
    if model.info is None:
        fix = ("check the path given to --onnx, the `onnx` config key or [check.\"onnx.opset\"] files" if model.unreadable
               else "re-export the model, or pass the .onnx file itself")
        return [Finding(Status.ERROR, f"{model.path}: {model.problem}", fix)]
    if model.info.opset is None and model.info.uses_default_domain:
        return [Finding(Status.ERROR, f"{model.path}: uses ai.onnx operators but imports no ai.onnx opset (not a valid "
                        "model)", "re-export the model with torch.onnx.export(..., opset_version=17)")]
    return []


def _rule_model_missing_data(model: ModelFile, facts: OnnxFacts, min_opset: int) -> list[Finding]:
    """Weights stored in external data files that are missing or short: onnxruntime cannot load the model."""
    if not model.missing_data:
        return []
    more = len(model.missing_data) - 3
    shown = "; ".join(model.missing_data[:3]) + (f"; and {more} more" if more > 0 else "")
    return [Finding(Status.FAIL, f"{model.path}: its weights are stored in external data that is missing or short "
                    f"({shown}): onnxruntime cannot load it",
                    "copy the external data files next to the .onnx file (paths are relative to it), or re-export "
                    "with onnx.save_model(model, path, save_as_external_data=False) when it fits in 2 GiB")]


def _rule_model_mode_refused(model: ModelFile, facts: OnnxFacts, min_opset: int) -> list[Finding]:
    """A Resize/Upsample whose mode onnxruntime does not know: the model does not load at all."""
    assert model.info is not None
    bad = [n for n in model.info.live_interpolation() if n.mode not in LOADABLE_MODES]
    if not bad:
        return []
    kinds = "/".join(sorted({n.op for n in bad}))
    modes = ", ".join(sorted({repr(n.mode) if n.mode != "<not text>" else "not text" for n in bad}))
    names = ", ".join(repr(n.where) for n in bad[:EXAMPLES]) + (", ..." if len(bad) > EXAMPLES else "")
    return [Finding(Status.FAIL, f"{model.path}: {len(bad)} {kinds} node(s) with mode {modes} ({names}): onnxruntime "
                    "refuses to load the model; it takes 'nearest', 'linear' or 'cubic', in lower case",
                    "re-export with torch.onnx.export (it writes a valid mode), or set each node's mode attribute to "
                    "'nearest', 'linear' or 'cubic' with onnx.helper and save the model again")]


def _rule_model_interpolation(model: ModelFile, facts: OnnxFacts, min_opset: int) -> list[Finding]:
    """Resize/Upsample below opset 11 does not match PyTorch's interpolate (PITFALLS 7): the
    linear and cubic modes (no align_corners, other pixel centres) fail; nearest, which
    picks the same pixels for whole-number scales (helper-42: max difference 0.0 through
    onnxruntime), warns: a size that is no multiple of the input may round otherwise."""
    assert model.info is not None
    early = [n for n in model.info.live_interpolation()
             if n.opset is not None and n.opset < min_opset and n.mode in LOADABLE_MODES]
    if not early:
        return []
    smooth = [n for n in early if n.mode != "nearest"]
    shown = smooth or early
    kinds = "/".join(sorted({n.op for n in shown}))
    modes = "/".join(sorted({n.mode for n in shown}))
    names = ", ".join(repr(n.where) for n in shown[:EXAMPLES]) + (", ..." if len(shown) > EXAMPLES else "")
    opsets = "/".join(str(o) for o in sorted({n.opset for n in shown if n.opset is not None}))
    fix = (f"torch.onnx.export(model, args, 'model.onnx', opset_version="
           f"{_exportable(facts, _suggested_opset(min_opset, facts.runtime.max_opset))})")
    if smooth:
        return [Finding(Status.FAIL, f"{model.path}: {len(smooth)} {kinds} node(s) in {modes} mode at opset {opsets} "
                        f"({names}); expected opset >= {min_opset}: before opset 11 ONNX's {modes} Resize/Upsample does "
                        "not match PyTorch's interpolate (no align_corners, other pixel centres)", fix)]
    return [Finding(Status.WARN, f"{model.path}: {len(early)} {kinds} node(s) in nearest mode at opset {opsets} ({names}); "
                    f"expected opset >= {min_opset}: nearest matches PyTorch for whole-number scale factors, but an "
                    "output size that is no multiple of the input may pick other pixels before opset 11", fix)]


def _rule_model_unknown_ops(model: ModelFile, facts: OnnxFacts, min_opset: int) -> list[Finding]:
    """An ai.onnx operator the model's opset does not define: onnxruntime refuses the whole model."""
    assert model.info is not None
    refused_as_deprecated = facts.runtime.deprecated  # None: no onnxruntime to ask
    live = [op for op in model.info.unknown_ops if (op.function is None or op.function in model.info.called)
            and (op.deprecated is None or refused_as_deprecated is None
                 or f"{op.op}:{op.deprecated}" in refused_as_deprecated)]  # one it still runs is no finding
    if not live:
        return []
    shown = "; ".join(f"{op.op} ({op.where!r}) at opset {op.opset}, " + _why_unknown(op) for op in live[:EXAMPLES])
    more = f"; and {len(live) - EXAMPLES} more" if len(live) > EXAMPLES else ""
    needed = max((op.since for op in live if op.since), default=None)
    opset = _exportable(facts, max(needed or 0, _suggested_opset(min_opset, facts.runtime.max_opset)))
    replace = sorted({f"{REPLACED_BY[op.op]} in place of {op.op}" for op in live if op.op in REPLACED_BY and not op.since})
    fix = (f"torch.onnx.export(..., opset_version={opset}), or onnx.version_converter.convert_version(model, {opset})"
           if needed else
           f"export with {', '.join(replace)}: torch.onnx.export(..., opset_version={opset}) writes them" if replace else
           "give the operator its own domain and register it with onnxruntime (a custom op library), or export it "
           "as standard operators")
    if all(op.deprecated is not None for op in live) and refused_as_deprecated is None:
        return [Finding(Status.WARN, f"{model.path}: {shown}{more}: onnx's schemas deprecate it there, and an "
                        "onnxruntime that does too refuses to load the model (none is installed here to ask)", fix)]
    return [Finding(Status.FAIL, f"{model.path}: {shown}{more}: onnxruntime refuses to load the model (no such op "
                    "registered at that opset, or only as deprecated)", fix)]


REPLACED_BY = {"Upsample": "Resize", "Scatter": "ScatterElements"}  # what ONNX names in their place


def _why_unknown(op: UnknownOp) -> str:
    if op.deprecated is not None:
        return f"deprecated from opset {op.deprecated}" + (f", defined again from opset {op.since}" if op.since else "")
    return f"defined from opset {op.since}" if op.since else "defined in no ai.onnx opset"


def _rule_model_beyond_runtime(model: ModelFile, facts: OnnxFacts, min_opset: int) -> list[Finding]:
    """An opset or IR version newer than the installed onnxruntime loads."""
    assert model.info is not None
    rt, found = facts.runtime, []
    opset = max(filter(None, (model.info.opset, model.info.highest.get("ai.onnx"))), default=None)
    if opset is not None and rt.max_opset is not None and opset > rt.max_opset:
        if facts.released_only == "0" and rt.dev_opset is not None and opset <= rt.dev_opset:
            found.append(Finding(Status.WARN, f"{model.path}: opset {opset} is beyond onnxruntime {rt.version}'s released "
                                 f"opset {rt.max_opset}; it loads only because {RELEASED_ONLY_VAR}=0 (an opset under "
                                 "development)", f"torch.onnx.export(..., opset_version={_exportable(facts, rt.max_opset)})"))
        else:
            found.append(Finding(Status.FAIL, f"{model.path}: opset {opset}; onnxruntime {rt.version} runs up to opset "
                                 f"{rt.max_opset} and will refuse it",
                                 f"pip install -U onnxruntime, or torch.onnx.export(..., opset_version={_exportable(facts, rt.max_opset)})"))
    if rt.max_ir_version is not None and model.info.ir_version > rt.max_ir_version:
        found.append(Finding(Status.FAIL, f"{model.path}: IR version {model.info.ir_version}; onnxruntime {rt.version} "
                             f"loads up to IR version {rt.max_ir_version}", "pip install -U onnxruntime"))
    return found


def _rule_model_ml_beyond_runtime(model: ModelFile, facts: OnnxFacts, min_opset: int) -> list[Finding]:
    """An ai.onnx.ml opset newer than the installed onnxruntime loads (helper-92: only
    ai.onnx's limit was compared; sklearn-onnx exports trip this one)."""
    assert model.info is not None
    rt, found = facts.runtime, []
    ml = max(filter(None, (model.info.opsets.get(ML_DOMAIN), model.info.highest.get(ML_DOMAIN))), default=None)
    if ml is not None and rt.ml_max_opset is not None and ml > rt.ml_max_opset and facts.released_only == "0":
        # an opset under development loads with the variable at 0, and warns (helper-95)
        found.append(Finding(Status.WARN, f"{model.path}: {ML_DOMAIN} opset {ml} is beyond onnxruntime {rt.version}'s "
                             f"released {ML_DOMAIN} opset {rt.ml_max_opset}; it loads only because "
                             f"{RELEASED_ONLY_VAR}=0 (an opset under development), if at all",
                             f"pip install -U onnxruntime, or export again for {ML_DOMAIN} {rt.ml_max_opset}"))
    elif ml is not None and rt.ml_max_opset is not None and ml > rt.ml_max_opset:
        found.append(Finding(Status.FAIL, f"{model.path}: {ML_DOMAIN} opset {ml}; onnxruntime {rt.version} runs up to "
                             f"{ML_DOMAIN} opset {rt.ml_max_opset} and will refuse it",
                             f"pip install -U onnxruntime, or export again for {ML_DOMAIN} {rt.ml_max_opset} "
                             f"(skl2onnx: target_opset={{'': {_exportable(facts, rt.max_opset or 17)}, "
                             f"'{ML_DOMAIN}': {rt.ml_max_opset}}})"))
    return found


def _rule_model_below_runtime(model: ModelFile, facts: OnnxFacts, min_opset: int) -> list[Finding]:
    """An opset older than onnxruntime supports: some of its operators have no kernel there
    (helper-92: Relu at opset 1 does not load; at 6 it does)."""
    assert model.info is not None
    opset, kernels = model.info.opset, facts.runtime.cpu_kernels
    if opset is None or opset >= OLDEST_OPSET or facts.runtime.version is None:
        return []
    fix = (f"onnx.version_converter.convert_version(model, {min_opset}), or export again: torch.onnx.export(..., "
           f"opset_version={_exportable(facts, _suggested_opset(min_opset, facts.runtime.max_opset))})")
    if kernels is None:  # no kernel registry to ask
        return [Finding(Status.WARN, f"{model.path}: opset {opset}; onnxruntime supports opset {OLDEST_OPSET} and later, "
                        "and may have no implementation of an operator at this one ('Could not find an implementation "
                        "for Relu(1)')", fix)]
    missing = []
    for call in sorted(model.info.called):
        domain, _, op = call.partition(":")
        schema = _schema_at(op, opset) if domain in DEFAULT_DOMAINS and call not in model.info.functions else None
        if schema is not None and not any(a <= schema.since_version <= b for a, b in kernels.get(op, ())):
            missing.append(f"{_clean(op)}({schema.since_version})")
    if not missing:
        return []  # every operator has a CPU kernel at its version: it loads (Identity at opset 1 does)
    shown = ", ".join(missing[:EXAMPLES]) + (", ..." if len(missing) > EXAMPLES else "")
    return [Finding(Status.FAIL, f"{model.path}: opset {opset}: onnxruntime {facts.runtime.version} has no CPU "
                    f"implementation of {shown} and refuses the model ('Could not find an implementation'); it "
                    f"supports opset {OLDEST_OPSET} and later", fix)]


def _rule_model_unknown_domain_ops(model: ModelFile, facts: OnnxFacts, min_opset: int) -> list[Finding]:
    """An operator of a domain onnxruntime knows (ai.onnx.ml, com.microsoft) that it defines
    not at all at the model's version of that domain, or only as deprecated there (helper-95:
    TreeEnsembleRegressor at ai.onnx.ml 5, com.microsoft:NoSuchOp: refused, and ok)."""
    assert model.info is not None
    others = facts.runtime.other_schemas
    if others is None:
        return []
    refused = []
    for call in sorted(model.info.called):
        domain, _, op = call.partition(":")
        version = model.info.opsets.get(domain)
        if domain in DEFAULT_DOMAINS or domain not in others or call in model.info.functions or version is None:
            continue
        in_force = [entry for entry in others[domain].get(op, []) if entry[0] <= version]
        if not in_force:
            refused.append(f"{_clean(domain)}:{_clean(op)} at {_clean(domain)} {version}, defined "
                           + (f"from {others[domain][op][0][0]}" if others[domain].get(op) else "by no version"))
        elif max(in_force)[1]:
            refused.append(f"{_clean(domain)}:{_clean(op)} at {_clean(domain)} {version}, deprecated from {max(in_force)[0]}")
    if not refused:
        return []
    shown = "; ".join(refused[:EXAMPLES]) + (f"; and {len(refused) - EXAMPLES} more" if len(refused) > EXAMPLES else "")
    return [Finding(Status.FAIL, f"{model.path}: {shown}: onnxruntime {facts.runtime.version} refuses to load the model "
                    "('No Op registered', 'is deprecated in domain_version')",
                    "export again with operators that domain defines at the version the model imports (a converter "
                    "such as skl2onnx picks them for its target_opset), or raise the domain's version in opset_import")]


def _rule_model_unknown_domain(model: ModelFile, facts: OnnxFacts, min_opset: int) -> list[Finding]:
    """Operators of a domain onnxruntime defines no schema for and the model no function for:
    it loads only with a custom-op library registered (helper-92: 'acme.ops:Foo(-1) is not a
    registered function/op')."""
    assert model.info is not None
    known = facts.runtime.domains
    if known is None:
        return []
    foreign: dict[str, list[str]] = {}
    for call in sorted(model.info.called):
        domain, _, op = call.partition(":")
        if domain in DEFAULT_DOMAINS or domain in known or call in model.info.functions:
            continue
        foreign.setdefault(domain, []).append(op)
    if not foreign:
        return []
    unimported = sorted(d for d in foreign if d not in model.info.opsets)
    if unimported:  # no library helps: "No opset import for domain 'zz'" (helper-95)
        return [Finding(Status.FAIL, f"{model.path}: uses operators of domain {', '.join(map(_clean, unimported))} but "
                        "imports no opset of it: onnxruntime refuses the model ('No opset import for domain')",
                        "add the domain to the model's opset_import (onnx.helper.make_opsetid(DOMAIN, 1)), or export again")]
    said = "; ".join(f"{_clean(d)} ({', '.join(_clean(o) for o in ops[:EXAMPLES])}{', ...' if len(ops) > EXAMPLES else ''})"
                     for d, ops in sorted(foreign.items()))
    return [Finding(Status.WARN, f"{model.path}: uses operators of a domain onnxruntime {facts.runtime.version} does not "
                    f"define: {said}; it loads only where a custom-op library registers them",
                    "SessionOptions().register_custom_ops_library(PATH) before InferenceSession (and ship the library "
                    "with the model), or export those operators as standard ones")]


def _model_notes(model: ModelFile, facts: OnnxFacts) -> list[str]:
    """What is worth saying about a model that is no finding."""
    opset, notes = model.info.opset if model.info else None, []
    if model.info is not None and facts.runtime.version is None:
        notes.append("onnxruntime is not installed: not checked whether it runs this model")
    if opset is not None and opset > facts.onnx_max_opset:
        notes.append(f"opset {opset} is newer than the installed onnx {facts.onnx_version} knows ({facts.onnx_max_opset})")
    return notes


def _judge_model(model: ModelFile, facts: OnnxFacts, min_opset: int) -> list[Finding]:
    """The findings for one model file; with several models each fix says which one it is for."""
    findings = _rule_model_unusable(model, facts, min_opset)
    if not findings:
        findings = (_rule_model_missing_data(model, facts, min_opset) + _rule_model_mode_refused(model, facts, min_opset)
                    + _rule_model_interpolation(model, facts, min_opset)
                    + _rule_model_unknown_ops(model, facts, min_opset)
                    + _rule_model_beyond_runtime(model, facts, min_opset)
                    + _rule_model_ml_beyond_runtime(model, facts, min_opset)
                    + _rule_model_below_runtime(model, facts, min_opset)
                    + _rule_model_unknown_domain_ops(model, facts, min_opset)
                    + _rule_model_unknown_domain(model, facts, min_opset))
    if len(facts.models) > 1:
        name = Path(model.path).name
        findings = [f.replace(fix=f"{name}: {f.fix}") if f.fix else f for f in findings]
    return findings


def _model_fact(model: ModelFile, findings: list[Finding], notes: list[str]) -> dict[str, Any]:
    status = max((f.status for f in findings), key=_rank, default=Status.OK)
    fact: dict[str, Any] = {"path": model.path, "status": status.value}
    if model.info is None:
        fact["problem"] = model.problem
    else:
        info = model.info
        fact.update(
            ir_version=info.ir_version,
            opsets=dict(info.opsets),
            nodes=info.nodes,
            resize_nodes=sum(1 for n in info.interpolation if n.op == "Resize"),
            upsample_nodes=sum(1 for n in info.interpolation if n.op == "Upsample"),
        )
    fact["findings"] = [f.message for f in findings] + notes
    return fact


def _rank(status: Status) -> tuple[int, int]:
    """Severity, then fail before error: a definite finding speaks louder than an unreadable file."""
    return (status.severity, 1 if status is Status.FAIL else 0)


def _rule_released_only_var(facts: OnnxFacts, min_opset: int) -> list[Finding]:
    """ALLOW_RELEASED_ONNX_OPSET_ONLY other than 0/1 makes onnxruntime refuse every model."""
    if facts.runtime.version is None or facts.released_only in (None, "", "0", "1"):
        return []
    return [Finding(Status.FAIL, f"{RELEASED_ONLY_VAR}={facts.released_only!r}; onnxruntime accepts only 0 or 1 and "
                    "refuses every model otherwise", f"unset {RELEASED_ONLY_VAR}", env={RELEASED_ONLY_VAR: None})]


def _rule_torch_default_opset(facts: OnnxFacts, min_opset: int) -> list[Finding]:
    """torch.onnx.export's default opset: below the Resize fix, or beyond what onnxruntime runs."""
    t, rt, found = facts.torch_default_opset, facts.runtime, []
    if t is not None and t < min_opset:
        found.append(Finding(Status.WARN, f"torch.onnx.export uses opset {t} by default; expected >= {min_opset}: "
                             "Resize/Upsample below opset 11 does not match PyTorch's interpolate",
                             f"torch.onnx.export(..., opset_version={_exportable(facts, _suggested_opset(min_opset, rt.max_opset))})"))
    if t is not None and rt.max_opset is not None and t > rt.max_opset:
        found.append(Finding(Status.WARN, f"torch.onnx.export uses opset {t} by default; onnxruntime {rt.version} runs "
                             f"up to opset {rt.max_opset}", f"torch.onnx.export(..., opset_version={_exportable(facts, rt.max_opset)})"))
    return found


def _facts_out(facts: OnnxFacts, min_opset: int, model_facts: list[dict[str, Any]]) -> dict[str, Any]:
    rt = facts.runtime
    out: dict[str, Any] = {
        "onnx_version": facts.onnx_version,
        "onnx_max_opset": facts.onnx_max_opset,
        "onnx_max_ir_version": facts.onnx_max_ir_version,
        "onnxruntime_version": rt.version,
        "onnxruntime_max_opset": rt.max_opset,
        "onnxruntime_max_opset_source": rt.max_opset_source,
        "onnxruntime_dev_opset": rt.dev_opset,
        "onnxruntime_max_ir_version": rt.max_ir_version,
        "onnxruntime_max_ml_opset": rt.ml_max_opset,
        "onnxruntime_domains": list(rt.domains) if rt.domains is not None else None,
        "torch_default_export_opset": facts.torch_default_opset,
        "min_opset": min_opset,
        "models": model_facts,
        "models_failing": sum(1 for m in model_facts if m["status"] in ("fail", "error")),
    }
    if rt.reason:
        out["onnxruntime_reason"] = rt.reason
    if facts.torch_reason:
        out["torch_default_export_opset_reason"] = facts.torch_reason
    if facts.released_only is not None:
        out[RELEASED_ONLY_VAR] = facts.released_only
    return out


def judge(facts: OnnxFacts, settings: Mapping[str, Any]) -> Result:
    min_opset = int(settings["min_opset"])
    findings = _rule_released_only_var(facts, min_opset) + _rule_torch_default_opset(facts, min_opset)
    model_facts = []
    for model in facts.models:
        model_findings = _judge_model(model, facts, min_opset)
        findings.extend(model_findings)
        model_facts.append(_model_fact(model, model_findings, _model_notes(model, facts)))
    out = _facts_out(facts, min_opset, model_facts)
    # fail before error at the same severity: verdict keeps this order and names the first loudest status
    findings.sort(key=lambda f: _rank(f.status), reverse=True)
    if findings:
        out["findings"] = [f.message for f in findings]
    return verdict(findings, out, _ok_summary(facts))


def _ok_summary(facts: OnnxFacts) -> str:
    rt = facts.runtime
    parts = [f"onnx {facts.onnx_version} knows opset <= {facts.onnx_max_opset}"]
    if rt.version is None:
        parts.append("onnxruntime not installed")
    elif rt.max_opset is None:
        parts.append(f"onnxruntime {rt.version} (highest opset unknown)")
    else:
        parts.append(f"onnxruntime {rt.version} runs opset <= {rt.max_opset}")
    if facts.torch_default_opset is not None:
        parts.append(f"torch exports opset {facts.torch_default_opset} by default")
    elif facts.torch_reason:
        parts.append(f"torch's default export opset not checked: {facts.torch_reason}")
    if facts.models:
        parts.append(f"{len(facts.models)} model(s) fine")
    return "; ".join(parts)


CHECK = Check(
    id="onnx.opset",
    title="ONNX exports at an opset that matches PyTorch (Resize >= 11), that defines every operator the model uses, and that the installed onnxruntime runs",
    gather=gather,
    judge=judge,
    # Loading onnxruntime (and building sessions to find its limits) happens in
    # envdoctor's own process, and under preflight() that is the training script:
    # intrusive, so `envdoctor check` only.
    modes=("check",),
    intrusive=True,
    explain=__doc__ or "",
    needs=("onnx",),
    # it reads the torch facts too (torch.onnx's default opset), and the torch probe's own
    # bound is 60 s: at the default 15 a slow or hung probe cut the whole check off, files and
    # runtime with it, where it should cost the torch part only (helper-120). As the torch checks
    timeout=90.0,
    config={"files": [], "min_opset": 11},
    metrics=(
        Metric("onnx_max_opset", "onnx_max_opset", "Highest ai.onnx opset the installed onnx package knows"),
        Metric("onnxruntime_max_opset", "onnxruntime_max_opset", "Highest ai.onnx opset the installed onnxruntime loads"),
        Metric("onnx_torch_default_export_opset", "torch_default_export_opset",
               "ai.onnx opset torch.onnx.export uses when none is given"),
        Metric("onnx_models_failing", "models_failing",
               "Given .onnx models with an opset problem or that could not be read"),
    ),
)
