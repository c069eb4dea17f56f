"""`envdoctor exec` where the machine says no: here, no writable temporary directory for
--attach's start-up hook (a read-only root with a read-only /tmp, as hardened images
have). The job must still start, with one line saying why it is not attached."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare for a private mount")
def test_attach_without_a_writable_tmp_still_starts_the_job():
    """No writable cache directory either (XDG_CACHE_HOME under /proc): mkdtemp raised
    FileNotFoundError out of exec: a traceback, exit 1, and the job never ran."""
    # /tmp and /var/tmp made read-only in place (a bind remount), not hidden under an empty
    # tmpfs: a checkout cloned under /tmp (mktemp -d) keeps its venv visible.
    script = ("mount --bind /tmp /tmp && mount -o remount,bind,ro /tmp && "
              "mount --bind /var/tmp /var/tmp && mount -o remount,bind,ro /var/tmp && cd /proc && "
              f"TMPDIR=/tmp XDG_CACHE_HOME=/proc/envdoctor-no-cache "
              f"exec {sys.executable} -m envdoctor exec --attach -- sh -c 'echo job-ran'")
    env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "job-ran"
    assert "Traceback" not in proc.stderr
    assert "--attach: cannot write the start-up hook" in proc.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "1e300", "0", "-1"])
def test_a_timeout_that_is_not_a_bound_is_bad_usage(value):
    """NaN passed `timeout <= 0` and reached select(): ValueError, a traceback, exit 1,
    and the job never started; inf and 1e300 overflowed the clock the same way."""
    from helpers import cli

    out = cli("exec", "--timeout", value, "--", "true", timeout=60)
    assert out.returncode == 2, out.stderr
    assert "--timeout" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("kwargs", ["interval=float('inf')", "first_delay=float('nan')", "first_delay=float('inf')",
                                    "interval=1e300"])
def test_attach_with_a_non_finite_interval_is_a_value_error_at_the_call(kwargs):
    """Before: attach() returned, then its thread died with an OverflowError traceback in the
    job's stderr. Now the call says what is wrong, and no thread is left running."""
    code = ("import envdoctor, threading\n"
            "try:\n"
            f"    envdoctor.attach({kwargs})\n"
            "except ValueError as exc:\n"
            "    print('refused:', exc)\n"
            "print('threads', sorted(t.name for t in threading.enumerate() if t.name.startswith('envdoctor')))\n")
    env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_ATTACH"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "refused: envdoctor.attach:" in proc.stdout and "threads []" in proc.stdout, proc.stdout


def test_attach_with_an_ordinary_interval_still_publishes():
    code = ("import envdoctor, os, time\n"
            "p = envdoctor.attach(0.5)\n"
            "time.sleep(1.2)\n"
            "print('published', p.publications > 0 and os.path.exists(p.path))\n"
            "p.close()\n")
    env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_ATTACH"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert "published True" in proc.stdout, proc.stderr


