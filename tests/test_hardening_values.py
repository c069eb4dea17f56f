"""Issue 8, family 4: no traceback from values. Every value a user or a target controls
(an environment variable, a file name, a config value, a plug-in's message) is escaped
for the format it goes into, and every number is checked before int()/float() use.

Hypothesis feeds arbitrary text (markup, control characters, undecodable bytes, huge
numbers) through the public API (redaction + every exporter, the parsers, config
loading, the checks on an in-process session) and through the CLI (environment
values as raw bytes, every format, stdout and -o)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envdoctor import pipeline, redact
from envdoctor.config import Config, load as load_config
from envdoctor.context import Session
from envdoctor.errors import ConfigError, ParseError
from envdoctor.exporters import FORMATS, ExportOptions, render
from envdoctor.model import Report, Result, Status
from envdoctor.units import MAX_SIZE, parse_size

# Text a target may hold: anything, with the nasty parts made likely.
NASTY = ["[/bold]", "[red]", "[link=x]", "\x1b[31m", "\x07", "\x00", "\r", "\x9b", "\u202e", "\ud800", "\udcff",
         "]]>", "<!--", "&amp;", "|", "`", "```", "\n", "*", "_", "<script>", "\ufffe"]
values = st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=12)), max_size=8).map("".join)
numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-2**80, max_value=2**80))
RAW_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e]")


def _report(value: str, number) -> Report:
    r = Result(Status.FAIL, f"summary {value}", f"fix {value}", {"bytes": number, "v": value, value: number,
                                                                  "nested": {"x": [number, value]}}, "x.y", f"pid:{value}")
    r2 = Result(Status.WARN, value, value, {}, value or "a.b", "self")
    return Report(host=value or "h", version="0", started_at="2026-01-01T00:00:00+00:00", target="self", results=[r, r2],
                  system={"os": value, "kernel": value, "memory_total_bytes": number, "cpu_quota": number,
                          "gpus": [{"index": 0, "name": value, "memory_total_bytes": number, "uuid": value}],
                          "unavailable": {"gpus": value}}, duration_seconds=0.5)


def _strict_json(text: str):
    def reject(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=reject)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=values, number=numbers, fmt=st.sampled_from(FORMATS), fail_on=st.sampled_from(["warn", "fail"]))
def test_every_exporter_renders_any_value_validly(value, number, fmt, fail_on):
    """After redaction (which every report passes), each format renders any value: strict JSON
    (no NaN), well-formed XML, UTF-8 encodable, no raw control character, markup printed as written."""
    report = redact.redact_report(_report(value, number), [{}])
    out = render(fmt, report, ExportOptions(fail_on=fail_on, color=False, width=100))
    out.encode("utf-8")  # -o and a UTF-8 stdout must be able to write it
    if fmt == "json":
        data = _strict_json(out)
        assert data["results"][0]["facts"]["bytes"] is None or math.isfinite(data["results"][0]["facts"]["bytes"])
    elif fmt == "junit":
        ET.fromstring(out.split("\n", 1)[1])
    elif fmt in ("text", "markdown"):
        assert not RAW_CONTROL.search(out), repr(out)
        if fmt == "text" and "[/bold]" in value:
            assert "[/bold]" in out  # markup is text, not styling (and not a crash)


@settings(max_examples=60, deadline=None)
@given(value=values)
def test_text_report_on_a_terminal_shows_values_not_escape_sequences(value):
    """With colour on (a terminal), the only escape sequences are envdoctor's own styles."""
    report = redact.redact_report(_report(value, 1), [{}])
    out = render("text", report, ExportOptions(color=True, width=100))
    stripped = re.sub(r"\x1b\[[0-9;]*m", "", out)  # rich's SGR styles
    assert not RAW_CONTROL.search(stripped), repr(stripped)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=60), st.from_regex(r"\s*[0-9]{1,400}(\.[0-9]{1,400})?\s*[a-zA-Z]{0,3}\s*", fullmatch=True),
                 st.integers(), st.floats(), st.booleans(), st.none()))
def test_parse_size_answers_a_size_or_parse_error(text):
    try:
        size = parse_size(text)
    except ParseError:
        return
    assert isinstance(size, int) and 0 <= size <= MAX_SIZE


TOML_VALUES = ["inf", "-inf", "nan", "+nan", "1e400", "0", "-1", "9" * 400, "9" * 5000, "-" + "9" * 5000, "1" + "0" * 30, '"inf"', '"nan"', '"x"',
               "[1]", "{a = 1}", "true", "1.5", '"16GiB"', '"' + "9" * 5000 + 'g"', '"1.5.5g"', "1979-05-27"]


