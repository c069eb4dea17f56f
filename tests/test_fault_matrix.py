"""Every check, over fixture roots and a --pid target, with each file it reads broken
in each of the ways a real node breaks them: the file blocks on read (a FIFO where
/proc/N/environ should be), vanishes (the process exited mid-run), cannot be read
(permission denied), holds garbage, or is huge. Each run must end, within its bound,
with exactly one row per check: never a hang, never a traceback.

The files are not listed by hand: a clean run under an audit hook records every
file under the fixture roots that envdoctor opens, and each of those is broken in
turn. A check that starts reading a new file is attacked without touching this test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import unprivileged_envdoctor

PID = 4242
TIMEOUT = 2.0  # --timeout of every run
# The bound: --timeout, plus the plug-in import deadline (5 s, not reached here), plus
# interpreter start and output. SLACK is what a loaded 2-core CI machine may add; a hang
# (the fault this catches) overshoots it without limit.
SLACK = 20.0
CHECKS = ("cpu.threads", "cuda.runtime", "cuda.visible_devices", "dist.env", "dist.consistency", "dist.master_port", "memory.cache_growth", "gpu.health", "onnx.opset", "shm.size",
          "torch.cudnn", "torch.pin_memory")

ENVIRON = (b"OMP_NUM_THREADS=4\0MKL_NUM_THREADS=4\0CUDA_VISIBLE_DEVICES=0,1\0WORLD_SIZE=2\0RANK=0\0LOCAL_RANK=0\0"
           b"LOCAL_WORLD_SIZE=2\0MASTER_ADDR=127.0.0.1\0MASTER_PORT=1\0NCCL_SOCKET_IFNAME=eth0\0HOME=/root\0")
MOUNTINFO = ("22 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n"
             "25 22 0:24 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
             "30 1 0:30 / /dev/shm rw,nosuid,nodev shared:5 - tmpfs shm rw,size=65536k\n")


def build_tree(root: Path) -> dict[str, Path]:
    """A node with one training process (pid 4242) under a 2-CPU cgroup v2 quota."""
    procfs, sysfs, rootfs = root / "proc", root / "sys", root / "root"
    files = {
        procfs / str(PID) / "environ": ENVIRON,
        procfs / str(PID) / "cgroup": b"0::/job.slice/train\n",
        procfs / str(PID) / "status": b"Name:\ttrain\nState:\tS (sleeping)\nCpus_allowed_list:\t0-3\n",
        procfs / str(PID) / "stat": f"{PID} (train) S 1 {PID} {PID} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 9 0 1 0 0\n".encode(),
        procfs / str(PID) / "mountinfo": MOUNTINFO.encode(),
        procfs / str(PID) / "cmdline": b"python\0train.py\0",
        procfs / str(PID) / "net" / "dev": (b"Inter-|   Receive\n face |bytes\n    lo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"
                                            b"  eth0: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"),
        procfs / "self" / "mountinfo": MOUNTINFO.encode(),
        procfs / "self" / "cgroup": b"0::/\n",
        procfs / "self" / "status": b"Name:\tenvdoctor\nCpus_allowed_list:\t0-3\n",
        procfs / "meminfo": b"MemTotal:       16384000 kB\nMemAvailable:   8192000 kB\n",
        procfs / "cpuinfo": b"processor\t: 0\nmodel name\t: Fixture CPU\n",
        procfs / "sys" / "kernel" / "osrelease": b"6.1.0-fixture\n",
        sysfs / "fs" / "cgroup" / "job.slice" / "train" / "cpu.max": b"200000 100000\n",
        sysfs / "fs" / "cgroup" / "job.slice" / "cpu.max": b"max 100000\n",
        sysfs / "devices" / "system" / "cpu" / "online": b"0-3\n",
        sysfs / "class" / "net" / "eth0" / "mtu": b"1500\n",
        rootfs / "etc" / "os-release": b'PRETTY_NAME="Fixture Linux"\n',
    }
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (procfs / str(PID) / "root" / "dev" / "shm").mkdir(parents=True)
    (rootfs / "dev" / "shm").mkdir(parents=True)
    return {"procfs": procfs, "sysfs": sysfs, "rootfs": rootfs}


def args(roots: dict[str, Path]) -> list[str]:
    return ["check", "--pid", str(PID), "--format", "json", "--timeout", f"{TIMEOUT:g}",
            "--path.procfs", str(roots["procfs"]), "--path.sysfs", str(roots["sysfs"]), "--path.rootfs", str(roots["rootfs"])]


_RECORDER = """
import atexit, os, sys
seen = set()
def hook(event, a):
    if event == "open" and a and isinstance(a[0], (str, bytes, os.PathLike)):
        seen.add(os.fsdecode(a[0]))
