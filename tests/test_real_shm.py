"""shm.size against real tmpfs mounts in private mount namespaces (root only).

Ground truth: a real torch DataLoader with workers, moving 32 MiB batches, is run
in the same namespace as envdoctor. On a 64 MiB /dev/shm the check must fail and
the DataLoader must die with PyTorch's shared-memory error; on a 2 GiB /dev/shm
both must pass. A process living in such a namespace, examined from outside with
--pid, must be judged by its own /dev/shm, not envdoctor's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import other_users_sleeper, unprivileged_envdoctor

from envdoctor.checks import shm_size
from envdoctor.context import Session, Target
from envdoctor.model import Status
from envdoctor.runner import Plan, run_one

pytestmark = pytest.mark.real

MIB = 1024**2
# 2 workers x prefetch_factor 2 + 1 batch in use = 5 batches of 32 MiB = 160 MiB in /dev/shm
LOADER = """
import torch
from torch.utils.data import DataLoader, Dataset

class Samples(Dataset):
    def __len__(self):
        return 48
    def __getitem__(self, i):
        return torch.ones(4 * 1024 * 1024)  # 16 MiB of float32

n = 0
for batch in DataLoader(Samples(), batch_size=2, num_workers=2, prefetch_factor=2):
    n += 1
print("LOADER DONE", n, flush=True)
"""
CONFIG = """
[check."shm.size"]
num_workers = 2
batch_bytes = "32MiB"
prefetch_factor = 2
"""
SHM_ERROR = re.compile(r"shared memory|\bshm\b|bus error|no space left on device", re.IGNORECASE)


def _namespace_or_skip() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs in a private mount namespace")
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) from util-linux")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount --make-rprivate / && mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a new mount namespace here: {probe.stderr.strip()}")


def _run_in_namespace(size: str, workdir: Path, mount: str = "", then: str = "",
                      ) -> tuple[subprocess.CompletedProcess, dict, subprocess.CompletedProcess]:
    """In one private mount namespace with a `size` tmpfs on /dev/shm: envdoctor's report, then the DataLoader.
    `mount` replaces the tmpfs mount command; `then` runs after it (filling it, say)."""
    (workdir / "envdoctor.toml").write_text(CONFIG)
    (workdir / "loader.py").write_text(LOADER)
    py = sys.executable
    mount = mount or "mount -t tmpfs -o size=$SHM_SIZE tmpfs /dev/shm"
    script = (
        f"mount --make-rprivate / && {mount} || exit 97; {then or 'true'}; "
        f"{py} -m envdoctor check --only shm.size --format json --config envdoctor.toml > report.json 2> report.err; "
        "echo $? > report.rc; "
        f"{py} loader.py > loader.out 2>&1; echo $? > loader.rc"
    )
    env = {**os.environ, "SHM_SIZE": size}
    outer = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=workdir, env=env, capture_output=True, text=True, timeout=240)
    assert outer.returncode != 97, f"mount failed: {outer.stderr}"
    report_rc = int((workdir / "report.rc").read_text())
    report = json.loads((workdir / "report.json").read_text() or "{}")
    loader = subprocess.CompletedProcess([], int((workdir / "loader.rc").read_text()), (workdir / "loader.out").read_text(), "")
    assert report, f"no report: {(workdir / 'report.err').read_text()}"
    return subprocess.CompletedProcess([], report_rc, "", (workdir / "report.err").read_text()), report, loader


def _shm_result(report: dict) -> dict:
    (result,) = [r for r in report["results"] if r["check"] == "shm.size"]
    return result


def test_docker_default_64m_fails_and_the_dataloader_dies(tmp_path):
    _namespace_or_skip()
    run, report, loader = _run_in_namespace("64m", tmp_path)
    result = _shm_result(report)
    assert result["status"] == "fail", result
    assert run.returncode == 1  # fail is at the default --fail-on level
    assert result["facts"]["size_bytes"] == 64 * MIB
    assert result["facts"]["need_bytes"] == 160 * MIB
    assert "Docker's default" in result["summary"]
    assert "--shm-size=" in result["remediation"] and "medium: Memory" in result["remediation"]
    # the ground truth the check predicted
    assert loader.returncode != 0, loader.stdout
    assert "LOADER DONE" not in loader.stdout
    assert SHM_ERROR.search(loader.stdout), loader.stdout[-2000:]


def test_sized_shm_passes_and_the_dataloader_completes(tmp_path):
    _namespace_or_skip()
    run, report, loader = _run_in_namespace("2g", tmp_path)
    result = _shm_result(report)
    assert result["status"] == "ok", result
    assert run.returncode == 0
    assert result["facts"]["size_bytes"] == 2048 * MIB
    assert loader.returncode == 0, loader.stdout[-2000:]
    assert "LOADER DONE 24" in loader.stdout


# helper-92: each of these was ok (or a skip, exit 0) while the DataLoader died
UNUSABLE = {
    "read-only": ("mount -t tmpfs -o size=2g,ro tmpfs /dev/shm", "", "mounted read-only", "read-only file system"),
    "no inodes left": ("mount -t tmpfs -o size=2g,nr_inodes=3 tmpfs /dev/shm", "", "can hold only 2 more files",
                       "no space left on device"),
    "missing": ("mount -t tmpfs -o size=1m tmpfs /dev && mknod -m 666 /dev/null c 1 3 && mknod -m 666 /dev/zero c 1 5 "
                "&& mknod -m 666 /dev/urandom c 1 9 && mknod -m 666 /dev/random c 1 8", "", "does not exist",
                "no such file or directory"),
    "fewer inodes than batches in flight": ("mount -t tmpfs -o size=2g,nr_inodes=5 tmpfs /dev/shm", "",
                                            "can hold only 4 more files", "no space left on device|shared memory"),
}


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_an_unusable_shm_fails_and_the_dataloader_dies(tmp_path, case):
    _namespace_or_skip()
    mount, then, said, died = UNUSABLE[case]
    run, report, loader = _run_in_namespace("", tmp_path, mount=mount, then=then)
    result = _shm_result(report)
    assert result["status"] == "fail" and said in result["summary"], result
    assert run.returncode == 1
    # the ground truth the check predicted
    assert loader.returncode != 0 and "LOADER DONE" not in loader.stdout, loader.stdout[-1000:]
    assert re.search(died, loader.stdout, re.IGNORECASE), loader.stdout[-2000:]


def test_space_a_leftover_holds_warns_and_the_dataloader_dies(tmp_path):
    """A warn, not a fail (helper-94): the check cannot tell a leftover from a running job's own
    batches on a node's row, and there the job lives. The warn names the leftovers first."""
    _namespace_or_skip()
    run, report, loader = _run_in_namespace("", tmp_path, mount="mount -t tmpfs -o size=512m tmpfs /dev/shm",
                                            then="head -c 500M /dev/zero > /dev/shm/torch_leftover")
    result = _shm_result(report)
    assert result["status"] == "warn" and "held by other processes or leftover segments" in result["summary"], result
    assert result["remediation"].startswith("remove leftover /dev/shm/torch_* files")
    assert loader.returncode != 0 and "LOADER DONE" not in loader.stdout


