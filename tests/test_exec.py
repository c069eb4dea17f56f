"""`envdoctor exec` as an image's entrypoint meets it: it becomes the command.

Every test runs the real CLI in a subprocess and a real command after it: exit
statuses and signals come back as the command's own, the PID the test started is
the PID the job runs in, a signal sent to that PID reaches the job's handler, no
process of envdoctor's stays behind, and bad usage or a command that cannot run
ends in one line with 2, 126 or 127.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from exec_log import events, messages, one
from helpers import cli

REPO = Path(__file__).resolve().parent.parent
TOO_MANY = str(len(os.sched_getaffinity(0)) * 8)  # OMP_NUM_THREADS that oversubscribes this machine
EXEC_IDS = {"shm.size", "cpu.threads", "cuda.visible_devices", "dist.env", "gpu.health", "cuda.runtime", "torch.cudnn",
            "dist.consistency"}  # (it skips at once outside a distributed launch)


def envdoctor_exec(*args: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    return cli("exec", *args, env=env, **kwargs)


def start(*args: str, env: dict | None = None) -> subprocess.Popen:
    full_env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
    full_env.update(env or {})
    return subprocess.Popen([sys.executable, "-m", "envdoctor", "exec", *args], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_terminal_like)


def _terminal_like() -> None:
    """The stop signals at their defaults, as in a terminal (a suite run under nohup or in
    the background has some ignored, and envdoctor rightly keeps an ignored one ignored),
    and no core file from SIGQUIT."""
    import resource

    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@pytest.mark.parametrize("status", [0, 1, 7, 255])
def test_exit_status_is_the_commands_own(status):
    proc = envdoctor_exec("--", "sh", "-c", f"exit {status}")
    assert proc.returncode == status, proc.stderr
    assert "Traceback" not in proc.stderr
    last = events(proc.stderr)[-1]
    assert last["action"] == "start" and last["command"] == "sh" and last["msg"].endswith("starting sh")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGSEGV])
def test_death_by_signal_shows_as_such_to_the_parent(sig):
    proc = envdoctor_exec("--", "sh", "-c", f"kill -{sig.name[3:]} $$")
    assert proc.returncode == -sig, (proc.returncode, proc.stderr)


def test_the_job_runs_in_the_pid_that_was_started_and_nothing_stays_between():
    job = "import os; print(os.getpid(), os.getppid(), open('/proc/self/task/%d/children' % os.getpid()).read().split())"
    proc = start("--", sys.executable, "-c", job)
    out, err = proc.communicate(timeout=60)
    pid, ppid, children = out.split(" ", 2)
    assert int(pid) == proc.pid, err  # envdoctor was replaced, not wrapped
    assert int(ppid) == os.getpid()  # no process between the test and the job
    assert eval(children) == [], "the pre-flight's child must be gone (reaped) before the job starts"


def test_sigterm_to_the_started_pid_reaches_the_jobs_handler(tmp_path):
    ready = tmp_path / "ready"
    job = (
        "import signal, sys, time, pathlib\n"
        "def bye(signum, frame):\n"
        "    print('handled', signum, flush=True); sys.exit(42)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        f"pathlib.Path({str(ready)!r}).write_text('x')\n"
        "for _ in range(600): time.sleep(0.1)\n"
        "sys.exit(3)\n"
    )
    proc = start("--", sys.executable, "-c", job)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 42, err
    assert out.strip() == f"handled {int(signal.SIGTERM)}"


def test_the_job_gets_default_signal_dispositions_and_no_extra_descriptors():
    # Python ignores SIGPIPE and SIGXFSZ, and ignored signals survive execve: exec must undo that.
    status = envdoctor_exec("--", "grep", "^SigIgn", "/proc/self/status")
    ignored = int(status.stdout.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)), status.stdout
    assert not ignored & (1 << (signal.SIGXFSZ - 1)), status.stdout
    # Same job, started directly and through exec: the same open descriptors (nothing of envdoctor's leaks).
    job = [sys.executable, "-c", "import os; print(sorted(os.listdir('/proc/self/fd')))"]
    direct = subprocess.run(job, capture_output=True, text=True, timeout=60)
    through = envdoctor_exec("--", *job)
    assert through.stdout == direct.stdout, through.stderr


def test_yes_into_head_ends_like_a_shell_pipeline():
    # With SIGPIPE left ignored, `yes` would get EPIPE and print an error instead of dying quietly.
    proc = subprocess.run(f"{sys.executable} -m envdoctor exec -- yes | head -n 2; echo \"${{PIPESTATUS[0]}}\"",
                          shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=60)
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["y", "y"]
    assert lines[2] == str(128 + signal.SIGPIPE), proc.stderr
    assert "Broken pipe" not in proc.stderr


def test_a_command_that_is_not_there_is_127_in_one_line(tmp_path):
    proc = envdoctor_exec("--", "envdoctor-no-such-command-xyz")
    assert proc.returncode == 127
    (line,) = proc.stderr.splitlines()  # one line, and nothing ran
    (event,) = events(line)
    assert event["level"] == "error" and event["exit"] == "127"
    assert event["msg"].startswith("envdoctor-no-such-command-xyz: command not found")
    missing = envdoctor_exec("--", str(tmp_path / "nothing-here"))
    assert missing.returncode == 127 and "no such file" in missing.stderr
    script = tmp_path / "bad-interpreter"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    bad = envdoctor_exec("--", str(script))
    assert bad.returncode == 127 and "interpreter" in bad.stderr, bad.stderr


def test_a_command_that_cannot_be_executed_is_126_in_one_line(tmp_path):
    plain = tmp_path / "not-executable"
    plain.write_text("echo hi\n")
    plain.chmod(0o644)
    proc = envdoctor_exec("--", str(plain))
    assert proc.returncode == 126, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "permission denied" in messages(proc.stderr)[0]
    directory = envdoctor_exec("--", str(tmp_path))
    assert directory.returncode == 126 and "is a directory" in directory.stderr
    binary = tmp_path / "garbage"
    binary.write_bytes(b"\x00\x01\x02 not a program\n")
    binary.chmod(0o755)
    garbage = envdoctor_exec("--", str(binary))
    assert garbage.returncode == 126 and "exec format error (not a binary and no #! line)" in garbage.stderr
    # files that have a #! line were said to have none (helper-71)
    long_line = tmp_path / "long.sh"
    long_line.write_text("#!/" + "x" * 300 + "\n")
    inner = tmp_path / "inner"  # a script with no #! line, as another's interpreter
    inner.write_text("echo hi\n")
    outer = tmp_path / "outer.sh"
    outer.write_text(f"#!{inner}\necho x\n")
    for path, said in ((long_line, "its #! line is longer than the 256 bytes the kernel reads"),
                       (outer, f"its #! interpreter {inner} is not a binary the kernel can run")):
        path.chmod(0o755)
        inner.chmod(0o755)
        proc = envdoctor_exec("--", str(path))
        assert proc.returncode == 126 and said in proc.stderr, proc.stderr
    loop = tmp_path / "loop"
    loop.symlink_to(loop)  # a shell says "Too many levels of symbolic links", 126; exec said "no such file", 127
    looping = envdoctor_exec("--", str(loop))
    assert looping.returncode == 126 and "Too many levels of symbolic links" in looping.stderr, looping.stderr


def test_a_command_is_found_on_the_path_it_will_get(tmp_path):
    tool = tmp_path / "bin" / "my-job"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho found-me\n")
    tool.chmod(0o755)
    proc = envdoctor_exec("--", "my-job", env={"PATH": f"{tool.parent}{os.pathsep}{os.environ['PATH']}"})
    assert proc.returncode == 0 and proc.stdout == "found-me\n", proc.stderr


@pytest.mark.parametrize("args, said", [
    ((), "no command given"),
    (("--fail-on", "loud", "--", "true"), "--fail-on must be warn or fail"),
    (("--timeout", "0", "--", "true"), "--timeout must be a positive"),
    (("--only", "no.such_check", "--", "true"), "unknown check id 'no.such_check'; exec runs: cpu.threads,"),  # helper-84: what exec runs
    (("--only", ",", "--", "true"), "--only ',' names no check id"),
    (("--only", "onnx.opset", "--", "true"), "onnx.opset: does not run in exec"),
    (("--only", "onnx.opset", "--", "true"), "exec runs: cpu.threads, cuda.runtime, cuda.visible_devices"),
    (("--only", "torch.pin_memory", "--", "true"), "torch.pin_memory: does not run in exec"),
    (("--report", "/nonexistent-dir-xyz/report.json", "--", "true"), "does not exist"),
    (("--report", "/proc/version/report.json", "--", "true"), "/proc/version is not a directory"),  # said "does not exist"
    (("--report", "", "--", "true"), "--report needs a file name"),  # wrote nothing, said nothing
    (("--report", "/tmp/report.json/", "--", "true"), "names a directory"),  # wrote /tmp/report.json
    (("--no-such-flag", "--", "true"), "No such option"),
])
def test_bad_usage_is_2_in_one_line_and_nothing_runs(tmp_path, args, said):
    marker = tmp_path / "ran"
    if args and args[-1] == "true":
        args = (*args[:-1], "touch", str(marker))
    proc = envdoctor_exec(*args)
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


@pytest.mark.parametrize("where", ["environment", "file"])
def test_a_config_that_leaves_exec_nothing_to_run_is_bad_usage(tmp_path, where):
    """ENVDOCTOR_ONLY=onnx.opset (or only = [...] in the file) left exec no check: the job
    started unchecked, even with --strict, where `--only onnx.opset` is exit 2."""
    marker = tmp_path / "ran"
    env = {"ENVDOCTOR_ONLY": "onnx.opset"} if where == "environment" else None
    if where == "file":
        (tmp_path / "envdoctor.toml").write_text('only = ["torch.pin_memory"]\n')
    proc = envdoctor_exec("--strict", "--", "touch", str(marker), env=env, cwd=tmp_path)
    assert proc.returncode == 2 and "does not run in exec" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "the config's only" in proc.stderr and not marker.exists()


def test_a_bad_config_is_2_naming_the_file(tmp_path):
    (tmp_path / "envdoctor.toml").write_text('[check."shm.size"]\nmin_bytez = 1\n')
    proc = envdoctor_exec("--", "true", cwd=tmp_path)
    assert proc.returncode == 2
    assert "envdoctor.toml" in proc.stderr and "min_bytez" in proc.stderr


def test_options_after_the_command_belong_to_the_command():
    proc = envdoctor_exec("--", sys.executable, "-c", "import sys; print(sys.argv[1:])", "--strict", "--fix")
    assert proc.returncode == 0
    assert proc.stdout.strip() == "['--strict', '--fix']"


def test_the_log_is_one_line_per_problem_with_its_fix_and_one_summary(tmp_path):
    # 8 threads per CPU this process may use: a real cpu.threads warning
    proc = envdoctor_exec("--", "true", env={"OMP_NUM_THREADS": TOO_MANY})
    logged = events(proc.stderr)
    assert len(logged) == len(proc.stderr.splitlines())  # nothing but log lines: no table, no traceback
    *findings, summary = logged
    for finding in findings:  # one line per problem, each with its status and check, loudest first
        assert finding["msg"].startswith(f"{finding['status']} {finding['check']}: ")
        assert finding["level"] == ("warn" if finding["status"] == "warn" else "error")
    assert [f["status"] for f in findings] == sorted((f["status"] for f in findings), key=lambda s: s == "warn")
    (warn,) = [f for f in findings if f["check"] == "cpu.threads"]
    assert warn["level"] == "warn" and warn["status"] == "warn"
    assert warn["msg"].startswith("warn cpu.threads: ") and f"OMP_NUM_THREADS={TOO_MANY}" in warn["msg"]
    assert warn["fix"].startswith("export OMP_NUM_THREADS=")
    assert summary["msg"].startswith("8 checks in ") and summary["msg"].endswith("; starting true")
    assert int(summary["warn"]) >= 1 and summary["checks"] == "8" and summary["action"] == "start"
    assert "--fix would set OMP_NUM_THREADS" in summary["msg"]


def test_the_commands_arguments_never_reach_the_log():
    proc = envdoctor_exec("--", "sh", "-c", "exit 0", "--password=hunter2-secret")
    assert proc.returncode == 0
    assert "hunter2" not in proc.stderr and "exit 0" not in proc.stderr


def test_strict_refuses_at_fail_on_with_78_and_the_command_leaves_no_trace(tmp_path):
    marker = tmp_path / "ran"
    # (only cpu.threads: what else this machine has to say must not decide these exit codes)
    proc = envdoctor_exec("--strict", "--fail-on", "warn", "--only", "cpu.threads", "--", "touch", str(marker),
                          env={"OMP_NUM_THREADS": TOO_MANY})
    assert proc.returncode == 78, proc.stderr
    assert not marker.exists()
    last = events(proc.stderr)[-1]
    assert "--strict: not starting touch: 1 at or above warn" in last["msg"]
    assert last["action"] == "refuse" and last["exit"] == "78" and last["warn"] == "1"
    # at the default level (fail) the same warning does not stop it
    ok = envdoctor_exec("--strict", "--only", "cpu.threads", "--", "touch", str(marker), env={"OMP_NUM_THREADS": TOO_MANY})
    assert ok.returncode == 0 and marker.exists(), ok.stderr


def test_fix_gives_the_command_fitting_thread_counts_and_keep_protects_a_variable():
    cpus = len(os.sched_getaffinity(0))
    show = [sys.executable, "-c", "import os, json; print(json.dumps({k: v for k, v in os.environ.items() if 'THREADS' in k}))"]
    fixed = envdoctor_exec("--fix", "--", *show, env={"OMP_NUM_THREADS": str(cpus * 8)})
    got = json.loads(fixed.stdout)
    assert got == {name: str(cpus) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")}, fixed.stderr
    change = one(fixed.stderr, "set OMP_NUM_THREADS")
    assert change["msg"].startswith(f"set OMP_NUM_THREADS {cpus * 8} -> {cpus} ({cpus} CPU{'s' if cpus > 1 else ''} of ")
    assert (change["var"], change["old"], change["new"]) == ("OMP_NUM_THREADS", str(cpus * 8), str(cpus))
    assert not [e for e in events(fixed.stderr) if e.get("check") == "cpu.threads" and "status" in e], \
        "judged again after the fix: no warning left"

    kept = envdoctor_exec("--fix", "--keep", "OMP_NUM_THREADS", "--", *show, env={"OMP_NUM_THREADS": str(cpus * 8)})
    got = json.loads(kept.stdout)
    assert got["OMP_NUM_THREADS"] == str(cpus * 8) and "MKL_NUM_THREADS" not in got  # it follows the kept one
    assert one(kept.stderr, f"kept OMP_NUM_THREADS={cpus * 8} (--keep)")["wanted"] == str(cpus)

    # a sibling the job set itself stays as set beside a kept OMP_NUM_THREADS (helper-49: fixed,
    # it disagreed with the kept one, and the row judged again blamed that on the job)
    both = envdoctor_exec("--fix", "--keep", "OMP_NUM_THREADS", "--", *show,
                          env={"OMP_NUM_THREADS": str(cpus * 8), "MKL_NUM_THREADS": str(cpus * 8)})
    assert json.loads(both.stdout)["MKL_NUM_THREADS"] == str(cpus * 8), both.stderr


def test_a_fix_is_explained_by_its_own_finding_not_another_rules_words():
    """Helper-15: the clean CUDA_VISIBLE_DEVICES list was logged as "GPU models differ"."""
    show = [sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"]
    fixed = envdoctor_exec("--fix", "--only", "cuda.visible_devices", "--", *show, env={"CUDA_VISIBLE_DEVICES": "0,x,1"})
    assert fixed.stdout.strip() == "0,1", fixed.stderr
    change = one(fixed.stderr, "set CUDA_VISIBLE_DEVICES")
    assert "GPU models differ" not in change["msg"]
    assert "entry 'x' is invalid" in change["msg"] and "ignores 1 after it" in change["msg"], change["msg"]


def test_an_undecodable_byte_reads_the_same_in_execs_log_as_in_checks_report():
    """Helper-15: exec's log showed OMP_NUM_THREADS='\\udcff' where check showed '\\xff'."""
    env = {"OMP_NUM_THREADS": "\udcff"}  # the byte 0xff, as subprocess encodes it (surrogateescape)
    logged = one(envdoctor_exec("--only", "cpu.threads", "--", "true", env=env).stderr, "fail cpu.threads")["msg"]
    reported = json.loads(cli("check", "--only", "cpu.threads", "-f", "json", env=env).stdout)["results"][0]["summary"]
    assert "OMP_NUM_THREADS='\\xff'" in logged and "OMP_NUM_THREADS='\\xff'" in reported, (logged, reported)
    assert "udc" not in logged + reported


