"""check's and exec's options read without the CLI (envdoctor.plain_argv) are what the CLI
reads, and any line it is unsure of goes to the CLI, which says what is wrong as it always did."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import typer

from envdoctor import cli, plain_argv

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS = ("strict", "fix", "keep", "report", "only", "skip", "fail_on", "timeout", "attach")


def _cli_reads(options: list[str], command: list[str]) -> dict | None:
    """What the CLI's exec command parses from the line (None: a usage error)."""
    group = typer.main.get_command(cli.app)
    exec_command = group.commands["exec"]
    try:
        ctx = exec_command.make_context("exec", [*options, "--", *command])
    except Exception:  # noqa: BLE001 - click's usage errors; --help exits
        return None
    params = dict(ctx.params)
    assert list(params.pop("command") or []) == command
    return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in params.items()}


PLAIN = [
    [],
    ["--strict"],
    ["--fix", "--strict", "--attach"],
    ["--strict", "--strict"],
    ["--keep", "OMP_NUM_THREADS", "--keep=MKL_NUM_THREADS", "--fix"],
    ["--report", "/tmp/r.json"],
    ["--report=-"],
    ["--report", "-"],
    ["--report", "--strict"],  # the next word, whatever it is (entrypoint refuses it, with a reason)
    ["--report", "a", "--report", "b"],  # the last one counts
    ["--only", "shm.size,cpu.threads", "--skip", "gpu.health", "--skip=torch.cudnn"],
    ["--fail-on", "warn"],
    ["--fail-on=nope"],  # a value the entrypoint refuses: read alike, refused alike
    ["--timeout", "2.5"],
    ["--timeout=1e3"],
    ["--timeout", " 7 "],
    ["--timeout", "inf"],
    ["--timeout", "-1"],
    ["--keep="],
    ["--only", ""],
    ["--report", "f=g"],
    ["--keep", "\udcff"],  # undecodable bytes in argv arrive as surrogates
]

NOT_PLAIN = [
    ["--help"],
    ["-h"],
    ["--bogus"],
    ["--stric"],  # a prefix: click refuses it
    ["--strict=1"],
    ["--fix=no"],
    ["--report"],
    ["--timeout", "abc"],
    ["--timeout="],
    ["--timeout", "1,5"],
    ["python"],  # a word before --
    ["-"],
]


@pytest.mark.parametrize("options", PLAIN, ids=lambda o: " ".join(o) or "none")
def test_plain_options_read_as_the_cli_reads_them(options):
    ours = plain_argv.parse_exec(options)
    assert ours is not None
    theirs = _cli_reads(options, ["true"])
    assert theirs is not None
    assert {k: ours.get(k, None if k not in ("strict", "fix", "attach") else False) for k in FIELDS} == theirs


@pytest.mark.parametrize("options", NOT_PLAIN, ids=lambda o: " ".join(o))
def test_anything_else_goes_to_the_cli(options):
    assert plain_argv.parse_exec(options) is None


def test_split_needs_exec_and_a_separator():
    assert plain_argv.split_exec(["envdoctor", "exec", "--fix", "--", "python", "--", "x"]) == (["--fix"], ["python", "--", "x"])
    assert plain_argv.split_exec(["envdoctor", "exec", "python"]) is None
    assert plain_argv.split_exec(["envdoctor", "check", "--"]) is None


def _run_command(argv: list[str]) -> subprocess.CompletedProcess:
    code = ("import sys\n"
            f"sys.argv = {argv!r}\n"
            "from envdoctor import program\n"
            "program.console_main()\n")
    return subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=60)


def test_the_command_starts_a_plain_exec_line_without_the_cli():
    out = _run_command(["envdoctor", "exec", "--strict", "--timeout", "10", "--", "/nonexistent/train"])
    assert out.returncode == 127
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]
    assert "envdoctor.entrypoint" in imported
    assert not [m for m in imported if m.split(".")[0] in ("typer", "click", "envdoctor.cli")], imported
    assert "/nonexistent/train" in out.stderr


