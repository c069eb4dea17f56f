"""The `envdoctor` command leaves with os._exit after main() (cli.console_main): the
same exit codes, complete output on stdout and in -o files, messages on stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("envdoctor")


def run(*args: str, env_extra: dict | None = None, **kw) -> subprocess.CompletedProcess:
    if not SCRIPT.exists():
        pytest.skip(f"no envdoctor console script beside {sys.executable} (not installed)")
    env = dict(os.environ)
    env.pop("ENVDOCTOR_CONFIG", None)
    env.update(env_extra or {})
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


_BUSY_IN_ORT = '''
from envdoctor.check import Check
from envdoctor.onnxfacts import tiny_model


def run(ctx):
    import onnxruntime as ort
    model = tiny_model(13, 7)
    while True:  # a thread that never leaves onnxruntime's C++ for long
        ort.InferenceSession(model, providers=["CPUExecutionProvider"])


CHECK = Check(id="ortloop.busy", title="keeps a thread inside onnxruntime", run=run)
'''


def test_python_m_survives_a_check_stuck_inside_onnxruntime(tmp_path):
    """`python -m envdoctor` with a check still inside onnxruntime at exit: the report and
    the exit code, not SIGABRT ("terminate called without an active exception") from
    onnxruntime's static destructors running under the stuck thread (6 of 6 runs before)."""
    pytest.importorskip("onnxruntime", reason="needs onnxruntime (the onnx extra, installed by scripts/test.sh)")
    from helpers import cli

    site = tmp_path / "site"
    (site / "ortloop-1.0.dist-info").mkdir(parents=True)
    (site / "ortloop.py").write_text(_BUSY_IN_ORT)
    (site / "ortloop-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: ortloop\nVersion: 1.0\n")
    (site / "ortloop-1.0.dist-info" / "entry_points.txt").write_text("[envdoctor.checks]\nortloop.busy = ortloop:CHECK\n")
    proc = cli("check", "--only", "ortloop.busy", "--timeout", "1", "-f", "json",
               env={"PYTHONPATH": str(site), "ENVDOCTOR_NO_CACHE": "1"}, cwd=tmp_path, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "terminate called" not in proc.stderr
    row = json.loads(proc.stdout)["results"][0]
    assert row["check"] == "ortloop.busy" and row["status"] == "error" and "timed out" in row["summary"]


def test_the_fast_exit_still_kills_a_probe_whose_check_timed_out(tmp_path):
    """os._exit skips atexit, where the probes were killed: a probe that outlived its
    check's timeout (and its child) stayed behind after every `envdoctor check`."""
    pids = tmp_path / "pids.txt"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nsleep 300 &\necho $$ $! > {pids}.part && mv {pids}.part {pids}\nsleep 300\n")
    fake.chmod(0o755)
    proc = run("check", "--only", "torch.cudnn", "--python", str(fake), "-f", "json", cwd=tmp_path,
               env_extra={"ENVDOCTOR_NO_CACHE": "1", "ENVDOCTOR_CHECK__TORCH_CUDNN__TIMEOUT": "1"})
    row = json.loads(proc.stdout)["results"][0]
    assert row["status"] == "error" and "timed out after 1 s" in row["summary"], row["summary"]
    alive = [int(p) for p in pids.read_text().split() if _running(int(p))]
    for pid in alive:  # clean up before failing
        os.kill(pid, 9)
    assert not alive, f"probe processes outlived envdoctor: {alive}"


def _running(pid: int) -> bool:
    deadline = time.monotonic() + 5  # the kernel may take a moment to tear down a killed group
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        if state in ("Z", "X"):
            return False
        time.sleep(0.05)
    return True


def test_started_with_stdout_or_stderr_closed_there_is_no_traceback(tmp_path):
    """`>&-`: Python has no sys.stdout at all (None). Every command that writes there
    (serve --once prints its metrics without --textfile) exits 74 as for any unwritable
    report, and a closed stderr costs only the messages."""
    if not SCRIPT.exists():
        pytest.skip(f"no envdoctor console script beside {sys.executable} (not installed)")
    env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
    env["ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    for args, closed_fd, code in ((["serve", "--once"], 1, 74), (["check", "--only", "shm.size"], 1, 74),
                                  (["check", "--only", "shm.size"], 2, 0),
                                  # these wrote through click, which drops what goes to no stdout: exit 0
                                  (["checks"], 1, 74), (["explain", "shm.size"], 1, 74), (["--version"], 1, 74)):
        proc = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=120, preexec_fn=lambda fd=closed_fd: os.close(fd))
        assert proc.returncode == code, (args, closed_fd, proc.returncode, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("args", [["checks"], ["explain", "shm.size"], ["--version"], ["--help"]])
def test_every_command_into_a_full_disk_is_one_line_and_74(args):
    """They raised OSError (ENOSPC) as a traceback; `check` already said so in one line."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "envdoctor", *args], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    assert proc.returncode == 74 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == "envdoctor: cannot write the output: No space left on device"


@pytest.mark.parametrize("args, said", [
    (["check", "--timeout", "abc"], "Invalid value for '--timeout'"),
    (["exec", "--bogus", "--", "true"], "No such option: --bogus"),
    (["explain"], "Missing argument 'ID'"),
    (["nosuch"], "No such command 'nosuch'"),
])
def test_a_usage_error_is_one_line_naming_the_help(args, said):
    """click printed four lines (usage, a hint, a blank, the error); ours are one."""
    proc = subprocess.run([sys.executable, "-m", "envdoctor", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    # exec's log is logfmt, its usage errors too (a log parser finds them with the rest)
    start = "ts=" if args[0] == "exec" else "envdoctor: "
    assert len(lines) == 1 and lines[0].startswith(start) and said in lines[0] and "--help`" in lines[0], lines
    if args[0] == "exec":
        assert " level=error " in lines[0] and lines[0].endswith(" exit=2 source=envdoctor.exec"), lines


@pytest.mark.parametrize("stderr", ["closed", "full"])
def test_a_usage_error_exits_2_whatever_stderr_is(stderr):
    """helper-59: with stderr closed a click usage error ended with 1, into a full disk with
    74; the message is lost there, the exit code still says bad usage. --help with both
    closed or full is 74, what an unwritable output is."""
    def started(args, out=None):
        if stderr == "closed":
            return subprocess.run([sys.executable, "-m", "envdoctor", *args], stdout=out or subprocess.DEVNULL,
                                  timeout=60, preexec_fn=lambda: os.close(2))
        with open("/dev/full", "w") as full:
            return subprocess.run([sys.executable, "-m", "envdoctor", *args], stdout=out or subprocess.DEVNULL,
                                  stderr=full, timeout=60)

    assert started(["check", "stray"]).returncode == 2
    assert started(["nosuch"]).returncode == 2
    with open("/dev/full", "w") as full:
        assert started(["check", "--help"], out=full).returncode == 74


def test_a_usage_error_masks_a_secret_pasted_into_the_wrong_flag():
    """click quotes the value it refused: a token in the wrong flag went to stderr (and CI logs)."""
    env = {**os.environ, "HF_TOKEN": "hf_s3cr3tvalue1234"}
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "check", "--timeout", "hf_s3cr3tvalue1234"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "Invalid value for '--timeout'" in proc.stderr, proc.stderr
    assert "s3cr3t" not in proc.stderr and "'***'" in proc.stderr

    proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--timeout", "https://bob:hunter2@x.example", "--", "true"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "hunter2" not in proc.stderr and "bob:***@" in proc.stderr, proc.stderr


@pytest.mark.parametrize("signum, code", [(15, 143), (2, 130)])
def test_a_signal_while_a_built_in_check_imports_ends_the_run(signum, code):
    """SIGTERM or Ctrl-C landing in a built-in check's import was caught as that check's
    import failure: the run went on and blamed envdoctor's own check (helper-19; torchrun
    SIGTERMs the other ranks when one dies at start-up)."""
    script = textwrap.dedent(f"""
        import importlib.abc, os, signal, sys, threading, time
        from envdoctor import cli, registry
        signal.signal(signal.SIGTERM, cli._on_sigterm)
        signal.signal(signal.SIGINT, cli._on_sigint)

        class SlowImport(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "envdoctor.checks.shm_size":
                    threading.Timer(0.2, os.kill, (os.getpid(), {signum})).start()
                    time.sleep(10)  # the signal lands here, inside the built-in's import
                return None

        sys.meta_path.insert(0, SlowImport())
        try:
            loaded = registry.load(autoload_plugins=False)
        except KeyboardInterrupt:
            sys.exit(130)
        print("went on:", [f.reason for f in loaded.failures])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "ENVDOCTOR_NO_CACHE": "1"})
    assert proc.returncode == code and "went on" not in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-800:])


