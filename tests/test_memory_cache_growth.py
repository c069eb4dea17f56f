"""memory.cache_growth: the judge on facts (horizons, the tightest limit, the fixes per
memory, allocator findings), and the check through the runner (no window: skip; a
serve-style history registered on the host session; the node target)."""

from __future__ import annotations

from envdoctor.checks import memory_cache_growth as mcg
from envdoctor.checks.memory_cache_growth import GrowthFacts, judge
from envdoctor.context import HostSession, Session, Target
from envdoctor.memsample import Limit, MemoryHistory, Sample
from envdoctor.model import Status
from envdoctor.runner import Plan, run_one

MIB = 1024**2
GIB = 1024**3
DEFAULTS = dict(mcg.CHECK.config)


def series(slope, n=60, step=1.0, base=500 * MIB):
    ts = [i * step for i in range(n)]
    return ts, [base + slope * t for t in ts]


def facts(memories, limits, **kw):
    return GrowthFacts(memories, limits, "window", **kw)


def test_a_leak_that_hits_the_cgroup_limit_within_the_hour_fails_with_the_loss_item_fix():
    limit = Limit(2 * GIB, 1 * GIB, "cgroup v1 memory limit (/sys/fs/cgroup/memory/x/memory.limit_in_bytes)")
    r = judge(facts({"rss": series(2 * MIB)}, {"rss": limit}), DEFAULTS)
    assert r.status is Status.FAIL
    assert "resident memory grows 2 MiB/s" in r.summary
    assert "cgroup v1 memory limit" in r.summary and "runs out in 9 min, 1 GiB left" in r.summary
    assert "loss.item()" in r.remediation
    assert r.facts["exhaustion_eta_seconds"]["rss"] == 512.0
    assert r.facts["growth_bytes_per_second"]["rss"] == 2 * MIB


def test_a_throttling_bound_says_so_and_when_the_limit_beyond_it_kills():
    """helper-100: cgroup v2 memory.high was named as "not killed" while memory.max, 124 MiB
    further up, would OOM-kill the job; now the throttling and the kill are both said."""
    kill = Limit(1 * GIB, 544 * MIB, "cgroup v2 memory limit /sys/fs/cgroup/pod1/memory.max")
    high = Limit(900 * MIB, 420 * MIB, "cgroup v2 memory.high /sys/fs/cgroup/pod1/memory.high", True, kill)
    r = judge(facts({"cgroup": series(20 * MIB, base=480 * MIB)}, {"cgroup": high}), DEFAULTS)
    assert r.status is Status.FAIL
    assert ("cgroup v2 memory.high /sys/fs/cgroup/pod1/memory.high (900 MiB) runs out in 21 s, 420 MiB left, "
            "where the kernel throttles the job to a crawl; cgroup v2 memory limit /sys/fs/cgroup/pod1/memory.max "
            "(1 GiB), which kills it, runs out in 27 s") in r.summary, r.summary
    assert r.facts["limits"]["cgroup"]["throttles"] is True
    assert r.facts["limits"]["cgroup"]["then"]["limit_bytes"] == GIB
    zero = Limit(0, 0, "cgroup v2 memory.high /sys/fs/cgroup/pod1/memory.high", True)  # helper-100: its size was dropped
    assert "memory.high (0 B)" in judge(facts({"cgroup": series(20 * MIB)}, {"cgroup": zero}), DEFAULTS).summary


def test_warn_between_the_horizons_ok_beyond():
    limit = Limit(64 * GIB, 20 * GIB, "host memory (MemAvailable)")
    r = judge(facts({"rss": series(1 * MIB)}, {"rss": limit}), DEFAULTS)  # 20480 s: 5.7 h
    assert r.status is Status.WARN and "5.7 h" in r.summary
    r = judge(facts({"rss": series(1 * MIB)}, {"rss": Limit(512 * GIB, 400 * GIB, "host memory")}), DEFAULTS)
    assert r.status is Status.OK  # 4.7 days: beyond the warn horizon, still said
    assert "grows 1 MiB/s" in r.summary and "beyond" in r.summary
    cfg = dict(DEFAULTS, warn_horizon_seconds=7 * 86400.0)
    assert judge(facts({"rss": series(1 * MIB)}, {"rss": Limit(512 * GIB, 400 * GIB, "host memory")}), cfg).status is Status.WARN


