"""The runner contains every kind of misbehaviour and runs checks concurrently."""

from __future__ import annotations

import threading
import time

from envdoctor.check import Check
from envdoctor.context import Session
from envdoctor.errors import Unavailable
from envdoctor.model import Status, ok, warn
from envdoctor.runner import Plan, run


def _check(check_id, fn, **kw):
    return Check(id=check_id, title=check_id, run=fn, **kw)


def _session(**kw):
    return Session(env_override={}, **kw)


def test_hang_and_raise_become_error_rows_while_others_are_judged():
    release = threading.Event()

    def hang(ctx):
        release.wait(60)
        return ok("never")

    def boom(ctx):
        raise KeyError("missing fact")

    plans = [
        Plan(_check("t.hang", hang), {}, 0.5),
        Plan(_check("t.boom", boom), {}, 5),
        Plan(_check("t.fine", lambda ctx: warn("observed 3, expected 2", "export X=2", n=3)), {}, 5),
    ]
    started = time.perf_counter()
    results = {r.check: r for r in run(plans, _session())}
    elapsed = time.perf_counter() - started
    release.set()

    assert results["t.hang"].status is Status.ERROR
    assert "timed out after 0.5 s" in results["t.hang"].summary
    assert "hang" in results["t.hang"].summary  # names where it was stuck
    assert results["t.boom"].status is Status.ERROR
    assert "KeyError" in results["t.boom"].summary and "test_runner.py" in results["t.boom"].summary
    assert results["t.fine"].status is Status.WARN and results["t.fine"].facts == {"n": 3}
    assert results["t.fine"].remediation == "export X=2"
    assert 0.45 <= elapsed < 2.0, elapsed  # near the timeout, not the hang's 60 s


def test_checks_run_concurrently_wall_time_is_the_slowest_not_the_sum():
    def nap(ctx):
        time.sleep(0.4)
        return ok("rested")

    plans = [Plan(_check(f"t.nap{i}", nap), {}, 5) for i in range(5)]
    started = time.perf_counter()
    results = run(plans, _session())
    elapsed = time.perf_counter() - started
    assert [r.status for r in results] == [Status.OK] * 5
    assert elapsed < 1.2, f"5 x 0.4 s checks took {elapsed:.2f} s: not concurrent"
    assert all(r.duration_seconds >= 0.39 for r in results)


def test_quick_checks_start_one_after_another_in_plan_order(monkeypatch):
    """Started all at once, a process's checks contended for the GIL and its session's
    facts (serve: 2.5x the CPU over 64 processes). The next check starts when the last
    one ends, or has run SLOW_CHECK_SECONDS: with that made long, none overlap."""
    from envdoctor import runner

    monkeypatch.setattr(runner, "SLOW_CHECK_SECONDS", 30.0)
    lock = threading.Lock()
    running, most, order = [0], [0], []

    def work(name):
        def fn(ctx):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
                order.append(name)
            time.sleep(0.02)
            with lock:
                running[0] -= 1
            return ok(name)
        return fn

    plans = [Plan(_check(f"t.q{i}", work(f"t.q{i}")), {}, 5) for i in range(6)]
    results = run(plans, _session())
    assert [r.status for r in results] == [Status.OK] * 6
    assert most[0] == 1, "quick checks overlapped"
    assert order == [p.check.id for p in plans]


def test_unavailable_becomes_skip_with_reason_and_unmet_needs_skip_before_running():
    called = []

    def needs_gpu(ctx):
        called.append(True)
        return ok("ran")

    def no_permission(ctx):
        raise Unavailable("permission denied reading /proc/1/environ")

    def missing_nvml():
        raise Unavailable("NVML library not found: no NVIDIA driver")

    session = _session(nvml_factory=missing_nvml)
    results = {r.check: r for r in run([
        Plan(_check("t.gpu", needs_gpu, needs=("nvml",)), {}, 5),
        Plan(_check("t.perm", no_permission), {}, 5),
    ], session)}
    assert results["t.gpu"].status is Status.SKIP and "no NVIDIA driver" in results["t.gpu"].summary
    assert called == []
    assert results["t.perm"].status is Status.SKIP and "permission denied" in results["t.perm"].summary


def test_runner_fills_identity_and_a_non_result_is_an_error():
    results = run([Plan(_check("t.bad", lambda ctx: "ok"), {}, 5)], _session())
    assert results[0].check == "t.bad" and results[0].target == "self"
    assert results[0].status is Status.ERROR and "not a Result" in results[0].summary


def test_a_shared_need_is_computed_once_across_concurrent_checks():
    calls = []

    def slow_torch(session):
        calls.append(1)
        time.sleep(0.2)
        return {"torch_version": "2.13.0"}

    session = _session(torch_factory=slow_torch)
    plans = [Plan(_check(f"t.torch{i}", lambda ctx: ok(ctx.torch["torch_version"]), needs=("torch",)), {}, 5) for i in range(4)]
    results = run(plans, session)
    assert [r.summary for r in results] == ["2.13.0"] * 4
    assert calls == [1]


def test_join_fixes_keeps_every_distinct_fix_worst_first():
    from envdoctor.model import Status, join_fixes

    findings = [(Status.WARN, "w", "export A=1"), (Status.FAIL, "f", "export B=2"), (Status.WARN, "w2", "export A=1"),
                (Status.FAIL, "f2", "")]
    assert join_fixes(findings) == "export B=2; export A=1"
    assert join_fixes([]) == ""


