"""Issue 8, family 1: writing a report never destroys anything. Hypothesis builds a
directory of every kind of entry (files, links to files inside and outside, dangling
links, link loops, a FIFO, a socket, a sub-directory, links planted at temporary-looking
names) and writes to any of them, or to paths that make no sense; afterwards nothing but
the named file may have changed, nothing may be left behind, and a failure is one
OutputError line. The CLI runs attack -o and stdout the same way (exit 74, one line)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envdoctor.atomicfile import write_atomic
from envdoctor.errors import OutputError
from helpers import cli, unprivileged_envdoctor

KINDS = ["file", "link_in", "link_out", "dangling", "loop", "fifo", "socket", "dir", "link_dir", "link_devnull",
         "planted_tmp"]


def _populate(directory: Path, outside: Path, entries: list[tuple[str, str]]) -> None:
    for name, kind in entries:
        path = directory / name
        if kind == "file":
            path.write_text(f"old {name}")
        elif kind == "link_in":
            (directory / f"{name}.real").write_text(f"real {name}")
            path.symlink_to(f"{name}.real")
        elif kind == "link_out":
            path.symlink_to(outside / "victim")
        elif kind == "dangling":
            path.symlink_to(directory / f"{name}.nowhere")
        elif kind == "loop":
            path.symlink_to(path)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "socket":
            sock = socket.socket(socket.AF_UNIX)
            sock.bind(str(path))
            sock.close()
        elif kind == "dir":
            path.mkdir()
        elif kind == "link_dir":
            path.symlink_to(outside)
        elif kind == "link_devnull":
            path.symlink_to("/dev/null")
        elif kind == "planted_tmp":  # what an attacker guesses the temporary file will be called
            for guess in (f"{name}.tmp", f".{name}.tmp", f".{name}.", f"{name}~", f".{name}.XXXXXX.tmp"):
                if not (directory / guess).exists() and not (directory / guess).is_symlink():
                    (directory / guess).symlink_to(outside / "victim")


def _snapshot(directory: Path) -> dict[str, tuple]:
    """Every entry: its type, link target and content (what must not change)."""
    out = {}
    for entry in sorted(os.listdir(directory)):
        path = directory / entry
        st_ = os.lstat(path)
        if stat.S_ISLNK(st_.st_mode):
            out[entry] = ("link", os.readlink(path))
        elif stat.S_ISREG(st_.st_mode):
            out[entry] = ("file", path.read_bytes(), stat.S_IMODE(st_.st_mode))
        else:
            out[entry] = (stat.S_IFMT(st_.st_mode),)
    return out


names = st.sampled_from(["report.json", "out", "r.txt", "x"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.dictionaries(names, st.sampled_from(KINDS), max_size=4),
       target=st.one_of(names, st.sampled_from(["", ".", "/", "missing/r.txt", "report.json/x", "//"])),
       data=st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_write_atomic_changes_nothing_but_its_target(tmp_path_factory, entries, target, data):
    base = tmp_path_factory.mktemp("w")
    directory, outside = base / "d", base / "outside"
    directory.mkdir()
    outside.mkdir()
    (outside / "victim").write_text("precious")
    _populate(directory, outside, list(entries.items()))
    before = _snapshot(directory)
    kind = entries.get(target)
    if kind == "planted_tmp":  # only its guessed temporary names exist: the target itself is new
        kind = None
    path = target if target in ("", "/", "//") else str(directory / target)
    try:
        write_atomic(path, data)
        ok = True
    except OutputError as exc:
        ok = False
        assert "\n" not in str(exc) and str(exc)
    after = _snapshot(directory)
    expected_payload = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data

    # the victim outside is only ever changed by writing to a link that points at it, on purpose
    if kind != "link_out":
        assert (outside / "victim").read_text() == "precious"
    # no temporary file is left behind, whatever happened
    created = set(after) - set(before)
    allowed = {target} | ({f"{target}.nowhere"} if kind == "dangling" else set())  # a dangling link names the file to create
    assert created <= allowed, f"left behind: {created - allowed}"
    # every other entry is exactly as it was; special files keep their type
    for entry, was in before.items():
        if entry == target and kind in ("file", None):
            continue
        if entry == f"{target}.real" and kind == "link_in":
            continue
        assert after.get(entry) == was, (entry, was, after.get(entry))
    if ok:
        if kind in (None, "file"):
            assert (directory / target).read_bytes() == expected_payload and not (directory / target).is_symlink()
        elif kind == "link_in":
            assert (directory / f"{target}.real").read_bytes() == expected_payload
        elif kind == "link_out":
            assert (outside / "victim").read_bytes() == expected_payload
        elif kind == "dangling":
            assert (directory / f"{target}.nowhere").read_bytes() == expected_payload
        else:
            assert kind == "link_devnull", f"wrote to a {kind}"
    else:
        assert kind in ("fifo", "socket", "dir", "link_dir", "loop") or target in ("", ".", "/", "//", "missing/r.txt",
                                                                             "report.json/x") or "/" in target, (kind, target)


@pytest.mark.parametrize("where", ["", ".", "/", "missing-dir/r.txt", "dir", "fifo", "socket", "/dev/full", "loop"])
def test_cli_output_to_places_that_cannot_take_it_is_one_line_and_exit_74(tmp_path, where):
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "socket"))
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    before = _snapshot(tmp_path)
    proc = cli("check", "--only", "shm.size", "-f", "json", "-o", where, cwd=tmp_path,
               env={"ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"})
    sock.close()
    assert proc.returncode == (2 if where == "" else 74), (where, proc.returncode, proc.stderr)  # '' names no file
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert _snapshot(tmp_path) == before
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_cli_output_to_dev_null_and_a_devnull_link_keeps_the_device(tmp_path):
    (tmp_path / "null").symlink_to("/dev/null")
    for where in ("/dev/null", str(tmp_path / "null")):
        proc = cli("check", "--only", "shm.size", "-o", where, env={"ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"})
        assert proc.returncode in (0, 1), proc.stderr
        assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and os.readlink(tmp_path / "null") == "/dev/null"


def test_cli_output_into_a_read_only_directory_is_exit_74(tmp_path):
    """Root would write anyway: without its capabilities it cannot, as an ordinary user."""
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "r.json").write_text("old")
    (tmp_path / "ro").chmod(0o555)
    (tmp_path / "ro" / "r.json").chmod(0o444)
    proc = unprivileged_envdoctor("check", "--only", "shm.size", "-f", "json", "-o", str(tmp_path / "ro" / "r.json"),
                                  env={"ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert proc.returncode == 74 and "Permission denied" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert (tmp_path / "ro" / "r.json").read_text() == "old" and os.listdir(tmp_path / "ro") == ["r.json"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare for a tiny tmpfs")
@pytest.mark.parametrize("fmt", ["json", "text", "junit"])
def test_cli_full_disk_keeps_the_old_report_and_leaves_nothing(fmt):
    shell = (f"mount -t tmpfs -o size=4k tmpfs /mnt && echo old > /mnt/r && "
             f"{sys.executable} -m envdoctor check -f {fmt} -o /mnt/r; echo rc=$?; ls -a /mnt; cat /mnt/r")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", shell], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert "rc=74" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stdout.split("rc=74", 1)[1].split() == [".", "..", "r", "old"], proc.stdout
    assert "No space left on device" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("stdout", ["closed", "full", "broken_pipe"])
def test_cli_stdout_that_cannot_take_the_report_is_one_line(stdout):
    env = {**os.environ, "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
    args = [sys.executable, "-m", "envdoctor", "check", "--only", "shm.size", "-f", "json"]
    if stdout == "full":
        with open("/dev/full", "w") as full:
            proc = subprocess.run(args, stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=60)
    elif stdout == "closed":
        proc = subprocess.run(["sh", "-c", '"$@" >&-', "sh", *args], stderr=subprocess.PIPE, text=True, env=env, timeout=60)
    else:
        r, w = os.pipe()
        os.close(r)
        proc = subprocess.run(args, stdout=w, stderr=subprocess.PIPE, text=True, env=env, timeout=60)
        os.close(w)
    assert proc.returncode == 74, (stdout, proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("args, code, said", [
    (["check", "--only", "shm.size", "-o", "{tmp}/report.json/"], 74, "names a directory"),  # wrote report.json
    (["check", "--only", "shm.size", "--path.rootfs", ""], 2, "--path.rootfs needs a directory"),  # read '.'
    (["check", "--only", "shm.size", "--path.procfs", ""], 2, "--path.procfs needs a directory"),
    (["serve", "--once", "--textfile", "{tmp}/envdoctor.prom/"], 2, "give the path of a *.prom file"),  # wrote envdoctor.prom
    (["serve", "--once", "--path.sysfs", ""], 2, "--path.sysfs needs a directory"),
])
def test_a_path_that_names_a_directory_or_nothing_is_refused(tmp_path, args, code, said):
    """typer's Path turned '' into '.' and dropped a trailing slash, so these read the
    working directory or wrote a file named as the directory they meant."""
    from helpers import cli

    out = cli(*[a.replace("{tmp}", str(tmp_path)) for a in args], cwd=tmp_path, timeout=60)
    assert out.returncode == code and said in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere


@pytest.mark.skipif(os.geteuid() != 0, reason="root: the file's own permissions let it past the first test")
def test_a_file_in_proc_says_the_folder_takes_no_new_files():
    """Helper-38: `-o /proc/version` (exec --report too) said "No such file or directory"
    of a file that exists: the temporary beside it cannot be made in /proc."""
    proc = cli("check", "--only", "shm.size", "-f", "json", "-o", "/proc/version",
               env={"ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert proc.returncode == 74 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == ("envdoctor: cannot write /proc/version: no new file can be made in /proc "
                                   "(a file system such as /proc or /sys)"), proc.stderr
