"""The engine's shape: a source checkout works like an install, exporters register
like checks, one atomic writer that never destroys anything, and the logger."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers import cli

REPO = Path(__file__).resolve().parent.parent

# Run envdoctor as if it were not installed: drop setuptools' editable-install finder,
# so every envdoctor module must come from the directory the command runs in.
_NOT_INSTALLED = (
    "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
    "sys.path_hooks[:] = [h for h in sys.path_hooks if 'editable' not in repr(h).lower()]; "
)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the repository's files (tracked and new), as a fresh clone has them."""
    dest = tmp_path_factory.mktemp("checkout") / "envdoctor"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _run_in(checkout: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ENVDOCTOR_CONFIG")}
    return subprocess.run([sys.executable, "-c", _NOT_INSTALLED + code, *args], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=120)


def test_python_m_envdoctor_check_works_from_the_repository_root(checkout):
    code = ("import runpy; sys.argv = ['envdoctor'] + sys.argv[1:]; "
            "runpy.run_module('envdoctor', run_name='__main__', alter_sys=True)")
    proc = _run_in(checkout, code, "check", "--only", "shm.size,cpu.threads", "-f", "json")
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr
    rows = {r["check"]: r for r in json.loads(proc.stdout)["results"]}
    assert set(rows) == {"shm.size", "cpu.threads"}
    assert all(r["status"] != "error" for r in rows.values()), rows


def test_modules_come_from_the_checkout_not_an_install(checkout):
    proc = _run_in(checkout, "import envdoctor.checks as c, envdoctor.exporters as e, envdoctor; "
                             "print(c.__file__); print(e.__file__); print(envdoctor.__file__)")
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.split():
        assert line.startswith(str(checkout)), (line, checkout)


def test_preflight_works_from_the_repository_root(checkout):
    proc = _run_in(checkout, "import envdoctor, json; rs = envdoctor.preflight(file=None); "
                             "print(json.dumps([[r.check, r.status.value, r.summary] for r in rs]))")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert {"shm.size", "cpu.threads"} <= {c for c, _, _ in rows}
    broken = [r for r in rows if r[1] == "error" and "could not be loaded" in r[2]]
    assert not broken, broken


def test_a_plugin_exporter_is_one_file_and_one_entry_point(plugin_env):
    proc = cli("check", "--only", "shm.size", "-f", "example-csv", env=plugin_env)
    assert proc.returncode in (0, 1), proc.stderr
    rows = list(csv.reader(io.StringIO(proc.stdout)))
    assert rows[0] == ["check", "target", "status", "summary"]
    assert rows[1][0] == "shm.size" and rows[1][1] == "self"
    help_text = cli("check", "-f", "nope", env=plugin_env)
    assert help_text.returncode == 2 and "example-csv" in help_text.stderr


def test_every_builtin_exporter_declares_its_content_type_and_extension():
    from envdoctor import export

    for name in ("text", "json", "markdown", "junit", "prometheus"):
        exporter = export.get(name)
        assert exporter.name == name and "/" in exporter.content_type and exporter.extension
    with pytest.raises(export.UnknownFormat, match="choose from"):
        export.get("yaml")


# -- the atomic writer ------------------------------------------------------------------

def test_writing_to_dev_null_leaves_the_device_a_device(tmp_path):
    from envdoctor.atomicfile import write_atomic

    write_atomic("/dev/null", "report\n")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_symlink_target_is_followed_and_the_link_kept(tmp_path):
    from envdoctor.atomicfile import write_atomic

    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    write_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_links_planted_at_temporary_names_are_never_written_through(tmp_path):
    from envdoctor.atomicfile import write_atomic

    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "report.json"
    for name in ("report.json.tmp", ".report.json.tmp", ".report.json.", "report.json~"):
        (tmp_path / name).symlink_to(victim)
    write_atomic(out, "{}")
    assert victim.read_text() == "precious"
    assert out.read_text() == "{}" and not out.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()) == []


def test_a_regular_file_keeps_its_permissions(tmp_path):
    from envdoctor.atomicfile import write_atomic

    out = tmp_path / "r.txt"
    out.write_text("x")
    out.chmod(0o640)
    write_atomic(out, "y")
    assert stat.S_IMODE(out.stat().st_mode) == 0o640 and out.read_text() == "y"