@pytest.mark.parametrize("module", ["json", "signal"])
def test_a_module_of_the_jobs_pythonpath_that_breaks_envdoctor_is_one_line_and_exec_starts_the_job(tmp_path, module):
    """helper-117: the job's PYTHONPATH is envdoctor's too, and a `json.py` or `signal.py`
    there that raises was imported in place of the standard library's: a traceback, exit 1,
    and the job never started. Now one line naming the file; exec starts the job unchecked,
    written with or without `--` (--strict: 78); any other command is 70 (helper-119)."""
    shadow = tmp_path / "job"
    shadow.mkdir()
    (shadow / f"{module}.py").write_text("raise ImportError('the job module')\n")
    env = {"PYTHONPATH": str(shadow)}
    for line in (["exec", "--", "sh", "-c", "echo job ran; exit 3"], ["exec", "--timeout", "3", "sh", "-c", "echo job ran; exit 3"]):
        started = run(*line, env_extra=env, cwd=tmp_path)
        assert started.returncode == 3 and started.stdout == "job ran\n", (line, started.stderr)
        [said] = started.stderr.splitlines()
        assert said.startswith("envdoctor: cannot run: ImportError: the job module (from ") and str(shadow / f"{module}.py") in said
        assert said.endswith("starting sh unchecked"), said
    strict = run("exec", "--strict", "--", "sh", "-c", "echo job ran", env_extra=env, cwd=tmp_path)
    assert strict.returncode == 78 and strict.stdout == "" and "Traceback" not in strict.stderr, strict.stderr
    # helper-122: one that raises SystemExit was run again by the cleanup's import, and its exit left without the job
    (shadow / f"{module}.py").write_text("raise SystemExit(0)\n")
    exited = run("exec", "--", "sh", "-c", "echo job ran; exit 3", env_extra=env, cwd=tmp_path)
    assert exited.returncode == 3 and exited.stdout == "job ran\n", (exited.returncode, exited.stderr)
    (shadow / f"{module}.py").write_text("raise ImportError('the job module')\n")
    for args in (["check"], ["check", "-f", "json"], ["checks"]):
        other = run(*args, env_extra=env, cwd=tmp_path)
        assert other.returncode == 70 and "Traceback" not in other.stderr, (args, other.stderr)
        assert other.stderr.startswith("envdoctor: cannot run: ImportError: the job module"), (args, other.stderr)


