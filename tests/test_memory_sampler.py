"""memsample over fixture trees (cgroup v1 and v2, a limit on a parent level), NVML through
the fake library (per-process memory, None in a container, MIG), the attached document's
allocator figures, pid reuse, and the bounded history."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from fake_pynvml import GIB, FakeDevice, FakeNvml

from envdoctor import nvml as nvml_module
from envdoctor.memsample import MemoryHistory, ProcessGone, Sample, Sampler, sample_window
from envdoctor.paths import Roots

MIB = 1024**2
PID = 4242


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _stat(start: int) -> str:
    fields = ["S"] + ["0"] * 18 + [str(start)] + ["0"] * 20
    return f"{PID} (python train.py) " + " ".join(fields) + "\n"


def make_tree(tmp_path: Path, version: str = "v1", rss_kib: int = 102400, start: int = 777) -> Roots:
    proc, sys_ = tmp_path / "proc", tmp_path / "sys"
    _write(proc / str(PID) / "status", f"Name:\tpython\nNSpid:\t{PID}\t12\nUid:\t1000\t1000\t1000\t1000\nVmRSS:\t{rss_kib} kB\n")
    _write(proc / str(PID) / "stat", _stat(start))
    _write(proc / "meminfo", "MemTotal:       16384000 kB\nMemFree:  1 kB\nMemAvailable:    8192000 kB\n")
    (proc / str(PID) / "root" / "dev" / "shm").mkdir(parents=True)
    if version == "v1":
        _write(proc / str(PID) / "cgroup", "4:memory:/docker/abc\n1:cpu:/docker/abc\n0::/\n")
        _write(proc / "self" / "mountinfo",
               "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n")
        top = sys_ / "fs" / "cgroup" / "memory"
        _write(top / "docker" / "abc" / "memory.usage_in_bytes", str(300 * MIB))
        _write(top / "docker" / "abc" / "memory.limit_in_bytes", "9223372036854771712")
        _write(top / "docker" / "abc" / "memory.stat", f"cache 0\ntotal_inactive_file {100 * MIB}\n")
        _write(top / "docker" / "memory.usage_in_bytes", str(400 * MIB))
        _write(top / "docker" / "memory.limit_in_bytes", str(512 * MIB))  # the parent's limit binds
        _write(top / "docker" / "memory.stat", f"total_inactive_file {100 * MIB}\n")
    else:
        _write(proc / str(PID) / "cgroup", "0::/kubepods/pod1\n")
        _write(proc / "self" / "mountinfo", "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n")
        top = sys_ / "fs" / "cgroup"
        _write(top / "kubepods" / "pod1" / "memory.current", str(300 * MIB))
        _write(top / "kubepods" / "pod1" / "memory.max", str(1024 * MIB))
        _write(top / "kubepods" / "pod1" / "memory.stat", f"anon 1\ninactive_file {50 * MIB}\n")
        _write(top / "kubepods" / "memory.current", str(300 * MIB))
        _write(top / "kubepods" / "memory.max", "max")
    return Roots(procfs=proc, sysfs=sys_, rootfs=tmp_path / "root")


def test_v1_working_set_and_the_tightest_level(tmp_path):
    roots = make_tree(tmp_path, "v1")
    s = Sampler(roots, PID).sample()
    assert s.values["rss"] == 100 * MIB
    assert s.values["cgroup"] == 200 * MIB  # usage less inactive file cache
    limit = s.limits["cgroup"]
    assert limit.limit == 512 * MIB and limit.headroom == 512 * MIB - 300 * MIB  # the parent's level
    assert "docker/memory.limit_in_bytes" in limit.name
    assert s.limits["rss"] == limit  # tighter than the host's 7.8 GiB available
    assert "shm" in s.values and s.limits["shm"].name == "/dev/shm"


def test_v2_memory_current_and_max(tmp_path):
    roots = make_tree(tmp_path, "v2")
    s = Sampler(roots, PID).sample()
    assert s.values["cgroup"] == 250 * MIB
    assert s.limits["cgroup"].limit == 1024 * MIB and s.limits["cgroup"].headroom == 774 * MIB


def test_v2_memory_high_below_max_is_the_bound_named_as_throttling(tmp_path):
    """Helper-96: a job in a cgroup whose memory.high is below memory.max slows to a crawl at
    memory.high (the kernel throttles and reclaims) long before memory.max would kill it;
    the time to the first bound was computed against the second."""
    roots = make_tree(tmp_path, "v2")
    pod = roots.sysfs / "fs" / "cgroup" / "kubepods" / "pod1"
    _write(pod / "memory.high", str(600 * MIB))
    limit = Sampler(roots, PID).sample().limits["cgroup"]
    assert limit.limit == 600 * MIB and limit.headroom == 350 * MIB
    assert "pod1/memory.high" in limit.name and limit.throttles
    assert limit.then.limit == 1024 * MIB and "pod1/memory.max" in limit.then.name  # what kills it, beyond
    _write(pod / "memory.max", str(16 * 1024 * MIB))  # far above the host's 7.8 GiB available (helper-101)
    limit = Sampler(roots, PID).sample().limits["cgroup"]
    assert limit.throttles and limit.then.name.startswith("host memory")  # the host runs out before memory.max
    _write(pod / "memory.max", str(1024 * MIB))
    _write(pod / "memory.high", "max")  # the default: no throttling bound, memory.max again
    limit = Sampler(roots, PID).sample().limits["cgroup"]
    assert limit.limit == 1024 * MIB and "pod1/memory.max" in limit.name
    _write(pod / "memory.high", str(2048 * MIB))  # above memory.max: max comes first
    assert Sampler(roots, PID).sample().limits["cgroup"].limit == 1024 * MIB


def test_v2_a_cgroup_without_memory_files_is_held_by_its_parents_limit(tmp_path):
    """Helper-96: a level whose parent does not enable memory in cgroup.subtree_control has no
    memory files; its parent's memory.max still holds it, and the limit was dropped."""
    roots = make_tree(tmp_path, "v2")
    top = roots.sysfs / "fs" / "cgroup"
    _write(roots.procfs / str(PID) / "cgroup", "0::/kubepods/pod1/step\n")
    (top / "kubepods" / "pod1" / "step").mkdir()
    s = Sampler(roots, PID).sample()
    assert s.limits["cgroup"].limit == 1024 * MIB and "pod1/memory.max" in s.limits["cgroup"].name
    assert any("accounted from" in note for note in s.notes), s.notes