def test_report_file_is_the_json_report_of_the_exec_checks(tmp_path):
    report = tmp_path / "report.json"
    proc = envdoctor_exec("--fix", "--report", str(report), "--", "true", env={"OMP_NUM_THREADS": "999"})
    assert proc.returncode == 0, proc.stderr
    document = json.loads(report.read_text())
    schema = json.loads((REPO / "envdoctor" / "schema" / "report-v1.json").read_text())
    jsonschema.validate(document, schema)
    rows = {r["check"]: r for r in document["results"]}
    assert set(rows) == EXEC_IDS
    assert rows["cpu.threads"]["facts"]["exec_fixed"]["OMP_NUM_THREADS"]["from"] == "999"
    assert document["system"]["cpu_logical"] == os.cpu_count()
    assert not list(tmp_path.glob(".report.json.*")), "no temporary file left"


def test_only_and_skip_choose_among_the_exec_checks(tmp_path):
    report = tmp_path / "r.json"
    proc = envdoctor_exec("--only", "shm.size,cpu.threads", "--skip", "cpu.threads", "--report", str(report), "--", "true")
    assert proc.returncode == 0, proc.stderr
    assert [r["check"] for r in json.loads(report.read_text())["results"]] == ["shm.size"]
    assert events(proc.stderr)[-1]["msg"].startswith("1 check in")


