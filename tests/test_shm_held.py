"""envdoctor.shm_held on real processes: a parent and its child holding /dev/shm files
that are already unlinked, as torch's DataLoader workers and the training process do."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envdoctor.shm_held import holders, process_tree

MIB = 1 << 20
PROC = Path("/proc")

# Parent: one 3 MiB unlinked file, shared with its child (counted once); the child adds a
# 2 MiB one of its own. Like a batch handed from a worker to the training process.
HOLDER = textwrap.dedent("""
    import os, sys, time
    def unlinked(name, size):
        fd = os.open(f"/dev/shm/{name}-{os.getpid()}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.unlink(f"/dev/shm/{name}-{os.getpid()}")
        os.write(fd, b"x" * size)
        return fd
    shared = unlinked("envdoctor-test-batch", 3 << 20)
    r, w = os.pipe()
    if os.fork() == 0:
        own = unlinked("envdoctor-test-worker", 2 << 20)
        os.write(w, b"1")
        time.sleep(60)
        os._exit(0)
    os.read(r, 1)  # the child's file is written
    print("ready", flush=True)
    sys.stdin.read()
""")


@pytest.fixture
def holder():
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("needs a writable /dev/shm")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    for pid in reversed(process_tree(PROC, proc.pid)):
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    proc.wait(timeout=30)


def test_a_process_tree_holds_its_unlinked_files_counted_once(holder):
    device = os.stat("/dev/shm").st_dev
    table = holders(PROC)
    own, others = table.split(process_tree(PROC, holder.pid), device)
    assert own == 5 * MIB  # 3 MiB shared by both, 2 MiB the child's
    # the child alone holds the shared file and its own; the parent's 3 MiB is no one else's
    child = process_tree(PROC, holder.pid)[1]
    assert table.split([child], device)[0] == 5 * MIB


def test_another_device_is_not_counted(holder):
    assert holders(PROC).split(process_tree(PROC, holder.pid), os.stat("/proc").st_dev) == (0, 0)


def test_a_process_that_is_gone_is_unknown_not_zero():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    assert holders(PROC).split([proc.pid], os.stat("/dev/shm").st_dev) == (None, None)


def test_shm_size_of_a_running_job_counts_its_own_files_as_its_room(holder):
    """Through `check --pid`, when free space is short of what the job wants (here a floor
    of the whole /dev/shm, which the job's own 5 MiB keep it from having free): its own
    files are read into the facts, and they are room for it, not space others hold."""
    import json

    from helpers import cli

    st = os.statvfs("/dev/shm")
    floor = str(st.f_blocks * st.f_frsize)
    out = cli("check", "--pid", str(holder.pid), "--only", "shm.size", "-f", "json", timeout=60,
              env={**os.environ, "ENVDOCTOR_CHECK__SHM_SIZE__MIN_BYTES": floor, "ENVDOCTOR_CHECK__SHM_SIZE__RECOMMENDED_BYTES": floor})
    row = json.loads(out.stdout)["results"][0]
    assert row["facts"]["own_bytes"] == 5 * MIB, row
    if row["facts"]["used_bytes"] == row["facts"]["own_bytes"]:  # nobody else on this /dev/shm
        assert row["status"] == "ok", row


def test_memory_growth_of_a_shared_dev_shm_is_judged_by_who_holds_it(holder):
    """serve's history says /dev/shm (one mount for both) rose 2.9 MiB over the window; the
    holder's tree holds 5 MiB of files open, more than the rise: its own fail. A bystander
    that holds nothing, beside files others hold open, is not judged for it."""
    from envdoctor.checks import memory_cache_growth as mcg
    from envdoctor.context import HostSession, Session, Target
    from envdoctor.memsample import Limit, MemoryHistory, Sample
    from envdoctor.runner import Plan, run_one

    bystander = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        history = MemoryHistory()
        for pid in (holder.pid, bystander.pid):
            for i in range(30):
                history.add(f"pid:{pid}", Sample(float(i), {"shm": MIB // 10 * i},
                                                 {"shm": Limit(64 * MIB, 10 * MIB, "/dev/shm size")}))
        host = HostSession()
        host.fact(mcg.HISTORY_FACT, lambda: history)
        plan = Plan(mcg.CHECK, dict(mcg.CHECK.config, min_rise_bytes=MIB), 30.0)
        r = run_one(plan, Session(target=Target(holder.pid), host=host))
        assert r.status.value == "fail" and r.facts["shm_own_bytes"] == 5 * MIB, r.summary
        r = run_one(plan, Session(target=Target(bystander.pid), host=host))
        assert r.status.value == "ok" and "in files other processes hold open" in r.summary, r.summary
        assert r.facts["shm_own_bytes"] == 0 and r.facts["shm_others_bytes"] >= 5 * MIB
    finally:
        bystander.communicate(b"", timeout=30)
