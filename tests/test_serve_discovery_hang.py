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

from envdoctor.serve import Daemon, Options, bounded_discovery, discovery

TIMEOUT = 1.0  # the config's timeout, which bounds discovery too


def _orphan_python(tag: str, seconds: int = 60) -> int:
    """A python process (discovery reads the maps of those) that is not our child."""
    out = subprocess.run(["sh", "-c", f"{sys.executable} -c 'import time; time.sleep({seconds})' > /dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True, env={**os.environ, tag: "1"})
    return int(out.stdout.strip())


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def _wait_until_nothing_is_stuck(scheduler, seconds: float = 10.0) -> None:
    """Until the reads released by a test have returned (their calls leave the stuck list)."""
    deadline = time.monotonic() + seconds
    while scheduler.stuck_calls() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def daemon(tmp_path):
    tag = f"ENVDOCTOR_HANG_{os.getpid()}"
    cfg = tmp_path / "envdoctor.toml"
    cfg.write_text(f"timeout = {TIMEOUT}\n[serve]\nselect_env = [\"{tag}\"]\n")
    pids = [_orphan_python(tag) for _ in range(4)]  # more than DISCOVERY_ATTEMPTS
    try:
        yield Daemon(Options(once=True, config_file=str(cfg))).scheduler, pids
    finally:
        _kill(pids)


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
        assert b"\nenvdoctor_targets_hung 1.0\n" in snap.metrics  # what EnvdoctorProcessHung alerts on

        # the next run does not wait on it again: it is left out while that read is stuck
        t0 = time.monotonic()
        snap = scheduler.run_once()
        assert time.monotonic() - t0 < TIMEOUT, "the second run waited on the hung process again"
        assert f"pid:{stuck_pid}" not in snap.targets and f"pid:{other_pid}" in snap.targets
    finally:
        release.set()

    # once the read returns, the process is examined again
    _wait_until_nothing_is_stuck(scheduler)
    snap = scheduler.run_once()
    assert f"pid:{stuck_pid}" in snap.targets and f"pid:{other_pid}" in snap.targets
    assert not scheduler.stuck_calls() and b"\nenvdoctor_targets_hung 0.0\n" in snap.metrics
    err = capfd.readouterr().err  # never examined before: it appears, in one line (helper-104)
    assert f'msg="target appeared" target=pid:{stuck_pid}' in err, err
    assert f'examined again: the hung read of its /proc files returned" target=pid:{stuck_pid}' not in err, err


def test_discovery_that_hangs_on_process_after_process_fails_the_run_with_the_reason(daemon, monkeypatch):
    """Every python process hangs its read (4 here, more than the attempts): the run gives
    up after bounded_discovery.ATTEMPTS and says which processes; the daemon lives on (its loop logs
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
        with pytest.raises(discovery.DiscoveryFailed, match=r"hung in one run \(pids"):
            scheduler.run_once()
        assert time.monotonic() - t0 < bounded_discovery.ATTEMPTS * TIMEOUT + 10
        assert len([n for n in scheduler.stuck_calls() if n.startswith("discovery:pid:")]) == bounded_discovery.ATTEMPTS
    finally:
        release.set()


def test_a_known_target_that_exits_while_its_read_hangs_is_said_gone(daemon, monkeypatch, capfd):
    """helper-99: the hung target was dropped from the known ones, so its exit was never
    logged ("target gone"), and a survivor was logged as appearing a second time."""
    scheduler, (stuck_pid, survivor, *_) = daemon
    scheduler.run_once()
    release = threading.Event()
    real = discovery._torch_maps

    def maps_of(procfs, pid):
        if pid in (stuck_pid, survivor):
            release.wait(60)
        return real(procfs, pid)

    monkeypatch.setattr(discovery, "_torch_maps", maps_of)
    try:
        snap = scheduler.run_once()
        assert f"pid:{stuck_pid}" not in snap.targets and f"pid:{survivor}" not in snap.targets
        assert scheduler.history.latest(f"pid:{survivor}") is not None  # left out, its memory history kept (helper-101)
        os.kill(stuck_pid, 9)
    finally:
        release.set()
    _wait_until_nothing_is_stuck(scheduler)
    capfd.readouterr()
    snap = scheduler.run_once()
    err = capfd.readouterr().err
    assert f"pid:{survivor}" in snap.targets and f"pid:{stuck_pid}" not in snap.targets
    assert f'msg="target gone" target=pid:{stuck_pid}' in err, err
    assert f'examined again: the hung read of its /proc files returned" target=pid:{stuck_pid}' not in err, err  # helper-102
    assert f'msg="target appeared" target=pid:{survivor}' not in err, err  # it never went
    assert f'msg="process examined again: the hung read of its /proc files returned" target=pid:{survivor}' in err, err


def test_a_scan_stuck_before_any_process_is_named_and_not_started_again(daemon, monkeypatch):
    """helper-99: stuck before any pid (listing /proc), each run started one more scan that
    hung beside the others (a thread a run, until the watchdog refused everything)."""
    scheduler, _ = daemon
    release = threading.Event()
    real = discovery._pid_name
    monkeypatch.setattr(discovery, "_pid_name", lambda name: release.wait(60) and real(name))
    try:
        with pytest.raises(discovery.DiscoveryFailed, match="stuck listing /proc"):
            scheduler.run_once()
        assert any(n.startswith("discovery:listing /proc for ") for n in scheduler.stuck_calls()), scheduler.stuck_calls()
        threads = scheduler.watchdog.threads()
        for _ in range(3):
            t0 = time.monotonic()
            with pytest.raises(discovery.DiscoveryFailed, match="still stuck listing /proc"):
                scheduler.run_once()
            assert time.monotonic() - t0 < TIMEOUT  # not waited on again
        assert scheduler.watchdog.threads() == threads  # no thread more per run
    finally:
        release.set()
    _wait_until_nothing_is_stuck(scheduler)
    assert len(scheduler.run_once().targets) >= 3  # the node and the processes again


def test_a_hung_announce_directory_costs_the_announcements_not_the_run(daemon, monkeypatch):
    """helper-100: an announce directory on a dead mount stopped every run, the node's too,
    though announcements are an optional source any job can write."""
    scheduler, pids = daemon
    release = threading.Event()
    from envdoctor import announce

    real = announce.announced_pids
    monkeypatch.setattr(announce, "announced_pids", lambda *a: release.wait(60) and real(*a))
    try:
        for _ in range(3):
            t0 = time.monotonic()
            snap = scheduler.run_once()
            assert time.monotonic() - t0 < TIMEOUT + 5
            assert "node" in snap.targets and all(f"pid:{p}" in snap.targets for p in pids)
        stuck = [n for n in scheduler.stuck_calls() if n.startswith("discovery.announcements:")]
        assert len(stuck) == 1, scheduler.stuck_calls()  # the one stuck read, not one a run
    finally:
        release.set()


def test_a_slow_scan_is_not_blamed_on_a_process(daemon, monkeypatch):
    """helper-99: a scan that only took longer than the timeout (every maps read slow, none
    hung) left out whichever process it was reading at the deadline, as in D state. It
    fails its run, blames nobody, and the scans go on once it has returned."""
    scheduler, pids = daemon
    real = discovery._torch_maps
    slow = [True]

    def maps_of(procfs, pid):
        if pid in pids and slow[0]:
            time.sleep(TIMEOUT * 0.45)  # four of these: the scan outlasts its timeout (and grace), no one read is long
        return real(procfs, pid)

    monkeypatch.setattr(discovery, "_torch_maps", maps_of)
    with pytest.raises(discovery.DiscoveryFailed, match="did not return within"):
        scheduler.run_once()
    assert not scheduler._discovery.hung
    slow[0] = False
    _wait_until_nothing_is_stuck(scheduler)
    assert all(f"pid:{p}" in scheduler.run_once().targets for p in pids)


def test_a_read_that_hangs_late_in_a_slow_scan_is_named_by_the_next_run(daemon, monkeypatch):
    """helper-100: one slow read, then one that never returns after half the timeout had
    gone: every run was judged slow, started one more scan (a thread a run) and never
    named the process. The next run finds the old scan stuck on it and leaves it out."""
    scheduler, pids = daemon
    slow_pid, hung_pid = sorted(pids)[:2]
    release = threading.Event()
    real = discovery._torch_maps

    def maps_of(procfs, pid):
        if pid == slow_pid:
            time.sleep(TIMEOUT * 1.2)  # the hung read begins too late in the scan to be blamed by its end
        if pid == hung_pid:
            release.wait(60)
        return real(procfs, pid)

    monkeypatch.setattr(discovery, "_torch_maps", maps_of)
    try:
        with pytest.raises(discovery.DiscoveryFailed, match="did not return within"):
            scheduler.run_once()
        time.sleep(TIMEOUT * 0.6)
        monkeypatch.setattr(discovery, "_torch_maps", lambda procfs, pid: release.wait(60) and real(procfs, pid)
                            if pid == hung_pid else real(procfs, pid))
        snap = scheduler.run_once()
        assert f"pid:{hung_pid}" not in snap.targets and f"pid:{slow_pid}" in snap.targets
        assert scheduler._discovery.hung.keys() == {hung_pid}
        assert f"discovery:pid:{hung_pid}" in " ".join(scheduler.stuck_calls())
    finally:
        release.set()


def test_at_most_max_hung_processes_are_left_out_at_once(monkeypatch):
    """Each process left out holds a worker thread; the watchdog starts no call at all past
    64 stuck ones (helper-99: after 64 hung processes every run failed, the node's too, with
    the watchdog's words). Past MAX_HUNG, no scan starts and the reason names the pids."""
    from envdoctor.watchdog import Watchdog

    monkeypatch.setattr(bounded_discovery, "MAX_HUNG", 4)
    finder = bounded_discovery.BoundedDiscovery(Watchdog(name="test-maxhung"))
    release = threading.Event()

    def scan(leave_out, progress):
        pid = next(p for p in range(100, 200) if p not in leave_out)
        progress(pid)
        release.wait(60)
        return discovery.Found()

    try:
        for _ in range(2):
            with pytest.raises(discovery.DiscoveryFailed):
                finder.find(scan, 0.2)
        assert len(finder.hung) == 4
        t0 = time.monotonic()
        with pytest.raises(discovery.DiscoveryFailed, match=r"4 scans are stuck on processes' /proc files \(pids 100, 101, 102, 103\)"):
            finder.find(scan, 0.2)
        assert time.monotonic() - t0 < 0.2
    finally:
        release.set()


def test_a_process_whose_read_returned_is_examined_again_while_the_old_scan_waits_on_another(daemon, monkeypatch, capfd):
    """helper-101: P and Q both hung a scan; P's read returned and that scan went on to wait
    on Q. P stayed left out, counted and named as hung for as long as Q stayed stuck."""
    scheduler, (p_pid, q_pid, *_) = daemon
    events = {p_pid: threading.Event(), q_pid: threading.Event()}
    real = discovery._torch_maps

    def maps_of(procfs, pid):
        if pid in events:
            events[pid].wait(60)
        return real(procfs, pid)

    monkeypatch.setattr(discovery, "_torch_maps", maps_of)
    try:
        scheduler.run_once()
        assert scheduler._discovery.hung.keys() == {p_pid, q_pid}
        events[p_pid].set()  # P answers; the scan that hung on it now waits on Q
        time.sleep(TIMEOUT)  # past BLAME_SHARE of the timeout on Q
        snap = scheduler.run_once()
        assert f"pid:{p_pid}" in snap.targets and f"pid:{q_pid}" not in snap.targets
        assert scheduler._discovery.hung.keys() == {q_pid}
        assert b"\nenvdoctor_targets_hung 1.0\n" in snap.metrics
        assert not any(f"pid:{p_pid}" in n for n in scheduler.stuck_calls()), scheduler.stuck_calls()
        assert f'msg="target appeared" target=pid:{p_pid}' in capfd.readouterr().err  # first examined now
    finally:
        for e in events.values():
            e.set()


def test_a_hung_announce_directory_keeps_the_jobs_announced_before(tmp_path, monkeypatch, capfd):
    """helper-101: with the announce directory hung, a job found only by its announcement was
    logged gone while it ran, its series dropped and its memory history thrown away."""
    import json

    from envdoctor import announce

    directory = tmp_path / "announced"
    directory.mkdir()
    monkeypatch.setenv("ENVDOCTOR_ANNOUNCE_DIR", str(directory))
    out = subprocess.run(["sh", "-c", "sleep 60 > /dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True)
    pid = int(out.stdout.strip())
    try:
        (directory / f"{pid}.json").write_text(json.dumps({"pid": pid, "start_ticks": announce.start_ticks("/proc", pid)}))
        cfg = tmp_path / "envdoctor.toml"
        cfg.write_text(f"timeout = {TIMEOUT}\n")
        scheduler = Daemon(Options(once=True, config_file=str(cfg))).scheduler
        assert f"pid:{pid}" in scheduler.run_once().targets
        release = threading.Event()
        real = announce.announced_pids
        monkeypatch.setattr(announce, "announced_pids", lambda *a: release.wait(60) and real(*a))
        try:
            capfd.readouterr()
            for _ in range(3):
                snap = scheduler.run_once()
                assert f"pid:{pid}" in snap.targets
            err = capfd.readouterr().err
            # (other tests' torch processes come and go beside it: only this job's lines count)
            assert f'msg="target gone" target=pid:{pid}' not in err and err.count("announcements not read") == 1, err
            assert scheduler.history.latest(f"pid:{pid}") is not None  # its history is kept
        finally:
            release.set()
        os.kill(pid, 9)
        time.sleep(0.2)
        _wait_until_nothing_is_stuck(scheduler)
        assert f"pid:{pid}" not in scheduler.run_once().targets  # gone once it is gone
    finally:
        _kill([pid])


def test_a_slow_scan_is_named_slow_not_after_a_process():
    """helper-101: /healthz named a merely slow scan `discovery:pid:N`, as a hung process."""
    progress = bounded_discovery.Progress(timeout=10.0)
    progress(1234)
    assert progress.where() == "slow scan" and progress.stuck_on() is None
    assert progress.started <= progress.since
    progress.since -= 6.0  # its read of 1234 has lasted over half the timeout
    assert progress.where() == "pid:1234" and progress.stuck_on() == 1234
    progress("listing /proc")
    assert progress.where() == "listing /proc" and not progress.stuck_in_step()


def test_a_read_that_outlasts_every_scan_is_said_once_not_every_run(daemon, monkeypatch, capfd):
    """helper-102: a read that takes longer than the timeout but returns was said hung and
    "examined again" every run (two lines a run), though the process was never examined."""
    scheduler, (slow_pid, *_) = daemon
    real = discovery._torch_maps

    def maps_of(procfs, pid):
        if pid == slow_pid:
            time.sleep(TIMEOUT * 2)  # blamed within each scan: it outlasts half the timeout
        return real(procfs, pid)

    monkeypatch.setattr(discovery, "_torch_maps", maps_of)
    capfd.readouterr()
    for _ in range(4):
        assert f"pid:{slow_pid}" not in scheduler.run_once().targets
        time.sleep(TIMEOUT * 0.5)
    err = capfd.readouterr().err
    assert err.count(f'a read of its /proc files hung" target=pid:{slow_pid}') == 1, err
    assert f'examined again: the hung read of its /proc files returned" target=pid:{slow_pid}' not in err, err
    monkeypatch.setattr(discovery, "_torch_maps", real)  # it answers in time again
    _wait_until_nothing_is_stuck(scheduler)
    assert f"pid:{slow_pid}" in scheduler.run_once().targets
    err = capfd.readouterr().err
    assert f'msg="target appeared" target=pid:{slow_pid}' in err, err
    assert f'examined again: the hung read of its /proc files returned" target=pid:{slow_pid}' not in err, err


def test_a_slow_announce_directory_costs_neither_the_scan_nor_later_announcements(tmp_path, monkeypatch):
    """helper-102: a directory that answers, but after the announcements' bound: its late
    answers were thrown away (a job announced later was never found), and its wait came
    out of the scan's own time, so a scan that fit its timeout failed every run."""
    import json

    from envdoctor import announce

    directory = tmp_path / "announced"
    directory.mkdir()
    monkeypatch.setenv("ENVDOCTOR_ANNOUNCE_DIR", str(directory))
    jobs = []
    try:
        def announced_job() -> int:
            out = subprocess.run(["sh", "-c", "sleep 60 > /dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True)
            pid = int(out.stdout.strip())
            jobs.append(pid)
            (directory / f"{pid}.json").write_text(json.dumps({"pid": pid, "start_ticks": announce.start_ticks("/proc", pid)}))
            return pid

        first = announced_job()
        cfg = tmp_path / "envdoctor.toml"
        cfg.write_text(f"timeout = {TIMEOUT}\n")
        scheduler = Daemon(Options(once=True, config_file=str(cfg))).scheduler
        assert f"pid:{first}" in scheduler.run_once().targets
        real = announce.announced_pids
        monkeypatch.setattr(announce, "announced_pids", lambda *a: time.sleep(TIMEOUT * 0.6) or real(*a))
        later = announced_job()
        found_later = False
        for _ in range(4):
            targets = scheduler.run_once().targets  # each run fits: the wait is the announcements' own
            assert f"pid:{first}" in targets
            found_later = found_later or f"pid:{later}" in targets
            time.sleep(TIMEOUT * 0.3)  # the late answer comes in meanwhile
        assert found_later
    finally:
        _kill(jobs)


def test_a_process_that_hung_at_first_sight_and_is_no_target_is_closed_with_one_line(daemon, monkeypatch, capfd):
    """helper-103: a process said hung that was never a target (a daemon started beside a job
    already in D state; a python process that is not a job) got no closing line at all."""
    scheduler, pids = daemon
    out = subprocess.run(["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(60)' > /dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True)  # python, not selected: not a target
    other = int(out.stdout.strip())
    release = threading.Event()
    real = discovery._torch_maps

    def maps_of(procfs, pid):
        if pid == other:
            release.wait(60)
        return real(procfs, pid)

    monkeypatch.setattr(discovery, "_torch_maps", maps_of)
    try:
        scheduler.run_once()
        assert scheduler._discovery.hung.keys() == {other}
        name = next(n for n in scheduler.stuck_calls() if n.startswith(f"discovery:pid:{other} for "))
        assert int(name.split(" for ")[1].split()[0]) <= 2  # the time on this process, not the scan's age
    finally:
        release.set()
        _wait_until_nothing_is_stuck(scheduler)
        scheduler.run_once()
        os.kill(other, 9)
    assert f'msg="process no longer hung: the read of its /proc files returned, and it is not a target (now)" target=pid:{other}' \
        in capfd.readouterr().err