def test_few_inodes_but_one_a_batch_in_flight_warns_and_this_loader_runs(tmp_path):
    """How many files a job needs is its own (helper-94's loader of several tensors a batch died
    with 19 free; this one, of one, runs): below a file a batch fails, fewer than 1024 warns."""
    _namespace_or_skip()
    run, report, loader = _run_in_namespace("", tmp_path, mount="mount -t tmpfs -o size=2g,nr_inodes=20 tmpfs /dev/shm")
    result = _shm_result(report)
    assert result["status"] == "warn" and "can hold only 19 more files" in result["summary"], result
    assert loader.returncode == 0 and "LOADER DONE 24" in loader.stdout, loader.stdout[-1000:]


def test_the_nodes_row_through_a_read_only_view_of_the_host_is_not_read_only(tmp_path):
    """Helper-94: the DaemonSet reads the host's /dev/shm through its own read-only mount of the
    host (recursiveReadOnly); the node's row failed as if the host's were read-only."""
    _namespace_or_skip()
    view = tmp_path / "host"
    view.mkdir()
    script = (f"mount --make-rprivate / && mount -t tmpfs -o size=2g tmpfs /dev/shm && mount --rbind / {view} && "
              f"mount -o remount,bind,ro {view} && mount -o remount,bind,ro {view}/dev/shm && "
              f"{sys.executable} -m envdoctor check --only shm.size --path.rootfs {view} --format json")
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    (result,) = json.loads(out.stdout)["results"]
    assert "read-only" not in result["summary"] and result["facts"]["read_only"] is None, result


