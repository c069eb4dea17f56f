"""`envdoctor exec` in the situations a container puts it in, made for real (root only):
a 64 MiB /dev/shm in a private mount namespace, a 0.5-CPU cgroup, the job as PID 1
of its own PID namespace, and tini as that PID 1.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exec_log import events, one
from test_real_cgroup import _make_limited_cgroup, _remove

pytestmark = pytest.mark.real

PY = sys.executable
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
SHOW_THREADS = "import os, json; print(json.dumps({k: os.environ.get(k) for k in %r}))" % (THREAD_VARS,)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
    env.update(extra)
    return env


def _need_root_and(tool: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (namespaces, mounts, cgroups)")
    if shutil.which(tool) is None:
        pytest.skip(f"needs {tool}")


# ----------------------------------------------------------------------------- /dev/shm
def _in_shm_namespace(size: str, exec_args: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    _need_root_and("unshare")
    script = (f"mount --make-rprivate / && mount -t tmpfs -o size={size} tmpfs /dev/shm || exit 97; "
              f"exec {PY} -m envdoctor exec {exec_args}")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=tmp_path, env=_env(**env), capture_output=True,
                          text=True, timeout=120)
    if proc.returncode == 97:
        pytest.skip(f"cannot mount a tmpfs in a new mount namespace here: {proc.stderr.strip()}")
    return proc


def test_strict_refuses_a_64m_shm_with_78_and_the_command_leaves_no_trace(tmp_path):
    marker = tmp_path / "job-ran"
    proc = _in_shm_namespace("64m", f"--strict -- sh -c 'touch {marker}'", tmp_path)
    assert proc.returncode == 78, proc.stderr
    assert not marker.exists()
    fail = one(proc.stderr, "fail shm.size:")
    assert "/dev/shm is 64 MiB (Docker's default)" in fail["msg"]
    assert "docker run --shm-size=" in fail["fix"] and "medium: Memory" in fail["fix"]
    assert "--strict: not starting sh" in events(proc.stderr)[-1]["msg"]


def test_without_strict_the_job_runs_in_the_64m_namespace_and_the_log_names_the_problem(tmp_path):
    marker = tmp_path / "job-ran"
    # the job reports the size it got, proving it ran inside the namespace that was judged
    job = f"{PY} -c \"import os; s = os.statvfs('/dev/shm'); open('{marker}', 'w').write(str(s.f_blocks * s.f_frsize))\""
    proc = _in_shm_namespace("64m", f"--fix -- {job}", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert marker.read_text() == str(64 * 1024**2)
    fail = one(proc.stderr, "fail shm.size:")
    # --fix cannot grow /dev/shm from inside: the line says so and gives the outside fix
    assert fail["msg"].endswith("(not something --fix changes: see its fix)")
    assert fail["fix"].startswith("docker run --shm-size=")


def test_a_2g_shm_passes_strict(tmp_path):
    proc = _in_shm_namespace("2g", "--strict --only shm.size -- true", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert events(proc.stderr)[-1]["ok"] == "1"


# ----------------------------------------------------------------------------- CPU quota
@pytest.fixture(scope="module")
def half_cpu():
    cgroup = _make_limited_cgroup()
    try:
        yield cgroup
    finally:
        _remove(cgroup)


def _in_cgroup(cgroup, exec_args: list[str], **env: str) -> subprocess.CompletedProcess:
    """Move a shell into the cgroup, then exec envdoctor exec there (so the job is judged and run inside it)."""
    quoted = " ".join(shlex.quote(a) for a in exec_args)
    script = f"echo $$ > {cgroup.path}/cgroup.procs && exec {PY} -m envdoctor exec {quoted}"
    return subprocess.run(["sh", "-c", script], env=_env(**env), capture_output=True, text=True, timeout=120)


def test_fix_gives_the_job_thread_counts_that_fit_half_a_cpu(half_cpu):
    proc = _in_cgroup(half_cpu, ["--fix", "--", PY, "-c", SHOW_THREADS], OMP_NUM_THREADS="16")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == dict.fromkeys(THREAD_VARS, "1")
    assert one(proc.stderr, "set OMP_NUM_THREADS")["msg"] == "set OMP_NUM_THREADS 16 -> 1 (0.5 CPUs of cgroup quota)"
    assert one(proc.stderr, "set MKL_NUM_THREADS")["msg"] == "set MKL_NUM_THREADS unset -> 1 (0.5 CPUs of cgroup quota)"
    assert "warn cpu.threads" not in proc.stderr  # judged again on the fixed environment


def test_without_fix_the_job_gets_its_environment_unchanged_and_the_log_says_what_would_help(half_cpu):
    proc = _in_cgroup(half_cpu, ["--", PY, "-c", SHOW_THREADS], OMP_NUM_THREADS="16")
    assert json.loads(proc.stdout)["OMP_NUM_THREADS"] == "16"
    warn = one(proc.stderr, "warn cpu.threads:")
    assert "0.5 effective CPUs (cgroup quota" in warn["msg"] and warn["fix"].startswith("export OMP_NUM_THREADS=1 ")
    assert "--fix would set OMP_NUM_THREADS" in events(proc.stderr)[-1]["msg"]


def test_keep_leaves_a_variable_as_it_was(half_cpu):
    proc = _in_cgroup(half_cpu, ["--fix", "--keep", "OMP_NUM_THREADS", "--", PY, "-c", SHOW_THREADS], OMP_NUM_THREADS="16")
    got = json.loads(proc.stdout)
    assert got["OMP_NUM_THREADS"] == "16"
    # the ones the job did not set follow the kept one (helper-38: set to 1, they "disagreed" with it)
    assert all(got[name] is None for name in THREAD_VARS if name != "OMP_NUM_THREADS"), got
    assert one(proc.stderr, "kept OMP_NUM_THREADS=16 (--keep)")["msg"].endswith("wanted 1 (0.5 CPUs of cgroup quota)")
    assert one(proc.stderr, "kept MKL_NUM_THREADS=unset (--keep)")["msg"].endswith("left unset beside the kept OMP_NUM_THREADS)")
    warn = one(proc.stderr, "warn cpu.threads:")  # still oversubscribed, and the log says so, but of nothing --fix did
    assert "disagree" not in warn["msg"], warn


def test_keep_of_any_thread_variable_leaves_the_others_as_the_job_gave_them(half_cpu):
    """Helper-52: `--keep MKL_NUM_THREADS` with OMP=16 and MKL=16 gave the job OMP=2, and the
    row judged again said the variables disagree, as --keep OMP_NUM_THREADS had until f13d6a6."""
    proc = _in_cgroup(half_cpu, ["--fix", "--keep", "MKL_NUM_THREADS", "--", PY, "-c", SHOW_THREADS],
                      OMP_NUM_THREADS="16", MKL_NUM_THREADS="16")
    got = json.loads(proc.stdout)
    assert got["OMP_NUM_THREADS"] == "16" and got["MKL_NUM_THREADS"] == "16" and got["OPENBLAS_NUM_THREADS"] is None, got
    assert one(proc.stderr, "kept OMP_NUM_THREADS=16 (--keep)")["msg"].endswith("beside the kept MKL_NUM_THREADS)")
    assert "disagree" not in one(proc.stderr, "warn cpu.threads:")["msg"]


def test_keep_of_a_thread_variable_the_job_left_unset_does_not_hold_the_others(half_cpu):
    """Helper-53: --keep VECLIB_MAXIMUM_THREADS (unset; read on macOS only) left OMP=16 unfixed.
    An unset kept variable has no value for the others to disagree with."""
    proc = _in_cgroup(half_cpu, ["--fix", "--keep", "VECLIB_MAXIMUM_THREADS", "--", PY, "-c", SHOW_THREADS],
                      OMP_NUM_THREADS="16")
    got = json.loads(proc.stdout)
    assert got["OMP_NUM_THREADS"] == "1" and got["MKL_NUM_THREADS"] == "1" and got["VECLIB_MAXIMUM_THREADS"] is None, got


def test_keep_omp_leaves_the_thread_variables_the_job_set_as_they_were(half_cpu):
    """Helper-49: with OMP_NUM_THREADS=16 and MKL_NUM_THREADS=16, `--keep OMP_NUM_THREADS` gave
    the job MKL=1, and the row judged again said "thread variables disagree: OMP_NUM_THREADS=16,
    MKL_NUM_THREADS=1", a disagreement --fix had made."""
    proc = _in_cgroup(half_cpu, ["--fix", "--keep", "OMP_NUM_THREADS", "--", PY, "-c", SHOW_THREADS],
                      OMP_NUM_THREADS="16", MKL_NUM_THREADS="16")
    got = json.loads(proc.stdout)
    assert got["OMP_NUM_THREADS"] == "16" and got["MKL_NUM_THREADS"] == "16", got
    assert one(proc.stderr, "kept MKL_NUM_THREADS=16 (--keep)")["msg"].endswith("left as the job set it, beside the kept "
                                                                              "OMP_NUM_THREADS)")
    warn = one(proc.stderr, "warn cpu.threads:")  # still oversubscribed, of the job's own making
    assert "disagree" not in warn["msg"], warn


