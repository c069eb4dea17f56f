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