def test_no_cgroup_limit_falls_back_to_host_memory(tmp_path):
    roots = make_tree(tmp_path, "v1")
    (roots.sysfs / "fs/cgroup/memory/docker/memory.limit_in_bytes").write_text("9223372036854771712")
    s = Sampler(roots, PID).sample()
    assert s.limits["rss"].name.startswith("host memory")
    assert s.limits["rss"].headroom == 8192000 * 1024


def test_pid_reuse_and_exit_are_process_gone(tmp_path):
    roots = make_tree(tmp_path)
    sampler = Sampler(roots, PID)
    sampler.sample()
    _write(roots.procfs / str(PID) / "stat", _stat(999))  # another process under the same pid
    with pytest.raises(ProcessGone, match="another process"):
        sampler.sample()
    (roots.procfs / str(PID) / "status").unlink()
    with pytest.raises(ProcessGone):
        sampler.sample()


def _nvml(devices):
    return nvml_module.connect(lib=FakeNvml(devices=devices), timeout=2.0)


def test_gpu_memory_per_process_from_nvml(tmp_path):
    roots = make_tree(tmp_path)
    nv = _nvml([FakeDevice(memory_total=80 * GIB, memory_used=30 * GIB, processes=[(PID, 3 * GIB), (1, GIB)]),
                FakeDevice(processes=[(99, GIB)])])
    s = Sampler(roots, PID, nv).sample()
    assert s.values["gpu0"] == 3 * GIB
    assert "gpu1" not in s.values  # not on that GPU: absent, not 0
    assert s.limits["gpu0"].limit == 80 * GIB and s.limits["gpu0"].headroom == 50 * GIB


def test_gpu_memory_not_available_is_absent_never_zero(tmp_path):
    roots = make_tree(tmp_path)
    nv = _nvml([FakeDevice(processes=[(PID, None)]), FakeDevice(mig=True, processes=[(PID, GIB)])])
    s = Sampler(roots, PID, nv).sample()
    assert not [k for k in s.values if k.startswith("gpu")]
    assert any("not available" in n for n in s.notes)
    assert any("MIG" in n for n in s.notes)


def test_attached_allocator_figures(tmp_path):
    roots = make_tree(tmp_path)
    doc = {"cuda": {"initialized": True, "devices": {"0": {
        "allocated_bytes": 2 * GIB, "reserved_bytes": 6 * GIB, "inactive_split_bytes": GIB,
        "num_alloc_retries": 3, "total_bytes": 16 * GIB, "free_bytes": 9 * GIB}, "x": "junk"}}}
    s = Sampler(roots, PID, live=lambda: doc).sample()
    assert s.values["cuda0_reserved"] == 6 * GIB and s.values["cuda0_allocated"] == 2 * GIB
    assert s.limits["cuda0_reserved"].headroom == 9 * GIB
    assert s.limits["cuda0_allocated"].headroom == 13 * GIB  # cached blocks are reused first
    assert s.counters["cuda0_num_alloc_retries"] == 3
    bad = Sampler(roots, PID, live=lambda: {"cuda": ["not", "a", "dict"]}).sample()
    assert not [k for k in bad.values if k.startswith("cuda")]


