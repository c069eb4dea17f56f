"""Chained calls (Watchdog.start_chain): one worker runs a target's checks one after
another, and a slow one never holds up those after it.

Why a chain: serve runs ~450 checks a run, and handing each one to a worker and its
answer back woke two threads per check. A chain must keep every guarantee the single
calls had: its own key, deadline and outcome per call, nothing run twice or lost when
the caller sends the rest elsewhere, nothing waiting behind a hung call.
"""

from __future__ import annotations

import random
import threading
import time

from envdoctor.check import Check
from envdoctor.context import Session
from envdoctor.model import Status, ok
from envdoctor.runner import Plan, run
from envdoctor.watchdog import DONE, STUCK, TIMED_OUT, Watchdog


def _check(check_id, fn):
    return Check(id=check_id, title=check_id, run=fn)


def test_a_chain_runs_in_order_on_one_worker_and_each_call_times_itself():
    wd = Watchdog(max_workers=4)
    order, threads = [], set()

    def nap(name):
        def call():
            order.append(name)
            threads.add(threading.get_ident())
            time.sleep(0.05)
            return name
        return call

    calls = wd.start_chain([(f"k{i}", nap(i)) for i in range(4)])
    outcomes = [c.wait(time.monotonic() + 5) for c in calls]
    assert [o.kind for o in outcomes] == [DONE] * 4
    assert [o.value for o in outcomes] == [0, 1, 2, 3] == order
    assert len(threads) == 1  # one worker, no hand-over between calls
    # each call's time is its own, not the chain's so far (the 4th is not 0.2 s)
    assert all(0.04 <= o.seconds < 0.15 for o in outcomes), [o.seconds for o in outcomes]


def test_calls_after_a_hung_one_finish_long_before_its_deadline():
    release = threading.Event()
    finished_at: dict[str, float] = {}

    def quick(name):
        def check(ctx):
            finished_at[name] = time.monotonic()
            return ok(name)
        return check

    def hang(ctx):
        release.wait(60)
        return ok("never")

    plans = [Plan(_check("a.first", quick("a.first")), {}, 5), Plan(_check("b.hang", hang), {}, 1.0),
             Plan(_check("c.after", quick("c.after")), {}, 5), Plan(_check("d.last", quick("d.last")), {}, 5)]
    started = time.monotonic()
    try:
        results = {r.check: r for r in run(plans, Session(env_override={}))}
    finally:
        release.set()
    assert results["b.hang"].status is Status.ERROR and "timed out after 1 s" in results["b.hang"].summary
    assert [results[k].status for k in ("a.first", "c.after", "d.last")] == [Status.OK] * 3
    # left behind once it had run SLOW_CHECK_SECONDS (0.05 s): not after its 1 s timeout
    assert finished_at["c.after"] - started < 0.6 and finished_at["d.last"] - started < 0.6, finished_at
    assert results["c.after"].duration_seconds < 0.5


def test_a_stuck_key_in_a_chain_is_answered_at_once_and_the_rest_runs():
    wd = Watchdog(max_workers=2)
    release = threading.Event()
    try:
        assert wd.call("stuck", lambda: release.wait(30), 0.1).kind == TIMED_OUT
        ran = []
        calls = wd.start_chain([("a", lambda: ran.append("a")), ("stuck", lambda: ran.append("stuck")),
                                ("b", lambda: ran.append("b"))])
        kinds = [c.wait(time.monotonic() + 5).kind for c in calls]
        assert kinds == [DONE, STUCK, DONE]
        assert ran == ["a", "b"]  # the stuck key was not started again
    finally:
        release.set()


def test_detaching_while_the_worker_moves_on_runs_every_call_exactly_once():
    """The caller sends the rest of a chain elsewhere at random moments, racing the worker
    that takes the next call itself: each call must run once, none lost, none twice."""
    wd = Watchdog(max_workers=8)
    counts: dict[tuple[int, int], int] = {}
    lock = threading.Lock()
    rng = random.Random(7)

    def call(key):
        def fn():
            with lock:
                counts[key] = counts.get(key, 0) + 1
            if rng.random() < 0.3:
                time.sleep(0.0005)
            return key
        return fn

    for chain in range(150):
        keys = [(chain, i) for i in range(6)]
        calls = wd.start_chain([(key, call(key)) for key in keys])
        for pending in calls:
            roll = rng.random()
            if roll < 0.3:
                pending.detach_rest()  # most likely before the worker reaches it
            elif roll < 0.6:
                pending.finished_within(1)  # after it returned: the worker may own the next already
                pending.detach_rest()
            elif roll < 0.8:
                time.sleep(rng.random() / 2000)
                pending.detach_rest()
        outcomes = [c.wait(time.monotonic() + 10) for c in calls]
        assert [o.kind for o in outcomes] == [DONE] * 6, [o.describe() for o in outcomes]
        assert [o.value for o in outcomes] == keys
    assert len(counts) == 150 * 6 and set(counts.values()) == {1}
    assert wd.threads() <= 8
