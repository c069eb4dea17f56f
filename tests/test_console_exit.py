"""The `envdoctor` command leaves with os._exit after main() (cli.console_main): the
same exit codes, complete output on stdout and in -o files, messages on stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("envdoctor")


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    if not SCRIPT.exists():
        pytest.skip(f"no envdoctor console script beside {sys.executable} (not installed)")
    env = dict(os.environ)
    env.pop("ENVDOCTOR_CONFIG", None)
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120, **kw)


def test_exit_codes_and_output_survive_the_fast_exit(tmp_path):
    bad = run("check", "--fail-on", "bogus", cwd=tmp_path)
    assert bad.returncode == 2 and "--fail-on must be warn or fail" in bad.stderr
    ok = run("check", "--only", "shm.size", "-f", "json", cwd=tmp_path)
    assert ok.returncode in (0, 1), ok.stderr
    assert [r["check"] for r in json.loads(ok.stdout)["results"]] == ["shm.size"]
    out = tmp_path / "report.json"
    written = run("check", "--only", "shm.size", "-f", "json", "-o", str(out), cwd=tmp_path)
    assert written.returncode == ok.returncode and written.stdout == ""
    assert json.loads(out.read_text())["results"][0]["check"] == "shm.size"
    listing = run("checks", cwd=tmp_path)
    assert listing.returncode == 0 and "shm.size" in listing.stdout


def test_a_closed_pipe_ends_quietly(tmp_path):
    if not SCRIPT.exists():
        pytest.skip("not installed")
    proc = subprocess.Popen([str(SCRIPT), "check", "-f", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path)
    proc.stdout.read(5)
    proc.stdout.close()  # the reader went away, as `envdoctor check | head -c 5` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (0, 1, 120, -13) and "Traceback" not in err


def test_started_with_stdout_or_stderr_closed_there_is_no_traceback(tmp_path):
    """`>&-`: Python has no sys.stdout at all (None). A command that writes nothing there
    (serve --once) exits 0, check exits 74 as for any unwritable report, and a closed
    stderr costs only the messages."""
    if not SCRIPT.exists():
        pytest.skip(f"no envdoctor console script beside {sys.executable} (not installed)")
    env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
    env["ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    for args, closed_fd, code in ((["serve", "--once"], 1, 0), (["check", "--only", "shm.size"], 1, 74),
                                  (["check", "--only", "shm.size"], 2, 0)):
        proc = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=120, preexec_fn=lambda fd=closed_fd: os.close(fd))
        assert proc.returncode == code, (args, closed_fd, proc.returncode, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
