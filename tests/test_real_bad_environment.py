"""The whole tool against a really broken environment, as a new user meets it:
a 64 MiB /dev/shm (a tmpfs in a private mount namespace, Docker's default), a
0.5-CPU cgroup quota, oversubscribed threads, a badly masked CUDA_VISIBLE_DEVICES
and half a DDP launch. `envdoctor check` must name each problem with its fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_real_cgroup import _make_limited_cgroup, _remove
from test_real_shm import _namespace_or_skip

pytestmark = pytest.mark.real

BROKEN_ENV = {"OMP_NUM_THREADS": "16", "CUDA_VISIBLE_DEVICES": "0,x,1", "WORLD_SIZE": "2", "RANK": "3"}


def test_check_names_every_problem_and_its_fix(tmp_path):
    _namespace_or_skip()
    cgroup = _make_limited_cgroup()
    try:
        script = (
            f"echo $$ > {cgroup.path / 'cgroup.procs'} && mount --make-rprivate / && "
            "mount -t tmpfs -o size=64m tmpfs /dev/shm || exit 97; "
            f"{sys.executable} -m envdoctor check --format json > report.json; echo $? > json.rc; "
            f"COLUMNS=200 {sys.executable} -m envdoctor check > report.txt; echo $? > text.rc"
        )
        env = {**os.environ, **BROKEN_ENV, "XDG_CACHE_HOME": str(tmp_path / "cache")}
        outer = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=240)
        assert outer.returncode != 97, outer.stderr
    finally:
        _remove(cgroup)

    assert (tmp_path / "json.rc").read_text().strip() == "1"
    rows = {r["check"]: r for r in json.loads((tmp_path / "report.json").read_text())["results"]}
    shm, cpu, cvd, dist = rows["shm.size"], rows["cpu.threads"], rows["cuda.visible_devices"], rows["dist.env"]

    assert shm["status"] == "fail" and shm["facts"]["size_bytes"] == 64 * 1024**2
    assert "--shm-size=" in shm["remediation"] and "emptyDir" in shm["remediation"]
    assert cpu["status"] == "warn" and cpu["facts"]["effective_cpus"] == 0.5
    assert "OMP_NUM_THREADS=16" in cpu["summary"] and "export OMP_NUM_THREADS=1" in cpu["remediation"]
    assert cvd["status"] == "fail" and "'x'" in cvd["summary"]
    assert "export CUDA_VISIBLE_DEVICES=0,1" in cvd["remediation"]
    assert dist["status"] == "fail" and "MASTER_ADDR" in dist["summary"] and "RANK=3" in dist["summary"]
    assert dist["remediation"]

    text = (tmp_path / "report.txt").read_text()
    assert (tmp_path / "text.rc").read_text().strip() == "1"
    for needle in ("shm.size", "cpu.threads", "cuda.visible_devices", "dist.env", "--shm-size=", "OMP_NUM_THREADS=1",
                   "CUDA_VISIBLE_DEVICES=0,1", "CPU quota (cgroup)  0.5 CPUs", "/dev/shm size       64 MiB"):
        assert needle in text, f"{needle!r} missing from the text report"
