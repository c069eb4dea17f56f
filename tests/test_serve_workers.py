"""serve and DataLoader workers, for real: a torch job with two persistent workers. The
workers share the job's environment, cgroup, /dev/shm and torch, so each check but the
memory one repeated the job's verdict on every worker (helper-54: one job with 4 workers
was 5 failing targets, each its own alert); only memory.cache_growth runs on a worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import stop_job

pytestmark = pytest.mark.real

JOB = textwrap.dedent("""
    import os, sys, time, torch
    from torch.utils.data import DataLoader, TensorDataset
    loader = DataLoader(TensorDataset(torch.zeros(64, 8)), batch_size=8, num_workers=2, persistent_workers=True)
    it = iter(loader); next(it)                     # the workers are up
    print("ready", flush=True)
    for _ in range(600):                            # bounded: at most 60 s
        if os.path.exists(sys.argv[1]):
            break
        time.sleep(0.1)
""")

SERVE_ONCE = """
import json
from envdoctor.serve import Daemon, Options
snap = Daemon(Options(once=True)).scheduler.run_once()
print(json.dumps({"report": json.loads(snap.report.decode()), "metrics": snap.metrics.decode()}))
"""


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_dataloader_workers_get_only_the_memory_check(tmp_path):
    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    stop = tmp_path / "stop"
    job = subprocess.Popen([sys.executable, "-c", JOB, str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline().strip() == "ready"
        children = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()
        workers = [int(p) for p in children if _comm(int(p)) == "pt_data_worker"]
        if not workers:
            pytest.skip(f"this torch does not name its DataLoader workers pt_data_worker: {[_comm(int(p)) for p in children]}")
        out = subprocess.run([sys.executable, "-c", SERVE_ONCE], capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD="1"))
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout)
        rows: dict[str, set[str]] = {}
        for r in data["report"]["results"]:
            rows.setdefault(r["target"], set()).add(r["check"])
        print("job:", sorted(rows.get(f"pid:{job.pid}", ())), "| workers:", {w: sorted(rows.get(f"pid:{w}", ())) for w in workers})
        assert {"shm.size", "cpu.threads", "memory.cache_growth"} <= rows[f"pid:{job.pid}"]
        for worker in workers:
            assert rows.get(f"pid:{worker}") == {"memory.cache_growth"}, rows.get(f"pid:{worker}")
            assert f'envdoctor_target_info{{' in data["metrics"] and f'target="pid:{worker}"' in data["metrics"]
        # with the memory check switched off, a worker runs nothing, quietly (not an error each run)
        off = subprocess.run([sys.executable, "-c", SERVE_ONCE], capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD="1", ENVDOCTOR_SKIP="memory.cache_growth"))
        assert off.returncode == 0 and "target not examined" not in off.stderr, off.stderr
        targets = {r["target"] for r in json.loads(off.stdout)["report"]["results"]}
        assert f"pid:{job.pid}" in targets and not targets & {f"pid:{w}" for w in workers}
    finally:
        stop_job(job, stop)


def test_a_process_that_only_takes_the_workers_name_keeps_every_check(tmp_path):
    """Helper-55: a torch process that renames itself pt_data_worker (prctl) hid from every
    check but memory.cache_growth. A worker must also be the child of a target."""
    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    stop = tmp_path / "stop"
    code = ("import ctypes, os, sys, time, torch; ctypes.CDLL(None).prctl(15, b'pt_data_worker', 0, 0, 0); "
            "print('ready', flush=True)\nfor _ in range(600):\n    time.sleep(0.1)\n    if os.path.exists(sys.argv[1]): break")
    # under a shell that stays its parent: this test's own process has torch loaded and is a target
    shell = subprocess.Popen(["sh", "-c", '"$0" -c "$1" "$2"; true', sys.executable, code, str(stop)],
                             stdout=subprocess.PIPE, text=True)
    job = shell
    try:
        assert shell.stdout.readline().strip() == "ready"
        job_pid = int(subprocess.run(["pgrep", "-P", str(shell.pid)], capture_output=True, text=True).stdout.split()[0])
        assert _comm(job_pid) == "pt_data_worker"
        out = subprocess.run([sys.executable, "-c", SERVE_ONCE], capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD="1"))
        rows = {r["check"] for r in json.loads(out.stdout)["report"]["results"] if r["target"] == f"pid:{job_pid}"}
        assert {"shm.size", "cpu.threads", "memory.cache_growth"} <= rows, rows
    finally:
        stop.touch()
        job.wait(timeout=30)
