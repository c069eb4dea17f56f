"""deploy/slurm: the health program drains with NHC's one-line reason through a
stand-in `scontrol` that records its arguments, resumes only nodes it drained,
leaves an admin's drain alone, and never drains when envdoctor itself cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SLURM = Path(__file__).resolve().parent.parent / "deploy/slurm"

STANDIN_SCONTROL = """#!/usr/bin/env python3
# Stand-in for Slurm's scontrol: records argv, answers `show node` from a file.
import json, os, sys
with open(os.environ["STANDIN_SCONTROL_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["show", "node"]:
    sys.stdout.write(open(os.environ["STANDIN_SCONTROL_SHOW"]).read())
"""


@pytest.fixture
def slurm(plugin_env, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(STANDIN_SCONTROL)
    scontrol.chmod(0o755)
    envdoctor = bin_dir / "envdoctor"
    envdoctor.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m envdoctor "$@"\n')
    envdoctor.chmod(0o755)
    log, show = tmp_path / "scontrol.log", tmp_path / "show-node.txt"
    show.write_text("NodeName=gpu07 Arch=x86_64 CoresTotal=64 State=IDLE ThreadsPerCore=2\n")

    def run(script, marker_path, args="--only example.marker_file", **extra):
        (tmp_path / "envdoctor.toml").write_text(f'[check."example.marker_file"]\npath = "{marker_path}"\n')
        env = {**os.environ, **plugin_env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               "STANDIN_SCONTROL_LOG": str(log), "STANDIN_SCONTROL_SHOW": str(show),
               "ENVDOCTOR_NODENAME": "gpu07", "ENVDOCTOR_HEALTH_ARGS": args, **extra}
        proc = subprocess.run(["bash", str(SLURM / script)], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=180)
        calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        log.unlink(missing_ok=True)
        return proc, [c for c in calls if c[0] != "show"]

    run.show_node = show
    run.tmp = tmp_path
    return run


def test_a_failing_check_drains_with_one_nhc_style_line(slurm):
    proc, updates = slurm("health.sh", "/no/such/READY")
    reason = "envdoctor: example.marker_file: /no/such/READY is missing on self"
    assert proc.returncode == 1
    assert proc.stdout == reason + "\n"
    assert updates == [["update", "NodeName=gpu07", "State=DRAIN", f"Reason={reason}"]]


def test_several_failures_name_the_first_and_count_the_rest(slurm):
    proc, updates = slurm("health.sh", "/no/such/READY", args="--only example.marker_file --only dist.env",
                          WORLD_SIZE="2", RANK="3")
    assert proc.returncode == 1
    line = proc.stdout.strip()
    assert "\n" not in line and len(line) <= 200 and line.endswith("(+1 more)"), line
    assert updates[0][3] == "Reason=" + line


def test_a_healthy_node_is_left_alone(slurm):
    proc, updates = slurm("health.sh", slurm.tmp)
    assert proc.returncode == 0 and proc.stdout == "" and updates == []


def test_a_node_it_drained_is_resumed_once_healthy(slurm):
    slurm.show_node.write_text("NodeName=gpu07 State=IDLE+DRAIN Reason=envdoctor: shm.size: /dev/shm is 64 MiB "
                               "[root@2026-11-23T05:40:00]\n")
    proc, updates = slurm("health.sh", slurm.tmp)
    assert proc.returncode == 0
    assert updates == [["update", "NodeName=gpu07", "State=RESUME"]]
    assert "resumed gpu07 (was: envdoctor: shm.size: /dev/shm is 64 MiB)" in proc.stdout


def test_an_admins_drain_is_never_resumed_nor_overwritten(slurm):
    slurm.show_node.write_text("NodeName=gpu07 State=IDLE+DRAIN Reason=bad DIMM, ticket 4711 [alice@2026-11-22T10:00:00]\n")
    proc, updates = slurm("health.sh", slurm.tmp)
    assert proc.returncode == 0 and updates == []
    proc, updates = slurm("health.sh", "/no/such/READY")
    assert proc.returncode == 1 and updates == []
    assert "already drained by someone else (bad DIMM, ticket 4711)" in proc.stderr


def test_envdoctor_that_cannot_run_or_overruns_drains_nothing(slurm):
    proc, updates = slurm("health.sh", "/no/such/READY", args="--only no.such_check")
    assert proc.returncode == 0 and updates == []
    assert "could not run (exit 2)" in proc.stderr
    proc, updates = slurm("health.sh", "/no/such/READY", ENVDOCTOR_HEALTH_TIMEOUT="0.05")
    assert proc.returncode == 0 and updates == []
    assert "timed out after 0.05 s (ENVDOCTOR_HEALTH_TIMEOUT); nothing drained" in proc.stderr, proc.stderr


def test_the_prolog_says_it_timed_out_and_lets_the_job_start(slurm):
    """helper-115: a timeout was "could not run (exit 124): " with nothing after it."""
    proc, updates = slurm("prolog.sh", "/no/such/READY", ENVDOCTOR_PROLOG_TIMEOUT="0.05")
    assert proc.returncode == 0 and updates == []
    assert "envdoctor prolog timed out after 0.05 s (ENVDOCTOR_PROLOG_TIMEOUT); the job starts" in proc.stderr, proc.stderr


def test_fields_slurm_prints_after_the_reason_are_not_part_of_it(slurm):
    """helper-115: newer scontrol prints Comment=, Extra=... after `Reason=... [user@time]`;
    they were shown as part of the reason (and an admin's reason ending so was not ours)."""
    slurm.show_node.write_text("NodeName=gpu07 State=IDLE+DRAIN Reason=envdoctor: shm.size: /dev/shm is 64 MiB "
                               "[root@2026-11-23T05:40:00] Comment=rack12 Extra=(null) InstanceId=(null)\n")
    proc, updates = slurm("health.sh", slurm.tmp)
    assert proc.returncode == 0 and updates == [["update", "NodeName=gpu07", "State=RESUME"]]
    assert "(was: envdoctor: shm.size: /dev/shm is 64 MiB)\n" in proc.stdout, proc.stdout


def _epilog(tmp_path, textfile, timeout="60"):
    envdoctor = tmp_path / "envdoctor-bin"
    envdoctor.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m envdoctor "$@"\n')
    envdoctor.chmod(0o755)
    env = {**os.environ, "ENVDOCTOR": str(envdoctor), "ENVDOCTOR_TEXTFILE": str(textfile),
           "ENVDOCTOR_EPILOG_TIMEOUT": timeout, "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run(["bash", str(SLURM / "epilog.sh")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=180)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.real
def test_epilog_textfile_is_served_by_the_real_node_exporter(tmp_path):
    import shutil
    import time
    import urllib.request

    exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if exporter is None:
        pytest.skip("prometheus-node-exporter not installed (Debian package prometheus-node-exporter)")
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    proc = _epilog(tmp_path, textdir / "envdoctor.prom")
    assert proc.returncode == 0, proc.stderr
    port = _free_port()
    node_exporter = subprocess.Popen([exporter, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
                                      "--collector.textfile", f"--collector.textfile.directory={textdir}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    body = r.read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline, "node_exporter did not answer"
                time.sleep(0.2)
    finally:
        node_exporter.terminate()
        node_exporter.wait(timeout=10)
    import re

    assert re.search(r'envdoctor_check_status\{check="shm.size",status="\w+",target="node"\} 1', body)
    assert 'node_textfile_scrape_error 0' in body  # node_exporter parsed it without complaint


def test_epilog_never_fails_the_job_even_when_envdoctor_cannot_write(tmp_path):
    proc = _epilog(tmp_path, tmp_path / "no/such/dir/envdoctor.prom")
    assert proc.returncode == 0
    assert "serve --once exited 2" in proc.stderr and "does not exist" in proc.stderr
    proc = _epilog(tmp_path, tmp_path / "envdoctor.prom", timeout="0.05")
    assert proc.returncode == 0 and "serve --once exited 124" in proc.stderr
    assert not (tmp_path / "envdoctor.prom").exists()


def test_epilog_writes_the_node_only_so_no_exited_process_keeps_alerting(tmp_path):
    """helper-44: the file is written once per job; a process's series in it outlived the
    process until the next job ended, and its alerts never cleared."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                               env={**os.environ, "ENVDOCTOR_TEST_PICK_ME": "1"})
    try:
        os.environ["ENVDOCTOR_SERVE__SELECT_ENV"] = "ENVDOCTOR_TEST_PICK_ME"  # serve would examine it
        proc = _epilog(tmp_path, tmp_path / "envdoctor.prom")
    finally:
        os.environ.pop("ENVDOCTOR_SERVE__SELECT_ENV", None)
        sleeper.communicate(b"", timeout=30)
    assert proc.returncode == 0, proc.stderr
    body = (tmp_path / "envdoctor.prom").read_text()
    assert 'target="node"' in body and 'target="pid:' not in body
