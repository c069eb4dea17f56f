"""`envdoctor serve --once` over a fixture node whose files break the ways a real node
breaks them: every file the clean run opened under the roots is, in turn, a FIFO, gone,
unreadable, garbage or huge. The run must end within its bound, write a textfile with
the node's rows, and say nothing with a traceback. (test_fault_matrix.py does the same
for `check --pid`; serve reads more: discovery's stat/maps/environ/cgroup, and the
memory sampler's status/meminfo/cgroup files.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import unprivileged_envdoctor
from test_fault_matrix import FAULTS, PID, _break, build_tree

SLACK = 30.0  # interpreter start, plug-in import and one run on a loaded 2-core machine; a hang overshoots it
_RECORDER = """
import atexit, os, sys
seen = set()
def hook(event, a):
    if event == "open" and a and isinstance(a[0], (str, bytes, os.PathLike)):
        seen.add(os.fsdecode(a[0]))
sys.addaudithook(hook)
record = sys.argv[1]
atexit.register(lambda: open(record, "w").write("\\n".join(sorted(seen))))
sys.argv = ["envdoctor"] + sys.argv[2:]
from envdoctor.cli import main
main()
"""


def serve_tree(root: Path) -> dict[str, Path]:
    """The fault matrix's node, its process made a torch job that serve's discovery finds
    (comm python, libtorch mapped) and a memory cgroup the sampler reads."""
    roots = build_tree(root)
    proc = roots["procfs"] / str(PID)
    (proc / "stat").write_bytes(f"{PID} (python) S 1 {PID} {PID} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 9 0 1 0 0\n".encode())
    (proc / "comm").write_bytes(b"python\n")
    (proc / "maps").write_bytes(b"7f0000000000-7f0000001000 r-xp 00000000 08:01 42 /opt/torch/lib/libtorch_cpu.so\n")
    (proc / "status").write_bytes(b"Name:\tpython\nState:\tS (sleeping)\nUid:\t0\t0\t0\t0\nVmRSS:\t  102400 kB\n"
                                  b"Cpus_allowed_list:\t0-3\n")
    memory = roots["sysfs"] / "fs" / "cgroup" / "job.slice" / "train"
    (memory / "memory.current").write_bytes(b"104857600\n")
    (memory / "memory.max").write_bytes(b"1073741824\n")
    (memory / "memory.stat").write_bytes(b"anon 100\ninactive_file 4096\n")
    return roots


def serve_args(roots: dict[str, Path], textfile: Path) -> list[str]:
    return ["serve", "--once", "--textfile", str(textfile), "--path.procfs", str(roots["procfs"]),
            "--path.sysfs", str(roots["sysfs"]), "--path.rootfs", str(roots["rootfs"])]


def _env() -> dict[str, str]:
    env = {**os.environ, "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1", "ENVDOCTOR_ANNOUNCE_DIR": "/nonexistent-envdoctor"}
    env.pop("ENVDOCTOR_CONFIG", None)
    return env


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-faults")
    roots = serve_tree(root / "tree")
    record, textfile = root / "opened.txt", root / "clean.prom"
    proc = subprocess.run([sys.executable, "-c", _RECORDER, str(record), *serve_args(roots, textfile)],
                          capture_output=True, text=True, env=_env(), timeout=120, cwd=root)
    assert proc.returncode == 0, proc.stderr
    tree = (root / "tree").resolve()
    opened = sorted({Path(p).resolve().relative_to(tree).as_posix() for p in record.read_text().splitlines()
                     if p and Path(p).resolve().is_relative_to(tree) and Path(p).is_file()})
    return root / "tree", opened, textfile.read_text()


def test_the_clean_run_finds_the_job_and_samples_it(clean):
    _, opened, exposition = clean
    for needed in (f"proc/{PID}/stat", f"proc/{PID}/maps", f"proc/{PID}/status", f"proc/{PID}/environ",
                   "sys/fs/cgroup/job.slice/train/memory.current"):
        assert needed in opened, f"{needed} was not read: {opened}"
    assert f'target="pid:{PID}"' in exposition


def _run_faulted(clean, tmp_path: Path, relative: str, fault: str):
    source, _, _ = clean
    tree = tmp_path / "tree"
    shutil.copytree(source, tree, symlinks=True)
    _break(tree / relative, fault)
    roots = {"procfs": tree / "proc", "sysfs": tree / "sys", "rootfs": tree / "root"}
    textfile = tmp_path / "out.prom"
    if fault == "denied":
        proc = unprivileged_envdoctor(*serve_args(roots, textfile), env={"ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1",
                                      "ENVDOCTOR_ANNOUNCE_DIR": "/nonexistent-envdoctor"}, timeout=SLACK)
    else:
        proc = subprocess.run([sys.executable, "-m", "envdoctor", *serve_args(roots, textfile)], capture_output=True,
                              text=True, env=_env(), timeout=SLACK)
    return proc, textfile


@pytest.mark.parametrize("fault", FAULTS)
def test_every_file_every_fault_ends_with_a_textfile(clean, tmp_path, fault):
    if fault == "denied" and os.geteuid() != 0:
        pytest.skip("needs root to drop capabilities")
    _, opened, _ = clean
    assert opened
    for i, relative in enumerate(opened):
        where = f"{relative} ({fault})"
        try:
            proc, textfile = _run_faulted(clean, tmp_path / str(i), relative, fault)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{where}: serve --once did not end within {SLACK} s") from None
        assert "Traceback" not in proc.stderr, f"{where}: {proc.stderr[-2000:]}"
        assert proc.returncode == 0, f"{where}: rc={proc.returncode} {proc.stderr[-2000:]}"
        exposition = textfile.read_text()
        assert 'envdoctor_check_status{check="shm.size",status="ok",target="node"}' in exposition \
            or 'target="node"' in exposition, f"{where}: no node rows"
        assert "run failed" not in proc.stderr, f"{where}: {proc.stderr[-2000:]}"


def test_a_unicode_digit_name_in_the_announce_dir_does_not_fail_the_run(tmp_path):
    """Any job may drop files in the announce directory; '²³.json' passed str.isdigit() and
    int() refused it, so every run failed (--once: a traceback). Now it is not a pid, and the
    process that did announce itself is still found."""
    announce = tmp_path / "announce"
    announce.mkdir()
    job = subprocess.Popen(["sleep", "60"])
    try:
        from envdoctor.announce import start_ticks

        ticks = start_ticks("/proc", job.pid)
        (announce / "²³.json").write_text(json.dumps({"pid": 23, "start_ticks": ticks}))
        (announce / f"{job.pid}.json").write_text(json.dumps({"pid": job.pid, "start_ticks": ticks}))
        textfile = tmp_path / "out.prom"
        env = {**_env(), "ENVDOCTOR_ANNOUNCE_DIR": str(announce)}
        proc = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--once", "--textfile", str(textfile)],
                              capture_output=True, text=True, env=env, timeout=120)
    finally:
        job.kill()
        job.wait()
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f'target="pid:{job.pid}"' in textfile.read_text()


def test_an_announced_pid_whose_stat_is_a_fifo_does_not_hang_the_run(tmp_path):
    """announce.start_ticks opened <procfs>/PID/stat with a plain open(): with a FIFO there
    (a --path.procfs tree) every run waited for a writer that never came."""
    roots = serve_tree(tmp_path / "tree")
    stat_file = roots["procfs"] / str(PID) / "stat"
    stat_file.unlink()
    os.mkfifo(stat_file)
    announce = tmp_path / "announce"
    announce.mkdir()
    (announce / f"{PID}.json").write_text(json.dumps({"pid": PID, "start_ticks": 1}))
    env = {**_env(), "ENVDOCTOR_ANNOUNCE_DIR": str(announce)}
    textfile = tmp_path / "out.prom"
    proc = subprocess.run([sys.executable, "-m", "envdoctor", *serve_args(roots, textfile)], capture_output=True,
                          text=True, env=env, timeout=SLACK)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert 'target="node"' in textfile.read_text()


@pytest.mark.parametrize("value", ["nan", "inf", "1e999", "1e10", "86401"])
def test_an_interval_that_is_not_a_finite_number_is_refused_at_start(value):
    """NaN passed `interval < 1`: runs back to back (a core at 100 %) and /healthz 503 forever;
    inf ran once and never again; 1e10 overflowed the scheduler's timed wait after the first
    run and killed its thread while /healthz said ok. Exit 2, one line, nothing listens."""
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--web.listen-address", "127.0.0.1:0",
                           "--interval", value], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 2 and "--interval" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e10"])
def test_a_serve_table_interval_that_is_not_finite_names_the_key(tmp_path, value):
    config = tmp_path / "envdoctor.toml"
    config.write_text(f"[serve]\ninterval = {value}\n")
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--once", "--config", str(config)],
                          capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 2 and "serve.interval" in proc.stderr and ":2" in proc.stderr, proc.stderr


def test_a_textfile_that_is_a_fifo_with_a_stalled_reader_does_not_block(tmp_path):
    """A reader that opened the FIFO and stopped reading: the second run's write filled the
    pipe and blocked for good (in the daemon: the scheduler thread, every run after it)."""
    fifo = tmp_path / "envdoctor.prom"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # holds the FIFO open, never reads
    try:
        for _ in range(3):
            proc = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--once", "--textfile", str(fifo)],
                                  capture_output=True, text=True, env=_env(), timeout=SLACK)
            assert proc.returncode == 74 and "FIFO" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    finally:
        os.close(reader)


@pytest.mark.parametrize("variable", ["ENVDOCTOR_ONLY", "ENVDOCTOR_SKIP"])
@pytest.mark.parametrize("once", [True, False])
def test_an_unknown_check_id_from_the_environment_is_refused_at_start(variable, once):
    """It started, and every run logged 'target not examined' and examined nothing while
    /healthz said ok; the same id in the file's only/skip was already exit 2."""
    from helpers import cli

    args = ["--once"] if once else ["--web.listen-address", "127.0.0.1:0"]
    proc = cli("serve", *args, env={variable: "no.such_check"}, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "unknown check id 'no.such_check'" in proc.stderr


def test_a_path_procfs_that_is_not_a_procfs_is_said_at_start(tmp_path):
    """helper-67: `--path.procfs /tmp` ran with the node alone and said nothing. It still runs
    (a container whose /proc mount is late is not refused) but warns once, naming the path;
    the real /proc does not warn."""
    textfile = tmp_path / "out.prom"
    for procfs, warned in ((tmp_path, True), (Path("/proc"), False)):
        proc = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--once", "--textfile", str(textfile),
                               "--path.procfs", str(procfs)], capture_output=True, text=True, env=_env(), timeout=120)
        assert proc.returncode == 0, proc.stderr
        line = f'msg="no process under --path.procfs" path={procfs}'
        assert (line in proc.stderr) is warned, proc.stderr
        assert 'target="node"' in textfile.read_text()