def test_join_fixes_gives_a_shared_step_once():
    """Seen in cpu.threads of an attached job: 'export ...; torch.set_num_threads(1) in the
    script; export ...' (the unset-variables finding and the live-threads one share the export)."""
    from envdoctor.model import Status, join_fixes

    export = "export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1"
    findings = [(Status.FAIL, "live", f"{export}; # and torch.set_num_threads(1) in the script"),
                (Status.WARN, "unset", export), (Status.WARN, "other", "export X=1")]
    # helper-54: pasted into bash, 'export ...; torch.set_num_threads(1) in the script' ran nothing
    # (a syntax error); the advice is a comment now, and comments go last so every command runs
    assert join_fixes(findings) == f"{export}; export X=1  # and torch.set_num_threads(1) in the script"
    import subprocess
    pasted = subprocess.run(["bash", "-c", join_fixes(findings) + "\necho $OMP_NUM_THREADS $X"],
                            capture_output=True, text=True)
    assert pasted.returncode == 0 and pasted.stdout.split() == ["1", "1"], pasted.stderr


def test_a_check_that_answers_past_its_timeout_is_timed_out_whatever_ran_before_it():
    """Helper-15: a 3.8 s check with timeout 2 was reported ok when a 4 s check ran
    before it, because the runner looked at it only after waiting for the first."""

    def slow(seconds):
        def run_it(ctx):
            time.sleep(seconds)
            return ok(f"slept {seconds}")
        return run_it

    plans = [
        Plan(_check("t.first", slow(1.0)), {}, 5),
        Plan(_check("t.late", slow(0.6)), {}, 0.3),
        Plan(_check("t.quick", slow(0.0)), {}, 5),
    ]
    results = {r.check: r for r in run(plans, _session())}
    assert results["t.first"].status is Status.OK
    late = results["t.late"]
    assert late.status is Status.ERROR, late.summary
    assert "past its 0.3 s timeout" in late.summary and 'check."t.late"' in late.summary
    assert late.facts["timeout_seconds"] == 0.3
    assert results["t.quick"].status is Status.OK


def test_a_bound_set_by_the_caller_names_the_callers_knob():
    plans = [Plan(_check("t.hang", lambda ctx: time.sleep(2) or ok("x")), {}, 0.2, "raise exec's --timeout")]
    (row,) = run(plans, _session())
    assert row.status is Status.ERROR and "timed out after 0.2 s" in row.summary
    assert "raise exec's --timeout" in row.summary and "[check." not in row.summary


def test_a_comment_ending_one_step_does_not_swallow_the_steps_after_it():
    """Helper-55: dist.env's 'export NCCL_SOCKET_IFNAME=eth0; export GLOO_SOCKET_IFNAME=eth0  #
    exact names, see ip -br link; unset NCCL_P2P_DISABLE; ...' pasted into bash ran only the two
    exports: the comment took the rest of the line. Comments are gathered at the end."""
    import subprocess

    from envdoctor.model import Status, join_fixes

    fix = join_fixes([(Status.FAIL, "ifname", "export A=eth0  # exact names, see ip -br link"),
                      (Status.FAIL, "p2p", "unset B"), (Status.WARN, "debug", "export C=WARN"),
                      (Status.WARN, "other", "export D=1; # and restart the job")])
    assert fix == "export A=eth0; unset B; export C=WARN; export D=1  # exact names, see ip -br link; and restart the job"
    pasted = subprocess.run(["bash", "-c", fix + "\necho $A ${B-unset} $C $D"], capture_output=True, text=True,
                            env={"B": "1", "PATH": "/usr/bin:/bin"})
    assert pasted.stdout.split() == ["eth0", "unset", "WARN", "1"], (fix, pasted.stderr)


def test_a_kept_failure_keeps_where_it_was_raised_not_what_its_factory_had_read():
    """A session keeps a need's failure for the run and re-raises it to every check that
    asks. Its frames keep their file and line (an error row says where) but not their
    local variables: in serve, a torch-less process's "no torch" held its maps text, and
    its session, until every target of the run was done."""
    import gc
    import weakref

    import pytest

    from envdoctor.context import _Once
    from envdoctor.errors import Unavailable
    from envdoctor.watchdog import where_raised

    class Text(str):
        pass

    for kind in (Unavailable, RuntimeError):
        read: list[weakref.ref] = []

        def factory():
            maps_text = Text("x" * 4096)  # a local of the failing frame
            read.append(weakref.ref(maps_text))
            raise kind("no torch in pid:1")

        once = _Once(factory)
        for _ in range(2):
            with pytest.raises(kind, match="no torch in pid:1") as raised:
                once.get()
            assert where_raised(raised.value).startswith("test_runner.py:"), kind  # factory's raise, innermost
        gc.collect()
        assert read[0]() is None, f"{kind.__name__}: the frames' locals (what was read) were kept"


def test_a_huge_summary_or_fix_is_cut_saying_how_much_more():
    """helper-85: a plug-in's 50 MB summary was kept whole, and the report took 12.8 s."""
    from envdoctor.runner import MAX_TEXT_CHARS

    big = Check(id="x.big", title="big", run=lambda ctx: warn("s" * 1_000_000, "f" * 30_000))
    r, = run([Plan(big, {}, 5.0)], Session())
    assert r.status is Status.WARN and len(r.summary) < MAX_TEXT_CHARS + 100, len(r.summary)
    assert r.summary.endswith(f"... ({1_000_000 - MAX_TEXT_CHARS} more characters)")
    assert r.remediation.endswith(f"... ({30_000 - MAX_TEXT_CHARS} more characters)")
