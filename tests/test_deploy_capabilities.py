"""Which capabilities the node monitor really needs to read another user's process.

serve reads a target through /proc/N/environ (mode 0400, owned by the target's uid),
/proc/N/root/dev/shm and /proc/N/maps (both behind the kernel's ptrace access check).
Measured here, as a non-root user against a process of another user:
CAP_SYS_PTRACE alone opens root/ and maps but not environ (file mode still denies);
CAP_DAC_READ_SEARCH alone opens nothing (the ptrace check still denies); both are
needed. deploy/systemd and deploy/kubernetes grant exactly these two, nothing else.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

pytestmark = pytest.mark.real

# The reader runs under the system interpreter: the venv's may sit under /root, which
# an unprivileged uid cannot even execute without the very capability being tested.
READER = r"""
import os, sys
pid = sys.argv[1]
seen = []
for name, probe in (("environ", lambda: open(f"/proc/{pid}/environ", "rb").read()),
                    ("root", lambda: os.statvfs(f"/proc/{pid}/root/dev/shm")),
                    ("maps", lambda: open(f"/proc/{pid}/maps").read())):
    try:
        probe(); seen.append(name)
    except PermissionError:
        pass
print(",".join(seen))
"""

TARGET_UID, READER_UID = 65534, 4242 + os.getpid() % 1000


def _system_python():
    for candidate in ("/usr/bin/python3", "/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("no system python3 for the unprivileged reader")


@pytest.fixture
def other_users_process():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to run processes as other users")
    proc = subprocess.Popen(["setpriv", f"--reuid={TARGET_UID}", f"--regid={TARGET_UID}", "--clear-groups",
                             "env", "OMP_NUM_THREADS=64", "sleep", "60"])
    deadline = time.monotonic() + 10
    # Until `sleep` itself runs: between setpriv's setuid and the last execve the process is
    # briefly not dumpable, and its /proc files are root's (a fresh clone's run under load
    # once read environ with sys_ptrace alone).
    while not _settled(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _settled(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            name = comm.read().strip()
        return name == "sleep" and os.stat(f"/proc/{pid}/environ").st_uid == TARGET_UID
    except OSError:
        return False


def _read_as(pid, *setpriv_args):
    proc = subprocess.run(["setpriv", *setpriv_args, "--", _system_python(), "-c", READER, str(pid)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return set(filter(None, proc.stdout.strip().split(",")))


def _unprivileged(caps):
    ids = [f"--reuid={READER_UID}", f"--regid={READER_UID}", "--clear-groups"]
    if not caps:
        return [*ids, "--inh-caps=-all"]
    return [*ids, f"--inh-caps={caps}", f"--ambient-caps={caps}"]


def test_a_non_root_monitor_needs_both_sys_ptrace_and_dac_read_search(other_users_process):
    pid = other_users_process
    assert _read_as(pid, *_unprivileged("")) == set()
    assert _read_as(pid, *_unprivileged("+sys_ptrace")) == {"root", "maps"}
    assert _read_as(pid, *_unprivileged("+dac_read_search")) == set()
    assert _read_as(pid, *_unprivileged("+sys_ptrace,+dac_read_search")) == {"environ", "root", "maps"}


def test_root_with_every_other_capability_dropped_still_reads_everything(other_users_process):
    """The container form (uid 0, capabilities: drop ALL, add the two): enough."""
    only_two = ["--inh-caps=-all", "--bounding-set=-all,+sys_ptrace,+dac_read_search"]
    assert _read_as(other_users_process, *only_two) == {"environ", "root", "maps"}
    assert _read_as(other_users_process, "--inh-caps=-all", "--bounding-set=-all,+sys_ptrace") == {"root", "maps"}


def test_a_monitor_that_may_not_read_another_users_python_process_says_so():
    """Helper-89: without CAP_SYS_PTRACE another user's torch job could not be told from any
    python process (its maps are closed), and it vanished from the metrics without a word,
    where the docs promised a skip with the reason. serve counts such processes
    (envdoctor_targets_unreadable) and logs why once; with the capabilities, none."""
    from helpers import unprivileged_envdoctor

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to run processes as other users")
    job = subprocess.Popen(["setpriv", f"--reuid={TARGET_UID}", f"--regid={TARGET_UID}", "--clear-groups",
                            _system_python(), "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if os.stat(f"/proc/{job.pid}/environ").st_uid == TARGET_UID and "python" in open(f"/proc/{job.pid}/comm").read():
                    break
            except OSError:
                pass
            time.sleep(0.02)

        def unreadable(out):
            line = next(l for l in out.stdout.splitlines() if l.startswith("envdoctor_targets_unreadable "))
            return float(line.split()[1])

        stripped = unprivileged_envdoctor("serve", "--once")
        assert stripped.returncode == 0, stripped.stderr[-1000:]
        assert unreadable(stripped) >= 1
        assert 'msg="processes not examined: permission denied"' in stripped.stderr and "CAP_SYS_PTRACE" in stripped.stderr
        from helpers import cli

        whole = cli("serve", "--once")
        assert whole.returncode == 0 and unreadable(whole) == 0, whole.stderr[-1000:]
        assert "permission denied" not in whole.stderr
    finally:
        job.kill()
        job.wait(timeout=10)
