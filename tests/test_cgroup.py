"""envdoctor.cgroup and envdoctor.affinity: the parsers (property-tested) and the
quota lookup over fixture trees for cgroup v1, v2, nested limits, a Docker view
and another process."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envdoctor.affinity import parse_cpulist, parse_status_cpus_allowed
from envdoctor.cgroup import (
    CgroupEntry,
    cpu_limit,
    effective_cpus,
    parse_cfs_period,
    parse_cfs_quota,
    parse_cpu_max,
    parse_mountinfo,
    parse_mountinfo_line,
    parse_proc_cgroup,
)
from envdoctor.context import Roots
from envdoctor.errors import ParseError

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_roots(name: str) -> Roots:
    base = FIXTURES / name
    return Roots(procfs=base / "procfs", sysfs=base / "sys", rootfs=base)


# ----------------------------------------------------------------- parsers, by example


def test_proc_cgroup_v1_v2_and_colons_in_path():
    entries = parse_proc_cgroup("4:cpu,cpuacct:/docker/abc\n1:name=systemd:/a:b\n0::/user.slice\n\n")
    assert entries == (
        CgroupEntry(4, ("cpu", "cpuacct"), "/docker/abc"),
        CgroupEntry(1, ("name=systemd",), "/a:b"),
        CgroupEntry(0, (), "/user.slice"),
    )
    assert entries[2].is_v2 and not entries[0].is_v2


@pytest.mark.parametrize("bad", ["4:cpu", "x:cpu:/a", "-1:cpu:/a", "4:cpu:relative", "0::/a\0b"])
def test_proc_cgroup_rejects(bad):
    with pytest.raises(ParseError):
        parse_proc_cgroup(bad)


def test_mountinfo_fields_optional_tags_and_escapes():
    m = parse_mountinfo_line(
        r"612 611 0:27 /docker/abc /sys/fs/cgroup/my\040cpu ro,relatime master:13 shared:2 - cgroup cpu,cpuacct rw,cpu,cpuacct"
    )
    assert (m.mount_id, m.parent_id, m.root, m.mount_point) == (612, 611, "/docker/abc", "/sys/fs/cgroup/my cpu")
    assert (m.fstype, m.source, m.super_options) == ("cgroup", "cpu,cpuacct", ("rw", "cpu", "cpuacct"))
    # nsfs mounts have a root that is not a path; it must still parse
    ns = parse_mountinfo_line("700 25 0:4 net:[4026531840] /run/netns/x rw - nsfs nsfs rw")
    assert ns.root == "net:[4026531840]"


@pytest.mark.parametrize("bad", [
    "1 2 0:3 / /x rw ext4 /dev/sda rw",  # no separator
    "1 2 0:3 / /x rw - ",  # nothing after the separator
    "1 2 nodev / /x rw - ext4 /dev/sda rw",  # device not major:minor
    "1 2 0:3 / relative rw - ext4 /dev/sda rw",  # mount point not absolute
    "a 2 0:3 / /x rw - ext4 /dev/sda rw",
])
def test_mountinfo_rejects(bad):
    with pytest.raises(ParseError):
        parse_mountinfo(bad)


def test_mountinfo_of_this_machine_parses():
    text = Path("/proc/self/mountinfo").read_text()
    mounts = parse_mountinfo(text)
    assert any(m.mount_point == "/" for m in mounts)


@pytest.mark.parametrize("text,expected", [
    ("max 100000\n", (None, 100000)),
    ("200000 100000", (200000, 100000)),
    ("50000 100000", (50000, 100000)),
    ("max", (None, 100000)),
])
def test_cpu_max(text, expected):
    assert parse_cpu_max(text) == expected


@pytest.mark.parametrize("bad", ["", "0 100000", "max 0", "-5 100000", "1 2 3", "max abc"])
def test_cpu_max_rejects(bad):
    with pytest.raises(ParseError):
        parse_cpu_max(bad)


def test_cfs_files():
    assert parse_cfs_quota("-1\n") is None
    assert parse_cfs_quota("50000\n") == 50000
    assert parse_cfs_period("100000\n") == 100000
    for bad in ("0", "-2", "", "1e5", "9" * 30):
        with pytest.raises(ParseError):
            parse_cfs_quota(bad)
    with pytest.raises(ParseError):
        parse_cfs_period("0")


def test_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert parse_cpulist("") == frozenset()
    assert parse_status_cpus_allowed("Name:\tx\nCpus_allowed_list:\t0-1,4-5\n") == frozenset({0, 1, 4, 5})
    for bad in ("3-1", "a", "0-99999999", "1,,2"):
        with pytest.raises(ParseError):
            parse_cpulist(bad)
    with pytest.raises(ParseError):
        parse_status_cpus_allowed("Name:\tx\n")


# ----------------------------------------------------------------- parsers, any input


def _value_or_parse_error(fn, text):
    try:
        fn(text)
    except ParseError:
        pass  # the only exception a parser of untrusted text may raise


# Text biased toward the characters these formats are made of, so the property reaches
# past the first check of each parser rather than only exercising "garbage in".
_kernelish = st.text(alphabet=st.sampled_from(list("0123456789-:,/ \n\t\\max=cpu") + ["\0", "é"]), max_size=80)
_any = st.one_of(st.text(max_size=200), _kernelish)


@settings(max_examples=300, deadline=None)
@given(_any)
def test_parsers_return_or_raise_parse_error(text):
    for fn in (parse_proc_cgroup, parse_mountinfo, parse_cpu_max, parse_cfs_quota, parse_cfs_period,
               parse_cpulist, parse_status_cpus_allowed):
        _value_or_parse_error(fn, text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 15), st.lists(st.sampled_from(["cpu", "cpuacct", "memory", "name=systemd"]), max_size=3),
                          st.lists(st.text(alphabet="abc:.-_ 0", min_size=1, max_size=6), max_size=4)), max_size=6))
def test_proc_cgroup_roundtrip(lines):
    text = "".join(f"{h}:{','.join(c)}:/{'/'.join(p)}\n" for h, c, p in lines)
    entries = parse_proc_cgroup(text)
    assert [(e.hierarchy, list(e.controllers), e.path) for e in entries] == [
        (h, c, "/" + "/".join(p)) for h, c, p in lines
    ]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**12), st.integers(1, 10**7))
def test_cpu_max_roundtrip(quota, period):
    assert parse_cpu_max(f"{quota} {period}\n") == (quota, period)


# ----------------------------------------------------------------- lookups over fixture trees


def test_v1_quota_on_the_job_cgroup():
    limit = cpu_limit(fixture_roots("cgroup_v1_quota"), None)
    assert limit.quota_cpus == 2.0
    assert limit.source == "cgroup v1"
    assert limit.path.endswith("sys/fs/cgroup/cpu,cpuacct/slurm/job42/cpu.cfs_quota_us")
    eff = effective_cpus(fixture_roots("cgroup_v1_quota"), None)
    assert (eff.cpus, eff.affinity, eff.online, eff.limited_by) == (2.0, 16, 16, "cgroup quota")


def test_v1_docker_view_strips_the_mount_root():
    limit = cpu_limit(fixture_roots("cgroup_v1_docker"), None)
    assert limit.quota_cpus == 4.0
    assert limit.path.endswith("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us")


def test_v2_max_on_the_container():
    limit = cpu_limit(fixture_roots("cgroup_v2_max"), None)
    assert (limit.quota_cpus, limit.source) == (2.0, "cgroup v2")
    assert limit.path.endswith("cri-containerd-c1.scope/cpu.max")
    assert effective_cpus(fixture_roots("cgroup_v2_max"), None).cpus == 2.0


def test_v2_unlimited():
    limit = cpu_limit(fixture_roots("cgroup_v2_unlimited"), None)
    assert (limit.quota_cpus, limit.source, limit.path) == (None, "none", "")
    eff = effective_cpus(fixture_roots("cgroup_v2_unlimited"), None)
    assert (eff.cpus, eff.limited_by) == (8.0, "affinity")


def test_v2_nested_parent_is_tighter():
    limit = cpu_limit(fixture_roots("cgroup_v2_nested"), None)
    assert limit.quota_cpus == 1.0
    assert limit.path.endswith("batch/job7/cpu.max")
    eff = effective_cpus(fixture_roots("cgroup_v2_nested"), None)
    assert (eff.cpus, eff.affinity, eff.online, eff.limited_by) == (1.0, 4, 16, "cgroup quota")


def test_other_process_through_the_readers_mount_table():
    roots = fixture_roots("cgroup_v2_pid")
    limit = cpu_limit(roots, 4242)
    assert limit.quota_cpus == 1.5
    eff = effective_cpus(roots, 4242)
    assert (eff.cpus, eff.affinity) == (1.5, 4)


def _only_its_own_mount_table_shows(proc: Path, pid: int) -> None:
    """Process `pid` whose v1 cpu cgroup (a quarter CPU) only its own mount table shows,
    reached through <procfs>/<pid>/root."""
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text("4:cpu:/docker/x\n")
    (proc / str(pid) / "mountinfo").write_text("9 1 0:27 /docker/x /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n")
    cg = proc / str(pid) / "root" / "sys" / "fs" / "cgroup" / "cpu"
    cg.mkdir(parents=True)
    (cg / "cpu.cfs_quota_us").write_text("25000\n")
    (cg / "cpu.cfs_period_us").write_text("100000\n")


def test_falls_back_to_the_targets_own_mount_table(tmp_path):
    # The reader cannot see the hierarchy (no cgroup mount of its own), the target
    # can: its mount is reached through <procfs>/<pid>/root.
    proc = tmp_path / "procfs"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n")
    _only_its_own_mount_table_shows(proc, 77)
    limit = cpu_limit(Roots(procfs=proc, sysfs=tmp_path / "sys", rootfs=tmp_path), 77)
    assert limit.quota_cpus == 0.25
    assert "77/root" in limit.path


def test_processes_of_one_cgroup_share_one_lookup_per_run(tmp_path):
    """serve asks every process's quota every run; those whose /proc/N/cgroup says the
    same are in the same cgroups, so a run's memo looks the quota up once for them. A
    process our mount table cannot show is still looked up through its own."""
    import shutil

    from envdoctor.context import HostSession

    shutil.copytree(FIXTURES / "cgroup_v2_pid", tmp_path / "t")
    roots = Roots(procfs=tmp_path / "t" / "procfs", sysfs=tmp_path / "t" / "sys", rootfs=tmp_path / "t")
    shutil.copytree(roots.procfs / "4242", roots.procfs / "4243")
    cpu_max = roots.sysfs / "fs/cgroup/system.slice/train.service/cpu.max"

    run = HostSession(roots=roots)
    first = cpu_limit(roots, 4242, run.fact)
    cpu_max.write_text("300000 100000\n")  # changes between two processes of one run
    assert cpu_limit(roots, 4243, run.fact) == first and first.quota_cpus == 1.5  # looked up once this run
    assert effective_cpus(roots, 4243, run.fact).cpus == 1.5
    assert cpu_limit(roots, 4243).quota_cpus == 3.0  # without the memo: read now
    assert cpu_limit(roots, 4243, HostSession(roots=roots).fact).quota_cpus == 3.0  # the next run reads afresh

    # the reader's table cannot show this one's cgroup; its own mount table can
    _only_its_own_mount_table_shows(roots.procfs, 77)
    limit = cpu_limit(roots, 77, run.fact)
    assert limit.quota_cpus == 0.25 and "77/root" in limit.path


def test_empty_tree_is_unknown_not_an_exception(tmp_path):
    roots = Roots(procfs=tmp_path, sysfs=tmp_path, rootfs=tmp_path)
    limit = cpu_limit(roots, None)
    assert (limit.quota_cpus, limit.source) == (None, "unknown")
    assert "cannot read" in limit.notes[0]
    eff = effective_cpus(roots, None)
    assert (eff.cpus, eff.limited_by) == (None, "unknown")


def test_malformed_files_become_notes(tmp_path):
    proc = tmp_path / "procfs" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("0::/a\n")
    (proc / "mountinfo").write_text("25 22 0:24 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    (tmp_path / "sys" / "fs" / "cgroup" / "a").mkdir(parents=True)
    (tmp_path / "sys" / "fs" / "cgroup" / "a" / "cpu.max").write_text("lots 100000\n")
    limit = cpu_limit(Roots(procfs=tmp_path / "procfs", sysfs=tmp_path / "sys", rootfs=tmp_path), None)
    assert limit.quota_cpus is None and limit.source == "none"
    assert any("ignoring" in n and "cpu.max" in n for n in limit.notes)


def test_cgroup_path_outside_the_namespace_is_not_followed(tmp_path):
    proc = tmp_path / "procfs" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("0::/../../etc\n")
    (proc / "mountinfo").write_text("25 22 0:24 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    (tmp_path / "sys" / "fs" / "cgroup").mkdir(parents=True)
    limit = cpu_limit(Roots(procfs=tmp_path / "procfs", sysfs=tmp_path / "sys", rootfs=tmp_path), None)
    assert limit.source == "unknown"
    assert any("not visible" in n for n in limit.notes)


def test_this_machine_does_not_raise():
    eff = effective_cpus(Roots(), None)
    assert eff.cpus is None or eff.cpus > 0


def test_paths_outside_the_readers_cgroup_namespace_match_a_mount_shown_the_same_way():
    """Helper-96 (kernel cgroup-v2.rst, "Namespace"): from a sibling namespace a cgroup reads
    `/../sibling/...`, and a mount of the outer tree reads `/..`: a prefix like any other."""
    from envdoctor.cgroup import _relative

    assert _relative("/../b", "/..") == ("b",)
    assert _relative("/../../kubepods.slice/c.scope", "/../../kubepods.slice/c.scope") == ()
    assert _relative("/../b", "/") is None  # the reader's own tree does not hold it
    assert _relative("/a/../../b", "/a") is None  # what climbs out of the mount after its root


def test_no_quota_on_a_v1_host_whose_unified_hierarchy_is_not_mounted_is_none_not_unknown(tmp_path):
    """Helper-98: a v1 container lists "0::/" but has no cgroup2 mount; that hierarchy holds no
    cpu controller, so "unknown" (after helper-96's change) should stay "none"."""
    proc = tmp_path / "procfs"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("4:cpu,cpuacct:/docker/x\n0::/\n")
    (proc / "self" / "mountinfo").write_text("9 1 0:27 /docker/x /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu,cpuacct\n")
    cg = tmp_path / "sys" / "fs" / "cgroup" / "cpu"
    cg.mkdir(parents=True)
    (cg / "cpu.cfs_quota_us").write_text("-1\n")
    (cg / "cpu.cfs_period_us").write_text("100000\n")
    limit = cpu_limit(Roots(procfs=proc, sysfs=tmp_path / "sys", rootfs=tmp_path), None)
    assert limit.quota_cpus is None and limit.source == "none", limit