def test_a_hung_check_never_holds_the_job(plugin_env, tmp_path):
    marker = tmp_path / "ran"
    env = {**plugin_env, "ENVDOCTOR_CHECK__EXAMPLE_SLEEPY__SECONDS": "120"}
    started = time.monotonic()
    proc = envdoctor_exec("--timeout", "2", "--only", "example.sleepy,shm.size", "--", "touch", str(marker), env=env)
    assert time.monotonic() - started < 60, "exec waited for the hung check"
    assert proc.returncode == 0 and marker.exists(), proc.stderr
    error = one(proc.stderr, "error example.sleepy")
    assert error["level"] == "error" and "timed out" in error["msg"], proc.stderr

    marker.unlink()
    strict = envdoctor_exec("--strict", "--timeout", "2", "--only", "example.sleepy", "--", "touch", str(marker), env=env)
    assert strict.returncode == 78 and not marker.exists(), strict.stderr


def test_a_broken_plugin_is_an_error_row_and_strict_refuses(plugin_env, tmp_path):
    marker = tmp_path / "ran"
    proc = envdoctor_exec("--strict", "--only", "example.broken", "--", "touch", str(marker), env=plugin_env)
    assert proc.returncode == 78 and not marker.exists(), proc.stderr
    assert one(proc.stderr, "error example.broken")["status"] == "error"


