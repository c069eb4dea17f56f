"""Config: precedence defaults < file < environment < command line, and bad config
reported with file, line and key (exit 2 from the CLI)."""

from __future__ import annotations

import textwrap

import pytest

from envdoctor import config as cfg
from envdoctor.check import Check
from envdoctor.errors import ConfigError
from envdoctor.model import ok

from helpers import cli

SHM = Check(id="shm.size", title="t", run=lambda ctx: ok("x"), config={"min_bytes": 1024, "num_workers": 0, "ratio": 0.5, "names": ["a"]})
OTHER = Check(id="onnx.opset", title="t", run=lambda ctx: ok("x"), timeout=90)
CATALOG = {c.id: c for c in (SHM, OTHER)}


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_defaults_when_there_is_no_file(tmp_path):
    config = cfg.load(CATALOG, environ={}, cwd=tmp_path)
    assert config.source is None and config.fail_on == "fail"
    assert config.settings_for(SHM) == SHM.config
    assert config.timeout_for(SHM) == cfg.DEFAULT_TIMEOUT
    assert config.timeout_for(OTHER) == 90  # a check's declared timeout wins over a smaller default


def test_a_declared_timeout_shorter_than_the_default_is_kept_as_explain_shows_it(tmp_path):
    quick = Check(id="quick.read", title="t", run=lambda ctx: ok("x"), timeout=2)
    config = cfg.load({"quick.read": quick}, environ={}, cwd=tmp_path)
    assert config.timeout_for(quick) == 2  # was raised to the run's default 15
    config.set_timeout(7)  # a run-wide timeout the user chose bounds it instead
    assert config.timeout_for(quick) == 7


def test_file_then_environment_precedence_and_size_strings(tmp_path):
    _write(tmp_path, "envdoctor.toml", """
        fail_on = "warn"
        timeout = 20
        [check."shm.size"]
        min_bytes = "1GiB"
        num_workers = 4
        timeout = 3
    """)
    config = cfg.load(CATALOG, environ={}, cwd=tmp_path)
    assert config.source.endswith("envdoctor.toml")
    assert config.fail_on == "warn" and config.timeout == 20
    assert config.settings_for(SHM)["min_bytes"] == 1024**3
    assert config.settings_for(SHM)["num_workers"] == 4
    assert config.timeout_for(SHM) == 3

    env = {"ENVDOCTOR_FAIL_ON": "fail", "ENVDOCTOR_CHECK__SHM_SIZE__MIN_BYTES": "16g",
           "ENVDOCTOR_CHECK__SHM_SIZE__NAMES": "x, y", "ENVDOCTOR_CHECK__SHM_SIZE__ENABLED": "false"}
    config = cfg.load(CATALOG, environ=env, cwd=tmp_path)
    assert config.fail_on == "fail"
    assert config.settings_for(SHM)["min_bytes"] == 16 * 1024**3
    assert config.settings_for(SHM)["names"] == ["x", "y"]
    assert config.enabled(SHM) is False


def test_pyproject_tool_table_is_read(tmp_path):
    _write(tmp_path, "pyproject.toml", """
        [project]
        name = "trainer"
        [tool.envdoctor]
        skip = ["onnx.opset"]
        [tool.envdoctor.check."shm.size"]
        ratio = 2
    """)
    config = cfg.load(CATALOG, environ={}, cwd=tmp_path)
    assert config.skip == ["onnx.opset"] and config.settings_for(SHM)["ratio"] == 2.0


def test_pyproject_without_our_table_is_not_config(tmp_path):
    _write(tmp_path, "pyproject.toml", "[project]\nname = 'x'\n")
    assert cfg.load(CATALOG, environ={}, cwd=tmp_path).source is None