def test_pid_target_is_judged_by_its_own_shm(tmp_path):
    _namespace_or_skip()
    marker = tmp_path / "mounted"
    # 48 MiB: a size neither this machine's nor CI's own /dev/shm has, so the
    # result cannot have come from envdoctor's /dev/shm by accident.
    script = f"mount --make-rprivate / && mount -t tmpfs -o size=48m tmpfs /dev/shm && touch {marker} && exec sleep 60"
    proc = subprocess.Popen(["unshare", "-m", "sh", "-c", script])  # unshare and sh exec: proc.pid is the sleep
    try:
        deadline = time.monotonic() + 20
        while not marker.exists():
            assert proc.poll() is None, "the namespace's shell exited early"
            assert time.monotonic() < deadline, "the tmpfs was not mounted in time"
            time.sleep(0.05)
        assert os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize != 48 * MIB

        result = run_one(Plan(shm_size.CHECK, dict(shm_size.CHECK.config), 10.0), Session(target=Target(proc.pid)))
        assert result.target == f"pid:{proc.pid}"
        assert result.status is Status.FAIL, result.summary
        assert result.facts["size_bytes"] == 48 * MIB
        assert result.facts["path"] == f"/proc/{proc.pid}/root/dev/shm"
        assert result.facts["fstype"] == "tmpfs" and result.facts["own_mount"] is True

        cli = subprocess.run([sys.executable, "-m", "envdoctor", "check", "--only", "shm.size", "--pid", str(proc.pid),
                              "--format", "json"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert cli.returncode == 1, cli.stderr
        cli_result = _shm_result(json.loads(cli.stdout))
        assert cli_result["status"] == "fail" and cli_result["facts"]["size_bytes"] == 48 * MIB
    finally:
        proc.kill()
        proc.wait(timeout=10)

    # once the process is gone, the check skips with a reason instead of breaking
    gone = run_one(Plan(shm_size.CHECK, dict(shm_size.CHECK.config), 10.0), Session(target=Target(proc.pid)))
    assert gone.status is Status.SKIP and str(proc.pid) in gone.summary


def test_another_users_process_is_a_skip_with_the_reason(tmp_path):
    child = other_users_sleeper()  # owned by nobody; envdoctor below keeps uid 0 but has no capabilities
    try:
        proc = unprivileged_envdoctor("check", "--pid", str(child.pid), "--only", "shm.size", "--format", "json",
                                      cwd=tmp_path)
        assert "Traceback" not in proc.stderr, proc.stderr
        result = _shm_result(json.loads(proc.stdout))
        assert result["status"] == "skip", result
        assert "permission denied" in result["summary"] and f"/proc/{child.pid}/root/dev/shm" in result["summary"]
    finally:
        child.kill()
        child.wait()


def _row_in_namespace(script: str) -> dict:
    """shm.size's row from `check --pid` for the process `script` ends as (`exec sleep`), in
    a mount namespace of its own."""
    proc = subprocess.Popen(["unshare", "-m", "sh", "-c", script])  # unshare and sh exec: proc.pid is the sleep
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not os.readlink(f"/proc/{proc.pid}/exe").endswith("sleep"):
            time.sleep(0.05)
        out = subprocess.run([sys.executable, "-m", "envdoctor", "check", "--pid", str(proc.pid), "-f", "json",
                              "--only", "shm.size"], capture_output=True, text=True, timeout=120)
        report = json.loads(out.stdout)
        row = _shm_result(report)
        row["report_system"] = report["system"]  # the header's figures, read apart from the row's
        return row
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("link", ["/dev/realshm", "realshm"])
def test_a_shm_that_is_a_link_is_judged_where_it_leads_in_the_targets_root(tmp_path, link):
    """helper-107: through /proc/N/root the kernel resolves an absolute link from the
    reader's root, so a /dev/shm linking to /dev/realshm (as older images link it to
    /run/shm) was looked for on the host and judged missing. Relative links were right."""
    _namespace_or_skip()
    script = ("mount --make-rprivate / && mount -t tmpfs -o size=16m tmpfs /dev && mkdir /dev/realshm && "
              f"ln -s {link} /dev/shm && exec sleep 120")
    row = _row_in_namespace(script)
    facts = row["facts"]
    assert facts["size_bytes"] == 16 * 1024 * 1024, row  # the /dev tmpfs, where the link leads
    assert facts["fstype"] == "tmpfs" and facts["own_mount"] is False, row
    assert "does not exist" not in row["summary"], row
    # the report's system facts (its header) read the same /dev/shm: they took the host's
    # when the link was absolute (helper-120)
    assert row["report_system"]["shm_size_bytes"] == 16 * 1024 * 1024, row["report_system"]


def test_a_shm_directory_under_a_tmpfs_mounted_over_dev_is_not_a_mount_of_its_own(tmp_path):
    """The host's /dev/shm mount stays in a private namespace's table after a tmpfs is
    mounted over /dev, hidden under it; the deepest mount point alone took it, and said
    /dev/shm was a mount of its own when it is a plain directory on the new /dev."""
    _namespace_or_skip()
    script = "mount --make-rprivate / && mount -t tmpfs -o size=16m tmpfs /dev && mkdir /dev/shm && exec sleep 120"
    row = _row_in_namespace(script)
    facts = row["facts"]
    assert facts["size_bytes"] == 16 * 1024 * 1024 and facts["fstype"] == "tmpfs", facts
    assert facts["own_mount"] is False, facts


def test_a_mount_over_the_root_is_not_where_the_processes_shm_is(tmp_path):
    """helper-108: `mount --bind X /` stacks X on the process's root, but its paths start
    at its root and never reach X: its /dev/shm is still the tmpfs it mounted. The mount
    walk climbed onto X and judged an ext4 directory there."""
    _namespace_or_skip()
    (tmp_path / "over" / "dev" / "shm").mkdir(parents=True)
    script = (f"mount --make-rprivate / && mount -t tmpfs -o size=16m tmpfs /dev/shm && "
              f"mount --bind {tmp_path / 'over'} / && exec sleep 120")
    row = _row_in_namespace(script)
    facts = row["facts"]
    assert facts["size_bytes"] == 16 * 1024 * 1024, facts
    assert facts["fstype"] == "tmpfs" and facts["own_mount"] is True, facts


def test_a_shm_link_that_loops_is_no_usable_shm(tmp_path):
    """helper-108: a /dev/shm that links to itself was a skip ("cannot examine"); the
    job's own shm_open fails there, as where /dev/shm is missing: a fail."""
    _namespace_or_skip()
    script = ("mount --make-rprivate / && mount -t tmpfs -o size=16m tmpfs /dev && ln -s /dev/shm /dev/shm && "
              "exec sleep 120")
    row = _row_in_namespace(script)
    assert row["status"] == "fail" and "loop of symbolic links" in row["summary"], row