@pytest.mark.parametrize("fix", [[], ["--fix"]])
def test_an_environment_entry_with_an_empty_name_is_dropped_and_said_and_the_job_starts(fix):
    """`env =weird envdoctor exec -- cmd`: os.environ.clear() raised in the pre-flight and
    execve then refused the name, with a traceback; the job never started (helper-19)."""
    proc = subprocess.run(["env", "=weird", "KEPT=1", sys.executable, "-m", "envdoctor", "exec", *fix, "--",
                           "sh", "-c", 'echo "ran KEPT=$KEPT"; env | grep -c "^=weird" || true'],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.split() == ["ran", "KEPT=1", "0"], proc.stdout
    assert "broke" not in proc.stderr
    dropped = [line for line in proc.stderr.splitlines() if "dropped 1 environment entry" in line]
    assert len(dropped) == 1 and "level=warn" in dropped[0] and "=weird" in dropped[0], proc.stderr


def test_without_a_cache_directory_attach_reuses_one_hook_directory_in_tmpdir(tmp_path):
    """With no usable cache directory, every `exec --attach` made a fresh mkdtemp that
    nothing could remove (after execve nothing of envdoctor is left): one per start, for
    good (helper-19). It reuses one private directory per user; one that someone else
    made under that name first is never used."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
    env.update(TMPDIR=str(tmpdir), XDG_CACHE_HOME="/proc/envdoctor-no-cache")

    def start() -> str:
        proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--attach", "--", "sh", "-c", "echo ran"],
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0 and proc.stdout.strip() == "ran", proc.stderr
        return next(line.split("hook=")[1].split()[0].strip('"') for line in proc.stderr.splitlines() if "hook=" in line)

    first, second = start(), start()
    assert first == second and first.startswith(str(tmpdir)), (first, second)
    assert [p.name for p in tmpdir.iterdir()] == [os.path.basename(first)]
    assert oct(os.stat(first).st_mode & 0o777) == "0o700"

    shutil.rmtree(first)
    os.mkdir(first, 0o777)
    os.chmod(first, 0o777)  # someone made the predictable name first, writable by all
    third = start()
    assert third != first and os.path.basename(third).startswith("envdoctor-attach-")
    assert os.listdir(first) == [], "nothing is written into a directory that is not private"


def test_a_hook_directory_under_a_parent_others_can_write_is_not_used(tmp_path):
    """A cache root writable by everyone (not sticky): another user could rename the
    hook directory away and put their own sitecustomize.py in its place before the job
    started, and run code in the job (helper-20). Only a chain we and root own is used."""
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "envdoctor").mkdir()
    os.chown(shared / "envdoctor", 65534, 65534)
    (shared / "envdoctor").chmod(0o777)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
    env.update(XDG_CACHE_HOME=str(shared), TMPDIR=str(tmpdir))
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--attach", "--", "sh", "-c", "echo ran"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ran", proc.stderr
    hook = next(line.split("hook=")[1].split()[0].strip('"') for line in proc.stderr.splitlines() if "hook=" in line)
    assert not hook.startswith(str(shared)) and hook.startswith(str(tmpdir)), hook
    assert not list(shared.rglob("sitecustomize.py")), "no hook is written where others can swap it"

    tmpdir.chmod(0o777)  # a TMPDIR others may write and that is not sticky is no better
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--attach", "--", "sh", "-c", "echo ran"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ran", proc.stderr
    assert "--attach: cannot write the start-up hook: no directory only this user can change" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv (another user)")
@pytest.mark.parametrize("where", ["tmpdir", "cache"])
def test_a_symlink_planted_as_the_hook_directory_is_never_followed(where):
    """Another user made the predictable hook path a symlink to a root-owned directory:
    root resolved it, found the target trusted, wrote sitecustomize.py there and put it on
    the job's PYTHONPATH (helper-21). In `cache`, root runs with a HOME whose cache is
    that user's (sudo without -H)."""
    import hashlib
    import tempfile

    import envdoctor.entrypoint
    from envdoctor import __version__

    installation = f"{os.path.dirname(os.path.abspath(envdoctor.entrypoint.__file__))}\0{__version__}"
    name = f"attach-hook-{hashlib.sha256(installation.encode()).hexdigest()[:16]}"
    base = tempfile.mkdtemp(prefix="envdoctor-test-planted-")
    try:
        os.chmod(base, 0o755)  # the other user must reach what it plants in
        target = os.path.join(base, "root-owned-target")
        os.mkdir(target, 0o755)
        tmpdir = os.path.join(base, "tmp")
        os.mkdir(tmpdir)
        os.chmod(tmpdir, 0o1777)  # as /tmp: anyone may plant a name there
        env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
        env["TMPDIR"] = tmpdir
        if where == "tmpdir":
            planted = os.path.join(tmpdir, f"envdoctor-{name}-0")
            env["XDG_CACHE_HOME"] = "/proc/envdoctor-no-cache"
        else:
            cache = os.path.join(base, "users-cache")
            os.makedirs(os.path.join(cache, "envdoctor"))
            for d in (cache, os.path.join(cache, "envdoctor")):
                os.chown(d, 65534, 65534)
            planted = os.path.join(cache, "envdoctor", name)
            env["XDG_CACHE_HOME"] = cache
        subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "ln", "-s", target, planted],
                       check=True, timeout=30)
        proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--attach", "--", "sh", "-c", 'echo "$PYTHONPATH"'],
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        assert os.listdir(target) == [], "nothing is written through the planted link"
        assert target not in proc.stdout and planted not in proc.stdout, proc.stdout
        assert os.path.islink(planted), "the planted link is left as it was"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv (another user)")
