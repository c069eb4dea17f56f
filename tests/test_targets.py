"""Targets other than ourselves: another process's environment read through
/proc/N, permission denied and a process that vanishes mid-run become skips with
their reason, never tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from envdoctor.context import Session, Target
from envdoctor.errors import Unavailable
from helpers import cli, other_users_sleeper, unprivileged_envdoctor


def _sleeper(env=None):
    """A child that has finished starting: right after exec, /proc/N/environ can
    still read empty (the kernel sets the new environ bounds late in execve)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"], env=env,
                             stdout=subprocess.PIPE)
    child.stdout.readline()
    return child


def test_pid_target_environment_is_the_targets_not_ours():
    child = _sleeper({**os.environ, "CUDA_VISIBLE_DEVICES": "3,1", "ONLY_IN_CHILD": "yes"})
    try:
        env = Session(target=Target(child.pid)).env
        assert env["CUDA_VISIBLE_DEVICES"] == "3,1" and env["ONLY_IN_CHILD"] == "yes"
        assert "ONLY_IN_CHILD" not in os.environ
    finally:
        child.kill()
        child.wait()


def test_a_process_that_exits_mid_run_is_a_reason_not_a_crash():
    child = _sleeper()
    session = Session(target=Target(child.pid))
    child.kill()
    child.wait()
    with pytest.raises(Unavailable, match=f"process {child.pid} exited during the run"):
        session.env


@pytest.mark.real
def test_permission_denied_on_another_users_process_is_a_skip(tmp_path):
    child = other_users_sleeper()  # owned by nobody; envdoctor below keeps uid 0 but has no capabilities
    try:
        proc = unprivileged_envdoctor("check", "--pid", str(child.pid), "--only", "dist.env", "--format", "json",
                                      cwd=tmp_path)
        assert "Traceback" not in proc.stderr, proc.stderr
        row = json.loads(proc.stdout)["results"][0]
        assert row["status"] == "skip", row
        assert "permission denied" in row["summary"] and f"/proc/{child.pid}/environ" in row["summary"]
    finally:
        child.kill()
        child.wait()
