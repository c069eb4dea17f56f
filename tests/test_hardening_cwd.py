"""Every command started from a working directory that was removed (a job's scratch
directory cleaned up under it, a shell left in a deleted checkout). getcwd() fails
there: the entry-point cache, the torch facts and relative output paths each raised
FileNotFoundError out of it (a traceback; exec's pre-flight ran no check at all)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest


def in_removed_cwd(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """Run `python -m envdoctor ARGS` from a directory that is removed before it starts."""
    gone = tmp_path / "gone"
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "envdoctor", *args])
    script = f"mkdir {shlex.quote(str(gone))} && cd {shlex.quote(str(gone))} && rmdir {shlex.quote(str(gone))} && exec {command}"
    env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
    env["ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120, env=env)


def test_check_runs_every_check(tmp_path):
    proc = in_removed_cwd(tmp_path, "check", "-f", "json")
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    rows = json.loads(proc.stdout)["results"]
    assert len(rows) >= 10
    assert not [r for r in rows if "the check broke" in r["summary"]], rows


def test_exec_runs_its_checks_and_starts_the_job(tmp_path):
    proc = in_removed_cwd(tmp_path, "exec", "--", "sh", "-c", "echo job-ran")
    assert proc.returncode == 0 and proc.stdout.strip() == "job-ran", proc.stderr
    assert "the pre-flight broke" not in proc.stderr and "nothing to check" not in proc.stderr
    assert "error=" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, code", [
    (("exec", "--report", "r.json", "--", "true"), 2),
    (("check", "-o", "r.json"), 74),
    (("serve", "--once", "--textfile", "x.prom"), 74),
])
def test_a_relative_output_path_is_one_line(tmp_path, args, code):
    proc = in_removed_cwd(tmp_path, *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == code, proc.stderr
    assert "the working directory was removed" in proc.stderr


def test_exec_attach_hook_works_in_a_removed_directory(tmp_path):
    """The hook's abspath('') asked getcwd: 'Error in sitecustomize' in the job's stderr and
    no attach. The job here checks that it did attach."""
    job = ("import sys, time; time.sleep(1.5); import envdoctor.attach as a; "
           "print('attached' if a.current() is not None else 'not-attached')")
    proc = in_removed_cwd(tmp_path, "exec", "--attach", "--", sys.executable, "-c", job)
    assert proc.returncode == 0, proc.stderr
    assert "sitecustomize" not in proc.stderr, proc.stderr
    assert proc.stdout.strip() == "attached", proc.stderr
