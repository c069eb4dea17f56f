"""The whole run ends within --timeout plus a small constant, whatever blocks.

A FIFO where /proc/N/environ should be blocks any plain read forever; before the
watchdog, redaction waited on a check stuck reading it and the run never ended.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from helpers import cli

# Interpreter start, typer, entry points, rendering: what a run costs beyond its checks'
# timeout. Generous for a loaded 2-core CI runner; the point is "ends", not "fast".
SLACK_SECONDS = 12.0


def _procfs_with_fifo_environ(root: Path) -> Path:
    procfs = root / "proc"
    pid_dir = procfs / "4242"
    pid_dir.mkdir(parents=True)
    os.mkfifo(pid_dir / "environ")
    os.mkfifo(pid_dir / "cgroup")
    (pid_dir / "status").write_text("Name:\tpython\nCpus_allowed_list:\t0-1\n")
    (pid_dir / "root").mkdir()
    self_dir = procfs / "self"
    self_dir.mkdir()
    shutil.copy("/proc/self/mountinfo", self_dir / "mountinfo")
    return procfs


def test_a_fifo_environ_ends_the_run_within_the_timeout(tmp_path):
    procfs = _procfs_with_fifo_environ(tmp_path)
    started = time.monotonic()
    proc = cli("check", "--pid", "4242", "--path.procfs", str(procfs), "--timeout", "2",
               "--skip", "onnx.opset,torch.pin_memory,torch.cudnn,cuda.runtime", "-f", "json", timeout=60)
    took = time.monotonic() - started
    assert took < 2 + SLACK_SECONDS, took
    assert proc.returncode in (0, 1), proc.stderr
    rows = {r["check"]: r for r in json.loads(proc.stdout)["results"]}
    env_rows = [rows[c] for c in ("cpu.threads", "cuda.visible_devices", "dist.env") if c in rows]
    assert env_rows and all(r["status"] in ("skip", "error") for r in env_rows), env_rows
    assert any("not a readable file" in r["summary"] or "FIFO" in r["summary"] for r in env_rows), env_rows
