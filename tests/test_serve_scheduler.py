"""The scheduler's run over many targets, and the watchdog under the load serve puts on it."""

from __future__ import annotations

import os
import subprocess
import threading
import time

from envdoctor.watchdog import DONE, Watchdog


def test_watchdog_backlog_from_many_callers_never_starves():
    """serve runs several targets at once, each starting all its checks: far more calls
    than workers. Every queued call must still get a worker (a miscounted idle pool
    once let the workers retire while calls waited, and every check 'timed out
    waiting for a free worker')."""
    wd = Watchdog(max_workers=4, name=f"test-{os.getpid()}")
    kinds: list[str] = []
    lock = threading.Lock()

    def caller(i: int) -> None:
        for round_ in range(3):
            pending = [wd.start((i, round_, j), lambda: time.sleep(0.01)) for j in range(10)]
            deadline = time.monotonic() + 30
            outcomes = [p.wait(deadline) for p in pending]
            with lock:
                kinds.extend(o.kind for o in outcomes)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(kinds) == 8 * 3 * 10
    assert set(kinds) == {DONE}, {k: kinds.count(k) for k in set(kinds)}
    assert wd.threads() <= 4
