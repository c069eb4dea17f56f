"""onnx.opset: real .onnx files made with onnx.helper (and torch.onnx.export in a
subprocess), read by the check and, where cheap, run by the installed onnxruntime."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from envdoctor.checks import onnx_opset
from envdoctor.checks.onnx_opset import (
    CHECK,
    InterpolationNode,
    ModelFile,
    ModelInfo,
    OnnxFacts,
    RuntimeFacts,
    judge,
    parse_model,
    read_model,
    runtime_facts,
    strip_weights,
)
from envdoctor.context import Session
from envdoctor.errors import ParseError, Unavailable
from envdoctor.model import Status
from envdoctor.runner import Plan, run_one

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is part of envdoctor[onnx] and installed in CI")


# -- model builders ----------------------------------------------------------------------


def _finish(graph, opset: int, functions=()) -> onnx.ModelProto:
    ids = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=ids, functions=list(functions))
    # onnx.helper stamps its own newest IR version; use the lowest that the opset needs,
    # as exporters do, so the installed onnxruntime can load what it should.
    model.ir_version = max(7, helper.find_min_ir_version_for(ids, ignore_unknown=True))
    return model


def _io(name: str, shape=None):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _interp_node(op: str, opset: int, out: str = "y", name: str = "up") -> tuple[onnx.NodeProto, list]:
    """A x2 upsampling node as the exporter writes it at `opset`, plus its constant inputs."""
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), f"{name}_scales")
    if op == "Resize" and opset >= 11:
        roi = numpy_helper.from_array(np.array([], np.float32), f"{name}_roi")
        node = helper.make_node("Resize", ["x", roi.name, scales.name], [out], name=name, mode="linear",
                                coordinate_transformation_mode="half_pixel")
        return node, [roi, scales]
    return helper.make_node(op, ["x", scales.name], [out], name=name, mode="linear"), [scales]


def interp_model(op: str, opset: int) -> onnx.ModelProto:
    node, inits = _interp_node(op, opset)
    graph = helper.make_graph([node], "g", [_io("x", [1, 1, 3, 3])], [_io("y")], inits)
    return _finish(graph, opset)


def identity_model(opset: int) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="id")], "g",
                              [_io("x", [1])], [_io("y", [1])])
    return _finish(graph, opset)


def if_model(opset: int) -> onnx.ModelProto:
    """Resize hidden in the then-branch of an If: the walk must enter subgraphs."""
    node, inits = _interp_node("Resize", opset, out="then_y", name="resize_in_then")
    then_graph = helper.make_graph([node], "then_branch", [], [_io("then_y")], inits)
    else_graph = helper.make_graph([helper.make_node("Identity", ["x"], ["else_y"], name="keep")], "else_branch",
                                   [], [_io("else_y")])
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], name="choose", then_branch=then_graph, else_branch=else_graph)],
        "g", [cond, _io("x", [1, 1, 3, 3])], [_io("y")])
    return _finish(graph, opset)


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def run_check(files=(), torch=None, env=None, config=None):
    def torch_factory(session):
        if torch is None:
            raise Unavailable("no torch in this test")
        return torch

    session = Session(env_override=env or {}, torch_factory=torch_factory, onnx_files=tuple(Path(f) for f in files))
    return run_one(Plan(CHECK, {**CHECK.config, **(config or {})}, 30), session)


def model_fact(result, path):
    return next(m for m in result.facts["models"] if m["path"] == str(path))


# -- the installed onnxruntime ---------------------------------------------------------------


def test_runtime_limits_come_from_onnxruntime_itself():
    rt = runtime_facts()
    assert rt.version == ort.__version__
    assert rt.max_opset_source == "load_refusal", rt.reason
    assert rt.max_opset is not None and rt.max_opset >= 11
    assert rt.max_ir_version is not None and rt.max_ir_version >= 7
    # the schema registry may hold one opset still under development, never fewer than released
    assert rt.dev_opset is not None and rt.dev_opset >= rt.max_opset


def test_runtime_runs_its_max_opset_and_refuses_the_next():
    """What the check calls 'runs up to opset N' is what onnxruntime does."""
    top = runtime_facts().max_opset
    session = ort.InferenceSession(identity_model(top).SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([3.5], np.float32)
    assert session.run(None, {"x": x})[0].tolist() == [3.5]
    # only the opset past it: the next opset may need an IR version the runtime does not load
    # either (onnxruntime 1.23.2, the last for Python 3.10: opset 24 needs IR 12, it loads 11)
    beyond = identity_model(top + 1)
    beyond.ir_version = min(beyond.ir_version, runtime_facts().max_ir_version)
    with pytest.raises(Exception, match=f"Opset {top + 1}"):
        ort.InferenceSession(beyond.SerializeToString(), providers=["CPUExecutionProvider"])


def test_runtime_limit_falls_back_to_its_schemas_and_says_so(monkeypatch):
    """When the refusal cannot be read (another wording, or ALLOW_RELEASED_ONNX_OPSET_ONLY=0
    in our own environment), the schema registry's newest opset stands in, labelled."""
    monkeypatch.setattr(onnx_opset, "_refusal", lambda *args: None)
    rt = onnx_opset.probe_runtime()
    assert rt.max_opset_source == "schema_registry" and rt.max_opset == rt.dev_opset >= 11
    assert "under development" in rt.reason


def test_runtime_absent_is_a_fact_not_an_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # makes `import onnxruntime` raise ImportError
    rt = onnx_opset.probe_runtime()
    assert rt.version is None and rt.max_opset is None
    assert "not installed" in rt.reason

    monkeypatch.setattr(onnx_opset, "runtime_facts", lambda: rt)
    good = save(interp_model("Resize", 13), tmp_path / "r13.onnx")
    result = run_check([good])
    assert result.status is Status.OK, result.summary
    assert result.facts["onnxruntime_version"] is None
    assert "onnxruntime not installed" in result.summary
    assert any("not checked whether it runs" in f for f in model_fact(result, good)["findings"])


# -- model files ---------------------------------------------------------------------------


