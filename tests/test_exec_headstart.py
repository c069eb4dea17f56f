"""`envdoctor exec` forks its pre-flight child before the CLI is imported (envdoctor.exec_headstart).

The child imports the checks while the parent parses; it must then be the one that
runs the pre-flight (and is reaped before the job starts), and a parent that never
hands it work (help, bad usage, a command not found) must leave no process behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from exec_log import events
from helpers import cli, dies_with_its_parent

from envdoctor import exec_headstart

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("argv, wanted", [
    (["envdoctor", "exec", "--", "true"], True),
    (["envdoctor", "exec", "--strict", "--fix", "--keep", "OMP_NUM_THREADS", "--", "python", "-h"], True),
    (["envdoctor", "exec", "--", "sh", "--help"], True),  # the job's own --help, after --
    (["envdoctor", "exec", "--help", "--", "true"], False),
    (["envdoctor", "exec", "-h", "--", "true"], False),
    (["envdoctor", "exec", "true"], False),  # no --: a usage the CLI answers, no pre-flight
    (["envdoctor", "check", "--", "x"], False),
    (["envdoctor", "exec"], False),
])
def test_a_head_start_only_for_a_run_that_will_start_a_command(argv, wanted):
    assert exec_headstart.wanted(argv) is wanted


JOB_SEES_THE_CHILD = """
import os, sys
pid = int(sys.argv[1])
try:
    state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
except OSError:
    state = "gone"
