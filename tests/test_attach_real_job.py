"""The done-when job, for real: an attached torch script in a 0.5-CPU cgroup with a 64 MiB
/dev/shm (its own tmpfs, `unshare -m`), torch.set_num_threads(16), a DataLoader with 4
workers and pin_memory=True handing over 32 MiB batches. `envdoctor check --pid N` from
outside reads its published document and reports those live numbers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from helpers import cli

pytestmark = pytest.mark.real

REPO = Path(__file__).resolve().parent.parent

JOB = textwrap.dedent("""
    import os, sys, time
    import envdoctor
    envdoctor.attach(interval=1.0)          # before torch: the post-import hook sees the DataLoader
    import torch
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(16)

    class Big(Dataset):                     # one 32 MiB tensor per item, produced one at a time
        def __len__(self):
            return 4
        def __getitem__(self, i):
            time.sleep(0.6 * i)
            return torch.zeros(8 * 1024 * 1024)  # float32: 32 MiB

    loader = DataLoader(Big(), batch_size=None, num_workers=4, pin_memory=True)
    try:
        for batch in loader:
            del batch
    except Exception as exc:                # a worker killed by the small /dev/shm: the job goes on for the test
        print("loader failed:", type(exc).__name__, exc, file=sys.stderr, flush=True)
    print("ready", flush=True)
    stop = sys.argv[1]
    for _ in range(600):                    # bounded: at most 60 s
        if os.path.exists(stop):
            break
        time.sleep(0.1)
""")


def _cpu_cgroup() -> Path:
    top = Path("/sys/fs/cgroup/cpu")
    if os.geteuid() != 0 or not (top / "cpu.cfs_quota_us").exists():
        pytest.skip("needs root and the cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
    path = top / f"envdoctor-attach-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    (path / "cpu.cfs_period_us").write_text("100000")
    (path / "cpu.cfs_quota_us").write_text("50000")
    return path


def _remove_cgroup(path: Path) -> None:
    for _ in range(50):
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.1)


SERVE_ONCE = """
import json, sys
from envdoctor.serve import Daemon, Options
snap = Daemon(Options(once=True)).scheduler.run_once()
print(snap.report.decode())
"""


def _serve_report_rows(pid: int) -> dict:
    """One run of the monitor (as `envdoctor serve` does every interval): pid N's rows of /report."""
    out = subprocess.run([sys.executable, "-c", SERVE_ONCE], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD="1"))
    assert out.returncode == 0, out.stderr
    rows = {r["check"]: r for r in json.loads(out.stdout)["results"] if r["target"] == f"pid:{pid}"}
    assert rows, f"serve did not examine pid:{pid}"
    return rows


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_check_pid_reports_the_live_numbers_of_an_attached_job(tmp_path):
    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    cgroup = _cpu_cgroup()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    stop = tmp_path / "stop"
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", NUMEXPR_NUM_THREADS="1")
    shell = (f'echo $$ > {cgroup}/cgroup.procs && exec unshare -m sh -c '
             f'"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} {script} {stop}"')
    job = subprocess.Popen(["sh", "-c", shell], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = job.stdout.readline()  # bounded by the job's own sleeps; the loader ends either way
        assert line.strip() == "ready", job.stderr.read() if job.poll() is not None else line
        time.sleep(1.5)  # one more publication after the last batch
        result = cli("check", "--pid", str(job.pid), "--only", "cpu.threads,shm.size,torch.pin_memory",
                     "-f", "json", timeout=120)
        report = json.loads(result.stdout)
        rows = {r["check"]: r for r in report["results"]}
        print("\n".join(f"{r['status']} {k}: {r['summary']} | fix: {r['remediation']}" for k, r in rows.items()))

        threads = rows["cpu.threads"]
        assert threads["status"] == "warn", threads
        assert threads["facts"]["live_threads"] == 16 and threads["facts"]["live_workers"] == 4
        assert "16 intra-op threads (live" in threads["summary"] and "4 DataLoader workers" in threads["summary"]
        assert "0.5 effective CPUs" in threads["summary"]
        assert "torch.set_num_threads(1)" in threads["remediation"]

        shm = rows["shm.size"]
        assert shm["status"] == "fail", shm
        assert shm["facts"]["size_bytes"] == 64 * 1024**2
        assert shm["facts"]["need_bytes"] == 9 * 32 * 1024**2  # (4 workers x prefetch 2 + 1) x 32 MiB
        assert "the running job's (live) 4 DataLoader workers x prefetch_factor 2" in shm["summary"]
        assert "of 32 MiB" in shm["summary"]

        pin = rows["torch.pin_memory"]
        assert pin["facts"]["live_pin_memory"] is True
        assert "pin_memory=True (live)" in pin["summary"]

        # serve finds the same job (a python process with libtorch mapped) and says the same
        served = _serve_report_rows(job.pid)
        assert served["cpu.threads"]["facts"]["live_threads"] == 16, served["cpu.threads"]
        assert "16 intra-op threads (live" in served["cpu.threads"]["summary"]
        assert served["shm.size"]["status"] == "fail" and "the running job's (live) 4 DataLoader workers" in \
            served["shm.size"]["summary"]
        assert served["torch.cudnn"]["facts"]["live_settings"] is True, served["torch.cudnn"]
    finally:
        stop.write_text("")
        try:
            job.wait(timeout=30)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()
        _remove_cgroup(cgroup)
    # the document went with the job (its /dev/shm was its own tmpfs, gone with the namespace)
    assert job.returncode == 0, job.stderr.read()


SETS_ITS_OWN = textwrap.dedent("""
    import os, sys, time
    os.environ["OMP_NUM_THREADS"] = "1"     # set by the job itself, before torch: /proc/N/environ never shows it
    os.environ["MKL_NUM_THREADS"] = "1"
    import envdoctor
    envdoctor.attach(interval=0.5)
    import torch
    print("ready", torch.get_num_threads(), flush=True)
    for _ in range(600):                    # bounded: at most 60 s
        if os.path.exists(sys.argv[1]):
            break
        time.sleep(0.1)
""")


def test_cpu_threads_judges_the_variables_a_job_set_for_itself(tmp_path):
    """helper-75: a job that sets OMP_NUM_THREADS=1 in os.environ before `import torch` (its
    live view shows it) was warned "OMP_NUM_THREADS, MKL_NUM_THREADS ... unset": only
    /proc/N/environ, the environment at its start, was read."""
    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    script, stop = tmp_path / "job.py", tmp_path / "stop"
    script.write_text(SETS_ITS_OWN)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    job = subprocess.Popen([sys.executable, str(script), str(stop)], stdout=subprocess.PIPE, text=True,
                           env=dict(env, PYTHONPATH=str(REPO)))
    try:
        assert job.stdout.readline().split() == ["ready", "1"]
        time.sleep(1.0)  # a publication after torch's import
        result = cli("check", "--pid", str(job.pid), "--only", "cpu.threads", "-f", "json", timeout=120)
    finally:
        stop.touch()
        job.wait(timeout=60)
    row = json.loads(result.stdout)["results"][0]
    assert row["facts"]["variables"]["OMP_NUM_THREADS"] == "1" and row["facts"]["variables"]["MKL_NUM_THREADS"] == "1"
    assert "unset" not in row["summary"] or "OMP_NUM_THREADS" not in row["summary"], row
    assert any("OMP_NUM_THREADS=1" in note and "as the running job set it" in note for note in row["facts"]["notes"]), row
