"""`envdoctor check --window`: the memory check skips without one and says how, bad
windows are usage errors, and a window outlasts the run's --timeout."""

from __future__ import annotations

import json
import subprocess

from helpers import cli


def rows(proc):
    return {r["check"]: r for r in json.loads(proc.stdout)["results"]}


def test_without_a_window_the_check_skips_and_says_how():
    proc = cli("check", "--only", "memory.cache_growth", "-f", "json")
    assert proc.returncode == 0, proc.stderr
    row = rows(proc)["memory.cache_growth"]
    assert row["status"] == "skip"
    assert "--window 60" in row["remediation"]


def test_bad_windows_are_usage_errors():
    for value in ("0", "-3", "nan", "1e12"):
        proc = cli("check", "--only", "memory.cache_growth", "--window", value)
        assert proc.returncode == 2, (value, proc.stderr)
        assert "--window" in proc.stderr


def test_a_window_outlasts_the_timeout_and_judges_a_pid(tmp_path):
    config = tmp_path / "envdoctor.toml"
    config.write_text('[check."memory.cache_growth"]\nmin_window_seconds = 1.0\ninterval_seconds = 0.2\n')
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        proc = cli("check", "--only", "memory.cache_growth", "--pid", str(sleeper.pid), "--window", "3",
                   "--timeout", "1", "--config", str(config), "-f", "json")
    finally:
        sleeper.kill()
        sleeper.wait()
    row = rows(proc)["memory.cache_growth"]
    assert row["status"] == "ok", row
    assert row["target"] == f"pid:{sleeper.pid}"
    assert row["facts"]["window_seconds"] >= 2.5
    assert row["facts"]["growth_bytes_per_second"]["rss"] == 0.0
    assert "no sustained memory growth" in row["summary"]


def test_a_window_too_short_for_the_detector_is_a_skip_with_the_window_to_use():
    proc = cli("check", "--only", "memory.cache_growth", "--window", "1", "-f", "json")
    row = rows(proc)["memory.cache_growth"]
    assert row["status"] == "skip" and "--window 30" in row["summary"]


def test_a_target_that_exits_during_the_window_is_exit_2_and_one_line_not_a_healthy_0():
    """helper-120: `check --pid N --window 10` of a job that died 3 s in (the OOM killer)
    was exit 0, its memory row a skip: a healthy-looking report of a dead job. It is 2, as
    when there is no such process at the start, with the report still written. Here the
    job is a zombie until the check ends (its parent, this test, reaps it after)."""
    job = subprocess.Popen(["sleep", "1"])
    try:
        out = cli("check", "--pid", str(job.pid), "--window", "4", "-f", "compact")
    finally:
        job.wait()
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert out.stdout.startswith(f"envdoctor pid:{job.pid}: ")
    assert f"envdoctor: process {job.pid} exited during the run: the report is partial" in out.stderr