def _plugin_that_hangs_on_import(tmp_path: Path, body: str = "import time\ntime.sleep(120)\n") -> dict:
    """A third-party check registered as an installed distribution is (a dist-info with
    an entry point), whose module never finishes importing."""
    site = tmp_path / "site"
    dist = site / "envdoctor_hangs-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: envdoctor-hangs\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[envdoctor.checks]\nhangs.on_import = envdoctor_hangs_mod:CHECK\n")
    (site / "envdoctor_hangs_mod.py").write_text(body)
    return {"PYTHONPATH": str(site)}


def _exec_despite_the_plugin(env: dict, marker: Path, report: Path) -> subprocess.CompletedProcess:
    """exec --timeout 2 of `touch marker`: it must start, and well within the test's bound."""
    started = time.monotonic()
    proc = envdoctor_exec("--timeout", "2", "--report", str(report), "--", "touch", str(marker), env=env)
    assert time.monotonic() - started < 60, "exec waited for the plug-in's import"
    assert proc.returncode == 0 and marker.exists(), proc.stderr
    return proc


def test_a_plugin_whose_import_hangs_never_holds_the_job(tmp_path):
    """Its import gets half the pre-flight's bound; the built-in checks run in the rest."""
    env = _plugin_that_hangs_on_import(tmp_path)
    marker, report = tmp_path / "ran", tmp_path / "report.json"
    proc = _exec_despite_the_plugin(env, marker, report)
    first = messages(proc.stderr)[0]  # names the plug-in it was stuck on, and the way round it
    assert first.startswith("error hangs.on_import: ") and "its import did not finish within " in first, first
    assert "stuck at envdoctor_hangs_mod.py:2" in first and "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1" in first
    document = json.loads(report.read_text())
    jsonschema.validate(document, json.loads((REPO / "envdoctor" / "schema" / "report-v1.json").read_text()))
    rows = {r["check"]: r for r in document["results"]}
    assert rows["hangs.on_import"]["status"] == "error" and rows["shm.size"]["status"] != "error", rows

    marker.unlink()
    strict = envdoctor_exec("--strict", "--timeout", "2", "--", "touch", str(marker), env=env)
    assert strict.returncode == 78 and not marker.exists(), strict.stderr