print(state)
"""

HEADSTARTED_EXEC = """
import sys
sys.argv = ["envdoctor", "exec", "--", "true"]
from envdoctor import exec_headstart, program
program._head_start_exec()
waiting = exec_headstart._waiting
assert waiting is not None, "no head start was forked"
from envdoctor import entrypoint
code = entrypoint.run(entrypoint.ExecOptions(timeout=30.0), [sys.executable, "-c", sys.argv_job, str(waiting.pid)])
raise SystemExit(code)
"""


def test_the_child_forked_first_runs_the_preflight_and_is_reaped_before_the_job():
    """The job gets the head-start child's pid: a child that had not been given the
    work would still be alive (waiting), or a zombie of the job once its pipe closed."""
    script = HEADSTARTED_EXEC.replace("sys.argv_job", repr(JOB_SEES_THE_CHILD))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "gone", proc.stdout + proc.stderr
    summary = events(proc.stderr)[-1]
    assert summary["action"] == "start" and int(summary["checks"]) >= 1, proc.stderr


def _processes_marked(mark: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if f"ENVDOCTOR_TEST_MARK={mark}".encode() in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("args, code", [
    (["--timeout", "0", "--", "true"], 2),  # refused after the child was forked
    (["--no-such-option", "--", "true"], 2),  # the CLI's own usage error
    (["--", "/nonexistent/command"], 127),
    (["--report", "/nonexistent/dir/r.json", "--", "true"], 2),
])
def test_a_parent_that_never_hands_over_leaves_no_child(args, code):
    mark = uuid.uuid4().hex
    proc = cli("exec", *args, env={"ENVDOCTOR_TEST_MARK": mark}, timeout=60)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    deadline = time.monotonic() + 5
    while _processes_marked(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_marked(mark) == []


def test_help_forks_nothing_and_is_the_clis():
    mark = uuid.uuid4().hex
    proc = cli("exec", "--help", "--", "true", env={"ENVDOCTOR_TEST_MARK": mark})
    assert proc.returncode == 0 and "Usage: " in proc.stdout
    assert _processes_marked(mark) == []


def test_a_large_command_line_reaches_the_child_whole():
    """More than a pipe holds (64 KiB) goes to the child in pieces, within the bound."""
    words = [f"arg{i:06d}" for i in range(20000)]  # ~200 KB of argv
    proc = cli("exec", "--", sys.executable, "-c", "import sys; print(len(sys.argv) - 1, sys.argv[-1])", *words)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(len(words)), words[-1]]
    assert events(proc.stderr)[-1]["action"] == "start"


@pytest.mark.parametrize("limit", [5, 6, 7])
def test_few_free_descriptors_still_start_the_job(limit):
    """The head start takes four descriptors; when the second pipe could not be made, the
    first pair leaked and the CLI's own imports failed with a traceback (helper-33)."""
    proc = subprocess.run(["bash", "-c", f'ulimit -n {limit}; exec "$0" -m envdoctor exec -- sh -c "echo started"',
                           sys.executable], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "started\n", proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def _children(pid: int) -> list[int]:
    from envdoctor.forked import children_of

    return children_of(pid)


def test_sigterm_to_the_preflight_child_ends_the_probe_it_started(tmp_path):
    """The child forked before the CLI had none of the CLI's handlers: SIGTERM killed it
    outright and the torch probe it had started, in a session of its own, ran on."""
    mark = uuid.uuid4().hex
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nexec sleep 100\n")  # the job's interpreter, probed for torch: it never answers
    fake.chmod(0o755)
    env = dict(os.environ, ENVDOCTOR_TEST_MARK=mark)
    env.pop("ENVDOCTOR_CONFIG", None)
    proc = subprocess.Popen([sys.executable, "-m", "envdoctor", "exec", "--timeout", "30", "--", str(fake), "x"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        probe = []
        while not probe and time.monotonic() < deadline:
            probe = [p for p in _processes_marked(mark) if p != proc.pid and _comm(p) == "sleep"]
            time.sleep(0.02)
        assert probe, "the probe never started"
        child = [c for c in _children(proc.pid)]
        assert len(child) == 1
        os.kill(child[0], 15)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (_comm(proc.pid) != "sleep" or any(
                p != proc.pid for p in _processes_marked(mark))):
            time.sleep(0.05)  # the job (itself the fake: `exec sleep 100`) started, the probe gone
        assert [p for p in _processes_marked(mark) if p != proc.pid] == []
    finally:
        proc.kill()
        _, stderr = proc.communicate(timeout=30)
    assert "Traceback" not in stderr and "Terminated" in stderr, stderr[-2000:]


def _alive(pid: int) -> bool:
    """Running, not a zombie (a killed process keeps its /proc entry, comm included, until reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


RUNPY_TWICE = """
import os, runpy, sys
for argv in (["envdoctor", "exec", "--bogus", "--", "true"], ["envdoctor", "exec", "--", "/nonexistent/x"]):
    sys.argv = argv
    try:
        runpy.run_module("envdoctor", run_name="__main__")
    except SystemExit as exc:
        print("exit", exc.code)
from envdoctor.forked import children_of
print("children", len(children_of(os.getpid())))
"""


def test_a_runpy_caller_keeps_no_waiting_child():
    proc = subprocess.run([sys.executable, "-c", RUNPY_TWICE], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split("\n")[:3] == ["exit 2", "exit 127", "children 0"], proc.stdout + proc.stderr


MANY_DESCRIPTORS = """
import os, resource, subprocess, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if hard != resource.RLIM_INFINITY and hard < 1200:
    print("skip: hard limit", hard); raise SystemExit(0)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # inherited: the pipes get numbers over 1024
for fd in held:
    os.set_inheritable(fd, True)
proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--", "sh", "-c", "echo job ran"],
                      capture_output=True, text=True, close_fds=False, timeout=120)
print(proc.returncode, proc.stdout.strip())
sys.stderr.write(proc.stderr)
"""


def test_over_1024_inherited_descriptors_still_start_the_job():
    """select() refuses a descriptor of 1024 or more: a launcher that leaked that many
    into the job's start got a traceback from the pre-flight's pipe instead (helper-33)."""
    proc = subprocess.run([sys.executable, "-c", MANY_DESCRIPTORS], capture_output=True, text=True, timeout=180)
    if proc.stdout.startswith("skip:"):
        pytest.skip(proc.stdout.strip())
    assert proc.stdout.strip() == "0 job ran", proc.stdout + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


CTRL_C_WHILE_STARTING = """
import os, signal, sys, time
from envdoctor import program
def importing_the_cli():  # where a Ctrl-C lands in the first ~100 ms: an import of the CLI
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
def defining_a_class():  # the same, in a class body's __set_name__ (a dataclass, ipaddress)
    class Named:
        def __set_name__(self, owner, name):
            importing_the_cli()
    class Owner:
        field = Named()
program._head_start_exec = {where}
sys.argv = ["envdoctor", "check"]
program.{main}()
"""


@pytest.mark.parametrize("where", ["importing_the_cli", "defining_a_class"])
@pytest.mark.parametrize("main", ["console_main", "module_main"])
def test_ctrl_c_before_the_clis_handler_is_one_line_and_130(main, where):
    """Before the CLI's handler was installed, Python's own KeyboardInterrupt printed a
    traceback of whatever import it hit (helper-33, on every version); in a class body's
    __set_name__, Python 3.11 wraps it in a RuntimeError (helper-36)."""
    proc = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_STARTING.format(main=main, where=where)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130 and proc.stderr == "envdoctor: interrupted\n", (proc.returncode, proc.stderr)


def test_signals_the_invoker_ignores_stay_ignored_in_the_job():
    """`trap '' INT` (a shell's background job, nohup): the CLI's handler was installed
    over the ignore, and execve then reset the signal to its default for the job; the
    head-start child also replaced the ignore, so a Ctrl-C meant for nobody killed the
    pre-flight (helper-35)."""
    job = "grep -E '^Sig(Ign|Blk)' /proc/self/status"
    script = 'trap "" INT TERM; exec "$@"'
    plain = subprocess.run(["bash", "-c", script, "bash", "sh", "-c", job], capture_output=True, text=True, timeout=60)
    through = subprocess.run(["bash", "-c", script, "bash", sys.executable, "-m", "envdoctor", "exec", "--",
                              "sh", "-c", job], capture_output=True, text=True, timeout=120)
    assert through.returncode == 0, through.stderr
    assert through.stdout == plain.stdout and "SigIgn" in plain.stdout


LEAKY_PIPE = """
import os, resource
from envdoctor import forked
os.close(0); os.close(1)  # os.pipe() then hands out 0 and 1, which must move above stdio
resource.setrlimit(resource.RLIMIT_NOFILE, (3, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
before = sorted(os.listdir("/proc/self/fd"))
try:
    forked.pipe()
    outcome = "made"
except OSError as exc:
    outcome = "refused"
after = sorted(os.listdir("/proc/self/fd"))
os.write(2, f"{outcome} {before == after}\\n".encode())
"""


def test_a_pipe_that_cannot_be_moved_above_stdio_leaves_no_descriptor_taken():
    proc = subprocess.run([sys.executable, "-c", LEAKY_PIPE], capture_output=True, text=True, timeout=60)
    assert proc.stderr.strip() == "refused True", proc.stderr


def test_a_fork_that_fails_is_an_answer_not_a_traceback(monkeypatch):
    from envdoctor import forked

    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(forked.os, "fork", no_fork)
    outcome = forked.call(lambda send: 1, 5.0)
    assert outcome.kind == forked.RAISED and "cannot start the pre-flight process" in outcome.error


def test_sigterm_leaves_the_background_jobs_of_the_shell_that_exec_d_envdoctor(tmp_path):
    """`sleep 300 & exec envdoctor ...`: the shell's job became envdoctor's child, and the
    SIGTERM handler, which kills what envdoctor started, killed it too (helper-33/35)."""
    mark = uuid.uuid4().hex
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nexec sleep 100\n")  # the job's interpreter, probed for torch: it hangs
    fake.chmod(0o755)
    env = dict(os.environ, ENVDOCTOR_TEST_MARK=mark)
    env.pop("ENVDOCTOR_CONFIG", None)
    script = f'sleep 300 & echo $! > {tmp_path}/job; exec "$0" -m envdoctor exec --timeout 30 -- {fake} x'
    proc = subprocess.Popen(["bash", "-c", script, sys.executable], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    job = None
    try:
        deadline = time.monotonic() + 30
        while job is None and time.monotonic() < deadline:
            text = (tmp_path / "job").read_text() if (tmp_path / "job").exists() else ""
            job = int(text) if text.strip() else None
            time.sleep(0.02)
        while time.monotonic() < deadline and not [p for p in _processes_marked(mark)
                                                   if p not in (proc.pid, job) and _comm(p) == "sleep"]:
            time.sleep(0.02)  # the probe is running: envdoctor's handlers are in place
        os.kill(proc.pid, 15)
        proc.wait(timeout=30)
        time.sleep(0.3)
        assert proc.returncode == 143, proc.stderr
        assert _alive(job), "the shell's background job was killed"
        assert [p for p in _processes_marked(mark) if p != job] == []  # the probe went
    finally:
        if job:
            try:
                os.kill(job, 9)
            except OSError:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_watchdog_that_cannot_start_a_thread_answers_at_once(monkeypatch):
    """`ulimit -u` or no memory: 'can't start new thread' was a traceback from `check`
    (helper-36); queued calls would otherwise wait for a worker until their deadlines."""
    import threading

    from envdoctor import watchdog

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    dog = watchdog.Watchdog(max_workers=2)
    started = time.monotonic()
    first, second = dog.start_chain([("a", lambda: 1), ("b", lambda: 2)])
    outcomes = [first.wait(time.monotonic() + 30), second.wait(time.monotonic() + 30)]
    assert time.monotonic() - started < 5
    assert [o.kind for o in outcomes] == [watchdog.RAISED, watchdog.RAISED]
    assert all("no thread could be started" in str(o.error) for o in outcomes)


def test_the_deadman_without_threads_lets_the_run_go_on(monkeypatch):
    import threading

    from envdoctor import deadman

    def no_thread(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with deadman.Heartbeat():
        pass  # neither entering nor leaving raises


def test_the_preflight_child_dies_with_envdoctor_even_by_sigkill(tmp_path):
    """The child asks the kernel to kill it when its parent dies (PR_SET_PDEATHSIG,
    forked.die_with_parent): after a SIGKILL no envdoctor code runs to end it. Asked
    through _ctypes, so the child does not import ctypes (~3 ms before its first check)."""
    pidfile = tmp_path / "child.pid"
    child_code = ("import os, sys, time\nfrom envdoctor import forked\nforked.die_with_parent(os.getppid())\n"
                  "assert 'ctypes' not in sys.modules, 'ctypes imported'\n"
                  f"open({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    parent_code = (f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {child_code!r}], "
                   f"start_new_session=True, cwd={REPO!r})\ntime.sleep(120)\n")
    dies_with_its_parent(parent_code, pidfile, "exec's pre-flight child")


def test_the_subreaper_bit_is_set_and_read_without_ctypes():
    """check's containment (forked.contained) sets and reads PR_SET/GET_CHILD_SUBREAPER;
    through _ctypes, as die_with_parent, so `check` does not import ctypes (helper-60)."""
    code = ("import sys\nfrom envdoctor import forked\n"
            "print(forked.adopt_orphans(True), forked.adopts_orphans(), forked.adopt_orphans(False), "
            "forked.adopts_orphans(), 'ctypes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
    assert out.stdout.split() == ["True", "True", "True", "False", "False"], out
