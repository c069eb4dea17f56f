"""A run's threads are kept on one CPU while it lasts and let go after (serve.onecpu).

Real affinity on this machine's real threads: nothing faked. The tests that pin need
two allowed CPUs (CI has 2); with one there is nothing to keep together.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from envdoctor.serve.onecpu import OneCpu, current_cpu

ALLOWED = set(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(ALLOWED) < 2, reason="one CPU allowed: nothing to keep together")


def _affinities() -> dict[int, set[int]]:
    out = {}
    for name in os.listdir("/proc/self/task"):
        try:
            out[int(name)] = set(os.sched_getaffinity(int(name)))
        except OSError:  # a thread that ended while listed
            pass
    return out


class _Parked:
    """A thread that waits until told to end, and says which CPUs it may use when asked."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.thread = threading.Thread(target=self.go.wait, daemon=True)
        self.thread.start()

    def end(self) -> None:
        self.go.set()
        self.thread.join()


@needs_two
def test_every_thread_is_on_the_callers_cpu_inside_and_gets_its_cpus_back_after():
    parked = [_Parked() for _ in range(3)]
    try:
        before = _affinities()
        with OneCpu() as kept:
            inside = _affinities()
            assert kept.cpu in ALLOWED
            assert current_cpu(ALLOWED) == kept.cpu  # the caller runs there now, and nowhere else
        after = _affinities()
        assert len(inside) >= 4
        assert all(cpus == {kept.cpu} for cpus in inside.values()), inside
        assert after == before
    finally:
        for p in parked:
            p.end()


@needs_two
def test_a_thread_started_inside_and_a_block_that_raises_get_the_cpus_back_too():
    late: list[_Parked] = []
    try:
        with pytest.raises(RuntimeError):
            with OneCpu() as kept:
                late.append(_Parked())  # inherits the one CPU from the pinned caller
                assert os.sched_getaffinity(late[0].thread.native_id) == {kept.cpu}
                raise RuntimeError("a run that failed")
        assert os.sched_getaffinity(late[0].thread.native_id) == ALLOWED
        assert os.sched_getaffinity(0) == ALLOWED
    finally:
        for p in late:
            p.end()


def test_disabled_it_changes_nothing():
    before = _affinities()
    with OneCpu(enabled=False) as kept:
        assert _affinities() == before
    assert kept.cpu is None and _affinities() == before


def test_a_process_allowed_one_cpu_is_left_alone():
    cpu = min(ALLOWED)
    program = (
        "import os\n"
        f"os.sched_setaffinity(0, {{{cpu}}})\n"
        "from envdoctor.serve.onecpu import OneCpu\n"
        "with OneCpu() as kept:\n"
        "    print(kept.cpu, sorted(os.sched_getaffinity(0)))\n"
        "print(sorted(os.sched_getaffinity(0)))\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == [f"None [{cpu}]", f"[{cpu}]"]


@needs_two
def test_a_serve_run_examines_on_one_cpu_and_leaves_every_thread_as_it_found_it(monkeypatch):
    from fake_pynvml import FakeNvml
    from test_serve_scheduler import _scheduler

    sched = _scheduler(FakeNvml(devices=[]))
    seen: list[set[int]] = []

    def examine(target, host):
        seen.append(set(os.sched_getaffinity(0)))  # on the pool's thread
        return []

    monkeypatch.setattr(sched, "_examine", examine)
    sched.run_once()  # starts the pool's threads
    before = _affinities()
    seen.clear()
    sched.run_once()
    assert seen and all(len(cpus) == 1 for cpus in seen), seen
    assert _affinities() == before

    sched.one_cpu_runs = False
    seen.clear()
    sched.run_once()
    assert seen and all(cpus == ALLOWED for cpus in seen), seen


@needs_two
def test_the_nodes_cpus_are_what_the_daemon_may_use_not_the_one_cpu_of_its_run():
    """serve's node target is read from the daemon's own process, whose threads a run
    keeps on one CPU: the node must still show every CPU it was allowed (helper-64 saw
    `envdoctor_cpu_effective{target="node"} 1.0` on a 2-CPU machine)."""
    import json

    from fake_pynvml import FakeNvml
    from test_serve_scheduler import _scheduler

    from envdoctor import affinity

    sched = _scheduler(FakeNvml(devices=[]))
    report = json.loads(sched.run_once().report)
    [node] = [r for r in report["results"] if r["check"] == "cpu.threads" and r["target"] == "node"]
    assert node["facts"]["affinity_cpus"] == len(ALLOWED), node["facts"]
    assert affinity.affinity(__import__("pathlib").Path("/proc"), None) == ALLOWED  # and nothing left narrowed after
