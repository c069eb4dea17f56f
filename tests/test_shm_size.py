"""shm.size: the judge on facts, the gatherer over fixture trees (statvfs is faked
where a fixture cannot carry a file-system size), and the size parser its config uses."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envdoctor.checks import shm_size
from envdoctor.checks.shm_size import ShmFacts, judge
from envdoctor.context import Roots, Session, Target
from envdoctor.errors import ParseError
from envdoctor.model import Status
from envdoctor.runner import Plan, run_one
from envdoctor.units import parse_size

FIXTURES = Path(__file__).parent / "fixtures"
MIB = 1024**2
GIB = 1024**3
DEFAULTS = dict(shm_size.CHECK.config)


def shm(size, free=None, fstype="tmpfs"):
    return ShmFacts("/dev/shm", size, size if free is None else free, fstype, "/dev/shm")


def loader(workers, batch, prefetch=2, **more):
    return {**DEFAULTS, "num_workers": workers, "batch_bytes": batch, "prefetch_factor": prefetch, **more}


def fake_statvfs(size, free):
    block = 4096
    return lambda path: os.statvfs_result((block, block, size // block, free // block, free // block, 0, 0, 0, 0, 255))


def run_fixture(name, config=None, pid=None):
    base = FIXTURES / name
    session = Session(target=Target(pid), roots=Roots(procfs=base / "procfs", sysfs=base / "sys", rootfs=base), env_override={})
    return run_one(Plan(shm_size.CHECK, {**DEFAULTS, **(config or {})}, 10.0), session)


# ----------------------------------------------------------------- judge: floors


def test_docker_default_fails_and_names_it():
    r = judge(shm(64 * MIB), DEFAULTS)
    assert r.status is Status.FAIL
    assert "/dev/shm is 64 MiB (Docker's default), expected >= 256 MiB" in r.summary
    assert "docker run --shm-size=1g" in r.remediation and "--ipc=host" in r.remediation
    assert "emptyDir: {medium: Memory, sizeLimit: 1Gi}" in r.remediation and "mountPath: /dev/shm" in r.remediation
    assert "num_workers" in r.remediation
    assert r.facts["size_bytes"] == 64 * MIB and r.facts["free_bytes"] == 64 * MIB


def test_under_the_configured_floor_fails():
    assert judge(shm(900 * MIB), {**DEFAULTS, "min_bytes": GIB}).status is Status.FAIL
    assert judge(shm(64 * MIB), {**DEFAULTS, "min_bytes": 32 * MIB, "recommended_bytes": 32 * MIB}).status is Status.OK


def test_under_recommended_warns():
    r = judge(shm(512 * MIB), DEFAULTS)
    assert r.status is Status.WARN and "expected >= 1 GiB" in r.summary
    assert "--shm-size=1g" in r.remediation


def test_big_enough_is_ok():
    r = judge(shm(16 * GIB, 15 * GIB), DEFAULTS)
    assert r.status is Status.OK
    assert r.summary == "/dev/shm is 16 GiB, 15 GiB free (>= 1 GiB recommended)"
    assert r.facts["used_bytes"] == GIB


def test_full_shm_warns_about_leftovers():
    r = judge(shm(16 * GIB, 100 * MIB), DEFAULTS)
    assert r.status is Status.WARN and "only 100 MiB free" in r.summary and "15.9 GiB held" in r.summary


def test_a_full_shm_is_told_a_size_that_leaves_room_beside_what_others_hold():
    """helper-80: 1 GiB with 900 MiB held was told `mount -o remount,size=1G`, the size it had,
    and still warned once that was done. The size now leaves the room wanted beside what is
    held, and removing leftovers comes first."""
    r = judge(shm(GIB, 124 * MIB), DEFAULTS)
    assert r.status is Status.WARN and "900 MiB held" in r.summary, r.summary
    assert r.remediation.startswith("remove leftover /dev/shm/torch_* files"), r.remediation
    assert "remount,size=2G" in r.remediation and "--shm-size=2g" in r.remediation, r.remediation
    fixed = judge(shm(2 * GIB, 2 * GIB - 900 * MIB), DEFAULTS)  # what the line gives, the 900 MiB still there
    assert fixed.status is Status.OK, fixed.summary


def test_unlimited_tmpfs_is_ok():
    r = judge(ShmFacts("/dev/shm", None, None, "tmpfs", "/dev/shm"), DEFAULTS)
    assert r.status is Status.OK and "without a size limit" in r.summary


def test_disk_backed_shm_is_noted():
    r = judge(ShmFacts("/dev/shm", 100 * GIB, 50 * GIB, "overlay", "/"), DEFAULTS)
    assert r.status is Status.OK and "not tmpfs" in r.summary


@pytest.mark.parametrize("fstype", ["devtmpfs", "ramfs"])
def test_memory_backed_file_systems_other_than_tmpfs_are_not_called_disk(fstype):
    """helper-107: a /dev/shm that was a directory on /dev was "devtmpfs, not tmpfs, so it is backed by disk"."""
    r = judge(ShmFacts("/dev/shm", 100 * GIB, 50 * GIB, fstype, "/dev"), DEFAULTS)
    assert r.status is Status.OK and "disk" not in r.summary, r.summary


# ----------------------------------------------------------------- judge: the DataLoader's need


def test_workers_need_more_than_there_is_fails():
    # 4 workers x 2 + 1 = 9 batches of 256 MiB = 2.25 GiB
    r = judge(shm(2 * GIB), loader(4, 256 * MIB))
    assert r.status is Status.FAIL
    assert "4 DataLoader workers x prefetch_factor 2 + 1 batch in use = 9 batches of 256 MiB need 2.2 GiB" in r.summary
    assert r.facts["need_bytes"] == 9 * 256 * MIB
    # headroom 1.5 over 2.25 GiB = 3.375 GiB -> docker rounds up to 4g
    assert "--shm-size=4g" in r.remediation and "sizeLimit: 4Gi" in r.remediation
    # 2 GiB / 1.5 / 256 MiB = 5.3 batches -> (5.3 - 1) / 2 -> 2 workers fit
    assert "lower DataLoader num_workers to 2" in r.remediation


def test_workers_need_without_headroom_warns():
    r = judge(shm(2560 * MIB), loader(4, 256 * MIB))
    assert r.status is Status.WARN and "headroom" in r.summary


def test_workers_fit_is_ok_even_under_recommended():
    # a small loader on a modest /dev/shm: judged against what it holds, not the generic recommendation
    r = judge(shm(512 * MIB), loader(2, 8 * MIB))
    assert r.status is Status.OK, r.summary
    assert "need 40 MiB" in r.summary


def test_workers_need_more_than_is_free_warns():
    """A warn, not a fail (helper-94, after helper-92 had it made one): on a node's row, or with
    torch's file_system sharing, a running job's own batches look like space others hold."""
    r = judge(shm(8 * GIB, 300 * MIB), loader(2, 100 * MIB))
    assert r.status is Status.WARN and "only 300 MiB free" in r.summary and "expected >= 500 MiB free" in r.summary


def test_free_space_short_of_the_floor_with_the_loader_unknown_warns():
    r = judge(shm(8 * GIB, 100 * MIB), DEFAULTS)
    assert r.status is Status.WARN and "expected >= 256 MiB free" in r.summary, r.summary


def test_floor_still_applies_with_a_tiny_loader():
    r = judge(shm(64 * MIB), loader(1, MIB))
    assert r.status is Status.FAIL and "Docker's default" in r.summary


def test_no_workers_is_judged_by_the_floors_only():
    assert judge(shm(512 * MIB), loader(0, 256 * MIB)).status is Status.WARN
    assert judge(shm(2 * GIB), loader(0, 256 * MIB)).facts["need_bytes"] is None


# ----------------------------------------------------------------- gather over fixture trees


def test_empty_rootfs_fails():
    """Helper-92: no /dev/shm was a skip (exit 0) though the row said nothing shared can work."""
    r = run_fixture("shm_empty_rootfs")
    assert r.status is Status.FAIL
    assert "does not exist" in r.summary and "shm_empty_rootfs/dev/shm" in r.summary
    assert "mount -t tmpfs" in r.remediation


def test_docker_fixture_fails(monkeypatch):
    monkeypatch.setattr(shm_size.os, "statvfs", fake_statvfs(64 * MIB, 64 * MIB))
    r = run_fixture("shm_docker_64m")
    assert r.status is Status.FAIL and "Docker's default" in r.summary
    assert r.facts["fstype"] == "tmpfs" and r.facts["own_mount"] is True
    assert r.facts["path"].endswith("shm_docker_64m/dev/shm")


def test_shm_without_a_mount_of_its_own(monkeypatch):
    monkeypatch.setattr(shm_size.os, "statvfs", fake_statvfs(64 * MIB, 60 * MIB))
    r = run_fixture("shm_no_mount")
    assert r.facts["own_mount"] is False and r.facts["fstype"] == "tmpfs"  # the /dev tmpfs holds it
    assert r.facts["free_bytes"] == 60 * MIB


def test_unlimited_tmpfs_fixture(monkeypatch):
    monkeypatch.setattr(shm_size.os, "statvfs", fake_statvfs(0, 0))
    r = run_fixture("shm_docker_64m")
    assert r.status is Status.OK and r.facts["size_bytes"] is None and r.facts["free_bytes"] is None


def test_permission_denied_skips(monkeypatch):
    def denied(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(shm_size.os, "statvfs", denied)
    r = run_fixture("shm_docker_64m")
    assert r.status is Status.SKIP and "permission denied" in r.summary


def test_other_os_errors_skip(monkeypatch):
    def stale(path):
        raise OSError(errno.ESTALE, "Stale file handle", str(path))

    monkeypatch.setattr(shm_size.os, "statvfs", stale)
    r = run_fixture("shm_docker_64m")
    assert r.status is Status.SKIP and "Stale file handle" in r.summary


def test_shm_that_is_a_file_fails(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "shm").write_text("not a directory")
    session = Session(roots=Roots(procfs=tmp_path / "proc", sysfs=tmp_path / "sys", rootfs=tmp_path), env_override={})
    r = run_one(Plan(shm_size.CHECK, DEFAULTS, 10.0), session)
    assert r.status is Status.FAIL and "not a directory" in r.summary


def test_missing_pid_skips(tmp_path):
    session = Session(target=Target(999999), roots=Roots(procfs=tmp_path, sysfs=tmp_path, rootfs=tmp_path), env_override={})
    r = run_one(Plan(shm_size.CHECK, DEFAULTS, 10.0), session)
    assert r.status is Status.SKIP and "999999" in r.summary


def test_metrics_declared():
    assert {(m.name, m.fact) for m in shm_size.CHECK.metrics} == {("shm_size_bytes", "size_bytes"), ("shm_free_bytes", "free_bytes")}


# ----------------------------------------------------------------- sizes and the judge on any input


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=30), st.text(alphabet="0123456789.kKmMgGiBbtT -", max_size=12)))
def test_parse_size_any_input(text):
    try:
        value = parse_size(text)
    except ParseError:
        return
    assert isinstance(value, int) and value >= 0


@settings(max_examples=300, deadline=None)
@given(size=st.one_of(st.none(), st.integers(0, 1 << 50)), free=st.one_of(st.none(), st.integers(0, 1 << 50)),
       workers=st.integers(0, 64), batch=st.integers(0, 1 << 34), prefetch=st.integers(0, 16),
       fstype=st.sampled_from(["tmpfs", "overlay", None]))
def test_judge_always_gives_a_result_with_a_fix_when_not_ok(size, free, workers, batch, prefetch, fstype):
    free = None if size is None else min(free if free is not None else size, size)
    r = judge(ShmFacts("/dev/shm", size, free, fstype, "/dev/shm"), loader(workers, batch, prefetch))
    assert r.status in (Status.OK, Status.WARN, Status.FAIL)
    assert r.summary
    if r.status is not Status.OK:
        assert "--shm-size=" in r.remediation
        # a workaround the job can apply itself: fewer workers, or others' leftovers removed;
        # none for a known loader that fits (below the floor: fewer workers fix nothing for it)
        fits = "which fits" in r.summary and "which fits, but not" not in r.summary
        assert "num_workers" in r.remediation or "leftover /dev/shm/torch_*" in r.remediation or fits
        assert not (fits and "num_workers" in r.remediation), r.remediation
        if workers and batch and "num_workers to " in r.remediation:  # never the job's own number, or more
            assert int(r.remediation.split("num_workers to ")[1].split()[0]) < workers
    if size is not None and size < DEFAULTS["min_bytes"]:
        assert r.status is Status.FAIL


def test_a_running_jobs_own_batches_are_room_for_it_not_space_held_by_others():
    """Helper-42: a healthy attached job with 2 workers x 2 prefetch + 1 batches of 60 MiB
    in a 512 MiB /dev/shm holds 300 MiB itself; they were "held by other processes" and
    the job was warned that 212 MiB free is short of its 300 MiB need."""
    batch, size = 60 * MIB, 512 * MIB
    settings = loader(2, batch, 2)
    running = ShmFacts("/dev/shm", size, size - 300 * MIB, "tmpfs", "/dev/shm", own_bytes=300 * MIB)
    r = judge(running, settings)
    assert r.status is Status.OK, r.summary
    assert r.facts["own_bytes"] == 300 * MIB
    # others holding the space it needs warns, and names only what is theirs
    crowded = ShmFacts("/dev/shm", size, 40 * MIB, "tmpfs", "/dev/shm", own_bytes=100 * MIB)
    r = judge(crowded, settings)
    assert r.status is Status.WARN
    assert "(372 MiB held by other processes or leftover segments), besides the 100 MiB this job holds" in r.summary
    assert "expected >= 200 MiB free" in r.summary and "leftover /dev/shm/torch_*" in r.remediation


def test_the_num_workers_fix_never_names_the_jobs_own_count_or_more():
    """Helper-42: 'lower DataLoader num_workers to 2' for a job that had 2 fixed nothing."""
    r = judge(shm(512 * MIB, free=100 * MIB), loader(2, 60 * MIB, 2))  # short of free space only
    assert r.status is Status.WARN
    assert "num_workers to" not in r.remediation and "leftover" in r.remediation
    r = judge(shm(512 * MIB), loader(8, 60 * MIB, 2))  # 17 batches of 60 MiB do not fit
    assert "num_workers to 2 " in r.remediation


def test_below_the_floor_with_the_loader_known_the_fix_names_the_workers_that_fit():
    """Helper-49: a 192 MiB /dev/shm with 4 workers of 32 MiB batches was told only "lower
    DataLoader num_workers" (it ran 2 and 3 workers there), and the summary said the size twice."""
    mib = 1024 * 1024
    r = judge(ShmFacts("/dev/shm", 192 * mib, 192 * mib, "tmpfs", "/dev/shm"), loader(4, 32 * mib, 2))
    assert r.status is Status.FAIL
    assert r.summary.count("/dev/shm is 192 MiB") == 1, r.summary
    fit = int(r.remediation.split("num_workers to ")[1].split()[0])
    assert 0 < fit < 4, r.remediation
    # what it names fits: (fit x prefetch + 1) batches with the headroom
    assert (fit * 2 + 1) * 32 * mib * DEFAULTS["headroom"] <= 192 * mib