sys.addaudithook(hook)
record = sys.argv[1]
atexit.register(lambda: open(record, "w").write("\\n".join(sorted(seen))))
sys.argv = ["envdoctor"] + sys.argv[2:]
from envdoctor.cli import main
main()
"""


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The clean tree, the files envdoctor reads in it, and the clean run's rows."""
    root = tmp_path_factory.mktemp("fault-matrix")
    roots = build_tree(root / "tree")
    record = root / "opened.txt"
    env = {**os.environ, "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("ENVDOCTOR_CONFIG", None)
    proc = subprocess.run([sys.executable, "-c", _RECORDER, str(record), *args(roots)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=root)
    assert proc.returncode in (0, 1), proc.stderr
    tree = (root / "tree").resolve()
    opened = sorted({Path(p).resolve().relative_to(tree).as_posix() for p in record.read_text().splitlines()
                     if p and Path(p).resolve().is_relative_to(tree) and Path(p).is_file()})
    return root / "tree", opened, _rows(proc.stdout)


def _rows(stdout: str) -> dict[str, dict]:
    report = json.loads(stdout)
    rows: dict[str, dict] = {}
    for r in report["results"]:
        assert r["check"] not in rows, f"two rows for {r['check']}"
        rows[r["check"]] = r
    return rows


def test_the_clean_run_reads_the_target_files_and_judges_them(clean):
    _, opened, rows = clean
    # the target's view really came from the fixture, so breaking these files is meaningful
    for needed in (f"proc/{PID}/environ", f"proc/{PID}/cgroup", f"proc/{PID}/status",
                   "sys/fs/cgroup/job.slice/train/cpu.max"):
        assert needed in opened, f"{needed} was not read: {opened}"
    assert set(rows) == set(CHECKS)
    assert rows["cpu.threads"]["facts"].get("effective_cpus") == 2.0
    assert "OMP_NUM_THREADS" in json.dumps(rows["cpu.threads"])


def _break(path: Path, fault: str) -> None:
    original = path.read_bytes()
    if fault == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif fault == "vanish":
        path.unlink()
    elif fault == "denied":
        path.chmod(0)
    elif fault == "garbage":
        path.write_bytes(b"\xff\xfe\x00((garbage))\x1b[31m\n" + os.urandom(512) + b"\n-1 -1 max max\n\x00=\x00")
    elif fault == "huge":
        block = original or b"x\n"
        path.write_bytes(block * (8 * 1024 * 1024 // len(block) + 1))  # 8 MiB of plausible content
    else:
        raise AssertionError(fault)


FAULTS = ("fifo", "vanish", "denied", "garbage", "huge")


def _run_faulted(clean, tmp_path, relative: str, fault: str):
    source, _, _ = clean
    tree = tmp_path / "tree"
    shutil.copytree(source, tree, symlinks=True)
    target = tree / relative
    _break(target, fault)
    roots = {"procfs": tree / "proc", "sysfs": tree / "sys", "rootfs": tree / "root"}
    env = {"ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
    started = time.monotonic()
    if fault == "denied":
        proc = unprivileged_envdoctor(*args(roots), env=env, timeout=TIMEOUT + SLACK)
    else:
        full = {**os.environ, **env}
        full.pop("ENVDOCTOR_CONFIG", None)
        proc = subprocess.run([sys.executable, "-m", "envdoctor", *args(roots)], capture_output=True, text=True,
                              env=full, timeout=TIMEOUT + SLACK)
    return proc, time.monotonic() - started


@pytest.mark.parametrize("fault", FAULTS)
def test_every_file_every_fault_ends_as_rows(clean, tmp_path, fault):
    """For each file the clean run read, break it this way: one row per check, no traceback,
    exit 0/1, and the run ends (subprocess timeout = --timeout + SLACK)."""
    if fault == "denied" and os.geteuid() != 0:
        pytest.skip("needs root to drop capabilities (root would otherwise bypass the permission)")
    _, opened, clean_rows = clean
    assert opened
    for i, relative in enumerate(opened):
        proc, took = _run_faulted(clean, tmp_path / str(i), relative, fault)
        where = f"{relative} ({fault})"
        assert "Traceback" not in proc.stderr, f"{where}: {proc.stderr[-2000:]}"
        if proc.returncode == 2 and relative.startswith(f"proc/{PID}/") and relative.endswith("stat"):
            continue  # a --pid whose stat is unreadable or garbage may be refused as bad usage, with one line
        assert proc.returncode in (0, 1), f"{where}: rc={proc.returncode} {proc.stderr[-2000:]}"
        rows = _rows(proc.stdout)
        assert set(rows) == set(CHECKS), f"{where}: rows {sorted(rows)}"
        for check, row in rows.items():
            assert row["status"] in ("ok", "warn", "fail", "skip", "error"), f"{where}: {row}"
            assert row["summary"].strip(), f"{where}: {check} has an empty summary"
            if row["status"] == "error":
                assert "the check broke" not in row["summary"] or "ProbeError" in row["summary"], \
                    f"{where}: {check} broke instead of judging: {row['summary']}"
        if fault == "fifo":
            # a file that blocks must not cost more than the one check that read it its row
            assert took < TIMEOUT + SLACK