@pytest.mark.parametrize("where", [".", "/", "missing-dir/r.txt"])  # '' is bad usage: test_cli
def test_bad_output_paths_are_one_line_and_exit_74(tmp_path, where):
    proc = cli("check", "--only", "shm.size", "-o", where, cwd=tmp_path)
    assert proc.returncode == 74, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("envdoctor: cannot write")


def test_a_fifo_without_a_reader_is_refused_at_once_and_with_one_gets_the_report(tmp_path):
    from envdoctor.atomicfile import write_atomic
    from envdoctor.errors import OutputError

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="no reader"):
        write_atomic(fifo, "x")
    got: list[bytes] = []
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader is there
    reader = threading.Thread(target=lambda: got.append(os.read(fd, 100)))
    write_atomic(fifo, "through the pipe")
    reader.start()
    reader.join(5)
    os.close(fd)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare for a tiny tmpfs")
def test_a_full_disk_leaves_no_temporary_file_and_the_old_report_intact():
    script = (
        "import os, sys\n"
        "from envdoctor.atomicfile import write_atomic\n"
        "from envdoctor.errors import OutputError\n"
        "open('/mnt/r.txt','w').write('old report')\n"
        "try:\n"
        "    write_atomic('/mnt/r.txt', 'x' * 200000)\n"
        "    print('written')\n"
        "except OutputError as e:\n"
        "    print('error:', e)\n"
        "print(sorted(os.listdir('/mnt')), open('/mnt/r.txt').read())\n"
    )
    shell = f"mount -t tmpfs -o size=64k tmpfs /mnt && {sys.executable} -c \"$0\""
    proc = subprocess.run(["unshare", "-m", "sh", "-c", shell, script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "error: cannot write /mnt/r.txt: No space left on device" in proc.stdout
    assert "['r.txt'] old report" in proc.stdout


def test_a_closed_stdout_is_one_line_not_a_traceback():
    code = ("import os, sys; r, w = os.pipe(); os.close(r); os.dup2(w, 1); "
            "sys.argv = ['envdoctor', 'check', '--only', 'shm.size', '-f', 'json']; "
            "from envdoctor.cli import main; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 74, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "cannot write the report to standard output" in proc.stderr


# -- the logger -------------------------------------------------------------------------

def test_log_lines_are_logfmt_and_redacted(monkeypatch):
    from envdoctor import log

    monkeypatch.setenv("HF_TOKEN", "hf_supersecretvalue123")
    stream = io.StringIO()
    log.configure("info", stream)
    try:
        log.event("info", "run finished", targets=3, note='token hf_supersecretvalue123 "quoted"\nnext')
        log.event("debug", "not shown")
    finally:
        log.configure("info", None)
    line = stream.getvalue()
    assert line.count("\n") == 1
    assert "level=info" in line and 'msg="run finished"' in line and "targets=3" in line
    assert "hf_supersecretvalue123" not in line and "***" in line
    assert '\\"quoted\\"' in line and "\\x0a" in line


def test_another_users_link_in_a_sticky_shared_folder_is_not_followed(tmp_path):
    """helper-70: root's atomic write (serve --textfile, check -o) followed a link another user
    planted in a world-writable sticky folder (/tmp) and replaced what it named; a rename
    never asks the kernel to follow the link, so fs.protected_symlinks did not stop it.
    The same link made by us, or by the folder's owner, is still followed."""
    from envdoctor.atomicfile import OutputError, write_atomic

    if os.geteuid() != 0:
        pytest.skip("needs root: a link owned by another user")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = shared / "envdoctor.prom"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)  # nobody's
    with pytest.raises(OutputError, match=r"symlink that another user \(uid 65534\) made in .*not followed"):
        write_atomic(link, "metrics\n")
    assert victim.read_text() == "precious" and link.is_symlink()
    out = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--once", "--textfile", str(link)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 74 and "not followed" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert victim.read_text() == "precious"
    os.lchown(link, 0, 0)  # ours: followed, as before
    write_atomic(link, "metrics\n")
    assert victim.read_text() == "metrics\n" and link.is_symlink()
    shared.chmod(0o777)  # no sticky bit: the kernel follows anyone's link there too
    os.lchown(link, 65534, 65534)
    write_atomic(link, "again\n")
    assert victim.read_text() == "again\n"