def test_a_line_that_is_not_plain_is_still_refused_by_the_cli():
    out = _run_command(["envdoctor", "exec", "--timeout", "abc", "--", "true"])
    assert out.returncode == 2
    assert "'abc' is not a valid float" in out.stderr
    assert "typer" in [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")]


def _fast_path_with(raising: str, command: str = "exec") -> subprocess.CompletedProcess:
    """The fast path of `command` with its work (entrypoint.run, check_command.run_guarded)
    replaced by one that raises `raising`; an atexit handler says whether the interpreter's
    teardown ran (the CLI leaves with os._exit)."""
    patch = ("def run(options, command): raise {0}\nentrypoint.run = run\n" if command == "exec"
             else "def run(**options): raise {0}\ncheck_command.run_guarded = run\n").format(raising)
    argv = ['envdoctor', 'exec', '--strict', '--', 'true'] if command == "exec" else ['envdoctor', 'check', '-f', 'json']
    code = ("import atexit, sys\n"
            "atexit.register(lambda: sys.stderr.write('teardown ran\\n'))\n"
            "from envdoctor import check_command, entrypoint, errors, program\n"
            f"{patch}"
            f"sys.argv = {argv!r}\n"
            "program.console_main()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)


@pytest.mark.parametrize("command", ["exec", "check"])
def test_sigterm_during_the_fast_path_leaves_as_the_cli_does(command):
    """helper-57: Terminated (SIGTERM's SystemExit) went through the interpreter's teardown,
    where a second signal turned exit 143 into death by signal."""
    out = _fast_path_with("errors.Terminated(143)", command)
    assert out.returncode == 143
    assert "teardown ran" not in out.stderr


@pytest.mark.parametrize("command", ["exec", "check"])
def test_ctrl_c_during_the_fast_path_ends_quietly_with_130(command):
    out = _fast_path_with("KeyboardInterrupt", command)
    assert out.returncode == 130
    assert out.stderr == ""


def test_shell_completion_is_left_to_the_cli(monkeypatch):
    from envdoctor import program

    for argv in (["envdoctor", "exec", "--strict", "--", "true"], ["envdoctor", "check", "-f", "json"]):
        monkeypatch.setattr(sys, "argv", argv)
        monkeypatch.delenv("_ENVDOCTOR_COMPLETE", raising=False)
        assert program._plain_line() is not None
        monkeypatch.setenv("_ENVDOCTOR_COMPLETE", "bash_source")
        assert program._plain_line() is None


# -- check ----------------------------------------------------------------------------

CHECK_FIELDS = ("only", "skip", "fmt", "pid", "python", "onnx", "window", "config_file", "fail_on", "timeout",
                "output_text", "procfs_text", "sysfs_text", "rootfs_text")
CHECK_DEFAULTS = {"procfs_text": "/proc", "sysfs_text": "/sys", "rootfs_text": "/"}


def _cli_reads_check(options: list[str]) -> dict | None:
    """What the CLI's check command parses from `options` (None: a usage error)."""
    check_command = typer.main.get_command(cli.app).commands["check"]
    try:
        ctx = check_command.make_context("check", list(options))
    except Exception:  # noqa: BLE001 - click's usage errors; --help exits
        return None
    return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in ctx.params.items()}


PLAIN_CHECK = [
    [],
    ["--format", "json"],
    ["-f", "json"],
    ["-f", "json", "--format=compact"],  # the last one counts
    ["--only", "shm.size,cpu.threads", "--only=gpu.health", "--skip", "torch.cudnn"],
    ["--pid", "1"],
    ["--pid", " 42 "],
    ["--pid=1_000"],  # int() takes underscores, and so does click
    ["--python", "/usr/bin/python3", "--onnx", "a.onnx", "--onnx=b.onnx"],
    ["--window", "2.5", "--timeout", "1e3"],
    ["--window", "inf"],  # read alike; the command refuses it, with a reason
    ["--config", "envdoctor.toml", "--fail-on", "warn"],
    ["--fail-on=nope"],
    ["-o", "report.json"],
    ["-o", "-"],
    ["--output", "--format"],  # the next word, whatever it is (the command refuses it, with a reason)
    ["--output="],
    ["--path.procfs", "/host/proc", "--path.sysfs=/host/sys", "--path.rootfs", "/host"],
    ["--only", "\udcff"],
]

NOT_PLAIN_CHECK = [
    ["--help"],
    ["-h"],
    ["--version"],  # the group's option, not check's
    ["--bogus"],
    ["--form", "json"],  # a prefix: click refuses it
    ["-fjson"],  # click's attached short value: the CLI reads it
    ["-f=json"],
    ["-f"],
    ["--pid", "abc"],
    ["--pid", "1.5"],
    ["--pid="],
    ["--window", "x"],
    ["--timeout"],
    ["extra"],
    ["--"],
    ["-"],
]


@pytest.mark.parametrize("options", PLAIN_CHECK, ids=lambda o: " ".join(o) or "none")
def test_plain_check_options_read_as_the_cli_reads_them(options):
    ours = plain_argv.parse_check(["envdoctor", "check", *options])
    assert ours is not None
    theirs = _cli_reads_check(options)
    assert theirs is not None
    assert {k: ours.get(k, CHECK_DEFAULTS.get(k)) for k in CHECK_FIELDS} == theirs


@pytest.mark.parametrize("options", NOT_PLAIN_CHECK, ids=lambda o: " ".join(o))
def test_any_other_check_line_goes_to_the_cli(options):
    assert plain_argv.parse_check(["envdoctor", "check", *options]) is None


def test_parse_check_needs_check():
    assert plain_argv.parse_check(["envdoctor", "checks"]) is None
    assert plain_argv.parse_check(["envdoctor"]) is None
    assert plain_argv.parse_check(["envdoctor", "check"]) == {"only": [], "skip": [], "onnx": []}


def _through_the_cli(argv: list[str], cwd) -> subprocess.CompletedProcess:
    code = ("import sys\n"
            f"sys.argv = {argv!r}\n"
            "from envdoctor.cli import console_main\n"
            "console_main()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO, "ENVDOCTOR_NO_CACHE": "1"})


def _as_the_command(argv: list[str], cwd) -> subprocess.CompletedProcess:
    code = ("import sys\n"
            f"sys.argv = {argv!r}\n"
            "from envdoctor import program\n"
            "program.console_main()\n")
    return subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          cwd=cwd, timeout=60, env={**os.environ, "PYTHONPATH": REPO, "ENVDOCTOR_NO_CACHE": "1"})


def _imports(proc: subprocess.CompletedProcess) -> list[str]:
    return [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]


def _said(proc: subprocess.CompletedProcess) -> str:
    return "".join(line + "\n" for line in proc.stderr.splitlines() if not line.startswith("import time:"))


SAME_ENDING = [
    ["-f", "compact", "--only", "cpu.threads,shm.size"],
    ["--format", "nope"],
    ["--fail-on", "never"],
    ["--window", "0"],
    ["--timeout", "-1"],
    ["--only", ","],
    ["--only", "no.such"],
    ["--path.procfs", ""],
    ["--path.sysfs", "/nonexistent"],
    ["--python", "/nonexistent/python3"],
    ["-o", "--format"],
    ["-o", "out/"],
    ["--config", "bad.toml", "-f", "compact"],
    ["--pid", "999999999", "-f", "compact"],
]


@pytest.mark.parametrize("options", SAME_ENDING, ids=lambda o: " ".join(o))
def test_a_plain_check_line_ends_as_the_cli_ends_it(tmp_path, options):
    """Same exit code, same words on stderr, same report: the fast path runs the CLI's own
    check (envdoctor.check_command), only its options are read differently; and typer is
    never imported."""
    (tmp_path / "bad.toml").write_text("[check.\"cpu.threads\"]\nenabled = 3\n")
    argv = ["envdoctor", "check", *options]
    theirs = _through_the_cli(argv, tmp_path)
    ours = _as_the_command(argv, tmp_path)
    assert (ours.returncode, _said(ours), ours.stdout) == (theirs.returncode, theirs.stderr, theirs.stdout)
    assert not [m for m in _imports(ours) if m.split(".")[0] in ("typer", "click") or m == "envdoctor.cli"]


def test_a_plain_check_report_is_the_cli_report(tmp_path):
    argv = ["envdoctor", "check", "--format", "json", "--only", "cpu.threads,shm.size,cuda.visible_devices"]
    theirs, ours = _through_the_cli(argv, tmp_path), _as_the_command(argv, tmp_path)
    assert ours.returncode == theirs.returncode
    rows = [[(r["check"], r["status"], r["summary"]) for r in json.loads(p.stdout)["results"]] for p in (theirs, ours)]
    assert rows[0] == rows[1] and len(rows[0]) == 3


def test_a_check_line_that_is_not_plain_is_still_read_by_the_cli(tmp_path):
    out = _as_the_command(["envdoctor", "check", "--pid", "abc"], tmp_path)
    assert out.returncode == 2
    assert "'abc' is not a valid int" in _said(out)
    assert "typer" in _imports(out)


@pytest.mark.parametrize("options", [["--path.procfs", "a" * 300], ["--path.sysfs", "/" + "b" * 5000],
                                     ["--pid", "9" * 4200]], ids=["procfs", "sysfs", "pid"])
def test_a_name_too_long_for_the_file_system_is_one_line(tmp_path, options):
    """helper-59: is_dir() passes ENAMETOOLONG on (Python 3.11): a traceback, exit 1, on both paths."""
    for proc in (_through_the_cli(["envdoctor", "check", *options], tmp_path),
                 _as_the_command(["envdoctor", "check", *options], tmp_path)):
        said = _said(proc)
        assert proc.returncode == 2 and "Traceback" not in said and said.count("\n") == 1, said[-2000:]
