"""An idle `serve` sleeps: no thread wakes on a timer between runs (serve.mainbell and the
HTTP accept loop), yet a signal, a run or a connection wakes what must answer at once.

Each wake of a thread that slept a second cost ~2.4 ms of CPU on this project's 2-CPU
VM: the main thread's heartbeat once a second and the accept loop's poll twice a
second were ~0.4 % of a core, most of serve's 0.5 % budget, spent on nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from envdoctor import deadman
from envdoctor.serve import _wait_for_stop, mainbell


def _wakeups(pid: int) -> dict[int, int]:
    """Voluntary context switches of each thread of `pid`: how often each went to sleep."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                out[int(tid)] = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches:"))
        except (OSError, StopIteration):
            pass
    return out


def test_an_idle_daemon_wakes_no_thread_and_a_sigterm_still_stops_it_at_once(tmp_path):
    config = tmp_path / "envdoctor.toml"
    config.write_text('[serve]\nselect_comm = ["no-such-process-envdoctor"]\n')
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("ENVDOCTOR_CONFIG", None)
    proc = subprocess.Popen([sys.executable, "-m", "envdoctor", "serve", "--web.listen-address", "127.0.0.1:0",
                             "--interval", "600", "--config", str(config)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "listening" not in (line := proc.stderr.readline()):
            assert line, "serve ended before listening"
        time.sleep(3)  # its first run and the garbage collection after it are over
        before = _wakeups(proc.pid)
        time.sleep(3)
        after = _wakeups(proc.pid)
        woke = {tid: after[tid] - before.get(tid, 0) for tid in after}
        assert sum(woke.values()) <= 1, woke  # 3 s: the main thread alone woke 3 times, the accept loop 6
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - t0 < 1.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class _Scheduler:
    def __init__(self) -> None:
        self.is_busy = False
        self.on_run_start = None

    def busy(self) -> bool:
        return self.is_busy


def test_the_main_thread_beats_every_second_while_busy_and_seldom_while_idle(monkeypatch):
    """While a run goes on or a call is stuck (it may be a check spending CPU in Python),
    the deadman is beaten as before; idle, the CPU-time deadline does not move, and the
    main thread sleeps until a run starts (the scheduler rings it) or a signal comes."""
    beats: list[float] = []
    backstops: list[float] = []
    monkeypatch.setattr(deadman, "beat", lambda backstop: beats.append(time.monotonic()) or backstops.append(backstop))
    monkeypatch.setattr(deadman, "BEAT_SECONDS", 0.05)
    monkeypatch.setattr(mainbell, "IDLE_BEAT_SECONDS", 30.0)
    scheduler, stop = _Scheduler(), threading.Event()
    waiting = threading.Thread(target=_wait_for_stop, args=(stop, scheduler), daemon=True)
    waiting.start()
    time.sleep(0.5)
    assert len(beats) == 1  # the first beat, then asleep
    scheduler.is_busy = True
    scheduler.on_run_start()  # the scheduler rings as a run starts
    time.sleep(0.5)
    assert 5 <= len(beats) <= 12, len(beats)
    scheduler.is_busy = False
    time.sleep(0.2)
    quiet = len(beats)
    time.sleep(0.5)
    assert len(beats) == quiet
    stop.set()
    scheduler.on_run_start()
    waiting.join(5)
    assert not waiting.is_alive() and scheduler.on_run_start is None
    # the real-time backstop counts from each beat, and the next beat may be a whole wait away:
    # an idle daemon stopped (kill -STOP) for less than BACKSTOP_SECONDS goes on (helper-105)
    assert set(backstops) == {deadman.BACKSTOP_SECONDS + 0.05, deadman.BACKSTOP_SECONDS + 30.0}, backstops
