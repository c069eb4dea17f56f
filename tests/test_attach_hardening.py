"""envdoctor.attach against a hostile or broken host: what others drop in /dev/shm, a
/dev/shm that is a symlink, a file, full or nearly full, a document too large, two
pid namespaces sharing /dev/shm, relative directories and a later chdir, attach()
after close(). Each of these once broke the job or fooled the reader (a bad-input
pass on 2026-11-23); the real ones run in a private mount namespace as root."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from envdoctor.attach import SCHEMA, Publisher, document_name, read_document
from envdoctor.paths import Roots

REPO = Path(__file__).resolve().parent.parent
ROOT = os.geteuid() == 0 and shutil.which("unshare") is not None


def run_py(code: str, env: dict | None = None, timeout: float = 120, wrap: list[str] | None = None
           ) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(REPO))
    full.update(env or {})
    return subprocess.run([*(wrap or []), sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=full, timeout=timeout)


def good(pid: int, **extra) -> dict:
    return {"schema": SCHEMA, "pid": pid, "published_at": time.time(), "interval_seconds": 5.0,
            "torch": {"num_threads": 16}, "cuda": {"initialized": False, "devices": {}}, "dataloaders": [],
            "env": {}, **extra}


def fake_process(tmp_path: Path, pid: int = 4242, start_ticks: int = 1000) -> Roots:
    """A procfs tree with one process: its status (NSpid, Uid), its stat (start time) and
    an empty root directory, for the reader's choices between /dev/shm and /tmp."""
    proc = tmp_path / "proc" / str(pid)
    (proc / "root").mkdir(parents=True)
    uid = os.geteuid()
    (proc / "status").write_text(f"Name:\tjob\nNSpid:\t{pid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (proc / "stat").write_text(f"{pid} (job) " + " ".join(["S", *["0"] * 18, str(start_ticks), *["0"] * 10]) + "\n")
    return Roots(procfs=tmp_path / "proc")


# -- the writer ---------------------------------------------------------------------------


def test_names_that_are_no_pid_in_the_directory_do_not_stop_attach(tmp_path):
    """'²' passes str.isdigit() and int() refuses it; 20 digits overflow os.kill. Anyone
    may drop such names in a shared /dev/shm: attach() raised in every job on the host."""
    old = time.time() - 3600
    for name in ("envdoctor-attach-².json", "envdoctor-attach-99999999999999999999999.json",
                 "envdoctor-attach-.json", "envdoctor-attach--1.json"):
        (tmp_path / name).write_text("{}")
        os.utime(tmp_path / name, (old, old))
    publisher = Publisher(interval=60, directory=str(tmp_path)).start()
    try:
        assert publisher.error is None
        deadline = time.monotonic() + 10
        while not Path(publisher.path).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert json.loads(Path(publisher.path).read_text())["schema"] == SCHEMA
    finally:
        publisher.close()
    assert (tmp_path / "envdoctor-attach-².json").exists()  # not ours to judge: left alone


def test_a_document_over_the_cap_leaves_the_environment_out_instead_of_cutting_json(tmp_path):
    uuids = ",".join(f"GPU-{i:08x}-1111-2222-3333-444455556666" for i in range(2000))  # ~90 KB
    r = run_py(f"""
        import json, envdoctor
        p = envdoctor.attach(interval=60, directory={str(tmp_path)!r})
        p.publish()
        doc = json.loads(open(p.path).read())
        print(json.dumps({{"env": doc["env"], "omitted": doc.get("omitted"), "error": p.error}}))
        p.close()
    """, env={"CUDA_VISIBLE_DEVICES": uuids})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["env"] == {} and "over the 65536-byte cap" in out["omitted"] and out["error"] is None


def test_attach_after_close_starts_again_and_a_closed_publisher_is_not_current():
    r = run_py("""
        import os, time, envdoctor
        from envdoctor import attach as module
        p = envdoctor.attach(interval=0.5)
        p.close()
        assert module.current() is None, "a closed publisher still claimed the job was attached"
        q = envdoctor.attach(interval=0.5)
        assert q is not p and module.current() is q
        time.sleep(1.2)
        assert q._thread.is_alive() and os.path.exists(q.path)
        q.close()
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.parametrize("value", ["OFF", "False", "NO", " off "])
def test_envdoctor_attach_off_in_any_case(value):
    r = run_py("import envdoctor; print(envdoctor.attach(interval=60))", env={"ENVDOCTOR_ATTACH": value})
    assert r.returncode == 0 and r.stdout.strip() == "None", (r.stdout, r.stderr)


def test_relative_directories_and_a_later_chdir_leave_nothing_behind(tmp_path):
    (tmp_path / "pub").mkdir()
    (tmp_path / "ann").mkdir()
    (tmp_path / "elsewhere").mkdir()
    r = run_py(f"""
        import os, time, envdoctor
        os.chdir({str(tmp_path)!r})
        p = envdoctor.attach(interval=0.5, directory="pub")
        os.chdir("elsewhere")
        time.sleep(1.2)
        print(p.path)
    """, env={"ENVDOCTOR_ANNOUNCE_DIR": "ann"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(str(tmp_path / "pub"))
    left = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()]
    assert left == [], left


@pytest.mark.parametrize("planted", ["fifo", "fifo with a reader", "directory", "symlink"])
def test_what_another_user_leaves_under_our_announcement_name_never_blocks_attach(tmp_path, planted):
    """The announce directory is 1777. A FIFO named <pid>.json blocked attach()'s open,
    and with it the job, for good (helper-19); only a regular file of ours is written."""
    ann = tmp_path / "ann"
    ann.mkdir()
    ann.chmod(0o1777)
    r = run_py(f"""
        import os, stat, sys, time, envdoctor
        ann = {str(ann)!r}
        name = os.path.join(ann, f"{{os.getpid()}}.json")
        kind = {planted!r}
        if kind.startswith("fifo"):
            os.mkfifo(name, 0o666)
            if kind == "fifo with a reader":
                reader = os.open(name, os.O_RDONLY | os.O_NONBLOCK)
        elif kind == "directory":
            os.mkdir(name)
        else:
            os.symlink("/etc/passwd", name)
        started = time.monotonic()
        p = envdoctor.attach(interval=0.5, directory={str(tmp_path)!r})
        print("attached", round(time.monotonic() - started, 2), p is not None, flush=True)
        mode = os.lstat(name).st_mode
        print("left", stat.S_ISFIFO(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode))
    """, env={"ENVDOCTOR_ANNOUNCE_DIR": str(ann)}, timeout=30)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    lines = r.stdout.split()
    assert lines[0] == "attached" and float(lines[1]) < 5 and lines[2] == "True", r.stdout
    assert lines[3:] == ["left", "True"], r.stdout  # what was planted is left as it was
    assert open("/etc/passwd").read().startswith("root:"), "the symlink's target is never written"


# -- the reader ---------------------------------------------------------------------------


@pytest.mark.parametrize("shm", ["symlink", "file"])
def test_the_reader_looks_in_tmp_when_dev_shm_is_unusable(tmp_path, shm):
    """The writer skips a /dev/shm that is a symlink or no directory and publishes in
    /tmp; the reader stopped at /dev/shm and judged the job without its live view."""
    roots = fake_process(tmp_path)
    root = roots.procfs / "4242" / "root"
    (root / "dev").mkdir()
    if shm == "symlink":
        (tmp_path / "elsewhere").mkdir()
        (root / "dev" / "shm").symlink_to(tmp_path / "elsewhere")
    else:
        (root / "dev" / "shm").write_text("x")
    (root / "tmp").mkdir()
    (root / "tmp" / document_name(4242)).write_text(json.dumps(good(4242)))
    doc, source = read_document(roots, 4242)
    assert doc is not None and source == f"/tmp/{document_name(4242)}", source


def test_the_reader_prefers_a_usable_tmp_document_over_a_stale_dev_shm_one(tmp_path):
    roots = fake_process(tmp_path)
    root = roots.procfs / "4242" / "root"
    for directory in ("dev/shm", "tmp"):
        (root / directory).mkdir(parents=True)
    (root / "dev/shm" / document_name(4242)).write_text(json.dumps(good(4242, published_at=time.time() - 3600)))
    doc, _ = read_document(roots, 4242)
    assert doc is None  # only the stale one: its reason is said
    (root / "tmp" / document_name(4242)).write_text(json.dumps(good(4242)))
    doc, source = read_document(roots, 4242)
    assert doc is not None and source.startswith("/tmp/")


@contextlib.contextmanager
def _job_that_execs(setup: str, then_exec: str):
    """A python job that attaches (running `setup` first), publishes, says so, and on a line
    on its stdin runs `then_exec`; yields the Popen. Its leftover document is removed."""
    code = (f"import os, sys, envdoctor\n{setup}\n"
            "p = envdoctor.attach(interval=60); p.publish()\n"
            "sys.stdout.write('published\\n'); sys.stdout.flush()\n"
            f"sys.stdin.readline()\n{then_exec}\n")
    job = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                           env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    try:
        assert job.stdout.readline() == "published\n"
        yield job
    finally:
        job.kill()
        job.wait()
        for leftover in Path("/dev/shm").glob(f"envdoctor-attach-{job.pid}-*"):
            leftover.unlink()


def _go_on(job) -> None:
    job.stdin.write("\n")
    job.stdin.flush()


def test_a_document_of_the_program_a_job_exec_d_from_is_refused():
    """helper-79: a job that attached, set 16 threads and exec'd /bin/sleep kept its pid and
    start time, and `check --pid` judged the sleep by the python's document for 15 s. The
    document says which program wrote it (device and inode through /proc/self/exe)."""
    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    with _job_that_execs("import torch; torch.set_num_threads(16)", "os.execv('/bin/sleep', ['sleep', '120'])") as job:
        doc, source = read_document(Roots(), job.pid)
        assert doc is not None and doc["torch"]["num_threads"] == 16 and len(doc["exe"]) == 3, source
        _go_on(job)
        deadline = time.monotonic() + 30
        while os.readlink(f"/proc/{job.pid}/exe") != os.path.realpath("/bin/sleep") and time.monotonic() < deadline:
            time.sleep(0.01)
        doc, reason = read_document(Roots(), job.pid)
        assert doc is None and "exec'd since" in reason, reason


def test_a_document_of_the_same_interpreter_before_a_re_exec_is_refused():
    """helper-83: a job that re-exec'd its own python (a restart wrapper) kept the file, the
    pid and the start time, and its document was believed. Every exec moves the stack."""
    again = ("os.execv(sys.executable, [sys.executable, '-c', "
             "'import sys; sys.stdout.write(\"again\\\\n\"); sys.stdout.flush(); sys.stdin.readline()'])")
    with _job_that_execs("", again) as job:
        assert read_document(Roots(), job.pid)[0] is not None
        _go_on(job)
        assert job.stdout.readline() == "again\n"  # the same interpreter, exec'd anew
        doc, reason = read_document(Roots(), job.pid)
        assert doc is None and "exec'd since" in reason, reason


def test_a_document_written_by_another_process_with_the_same_pid_is_refused(tmp_path):
    roots = fake_process(tmp_path, start_ticks=1000)
    shm = roots.procfs / "4242" / "root" / "dev" / "shm"
    shm.mkdir(parents=True)
    path = shm / document_name(4242)
    path.write_text(json.dumps(good(4242, start_ticks=999)))
    doc, reason = read_document(roots, 4242)
    assert doc is None and "another process with the same pid" in reason
    path.write_text(json.dumps(good(4242, start_ticks=1000)))
    assert read_document(roots, 4242)[0] is not None
    path.write_text(json.dumps(good(4242)))  # an older writer, without start_ticks: taken on its pid
    assert read_document(roots, 4242)[0] is not None


def test_an_absurd_interval_does_not_keep_an_old_document_live(tmp_path):
    roots = fake_process(tmp_path)
    shm = roots.procfs / "4242" / "root" / "dev" / "shm"
    shm.mkdir(parents=True)
    (shm / document_name(4242)).write_text(json.dumps(good(4242, published_at=1.0, interval_seconds=1e300)))
    doc, reason = read_document(roots, 4242)
    assert doc is None and "interval_seconds" in reason


# -- real: a private mount namespace with a small /dev/shm -------------------------------------


def in_small_shm(size: str, fill_kib: int) -> list[str]:
    """unshare -m, then /dev/shm a tmpfs of `size` with `fill_kib` KiB already taken."""
    script = (f"mount -t tmpfs -o size={size} tmpfs /dev/shm && "
              f"dd if=/dev/zero of=/dev/shm/fill bs=1024 count={fill_kib} 2>/dev/null; exec \"$@\"")
    return ["unshare", "-m", "sh", "-c", script, "sh"]


JOB = """
    import json, os, time, envdoctor
    from envdoctor.attach_reader import read_document
    from envdoctor.paths import Roots
    p = envdoctor.attach(interval=60)
    p.publish()
    shm_docs = [n for n in os.listdir("/dev/shm") if n.startswith("envdoctor-attach-")]
    doc, source = read_document(Roots(), os.getpid())
    print(json.dumps({"path": p.path, "error": p.error, "shm_docs": shm_docs, "read": doc is not None,
                      "source": source}))
    p.close()
"""


@pytest.mark.skipif(not ROOT, reason="needs root and unshare for a private /dev/shm")
@pytest.mark.parametrize("fill_kib, env", [(100, {}), (4, {"PYTORCH_CUDA_ALLOC_CONF": "x" * 6000})],
                         ids=["full", "nearly-full"])
def test_a_full_dev_shm_moves_the_document_to_tmp_whole(fill_kib, env):
    """Full: every publication failed with ENOSPC and no document existed. Nearly full:
    os.write took part of the document and the half was renamed into place."""
    r = run_py(JOB, env=env, wrap=in_small_shm("8k", fill_kib))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["path"].startswith("/tmp/") and out["error"] is None, out
    assert out["shm_docs"] == [], out  # no half document, no stale copy left first in the reader's way
    assert out["read"] and out["source"].startswith("/tmp/"), out


def test_a_refused_document_is_said_in_the_verdict_facts(tmp_path):
    """A broken, stale or foreign document was dropped without a word: the verdict then
    came without the job's live view and nothing said so."""
    sleeper = subprocess.Popen(["sleep", "60"])
    path = Path("/dev/shm") / document_name(sleeper.pid)
    try:
        path.write_text('{"schema": "envdoctor.attach/v1", broken')
        r = subprocess.run([sys.executable, "-m", "envdoctor", "check", "--pid", str(sleeper.pid), "--only",
                            "cpu.threads", "--format", "json"], capture_output=True, text=True, timeout=120,
                           cwd=REPO, env=dict(os.environ, XDG_CACHE_HOME=str(tmp_path)))
        assert r.returncode == 0, r.stderr
        notes = json.loads(r.stdout)["results"][0]["facts"].get("notes", [])
        assert any("live view was not used" in n and "not valid JSON" in n for n in notes), notes
    finally:
        sleeper.kill()
        sleeper.wait()
        path.unlink(missing_ok=True)


def test_the_sweep_takes_another_namespaces_leftovers_only_when_no_reader_would(tmp_path):
    """A document from another pid namespace (a container sharing /dev/shm) names a pid we
    cannot look up. It goes once it is older than ten minutes and three of its own
    intervals; a live job publishing every hour keeps its document (the sweep of one
    start took it while a reader still accepted it)."""
    old = time.time() - 3600
    hourly = tmp_path / document_name(1, 1)  # namespace inode 1: not ours
    leftover = tmp_path / document_name(2, 1)
    hourly.write_text(json.dumps(good(1, interval_seconds=3600.0)))
    leftover.write_text(json.dumps(good(2)))
    for path in (hourly, leftover):
        os.utime(path, (old, old))
    publisher = Publisher(interval=60, directory=str(tmp_path)).start()
    publisher.close()
    assert hourly.exists() and not leftover.exists()


def test_close_leaves_a_newer_publishers_document_and_its_exit_handler_goes():
    """attach() right after close() from another thread: the old close() removed the file the
    new publisher had just written (same process, same name). And every attach/close cycle
    left an exit handler behind."""
    r = run_py("""
        import os, envdoctor
        p = envdoctor.attach(interval=60)
        p._stop.set()                       # close() has begun in another thread...
        q = envdoctor.attach(interval=60)   # ...and attach() runs before it removes the file
        q.publish()
        p.close()
        assert os.path.exists(q.path), "the old close() removed the new publisher's document"
        q.close()
        import gc, weakref
        closed = []
        for _ in range(50):
            publisher = envdoctor.attach(interval=60)
            publisher.close()
            closed.append(weakref.ref(publisher))
        del publisher
        envdoctor.attach(interval=60).close()  # the module's last one is another now
        gc.collect()
        alive = sum(ref() is not None for ref in closed)
        assert alive == 0, f"{alive} closed publishers still held (by their exit handlers)"
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


UNSHARED_JOB = """
    import os, sys, time, envdoctor
    envdoctor.attach(interval=0.5)
    print(os.getpid(), flush=True)
    sys.stdin.readline()
"""


@pytest.mark.skipif(not ROOT, reason="needs root and unshare for pid namespaces")
def test_two_jobs_that_are_pid_1_in_their_namespaces_keep_their_own_documents():
    """docker run --ipc=host: every job is pid 1 of its container and all share the host's
    /dev/shm. They wrote one file, and a reader judged each job by whichever wrote last."""
    jobs = []
    try:
        for threads in ("3", "5"):  # back to back: often within one clock tick, so start times can tie
            env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=threads)
            jobs.append((threads, subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                                                    textwrap.dedent(UNSHARED_JOB)], env=env, stdin=subprocess.PIPE,
                                                   stdout=subprocess.PIPE, text=True)))
        for _, job in jobs:
            assert job.stdout.readline().strip() == "1"  # pid 1 inside
        time.sleep(1.2)
        for threads, job in jobs:
            inner = int(Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split()[0])  # unshare's child
            doc, source = read_document(Roots(), inner)
            assert doc is not None, source
            assert doc["env"]["OMP_NUM_THREADS"] == threads, (threads, source)
    finally:
        for _, job in jobs:
            job.communicate("\n", timeout=30)


@pytest.mark.skipif(not ROOT, reason="needs root and unshare for a time namespace")
def test_a_job_in_a_time_namespace_is_read():
    """Inside `unshare --time` the kernel shifts the start times /proc shows, so a name or
    a check built on them never matched what the host sees: such a job was never found."""
    job = subprocess.Popen(["unshare", "--time", "--boottime", "100000", "--pid", "--fork", "--mount-proc",
                            sys.executable, "-c", textwrap.dedent(UNSHARED_JOB)],
                           env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="7"),
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = job.stdout.readline().strip()
        if line != "1":
            job.kill()
            pytest.skip(f"no time namespaces here: {job.communicate(timeout=30)[1].strip()[:200]}")
        time.sleep(1.2)
        inner = int(Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split()[0])
        doc, source = read_document(Roots(), inner)
        assert doc is not None and doc["env"]["OMP_NUM_THREADS"] == "7", source
    finally:
        if job.poll() is None:
            job.communicate("\n", timeout=30)


@pytest.mark.parametrize("interval", ["'abc'", "None", "'nan'", "float('inf')", "1e9", "[5]", "10**400", "True", "False"])
def test_a_bad_interval_is_named_at_the_call_not_a_bare_float_error(interval):
    """float('abc') said only "could not convert string to float: 'abc'", naming neither
    attach() nor the argument, where 'nan' got a sentence that did."""
    script = ("import envdoctor\n"
              f"try:\n    envdoctor.attach({interval})\n"
              "except ValueError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.startswith("envdoctor.attach: interval must be a finite number of seconds up to a day, not ")


@pytest.mark.parametrize("interval", ["0", "-5", "'0'"])
def test_a_zero_or_negative_interval_is_refused_not_quietly_raised_to_half_a_second(interval):
    script = ("import envdoctor\n"
              f"try:\n    envdoctor.attach({interval})\n    print('accepted')\n"
              "except ValueError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "ENVDOCTOR_ATTACH": "1"})
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.startswith("envdoctor.attach: interval must be more than 0 seconds"), out.stdout


def test_a_bad_interval_on_a_second_call_is_named_too():
    """Helper-41: after a first attach(), attach(interval='nan') (or inf, 'abc', None)
    returned the running publisher without a word; only a first call checked it."""
    script = ("import envdoctor\n"
              "first = envdoctor.attach(interval=5)\n"
              "for bad in ('nan', float('inf'), 'abc', None):\n"
              "    try:\n        envdoctor.attach(interval=bad)\n        print('accepted', bad)\n"
              "    except ValueError as exc:\n        print('refused')\n"
              "print(envdoctor.attach() is first)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "ENVDOCTOR_ATTACH": "1"})
    assert out.returncode == 0 and out.stdout.split() == ["refused"] * 4 + ["True"], out.stdout + out.stderr


def test_a_non_utf8_secret_the_job_publishes_is_masked_as_its_environ_spells_it():
    """helper-120: the job's os.environ keeps a byte that is not UTF-8 as a lone surrogate
    ('\\udcff'), /proc/N/environ's reader as U+FFFD, and redaction knows the secret by the
    second spelling: a token the job also held in MKL_NUM_THREADS, which the live view
    publishes, was printed in every format. The live view's strings are now read as the
    environ's are, so the secret is masked and the variable is not 'changed by the job'."""
    secret = b"k3y\xffV4lu3Zz9qq"
    env = {os.fsencode(k): os.fsencode(v) for k, v in os.environ.items()}
    env.update({b"PYTHONPATH": os.fsencode(REPO), b"WANDB_API_KEY": secret, b"MKL_NUM_THREADS": secret})
    job = subprocess.Popen([sys.executable, "-c", "import envdoctor, sys, time; envdoctor.attach(interval=0.5); "
                            "print('up', flush=True); time.sleep(60)"], env=env, stdout=subprocess.PIPE)
    try:
        assert job.stdout.readline() == b"up\n"
        time.sleep(0.5)
        out = subprocess.run([sys.executable, "-m", "envdoctor", "check", "--pid", str(job.pid), "--only", "cpu.threads",
                              "-f", "json"], capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
        text = out.stdout.decode("utf-8", "replace")
        row = json.loads(text)["results"][0]
        assert row["check"] == "cpu.threads", row
        for spelling in ("V4lu3Zz9qq", "k3y\\udcff", "k3y\ufffd", "k3y\\ufffd"):
            assert spelling not in text, spelling
        assert "MKL_NUM_THREADS='***'" in row["summary"], row["summary"]
        assert not any("as the running job set it" in n for n in row["facts"].get("notes", [])), row["facts"]
    finally:
        job.kill()
        job.wait()


def test_the_document_is_readable_by_its_owner_alone(tmp_path):
    """It holds variables of the job's environment, which /proc/N/environ keeps 0400: made
    0644 in a shared /dev/shm, another user read a token a job held in OMP_NUM_THREADS
    (helper-120). The job's user, root and serve (CAP_DAC_READ_SEARCH) read it still."""
    r = run_py(f"""
        import os, stat, time, envdoctor
        p = envdoctor.attach(interval=0.5, directory={str(tmp_path)!r})
        deadline = time.time() + 30
        while not os.path.exists(p.path) and time.time() < deadline:
            time.sleep(0.05)
        print(oct(stat.S_IMODE(os.stat(p.path).st_mode)))
        p.close()
    """, env={"OMP_NUM_THREADS": "hf_SecretHeldInAThreadVariable1"})
    assert r.returncode == 0 and r.stdout.strip() == "0o600", (r.stdout, r.stderr)