# ----------------------------------------------------------------------------- PID 1
def _pid1(args: list[str], **env: str) -> subprocess.CompletedProcess:
    _need_root_and("unshare")
    proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", *args], env=_env(**env), capture_output=True,
                          text=True, timeout=120)
    if proc.returncode != 0 and "unshare:" in proc.stderr and "Operation not permitted" in proc.stderr:
        pytest.skip(f"cannot make a PID namespace here: {proc.stderr.strip()}")
    return proc


LIST_PROCS = "import os; print(os.getpid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"


def test_as_pid_1_the_job_is_pid_1_and_alone(tmp_path):
    # no probe cache, so the torch probe really runs as a grandchild; it must be gone, reaped
    proc = _pid1([PY, "-m", "envdoctor", "exec", "--", PY, "-c", LIST_PROCS], ENVDOCTOR_NO_CACHE="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1 [1]", proc.stderr


def test_as_pid_1_a_probe_killed_at_the_timeout_leaves_no_zombie():
    proc = _pid1([PY, "-m", "envdoctor", "exec", "--timeout", "0.5", "--", PY, "-c", LIST_PROCS], ENVDOCTOR_NO_CACHE="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1 [1]", proc.stderr


@pytest.mark.parametrize("status", [0, 7, 255])
def test_as_pid_1_the_exit_status_passes_through(status):
    proc = _pid1([PY, "-m", "envdoctor", "exec", "--", "sh", "-c", f"exit {status}"])
    assert proc.returncode == status, proc.stderr


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.05)


def _handler_job(ready: Path) -> str:
    return ("import os, signal, sys, time, pathlib\n"
            "def bye(signum, frame):\n"
            "    print('handled', signum, 'as pid', os.getpid(), flush=True); sys.exit(42)\n"
            "signal.signal(signal.SIGTERM, bye)\n"
            f"pathlib.Path({str(ready)!r}).write_text(str(os.getpid()))\n"
            "for _ in range(600): time.sleep(0.1)\n")


def _ns_init(unshare_pid: int) -> int:
    """The host PID of the namespace's PID 1: unshare --fork's only child."""
    with open(f"/proc/{unshare_pid}/task/{unshare_pid}/children") as f:
        (child,) = f.read().split()
    return int(child)


@pytest.mark.parametrize("init", [[], ["tini", "--"]], ids=["job-as-pid-1", "under-tini"])
def test_sigterm_reaches_the_jobs_handler(tmp_path, init):
    _need_root_and("unshare")
    if init:
        _need_root_and("tini")
    ready = tmp_path / "ready"
    proc = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", *init, PY, "-m", "envdoctor", "exec", "--",
                             PY, "-c", _handler_job(ready)], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        _wait_for(ready, proc)
        # What a container runtime does on `docker stop`: SIGTERM to the container's PID 1.
        os.kill(_ns_init(proc.pid), signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    expected_pid = 2 if init else 1  # under tini the job is tini's first child; without it the job is PID 1
    assert ready.read_text() == str(expected_pid)
    assert out.strip() == f"handled {int(signal.SIGTERM)} as pid {expected_pid}", err
    assert proc.returncode == 42, err


def test_under_tini_exit_status_and_strict_pass_through(tmp_path):
    _need_root_and("tini")
    proc = _pid1(["tini", "--", PY, "-m", "envdoctor", "exec", "--", "sh", "-c", "exit 7"])
    assert proc.returncode == 7, proc.stderr
    marker = tmp_path / "ran"
    refused = _pid1(["tini", "--", PY, "-m", "envdoctor", "exec", "--strict", "--fail-on", "warn", "--only", "cpu.threads",
                     "--", "touch", str(marker)], OMP_NUM_THREADS="4096")
    assert refused.returncode == 78, refused.stderr
    assert not marker.exists()


def test_as_pid_1_with_no_init_it_says_so_before_the_job_starts():
    """helper-71: exec knew it was PID 1 and said nothing; the job then ignores SIGTERM (no
    handler) and reaps no orphan. One warn line names the init to use; under tini, none."""
    alone = _pid1([PY, "-m", "envdoctor", "exec", "--", "sh", "-c", "echo pid=$$"])
    assert alone.returncode == 0 and alone.stdout.strip() == "pid=1", alone.stderr
    warned = one(alone.stderr, "sh becomes PID 1 with no init")
    assert warned["level"] == "warn" and warned["action"] == "pid1" and "tini" in warned["msg"], warned
    _need_root_and("tini")
    under_tini = _pid1(["tini", "--", PY, "-m", "envdoctor", "exec", "--", "sh", "-c", "echo pid=$$"])
    assert under_tini.stdout.strip() == "pid=2" and "PID 1" not in under_tini.stderr, under_tini.stderr