@settings(max_examples=250, deadline=None)
@given(key=st.sampled_from(["timeout", "fail_on", "only", "python", "onnx"]),
       check_key=st.sampled_from(["timeout", "min_bytes", "max_used_fraction", "enabled", "resolve_timeout_seconds",
                                  "processes_per_node", "min_opset", "max_used_bytes"]),
       table=st.sampled_from(["shm.size", "gpu.health", "dist.env", "cpu.threads", "onnx.opset"]),
       value=st.sampled_from(TOML_VALUES),
       where=st.sampled_from(["top", "check", "env", "tool"]))
def test_config_values_load_or_fail_with_one_config_error(tmp_path_factory, key, check_key, table, value, where):
    """inf/nan/huge timeouts and sizes, wrong types, a `tool` that is not a table: a settled
    Config with finite numbers, or ConfigError (one line naming file and key); nothing else."""
    registry = pipeline.load_registry()
    directory = tmp_path_factory.mktemp("cfg")
    environ: dict[str, str] = {}
    if where == "top":
        (directory / "envdoctor.toml").write_text(f"{key} = {value}\n")
    elif where == "check":
        (directory / "envdoctor.toml").write_text(f'[check."{table}"]\n{check_key} = {value}\n')
    elif where == "tool":
        (directory / "pyproject.toml").write_text(f"tool = {value}\n" if key == "timeout" else f"[tool]\nenvdoctor = {value}\n")
    else:
        environ = {"ENVDOCTOR_TIMEOUT": value.strip('"')} if key == "timeout" else \
            {f"ENVDOCTOR_CHECK__{table.replace('.', '_').upper()}__{check_key.upper()}": value.strip('"')}
    try:
        config = load_config(registry.checks, cwd=directory, environ=environ)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert math.isfinite(config.timeout) and 0 < config.timeout <= 86400
    for settings_ in config.checks.values():
        for v in settings_.values():
            if isinstance(v, float):
                assert math.isfinite(v)


@pytest.mark.parametrize("tool", ["1", '"x"', "[1, 2]", "true", "{ envdoctor = 3 }", "{ envdoctor = [1] }"])
def test_preflight_never_raises_into_the_training_script(tmp_path, tool):
    """A pyproject.toml whose `tool` (or tool.envdoctor) is not a table: check says so in one
    line (or ignores a pyproject that is not ours), and preflight() returns results."""
    (tmp_path / "pyproject.toml").write_text(f"tool = {tool}\n")
    code = ("import envdoctor, sys; r = envdoctor.preflight(only=['shm.size', 'cpu.threads'], file=sys.stderr); "
            "print('ROWS', len(r))")
    env = {**os.environ, "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "ROWS 2" in proc.stdout, proc.stderr
    assert "Traceback" not in proc.stderr
    check = subprocess.run([sys.executable, "-m", "envdoctor", "check", "--only", "shm.size"], cwd=tmp_path,
                           capture_output=True, text=True, env=env, timeout=120)
    assert check.returncode in (0, 1, 2) and "Traceback" not in check.stderr, check.stderr
    if check.returncode == 2:
        assert check.stderr.count("\n") == 1 and "pyproject.toml" in check.stderr


ENV_NAMES = ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LOCAL_RANK", "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE",
             "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA",
             "CUBLAS_WORKSPACE_CONFIG", "PYTORCH_CUDA_ALLOC_CONF", "NCCL_P2P_DISABLE", "CUDA_DEVICE_ORDER"]
env_values = st.one_of(values, st.from_regex(r"[+-]?[0-9]{1,6000}", fullmatch=True),
                       st.lists(st.from_regex(r"-?[0-9]{1,30}|GPU-[0-9a-f-]{0,12}|x", fullmatch=True), max_size=50).map(",".join))
NON_PROBE_CHECKS = ["cpu.threads", "cuda.visible_devices", "dist.env", "shm.size", "gpu.health"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=st.dictionaries(st.sampled_from(ENV_NAMES), env_values, max_size=6))
def test_checks_judge_any_environment_without_breaking(env):
    """Numbers too long for int(), markup, control characters, any shape of list: every check
    reaches a verdict (never 'the check broke'), through the same pipeline as `check`."""
    registry = pipeline.load_registry()
    config = Config()
    config.set_timeout(10)
    env = {k: v.replace("\x00", "") for k, v in env.items()}  # an environment cannot hold NUL
    session = Session(env_override={**env, "PATH": "/usr/bin"})
    report = pipeline.execute(registry, config, session, pipeline.Selection(only=NON_PROBE_CHECKS), with_sysfacts=False)
    for row in report.results:
        assert "the check broke" not in row.summary, (row.check, row.summary)
        assert row.status is not Status.ERROR or "timed out" in row.summary, (row.check, row.summary)
    for fmt in FORMATS:
        render(fmt, report, ExportOptions(catalog=registry.checks)).encode("utf-8")


