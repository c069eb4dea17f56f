"""Issue 8, family 2: whatever blocks, the run ends within --timeout plus a small
constant, and nothing it started outlives it. The blockers are real: a torch probe
that hangs (an interpreter stuck importing), one that exits but leaves a child holding
its pipes, a plug-in whose import reads a FIFO nobody writes, a plug-in check that
sleeps, a FIFO where the target's /proc/N/environ should be. Signals (SIGTERM,
SIGINT) and check timeouts must take the probe's whole process group with them.

Tests assert bounds, not speed: a subprocess is given --timeout plus SLACK (a loaded
CI machine's margin); a hang overshoots any slack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envdoctor.probe import ProbeError, run_probe
from helpers import cli

SLACK = 20.0
QUIET = {"ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1", "ENVDOCTOR_NO_CACHE": "1"}


def _fake_python(tmp_path: Path, body: str) -> tuple[Path, Path]:
    """A 'python' whose run records its pid and its child's in pids.txt, then does `body`."""
    pids = tmp_path / "pids.txt"
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\n"
                    "sleep 300 &\n"
                    f"echo $$ $! > {pids}.part && mv {pids}.part {pids}\n"
                    f"{body}\n")
    fake.chmod(0o755)
    return fake, pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_for(path: Path, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _assert_dead(pids_file: Path) -> None:
    pids = [int(p) for p in pids_file.read_text().split()]
    deadline = time.monotonic() + 5  # the kernel may take a moment to tear down a killed group
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], f"still running: {pids}"


def test_a_probe_that_exits_but_leaves_a_child_on_its_pipes_is_not_waited_on(tmp_path):
    """It exited: its answer (none) is read at once, not when the child lets go of the pipe
    (60 s later); the child, in the probe's group, is killed."""
    fake, pids = _fake_python(tmp_path, "echo 'it broke' >&2; exit 3")
    started = time.monotonic()
    with pytest.raises(ProbeError, match="exited with status 3") as caught:
        run_probe(str(fake), timeout=30, use_cache=False)
    assert "did not finish" not in str(caught.value) and "it broke" in str(caught.value)
    assert time.monotonic() - started < 30  # not the probe's limit: it ended when the probe did
    _assert_dead(pids)


def test_timeout_bounds_the_torch_checks_and_the_probe(tmp_path):
    """--timeout 2: the torch checks (90 s by default) and the probe (60 s) both follow it."""
    fake, pids = _fake_python(tmp_path, "sleep 300")
    # (onnx.opset is left out: its own import of onnx may not fit in 2 s on a loaded machine;
    # test_hardening_rows proves it survives a failing probe)
    proc = cli("check", "--timeout", "2", "--skip", "onnx.opset", "--python", str(fake), "-f", "json", env=QUIET,
               timeout=2 + SLACK)
    assert proc.returncode == 1, proc.stderr
    rows = {r["check"]: r for r in json.loads(proc.stdout)["results"]}
    for check in ("torch.cudnn", "cuda.runtime"):
        assert rows[check]["status"] == "error"
        assert "did not finish within 1.8 s (killed)" in rows[check]["summary"], rows[check]["summary"]
    _assert_dead(pids)


def test_a_check_timeout_shorter_than_the_probe_kills_its_group_when_the_run_ends(tmp_path):
    """torch.cudnn given 1 s while the probe keeps its 60 s: the row says timed out, and the
    probe and its child do not outlive envdoctor."""
    fake, pids = _fake_python(tmp_path, "sleep 300")
    proc = cli("check", "--only", "torch.cudnn", "--python", str(fake), "-f", "json",
               env={**QUIET, "ENVDOCTOR_CHECK__TORCH_CUDNN__TIMEOUT": "1"}, timeout=1 + SLACK)
    row = json.loads(proc.stdout)["results"][0]
    assert row["status"] == "error" and "timed out after 1 s" in row["summary"], row["summary"]
    _assert_dead(pids)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130),
                                       (signal.SIGHUP, 129),  # the terminal or ssh session went away
                                       (signal.SIGUSR1, 138), (signal.SIGUSR2, 140),  # their default ends it too
                                       (signal.SIGQUIT, -signal.SIGQUIT)])  # Ctrl-\: still dies by it
