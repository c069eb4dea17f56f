"""Helpers tests import directly (tests/ is on sys.path under pytest's default import mode)."""

from __future__ import annotations

import os
import subprocess
import sys


def cli(*args: str, env: dict | None = None, cwd: str | os.PathLike | None = None, timeout: float = 120,
        input: str | None = None) -> subprocess.CompletedProcess:
    """Run `python -m envdoctor ARGS` in a subprocess, as a user would."""
    full_env = dict(os.environ)
    full_env.pop("ENVDOCTOR_CONFIG", None)
    if env:
        full_env.update(env)
    return subprocess.run([sys.executable, "-m", "envdoctor", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd, timeout=timeout, input=input)


NOBODY = 65534


def unprivileged_envdoctor(*args: str, env: dict | None = None, cwd=None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run envdoctor as root stripped of every capability (empty bounding set).

    Looking into another user's /proc/N (environ, root) then needs CAP_SYS_PTRACE,
    which it lacks: the permission-denied path, seen for real. Staying uid 0 keeps
    the checkout and the venv readable wherever they live (a 0700 temporary
    directory included), which running as 'nobody' would not.
    """
    import shutil

    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        import pytest

        pytest.skip("needs root and setpriv (util-linux) to drop capabilities")
    full_env = dict(os.environ)
    full_env.pop("ENVDOCTOR_CONFIG", None)
    full_env.update(env or {})
    return subprocess.run([setpriv, "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-m", "envdoctor", *args],
                          capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout)


def other_users_sleeper() -> subprocess.Popen:
    """A process owned by 'nobody' (root may start one; /bin/sleep is readable by all)."""
    return subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "60"])


def dies_with_its_parent(parent_code: str, pidfile, what: str) -> None:
    """Run `parent_code` in a Python that starts the process under test, which writes its
    pid to `pidfile`; SIGKILL that parent, and fail unless the process is gone (or a
    zombie: killed, not yet reaped by its new parent) within 10 s. For the probes'
    PR_SET_PDEATHSIG."""
    import time

    import pytest

    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pidfile.read_text())
        os.kill(child, 0)  # alive while its parent is
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{child}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        return
            except FileNotFoundError:
                return
            time.sleep(0.05)
        os.kill(child, 9)
        pytest.fail(f"{what} outlived its parent's SIGKILL")
    finally:
        parent.kill()
        parent.wait()


def stop_job(job: subprocess.Popen, stop: Path, timeout: float = 30) -> None:
    """End a test job that waits for its `stop` file: touch it, wait, kill if it lingers."""
    stop.touch()
    try:
        job.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()