def test_below_the_floor_a_known_loader_that_fits_is_not_told_workers_die():
    """Helper-51: 4 workers of 0.5 MiB batches in a 128 MiB /dev/shm (which run: they hold
    4.5 MiB) were told "DataLoader workers die" and to lower num_workers; and at 192 MiB with
    2 workers of 32 MiB the headroom warning said the size a second time. The floor still
    fails (NCCL), saying the loader fits, with only the size fixes."""
    mib = 1024 * 1024
    r = judge(ShmFacts("/dev/shm", 128 * mib, 128 * mib, "tmpfs", "/dev/shm"), loader(4, mib // 2, 2))
    assert r.status is Status.FAIL and "die" not in r.summary and "which fits" in r.summary, r.summary
    assert "num_workers" not in r.remediation and "--shm-size=" in r.remediation
    tight = judge(ShmFacts("/dev/shm", 192 * mib, 192 * mib, "tmpfs", "/dev/shm"), loader(2, 32 * mib, 2))
    assert tight.summary.count("192 MiB") == 1 and tight.summary.count("need 160 MiB") == 1, tight.summary
    assert "which fits, but not with x1.5 headroom = 240 MiB" in tight.summary and "die" not in tight.summary


def test_below_the_floor_a_fitting_loader_under_a_cpu_torch_warns_without_nccl():
    """helper-79: a CPU-only job (torch without CUDA, so no NCCL) whose 4 workers fit in a
    64 MiB /dev/shm failed with "NCCL fails there". The floor's NCCL reason needs a CUDA
    build: with a CPU one it warns (a larger loader would fail); with a CUDA one it fails."""
    mib = 1024 * 1024
    facts = ShmFacts("/dev/shm", 64 * mib, 64 * mib, "tmpfs", "/dev/shm")
    cpu = judge(facts._replace(torch_cuda=False), loader(4, mib // 8, 2))
    assert cpu.status is Status.WARN and "NCCL fails" not in cpu.summary and "CPU build: no NCCL" in cpu.summary, cpu.summary
    for torch_cuda in (True, None):  # a CUDA build, or not known: the floor stands
        r = judge(facts._replace(torch_cuda=torch_cuda), loader(4, mib // 8, 2))
        assert r.status is Status.FAIL and "NCCL fails there" in r.summary, r.summary
    unknown_loader = judge(facts._replace(torch_cuda=False), DEFAULTS)  # workers may need anything: still a fail
    assert unknown_loader.status is Status.FAIL


def test_the_floor_row_reads_as_english_for_a_live_loader_too():
    """Helper-54: an attached job's row read "this job's the running job's (live) 4 DataLoader workers"."""
    mib = 1024 * 1024
    facts = ShmFacts("/dev/shm", 64 * mib, 64 * mib, "tmpfs", "/dev/shm")
    settings = dict(loader(4, 6 * mib, 2), loader_source="live")
    r = judge(facts, settings)
    assert "this job's the" not in r.summary and "which fits" in r.summary, r.summary


def _mount_of_table(tmp_path: Path, table: str):
    """shm_size._mount_of over `table` as a process's mountinfo."""
    from types import SimpleNamespace

    file = tmp_path / "mountinfo"
    file.write_text(table)
    return shm_size._mount_of(SimpleNamespace(proc=lambda name: file), "/dev/shm")


HOST = "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 0:5 / /dev rw - devtmpfs udev rw\n3 2 0:20 / /dev/shm rw - tmpfs tmpfs rw\n"


def test_the_mount_holding_shm_is_found_as_the_path_walk_finds_it(tmp_path):
    assert _mount_of_table(tmp_path, HOST) == ("tmpfs", "/dev/shm")
    # a tmpfs mounted over /dev afterwards: stacked on the old /dev, it hides the old /dev/shm
    assert _mount_of_table(tmp_path, HOST + "9 2 0:30 / /dev rw - tmpfs none rw\n") == ("tmpfs", "/dev")
    # two mounts stacked on /dev/shm: the one on top
    assert _mount_of_table(tmp_path, HOST + "10 3 0:31 / /dev/shm rw - ramfs none rw\n") == ("ramfs", "/dev/shm")
    # a /dev mounted over / after /dev/shm was mounted (as a sibling): it hides /dev/shm too
    assert _mount_of_table(tmp_path, "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n3 1 0:20 / /dev/shm rw - tmpfs tmpfs rw\n"
                           "4 1 0:5 / /dev rw - devtmpfs udev rw\n") == ("devtmpfs", "/dev")
    # a chroot's table, whose root mount is above its root and left out: the deepest, as before
    assert _mount_of_table(tmp_path, "7 5 0:31 / /usr rw - ext4 /dev/sda1 rw\n8 5 0:20 /x /dev/shm rw - tmpfs t rw\n") \
        == ("tmpfs", "/dev/shm")
    # parents that loop (a hostile table) end, with an answer
    assert _mount_of_table(tmp_path, "1 0 8:1 / / rw - ext4 r rw\n2 3 0:5 / /dev rw - tmpfs a rw\n3 2 0:6 / /dev rw - tmpfs b rw\n")


def test_a_mount_over_the_processes_root_is_not_where_its_paths_lead(tmp_path):
    """helper-108: `mount --bind X /` stacks X on the root, but the process's paths start
    at its root and never cross onto X: its /dev/shm is still the tmpfs under the root."""
    table = HOST + "174 1 8:1 /srv/x / rw - ext4 /dev/sda1 rw\n"
    assert _mount_of_table(tmp_path, table) == ("tmpfs", "/dev/shm")


def test_a_chroots_tops_are_walked_as_the_children_of_the_parent_it_cannot_see(tmp_path):
    """helper-108: a chroot's table had three tops (/usr, /dev/shm, /dev over it): the
    deepest took the hidden /dev/shm; walked, /dev is crossed first."""
    table = ("400 345 8:1 /usr /usr rw - ext4 /dev/sda1 rw\n401 345 0:40 / /dev/shm rw - tmpfs a rw\n"
             "402 345 0:41 / /dev rw - tmpfs b rw\n")
    assert _mount_of_table(tmp_path, table) == ("tmpfs", "/dev")
    assert _mount_of_table(tmp_path, table.replace("tmpfs b", "devtmpfs b").replace(" tmpfs b", " devtmpfs b")) \
        == ("devtmpfs", "/dev")


def test_a_table_whose_ids_repeat_into_a_cycle_is_not_walked_for_ever(tmp_path, monkeypatch):
    """helper-108: two mounts with one id made a cycle; each step scanned 100,000
    children again, and a 16,000-line table took 17 s. Now a revisit ends the walk:
    each mount point is normalised a few times, not once per step."""
    import posixpath

    compared = 0
    real_normpath = posixpath.normpath

    def normpath(path):
        nonlocal compared
        compared += 1
        return real_normpath(path)

    monkeypatch.setattr(posixpath, "normpath", normpath)
    n = 20_000
    lines = ["1 0 8:1 / / rw - ext4 x rw", "2 1 0:5 / /dev rw - tmpfs t rw", "3 2 0:6 / /dev rw - tmpfs t rw",
             "2 3 0:7 / /dev rw - tmpfs u rw"] + [f"{10 + i} 2 0:9 / /dev/x/{i} rw - tmpfs t rw" for i in range(n)]
    assert _mount_of_table(tmp_path, "\n".join(lines) + "\n") == ("tmpfs", "/dev")  # not walked: the deepest
    assert compared < 10 * n, compared