def test_a_signal_kills_the_probes_whole_group(tmp_path, sig, code):
    fake, pids = _fake_python(tmp_path, "sleep 300")
    env = {**os.environ, **QUIET, "PYTHONFAULTHANDLER": "1"}  # SIGABRT dumps every thread's stack
    env.pop("ENVDOCTOR_CONFIG", None)
    # SIGINT at its default, as in a terminal: a suite started in the background (`pytest &`
    # in a script) has SIGINT ignored, every child inherits that, and a program that finds
    # SIGINT ignored at start rightly keeps ignoring it (Python then installs no handler).
    proc = subprocess.Popen([sys.executable, "-m", "envdoctor", "check", "--only", "torch.cudnn", "--python", str(fake)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_terminal_like)
    try:
        _wait_for(pids)
        proc.send_signal(sig)
        try:
            _, err = proc.communicate(timeout=SLACK)
        except subprocess.TimeoutExpired:  # say where it was stuck, not only that it was
            proc.send_signal(signal.SIGABRT)
            _, err = proc.communicate(timeout=SLACK)
            pytest.fail(f"still running {SLACK:g} s after {sig.name}; its threads:\n{err[-8000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err
    _assert_dead(pids)


def _terminal_like() -> None:
    """The stop signals at their defaults, as in a terminal, and no core file from SIGQUIT."""
    import resource

    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _blocking_plugin(tmp_path: Path) -> tuple[Path, Path]:
    site = tmp_path / "site"
    (site / "blockplug-1.0.dist-info").mkdir(parents=True)
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)
    (site / "blockplug.py").write_text(f"open({str(fifo)!r}).read()  # blocks: nobody ever writes\n")
    (site / "blockplug-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: blockplug\nVersion: 1.0\n")
    (site / "blockplug-1.0.dist-info" / "entry_points.txt").write_text(
        "[envdoctor.checks]\nblock.import = blockplug:CHECK\n[envdoctor.exporters]\nblockfmt = blockplug:EXPORTER\n")
    return site, fifo


@pytest.mark.parametrize("command", [["check", "-f", "json", "--skip", "torch.pin_memory"], ["checks"],
                                     ["check", "--only", "shm.size", "-f", "blockfmt"]])
def test_a_plugin_whose_import_blocks_does_not_hang_anything(tmp_path, command):
    site, _ = _blocking_plugin(tmp_path)
    proc = cli(*command, env={"PYTHONPATH": str(site)}, timeout=5 + 15 + SLACK)
    assert "Traceback" not in proc.stderr
    if command[0] == "checks":
        assert proc.returncode == 0 and "block.import" in proc.stdout and "did not finish within 5 s" in proc.stdout
    elif "blockfmt" in command:
        assert proc.returncode == 2 and "blockfmt" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    else:
        rows = {r["check"]: r for r in json.loads(proc.stdout)["results"]}
        assert rows["block.import"]["status"] == "error" and "blockplug.py" in rows["block.import"]["summary"]
        assert rows["shm.size"]["status"] in ("ok", "warn", "fail")


def test_everything_blocking_at_once_still_ends_within_the_bound(tmp_path, plugin_path):
    """A hanging probe, a plug-in import reading a FIFO, a plug-in check that sleeps, and a
    FIFO as the target's environ, together: every check gets its row within
    --timeout + the plug-in import deadline + SLACK."""
    from test_fault_matrix import PID, args, build_tree

    roots = build_tree(tmp_path / "tree")
    environ = roots["procfs"] / str(PID) / "environ"
    environ.unlink()
    os.mkfifo(environ)
    site, _ = _blocking_plugin(tmp_path)
    fake, pids = _fake_python(tmp_path, "sleep 300")
    config = tmp_path / "envdoctor.toml"
    config.write_text('[check."example.sleepy"]\nenabled = true\nseconds = 300.0\n')
    env = {"PYTHONPATH": f"{site}{os.pathsep}{plugin_path}", "ENVDOCTOR_NO_CACHE": "1"}
    started = time.monotonic()
    proc = cli(*args(roots), "--python", str(fake), "--config", str(config), env=env, timeout=2 + 5 + SLACK)
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr
    rows = {r["check"]: r for r in json.loads(proc.stdout)["results"]}
    assert {"block.import", "example.sleepy", "cpu.threads", "torch.cudnn", "dist.env"} <= set(rows)
    assert "timed out" in rows["example.sleepy"]["summary"]
    assert "did not finish within 5 s" in rows["block.import"]["summary"]
    print(f"everything blocking: the run took {took:.2f} s (--timeout 2, plug-in import deadline 5 s)")
    _assert_dead(pids)


def test_a_probe_started_after_the_kill_order_kills_itself(tmp_path):
    """The race a loaded CI machine hit: SIGTERM lands while a worker thread has started a
    probe but not yet registered it. kill_running() leaves a flag that such a late
    registration obeys: the probe is killed at once, and so is what it started."""
    fake, pids = _fake_python(tmp_path, "sleep 300")
    script = ("import sys\n"
              "from envdoctor import probe\n"
              "probe.kill_running()\n"
              "try:\n"
              f"    probe.run_probe({str(fake)!r}, timeout=60, use_cache=False)\n"
              "except probe.ProbeError as exc:\n"
              "    print(exc)\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=SLACK + 10)
    assert "killed by SIGKILL" in proc.stdout, (proc.stdout, proc.stderr)
    assert time.monotonic() - started < 30  # not the probe's 60 s
    if pids.exists():  # killed before its shell got as far as writing them: nothing to outlive it
        _assert_dead(pids)


def test_a_signal_also_ends_children_nobody_registered(tmp_path):
    """The CLI's signal path sweeps every child the process has, with its group: a probe
    in its own session that no registry knew of does not outlive envdoctor."""
    fake, pids = _fake_python(tmp_path, "sleep 300")
    script = ("import subprocess, time\n"
              "from envdoctor import cli\n"
              f"subprocess.Popen([{str(fake)!r}], start_new_session=True)\n"
              f"subprocess.Popen(['sleep', '300'])\n"
              "import os\n"
              "while not os.path.exists(" + repr(str(pids)) + "):\n"
              "    time.sleep(0.02)\n"
              "cli._kill_everything_started()\n"
              "time.sleep(0.5)\n"
              "from envdoctor.forked import children_of\n"
              "print('left', len([p for p in children_of(os.getpid()) "
              "if open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[0] not in 'ZX']))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=SLACK + 10)
    assert "left 0" in proc.stdout, (proc.stdout, proc.stderr)
    _assert_dead(pids)
