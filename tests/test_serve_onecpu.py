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
            inside, cpu = _affinities(), kept.cpu
            assert cpu in ALLOWED
            assert current_cpu(ALLOWED) == cpu  # the caller runs there now, and nowhere else
        after = _affinities()
        assert len(inside) >= 4
        assert all(cpus == {cpu} for cpus in inside.values()), inside
        assert after == before and kept.cpu is None
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

    from envdoctor import runner

    sched = _scheduler(FakeNvml(devices=[]))
    seen: list[set[int]] = []
    call_now = runner._call_now

    def call(plan, batch):
        seen.append(set(os.sched_getaffinity(0)))  # on the watchdog's worker, as each check starts
        return call_now(plan, batch)

    monkeypatch.setattr(runner, "_call_now", call)
    sched.run_once()  # starts the watchdog's threads
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


@needs_two
def test_a_move_someone_makes_while_the_run_lasts_is_kept():
    """An admin's `taskset -p` that lands inside a run is not undone when the run ends
    (helper-63: `taskset -a -p -c 0` during a run came back as 0-1, 8 of 8)."""
    parked = [_Parked() for _ in range(2)]
    try:
        with OneCpu() as kept:
            other = min(ALLOWED - {kept.cpu})
            os.sched_setaffinity(parked[0].thread.native_id, {other})  # the admin's move
        assert os.sched_getaffinity(parked[0].thread.native_id) == {other}
        assert os.sched_getaffinity(parked[1].thread.native_id) == ALLOWED
        assert os.sched_getaffinity(0) == ALLOWED
    finally:
        for p in parked:
            p.end()


CPUSET = "/sys/fs/cgroup/cpuset"


@needs_two
@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir(CPUSET), reason="needs root and the cgroup v1 cpuset hierarchy")
def test_a_cpuset_that_drops_the_runs_cpu_and_grows_back_is_followed(tmp_path):
    """A real cpuset: while the run lasts it drops the run's CPU (the kernel moves the
    threads to what is left), then grows back. The threads must follow it back, not stay
    where the kernel put them: left at the kernel's fallback they would keep the run's
    one CPU as their request, and the kernel honours that request when a cpuset grows."""
    child = (
        "import os, sys, threading\n"
        "sys.stdin.readline()\n"
        "gate = threading.Event()\n"
        "for _ in range(3): threading.Thread(target=gate.wait, daemon=True).start()\n"
        "from envdoctor.serve.onecpu import OneCpu\n"
        "def masks(): return sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir('/proc/self/task')})\n"
        "with OneCpu() as kept:\n"
        "    print(kept.cpu, flush=True)\n"
        "    sys.stdin.readline()\n"
        "print(masks(), flush=True)\n"
        "sys.stdin.readline()\n"
        "print(masks(), flush=True)\n"
    )
    group = os.path.join(CPUSET, f"envdoctor-test-{os.getpid()}")
    os.mkdir(group)
    proc = None
    try:
        both = ",".join(str(c) for c in sorted(ALLOWED)[:2])
        with open(os.path.join(CPUSET, "cpuset.mems")) as f:
            mems = f.read().strip()
        for name, value in (("cpuset.mems", mems), ("cpuset.cpus", both)):
            with open(os.path.join(group, name), "w") as f:
                f.write(value)
        proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(proc.pid))
        proc.stdin.write("go\n"); proc.stdin.flush()
        cpu = int(proc.stdout.readline())
        other = [c for c in sorted(ALLOWED)[:2] if c != cpu][0]
        with open(os.path.join(group, "cpuset.cpus"), "w") as f:
            f.write(str(other))  # drops the run's CPU while the run lasts
        proc.stdin.write("end the run\n"); proc.stdin.flush()
        assert proc.stdout.readline().strip() == f"[({other},)]"
        with open(os.path.join(group, "cpuset.cpus"), "w") as f:
            f.write(both)  # grows back
        proc.stdin.write("look again\n"); proc.stdin.flush()
        expected = "[(" + ", ".join(both.split(",")) + ")]"
        assert proc.stdout.readline().strip() == expected
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        os.rmdir(group)