def test_a_plugin_import_that_holds_the_interpreter_lock_never_holds_the_job(tmp_path):
    """A plug-in wedged in one C call at import (a catastrophic regular expression) stops
    every thread of the pre-flight: it is killed at the bound, and the report says nothing
    was verified, naming the plug-in it was importing."""
    env = _plugin_that_hangs_on_import(tmp_path, 'import re\nre.match(r"(a+)+$", "a" * 64 + "b")\n')
    marker, report = tmp_path / "ran", tmp_path / "report.json"
    proc = _exec_despite_the_plugin(env, marker, report)
    first = messages(proc.stderr)[0]
    assert "did not finish within 2 s (it was still importing plug-in checks: hangs.on_import " in first, first
    assert "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1" in first
    assert "0 checks in" in messages(proc.stderr)[-1] and "nothing verified" in messages(proc.stderr)[-1]
    document = json.loads(report.read_text())  # still a report, saying nothing was checked
    jsonschema.validate(document, json.loads((REPO / "envdoctor" / "schema" / "report-v1.json").read_text()))
    # one error row, not an empty list: `results: []` read as a clean report (helper-29)
    [row] = document["results"]
    assert (row["check"], row["status"]) == ("exec.preflight", "error")
    assert row["summary"].startswith("nothing was verified: the pre-flight did not finish") and "hangs.on_import" in row["summary"]

    marker.unlink()
    strict = envdoctor_exec("--strict", "--timeout", "2", "--", "touch", str(marker), env=env)
    assert strict.returncode == 78 and not marker.exists(), strict.stderr
    assert "the environment was not verified" in messages(strict.stderr)[-1]


