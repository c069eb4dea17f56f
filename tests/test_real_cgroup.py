"""cpu.threads against a real CPU-limited cgroup (root only).

A cgroup with a 0.5-CPU quota (v1 cpu.cfs_quota_us=50000 / cpu.cfs_period_us=100000,
or v2 cpu.max "50000 100000" where the cpu controller lives on cgroup v2) is made,
a `sleep` with chosen thread variables is put in it, and the check judges that
process from outside with --pid / Target(pid). The cgroup is removed afterwards,
whatever happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from envdoctor.cgroup import effective_cpus
from envdoctor.checks import cpu_threads
from envdoctor.checks.cpu_threads import THREAD_VARS
from envdoctor.context import Roots, Session, Target
from envdoctor.model import Status
from envdoctor.runner import Plan, run_one

pytestmark = pytest.mark.real


@dataclass
class LimitedCgroup:
    path: Path
    version: str  # "cgroup v1" or "cgroup v2"
    top: Path  # the hierarchy's mount point, where pids go back to


def _cgroup_mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of cgroup mounts, read independently of envdoctor.cgroup."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2") and fields[3] == "/":
            mounts.append((fields[4].replace("\\040", " "), tail[0], set(tail[2].split(","))))
    return mounts


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _make_limited_cgroup() -> LimitedCgroup:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a cgroup")
    name = f"envdoctor-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    mounts = _cgroup_mounts()
    v1 = [mp for mp, fstype, opts in mounts if fstype == "cgroup" and "cpu" in opts]
    v2 = [mp for mp, fstype, _ in mounts if fstype == "cgroup2"]
    try:
        if v1:
            top = Path(v1[0])
            path = top / name
            path.mkdir()
            _write(path / "cpu.cfs_period_us", "100000")
            _write(path / "cpu.cfs_quota_us", "50000")
            return LimitedCgroup(path, "cgroup v1", top)
        for mp in v2:
            top = Path(mp)
            if "cpu" not in (top / "cgroup.controllers").read_text().split():
                continue
            if "cpu" not in (top / "cgroup.subtree_control").read_text().split():
                _write(top / "cgroup.subtree_control", "+cpu")
            path = top / name
            path.mkdir()
            _write(path / "cpu.max", "50000 100000")
            return LimitedCgroup(path, "cgroup v2", top)
    except OSError as exc:
        pytest.skip(f"cannot create a CPU-limited cgroup here: {exc}")
    pytest.skip(f"no cgroup hierarchy with the cpu controller is mounted (mounts: {mounts})")


def _remove(cgroup: LimitedCgroup) -> None:
    procs = cgroup.path / "cgroup.procs"
    deadline = time.monotonic() + 10
    while cgroup.path.exists():
        try:
            for pid in procs.read_text().split():  # anything still inside goes back to the top
                try:
                    _write(cgroup.top / "cgroup.procs", pid)
                except OSError:
                    pass
            cgroup.path.rmdir()
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture(scope="module")
def limited():
    cgroup = _make_limited_cgroup()
    try:
        yield cgroup
    finally:
        _remove(cgroup)


@pytest.fixture
def sleeper(limited):
    """Start `sleep 60` with the given environment inside the limited cgroup; kill it afterwards."""
    started: list[subprocess.Popen] = []

    def start(env: dict[str, str]) -> int:
        proc = subprocess.Popen(["sleep", "60"], env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env})
        started.append(proc)
        _write(limited.path / "cgroup.procs", str(proc.pid))
        return proc.pid

    try:
        yield start
    finally:
        for proc in started:
            proc.kill()
            proc.wait(timeout=10)


def judge_pid(pid: int):
    return run_one(Plan(cpu_threads.CHECK, dict(cpu_threads.CHECK.config), 10.0), Session(target=Target(pid)))


def test_unset_variables_warn_inside_half_a_cpu(limited, sleeper):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 or more CPUs in the affinity mask for unset variables to oversubscribe 0.5 CPU")
    pid = sleeper({})
    r = judge_pid(pid)
    assert r.status is Status.WARN, r.summary
    assert r.facts["effective_cpus"] == 0.5
    assert r.facts["quota_source"] == limited.version
    assert r.facts["quota_path"].startswith(str(limited.path))
    assert "OMP_NUM_THREADS" in r.summary and "unset" in r.summary
    assert r.remediation == "export " + " ".join(f"{n}=1" for n in THREAD_VARS)


def test_oversubscribed_omp_warns(limited, sleeper):
    pid = sleeper({**dict.fromkeys(THREAD_VARS, "1"), "OMP_NUM_THREADS": "8"})
    r = judge_pid(pid)
    assert r.status is Status.WARN, r.summary
    assert "oversubscribed: OMP_NUM_THREADS=8" in r.summary and "0.5 effective CPUs (cgroup quota" in r.summary
    assert r.facts["effective_cpus"] == 0.5


def test_fitting_values_pass(limited, sleeper):
    pid = sleeper(dict.fromkeys(THREAD_VARS, "1"))
    r = judge_pid(pid)
    assert r.status is Status.OK, r.summary
    assert r.facts["effective_cpus"] == 0.5 and r.facts["recommended_threads"] == 1


def test_the_cli_sees_the_quota_of_the_pid(limited, sleeper, tmp_path):
    pid = sleeper({"OMP_NUM_THREADS": "8"})
    cli = subprocess.run([sys.executable, "-m", "envdoctor", "check", "--only", "cpu.threads", "--pid", str(pid),
                          "--format", "json", "--fail-on", "warn"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1, cli.stderr
    (result,) = json.loads(cli.stdout)["results"]
    assert result["status"] == "warn" and result["facts"]["quota_cpus"] == 0.5
    # envdoctor itself is not in that cgroup: its own view must not carry the quota
    own = run_one(Plan(cpu_threads.CHECK, dict(cpu_threads.CHECK.config), 10.0), Session(env_override={}))
    assert own.facts["quota_path"] != result["facts"]["quota_path"]


def test_a_reader_in_its_own_cgroup_namespace_still_finds_the_targets_quota(limited, sleeper, tmp_path):
    """Helper-96: seen from another cgroup namespace (a DaemonSet's on cgroup v2, `unshare -C`
    here), the target's path and the mount's root both begin with `..`; the path was given
    up, and the check said ok on the affinity alone, quota_source "none"."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) from util-linux")
    pid = sleeper({"OMP_NUM_THREADS": "8"})
    reader = limited.top / f"envdoctor-reader-{os.getpid()}"
    reader.mkdir()
    try:
        # the reader joins a sibling cgroup, then takes a cgroup namespace rooted there
        script = (f"echo $$ > {reader}/cgroup.procs && exec unshare -C {sys.executable} -m envdoctor check "
                  f"--only cpu.threads --pid {pid} --format json")
        out = subprocess.run(["sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        seen = subprocess.run(["sh", "-c", f"echo $$ > {reader}/cgroup.procs && exec unshare -C cat /proc/{pid}/cgroup"],
                              capture_output=True, text=True, timeout=30).stdout
    finally:
        reader.rmdir()  # both shells have ended: it is empty
    if "/.." not in seen:
        pytest.skip(f"the cgroup namespace did not show the target outside it here: {seen!r}")
    (result,) = json.loads(out.stdout)["results"]
    assert result["status"] == "warn" and result["facts"]["quota_cpus"] == 0.5, result


def test_serves_node_row_weighs_the_nodes_cpus_not_the_daemons_own_quota(limited, tmp_path):
    """helper-115: the systemd unit gives serve CPUQuota=20%, and the node row (read from the
    daemon's own process) warned "0.2 effective CPUs" on every node, and the alert fired. In
    the limited cgroup, `check` of itself carries the quota; serve's node row does not: it
    weighs PID 1's CPUs, the node's init."""
    def inside(*command: str) -> subprocess.CompletedProcess:
        enter = f"echo $$ > {limited.path / 'cgroup.procs'} && exec \"$@\""
        return subprocess.run(["sh", "-c", enter, "sh", sys.executable, "-m", "envdoctor", *command], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)

    own = inside("check", "--only", "cpu.threads", "-f", "json")
    (row,) = json.loads(own.stdout)["results"]
    assert row["facts"]["quota_cpus"] == 0.5, row  # the cgroup holds what runs in it
    init_cpus = effective_cpus(Roots(), 1).cpus  # PID 1 is outside the limited cgroup
    served = inside("serve", "--once")
    assert served.returncode == 0, served.stderr[-2000:]
    effective = [line for line in served.stdout.splitlines() if line.startswith('envdoctor_cpu_effective{target="node"}')]
    assert effective and float(effective[0].split()[-1]) == init_cpus != 0.5, (effective, init_cpus)
    assert 'envdoctor_cpu_quota_cpus{target="node"} 0.5' not in served.stdout