def test_no_other_users_link_or_directory_on_the_way_is_trusted_and_root_writes_nothing_there():
    """helper-22: a root symlink to another user's symlink (swappable between two
    resolutions); a cache directory of another user's holding a symlink named as a cache
    entry (root overwrote its target); a user's symlink in root's sticky directory (root
    made directories where it chose). Resolved one component at a time, none is used."""
    import tempfile

    base = tempfile.mkdtemp(prefix="envdoctor-test-chain-")
    try:
        os.chmod(base, 0o755)
        theirs = os.path.join(base, "theirs")
        os.mkdir(theirs, 0o755)
        os.chown(theirs, 65534, 65534)
        target = os.path.join(base, "rootreal")
        os.mkdir(target, 0o755)
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        subprocess.run([*nobody, "ln", "-s", target, os.path.join(theirs, "l")], check=True, timeout=30)
        os.symlink(os.path.join(theirs, "l"), os.path.join(base, "a"))  # root's link to their link
        victim = os.path.join(base, "victim")
        with open(victim, "w") as f:
            f.write("precious\n")
        home = os.path.join(base, "home")
        os.makedirs(os.path.join(home, ".cache", "envdoctor"))
        for d in (home, os.path.join(home, ".cache"), os.path.join(home, ".cache", "envdoctor")):
            os.chown(d, 65534, 65534)
        sticky = os.path.join(base, "sticky")
        os.mkdir(sticky)
        os.chmod(sticky, 0o1777)
        subprocess.run([*nobody, "ln", "-s", target, os.path.join(sticky, "xyz")], check=True, timeout=30)

        def run(**extra) -> subprocess.CompletedProcess:
            env = {k: v for k, v in os.environ.items() if k not in ("ENVDOCTOR_CONFIG", "XDG_CACHE_HOME")}
            env.update(TMPDIR=os.path.join(base, "no-tmp"), **extra)
            return subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--attach", "--", "sh", "-c",
                                   'echo "$PYTHONPATH"'], capture_output=True, text=True, timeout=120, env=env)

        first = run(XDG_CACHE_HOME=os.path.join(base, "a"))
        assert first.returncode == 0 and os.listdir(target) == [], (first.stderr, os.listdir(target))
        # entry names are predictable; plant links under every name the run above would use
        for name in ("entry-points", "torch-probe", "onnx-stack"):
            for i in range(3):
                subprocess.run([*nobody, "ln", "-s", victim,
                                os.path.join(home, ".cache", "envdoctor", f"{name}-{i:020x}.json")], check=True, timeout=30)
        second = run(HOME=home)
        assert second.returncode == 0, second.stderr
        assert open(victim).read() == "precious\n" and oct(os.stat(victim).st_mode & 0o777) == "0o644"
        assert not [n for n in os.listdir(os.path.join(home, ".cache", "envdoctor")) if not n.endswith(".json")]
        third = run(XDG_CACHE_HOME=os.path.join(sticky, "xyz"))
        assert third.returncode == 0 and os.listdir(target) == [], os.listdir(target)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_cache_directories_are_made_0700_whatever_the_umask(tmp_path):
    """parents=True made the missing ones with the default mode: 0777 under umask 000 (helper-22)."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    env["HOME"] = str(home)
    proc = subprocess.run(["sh", "-c", f"umask 000 && exec {sys.executable} -m envdoctor checks"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    for d in (home / ".cache", home / ".cache" / "envdoctor"):
        assert oct(d.stat().st_mode & 0o777) == "0o700", (d, oct(d.stat().st_mode))


@pytest.mark.parametrize("blocker", ["directory", "fifo"])
def test_a_hook_that_cannot_be_written_starts_the_job_unattached_not_a_traceback(tmp_path, blocker):
    """Helper-43: write_atomic's OutputError (a full disk, sitecustomize.py a directory or
    a FIFO) is no OSError; it escaped _attach_hook as a traceback and the job never ran."""
    import hashlib

    import envdoctor.entrypoint
    from envdoctor import __version__

    installation = f"{os.path.dirname(os.path.abspath(envdoctor.entrypoint.__file__))}\0{__version__}"
    hook_dir = tmp_path / "cache" / "envdoctor" / f"attach-hook-{hashlib.sha256(installation.encode()).hexdigest()[:16]}"
    hook_dir.mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "cache", 0o700)
    os.chmod(tmp_path / "cache" / "envdoctor", 0o700)
    blocked = hook_dir / "sitecustomize.py"
    blocked.mkdir() if blocker == "directory" else os.mkfifo(blocked)
    env = {k: v for k, v in os.environ.items() if k != "ENVDOCTOR_CONFIG"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--attach", "--", "sh", "-c", "echo ran"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ran", proc.stderr
    assert "Traceback" not in proc.stderr
    assert "--attach: cannot write the start-up hook: cannot write" in proc.stderr, proc.stderr


def test_a_hook_already_written_is_not_written_again(tmp_path):
    """Every start rewrote the same sitecustomize.py: on a full disk, a good hook was lost
    to the failed write. Now a start that finds it unchanged leaves the file alone."""
    from envdoctor.attach import startup_hook

    startup_hook(tmp_path, {})
    hook = tmp_path / "sitecustomize.py"
    before = os.stat(hook)
    startup_hook(tmp_path, {})
    after = os.stat(hook)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_link_planted_as_the_hook_is_replaced_not_written_through(tmp_path):
    """Helper-45: a symlink in the hook's place made every start rewrite the file it
    pointed to (write_atomic follows a link, as `-o` does)."""
    from envdoctor.attach import startup_hook

    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").symlink_to(victim)
    startup_hook(hook_dir, {})
    assert victim.read_text() == "mine\n"
    assert not (hook_dir / "sitecustomize.py").is_symlink()
    assert "envdoctor" in (hook_dir / "sitecustomize.py").read_text()