def _op_model(op: str, opset: int, in_function: str | None = None, called: bool = True) -> onnx.ModelProto:
    """`op` on x, in the main graph or in a model-local function the graph calls (or not)."""
    if in_function is None:
        graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="the_op")], "g", [_io("x", [1, 4])], [_io("y")])
        return _finish(graph, opset)
    function = helper.make_function("local", in_function, ["a"], ["b"], [helper.make_node(op, ["a"], ["b"])],
                                     [helper.make_opsetid("", opset)])
    node = helper.make_node(in_function if called else "Identity", ["x"], ["y"], name="call",
                            domain="local" if called else "")
    graph = helper.make_graph([node], "g", [_io("x", [1, 4])], [_io("y")])
    model = _finish(graph, opset, functions=[function])
    model.opset_import.append(helper.make_opsetid("local", 1))
    return model


@pytest.mark.parametrize("op, opset, said", [
    ("Gelu", 13, "Gelu ('the_op') at opset 13, defined from opset 20"),  # helper-76
    ("Frobnicate", 17, "Frobnicate ('the_op') at opset 17, defined in no ai.onnx opset"),
])
def test_an_operator_the_models_opset_does_not_define_fails_as_onnxruntime_refuses_it(tmp_path, op, opset, said):
    """helper-76: a model using Gelu (ai.onnx from opset 20) at opset 13 was "fine"; onnxruntime
    refuses to load it: INVALID_GRAPH ... No Op registered."""
    path = save(_op_model(op, opset), tmp_path / "m.onnx")
    with pytest.raises(Exception, match="(?i)no op registered|not a registered function"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    r = run_check([path])
    assert r.status is Status.FAIL and said in r.summary and "onnxruntime refuses to load the model" in r.summary, r.summary
    if op == "Gelu":
        assert "opset_version=20" in r.remediation, r.remediation


def test_operators_the_opset_defines_or_an_uncalled_function_holds_pass(tmp_path):
    for name, model in (("gelu20", _op_model("Gelu", 20)), ("relu13", _op_model("Relu", 13)),
                        ("uncalled", _op_model("Gelu", 13, in_function="helper", called=False))):
        path = save(model, tmp_path / f"{name}.onnx")
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # loads
        assert run_check([path]).status is Status.OK, name
    called = save(_op_model("Gelu", 13, in_function="helper"), tmp_path / "called.onnx")
    r = run_check([called])
    assert r.status is Status.FAIL and "function helper/" in r.summary, r.summary


@pytest.mark.parametrize("op, opset, said, fix", [
    ("Upsample", 11, "Upsample ('up') at opset 11, deprecated from opset 10", "Resize in place of Upsample"),
    ("Upsample", 10, "Upsample ('up') at opset 10, deprecated from opset 10", "Resize in place of Upsample"),
    ("Scatter", 13, "Scatter ('sc') at opset 13, deprecated from opset 11", "ScatterElements in place of Scatter"),
])
def test_an_operator_its_opset_deprecates_fails_as_onnxruntime_refuses_it(tmp_path, op, opset, said, fix):
    """helper-80, helper-82: Upsample at opset 11 and Scatter at 13 were "fine" (onnx returns
    their deprecated schemas); onnxruntime refuses: "Op registered for Upsample is deprecated"."""
    if op == "Upsample":
        node, inits = _interp_node("Upsample", 9)  # the scales as an input, as Upsample-9 takes them
        graph = helper.make_graph([node], "g", [_io("x", [1, 1, 3, 3])], [_io("y")], inits)
    else:
        node = helper.make_node("Scatter", ["x", "i", "u"], ["y"], name="sc")
        graph = helper.make_graph([node], "g", [_io("x", [2, 2]), helper.make_tensor_value_info("i", TensorProto.INT64, [2, 2]),
                                                _io("u", [2, 2])], [_io("y")])
    path = save(_finish(graph, opset), tmp_path / "m.onnx")
    with pytest.raises(Exception, match="(?i)is deprecated in domain_version"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    r = run_check([path])
    assert r.status is Status.FAIL and said in r.summary and "onnxruntime refuses to load the model" in r.summary, r.summary
    assert fix in r.remediation, r.remediation


def test_a_schema_onnx_deprecates_but_onnxruntime_runs_is_no_finding(tmp_path, monkeypatch):
    """onnx 1.19 deprecates GroupNormalization-18; onnxruntime 1.32 loads it: whether a deprecated
    operator is refused is the runtime's own schemas' word. Without a runtime to ask: a warning."""
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn", num_groups=2)
    graph = helper.make_graph([node], "g", [_io("x", [1, 4, 2, 2]), _io("s", [4]), _io("b", [4])], [_io("y")])
    path = save(_finish(graph, 18), tmp_path / "gn18.onnx")
    if onnx.defs.get_schema("GroupNormalization", 18, "").deprecated is False:
        pytest.skip("this onnx does not deprecate GroupNormalization-18")
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # loads
    assert run_check([path]).status is Status.OK
    rt = onnx_opset.probe_runtime()._replace(deprecated=None)  # as if no runtime could be asked
    monkeypatch.setattr(onnx_opset, "runtime_facts", lambda: rt)
    r = run_check([path])
    assert r.status is Status.WARN and "none is installed here to ask" in r.summary, r.summary


def test_resize_at_opset_10_fails(tmp_path):
    path = save(interp_model("Resize", 10), tmp_path / "resize10.onnx")
    result = run_check([path])
    assert result.status is Status.FAIL
    assert "resize10.onnx" in result.summary and "Resize" in result.summary and "opset 10" in result.summary
    assert "opset_version=17" in result.remediation
    fact = model_fact(result, path)
    assert fact["opsets"] == {"ai.onnx": 10} and fact["resize_nodes"] == 1 and fact["status"] == "fail"


def test_upsample_at_opset_9_fails(tmp_path):
    path = save(interp_model("Upsample", 9), tmp_path / "upsample9.onnx")
    result = run_check([path])
    assert result.status is Status.FAIL
    assert "Upsample" in result.summary and "'up'" in result.summary
    assert model_fact(result, path)["upsample_nodes"] == 1


def test_resize_at_opset_13_is_ok_and_runs(tmp_path):
    model = interp_model("Resize", 13)
    path = save(model, tmp_path / "resize13.onnx")
    result = run_check([path])
    assert result.status is Status.OK, result.summary
    assert model_fact(result, path)["resize_nodes"] == 1
    assert result.facts["models_failing"] == 0
    # and onnxruntime really runs it: a constant 3x3 image doubles to a constant 6x6
    out = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.full((1, 1, 3, 3), 2.0, np.float32)})[0]
    assert out.shape == (1, 1, 6, 6) and np.allclose(out, 2.0)