RAW = [b"0,\xff\xfe", b"[/bold]x[red]", b"\x1b]0;pwned\x07\x1b[2J", b"9" * 5000, b"1," * 20000 + b"1",
       b"GPU-\xc3(", b"<![CDATA[x]]>&", b"\xed\xa0\x80", b"a|b`c```d"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_writes_every_format_for_hostile_raw_bytes(tmp_path, fmt):
    """Environment values as raw bytes (not UTF-8, escape sequences, markup, 5000 digits):
    stdout and -o both written, exit 0/1, valid for the format, nothing raw to the terminal."""
    env = {k.encode(): v.encode() for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
    env[b"ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD"] = b"1"
    env[b"COLUMNS"] = b"1000"  # one line per row, so a value is found whole
    for i, name in enumerate([b"CUDA_VISIBLE_DEVICES", b"MASTER_ADDR", b"OMP_NUM_THREADS", b"WORLD_SIZE", b"RANK",
                              b"NCCL_SOCKET_IFNAME", b"LOCAL_RANK", b"CUBLAS_WORKSPACE_CONFIG", b"MASTER_PORT"]):
        env[name] = RAW[i % len(RAW)]
    out = tmp_path / f"report.{fmt}"
    only = ["--only", ",".join(NON_PROBE_CHECKS)]
    for extra in ((), ("-o", str(out))):
        proc = subprocess.run([sys.executable, "-m", "envdoctor", "check", *only, "--format", fmt, "--timeout", "10",
                               *extra], env=env, capture_output=True, timeout=120)
        assert proc.returncode in (0, 1), proc.stderr.decode(errors="replace")
        assert b"Traceback" not in proc.stderr
        data = out.read_bytes() if extra else proc.stdout
        text = data.decode("utf-8")  # strict: valid UTF-8
        assert "the check broke" not in text
        if fmt == "json":
            _strict_json(text)
        elif fmt == "junit":
            ET.fromstring(data.split(b"\n", 1)[1])
        elif fmt in ("text", "markdown"):
            assert not RAW_CONTROL.search(text), repr(text)[:300]
            assert "[/bold]x[red]" in text or fmt == "markdown" and "\\[/bold\\]x\\[red\\]" in text
        if fmt != "prometheus":  # (no messages in a metric) an undecodable byte reads \xff, also inside a message's quoted value ('\udcff' before)
            assert "\\udc" not in text and "\\xff" in text, text[:300]


def test_cli_onnx_file_names_with_markup_and_bad_bytes(tmp_path):
    """An --onnx file whose name holds rich markup and a byte that is not UTF-8."""
    name = b"model[red]x[b]\xff.onnx"
    path = os.path.join(os.fsencode(tmp_path), name)
    with open(path, "wb") as f:
        f.write(b"not a model")
    for fmt in ("text", "markdown", "junit"):
        out = tmp_path / f"r.{fmt}"
        proc = subprocess.run([sys.executable, "-m", "envdoctor", "check", "--only", "onnx.opset", "--onnx", path,
                               "-f", fmt, "-o", str(out)], capture_output=True, timeout=120,
                              # one line per row: a wrapped cell split the name wherever the temporary
                              # path's length (pytest-9 or pytest-27) put the column's edge
                              env={**os.environ, "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1", "COLUMNS": "1000"})
        assert proc.returncode == 1 and b"Traceback" not in proc.stderr, proc.stderr.decode(errors="replace")
        text = out.read_text(encoding="utf-8")
        assert "\\xff" in text and ("[red]x[b]" in text or "\\[red\\]x\\[b\\]" in text), text


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "1e999", "1e300", "0", "-5"])
def test_cli_timeout_that_is_not_a_finite_positive_number_is_one_line(value):
    for how in (["--timeout", value], None):
        env = {**os.environ, "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
        args = [sys.executable, "-m", "envdoctor", "check", "--only", "shm.size"]
        if how is None:
            env["ENVDOCTOR_TIMEOUT"] = value
        else:
            args += how
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2, (value, how, proc.stdout[-300:], proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", [["check", "-f", "json"], ["exec", "--", "sh", "-c", "echo job ran"],
                                     ["serve", "--once"]])
def test_a_variable_that_is_not_utf8_is_masked_not_a_traceback(command):
    """A Latin-1 environment (PROJECT_NAME=café as one byte): its values reach envdoctor as
    surrogate escapes, and URL-quoting one for the secret scrubber raised UnicodeEncodeError,
    a traceback from every command. The secret-named one stays masked in every spelling."""
    env = {k.encode(): v.encode("utf-8", "surrogateescape") for k, v in os.environ.items()}
    env.update({b"PROJECT_NAME": b"caf\xe9-r\xe9sum\xe9", b"MY_TOKEN": b"s3cr\xe9t-value-42"})
    env.pop(b"ENVDOCTOR_CONFIG", None)
    proc = subprocess.run([sys.executable, "-m", "envdoctor", *command], env=env, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert b"Traceback" not in proc.stderr and b"UnicodeEncodeError" not in proc.stderr, proc.stderr[-2000:]
    assert b"s3cr" not in proc.stdout + proc.stderr
