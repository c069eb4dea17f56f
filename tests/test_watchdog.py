"""The watchdog: a bounded call by key, and the runner on top of it, in a long-lived process.

These are the engine issue's "done when": a check that never returns, run 50 times
through the runner in one process, keeps the live thread count at a small constant,
and every run answers within its timeout; a check that calls sys.exit() is reported
as having raised SystemExit, not as having timed out.
"""

from __future__ import annotations

import sys
import threading
import time

from envdoctor.check import Check
from envdoctor.context import HostSession, Session, Target
from envdoctor.model import Status, ok
from envdoctor.runner import Plan, run
from envdoctor.watchdog import DONE, RAISED, STUCK, TIMED_OUT, Watchdog


def test_each_outcome_kind():
    wd = Watchdog(max_workers=2)
    release = threading.Event()
    assert wd.call("a", lambda: 42, 5).kind == DONE
    assert wd.call("a", lambda: 42, 5).value == 42
    raised = wd.call("b", lambda: 1 / 0, 5)
    assert raised.kind == RAISED and isinstance(raised.error, ZeroDivisionError)
    timed = wd.call("c", lambda: release.wait(30), 0.2)
    assert timed.kind == TIMED_OUT and "wait" in timed.where
    again = wd.call("c", lambda: 1, 5)  # still stuck: not started again
    assert again.kind == STUCK and again.since is not None
    assert "not started again" in again.describe()
    release.set()
    deadline = time.monotonic() + 5
    while "c" in wd.stuck() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert wd.call("c", lambda: "back", 5).value == "back"  # it came back: the key runs again


def test_base_exceptions_are_outcomes_not_crashes():
    wd = Watchdog()
    out = wd.call("exit", lambda: sys.exit(3), 5)
    assert out.kind == RAISED and isinstance(out.error, SystemExit)
    assert "SystemExit(3)" in out.describe()

    def interrupt():
        raise KeyboardInterrupt

    assert isinstance(wd.call("kbd", interrupt, 5).error, KeyboardInterrupt)


def test_stuck_calls_are_bounded_and_refused_beyond_the_limit():
    wd = Watchdog(max_workers=2, max_stuck=3)
    release = threading.Event()
    for i in range(3):
        assert wd.call(f"k{i}", lambda: release.wait(30), 0.05).kind == TIMED_OUT
    refused = wd.call("k-new", lambda: 1, 1)
    assert refused.kind == RAISED and "still stuck" in str(refused.error)
    assert wd.threads() <= 3 + 2
    release.set()


def test_pool_keeps_capacity_while_calls_are_stuck():
    wd = Watchdog(max_workers=2)
    release = threading.Event()
    for i in range(2):
        wd.call(f"hang{i}", lambda: release.wait(30), 0.05)
    # both original workers are stuck; new work still runs, on replacement workers
    outs = [wd.start(f"ok{i}", lambda i=i: i) for i in range(4)]
    assert [o.wait(time.monotonic() + 5).value for o in outs] == [0, 1, 2, 3]
    release.set()


def _hang_forever(ctx):
    threading.Event().wait()  # never returns
    return ok("never")


def test_a_never_returning_check_run_50_times_keeps_threads_bounded():
    host = HostSession(watchdog=Watchdog(max_workers=4))
    plans = [Plan(Check(id="t.never", title="never returns", run=_hang_forever), {}, 0.2),
             Plan(Check(id="t.fine", title="fine", run=lambda ctx: ok("fine")), {}, 5)]
    before = threading.active_count()
    counts = []
    for i in range(50):
        started = time.monotonic()
        session = Session(target=Target(), env_override={}, host=host)
        rows = {r.check: r for r in run(plans, session)}
        took = time.monotonic() - started
        assert rows["t.fine"].status is Status.OK
        assert rows["t.never"].status is Status.ERROR
        if i == 0:
            assert "timed out after 0.2 s" in rows["t.never"].summary
        else:
            assert "still stuck since" in rows["t.never"].summary and "not started again" in rows["t.never"].summary
        assert took < 0.2 + 2.0, took  # bounded by the timeout, not by the hang
        counts.append(threading.active_count())
    assert max(counts) - before <= 4 + 1, (before, counts)  # the pool, and nothing per run
    assert counts[-1] == counts[10], counts  # flat after the first runs


def test_sys_exit_in_a_check_is_reported_as_such_not_as_a_timeout():
    def leaves(ctx):
        sys.exit(3)

    session = Session(env_override={}, host=HostSession(watchdog=Watchdog()))
    started = time.monotonic()
    [row] = run([Plan(Check(id="t.exit", title="exits", run=leaves), {}, 10)], session)
    assert time.monotonic() - started < 5
    assert row.status is Status.ERROR
    assert "SystemExit(3)" in row.summary and "timed out" not in row.summary
    assert "test_watchdog.py" in row.summary


