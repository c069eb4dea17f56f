"""The Slurm prolog in deploy/ drains on a fail with the reason, passes otherwise,
and never drains a node because envdoctor itself could not run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROLOG = Path(__file__).resolve().parent.parent / "deploy/slurm/prolog.sh"


def _prolog(plugin_env, args, tmp_path):
    envdoctor = tmp_path / "envdoctor"
    envdoctor.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m envdoctor "$@"\n')
    envdoctor.chmod(0o755)
    env = {**os.environ, **plugin_env, "ENVDOCTOR": str(envdoctor), "ENVDOCTOR_PROLOG_ARGS": args}
    return subprocess.run(["bash", str(PROLOG)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_prolog_drains_with_the_reason_on_fail(plugin_env, tmp_path):
    (tmp_path / "envdoctor.toml").write_text('[check."example.marker_file"]\npath = "/no/such/READY"\n')
    proc = _prolog(plugin_env, "--only example.marker_file", tmp_path)
    assert proc.returncode == 1
    assert "example.marker_file: /no/such/READY is missing" in proc.stderr


def test_prolog_passes_when_nothing_fails(plugin_env, tmp_path):
    (tmp_path / "envdoctor.toml").write_text(f'[check."example.marker_file"]\npath = "{tmp_path}"\n')
    assert _prolog(plugin_env, "--only example.marker_file", tmp_path).returncode == 0


def test_prolog_does_not_drain_when_envdoctor_cannot_run(plugin_env, tmp_path):
    proc = _prolog(plugin_env, "--only no.such_check", tmp_path)
    assert proc.returncode == 0 and "could not run (exit 2)" in proc.stderr