def test_history_is_bounded_per_target_and_in_targets():
    history = MemoryHistory(maxlen=10, max_targets=3)
    for i in range(100):
        history.add("pid:1", Sample(float(i), {"rss": float(i)}))
    ts, ys = history.series("pid:1")["rss"]
    assert len(ts) == 10 and ys[-1] == 99.0
    for label in ("pid:2", "pid:3", "pid:4"):
        history.add(label, Sample(200.0, {"rss": 1.0}))
    assert len(history.labels()) == 3 and "pid:1" not in history.labels()  # the stalest goes
    history.prune(["pid:3"])
    assert history.labels() == ["pid:3"]


def test_history_sample_drops_exited_targets(tmp_path):
    roots = make_tree(tmp_path)
    history = MemoryHistory()
    assert history.sample([(f"pid:{PID}", PID), ("pid:999999", 999999)], roots) == {
        "pid:999999": "process 999999 exited"}
    assert history.latest(f"pid:{PID}").values["rss"] == 100 * MIB


def test_a_kept_sampler_reads_through_each_runs_nvml_and_live_view(tmp_path):
    """A process's sampler lives as long as the process; NVML and the live document are
    each run's. Kept from the run that first saw the process, a GPU that NVML could not
    reach then was never sampled, and every old facade read NVML again each run."""
    roots = make_tree(tmp_path)
    history = MemoryHistory()
    label = f"pid:{PID}"
    history.sample([(label, PID)], roots, nvml=None, live=lambda pid: None)  # NVML down on the first run
    assert not [k for k in history.latest(label).values if k.startswith("gpu")]
    nv = _nvml([FakeDevice(memory_total=80 * GIB, processes=[(PID, 3 * GIB)])])
    doc = {"cuda": {"initialized": True, "devices": {"0": {"allocated_bytes": GIB, "reserved_bytes": 2 * GIB}}}}
    history.sample([(label, PID)], roots, nvml=nv, live=lambda pid: doc)
    latest = history.latest(label).values
    assert latest["gpu0"] == 3 * GIB and latest["cuda0_reserved"] == 2 * GIB


def test_sample_window_on_this_process_reports_progress():
    seen = []
    history = MemoryHistory()
    stopped = sample_window(Sampler(), 0.3, 0.1, history, "self", lambda done, total: seen.append((done, total)))
    assert stopped is None
    assert len(history.series("self")["rss"][0]) >= 3
    assert seen[-1][1] == 0.3 and seen[-1][0] >= 0.3
    assert history.latest("self").values["rss"] > 0 and os.getpid() > 0


def test_history_keeps_samples_compactly_across_changes_of_names():
    """serve keeps 720 samples of every process: rows of 8-byte numbers, not an object per
    sample (a deque of (names, array) points was ~9 MiB for 64 processes)."""
    import tracemalloc

    history = MemoryHistory(maxlen=5)
    for i in range(4):
        history.add("pid:1", Sample(float(i), {"rss": 10.0 + i}))
    for i in range(4, 8):  # a GPU appears: a new column from here on
        history.add("pid:1", Sample(float(i), {"rss": 10.0 + i, "cuda0_reserved": 100.0 + i}))
    series = history.series("pid:1")
    assert list(series["rss"][0]) == [3.0, 4.0, 5.0, 6.0, 7.0] and list(series["rss"][1]) == [13.0, 14.0, 15.0, 16.0, 17.0]
    assert list(series["cuda0_reserved"][0]) == [4.0, 5.0, 6.0, 7.0]
    history.add("pid:1", Sample(8.0, {"rss": 18.0}))  # the older segment empties and goes
    assert list(history.series("pid:1")["rss"][0]) == [4.0, 5.0, 6.0, 7.0, 8.0]
    before = series["rss"][1][0]
    history.add("pid:1", Sample(9.0, {"rss": 19.0}))
    assert series["rss"][1][0] == before  # what series() handed out is a copy

    tracemalloc.start()
    try:
        big = MemoryHistory(maxlen=720)
        base = tracemalloc.get_traced_memory()[0]
        for i in range(720):
            big.add("pid:2", Sample(float(i), {"rss": 1.0, "shm": 2.0}, counters={"x": 3.0}))
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert held < 720 * 4 * 8 * 2, held  # 4 numbers a row; an object per sample was ~140 bytes each


