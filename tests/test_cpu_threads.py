"""cpu.threads: the judge on facts, the value parser on any input, and the whole
check over fixture trees through the runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envdoctor.cgroup import CpuLimit, EffectiveCpus
from envdoctor.checks import cpu_threads
from envdoctor.checks.cpu_threads import THREAD_VARS, ThreadFacts, judge, parse_thread_count
from envdoctor.context import Roots, Session, Target
from envdoctor.errors import ParseError
from envdoctor.model import Status
from envdoctor.runner import Plan, run_one

FIXTURES = Path(__file__).parent / "fixtures"
DEFAULTS = dict(cpu_threads.CHECK.config)
ALL_ONE = dict.fromkeys(THREAD_VARS, "1")


def cpus(effective, affinity, online=None, quota=None, limited_by=None):
    limit = CpuLimit(quota, "cgroup v1" if quota else "none", "/sys/fs/cgroup/cpu/x/cpu.cfs_quota_us" if quota else "")
    if limited_by is None:
        limited_by = "cgroup quota" if quota is not None and quota <= (affinity or 1e9) else "affinity"
    return EffectiveCpus(effective, affinity, online or affinity, limit, limited_by)


def facts(env=None, eff=None, lws=None):
    return ThreadFacts(env or {}, lws, eff or cpus(16.0, 16))


def run_fixture(name, env, config=None, pid=None):
    base = FIXTURES / name
    session = Session(target=Target(pid), roots=Roots(procfs=base / "procfs", sysfs=base / "sys", rootfs=base),
                      env_override=env)
    return run_one(Plan(cpu_threads.CHECK, {**DEFAULTS, **(config or {})}, 10.0), session)


# ----------------------------------------------------------------- values


@pytest.mark.parametrize("name,value,expected", [
    ("OMP_NUM_THREADS", "4", (4,)),
    ("OMP_NUM_THREADS", " 4 ", (4,)),
    ("OMP_NUM_THREADS", "4,2", (4, 2)),
    ("MKL_NUM_THREADS", "16", (16,)),
    ("OMP_NUM_THREADS", "+1", (1,)),  # strtoul's sign: torch 2.13 runs 1 thread (helper-76)
    ("OMP_NUM_THREADS", "+2,+1", (2, 1)),
    ("OPENBLAS_NUM_THREADS", "+4", (4,)),
])
def test_thread_count_accepts(name, value, expected):
    assert parse_thread_count(name, value) == expected


@pytest.mark.parametrize("name,value,why", [
    ("OMP_NUM_THREADS", "0", "0 is not"),
    ("OMP_NUM_THREADS", "", "empty"),
    ("OMP_NUM_THREADS", "auto", "not a positive integer"),
    ("OMP_NUM_THREADS", "4.0", "not a positive integer"),
    ("OMP_NUM_THREADS", "-1", "not a positive integer"),
    ("OMP_NUM_THREADS", "+", "not a positive integer"),
    ("OMP_NUM_THREADS", "++1", "not a positive integer"),
    ("OMP_NUM_THREADS", '"4"', "quotes"),
    ("OMP_NUM_THREADS", "4,", "not a positive integer"),
    ("MKL_NUM_THREADS", "4,2", "only OMP_NUM_THREADS takes a comma list"),
    ("OPENBLAS_NUM_THREADS", "1" * 12, "plausible"),
    ("MKL_NUM_THREADS", " 2", "MKL reads digits alone"),  # helper-80: torch then runs 1 thread
    ("MKL_NUM_THREADS", "2 ", "MKL reads digits alone"),
    ("MKL_NUM_THREADS", "+2", "MKL reads digits alone"),
])
def test_thread_count_rejects_with_reason(name, value, why):
    with pytest.raises(ParseError, match=why):
        parse_thread_count(name, value)


@pytest.mark.parametrize("value, valid", [("2", True), ("02", True), (" 2", False), ("2 ", False), ("+2", False),
                                           ("abc", False)])
def test_an_mkl_value_is_judged_as_torchs_mkl_reads_it(value, valid):
    """helper-80: MKL_NUM_THREADS=' 2' passed (libgomp reads it as 2), but MKL refuses it and
    torch runs one thread whatever OMP_NUM_THREADS says: asked of the real torch here."""
    import os
    import subprocess
    import sys

    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    env = {**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": value}
    threads = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                             capture_output=True, text=True, timeout=120)
    import torch

    if "USE_MKL=ON" not in torch.__config__.show():
        pytest.skip("this torch is built without MKL")
    assert (threads.stdout.strip() == "2") is valid, (value, threads.stdout, threads.stderr)
    env = dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"), "2")
    r = judge(facts({**env, "MKL_NUM_THREADS": value}, cpus(2.0, 2)), DEFAULTS)
    assert (r.status is Status.OK) is valid, r.summary
    if not valid:
        assert "torch then runs one thread" in r.summary, r.summary


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(THREAD_VARS + ("LOCAL_WORLD_SIZE",)),
       st.one_of(st.text(max_size=40), st.text(alphabet="0123456789, '\"-", max_size=20)))
def test_thread_count_any_input(name, value):
    try:
        counts = parse_thread_count(name, value)
    except ParseError:
        return
    assert counts and all(isinstance(c, int) and c > 0 for c in counts)
    assert len(counts) == 1 or name == "OMP_NUM_THREADS"


# ----------------------------------------------------------------- judge


def test_fitting_values_pass():
    r = judge(facts(dict.fromkeys(THREAD_VARS, "4"), cpus(4.0, 16, quota=4.0)), DEFAULTS)
    assert r.status is Status.OK, r.summary
    assert r.facts["recommended_threads"] == 4
    assert r.facts["effective_cpus"] == 4.0


def test_invalid_value_fails_and_says_which_and_why():
    r = judge(facts({"OMP_NUM_THREADS": "auto", "MKL_NUM_THREADS": "4"}, cpus(4.0, 4)), DEFAULTS)
    assert r.status is Status.FAIL
    assert "OMP_NUM_THREADS='auto'" in r.summary and "positive integer" in r.summary
    assert r.remediation.startswith("export OMP_NUM_THREADS=4 MKL_NUM_THREADS=4 ")


def test_zero_fails():
    r = judge(facts({**ALL_ONE, "NUMEXPR_NUM_THREADS": "0"}, cpus(4.0, 4)), DEFAULTS)
    assert r.status is Status.FAIL and "NUMEXPR_NUM_THREADS='0'" in r.summary


def test_disagreeing_values_warn():
    r = judge(facts({"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                     "NUMEXPR_NUM_THREADS": "1"}, cpus(4.0, 4)), DEFAULTS)
    assert r.status is Status.WARN
    assert "disagree" in r.summary and "OMP_NUM_THREADS=2" in r.summary and "MKL_NUM_THREADS=1" in r.summary


def test_nested_omp_list_counts_the_product():
    fits = judge(facts({"OMP_NUM_THREADS": "2,2"}, cpus(4.0, 4)), DEFAULTS)
    assert fits.status is Status.OK, fits.summary
    over = judge(facts({"OMP_NUM_THREADS": "4,2"}, cpus(4.0, 4)), DEFAULTS)
    assert over.status is Status.WARN and "8 threads" in over.summary
    # the outer level is what is compared with the others
    agree = judge(facts({"OMP_NUM_THREADS": "2,2", "MKL_NUM_THREADS": "2"}, cpus(4.0, 4)), DEFAULTS)
    assert "disagree" not in agree.summary


def test_oversubscribed_against_the_quota():
    r = judge(facts({**ALL_ONE, "OMP_NUM_THREADS": "8", "MKL_NUM_THREADS": "8"}, cpus(2.0, 64, quota=2.0)), DEFAULTS)
    assert r.status is Status.WARN
    assert "oversubscribed" in r.summary and "OMP_NUM_THREADS=8" in r.summary and "2 effective CPUs" in r.summary
    assert "export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 VECLIB_MAXIMUM_THREADS=2 NUMEXPR_NUM_THREADS=2" == r.remediation


def test_processes_per_node_divide_the_cpus():
    env = dict.fromkeys(THREAD_VARS, "4")
    alone = judge(facts(env, cpus(16.0, 16)), DEFAULTS)
    assert alone.status is Status.OK
    ranks = judge(facts(env, cpus(16.0, 16), lws="8"), DEFAULTS)
    assert ranks.status is Status.WARN and "8 processes per node (LOCAL_WORLD_SIZE)" in ranks.summary
    assert ranks.facts["recommended_threads"] == 2
    configured = judge(facts(env, cpus(16.0, 16)), {**DEFAULTS, "processes_per_node": 8})
    assert configured.status is Status.WARN and configured.facts["processes_per_node"] == 8


def test_dataloader_workers_take_their_cpus():
    env = dict.fromkeys(THREAD_VARS, "4")
    r = judge(facts(env, cpus(8.0, 8)), {**DEFAULTS, "num_workers": 6})
    assert r.status is Status.WARN and r.facts["recommended_threads"] == 2


def test_a_share_below_one_cpu_is_said_as_a_floor_not_as_arithmetic():
    """Helper-90: '0.5 effective CPUs less 3 DataLoader workers each leaves 1 thread' read as a sum."""
    r = judge(facts({"OMP_NUM_THREADS": "16"}, cpus(0.5, 2)), {**DEFAULTS, "num_workers": 3})
    assert "less 3 DataLoader workers each leaves less than one CPU per process: 1 thread each, the least" in r.summary, r.summary
    r = judge(facts({"OMP_NUM_THREADS": "16"}, cpus(8.0, 8)), {**DEFAULTS, "num_workers": 2})
    assert "leaves 6 threads per process" in r.summary, r.summary


def test_more_ranks_than_cpus_warn_even_at_one_thread():
    r = judge(facts(ALL_ONE, cpus(2.0, 64, quota=2.0), lws="4"), DEFAULTS)
    assert r.status is Status.WARN and "4 processes per node on 2 effective CPUs" in r.summary
    # the variables are already at one thread: a fix of only them changed nothing (helper-42)
    assert r.remediation.startswith("export OMP_NUM_THREADS=1")
    assert "# and run at most 2 processes per node (torchrun --nproc-per-node=2), or give the job more CPUs" in r.remediation


def test_bad_local_world_size_is_a_note_not_a_finding():
    r = judge(facts(ALL_ONE, cpus(4.0, 4), lws="four"), DEFAULTS)
    assert r.status is Status.OK
    assert any("LOCAL_WORLD_SIZE" in n for n in r.facts["notes"])


def test_unset_inside_a_quota_warns():
    r = judge(facts({}, cpus(0.5, 2, quota=0.5)), DEFAULTS)
    assert r.status is Status.WARN
    assert "OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS, NUMEXPR_NUM_THREADS unset" in r.summary
    assert "visible core (2)" in r.summary and "0.5 effective CPUs" in r.summary
    assert "VECLIB" not in r.summary  # Apple Accelerate only
    assert r.remediation.startswith("export OMP_NUM_THREADS=1 ")


def test_unset_without_a_quota_is_fine():
    r = judge(facts({}, cpus(16.0, 16)), DEFAULTS)
    assert r.status is Status.OK, r.summary


def test_libraries_that_follow_omp_are_not_reported_unset():
    r = judge(facts({"OMP_NUM_THREADS": "2"}, cpus(2.0, 16, quota=2.0)), DEFAULTS)
    assert r.status is Status.OK, r.summary


def test_unknown_cpus_with_nothing_wrong_is_a_skip():
    r = judge(facts(ALL_ONE, EffectiveCpus(None, None, None, CpuLimit(None, "unknown", "", ("cannot read x",)), "unknown")),
              DEFAULTS)
    assert r.status is Status.SKIP and "cannot read x" in r.summary


def test_unknown_cpus_still_fails_bad_values():
    r = judge(facts({"OMP_NUM_THREADS": "many"}, EffectiveCpus(None, None, None, CpuLimit(None, "unknown", ""), "unknown")),
              DEFAULTS)
    assert r.status is Status.FAIL


# ----------------------------------------------------------------- through the runner, over fixture trees


def test_fixture_v2_max_unset_warns_for_2_cpus_of_32():
    r = run_fixture("cgroup_v2_max", {"PATH": "/usr/bin"})
    assert r.status is Status.WARN, r.summary
    assert r.facts["effective_cpus"] == 2.0 and r.facts["quota_source"] == "cgroup v2"
    assert "visible core (32)" in r.summary
    assert r.remediation.startswith("export OMP_NUM_THREADS=2 ")


def test_fixture_v1_quota_fitting_values_pass():
    r = run_fixture("cgroup_v1_quota", dict.fromkeys(THREAD_VARS, "2"))
    assert r.status is Status.OK, r.summary
    assert r.facts["quota_cpus"] == 2.0 and r.facts["limited_by"] == "cgroup quota"


def test_fixture_nested_v2_parent_limit_wins():
    r = run_fixture("cgroup_v2_nested", dict.fromkeys(THREAD_VARS, "4"))
    assert r.status is Status.WARN
    assert r.facts["effective_cpus"] == 1.0 and r.facts["quota_path"].endswith("batch/job7/cpu.max")


def test_fixture_pid_target_reads_its_environ():
    r = run_fixture("cgroup_v2_pid", None, pid=4242)
    assert r.target == "pid:4242"
    assert r.status is Status.WARN and "OMP_NUM_THREADS=8" in r.summary
    assert r.facts["effective_cpus"] == 1.5
    assert "HOME" not in str(r.facts)  # only the thread variables are copied


def test_fixture_empty_tree_skips(tmp_path):
    session = Session(roots=Roots(procfs=tmp_path, sysfs=tmp_path, rootfs=tmp_path), env_override={})
    r = run_one(Plan(cpu_threads.CHECK, DEFAULTS, 10.0), session)
    assert r.status is Status.SKIP and r.summary


def test_metric_facts_exist():
    names = {m.name: m.fact for m in cpu_threads.CHECK.metrics}
    assert names == {"cpu_effective": "effective_cpus", "cpu_quota_cpus": "quota_cpus"}
    r = run_fixture("cgroup_v2_max", dict.fromkeys(THREAD_VARS, "2"))
    assert isinstance(r.facts["effective_cpus"], float) and isinstance(r.facts["quota_cpus"], float)


@pytest.mark.parametrize("cpus, shown", [(2.0, "2"), (0.5, "0.5"), (1.25, "1.25"), (0.001, "0.001"),
                                         (1.999, "2"), (0.004, "0.004")])
def test_a_cpu_count_is_shown_as_a_number(cpus, shown):
    """0.001 CPU (a 1000/1000000 quota) read "0. effective CPUs", and 1.999 read "2."."""
    assert cpu_threads._fmt_cpus(cpus) == shown
