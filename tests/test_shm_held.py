"""envdoctor.shm_held on real processes: a parent and its child holding /dev/shm files
that are already unlinked, as torch's DataLoader workers and the training process do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envdoctor.shm_held import Held, held_bytes, process_tree

from helpers import cli

MIB = 1 << 20
PROC = Path("/proc")

# Parent: one 3 MiB unlinked file, shared with its child (counted once); the child adds a
# 2 MiB one of its own. Like a batch handed from a worker to the training process. The
# parent also keeps a 4 MiB *named* file open: a dataset other jobs may share, no room of its own.
HOLDER = textwrap.dedent("""
    import os, sys, time
    def made(name, size, unlink=True):
        path = f"/dev/shm/{name}-{os.getpid()}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        if unlink:
            os.unlink(path)
        os.write(fd, b"x" * size)
        return fd
    shared = made("envdoctor-test-batch", 3 << 20)
    named = made("envdoctor-test-dataset", 4 << 20, unlink=False)
    r, w = os.pipe()
    if os.fork() == 0:
        own = made("envdoctor-test-worker", 2 << 20)
        os.write(w, b"1")
        time.sleep(60)
        os._exit(0)
    os.read(r, 1)  # the child's file is written
    print(f"/dev/shm/envdoctor-test-dataset-{os.getpid()}", flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def holder():
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("needs a writable /dev/shm")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    named = proc.stdout.readline().strip()
    assert named.startswith("/dev/shm/")
    yield proc
    for pid in reversed(process_tree(PROC, proc.pid)[0]):
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    proc.wait(timeout=30)
    os.unlink(named)


def test_a_process_tree_holds_its_unlinked_files_counted_once(holder):
    # 3 MiB shared by both, 2 MiB the child's; the named 4 MiB file is not its room
    assert held_bytes(PROC, holder.pid, os.stat("/dev/shm").st_dev) == Held(5 * MIB, True)


def test_another_device_is_not_counted(holder):
    assert held_bytes(PROC, holder.pid, os.stat("/proc").st_dev) == Held(0, True)


def test_a_process_that_is_gone_is_unknown_not_zero():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    assert held_bytes(PROC, proc.pid, os.stat("/dev/shm").st_dev) is None


def test_a_walk_past_its_bounds_says_it_is_incomplete(holder, monkeypatch):
    from envdoctor import shm_held

    monkeypatch.setattr(shm_held, "MAX_TREE", 1)  # the parent only: the child's 2 MiB is not read
    assert held_bytes(PROC, holder.pid, os.stat("/dev/shm").st_dev) == Held(3 * MIB, False)
    monkeypatch.setattr(shm_held, "MAX_TREE", 256)
    monkeypatch.setattr(shm_held, "MAX_DESCRIPTORS", 2)
    assert held_bytes(PROC, holder.pid, os.stat("/dev/shm").st_dev).complete is False


def test_shm_size_of_a_running_job_counts_its_own_files_as_its_room(holder):
    """Through `check --pid`, when free space is short of what the job wants (here a floor
    of the whole /dev/shm, which the job's own files keep it from having free): its own
    unlinked files are read into the facts, and they are room for it."""
    st = os.statvfs("/dev/shm")
    floor = str(st.f_blocks * st.f_frsize)
    out = cli("check", "--pid", str(holder.pid), "--only", "shm.size", "-f", "json", timeout=60,
              env={**os.environ, "ENVDOCTOR_CHECK__SHM_SIZE__MIN_BYTES": floor, "ENVDOCTOR_CHECK__SHM_SIZE__RECOMMENDED_BYTES": floor})
    row = json.loads(out.stdout)["results"][0]
    assert row["facts"]["own_bytes"] == 5 * MIB and row["facts"]["own_complete"] is True, row