def test_the_job_started_unchecked_gets_what_exec_would_give_it(tmp_path):
    """helper-119: the fallback's job inherited SIGPIPE and SIGXFSZ ignored and the
    LC_CTYPE Python's own start wrote; a json.py that imports but lacks dumps broke exec
    after its pre-flight child was forked, which stayed a zombie under the job; and
    `python -m envdoctor` from the job's folder (the working directory comes first) had
    none of this."""
    shadow = tmp_path / "job"
    shadow.mkdir()
    (shadow / "json.py").write_text("X = 1\n")
    probe = "grep SigIgn /proc/self/status; env | grep -c LC_CTYPE; sleep 1; ps -o stat= --ppid $$ | grep -c Z"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LC_") and k != "LANG"}
    env["PYTHONPATH"] = str(shadow)
    if not SCRIPT.exists():
        pytest.skip(f"no envdoctor console script beside {sys.executable} (not installed)")
    for argv, cwd in (([str(SCRIPT)], tmp_path), ([sys.executable, "-m", "envdoctor"], shadow)):
        out = subprocess.run([*argv, "exec", "--", "sh", "-c", probe], capture_output=True, text=True,
                             env=env if argv[0] == str(SCRIPT) else {**env, "PYTHONPATH": ""}, cwd=cwd, timeout=120)
        assert out.returncode == 1, (argv, out.stdout, out.stderr)  # grep -c found no zombie: 1
        assert out.stdout.splitlines() == ["SigIgn:\t0000000000000000", "0", "0"], (argv, out.stdout, out.stderr)
        assert "module 'json' has no attribute" in out.stderr and str(shadow / "json.py") in out.stderr, out.stderr


def test_a_failure_no_shadowing_module_caused_is_left_to_its_traceback(tmp_path, monkeypatch):
    """helper-119: every exception of every command, a daemon's hours in included, was
    'cannot start', exit 70, without a traceback. Only a module that took a name envdoctor
    imports is taken; a legitimately installed dependency on PYTHONPATH (pip --target) is not one."""
    from envdoctor import start_failure

    assert start_failure.leave(KeyError("a bug of ours")) is None
    target = tmp_path / "target"
    (target / "somedep").mkdir(parents=True)
    (target / "somedep" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(target))
    monkeypatch.setattr(start_failure, "DEPENDENCIES", start_failure.DEPENDENCIES | {"somedep"})
    assert start_failure._shadow(str(target / "somedep" / "__init__.py"), [str(target)], "/nowhere") is None  # only there
    later = tmp_path / "later"
    (later / "somedep").mkdir(parents=True)
    (later / "somedep" / "__init__.py").write_text("")
    monkeypatch.setattr(sys, "path", [*sys.path, str(later)])  # installed after it too: the first one takes its name
    assert start_failure._shadow(str(target / "somedep" / "__init__.py"), [str(target)], "/nowhere") is not None
    (target / "json.py").write_text("")
    assert start_failure._shadow(str(target / "json.py"), [str(target)], "/nowhere") == f"{target / 'json.py'}, in {target}"
    (target / "os.py").write_text("")  # frozen: found before any folder, so it replaces nothing
    assert start_failure._shadow(str(target / "os.py"), [str(target)], "/nowhere") is None
    assert start_failure.exec_line(["exec", "--timeout", "3", "--strict", "python", "-V"]) == (True, ["python", "-V"])
    assert start_failure.exec_line(["exec", "--help", "--", "x"]) is None and start_failure.exec_line(["check"]) is None