def test_resize_inside_an_if_branch_counts(tmp_path):
    path = save(if_model(10), tmp_path / "if10.onnx")
    result = run_check([path])
    assert result.status is Status.FAIL
    assert "choose.then_branch/resize_in_then" in result.summary


def test_resize_in_a_loop_body_and_a_local_function_counts():
    node, inits = _interp_node("Resize", 10, out="body_y", name="in_body")
    body = helper.make_graph([node], "body", [], [_io("body_y")], inits)
    fnode = helper.make_node("Upsample", ["a", "s"], ["b"], name="in_function")
    function = helper.make_function("local", "Up2", ["a", "s"], ["b"], [fnode], [helper.make_opsetid("", 9)])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["", ""], ["y"], name="loop", body=body),
         helper.make_node("Up2", ["x", "x"], ["z"], domain="local")],
        "g", [_io("x")], [_io("y"), _io("z")])
    model = _finish(graph, 10, functions=[function])
    model.opset_import.append(helper.make_opsetid("local", 1))
    info = parse_model(model.SerializeToString())
    assert {(n.op, n.where, n.opset) for n in info.interpolation} == {
        ("Resize", "loop.body/in_body", 10), ("Upsample", "function Up2/in_function", 9)}
    assert info.opsets == {"ai.onnx": 10, "local": 1}


def test_opset_beyond_the_runtime_fails_and_the_runtime_agrees(tmp_path):
    top = runtime_facts().max_opset
    model = identity_model(top + 1)
    path = save(model, tmp_path / "future.onnx")
    result = run_check([path])
    assert result.status is Status.FAIL
    assert f"opset {top + 1}" in result.summary and f"runs up to opset {top}" in result.summary
    assert "pip install -U onnxruntime" in result.remediation
    with pytest.raises(Exception):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_ir_version_beyond_the_runtime_fails(tmp_path):
    model = identity_model(13)
    model.ir_version = runtime_facts().max_ir_version + 1
    path = save(model, tmp_path / "newir.onnx")
    result = run_check([path])
    assert result.status is Status.FAIL and "IR version" in result.summary


@pytest.mark.parametrize("content, expected", [
    (b"", "no ir_version"),
    (b"this is not a model, just text\n", "not an ONNX model"),
    (b"\x08\x07\x3a\xff\xff\xff\x0f", "truncated"),  # ir_version 7, then a graph longer than the file
])
def test_a_file_that_is_not_a_model_is_an_error_naming_it(tmp_path, content, expected):
    path = tmp_path / "broken.onnx"
    path.write_bytes(content)
    result = run_check([path])
    assert result.status is Status.ERROR
    assert str(path) in result.summary and expected in result.summary
    assert result.remediation


def test_missing_file_and_directory_are_errors(tmp_path):
    missing = tmp_path / "nope.onnx"
    result = run_check([missing, tmp_path])
    assert result.status is Status.ERROR
    assert f"{missing}: does not exist" in result.summary
    assert f"{tmp_path}: is a directory" in result.summary
    assert "--onnx" in result.remediation
    # the config key a user sets is the top-level `onnx`; the fix named a `files` key that is
    # only valid under [check."onnx.opset"] (helper-34)
    assert "the `onnx` config key" in result.remediation


def test_truncated_real_model_is_an_error(tmp_path):
    data = interp_model("Resize", 13).SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    assert run_check([path]).status is Status.ERROR


def test_fail_outranks_error_and_every_file_is_reported(tmp_path):
    bad = save(interp_model("Resize", 10), tmp_path / "bad.onnx")
    good = save(interp_model("Resize", 17), tmp_path / "good.onnx")
    result = run_check([tmp_path / "gone.onnx", bad, good])
    assert result.status is Status.FAIL
    assert [m["status"] for m in result.facts["models"]] == ["error", "fail", "ok"]
    assert result.facts["models_failing"] == 2
    assert "gone.onnx: does not exist" in result.summary


def test_config_files_are_merged_with_onnx_files_once(tmp_path):
    path = save(interp_model("Resize", 10), tmp_path / "r10.onnx")
    other = save(interp_model("Resize", 11), tmp_path / "r11.onnx")
    result = run_check([path], config={"files": [str(path), str(other)]})
    assert [m["path"] for m in result.facts["models"]] == [str(path), str(other)]


def test_min_opset_is_configurable(tmp_path):
    path = save(interp_model("Resize", 11), tmp_path / "r11.onnx")
    assert run_check([path]).status is Status.OK
    result = run_check([path], config={"min_opset": 13})
    assert result.status is Status.FAIL and "expected opset >= 13" in result.summary


def test_weights_are_stepped_over_not_read(tmp_path):
    """A model's initializers are most of its bytes and none of its opset facts."""
    node, inits = _interp_node("Resize", 10)
    weights = numpy_helper.from_array(np.ones((2, 1024, 1024), np.float32), "weights")  # 8 MiB
    graph = helper.make_graph([node], "g", [_io("x")], [_io("y")], [weights, *inits])
    model = _finish(graph, 10)
    data = model.SerializeToString()
    stripped = strip_weights(io.BytesIO(data), len(data))
    assert len(data) > 8 * 1024 * 1024 and len(stripped) < 4096
    assert parse_model(stripped) == parse_model(data)
    path = save(model, tmp_path / "heavy.onnx")
    assert read_model(path).info.interpolation[0].opset == 10


# -- no files: versions and torch's default ----------------------------------------------------------


