"""`-o` and `exec --report` into what a shell already opened (/dev/stdout, /dev/fd/N),
onto a file owned by someone else, and onto a bind-mounted file: the file the user
meant gets the report, and nothing else of theirs is lost (helper-29's findings)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ENV = {**os.environ, "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
CHECK = f"{sys.executable} -m envdoctor check --only shm.size -f json"


def sh(script: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


def report_in(text: str) -> dict:
    start = text.index("{")
    return json.JSONDecoder().raw_decode(text[start:])[0]


@pytest.mark.parametrize("script, after", [
    (f"(echo head; {CHECK} -o /dev/stdout; echo foot) >> log.txt", ("head\n", "foot\n")),
    # exec: the job's own output follows, in the same log
    (f"{sys.executable} -m envdoctor exec --only shm.size --report /dev/stdout -- echo RAN >> log.txt", ("", "RAN\n")),
])
def test_dev_stdout_appended_by_the_shell_keeps_what_the_log_held(tmp_path, script, after):
    (tmp_path / "log.txt").write_text("PREV 1\nPREV 2\n")
    proc = sh(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "log.txt").read_text()
    assert text.startswith("PREV 1\nPREV 2\n" + after[0]) and text.endswith(after[1]), text
    assert report_in(text)["results"][0]["check"] == "shm.size"


@pytest.mark.parametrize("path", ["/dev/stdout", "/proc/self/fd/1", "/dev/fd/1"])
def test_dev_stdout_that_is_a_pipe_gets_the_report(tmp_path, path):
    proc = sh(f"{CHECK} -o {path} | cat", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert report_in(proc.stdout)["schema"] == "envdoctor.report/v1"


def test_a_descriptor_the_shell_opened_is_written_through(tmp_path):
    proc = sh(f"{CHECK} -o /dev/fd/7 7>>fd7.txt >/dev/null", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert report_in((tmp_path / "fd7.txt").read_text())["results"]


@pytest.mark.parametrize("script", [f"{CHECK} -o /dev/stdout >&- 2>err.txt", f"{CHECK} -o /dev/fd/9 2>err.txt"])
def test_a_descriptor_that_is_not_open_is_exit_74_and_nothing_else_is_written(tmp_path, script):
    """With stdout closed, descriptor 1 may be reused inside the process (a dup of stderr):
    the report went into the error log before."""
    proc = sh(script, tmp_path)
    assert proc.returncode == 74
    err = (tmp_path / "err.txt").read_text()
    assert "is not open" in err and len(err.strip().splitlines()) == 1 and "{" not in err, err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own a file as another user")
@pytest.mark.parametrize("mode", [0o640, 0o6755])  # a chown after the chmod cleared the set-id bits
def test_root_rewriting_a_users_report_leaves_it_theirs(tmp_path, mode):
    nobody = pwd.getpwnam("nobody")
    out = tmp_path / "owned.json"
    out.write_text("old")
    os.chown(out, nobody.pw_uid, nobody.pw_gid)
    out.chmod(mode)
    proc = sh(f"{CHECK} -o owned.json", tmp_path)
    assert proc.returncode == 0, proc.stderr
    st = out.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (nobody.pw_uid, nobody.pw_gid, mode)
    assert report_in(out.read_text())["results"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -m")
def test_a_bind_mounted_report_file_is_rewritten_in_place(tmp_path):
    """docker run -v host.json:/out/report.json: the file is a mount point, which rename
    cannot replace (EBUSY); the report lands in the host's file all the same."""
    (tmp_path / "host.json").write_text("old host content\n")
    (tmp_path / "bound.json").write_text("")
    proc = sh(f"unshare -m sh -c 'mount --bind host.json bound.json && {CHECK} -o bound.json'", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert report_in((tmp_path / "host.json").read_text())["results"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bound.json", "host.json"]  # no temporary left


@pytest.mark.parametrize("path", ["/proc/self/task/$$/fd/1", "/proc/$$/task/$$/fd/1", "/proc/thread-self/fd/1",
                                  "$PWD/pself/fd/1", "$PWD/fdl/../fd/1", "$PWD/up", "log.txt"])
def test_every_spelling_of_our_stdout_appends(tmp_path, path):
    """helper-30 and helper-31: a task's fd folder, a link to /proc/self used as a folder,
    `..` after a link, a relative link climbing to / and the log's own name all led to
    the log file, which was renamed over."""
    (tmp_path / "pself").symlink_to("/proc/self")
    (tmp_path / "fdl").symlink_to("/proc/self/fd")
    (tmp_path / "up").symlink_to("../" * len(tmp_path.parts) + "proc/self/fd/1")
    (tmp_path / "log.txt").write_text("old line\n")
    proc = sh(f"exec {CHECK} -o {path} >> log.txt", tmp_path)  # exec: $$ is envdoctor's pid
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "log.txt").read_text()
    assert text.startswith("old line\n") and report_in(text)["results"], text


def test_a_descriptor_envdoctor_opened_itself_is_not_the_users(tmp_path):
    """`-o /dev/fd/3` without `3>file`: descriptor 3 was envdoctor's own (a dup of stderr),
    and the report went there with exit 0. Only descriptors it started with are taken."""
    proc = sh(f"{CHECK} -o /dev/fd/3 2>err.txt >out.txt", tmp_path)
    assert proc.returncode == 74
    assert "file descriptor 3 is not open" in (tmp_path / "err.txt").read_text()
    assert "{" not in (tmp_path / "err.txt").read_text() + (tmp_path / "out.txt").read_text()


def test_another_processs_descriptor_is_refused_and_its_file_kept(tmp_path):
    log = tmp_path / "theirs.log"
    other = subprocess.Popen(["sh", "-c", "echo kept; exec sleep 30"], stdout=open(log, "w"))
    try:
        import time

        deadline = time.monotonic() + 10
        while "kept" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc = sh(f"{CHECK} -o /proc/{other.pid}/fd/1", tmp_path)
        assert proc.returncode == 74 and f"descriptor of process {other.pid}" in proc.stderr, proc.stderr
        assert log.read_text() == "kept\n" and os.path.samefile(f"/proc/{other.pid}/fd/1", log)
    finally:
        other.kill()
        other.wait()



@pytest.mark.parametrize("link, said", [("/proc/self/fd/1/", "Not a directory"), ("c40", "Too many levels of symbolic links"),
                                        ("/dev/fd/01", "No such file or directory")])
def test_what_the_kernel_would_refuse_is_refused_and_the_log_kept(tmp_path, link, said):
    (tmp_path / "c0").symlink_to("/proc/self/fd/1")
    for i in range(1, 41):
        (tmp_path / f"c{i}").symlink_to(f"c{i - 1}")
    (tmp_path / "it").symlink_to(link if link.startswith("/") else tmp_path / link)
    (tmp_path / "log.txt").write_text("kept\n")
    target = "/dev/fd/01" if link == "/dev/fd/01" else "$PWD/it"
    proc = sh(f"{CHECK} -o {target} >> log.txt", tmp_path)
    assert proc.returncode == 74 and said in proc.stderr, proc.stderr
    assert (tmp_path / "log.txt").read_text() == "kept\n"


def test_another_processs_descriptor_through_a_link_is_refused_too(tmp_path):
    log = tmp_path / "theirs.log"
    other = subprocess.Popen(["sleep", "30"], stdout=open(log, "w"))
    try:
        (tmp_path / "other").symlink_to(f"/proc/{other.pid}/fd")
        proc = sh(f"{CHECK} -o $PWD/other/../fd/1", tmp_path)
        assert proc.returncode == 74 and f"descriptor of process {other.pid}" in proc.stderr, proc.stderr
        assert os.path.samefile(f"/proc/{other.pid}/fd/1", log)
    finally:
        other.kill()
        other.wait()


NOBODY_ENV = "setpriv --reuid=nobody --regid=nogroup --clear-groups"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_as_another_user_a_file_one_may_write_but_not_replace_is_written_and_one_may_not_write_is_kept(tmp_path):
    """A root-owned 0666 file in a sticky directory: rename is refused (EPERM) where a
    shell's > succeeds; it is written in place. A root-owned 0644 file in a directory
    anyone may write was renamed over, now owned by nobody; it is refused, as > would."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="envdoctor-nobody-", dir="/tmp"))  # pytest's tmp_path is 0700 above
    base.chmod(0o755)
    try:
        # envdoctor where nobody can read it: the checkout or venv may lie under a 0700 folder
        package = Path(__import__("envdoctor").__file__).parent
        shutil.copytree(package, base / "lib" / "envdoctor", ignore=shutil.ignore_patterns("__pycache__"))
        for folder in [base / "lib", *(base / "lib").rglob("*")]:
            folder.chmod(0o755 if folder.is_dir() else 0o644)
        _sticky_cases(base / "sticky", str(base / "lib"))
    finally:
        shutil.rmtree(base)


def _sticky_cases(sticky: Path, site: str) -> None:
    sticky.mkdir()
    sticky.chmod(0o1777)
    shared = sticky / "shared.json"
    shared.write_text("old")
    shared.chmod(0o666)
    theirs = sticky / "theirs.json"
    theirs.write_text("root's")
    theirs.chmod(0o644)
    code = ("import sys; from envdoctor.atomicfile import write_atomic; from envdoctor.errors import OutputError\n"
            "try:\n    write_atomic(sys.argv[1], 'new'); print('written')\n"
            "except OutputError as exc:\n    print(exc)")
    run = lambda path: subprocess.run([*NOBODY_ENV.split(), sys.executable, "-c", code, str(path)], capture_output=True,
                                      text=True, env={**ENV, "PYTHONPATH": site}, timeout=60)
    first = run(shared)
    if first.returncode != 0 and "envdoctor" not in first.stderr:  # setpriv could not run this interpreter as nobody
        pytest.skip(f"this interpreter is not usable as nobody: {first.stderr.strip()[:200]}")
    assert first.stdout.strip() == "written" and shared.read_text() == "new", (first.stdout, first.stderr)
    assert shared.stat().st_uid == 0
    second = run(theirs)
    assert "Permission denied" in second.stdout and theirs.read_text() == "root's", (second.stdout, second.stderr)
    assert sorted(p.name for p in sticky.iterdir()) == ["shared.json", "theirs.json"]


def test_a_file_held_open_for_a_lock_is_replaced_whole_not_overwritten_in_part(tmp_path):
    """`exec 9<>file; flock 9` then `-o file`: written at fd 9's offset, the report left the
    old content's tail behind it (helper-32). Only stdout, stderr and appending
    descriptors are written through; this one is replaced as any file."""
    (tmp_path / "rep").write_text("OLD-" * 5000)
    proc = sh(f"exec 9<>rep; {CHECK} -o rep", tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "rep").read_text()
    assert "OLD-" not in text and report_in(text)["results"]


def test_a_link_to_a_descriptor_envdoctor_opened_itself_is_not_open(tmp_path):
    """A link to /proc/self/fd/3 reached envdoctor's own dup of stderr, and the report went
    to stderr with exit 0."""
    (tmp_path / "s3").symlink_to("/proc/self/fd/3")
    proc = sh(f"{CHECK} -o $PWD/s3 >out.txt 2>err.txt", tmp_path)
    assert proc.returncode == 74
    assert "file descriptor 3 is not open" in (tmp_path / "err.txt").read_text()
    assert "{" not in (tmp_path / "err.txt").read_text() + (tmp_path / "out.txt").read_text()


def test_a_long_file_name_the_file_system_takes_is_written(tmp_path):
    name = "r" * 250  # the temporary's name was this plus 14 characters: too long
    proc = sh(f"{CHECK} -o {name}", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert report_in((tmp_path / name).read_text())["results"]
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_a_non_blocking_stdout_pipe_gets_the_whole_report(tmp_path):
    """A pipe someone set O_NONBLOCK, read late: the text layer wrote what fit (4 KiB) and
    the rest was dropped at exit, with exit 0."""
    import fcntl
    import time

    r, w = os.pipe()
    fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ: a small pipe
    os.set_blocking(w, False)
    proc = subprocess.Popen([sys.executable, "-m", "envdoctor", "check", "-f", "json", "-o", "-"], stdout=w,
                            stderr=subprocess.PIPE, env=ENV, cwd=tmp_path)
    os.close(w)
    time.sleep(2)
    with os.fdopen(r, "rb") as reader:
        data = reader.read()
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    assert json.loads(data)["results"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -m")
def test_a_writable_file_mounted_into_a_read_only_folder_is_written_in_place(tmp_path):
    """A container with a read-only root and `-v out.json:/out/out.json`: no temporary can
    be made beside the file, but the file may be written, as > does."""
    (tmp_path / "rodir").mkdir()
    (tmp_path / "rodir" / "out.json").write_text("")
    (tmp_path / "host.json").write_text("old\n")
    script = ("mount --bind rodir rodir && mount -o remount,bind,ro rodir && "
              f"mount --bind host.json rodir/out.json && {CHECK} -o rodir/out.json")
    proc = sh(f"unshare -m sh -c '{script}'", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert report_in((tmp_path / "host.json").read_text())["results"]
