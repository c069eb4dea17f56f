"""The CLI as a user meets it: plug-ins listed and run, misbehaving checks
contained end to end, exit codes, bad usage in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import cli


def test_checks_lists_builtins_and_the_installed_plugin(plugin_env):
    proc = cli("checks", env=plugin_env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    ids = [line.split()[0] for line in lines]
    for builtin in ("shm.size", "cpu.threads", "cuda.visible_devices", "dist.env", "onnx.opset"):
        assert builtin in ids
    marker = next(line for line in lines if line.startswith("example.marker_file"))
    assert "plug-in from envdoctor-example-plugin" in marker
    broken = next(line for line in lines if line.startswith("example.broken"))
    assert "BROKEN" in broken and "envdoctor_example_missing_dependency" in broken
    # a check that `check` never runs says so where it is listed (helper-18)
    live = next(line for line in lines if line.startswith("preflight.live"))
    assert live.endswith("(not in `check`; runs in: inprocess)"), live
    assert not any("not in `check`" in line for line in lines if line.startswith(("shm.size", "onnx.opset")))


def test_plugin_runs_end_to_end_and_a_broken_plugin_is_an_error_row(plugin_env, tmp_path):
    marker = tmp_path / "READY"
    marker.write_text("yes")
    env = {**plugin_env, "ENVDOCTOR_CHECK__EXAMPLE_MARKER_FILE__PATH": str(marker)}
    proc = cli("check", "--format", "json", "--only", "example.marker_file", "--only", "example.broken", env=env)
    report = json.loads(proc.stdout)
    rows = {r["check"]: r for r in report["results"]}
    assert rows["example.marker_file"]["status"] == "ok"
    assert rows["example.marker_file"]["facts"]["size_bytes"] == 3
    assert rows["example.broken"]["status"] == "error"
    assert "envdoctor_example_missing_dependency" in rows["example.broken"]["summary"]
    assert proc.returncode == 1  # an error counts at the fail level


def test_disable_plugin_autoload_keeps_only_builtins(plugin_env):
    proc = cli("checks", env={**plugin_env, "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert "example." not in proc.stdout and "shm.size" in proc.stdout


def test_hanging_and_raising_checks_end_as_errors_near_the_timeout(plugin_env, tmp_path):
    marker = tmp_path / "READY"
    marker.write_text("")
    env = {**plugin_env, "ENVDOCTOR_CHECK__EXAMPLE_SLEEPY__SECONDS": "60",
           "ENVDOCTOR_CHECK__EXAMPLE_MARKER_FILE__PATH": str(marker)}
    started = time.perf_counter()
    proc = cli("check", "--format", "json", "--timeout", "2", "--only", "example.sleepy", "--only", "example.raises",
               "--only", "example.marker_file", "--only", "dist.env", env=env)
    elapsed = time.perf_counter() - started
    rows = {r["check"]: r for r in json.loads(proc.stdout)["results"]}
    assert rows["example.sleepy"]["status"] == "error" and "timed out after 2 s" in rows["example.sleepy"]["summary"]
    assert "misbehaving.py" in rows["example.sleepy"]["summary"]  # says where it hung
    assert rows["example.raises"]["status"] == "error" and "broken on purpose" in rows["example.raises"]["summary"]
    assert rows["example.marker_file"]["status"] == "ok"
    assert rows["dist.env"]["status"] in ("skip", "ok", "warn", "fail")  # judged, not disturbed
    assert proc.returncode == 1
    assert elapsed < 2 + 8, f"run took {elapsed:.1f} s with a 2 s timeout"  # interpreter start-up + the timeout


@pytest.mark.parametrize("args, message", [
    (("check", "--pid", "999999999"), "no process 999999999"),
    (("check", "--python", "/no/such/python3"), "--python /no/such/python3: no such executable interpreter"),
    (("check", "--only", "shm.sise"), "unknown check id 'shm.sise'"),
    (("check", "--only", ","), "--only ',' names no check id"),  # ran every check
    (("check", "--skip", " , "), "--skip ' , ' names no check id"),
    (("check", "--format", "yaml"), "--format must be one of"),
    (("check", "--fail-on", "error"), "--fail-on must be warn or fail"),
    (("check", "--path.procfs", "/nonexistent"), "is not a directory"),
    (("explain", "nope.nope"), "unknown check id 'nope.nope'"),
    (("explain", "a" * 100_000), "... (99900 more characters)"),  # helper-85: echoed whole
])
def test_bad_usage_exits_2_with_one_clear_line(args, message):
    proc = cli(*args)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("variable", ["ENVDOCTOR_ONLY", "ENVDOCTOR_SKIP"])
def test_an_unknown_id_from_the_environment_names_the_variable(variable):
    """helper-84: ENVDOCTOR_SKIP=nosuch.check (set by an image or a CI job) read like a typo on
    the command line, and nothing pointed at it."""
    proc = cli("check", env={variable: "nosuch.check"})
    assert proc.returncode == 2 and f"unknown check id 'nosuch.check' in {variable} (the environment)" in proc.stderr, proc.stderr


def test_explain_prints_the_checks_own_page_and_settings():
    proc = cli("explain", "shm.size")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("shm.size: ")
    assert "Settings, in envdoctor.toml under [check.\"shm.size\"]" in proc.stdout
    assert "ENVDOCTOR_CHECK__SHM_SIZE__KEY" in proc.stdout


def test_python_dash_m_works_like_the_command():
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "envdoctor 0.1.0"


def test_output_file_is_written_whole(tmp_path):
    out = tmp_path / "report.json"
    proc = cli("check", "--only", "dist.env", "--format", "json", "--output", str(out))
    assert proc.stdout == "" and proc.returncode in (0, 1)
    assert json.loads(out.read_text())["schema"] == "envdoctor.report/v1"
    assert not (tmp_path / "report.json.tmp").exists()


def test_no_color_in_pipes_and_with_no_color():
    proc = cli("check", "--only", "dist.env")
    assert "\x1b[" not in proc.stdout
    assert "dist.env" in proc.stdout


def test_only_accepts_a_comma_list_and_an_empty_selection_is_bad_usage():
    proc = cli("check", "--only", "shm.size,dist.env", "--format", "json")
    assert sorted(r["check"] for r in json.loads(proc.stdout)["results"]) == ["dist.env", "shm.size"]
    proc = cli("check", "--only", "shm.size", "--skip", "shm.size")
    assert proc.returncode == 2 and "leave no check to run" in proc.stderr


@pytest.mark.parametrize("check_id", ["shm.size", "dist.env", "cpu.threads", "torch.pin_memory", "onnx.opset"])
def test_explain_settings_paste_into_envdoctor_toml(check_id, tmp_path):
    """What `explain` lists under Settings is valid TOML that the config loader accepts."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the same parser, as envdoctor.config reads it there
        import tomli as tomllib

    text = cli("explain", check_id).stdout
    block = text.split("Settings, in envdoctor.toml")[1].split("\n\n")[0].splitlines()[1:]
    toml = f'[check."{check_id}"]\n' + "\n".join(line.strip() for line in block)
    assert tomllib.loads(toml)["check"][check_id]
    (tmp_path / "envdoctor.toml").write_text(toml)
    proc = cli("check", "--only", check_id, "--format", "json", cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr


def test_check_help_names_every_built_in_format_and_exit_74(monkeypatch):
    """`check --help` left out `compact` (what preflight() and logs use) and exit 74."""
    from envdoctor import export

    monkeypatch.setenv("ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD", "1")  # the built-ins only
    proc = cli("check", "--help", env={"COLUMNS": "200"})
    assert proc.returncode == 0
    for name in export.names():
        assert name in proc.stdout, name
    assert "74 the report could not be written" in proc.stdout


def test_only_a_check_that_does_not_run_in_check_mode_is_bad_usage():
    """`--only preflight.live` printed one skip row and exit 0, which CI reads as a pass;
    exec already refused such a selection (helper-18)."""
    proc = cli("check", "--only", "preflight.live")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "envdoctor: --only (or the config's only) leaves no check to run: "
        "preflight.live does not run in check mode (it runs in: inprocess)"]

    mixed = cli("check", "--only", "preflight.live,shm.size", "-f", "json")
    rows = {r["check"]: r for r in json.loads(mixed.stdout)["results"]}
    assert mixed.returncode in (0, 1) and set(rows) == {"preflight.live", "shm.size"}, mixed.stderr
    assert rows["preflight.live"]["status"] == "skip" and "does not run in check mode" in rows["preflight.live"]["summary"]