def test_processes_of_one_cgroup_share_its_reading_within_a_run(tmp_path):
    """serve samples every process each run; those of one container share their cgroup's
    memory files (three levels of three files) and the host's meminfo, so a run's node
    memo (HostSession.fact) reads them once, and the next run reads them afresh."""
    from envdoctor.context import HostSession

    roots = make_tree(tmp_path, "v2")
    other = PID + 1
    shutil.copytree(roots.procfs / str(PID), roots.procfs / str(other), symlinks=True)
    usage = roots.sysfs / "fs/cgroup/kubepods/pod1/memory.current"

    run = HostSession(roots=roots)
    first = Sampler(roots, PID).sample(run.fact)
    usage.write_text(str(500 * MIB))  # changes between the two processes' samples of one run
    second = Sampler(roots, other).sample(run.fact)
    assert first.values["cgroup"] == second.values["cgroup"] == 250 * MIB  # read once this run
    assert first.limits["rss"] == second.limits["rss"]
    assert Sampler(roots, other).sample().values["cgroup"] == 450 * MIB  # unshared: read now
    assert Sampler(roots, other).sample(HostSession(roots=roots).fact).values["cgroup"] == 450 * MIB  # next run


def test_serve_keeps_one_shm_series_per_mount_on_one_process_while_it_lives(tmp_path):
    """Helper-42, -44, -50: /dev/shm usage is the mount's, so one writer's growth gave every
    process on the mount the same series, a warning and its own alert. Helper-52: shown on the
    first process sampled in each run, it hopped between processes and left a frozen copy on
    the one it left. MemoryHistory keeps one series per mount, shown on its owner while the
    owner lives, then on the next, series and all; check's own window is unchanged."""
    roots = make_tree(tmp_path, "v2")
    other = PID + 1
    shutil.copytree(roots.procfs / str(PID), roots.procfs / str(other), symlinks=True)
    history = MemoryHistory(maxlen=100)
    for order in ([("a", PID), ("b", other)], [("b", other), ("a", PID)], [("a", PID), ("b", other)]):
        assert history.sample(order, roots) == {}
    assert len(history.series("a")["shm"][1]) == 3 and "shm" not in history.series("b")  # sticky, in any order
    assert "shm" in history.latest("a").limits and "shm" not in history.latest("b").values
    assert "rss" in history.series("b") and "cgroup" in history.series("b")  # only the mount's series moves
    history.prune(["b"])  # the owner exits: the next process on the mount takes the series over, whole
    history.sample([("b", other)], roots)
    assert len(history.series("b")["shm"][1]) == 4 and len(history.series("b")["rss"][1]) == 4
    window = MemoryHistory()
    sample_window(Sampler(roots, other), 0.0, 0.0, window, "b")  # check --window: its own series, as before
    assert "shm" in window.series("b")


def test_an_owner_that_leaves_its_mount_hands_the_series_on_and_shows_nothing_stale(tmp_path):
    """Helper-53: an owner that moved to another mount namespace kept the old mount's series,
    which nobody then appended to or showed; an owner whose /dev/shm could no longer be read
    still showed the mount's last figure and limit through latest()."""
    roots = make_tree(tmp_path, "v2")
    other = PID + 1
    shutil.copytree(roots.procfs / str(PID), roots.procfs / str(other), symlinks=True)
    history = MemoryHistory()
    for _ in range(2):
        history.sample([("a", PID), ("b", other)], roots)
    shm = roots.procfs / str(PID) / "root" / "dev" / "shm"
    shm.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shm.symlink_to("/dev/shm" if os.stat("/dev/shm").st_dev != os.stat(elsewhere).st_dev else "/proc")  # another mount
    history.sample([("a", PID), ("b", other)], roots)
    assert len(history.series("b")["shm"][1]) == 3, history.series("b").keys()  # b took the old mount's series over
    shm.unlink()  # a's /dev/shm is gone: it shows no shm at all, not the last figure
    history.sample([("a", PID), ("b", other)], roots)
    assert "shm" not in history.latest("a").values and "shm" not in history.series("a")
    assert len(history.series("b")["shm"][1]) == 4


def test_a_process_on_another_mount_keeps_its_own_shm_series(tmp_path):
    """A job in its own mount namespace (a pod's /dev/shm) is a mount of its own: its series stays."""
    import subprocess

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to give a process its own /dev/shm")
    child = subprocess.Popen(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=8m tmpfs /dev/shm && echo ready && "
                              "exec sleep 30"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        history = MemoryHistory()  # unshare and sh exec in place: child.pid is the sleeper in its namespace
        assert history.sample([("me", os.getpid()), ("them", child.pid)]) == {}
        assert "shm" in history.series("them") and history.latest("them").limits["shm"].limit == 8 * MIB
        if os.statvfs("/dev/shm").f_blocks:  # the host's mount, when it has a size: mine, on this one
            assert "shm" in history.series("me")
    finally:
        child.kill()
        child.wait()