def test_no_files_is_ok_with_the_versions():
    result = run_check()
    assert result.status is Status.OK, result.summary
    facts = result.facts
    assert facts["onnx_version"] == onnx.__version__
    assert facts["onnx_max_opset"] == onnx.defs.onnx_opset_version()
    assert facts["onnxruntime_version"] == ort.__version__
    assert facts["torch_default_export_opset"] is None
    assert "no torch in this test" in facts["torch_default_export_opset_reason"]
    assert facts["models"] == [] and facts["models_failing"] == 0


def test_torch_default_below_11_warns():
    result = run_check(torch={"onnx_default_opset": 9})
    assert result.status is Status.WARN
    assert "opset 9 by default" in result.summary and "opset_version=17" in result.remediation


def test_torch_default_beyond_the_runtime_warns():
    top = runtime_facts().max_opset
    result = run_check(torch={"onnx_default_opset": top + 2})
    assert result.status is Status.WARN and f"opset_version={top}" in result.remediation


def test_torch_default_reported_when_fine():
    result = run_check(torch={"onnx_default_opset": 17})
    assert result.status is Status.OK and result.facts["torch_default_export_opset"] == 17
    assert "torch exports opset 17 by default" in result.summary


def test_torch_probe_without_the_fact_leaves_it_none_with_reason():
    result = run_check(torch={"version": "2.13.0"})
    assert result.facts["torch_default_export_opset"] is None
    assert "did not report" in result.facts["torch_default_export_opset_reason"]


def test_allow_released_opset_only_env():
    result = run_check(env={"ALLOW_RELEASED_ONNX_OPSET_ONLY": "true", "SECRET_TOKEN": "hunter2"})
    assert result.status is Status.FAIL and "unset ALLOW_RELEASED_ONNX_OPSET_ONLY" in result.remediation
    assert "hunter2" not in json.dumps(result.to_dict())
    assert run_check(env={"ALLOW_RELEASED_ONNX_OPSET_ONLY": "1"}).status is Status.OK


# -- the judge, on facts -----------------------------------------------------------------------------


def _facts(*models, rt=None, released_only=None, torch=None) -> OnnxFacts:
    rt = rt or RuntimeFacts("1.99.0", 26, "load_refusal", 27, 13)
    return OnnxFacts("1.23.2", 28, 14, rt, torch, None, released_only, tuple(models))


def _model(opset: int, *interp: tuple[str, int]) -> ModelFile:
    nodes = tuple(InterpolationNode(op, f"n{i}", o) for i, (op, o) in enumerate(interp))
    return ModelFile(f"m{opset}.onnx", ModelInfo(8, {"ai.onnx": opset}, 1 + len(nodes), nodes))


def test_judge_dev_opset_loads_only_with_the_switch():
    model = _model(27)
    assert judge(_facts(model), CHECK.defaults).status is Status.FAIL
    result = judge(_facts(model, released_only="0"), CHECK.defaults)
    assert result.status is Status.WARN and "ALLOW_RELEASED_ONNX_OPSET_ONLY=0" in result.summary
    assert judge(_facts(_model(28), released_only="0"), CHECK.defaults).status is Status.FAIL


def test_judge_suggests_an_opset_the_runtime_runs():
    old_runtime = RuntimeFacts("1.8.0", 14, "load_refusal", 14, 7)
    result = judge(_facts(_model(10, ("Resize", 10)), rt=old_runtime), {**CHECK.defaults, "min_opset": 11})
    assert result.status is Status.FAIL and "opset_version=14" in result.remediation


def test_judge_model_without_default_opset_but_default_ops_is_error():
    model = ModelFile("ml.onnx", ModelInfo(8, {"ai.onnx.ml": 3}, 2, (), True))
    assert judge(_facts(model), CHECK.defaults).status is Status.ERROR
    only_ml = ModelFile("ml.onnx", ModelInfo(8, {"ai.onnx.ml": 3}, 2, (), False))
    assert judge(_facts(only_ml), CHECK.defaults).status is Status.OK


def test_judge_notes_opsets_newer_than_installed_onnx_without_failing():
    rt = RuntimeFacts("9.0.0", 40, "load_refusal", 40, 20)
    result = judge(_facts(_model(30), rt=rt), CHECK.defaults)
    assert result.status is Status.OK
    assert any("newer than the installed onnx" in f for f in result.facts["models"][0]["findings"])


def test_metrics_name_facts_the_check_produces():
    result = run_check(torch={"onnx_default_opset": 17})
    for metric in CHECK.metrics:
        assert isinstance(result.facts[metric.fact], int), metric


def test_explain_says_what_why_and_fix():
    text = CHECK.explain
    assert "opset 11" in text and "PITFALLS 7" in text and "opset_version=17" in text
    assert CHECK.needs == ("onnx",)


# -- parsers of untrusted bytes: a value or ParseError, nothing else --------------------------------------------------

_SEEDS = [m.SerializeToString() for m in (interp_model("Resize", 10), if_model(13), identity_model(17))]


@st.composite
def damaged_models(draw):
    data = bytearray(draw(st.sampled_from(_SEEDS)))
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(data) - 1))
        data[i] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(data)))
    return bytes(data[:cut]) if draw(st.booleans()) else bytes(data)


def _value_or_parse_error(data: bytes):
    try:
        info = parse_model(strip_weights(io.BytesIO(data), len(data)))
    except ParseError:
        return None
    assert isinstance(info, ModelInfo)
    return info


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_any_bytes_give_model_info_or_parse_error(data):
    _value_or_parse_error(data)
    try:
        parse_model(data)
    except ParseError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_models())
def test_damaged_models_give_model_info_or_parse_error(data):
    _value_or_parse_error(data)


@settings(max_examples=50, deadline=None)
@given(st.integers(7, 26), st.lists(st.integers(1, 5000), max_size=4), st.booleans())
def test_stripping_weights_keeps_everything_else(opset, sizes, in_subgraph):
    """Differential: the weight-free reader agrees with onnx's own full decode."""
    model = if_model(opset if opset >= 11 else 11) if in_subgraph else interp_model("Resize", opset)
    for i, n in enumerate(sizes):
        model.graph.initializer.append(numpy_helper.from_array(np.arange(n, dtype=np.float32), f"w{i}"))
    data = model.SerializeToString()
    stripped = onnx.ModelProto.FromString(strip_weights(io.BytesIO(data), len(data)))
    expected = onnx.ModelProto.FromString(data)
    del expected.graph.initializer[:]
    assert stripped == expected


