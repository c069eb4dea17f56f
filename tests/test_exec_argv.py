"""exec's options read without the CLI (envdoctor.exec_argv) are what the CLI reads, and
any line it is unsure of goes to the CLI, which says what is wrong as it always did."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer

from envdoctor import cli, exec_argv

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
    ours = exec_argv.parse(options)
    assert ours is not None
    theirs = _cli_reads(options, ["true"])
    assert theirs is not None
    assert {k: ours.get(k, None if k not in ("strict", "fix", "attach") else False) for k in FIELDS} == theirs


@pytest.mark.parametrize("options", NOT_PLAIN, ids=lambda o: " ".join(o))
def test_anything_else_goes_to_the_cli(options):
    assert exec_argv.parse(options) is None


def test_split_needs_exec_and_a_separator():
    assert exec_argv.split(["envdoctor", "exec", "--fix", "--", "python", "--", "x"]) == (["--fix"], ["python", "--", "x"])
    assert exec_argv.split(["envdoctor", "exec", "python"]) is None
    assert exec_argv.split(["envdoctor", "check", "--"]) is None


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


def _fast_path_with(raising: str) -> subprocess.CompletedProcess:
    """The fast path with entrypoint.run replaced by one that raises `raising`; an atexit
    handler says whether the interpreter's teardown ran (the CLI leaves with os._exit)."""
    code = ("import atexit, sys\n"
            "atexit.register(lambda: sys.stderr.write('teardown ran\\n'))\n"
            "from envdoctor import entrypoint, errors, program\n"
            f"def run(options, command): raise {raising}\n"
            "entrypoint.run = run\n"
            "sys.argv = ['envdoctor', 'exec', '--strict', '--', 'true']\n"
            "program.console_main()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)


def test_sigterm_during_the_fast_path_leaves_as_the_cli_does():
    """helper-57: Terminated (SIGTERM's SystemExit) went through the interpreter's teardown,
    where a second signal turned exit 143 into death by signal."""
    out = _fast_path_with("errors.Terminated(143)")
    assert out.returncode == 143
    assert "teardown ran" not in out.stderr


def test_ctrl_c_during_the_fast_path_ends_quietly_with_130():
    out = _fast_path_with("KeyboardInterrupt")
    assert out.returncode == 130
    assert out.stderr == ""


def test_shell_completion_is_left_to_the_cli(monkeypatch):
    from envdoctor import program

    monkeypatch.setattr(sys, "argv", ["envdoctor", "exec", "--strict", "--", "true"])
    assert program._plain_exec_line() is not None
    monkeypatch.setenv("_ENVDOCTOR_COMPLETE", "bash_source")
    assert program._plain_exec_line() is None
