"""serve's settings from the environment (ENVDOCTOR_SERVE__<KEY>): beats the file, as
every other setting's environment variable does; a bad one is bad config naming it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from envdoctor import config as cfg
from envdoctor.errors import ConfigError
from envdoctor.serve.settings import from_config


def _config(tmp_path, text=""):
    path = tmp_path / "envdoctor.toml"
    path.write_text(text)
    return cfg.load({}, explicit_file=str(path), environ={})


def test_the_environment_beats_the_file(tmp_path):
    config = _config(tmp_path, "[serve]\ninterval = 30\nmax_targets = 64\n")
    settings = from_config(config, environ={"ENVDOCTOR_SERVE__MAX_TARGETS": "1",
                                            "ENVDOCTOR_SERVE__SELECT_COMM": "train*, python3",
                                            "ENVDOCTOR_SERVE__SELECT_ENV": "SLURM_JOB_ID"})
    assert (settings.interval, settings.max_targets) == (30.0, 1)
    assert settings.selectors.comm == ("train*", "python3") and settings.selectors.env == ("SLURM_JOB_ID",)
    assert from_config(config, interval_flag=5.0, environ={"ENVDOCTOR_SERVE__INTERVAL": "60"}).interval == 5.0  # the flag wins


@pytest.mark.parametrize("var, value, said", [
    ("ENVDOCTOR_SERVE__MAX_TARGETS", "0", "expected a whole number >= 1"),
    ("ENVDOCTOR_SERVE__MAX_TARGETS", "lots", "expected a whole number >= 1"),
    ("ENVDOCTOR_SERVE__INTERVAL", "nan", "expected a finite number of seconds"),
    ("ENVDOCTOR_SERVE__SELECT_COMM", "train*,,x", "expected a list of non-empty strings (comma-separated)"),
    ("ENVDOCTOR_SERVE__MAXTARGETS", "1", "unknown setting; known: ENVDOCTOR_SERVE__INTERVAL"),
    ("ENVDOCTOR_SERVE__max_targets", "1", "unknown setting"),  # names are upper case, as every other variable's
    ("ENVDOCTOR_SERVE__MAX_TARGETS", "\u0661", "expected a whole number >= 1"),  # int() reads Arabic-Indic digits
])
def test_a_bad_variable_is_named(tmp_path, var, value, said):
    with pytest.raises(ConfigError) as caught:
        from_config(_config(tmp_path), environ={var: value})
    assert str(caught.value).startswith(f"environment: {var}: {said}"), str(caught.value)


def test_serve_once_with_max_targets_1_reports_the_node_only(tmp_path):
    """What deploy/slurm/epilog.sh does: a torch-free python process that selectors would
    pick is left to the overflow counter, not written as a series."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                               env={**os.environ, "ENVDOCTOR_TEST_PICK_ME": "1"})
    try:
        env = {**os.environ, "ENVDOCTOR_SERVE__SELECT_ENV": "ENVDOCTOR_TEST_PICK_ME"}
        env.pop("ENVDOCTOR_CONFIG", None)
        textfile = tmp_path / "envdoctor.prom"
        for limit, picked in (("256", True), ("1", False)):
            env["ENVDOCTOR_SERVE__MAX_TARGETS"] = limit
            proc = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--once", "--textfile", str(textfile)],
                                  capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
            assert proc.returncode == 0, proc.stderr
            body = textfile.read_text()
            assert (f'target="pid:{sleeper.pid}"' in body) is picked, body[-2000:]
            assert 'target="node"' in body
    finally:
        sleeper.communicate(b"", timeout=30)


def test_a_bad_file_value_is_refused_even_where_the_environment_overrides_it(tmp_path):
    """Helper-45: with the key in the environment, `max_targets = 0` in the file was never
    checked, and waited for the day the variable was gone."""
    config = _config(tmp_path, "[serve]\nmax_targets = 0\n")
    with pytest.raises(ConfigError) as caught:
        from_config(config, environ={"ENVDOCTOR_SERVE__MAX_TARGETS": "8"})
    assert "serve.max_targets: expected a whole number >= 1" in str(caught.value)


def test_check_refuses_what_serve_would_refuse_in_the_environment_too(tmp_path):
    env = {**os.environ, "ENVDOCTOR_SERVE__INTERVAL": "abc"}
    env.pop("ENVDOCTOR_CONFIG", None)
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "check", "--only", "shm.size"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and "ENVDOCTOR_SERVE__INTERVAL: expected a finite number" in proc.stderr, proc.stderr
