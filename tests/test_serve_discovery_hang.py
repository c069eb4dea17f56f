"""A read of one process's /proc files that never returns must not stop serve's runs.

On a node, reading /proc/N/maps or environ waits for the process's memory-map lock, and
a process in uninterruptible sleep (stuck in a driver or on a dead NFS mount, with a
thread waiting to map memory) can keep it waiting for good; `ps` hangs on such nodes.
Discovery read those files on the scheduler's thread, so one such process stopped every
run of the daemon for good.

The kernel's D state has no stand-in on this machine (it needs a filesystem or a driver
that stops answering), so the one read is made to wait here, in discovery's reader of
maps, for the one process under test; everything else is real: real processes, the
real /proc, the daemon's own scheduler and watchdog.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from envdoctor.serve import Daemon, Options, discovery

TIMEOUT = 1.0  # the config's timeout, which bounds discovery too


def _orphan_python(tag: str, seconds: int = 60) -> int:
    """A python process (discovery reads the maps of those) that is not our child."""
    out = subprocess.run(["sh", "-c", f"{sys.executable} -c 'import time; time.sleep({seconds})' > /dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True, env={**os.environ, tag: "1"})
    return int(out.stdout.strip())


@pytest.fixture
def daemon(tmp_path):
    tag = f"ENVDOCTOR_HANG_{os.getpid()}"
    cfg = tmp_path / "envdoctor.toml"
    cfg.write_text(f"timeout = {TIMEOUT}\n[serve]\nselect_env = [\"{tag}\"]\n")
    pids = [_orphan_python(tag) for _ in range(4)]  # more than DISCOVERY_ATTEMPTS
    try:
        yield Daemon(Options(once=True, config_file=str(cfg))).scheduler, pids
    finally:
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def test_a_process_whose_maps_read_hangs_is_left_out_and_the_runs_go_on(daemon, monkeypatch, capfd):
    scheduler, (stuck_pid, other_pid, *_) = daemon
    release = threading.Event()
    real = discovery._torch_maps

    def maps_of(procfs, pid):
        if pid == stuck_pid:
            release.wait(60)  # as a read waiting for a memory-map lock held in D state
        return real(procfs, pid)

    monkeypatch.setattr(discovery, "_torch_maps", maps_of)
    try:
        t0 = time.monotonic()
        snap = scheduler.run_once()
        first = time.monotonic() - t0
        # the run ends (one timeout spent on the read, not forever), with the other process in it
        assert first < TIMEOUT + 10, first
        assert f"pid:{other_pid}" in snap.targets
        assert f"pid:{stuck_pid}" not in snap.targets
        # /healthz names the stuck read by the process it hung on
        assert any(name.startswith(f"discovery:pid:{stuck_pid} for ") for name in scheduler.stuck_calls()), scheduler.stuck_calls()
        err = capfd.readouterr().err
        assert "process not examined: a read of its /proc files hung" in err and f"target=pid:{stuck_pid}" in err, err

        # the next run does not wait on it again: it is left out while that read is stuck
        t0 = time.monotonic()
        snap = scheduler.run_once()
        assert time.monotonic() - t0 < TIMEOUT, "the second run waited on the hung process again"
        assert f"pid:{stuck_pid}" not in snap.targets and f"pid:{other_pid}" in snap.targets
    finally:
        release.set()

    # once the read returns, the process is examined again
    deadline = time.monotonic() + 10
    while scheduler.stuck_calls() and time.monotonic() < deadline:
        time.sleep(0.05)
    snap = scheduler.run_once()
    assert f"pid:{stuck_pid}" in snap.targets and f"pid:{other_pid}" in snap.targets
    assert not scheduler.stuck_calls()
    assert "process examined again" in capfd.readouterr().err


def test_discovery_that_hangs_on_process_after_process_fails_the_run_with_the_reason(daemon, monkeypatch):
    """Every python process hangs its read (4 here, more than the attempts): the run gives
    up after DISCOVERY_ATTEMPTS and says which processes; the daemon lives on (its loop logs
    a failed run and tries again at the next interval)."""
    scheduler, _ = daemon
    release = threading.Event()
    real = discovery._torch_maps

    def maps_of(procfs, pid):
        release.wait(60)
        return real(procfs, pid)

    monkeypatch.setattr(discovery, "_torch_maps", maps_of)
    try:
        t0 = time.monotonic()
        with pytest.raises(discovery.DiscoveryFailed, match="hung this run: pids"):
            scheduler.run_once()
        from envdoctor.serve.scheduler import DISCOVERY_ATTEMPTS

        assert time.monotonic() - t0 < DISCOVERY_ATTEMPTS * TIMEOUT + 10
        assert len([n for n in scheduler.stuck_calls() if n.startswith("discovery:pid:")]) == DISCOVERY_ATTEMPTS
    finally:
        release.set()