@pytest.mark.parametrize("text, key, line, reason", [
    ('fail_on = "warn"\n[check."shm.size"]\nmin_bytes = "lots"\n', 'check."shm.size".min_bytes', 3, "not a size"),
    ('[check."shm.size"]\n\nnum_wokers = 4\n', 'check."shm.size".num_wokers', 3, "unknown setting for shm.size"),
    ('[check."shm.sise"]\nmin_bytes = 1\n', 'check."shm.sise"', 1, "unknown check id"),
    ('timeout = "soon"\n', "timeout", 1, "expected a number"),
    ('fail_on = "error"\n', "fail_on", 1, "expected one of warn, fail"),
    ('colour = true\n', "colour", 1, "unknown setting"),
    ('[check."shm.size"]\nnum_workers = true\n', 'check."shm.size".num_workers', 2, "expected an integer"),
    ('onnx = [" "]\n', "onnx", 1, "an empty file name"),  # helper-95: it was the directory '.'
])
def test_bad_file_names_file_line_key_and_reason(tmp_path, text, key, line, reason):
    path = _write(tmp_path, "envdoctor.toml", text)
    with pytest.raises(ConfigError) as info:
        cfg.load(CATALOG, environ={}, cwd=tmp_path)
    err = info.value
    assert (err.file, err.line, err.key) == (str(path), line, key)
    assert reason in str(err) and str(err).startswith(f"{path}:{line}: {key}: ")


def test_toml_syntax_error_names_the_line(tmp_path):
    _write(tmp_path, "envdoctor.toml", 'timeout = 3\n[check."shm.size"\n')
    with pytest.raises(ConfigError) as info:
        cfg.load(CATALOG, environ={}, cwd=tmp_path)
    assert info.value.line == 2 and "not valid TOML" in str(info.value)


def test_bad_environment_names_the_variable():
    with pytest.raises(ConfigError, match="ENVDOCTOR_CHECK__SHM_SIZE__NUM_WORKERS: expected an integer"):
        cfg.load(CATALOG, environ={"ENVDOCTOR_CHECK__SHM_SIZE__NUM_WORKERS": "four"})
    with pytest.raises(ConfigError, match="ENVDOCTOR_CHECK__NOPE__X"):
        cfg.load(CATALOG, environ={"ENVDOCTOR_CHECK__NOPE__X": "1"})


def test_explicit_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="nope.toml: no such config file"):
        cfg.load(CATALOG, explicit_file=str(tmp_path / "nope.toml"), environ={})


@pytest.mark.parametrize("given, said", [("DIR", "a directory, not a config file"),
                                         ("/dev/null", "not a regular file")])
def test_an_explicit_config_that_is_not_a_file_says_what_it_is(tmp_path, given, said):
    """Both said "not found (or not readable)", of a directory and a device that exist (helper-18)."""
    path = str(tmp_path) if given == "DIR" else given
    with pytest.raises(ConfigError, match=f"^{path}: {said}"):
        cfg.load(CATALOG, explicit_file=path, environ={})


@pytest.mark.parametrize("text", ['fail_on = "warn"\n\ntimeout = [\n', 'a = "x\u2028y"\nb = 1\ntimeout = ['])
def test_toml_cut_off_at_its_end_names_the_last_line(tmp_path, text):
    """A U+2028 inside a string is no line break to TOML (it was to str.splitlines)."""
    path = tmp_path / "envdoctor.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"envdoctor.toml:3: not valid TOML: .*end of document"):
        cfg.load(CATALOG, explicit_file=str(path), environ={})


def test_a_python_that_does_not_exist_names_where_it_was_set(tmp_path):
    (tmp_path / "envdoctor.toml").write_text('fail_on = "warn"\npython = "/nonexistent/bin/python"\n')
    proc = cli("check", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"envdoctor: bad config: {tmp_path / 'envdoctor.toml'}:2: python: '/nonexistent/bin/python': no such executable interpreter")
    proc = cli("check", cwd=tmp_path, env={"ENVDOCTOR_PYTHON": "/also/missing"})
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "envdoctor: bad config: environment: ENVDOCTOR_PYTHON: '/also/missing': no such executable interpreter")


