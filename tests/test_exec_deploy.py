"""The entrypoints written in deploy/docker/ work as written: the Dockerfile's
ENTRYPOINT + CMD and the pod's command + args are run here for real (tini
included), with only `envdoctor` pointed at this checkout and the report path
moved into the test's directory."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCKER = Path(__file__).resolve().parent.parent / "deploy" / "docker"


def _instruction(name: str) -> list[str]:
    (line,) = [line for line in (DOCKER / "Dockerfile").read_text().splitlines() if line.startswith(name + " ")]
    return json.loads(line[len(name) + 1:])  # exec form: a JSON array


def _yaml_list(key: str) -> list[str]:
    (match,) = re.findall(rf"^\s+{key}: (\[.*\])\s*$", (DOCKER / "pod-exec.yaml").read_text(), re.MULTILINE)
    return json.loads(match)  # a flow sequence of quoted strings is JSON


def _runnable(argv: list[str], report: Path) -> list[str]:
    out: list[str] = []
    for arg in argv:
        if arg == "envdoctor":
            out += [sys.executable, "-m", "envdoctor"]
        elif arg.endswith("envdoctor-report.json"):
            out.append(str(report))
        else:
            out.append(arg)
    return out


def _need_tini() -> None:
    if shutil.which("tini") is None:
        pytest.skip("needs tini (Debian package tini; scripts/test.sh installs it)")


def test_the_dockerfile_entrypoint_runs_the_command_and_writes_the_report(tmp_path):
    _need_tini()
    entrypoint, cmd = _instruction("ENTRYPOINT"), _instruction("CMD")
    assert entrypoint[:2] == ["tini", "--"] and entrypoint[-1] == "--" and "exec" in entrypoint
    assert cmd == ["python", "train.py"]
    report = tmp_path / "report.json"
    job = [sys.executable, "-c", "import os, sys; print(os.environ['OMP_NUM_THREADS']); sys.exit(5)"]
    proc = subprocess.run(_runnable(entrypoint, report) + job, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "4096"})
    assert proc.returncode == 5, proc.stderr  # the job's status, through envdoctor and tini
    assert proc.stdout.strip() == str(len(os.sched_getaffinity(0)))  # --fix is in the entrypoint
    assert json.loads(report.read_text())["schema"] == "envdoctor.report/v1"


def test_the_pod_command_refuses_a_failing_environment_and_runs_a_good_one(tmp_path):
    _need_tini()
    command, args = _yaml_list("command"), _yaml_list("args")
    assert "--strict" in command and args == ["python", "train.py"]
    marker = tmp_path / "trained"
    report = tmp_path / "report.json"
    job = ["touch", str(marker)]
    # a CUDA_VISIBLE_DEVICES that hides every GPU behind a bad token is a fail without any GPU here
    refused = subprocess.run(_runnable(command, report) + job, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "CUDA_VISIBLE_DEVICES": "GPU0"})
    assert refused.returncode == 78, refused.stderr
    assert not marker.exists()
    assert "fail cuda.visible_devices" in refused.stderr
    started = subprocess.run(_runnable(command, report) + job, capture_output=True, text=True, timeout=120,
                             env={k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"})
    assert started.returncode == 0 and marker.exists(), started.stderr


def test_the_pod_snippet_points_at_the_init_container_variant():
    text = (DOCKER / "pod-exec.yaml").read_text()
    (referenced,) = re.findall(r"\(([./\w-]+\.yaml)\)", text)
    assert (DOCKER / referenced).resolve().is_file()
    assert '"envdoctor", "check"' in (DOCKER / referenced).read_text()


def test_the_images_cmd_is_a_real_training_job_that_runs_under_the_entrypoint(tmp_path):
    """Helper-38: the Dockerfile copied a train.py that deploy/docker/ did not have, so the
    example did not build as shipped. Its CMD now runs, for real, under the ENTRYPOINT."""
    _need_tini()
    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    entrypoint, cmd = _instruction("ENTRYPOINT"), _instruction("CMD")
    assert cmd == ["python", "train.py"] and (DOCKER / "train.py").is_file()
    report = tmp_path / "report.json"
    job = [sys.executable, str(DOCKER / "train.py"), "--steps", "3", "--workers", "1"]
    proc = subprocess.run(_runnable(entrypoint, report) + job, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "4096"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("training on ") and "done: 3 steps" in proc.stdout, proc.stdout
    assert f"OMP_NUM_THREADS={len(os.sched_getaffinity(0))}" in proc.stdout  # --fix sized it to the CPUs