# -- for real: torch's own exporter, and onnxruntime against torch's numbers -------------------------------------------


_EXPORT = textwrap.dedent("""
    import sys, warnings
    import numpy as np, torch, torch.nn.functional as F
    warnings.simplefilter("ignore")
    out = sys.argv[1]

    class Up(torch.nn.Module):
        def forward(self, x):
            return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)

    x = torch.arange(16, dtype=torch.float32).reshape(1, 1, 4, 4)
    np.save(f"{out}/x.npy", x.numpy())
    np.save(f"{out}/torch.npy", Up()(x).numpy())
    for opset in (9, 10, 11, 17):
        torch.onnx.export(Up(), (x,), f"{out}/up{opset}.onnx", opset_version=opset, dynamo=False)
    print("torch" in sys.modules)
""")


@pytest.fixture(scope="module")
def torch_exports(tmp_path_factory):
    """torch.onnx.export in its own interpreter: envdoctor's processes never import torch."""
    pytest.importorskip("torch", reason="torch is not installed in this interpreter")
    out = tmp_path_factory.mktemp("torch_exports")
    proc = subprocess.run([sys.executable, "-c", _EXPORT, str(out)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 and "onnxscript" in proc.stderr:
        pytest.skip("this torch's ONNX exporter needs onnxscript, which is not installed")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.real
def test_torch_exports_below_11_fail_and_really_differ_from_torch(torch_exports):
    """PITFALLS 7 end to end: the opsets the check fails give onnxruntime numbers that
    differ from PyTorch's interpolate; the ones it passes match."""
    x = np.load(torch_exports / "x.npy")
    expected = np.load(torch_exports / "torch.npy")
    for opset, status in ((9, Status.FAIL), (10, Status.FAIL), (11, Status.OK), (17, Status.OK)):
        path = torch_exports / f"up{opset}.onnx"
        result = run_check([path])
        assert result.status is status, (opset, result.summary)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = session.run(None, {session.get_inputs()[0].name: x})[0]
        matches = got.shape == expected.shape and np.allclose(got, expected, atol=1e-5)
        assert matches is (status is Status.OK), (opset, np.abs(got - expected).max() if got.shape == expected.shape else got.shape)


@pytest.mark.real
def test_envdoctor_never_imports_torch_while_checking(torch_exports):
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from envdoctor.context import Session
        from envdoctor.runner import Plan, run_one
        from envdoctor.checks.onnx_opset import CHECK
        from envdoctor.errors import Unavailable
        def no_probe(session):
            raise Unavailable("probe not run")
        r = run_one(Plan(CHECK, dict(CHECK.config), 30),
                    Session(torch_factory=no_probe, onnx_files=(Path({str(torch_exports / 'up10.onnx')!r}),)))
        print(r.status.value, "torch" in sys.modules)
    """)
    env = {k: v for k, v in os.environ.items() if k != "ALLOW_RELEASED_ONNX_OPSET_ONLY"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["fail", "False"]


def test_stack_facts_are_cached_so_a_warm_run_imports_neither_onnx_nor_onnxruntime(tmp_path):
    """A second run without model files answers from the disk cache, with the same facts."""
    import subprocess
    import sys

    code = ("import json, sys\nfrom envdoctor.checks import onnx_opset\n"
            "facts = onnx_opset.stack_facts()\n"
            "print(json.dumps([facts['onnx_max_opset'], facts['runtime']['max_opset'], 'onnxruntime' in sys.modules,"
            " 'onnx' in sys.modules]))")
    env = {**__import__("os").environ, "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("ENVDOCTOR_NO_CACHE", None)
    first = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)
    second = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)
    assert first[2] is True and second[2] is False  # imported once, then served from the cache
    assert first[3] is False and second[3] is False  # onnx itself: read from its files, never imported
    assert first[:2] == second[:2] and isinstance(first[0], int)
    assert list((tmp_path / "envdoctor").glob("onnx-stack-*.json"))


@pytest.mark.parametrize("damage", [{}, {"onnx_version": None}, {"runtime": "x"}, {"runtime": {"max_opset": "28"}},
                                    {"runtime": {"surprise": 1}}, {"onnx_max_opset": [28]}, {"runtime": {}},
                                    {"onnx_max_opset": False}, {"onnx_max_opset": 10**400}])
def test_a_stack_cache_entry_of_the_wrong_shape_is_a_miss(tmp_path, monkeypatch, damage):
    """Helper-93: facts emptied or of the wrong types, the fingerprint intact, gave an
    error row ('the check broke: KeyError') on every run for a day."""
    from envdoctor.checks import onnx_opset

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("ENVDOCTOR_NO_CACHE", raising=False)
    truth = onnx_opset.stack_facts()
    (entry_file,) = (tmp_path / "envdoctor").glob("onnx-stack-*.json")
    entry = json.loads(entry_file.read_text())
    entry["facts"] = {} if not damage else {**entry["facts"], **damage}
    entry_file.write_text(json.dumps(entry))
    assert onnx_opset.stack_facts() == truth


def test_a_fifo_is_an_error_at_once_not_a_hang(tmp_path):
    import os
    import time as _time

    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    started = _time.monotonic()
    model = read_model(fifo)
    assert _time.monotonic() - started < 1
    assert model.unreadable and "not a regular file" in model.problem


def test_onnx_limits_from_files_equal_what_onnx_says_and_the_probe_model_is_onnx_helpers():
    """envdoctor.onnxfacts reads onnx's release table instead of importing onnx, and writes
    the probe model by hand: both must equal what onnx itself gives."""
    import onnx
    from onnx import TensorProto, helper

    from envdoctor.onnxfacts import onnx_limits, tiny_model

    assert onnx_limits() == {"onnx_version": onnx.__version__, "onnx_max_opset": onnx.defs.onnx_opset_version(),
                             "onnx_max_ir_version": onnx.IR_VERSION}
    for opset, ir in ((7, 1_000_000), (1_000_000, 7), (28, 14), (5, 3)):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "envdoctor_probe", [x], [y])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = ir
        assert tiny_model(opset, ir) == model.SerializeToString()


def test_onnx_release_table_reader_survives_bad_files(tmp_path):
    from envdoctor.onnxfacts import version_table

    for text in ("VERSION_TABLE = [", "VERSION_TABLE = f()", "", "\xff"):
        (tmp_path / "helper.py").write_text(text, errors="surrogateescape")
        assert version_table(tmp_path / "helper.py") is None
    (tmp_path / "helper.py").write_text("VERSION_TABLE: list = [('1.0', 3, 1, 1), ('1.23.0', 14, 28, 5, 1)]\n")
    assert version_table(tmp_path / "helper.py")[-1] == ("1.23.0", 14, 28, 5, 1)
    assert version_table(tmp_path / "missing.py") is None


def test_onnxruntime_leaves_no_trace_in_the_users_home(tmp_path):
    """Its first session saved a telemetry device id under ~/.cache/Microsoft, creating a
    missing home (helper-20), and warned in colour when the home was read-only."""
    pytest.importorskip("onnxruntime")
    import subprocess
    import sys

    home = tmp_path / "no-home"
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "ORT_DISABLE_TELEMETRY")}
    env.update(HOME=str(home), ENVDOCTOR_NO_CACHE="1")
    code = ("import os, json; from envdoctor.checks.onnx_opset import probe_runtime; r = probe_runtime(); "
            "print(json.dumps([r.max_opset, os.environ.get('ORT_DISABLE_TELEMETRY')]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    max_opset, left = json.loads(proc.stdout)
    assert isinstance(max_opset, int) and max_opset >= 17  # the limits are still found
    assert left is None, "the variable is ours only for the import"
    assert not home.exists() and "telemetry" not in proc.stderr



_EXPORT_MODES = textwrap.dedent("""
    import sys, warnings
    import numpy as np, torch
    out = sys.argv[1]
    x = torch.arange(2 * 3 * 5 * 7, dtype=torch.float32).reshape(2, 3, 5, 7)
    np.save(f"{out}/x.npy", x.numpy())
    for mode in ("nearest", "bilinear"):
        class Up(torch.nn.Module):
            def forward(self, x):
                return torch.nn.functional.interpolate(x, scale_factor=2, mode=mode)
        np.save(f"{out}/{mode}.npy", Up()(x).numpy())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Up(), (x,), f"{out}/{mode}9.onnx", opset_version=9, dynamo=False)
""")


@pytest.mark.real
@pytest.mark.parametrize("mode, status", [("nearest", Status.WARN), ("bilinear", Status.FAIL)])
def test_a_real_opset_9_export_is_judged_by_its_interpolation_mode(tmp_path, mode, status):
    """Helper-42: a nearest x2 upsample exported at opset 9 matches PyTorch exactly through
    onnxruntime, yet failed like bilinear, which does not match. Both exported by torch (in
    its own interpreter) and run by onnxruntime here: the rule stands on what they compute."""
    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    proc = subprocess.run([sys.executable, "-c", _EXPORT_MODES, str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    path = tmp_path / f"{mode}9.onnx"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: np.load(tmp_path / "x.npy")})[0]
    differs = float(np.abs(got - np.load(tmp_path / f"{mode}.npy")).max())
    assert (differs == 0.0) == (mode == "nearest"), differs  # what the rule claims, measured
    result = run_check([path])
    assert result.status is status, result.summary
    assert f"in {'nearest' if mode == 'nearest' else 'linear'} mode at opset 9" in result.summary
    assert "opset_version=17" in result.remediation


def test_an_export_fix_never_names_an_opset_torch_cannot_write(tmp_path):
    """Helper-42: onnxruntime's newest opset (above torch 2.13's ONNX_MAX_OPSET, 23) was the
    fix; torch.onnx.export refused it ('Unsupported onnx_opset_version')."""
    top = runtime_facts().max_opset
    path = save(identity_model(top + 1), tmp_path / "future.onnx")
    torch_max = top - 3
    result = run_check([path], torch={"onnx_default_opset": 17, "onnx_max_opset": torch_max})
    assert result.status is Status.FAIL
    assert f"opset_version={torch_max})" in result.remediation, result.remediation


def test_torchs_newest_export_opset_is_read_from_its_files():
    """Read from torch/onnx/_constants.py as torch itself has it (asked in its own interpreter)."""
    import importlib.util

    from envdoctor.torchfacts.metadata import onnx_max_opset

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        pytest.skip("needs torch (scripts/test.sh installs torch==2.13.0)")
    proc = subprocess.run([sys.executable, "-c", "from torch.onnx import _constants; print(_constants.ONNX_MAX_OPSET)"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert onnx_max_opset(Path(spec.origin).parent) == int(proc.stdout)


def _resize_model(tmp_path, op: str, opset: int, mode) -> Path:
    """One Resize/Upsample doubling a 2x2 image, its mode attribute as given (None: absent;
    an int: an integer-typed attribute)."""
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2])
    inputs = ["x", "", "scales"] if op == "Resize" and opset >= 11 else ["x", "scales"]
    node = helper.make_node(op, inputs, ["y"], name="up", **({} if mode is None else {"mode": mode}))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=[scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path = tmp_path / f"{op}-{opset}-{mode!r}.onnx".replace("'", "")
    path.write_bytes(model.SerializeToString())
    return path


def _onnxruntime_loads(path: Path) -> bool:
    ort = pytest.importorskip("onnxruntime", reason="needs onnxruntime (the onnx extra)")
    options = ort.SessionOptions()
    options.log_severity_level = 4  # its refusal is the answer here, not a log line
    try:
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return True
    except Exception:
        return False


@pytest.mark.parametrize("op, opset", [("Resize", 13), ("Upsample", 9)])
@pytest.mark.parametrize("mode", [None, "nearest", "linear", "cubic", "NEAREST", "bilinear", "", 5])
def test_a_mode_onnxruntime_refuses_fails_as_not_loading_and_real_onnxruntime_agrees(tmp_path, op, opset, mode):
    """The known limit of stop 30: 'NEAREST', 'bilinear', '' and an integer mode were judged as
    nearest or linear, where onnxruntime refuses the model outright. The verdict is held
    against onnxruntime itself loading each model."""
    path = _resize_model(tmp_path, op, opset, mode)
    loads = _onnxruntime_loads(path)
    row = run_check([path])
    refused = "refuses to load the model" in row.summary
    print(op, opset, repr(mode), "onnxruntime loads:", loads, "|", row.status.value, row.summary[:160])
    assert refused is (not loads), row.summary
    if refused:
        assert row.status is Status.FAIL and "'nearest', 'linear' or 'cubic'" in row.remediation


def _function_model(tmp_path: Path, mode: str, call: bool) -> Path:
    """A model-local function F holding a Resize with `mode`; the main graph calls it or not."""
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2])
    inner = helper.make_node("Resize", ["a", "", "s"], ["b"], name="r", mode=mode)
    s_const = helper.make_node("Constant", [], ["s"], value=scales)
    function = helper.make_function("local", "F", ["a"], ["b"], [s_const, inner],
                                    [helper.make_opsetid("", 13)])
    main = (helper.make_node("F", ["x"], ["y"], domain="local", name="call") if call
            else helper.make_node("Identity", ["x"], ["y"], name="id"))
    graph = helper.make_graph([main], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("local", 1)],
                              functions=[function])
    model.ir_version = 8
    path = tmp_path / f"func-{mode or 'empty'}-{'called' if call else 'unused'}.onnx"
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("call", [True, False])
@pytest.mark.parametrize("mode", ["bilinear", "NEAREST", "linear"])
def test_a_refused_mode_counts_only_in_a_function_that_runs(tmp_path, mode, call):
    """Helper-52: a local function nothing calls, holding a mode onnxruntime refuses, was
    'refuses to load the model', but onnxruntime loads and runs such a model (84 of 84 built)."""
    path = _function_model(tmp_path, mode, call)
    loads = _onnxruntime_loads(path)
    row = run_check([path])
    print(mode, "called" if call else "unused", "onnxruntime loads:", loads, "|", row.status.value, row.summary[:140])
    assert ("refuses to load the model" in row.summary) is (not loads), row.summary


def test_a_function_called_only_from_an_uncalled_function_does_not_count(tmp_path):
    """Helper-53: Outer (called by nothing) calls Inner, which holds a 'bilinear' Resize;
    onnxruntime loads the model, but Inner counted as called. What runs is what the main
    graph reaches."""
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2])
    inner = helper.make_function("local", "Inner", ["a"], ["b"],
                                 [helper.make_node("Constant", [], ["s"], value=scales),
                                  helper.make_node("Resize", ["a", "", "s"], ["b"], name="r", mode="bilinear")],
                                 [helper.make_opsetid("", 13)])
    outer = helper.make_function("local", "Outer", ["a"], ["b"], [helper.make_node("Inner", ["a"], ["b"], domain="local")],
                                 [helper.make_opsetid("", 13), helper.make_opsetid("local", 1)])
    for main, loads_expected in ((helper.make_node("Identity", ["x"], ["y"]), True),
                                 (helper.make_node("Outer", ["x"], ["y"], domain="local"), False)):
        graph = helper.make_graph([main], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("local", 1)],
                                  functions=[inner, outer])
        model.ir_version = 8
        path = tmp_path / f"nested-{main.op_type}.onnx"
        path.write_bytes(model.SerializeToString())
        loads = _onnxruntime_loads(path)
        row = run_check([path])
        assert loads is loads_expected, main.op_type
        assert ("refuses to load the model" in row.summary) is (not loads), row.summary


# -- helper-92: what onnxruntime refused while the check said ok ---------------------------------


def _loads(model: onnx.ModelProto) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


def _relu_model(opset: int, also=(), domain: str = "", op: str = "Relu") -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="act", domain=domain)], "g",
                              [_io("x", [1])], [_io("y", [1])])
    ids = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in also)]
    model = helper.make_model(graph, opset_imports=ids)
    model.ir_version = 7
    return model


def test_an_ml_opset_beyond_the_runtime_fails_as_it_refuses_it(tmp_path):
    top = runtime_facts().ml_max_opset
    assert isinstance(top, int), runtime_facts()
    beyond = _relu_model(17, [("ai.onnx.ml", top + 1)])
    result = run_check([save(beyond, tmp_path / "ml.onnx")])
    assert result.status is Status.FAIL and f"ai.onnx.ml opset {top + 1}" in result.summary, result.summary
    assert not _loads(beyond)
    within = _relu_model(17, [("ai.onnx.ml", top)])
    assert run_check([save(within, tmp_path / "ml_ok.onnx")]).status is Status.OK and _loads(within)


def test_an_opset_older_than_the_runtime_supports_fails_where_it_has_no_kernel(tmp_path):
    old = _relu_model(1)
    result = run_check([save(old, tmp_path / "relu1.onnx")])
    assert result.status is Status.FAIL and "no CPU implementation of Relu(1)" in result.summary, result.summary
    assert not _loads(old)  # Relu(1) has no implementation
    assert run_check([save(_relu_model(7), tmp_path / "relu7.onnx")]).status is Status.OK


def test_an_operator_of_a_domain_the_runtime_does_not_define_warns(tmp_path):
    custom = _relu_model(17, [("acme.ops", 1)], domain="acme.ops", op="Foo")
    result = run_check([save(custom, tmp_path / "custom.onnx")])
    assert result.status is Status.WARN and "acme.ops (Foo)" in result.summary, result.summary
    assert "register_custom_ops_library" in result.remediation
    assert not _loads(custom)
    ms = _relu_model(17, [("com.microsoft", 1)], domain="com.microsoft", op="FusedGemm")  # onnxruntime's own domain
    assert "does not define" not in run_check([save(ms, tmp_path / "ms.onnx")]).summary


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Add", "Identity", "Transpose"])
def test_below_opset_7_the_verdict_is_whether_onnxruntime_has_a_kernel(tmp_path, op):
    """Helper-95: every model below opset 7 warned alike; onnxruntime refuses Relu(1) and
    Add(6) and loads Identity(1) and Relu(6). The kernel registry says which, and the
    verdict is now what onnxruntime does: fail where it refuses, nothing where it loads."""
    for opset in range(1, 8):
        inputs = ["x", "x"] if op == "Add" else ["x"]
        graph = helper.make_graph([helper.make_node(op, inputs, ["y"], name="n")], "g", [_io("x", [2])], [_io("y", [2])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 7 if opset >= 7 else 3
        result = run_check([save(model, tmp_path / f"{op}_{opset}.onnx")])
        loads = _loads(model)
        assert (result.status is Status.FAIL) is (not loads), (op, opset, loads, result.summary)
        assert result.status in (Status.OK, Status.FAIL), (op, opset, result.summary)


def test_the_imports_of_a_models_functions_are_held_to_the_runtimes_limits(tmp_path):
    """Helper-95: onnxruntime checks every local function's opset imports, called or not;
    one importing ai.onnx.ml 9 passed as ok."""
    top = runtime_facts().ml_max_opset
    body = helper.make_function("acme", "Id", ["a"], ["b"], [helper.make_node("Identity", ["a"], ["b"])],
                                [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", top + 4)])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [_io("x", [1])], [_io("y", [1])])
    model = helper.make_model(graph, functions=[body], opset_imports=[helper.make_opsetid("", 17),
                                                                      helper.make_opsetid("acme", 1)])
    model.ir_version = 8
    result = run_check([save(model, tmp_path / "fn.onnx")])
    assert result.status is Status.FAIL and f"ai.onnx.ml opset {top + 4}" in result.summary, result.summary
    assert not _loads(model)


@pytest.mark.parametrize("imports, loads", [((20, 13), False), ((13, 20), True)])
def test_a_domain_imported_twice_is_judged_at_its_last_entry_as_onnxruntime_does(tmp_path, imports, loads):
    graph = helper.make_graph([helper.make_node("Gelu", ["x"], ["y"])], "g", [_io("x", [1])], [_io("y", [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", v) for v in imports])
    model.ir_version = 9
    result = run_check([save(model, tmp_path / "dup.onnx")])
    assert _loads(model) is loads
    assert (result.status is Status.FAIL) is (not loads), result.summary


def test_operators_of_a_domain_the_model_never_imports_fail(tmp_path):
    model = _relu_model(17, domain="zz", op="Foo")
    result = run_check([save(model, tmp_path / "zz.onnx")])
    assert result.status is Status.FAIL and "imports no opset of it" in result.summary, result.summary
    assert not _loads(model)


def test_an_ml_opset_under_development_with_the_variable_at_0_warns(tmp_path):
    top = runtime_facts().ml_max_opset
    model = _relu_model(17, [("ai.onnx.ml", top + 1)])
    result = run_check([save(model, tmp_path / "ml.onnx")], env={"ALLOW_RELEASED_ONNX_OPSET_ONLY": "0"})
    assert result.status is Status.WARN and "loads only because ALLOW_RELEASED_ONNX_OPSET_ONLY=0" in result.summary


def _fn_model(fn_domain: str) -> onnx.ModelProto:
    body = helper.make_function(fn_domain, "MyRelu", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
                                [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("MyRelu", ["x"], ["y"], domain=fn_domain)], "g",
                              [_io("x", [1])], [_io("y", [1])])
    imports = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(fn_domain, 1)] if fn_domain else [])
    model = helper.make_model(graph, functions=[body], opset_imports=imports)
    model.ir_version = 8
    return model


@pytest.mark.parametrize("fn_domain, loads", [("", False), ("ai.onnx.ml", False), ("acme", True)])
def test_a_local_function_in_onnxs_own_domains_is_refused_as_onnxruntime_refuses_it(tmp_path, fn_domain, loads):
    """Helper-95: onnxruntime resolves a model's own function in any domain but onnx's."""
    model = _fn_model(fn_domain)
    result = run_check([save(model, tmp_path / "fn.onnx")])
    assert _loads(model) is loads
    assert (result.status is Status.FAIL) is (not loads), result.summary


@pytest.mark.parametrize("domain, op, version", [("ai.onnx.ml", "TreeEnsembleRegressor", 5), ("ai.onnx.ml", "Foo", 3),
                                                 ("com.microsoft", "NoSuchOp", 1)])
def test_an_op_a_known_domain_does_not_define_at_its_version_fails(tmp_path, domain, op, version):
    """Helper-95: deprecated or unknown operators of ai.onnx.ml and com.microsoft were ok."""
    model = _relu_model(17, [(domain, version)], domain=domain, op=op)
    result = run_check([save(model, tmp_path / "op.onnx")])
    assert result.status is Status.FAIL and f"{domain}:{op} at {domain} {version}" in result.summary, result.summary
    assert not _loads(model)


def test_every_import_of_a_domain_is_held_to_the_limit_not_only_the_last(tmp_path):
    """Helper-95: ai.onnx.ml imported at 6 and then 3: onnxruntime refuses the 6."""
    top = runtime_facts().ml_max_opset
    model = _relu_model(17, [("ai.onnx.ml", top + 1), ("ai.onnx.ml", 3)])
    assert parse_model(model.SerializeToString()).highest["ai.onnx.ml"] == top + 1
    result = run_check([save(model, tmp_path / "twice.onnx")])
    assert result.status is Status.FAIL and f"ai.onnx.ml opset {top + 1}" in result.summary, result.summary
    assert not _loads(model)


def test_its_timeout_outlasts_the_torch_probe_so_a_hung_probe_costs_the_torch_part_only():
    """helper-120: at the default 15 s a `--python` that hangs (the probe waits 60 s for it)
    cut the whole check off, files and runtime with it: `error`, where README says a
    failing probe costs onnx.opset its torch part only. Measured by hand: with a
    `#!/bin/sh sleep 100000` interpreter the check is `ok` after 60.5 s, the torch part unknown."""
    from envdoctor import probe
    from envdoctor.checks import onnx_opset

    assert onnx_opset.CHECK.timeout > probe.DEFAULT_TIMEOUT