def test_without_fix_the_job_gets_exactly_the_environment_it_was_given():
    env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
    env.update({"OMP_NUM_THREADS": TOO_MANY, "SOME_TOKEN": "s3cr3t-value-123", "EMPTY": ""})
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--", sys.executable, "-c",
                           "import os, json; print(json.dumps(dict(os.environ)))"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == env
    assert "s3cr3t-value-123" not in proc.stderr


@pytest.mark.parametrize("closed", ["2>&-", ">&- 2>&-"])
def test_the_job_starts_with_closed_output_descriptors(tmp_path, closed):
    # Python starts with sys.stderr = None when descriptor 2 is closed; nothing may trip on it
    marker = tmp_path / "ran"
    proc = subprocess.run(f"{sys.executable} -m envdoctor exec -- sh -c 'touch {marker}; exit 3' {closed}",
                          shell=True, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert marker.exists()


@pytest.mark.parametrize("nproc, env", [
    (["--nproc-per-node", "2"], {}),
    (["--nproc-per-node=4", "--nproc-per-node=2"], {}),  # the last wins, as torchrun reads it (helper-71)
    ([], {"PET_NPROC_PER_NODE": "2"}),  # torchrun's default for the flag (helper-71)
])
def test_fix_under_torchrun_shares_the_cpus_between_its_ranks(tmp_path, nproc, env):
    # torchrun passes OMP_NUM_THREADS on to every worker: sized for the whole machine it
    # would oversubscribe it once per rank. A real torchrun, two workers printing theirs.
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this interpreter")
    worker = tmp_path / "worker.py"
    # One write(2) per worker: print() under PYTHONUNBUFFERED writes each field apart, and
    # the two ranks' fields then interleave on the shared pipe ("1 2 1 01" in CI).
    worker.write_text("import os\nos.write(1, ' '.join(os.environ[k] for k in ('LOCAL_RANK', 'LOCAL_WORLD_SIZE', "
                      "'OMP_NUM_THREADS', 'MKL_NUM_THREADS')).encode() + b'\\n')\n")
    proc = envdoctor_exec("--fix", "--", str(torchrun), *nproc, "--master-port", "0", str(worker),
                          env={"OMP_NUM_THREADS": TOO_MANY, **env}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    share = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert sorted(proc.stdout.split("\n")[:2]) == [f"0 2 {share} {share}", f"1 2 {share} {share}"], proc.stdout
    assert one(proc.stderr, "set OMP_NUM_THREADS")["msg"].endswith(" / 2 local ranks)")


def test_exec_never_imports_torch_itself(tmp_path):
    # A guard refuses any torch import in envdoctor's process (and, by fork, in its
    # pre-flight child); the torch probe is a separate interpreter and may. With
    # --strict, a refused import would be an error row and the command would not start.
    from test_no_torch_import import GUARD

    report = tmp_path / "report.json"
    code = GUARD + (f"sys.argv = ['envdoctor', 'exec', '--strict', '--timeout', '120', '--report', {str(report)!r}, "
                    "'--', 'true']\n"
                    "from envdoctor.cli import main\nmain()\n")
    env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
    proc = subprocess.run([sys.executable, "-c", code], env={**env, "ENVDOCTOR_NO_CACHE": "1"}, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {r["check"]: r for r in json.loads(report.read_text())["results"]}
    assert not [r for r in rows.values() if r["status"] == "error"], rows
    assert rows["torch.cudnn"]["status"] != "error" and "torch" in rows["torch.cudnn"]["summary"]


JOB_THAT_WAITS_TO_BE_SEEN = """
import glob, json, os, sys, time
import torch
torch.set_num_threads(3)

def published():
    try:  # envdoctor-attach-<pid>-<start ticks>.json
        path, = glob.glob(f"/dev/shm/envdoctor-attach-{os.getpid()}-*.json")
        return json.load(open(path))["torch"]["num_threads"] == 3
    except (OSError, ValueError, KeyError, TypeError):
        return False

deadline = time.monotonic() + 30
while not published() and time.monotonic() < deadline:
    time.sleep(0.1)
print(json.dumps({"pid": os.getpid(), "published": published()}), flush=True)
sys.stdin.readline()  # stay alive until the test has read us from outside
"""


def test_attach_makes_the_command_publish_its_live_view_and_check_pid_reads_it(tmp_path):
    """exec --attach -- python job.py: the job (same pid as exec) publishes without a line
    of envdoctor in its code, and `check --pid` judges it from the live document."""
    script = tmp_path / "job.py"
    script.write_text(JOB_THAT_WAITS_TO_BE_SEEN)
    env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
    env.update(OMP_NUM_THREADS="1", ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD="1")
    job = subprocess.Popen([sys.executable, "-m", "envdoctor", "exec", "--attach", "--", sys.executable, str(script)],
                           env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = json.loads(job.stdout.readline())
        assert said["pid"] == job.pid, "exec became the job: same pid"
        assert said["published"], "the job published its live view"
        published, = Path("/dev/shm").glob(f"envdoctor-attach-{job.pid}-*.json")
        document = json.loads(published.read_text())
        assert document["pid"] == job.pid
        proc = cli("check", "--pid", str(job.pid), "--only", "cpu.threads", "--format", "json",
                   env={"ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"})
        row = json.loads(proc.stdout)["results"][0]
        assert row["facts"]["live_threads"] == 3, row  # set in code, seen from outside
    finally:
        _, stderr = job.communicate("\n", timeout=30)
    assert job.returncode == 0
    assert "--attach: the command publishes its live settings" in stderr
    assert not published.exists(), "removed at exit"


def test_attach_reuses_one_hook_directory_instead_of_leaving_one_per_start(tmp_path):
    """Nothing of envdoctor is left after execve to remove the hook, so every start uses
    the same directory in the user's cache (0700, ours): starts do not pile up in /tmp."""
    env = {"XDG_CACHE_HOME": str(tmp_path), "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
    for _ in range(3):
        proc = envdoctor_exec("--attach", "--", sys.executable, "-c", "pass", env=env)
        assert proc.returncode == 0, proc.stderr
    hooks = list((tmp_path / "envdoctor").glob("attach-hook-*"))
    assert len(hooks) == 1 and (hooks[0] / "sitecustomize.py").is_file()
    assert hooks[0].stat().st_mode & 0o077 == 0


def test_fix_unsets_a_variable_for_the_job_when_that_is_the_fix(tmp_path):
    # a CUDA build's files (CUDA_LAUNCH_BLOCKING changes nothing for the CPU-only torch here)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    site = next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text("__version__ = '2.99.0+cu128'\ncuda = '12.8'\nhip = None\n")
    (site / "torch" / "__init__.py").write_text("raise ImportError('stub torch: read its files')\n")
    proc = envdoctor_exec("--fix", "--only", "cuda.runtime", "--", sys.executable, "-c",
                          "import os; print(repr(os.environ.get('CUDA_LAUNCH_BLOCKING')))",
                          env={"CUDA_LAUNCH_BLOCKING": "1", "ENVDOCTOR_PYTHON": str(tmp_path / "venv" / "bin" / "python")},
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None", proc.stdout  # unset, not the string 'None'
    (change,) = [e for e in events(proc.stderr) if e.get("var") == "CUDA_LAUNCH_BLOCKING"]
    assert change["old"] == "1" and change["new"] == "unset"


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129),
                                       (signal.SIGQUIT, -signal.SIGQUIT)])
def test_a_signal_during_the_preflight_leaves_no_probe_behind(tmp_path, sig, code):
    """The torch probe is started by exec's forked pre-flight child, in a session of its
    own: SIGTERM or Ctrl-C to exec killed the child only, and the probe (here a `python`
    that sleeps) ran on under PID 1."""
    marker = f"{97 + os.getpid() % 1000 / 1000:.3f}"  # a sleep length no other process has
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    (fakebin / "python").write_text(f"#!/bin/sh\nsleep {marker}\n")
    (fakebin / "python").chmod(0o755)

    def sleepers() -> list[str]:
        return subprocess.run(["pgrep", "-f", f"^sleep {marker}$"], capture_output=True, text=True).stdout.split()

    proc = start("--timeout", "30", "--", "python", "-c", "1",
                 env={"PATH": f"{fakebin}:/usr/bin:/bin", "ENVDOCTOR_NO_CACHE": "1"})
    try:
        deadline = time.monotonic() + 30
        while not sleepers() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sleepers(), "the probe never started: " + (proc.stderr.read() if proc.poll() is not None else "")
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == code
        deadline = time.monotonic() + 5
        while sleepers() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not sleepers()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run(["pkill", "-f", f"^sleep {marker}$"])


def test_the_job_gets_no_locale_its_invoker_did_not_set():
    """Helper-43: with no locale in the environment (most slim images), Python's start
    coerced the C locale and wrote LC_CTYPE=C.UTF-8 into os.environ; exec handed it on to
    every job. One the invoker did set is handed on as given."""
    bare = {"PATH": os.environ["PATH"]}
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--", "env"], env=bare,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "LC_CTYPE" not in proc.stdout, proc.stdout
    for given in ("C.UTF-8", "C", "POSIX", ""):  # C, POSIX and '' were overwritten by the coercion (helper-45)
        proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--", "env"], env={**bare, "LC_CTYPE": given},
                              capture_output=True, text=True, timeout=120)
        assert f"LC_CTYPE={given}" in proc.stdout.splitlines(), (given, proc.stdout)