def test_the_soonest_exhaustion_is_named_first():
    limits = {"rss": Limit(None, 10 * GIB, "host memory"), "shm": Limit(GIB, 200 * MIB, "/dev/shm size")}
    r = judge(facts({"rss": series(2 * MIB), "shm": series(1 * MIB, base=0)}, limits), DEFAULTS)
    assert r.summary.startswith("/dev/shm usage (the whole mount's, shared by every process on it) grows")
    assert "num_workers" in r.remediation and "loss.item()" in r.remediation


def test_steady_memory_is_ok_and_gauges_say_zero():
    r = judge(facts({"rss": series(0.0), "cgroup": series(0.0)}, {}), DEFAULTS)
    assert r.status is Status.OK and "no sustained memory growth" in r.summary
    assert r.facts["growth_bytes_per_second"] == {"cgroup": 0.0, "rss": 0.0}
    assert r.facts["exhaustion_eta_seconds"] == {}


def test_a_window_too_short_is_a_skip_that_says_how_long():
    r = judge(facts({"rss": series(5 * MIB, n=5)}, {}), DEFAULTS)
    assert r.status is Status.SKIP and "--window 30" in r.summary


def test_a_window_just_short_says_how_much_it_sampled_not_the_same_rounded_figure():
    """helper-107: 'sampled 10 s, need at least 10 s' for 9.7 s sampled."""
    r = judge(facts({"rss": series(5 * MIB, n=10, step=1.078)}, {}), DEFAULTS)  # 9.7 s
    assert r.status is Status.SKIP and "sampled 9.7 s, need at least 10 s" in r.summary, r.summary
    r = judge(facts({"rss": series(5 * MIB, n=5)}, {}), DEFAULTS)  # 4 s: whole seconds, as before
    assert "sampled 4 s, need at least 10 s" in r.summary, r.summary


def test_a_history_too_short_under_serve_says_to_wait_not_to_run_check():
    """serve's row for a new process told the user to run `envdoctor check --window 30`;
    under serve the history just needs more runs (helper-18)."""
    r = judge(GrowthFacts({"rss": series(5 * MIB, n=5)}, {}, "history"), DEFAULTS)
    assert r.status is Status.SKIP and "envdoctor check" not in r.summary
    assert "serve judges it again each run" in r.summary


def test_reserved_far_above_allocated_and_rising_retries_say_expandable_segments():
    ts = [float(i) for i in range(30)]
    memories = {"cuda0_reserved": (ts, [8.0 * GIB] * 30), "cuda0_allocated": (ts, [2.0 * GIB] * 30),
                "cuda0_num_alloc_retries": (ts, [float(i // 10) for i in range(30)])}
    r = judge(facts(memories, {}), DEFAULTS)
    assert r.status is Status.WARN
    assert "reserves 8 GiB but tensors use 2 GiB" in r.summary
    assert "2 allocation retries" in r.summary
    assert r.remediation == "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert r.fix_env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_nothing_readable_is_a_skip_with_the_notes():
    r = judge(facts({}, {}, notes=("cannot read /proc/1/status",)), DEFAULTS)
    assert r.status is Status.SKIP and "cannot read" in r.summary


def _plan(**config):
    return Plan(mcg.CHECK, dict(DEFAULTS, **config), 30.0)


def test_without_a_window_the_check_skips_and_says_how():
    r = run_one(_plan(), Session(target=Target()))
    assert r.status is Status.SKIP
    assert "--window" in r.remediation


def test_serve_history_on_the_host_session_is_judged_without_sampling():
    history = MemoryHistory()
    for i in range(60):
        history.add("pid:77", Sample(float(i), {"rss": 100 * MIB + 3 * MIB * i},
                                     {"rss": Limit(GIB, 300 * MIB, "cgroup v2 memory limit")}))
    host = HostSession()
    host.fact(mcg.HISTORY_FACT, lambda: history)
    r = run_one(_plan(), Session(target=Target(77), host=host))
    assert r.status is Status.FAIL and r.facts["source"] == "history"
    assert r.facts["exhaustion_eta_seconds"]["rss"] == 100.0
    # a process serve has not sampled yet
    r = run_one(_plan(), Session(target=Target(78), host=host))
    assert r.status is Status.SKIP and "no memory samples" in r.summary


def test_the_node_target_is_skipped():
    r = run_one(_plan(window_seconds=5.0), Session(target=Target.node()))
    assert r.status is Status.SKIP and "per process" in r.summary


def test_a_short_window_on_this_process_runs_end_to_end():
    r = run_one(_plan(window_seconds=1.0, interval_seconds=0.2, min_window_seconds=0.5), Session(target=Target()))
    assert r.status in (Status.OK, Status.SKIP), r.summary
    assert "rss" in r.facts["growth_bytes_per_second"]
    assert r.facts["source"] == "window"