def test_an_empty_onnx_name_is_bad_usage_not_the_working_directory(tmp_path):
    """`--onnx ''` was judged as the model '.': ".: is a directory" (helper-93)."""
    proc = cli("check", "--only", "onnx.opset", "--onnx", "", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == "envdoctor: --onnx needs a file name (it was empty)"


def test_an_empty_output_name_is_bad_usage_not_the_working_directory(tmp_path):
    """`-o ''` said "cannot write /the/cwd: it is a directory" (helper-18)."""
    proc = cli("check", "--only", "shm.size", "-o", "", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == "envdoctor: --output needs a file name (it was empty)"
    assert list(tmp_path.iterdir()) == []


def test_compact_says_one_check_not_one_checks():
    proc = cli("check", "--only", "shm.size", "-f", "compact")
    assert proc.stdout.splitlines()[0].startswith("envdoctor: 1 check: "), proc.stdout


def test_check_python_gives_that_interpreters_version_not_envdoctors():
    """helper-86: `check --python /usr/bin/python3` said `Python 3.11.7` (envdoctor's own) beside
    `Interpreter /usr/bin/python3`, a 3.11.2. Its X.Y is its name's (or its link's), or none."""
    import json
    import re

    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no /usr/bin/python3")
    named = re.fullmatch(r"python(\d+\.\d+)", os.path.basename(os.path.realpath("/usr/bin/python3")))
    proc = cli("check", "--python", "/usr/bin/python3", "--only", "cpu.threads", "-f", "json")
    system = json.loads(proc.stdout)["system"]
    assert system["python_executable"] == "/usr/bin/python3"
    assert system["python_version"] == (named.group(1) if named else None), system


def test_check_pid_names_the_targets_interpreter_not_envdoctors(tmp_path):
    """Helper-54: under --pid the header's Interpreter (and Python) were envdoctor's own, for a
    /usr/bin/python3 target, unless a torch check had read the target's torch."""
    import json
    import subprocess
    import sys

    target = subprocess.Popen(["/usr/bin/python3", "-c", "import time; time.sleep(30)"])
    try:
        import time

        time.sleep(0.3)
        proc = cli("check", "--pid", str(target.pid), "--only", "cpu.threads", "-f", "json")
        system = json.loads(proc.stdout)["system"]
        assert system["python_executable"] == os.path.realpath("/usr/bin/python3"), system
        assert system["envdoctor_python"] == sys.executable
        assert system["python_version"] in (None, ".".join(os.path.realpath("/usr/bin/python3").split("python")[-1:]))
    finally:
        target.kill()
        target.wait()