# --- through the CLI, as a user meets it ---------------------------------------------
def test_cli_bad_config_exits_2_with_one_line(tmp_path):
    path = _write(tmp_path, "envdoctor.toml", '[check."shm.size"]\nmin_bytes = "lots"\n')
    proc = cli("check", "--only", "shm.size", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert f"{path}:2: check.\"shm.size\".min_bytes:" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_flag_beats_environment_beats_file(tmp_path, plugin_env):
    _write(tmp_path, "envdoctor.toml", '[check."example.marker_file"]\npath = "/definitely/not/here"\n')
    # file: marker missing -> fail -> exit 1
    proc = cli("check", "--only", "example.marker_file", "--format", "json", cwd=tmp_path, env=plugin_env)
    assert proc.returncode == 1, proc.stderr
    # environment overrides the file: marker present -> ok -> exit 0
    env = {**plugin_env, "ENVDOCTOR_CHECK__EXAMPLE_MARKER_FILE__PATH": str(tmp_path / "envdoctor.toml")}
    proc = cli("check", "--only", "example.marker_file", "--format", "json", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout
    # an unset path warns: exit 0 at --fail-on fail (file), 1 when env says warn, 0 again when the flag says fail
    _write(tmp_path, "envdoctor.toml", 'fail_on = "fail"\n')
    assert cli("check", "--only", "example.marker_file", cwd=tmp_path, env=plugin_env).returncode == 0
    env = {**plugin_env, "ENVDOCTOR_FAIL_ON": "warn"}
    assert cli("check", "--only", "example.marker_file", cwd=tmp_path, env=env).returncode == 1
    assert cli("check", "--only", "example.marker_file", "--fail-on", "fail", cwd=tmp_path, env=env).returncode == 0


def test_file_paths_in_a_config_file_are_relative_to_that_file(tmp_path):
    sub = tmp_path / "project"
    sub.mkdir()
    onnx_check = Check(id="onnx.opset", title="t", run=lambda ctx: ok("x"), config={"files": []})
    _write(sub, "envdoctor.toml", 'onnx = ["a.onnx", "/abs/b.onnx"]\n[check."onnx.opset"]\nfiles = ["models/c.onnx"]\n')
    config = cfg.load({"onnx.opset": onnx_check}, explicit_file=str(sub / "envdoctor.toml"), environ={}, cwd=tmp_path)
    assert config.onnx == [str(sub / "a.onnx"), "/abs/b.onnx"]
    assert config.settings_for(onnx_check)["files"] == [str(sub / "models/c.onnx")]


def test_unknown_id_in_skip_names_its_line(tmp_path):
    path = _write(tmp_path, "envdoctor.toml", 'timeout = 3\nskip = ["onnx.opset", "shm.sise"]\n')
    with pytest.raises(ConfigError) as info:
        cfg.load(CATALOG, environ={}, cwd=tmp_path)
    assert (info.value.file, info.value.line, info.value.key) == (str(path), 2, "skip")
    assert "'shm.sise'" in str(info.value)


@pytest.mark.parametrize("nested", ["[" * 600 + "]" * 600, "{a = " * 600 + "1" + "}" * 600])
def test_a_config_nested_too_deeply_is_exit_2_not_a_traceback(tmp_path, nested):
    """tomllib recurses once per level: 500 levels raised RecursionError out of check, serve and exec."""
    path = tmp_path / "envdoctor.toml"
    path.write_text(f"a = {nested}\n")
    out = cli("check", "--config", str(path), timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [f"envdoctor: bad config: {path}: not valid TOML for envdoctor: nested too deeply"]


def test_a_config_over_a_mebibyte_is_refused_unread_not_parsed_past_the_timeout(tmp_path):
    """A 46 MB file took 8.9 s to parse against `check --timeout 1` (helper-39): parsing
    is not bounded by --timeout. The file is read no further than its first MiB."""
    path = tmp_path / "envdoctor.toml"
    path.write_text("# settings\n" * 200_000)  # 2.2 MB of comments: valid TOML
    out = cli("check", "--config", str(path), "--only", "shm.size", timeout=60)
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert out.stderr.strip().splitlines() == [f"envdoctor: bad config: {path}: cannot read: larger than 1 MiB: not read as a config file"]
    path.write_text("# settings\n" * 90_000)  # under the limit: an ordinary config
    assert cli("check", "--config", str(path), "--only", "shm.size", timeout=60).returncode in (0, 1)


def test_a_pyproject_over_a_mebibyte_with_our_table_is_refused_not_silently_ignored(tmp_path):
    """Helper-45: the size limit made a [tool.envdoctor] in a large pyproject.toml vanish
    without a word; someone else's large pyproject is still not our business."""
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.envdoctor.check."shm.size"]\nmin_bytes = "1g"\n' + "#" * (1 << 20) + "\n")
    out = cli("check", "--only", "shm.size", cwd=tmp_path, timeout=60)
    assert out.returncode == 2 and "pyproject.toml: larger than 1 MiB: not read as a config file" in out.stderr, out.stderr
    path.write_text('[tool.other]\nx = 1\n' + "#" * (1 << 20) + "\n")
    assert cli("check", "--only", "shm.size", cwd=tmp_path, timeout=60).returncode in (0, 1)


@pytest.mark.parametrize("check_id, key, value, said", [
    ("memory.cache_growth", "alpha", "-1", "expected a number >= 0"),
    ("memory.cache_growth", "alpha", "2", "expected a fraction from 0 to 1"),
    ("memory.cache_growth", "alpha", "0", "significance level above 0"),
    ("gpu.health", "max_used_fraction", "1e308", "expected a fraction from 0 to 1"),
    ("shm.size", "batch_bytes", "-1", ""),  # sizes go through parse_size, which has its own words
    ("memory.cache_growth", "interval_seconds", "-1", "expected a number >= 0"),
])
def test_a_number_out_of_its_range_is_exit_2(tmp_path, check_id, key, value, said):
    """Negative sizes, counts and times, and fractions over 1, were taken and made a rule that could never fire."""
    path = tmp_path / "envdoctor.toml"
    path.write_text(f'[check."{check_id}"]\n{key} = {value}\n')
    out = cli("check", "--config", str(path), "--only", "shm.size", timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"{check_id}\".{key}" in out.stderr and said in out.stderr, out.stderr


@pytest.mark.parametrize("where", ["file", "environment"])
def test_a_config_python_that_is_no_interpreter_is_exit_2(tmp_path, where):
    """As --python's own check: a typo there turned cuda.runtime and torch.cudnn into skips, exit 0."""
    path = tmp_path / "envdoctor.toml"
    path.write_text('python = "/nonexistent/python3"\n' if where == "file" else "")
    env = {"ENVDOCTOR_PYTHON": "/nonexistent/python3"} if where == "environment" else None
    out = cli("check", "--config", str(path), "--only", "shm.size", env=env, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and "no such executable interpreter" in out.stderr


@pytest.mark.parametrize("value, said", [("abc", "expected a number"), ("-5", "positive"), ("nan", "finite"),
                                         ("1e9", "at most 86400")])
def test_a_bad_probe_timeout_is_bad_config_not_the_default(value, said):
    """ENVDOCTOR_PROBE_TIMEOUT=abc was quietly 60 s; every other ENVDOCTOR_* typo is exit 2 (helper-18)."""
    proc = cli("check", "--only", "shm.size", env={"ENVDOCTOR_PROBE_TIMEOUT": value})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    line, = proc.stderr.strip().splitlines()
    assert line.startswith("envdoctor: bad config: environment: ENVDOCTOR_PROBE_TIMEOUT: ") and said in line, line


def test_a_good_probe_timeout_is_the_probes_limit(monkeypatch):
    from envdoctor import probe

    monkeypatch.setenv("ENVDOCTOR_PROBE_TIMEOUT", " 7.5 ")
    assert probe.default_timeout() == 7.5
    assert cfg.load({}, environ={"ENVDOCTOR_PROBE_TIMEOUT": "7.5"}).timeout == cfg.Config().timeout  # not the run's


@pytest.mark.parametrize("check_id", ["vendor.ecc__strict", "vendor.ecc_"])
def test_an_id_with_a_double_or_trailing_underscore_has_a_working_variable(check_id):
    """`explain` advertised ENVDOCTOR_CHECK__VENDOR_ECC__STRICT__KEY, which the split at
    every "__" then refused as naming no check (helper-21)."""
    catalog = {check_id: Check(id=check_id, title="t", run=lambda c: ok("x"), config={"level": 1})}
    var = cfg.env_name(check_id, "level")
    assert cfg.load(catalog, environ={var: "2"}).checks[check_id]["level"] == 2


def test_a_zero_seconds_setting_is_the_checks_to_judge(tmp_path):
    """A `*_timeout_seconds = 0` is not a config error: a plug-in's may mean "off", and a
    built-in check that cannot work with 0 says so in its row (torch.pin_memory)."""
    path = tmp_path / "envdoctor.toml"
    path.write_text('[check."dist.env"]\nresolve_timeout_seconds = 0\n[check."torch.pin_memory"]\nmeasure_timeout_seconds = 0\n')
    out = cli("check", "--config", str(path), "--only", "shm.size", timeout=60)
    assert out.returncode in (0, 1) and "bad config" not in out.stderr, out.stderr


def test_a_setting_declared_as_strings_or_a_table_takes_only_that(tmp_path):
    """Helper-37: `names = [1, {a=1}]` for a default of strings, and `table = 5` (or an
    environment variable) for a default table, reached the check as they were."""
    check = Check(id="acme.kinds", title="t", run=lambda ctx: ok("x"), config={"names": ["a", "b"], "table": {"x": 1},
                                                                          "anything": None, "open": []})
    catalog = {check.id: check}
    for text, said in (('names = [1, {a=1}]', "expected a list of strings, got the item 1"),
                       ('table = 5', "expected a table, got 5")):
        _write(tmp_path, "envdoctor.toml", f'[check."acme.kinds"]\n{text}\n')
        with pytest.raises(ConfigError, match=said):
            cfg.load(catalog, environ={}, cwd=tmp_path)
    with pytest.raises(ConfigError, match=r"ENVDOCTOR_CHECK__ACME_KINDS__TABLE: expected a table, which only envdoctor.toml can give"):
        cfg.load(catalog, environ={"ENVDOCTOR_CHECK__ACME_KINDS__TABLE": "zzz"})
    _write(tmp_path, "envdoctor.toml", '[check."acme.kinds"]\nnames = ["c"]\ntable = {y = 2}\nanything = 3\nopen = [1, "a"]\n')
    settings = cfg.load(catalog, environ={}, cwd=tmp_path).settings_for(check)
    assert (settings["names"], settings["table"], settings["anything"], settings["open"]) == (["c"], {"y": 2}, 3, [1, "a"])


@pytest.mark.parametrize("make, said", [
    (lambda p: p.mkdir(), "a directory, not a config file"),
    (lambda p: p.symlink_to(p.parent / "gone.toml"), "a symbolic link to nothing"),
])
def test_an_envdoctor_toml_that_is_no_file_is_bad_config(tmp_path, make, said):
    """Helper-38: a directory (or a dangling link) named envdoctor.toml in the working
    directory was passed over without a word, and the run went on with no config."""
    make(tmp_path / "envdoctor.toml")
    with pytest.raises(ConfigError, match=said):
        cfg.load(CATALOG, environ={}, cwd=tmp_path)
    proc = cli("exec", "--", "true", cwd=tmp_path)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_explain_writes_a_table_default_as_toml_and_says_a_none_default(tmp_path):
    """Helper-37: a dict default was shown as Python's repr, `table = {'x': 1}`, which is no
    TOML, and a None default as `maybe = ""`, though the check then got None."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the same parser, as envdoctor.config reads it there
        import tomli as tomllib

    assert tomllib.loads(f"t = {cfg.toml_value({'x': 1, 'a b': 'c', 'n': [1, 2]})}")["t"] == {"x": 1, "a b": "c", "n": [1, 2]}
    odd = 'a "quoted"\\ line\nand\ttab\x01\x7f é'  # helper-39: a newline in a default was written raw
    assert tomllib.loads(f"s = {cfg.toml_value(odd)}")["s"] == odd
    site = tmp_path / "site"
    info = site / "kinds-1.0.dist-info"
    info.mkdir(parents=True)
    (site / "kinds.py").write_text("from envdoctor.check import Check\nfrom envdoctor.model import ok\n"
                                   "CHECK = Check(id='acme.kinds', title='t', run=lambda ctx: ok('x'), "
                                   "config={'table': {'x': 1}, 'maybe': None})\n")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kinds\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[envdoctor.checks]\nacme.kinds = kinds:CHECK\n")
    out = cli("explain", "acme.kinds", env={"PYTHONPATH": str(site)}).stdout
    assert "  table = {x = 1}" in out and "  # maybe: unset by default" in out and 'maybe = ""' not in out, out


def test_check_refuses_a_serve_table_that_serve_would_refuse(tmp_path):
    """Helper-40: `[serve] bogus = 1` or `interval = 0` passed `envdoctor check` (exit 0)
    and then stopped `serve` (exit 2): a file CI checked could take the node's monitor down."""
    for text, key in (("[serve]\ninterval = 2\nbogus = 1\n", "serve.bogus"), ("[serve]\ninterval = 0\n", "serve.interval")):
        (tmp_path / "envdoctor.toml").write_text(text)
        proc = cli("check", "--only", "shm.size", cwd=tmp_path)
        assert proc.returncode == 2 and key in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    (tmp_path / "envdoctor.toml").write_text("[serve]\ninterval = 2\n")
    assert cli("check", "--only", "shm.size", cwd=tmp_path).returncode in (0, 1)


def test_only_on_the_command_line_beats_the_files_and_the_environments_skip(tmp_path):
    """Helper-47: with the README's `skip = ["onnx.opset"]` in the file, `--only onnx.opset`
    was exit 2 ("leave no check to run"), although the command line beats the file
    elsewhere (`--only` already overrides `enabled = false`). --skip still wins."""
    import json

    def ran(proc):
        assert proc.returncode in (0, 1), proc.stderr
        return sorted(r["check"] for r in json.loads(proc.stdout)["results"])

    _write(tmp_path, "envdoctor.toml", 'skip = ["onnx.opset", "shm.size"]\n')
    assert ran(cli("check", "--only", "onnx.opset", "-f", "json", cwd=tmp_path)) == ["onnx.opset"]
    assert ran(cli("check", "--only", "cpu.threads", "-f", "json", cwd=tmp_path,
                   env={"ENVDOCTOR_SKIP": "cpu.threads"})) == ["cpu.threads"]
    plain = ran(cli("check", "-f", "json", cwd=tmp_path))
    assert "onnx.opset" not in plain and "shm.size" not in plain and "cpu.threads" in plain
    refused = cli("check", "--only", "onnx.opset", "--skip", "onnx.opset", cwd=tmp_path)
    assert refused.returncode == 2 and "leave no check to run" in refused.stderr


def test_envdoctor_only_beats_the_files_skip_and_the_environments_skip_still_wins(tmp_path):
    """Helper-51: with skip = ["shm.size"] in the file, ENVDOCTOR_ONLY=shm.size was exit 2
    ("leave no check to run"), although the environment beats the file."""
    _write(tmp_path, "envdoctor.toml", 'skip = ["shm.size", "onnx.opset"]\n')
    config = cfg.load(CATALOG, environ={"ENVDOCTOR_ONLY": "shm.size"}, cwd=tmp_path)
    assert config.only == ["shm.size"] and "shm.size" not in config.skip
    both = cfg.load(CATALOG, environ={"ENVDOCTOR_ONLY": "shm.size", "ENVDOCTOR_SKIP": "shm.size"}, cwd=tmp_path)
    assert both.skip == ["shm.size"]
    proc = cli("check", "-f", "json", cwd=tmp_path, env={"ENVDOCTOR_ONLY": "shm.size"})
    assert proc.returncode in (0, 1), proc.stderr


def test_an_empty_model_name_in_the_checks_files_is_bad_config(tmp_path):
    """helper-95: files = [""] was judged as the model '.': ".: is a directory"."""
    (tmp_path / "envdoctor.toml").write_text('[check."onnx.opset"]\nfiles = ["a.onnx", ""]\n')
    proc = cli("check", "--only", "onnx.opset", "--config", str(tmp_path / "envdoctor.toml"), cwd=tmp_path)
    assert proc.returncode == 2 and 'check."onnx.opset".files: an empty file name' in proc.stderr, proc.stderr