def test_a_forked_child_gets_a_working_pool_not_the_parents_idle_workers():
    """The parent has an idle worker waiting in the pool; a forked child has no such
    thread. A call in the child must still run (it used to wait "for a free worker" until
    its deadline: the exec pre-flight's fixes timed out on a CI machine this way)."""
    from envdoctor import forked
    from envdoctor.watchdog import default_watchdog

    watchdog = default_watchdog()
    assert watchdog.call("warm-up", lambda: 1, 5).value == 1  # leaves an idle worker behind
    deadline = time.monotonic() + 5
    while watchdog._idle == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watchdog._idle >= 1

    def in_child(send):
        outcome = default_watchdog().call("in-child", lambda: 42, 5)
        return [outcome.kind, outcome.value, outcome.describe()]

    result = forked.call(in_child, 20)
    assert result.kind == forked.DONE, result.error
    assert result.value[:2] == [DONE, 42], result.value


class _Interrupted(Exception):
    pass


def test_a_signal_delivered_to_a_worker_thread_still_reaches_the_waiting_main_thread():
    """The kernel may deliver SIGTERM or SIGINT to a worker (one starting a subprocess
    blocks them on the main thread around its fork). Python's handler must still run on
    the main thread promptly, not when the check's timeout ends: `envdoctor check`
    ignored Ctrl-C for the whole torch-check timeout 2 times in 40 under load."""
    import signal

    def handler(signum, frame):
        raise _Interrupted

    def check():
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)  # to this worker, not to the main thread
        time.sleep(20)

    previous = signal.signal(signal.SIGUSR1, handler)
    started = time.monotonic()
    try:
        Watchdog().call("signalled", check, timeout=20)
        raise AssertionError("the handler never ran")
    except _Interrupted:
        pass
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert time.monotonic() - started < 10  # 0.1 s slices; a missed signal waits the full 20 s


def test_an_idle_worker_keeps_nothing_of_its_last_call():
    """A worker waiting for work held its last job: the function's closure, its value and
    its exception's traceback, and through them (in serve) a whole run's sessions and
    results, up to one old run per idle worker."""
    import gc
    import weakref

    class Payload:
        pass

    wd = Watchdog(max_workers=2)
    kept = []

    def make() -> Payload:
        payload = Payload()
        kept.append(weakref.ref(payload))
        return payload

    def fail() -> None:
        payload = Payload()
        kept.append(weakref.ref(payload))
        raise ValueError("with a traceback whose frame holds the payload")

    assert wd.call("value", make, 5).kind == DONE
    assert wd.call("error", fail, 5).kind == RAISED
    assert wd.threads() >= 1  # the workers are alive and idle, waiting for the next call
    deadline = time.monotonic() + 5
    while any(ref() is not None for ref in kept) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    assert [ref() for ref in kept] == [None, None]


def test_a_kept_failure_does_not_grow_with_every_caller():
    """A host fact that failed (NVML missing) is re-raised to every caller; its traceback
    must stay the failure's own, not gain the callers' frames (and keep them alive) each
    time, and it must still point at where it failed."""
    from envdoctor.context import _Once
    from envdoctor.errors import Unavailable
    from envdoctor.watchdog import where_raised

    def connect():
        raise Unavailable("no NVIDIA driver here")

    once = _Once(connect)

    def depth(tb) -> int:
        n = 0
        while tb is not None:
            n, tb = n + 1, tb.tb_next
        return n

    seen = []
    for _ in range(50):
        try:
            once.get()
        except Unavailable as exc:
            seen.append(depth(exc.__traceback__))
            assert where_raised(exc).startswith("test_watchdog.py:")  # connect()'s raise, innermost
    assert max(seen) == seen[0] and seen[0] <= 4, seen


def test_a_calls_done_flag_behaves_as_an_event_for_every_waiter():
    """_Done replaced threading.Event per call (a serve run holds ~520 at once, ~1.4 KiB each
    as Events): set, is_set and wait as an Event gives them, for several waiters at once."""
    from envdoctor.watchdog import _Done

    done = _Done()
    assert not done.is_set() and done.wait(0) is False and done.wait(-1) is False
    t0 = time.monotonic()
    assert done.wait(0.05) is False and time.monotonic() - t0 >= 0.04
    woke: list[bool] = []
    waiters = [threading.Thread(target=lambda: woke.append(done.wait(10))) for _ in range(8)]
    for w in waiters:
        w.start()
    time.sleep(0.05)
    done.set()
    for w in waiters:
        w.join(5)
    assert woke == [True] * 8
    done.set()  # a second set changes nothing
    assert done.is_set() and done.wait() is True and done.wait(0) is True
