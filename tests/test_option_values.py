"""Option values that are really options, and selections that leave nothing to run
(helper-29's findings): bad usage (exit 2) in one line, and the job never starts
unverified under --strict."""

from __future__ import annotations

import json

import pytest

from helpers import cli

BAD_CUDA = {"CUDA_VISIBLE_DEVICES": "0,x,1"}  # cuda.visible_devices fails on it
EXEC_CHECKS = "shm.size,cpu.threads,cuda.runtime,cuda.visible_devices,dist.consistency,dist.env,gpu.health,torch.cudnn"
CHECK_CHECKS = EXEC_CHECKS + ",dist.master_port,memory.cache_growth,onnx.opset,torch.pin_memory"


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.mark.parametrize("args, said", [
    (["--keep", "--strict"], "--keep '--strict': not a variable name"),
    (["--report", "--strict"], "--report --strict: looks like an option"),
    (["--keep", "A=B"], "not a variable name"),
    (["--keep", ""], "not a variable name"),
])
def test_exec_option_that_swallowed_the_next_flag_is_bad_usage(tmp_path, args, said):
    """`--keep --strict` took --strict as a variable name: the failing check no longer
    stopped the job. `--report --strict` also wrote a file named --strict."""
    marker = tmp_path / "ran"
    proc = cli("exec", *args, "--", "touch", str(marker), env=BAD_CUDA, cwd=tmp_path)
    assert proc.returncode == 2 and said in one_line(proc.stderr), proc.stderr
    assert not marker.exists() and list(tmp_path.iterdir()) == []


def test_exec_report_dash_is_standard_output(tmp_path):
    proc = cli("exec", "--only", "shm.size", "--report", "-", "--", "true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["results"][0]["check"] == "shm.size"
    assert list(tmp_path.iterdir()) == []


def test_check_output_dash_is_standard_output_and_an_option_is_not_a_file(tmp_path):
    proc = cli("check", "--only", "shm.size", "-f", "json", "-o", "-", cwd=tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)["results"], proc.stderr
    proc = cli("check", "--only", "shm.size", "-o", "--strict", cwd=tmp_path)
    assert proc.returncode == 2 and "--output --strict: looks like an option" in one_line(proc.stderr)
    assert list(tmp_path.iterdir()) == []


def test_check_skip_of_everything_that_runs_in_check_is_bad_usage():
    """Left with preflight.live alone (it runs only inside a job), `check` said
    "0 checks: none run" and exit 0, which CI reads as a pass."""
    proc = cli("check", "-f", "compact", "--skip", CHECK_CHECKS)
    assert proc.returncode == 2 and "leave no check that runs in `check`" in one_line(proc.stderr), proc.stderr


def test_exec_skip_of_everything_exec_runs_never_starts_the_job(tmp_path):
    marker = tmp_path / "ran"
    proc = cli("exec", "--strict", "--skip", EXEC_CHECKS, "--", "touch", str(marker))
    assert proc.returncode == 2 and "leave no check that runs in exec" in one_line(proc.stderr), proc.stderr
    assert not marker.exists()
    # the same through the config's skip
    config = tmp_path / "envdoctor.toml"
    config.write_text(f"skip = {EXEC_CHECKS.split(',')!r}\n".replace("'", '"'))
    proc = cli("exec", "--strict", "--", "touch", str(marker), env={"ENVDOCTOR_CONFIG": str(config)})
    assert proc.returncode == 2 and "leave no check that runs in exec" in one_line(proc.stderr), proc.stderr
    assert not marker.exists()


@pytest.mark.parametrize("command", [["check"], ["serve", "--once"]])
def test_an_empty_config_name_is_bad_usage_not_the_default_file(tmp_path, command):
    (tmp_path / "envdoctor.toml").write_text("this is not toml\n")  # what '' silently fell back to
    proc = cli(*command, "--config", "", cwd=tmp_path)
    assert proc.returncode == 2 and "--config needs a file name" in one_line(proc.stderr), proc.stderr


def test_a_config_with_a_byte_order_mark_says_so(tmp_path):
    config = tmp_path / "bom.toml"
    config.write_bytes(b'\xef\xbb\xbfonly = ["shm.size"]\n')
    proc = cli("check", "--config", str(config))
    assert proc.returncode == 2 and "byte order mark" in one_line(proc.stderr), proc.stderr


def test_exec_timeout_over_a_day_names_the_value_given():
    proc = cli("exec", "--timeout", "86400.0001", "--", "true")
    assert proc.returncode == 2 and "not 86400.0001" in one_line(proc.stderr), proc.stderr


@pytest.mark.parametrize("variable, command", [("ENVDOCTOR_ONLY", ["check"]), ("ENVDOCTOR_SKIP", ["exec", "--", "true"])])
def test_a_selection_variable_of_only_commas_is_bad_usage_as_the_flag_is(variable, command):
    """ENVDOCTOR_ONLY=, ran every check, where `--only ,` is exit 2; empty stays unset."""
    proc = cli(*command, env={variable: " , "})
    assert proc.returncode == 2 and f"{variable}: names no check id" in one_line(proc.stderr), proc.stderr
    assert cli(*command, env={variable: ""}).returncode == 0
