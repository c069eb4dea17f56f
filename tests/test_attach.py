"""envdoctor.attach: the publisher in real subprocesses (no torch import of its own, the
DataLoader hook, forked and spawned children quiet, removed at exit, the start-up hook
that keeps an existing sitecustomize), and the reader against hostile documents
(symlink, other owner, oversized, FIFO, malformed, stale, another pid's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envdoctor import attach as attach_module
from envdoctor.attach import MAX_BYTES, SCHEMA, document_name, read_document, startup_hook, validate
from envdoctor.attach_snapshot import pid_namespace
from envdoctor.paths import Roots

REPO = Path(__file__).resolve().parent.parent


def run_py(code: str, *args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(REPO))
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          env=full, timeout=timeout)


def test_attach_imports_no_torch_and_publishes_a_readable_document():
    r = run_py("""
        import sys, json, os
        import envdoctor
        p = envdoctor.attach(interval=0.5)
        assert envdoctor.attach(interval=0.5) is p          # idempotent
        p.publish()
        from envdoctor.attach import read_document
        from envdoctor.paths import Roots
        doc, source = read_document(Roots(), os.getpid())
        print(json.dumps({"torch_loaded": "torch" in sys.modules, "doc": doc, "source": source, "path": p.path}))
    """)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["torch_loaded"] is False
    doc = out["doc"]
    assert doc["schema"] == SCHEMA and doc["torch"] is None and doc["cuda"]["initialized"] is False
    assert doc["cost"]["publications"] >= 1
    # envdoctor-attach-<pid>-<pid namespace>.json: the child shares this test's pid namespace
    assert out["source"].endswith(document_name(doc["pid"], pid_namespace("/proc/self/ns/pid")))
    assert isinstance(doc["start_ticks"], int)
    assert not os.path.exists(out["path"])  # removed at exit


def test_importtime_shows_no_torch():
    code = "import envdoctor; print(type(envdoctor.attach()).__name__)"
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "Publisher"  # it attached
    imported = [line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")]
    assert "envdoctor" in imported and "threading" in imported
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]


def test_live_torch_settings_and_the_dataloader_hook_when_attach_comes_first():
    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    r = run_py("""
        import json, os
        import envdoctor
        p = envdoctor.attach(interval=60)
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.set_num_threads(3)
        torch.backends.cudnn.benchmark = True
        torch.use_deterministic_algorithms(True, warn_only=True)
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"     # set after start: only the live view sees it
        loader = DataLoader(TensorDataset(torch.zeros(64, 256)), batch_size=8, num_workers=0, pin_memory=False)
        for (batch,) in loader:
            pass
        doc = p.snapshot()
        threads = []
        for n in (5, 1, 4):                                  # through the wrapper attach puts on set_num_threads
            p.snapshot()
            torch.set_num_threads(n)
            threads.append((p.snapshot()["torch"]["num_threads"], torch.get_num_threads()))
        doc["threads_seen"] = threads
        print(json.dumps(doc))
    """)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    t = doc["torch"]
    assert t["num_threads"] == 3 and t["cudnn_benchmark"] is True
    assert doc["threads_seen"] == [[5, 5], [1, 1], [4, 4]]
    assert t["deterministic_algorithms"] is True and t["deterministic_warn_only"] is True
    assert doc["env"]["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert doc["cuda"] == {"initialized": False, "devices": {}}  # CPU torch: never initialised by attach
    (loader,) = doc["dataloaders"]
    assert loader["num_workers"] == 0 and loader["pin_memory"] is False and loader["prefetch_factor"] is None
    assert loader["batch_bytes_max"] == 8 * 256 * 4 and loader["batches_seen"] == 8


def test_a_set_num_threads_that_overtakes_the_first_read_is_kept_and_a_bypassed_one_is_read_again():
    """helper-79, with real torch: (a) attach() then set_num_threads(16) at once: the first
    publication's fresh-thread read (the old 2) overwrote what the wrapper had just recorded,
    and 2 was published for good; (b) a script that took `from torch import set_num_threads`
    before attaching calls the original, which the wrapper never sees: it is read again in
    the background every REREAD_SECONDS."""
    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    r = run_py("""
        import json, time
        import torch
        from torch import set_num_threads as original_set_num_threads
        import envdoctor
        from envdoctor import attach_snapshot

        p = envdoctor.attach(interval=3600)
        torch.set_num_threads(2)
        read = attach_snapshot._call_in_fresh_thread
        def overtaken(fn):
            value = read(fn)             # the count before ...
            torch.set_num_threads(16)    # ... the script's call lands while it is read
            return value
        attach_snapshot._threads["value"] = None
        attach_snapshot._call_in_fresh_thread = overtaken
        first = p.snapshot()["torch"]["num_threads"]
        attach_snapshot._call_in_fresh_thread = read
        then = p.snapshot()["torch"]["num_threads"]
        original_set_num_threads(1)      # bypasses the wrapper
        bypassed = p.snapshot()["torch"]["num_threads"]
        attach_snapshot._threads["read_at"] -= attach_snapshot.REREAD_SECONDS  # as if 30 s went by
        p.snapshot()                     # starts the read in the background
        deadline = time.monotonic() + 30
        while attach_snapshot._threads["value"] != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        print(json.dumps([first, then, bypassed, p.snapshot()["torch"]["num_threads"], torch.get_num_threads()]))
    """)
    assert r.returncode == 0, r.stderr
    first, then, bypassed, reread, actual = json.loads(r.stdout)
    assert then == 16 and first == 16, (first, then)  # the wrapper's value was kept, not the stale read
    assert bypassed == 16 and reread == 1 == actual, (bypassed, reread, actual)


def test_a_dataloader_that_is_gone_leaves_the_document_and_the_signature_stays_its_own():
    """helper-75: a one-off 8-worker loader deleted long ago stayed in the document, and
    cpu.threads and shm.size judged the job by its workers; an iterator that outlives its
    loader keeps it there. The wrapped methods keep DataLoader's own signatures (code that
    rebuilds a loader from inspect.signature(DataLoader.__init__) read (*args, **kwargs))."""
    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    r = run_py("""
        import gc, inspect, json
        import envdoctor
        p = envdoctor.attach(interval=60)
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        before = str(inspect.signature(DataLoader.__init__))
        data = TensorDataset(torch.zeros(16, 4))
        one_off = DataLoader(data, batch_size=4, num_workers=8)   # never iterated: no worker started
        del one_off
        gc.collect()
        train = DataLoader(data, batch_size=4, num_workers=0)
        workers_after_delete = [d["num_workers"] for d in p.snapshot()["dataloaders"]]
        it = iter(DataLoader(data, batch_size=2, num_workers=0))   # the loader itself is dropped at once
        gc.collect()
        with_iterator = [d["batch_size"] for d in p.snapshot()["dataloaders"]]
        del it
        gc.collect()
        print(json.dumps({"after_delete": workers_after_delete, "with_iterator": with_iterator,
                          "at_end": [d["batch_size"] for d in p.snapshot()["dataloaders"]],
                          "signature_kept": str(inspect.signature(DataLoader.__init__)) == before,
                          "name": DataLoader.__init__.__qualname__}))
    """)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["after_delete"] == [0], got
    assert sorted(got["with_iterator"]) == [2, 4] and got["at_end"] == [4], got
    assert got["signature_kept"] and got["name"] == "DataLoader.__init__", got


def test_an_attached_jobs_dataloader_still_pickles_saves_and_goes_to_a_spawned_process(tmp_path):
    """helper-77: the record attach() keeps on each DataLoader held weak references, and every
    pickled loader (pickle, torch.save, a spawn-started process's argument) raised TypeError."""
    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import copy, io, pickle, multiprocessing as mp
        import envdoctor
        envdoctor.attach(interval=60)
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        def count(loader):
            assert len(list(loader)) == 2

        if __name__ == "__main__":
            loader = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4)
            assert len(list(pickle.loads(pickle.dumps(loader)))) == 2
            torch.save(loader, io.BytesIO())
            assert len(list(copy.deepcopy(loader))) == 2
            child = mp.get_context("spawn").Process(target=count, args=(loader,))
            child.start()
            child.join()
            print("ok", child.exitcode, len(envdoctor.attach().snapshot()["dataloaders"]))
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "0", "1"], r.stdout  # the copies are not the job's loaders


def test_forked_children_do_not_publish_and_do_not_remove_the_parents_document():
    r = run_py("""
        import glob, os, sys, time, json
        import envdoctor
        p = envdoctor.attach(interval=0.2)
        time.sleep(0.3)
        pid = os.fork()
        if pid == 0:
            time.sleep(0.8)
            mine = bool(glob.glob(os.path.join(os.path.dirname(p.path), "envdoctor-attach-%d[.-]*json" % os.getpid())))
            sys.stdout.write(json.dumps({"child_published": mine}) + "\\n"); sys.stdout.flush()
            sys.exit(0)                                       # runs atexit in the child
        os.waitpid(pid, 0)
        print(json.dumps({"parent_still_there": os.path.exists(p.path)}))
    """)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert {"child_published": False} in lines
    assert {"parent_still_there": True} in lines


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_do_not_publish(tmp_path, context):
    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import glob, os, time, json
        import envdoctor
        envdoctor.attach(interval=0.2)             # at module level: spawned workers run this too
        import torch
        from torch.utils.data import DataLoader, Dataset

        class D(Dataset):
            def __len__(self): return 2
            def __getitem__(self, i): return torch.zeros(4)

        def init(_):
            time.sleep(0.8)                        # several publication intervals
            seen = bool(glob.glob("/dev/shm/envdoctor-attach-%d[.-]*json" % os.getpid()) or
                        glob.glob("/tmp/envdoctor-attach-%d[.-]*json" % os.getpid()))
            with open(os.path.join({str(tmp_path)!r}, "worker-%d" % os.getpid()), "w") as f:
                f.write(json.dumps(seen))

        if __name__ == "__main__":
            loader = DataLoader(D(), num_workers=2, worker_init_fn=init, multiprocessing_context={context!r})
            for _ in loader:
                pass
            print("done")
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    reports = [json.loads(p.read_text()) for p in tmp_path.glob("worker-*")]
    assert reports == [False, False]


def test_startup_hook_attaches_and_keeps_an_existing_sitecustomize(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIR_SITECUSTOMIZE_RAN'] = '1'\n")
    env = startup_hook(tmp_path / "hook", {"PYTHONPATH": str(theirs)}, interval=0.5)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "hook"), str(theirs)]
    code = textwrap.dedent("""
        import os, sys, time, json
        time.sleep(1.8)                      # the hook attaches after one second
        import envdoctor.attach as a
        p = a.current()
        print(json.dumps({"theirs": os.environ.get("THEIR_SITECUSTOMIZE_RAN"), "attached": p is not None,
                          "published": bool(p and os.path.exists(p.path)),
                          "envdoctor_path_left": any(x.endswith("envdoctor-src") for x in sys.path)}))
    """)
    # envdoctor is found through the hook alone: no PYTHONPATH to the checkout
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=env["PYTHONPATH"]), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == {"theirs": "1", "attached": True, "published": True, "envdoctor_path_left": False}


def test_envdoctor_attach_0_turns_it_off():
    r = run_py("import envdoctor; print(envdoctor.attach())", env={"ENVDOCTOR_ATTACH": "0"})
    assert r.stdout.strip() == "None"


# -- the reader, against hostile documents ------------------------------------------------


@pytest.fixture
def target():
    proc = subprocess.Popen(["sleep", "30"])
    path = Path("/dev/shm") / document_name(proc.pid)
    try:
        yield proc.pid, path
    finally:
        proc.kill()
        proc.wait()
        for p in (path, Path("/tmp") / document_name(proc.pid)):
            if p.is_symlink() or p.exists():
                p.unlink()


def good(pid: int) -> dict:
    return {"schema": SCHEMA, "pid": pid, "published_at": time.time(), "interval_seconds": 5.0,
            "torch": {"num_threads": 16}, "cuda": {"initialized": False, "devices": {}}, "dataloaders": [], "env": {}}


def test_reader_accepts_a_good_document(target):
    pid, path = target
    path.write_text(json.dumps(good(pid)))
    doc, source = read_document(Roots(), pid)
    assert doc is not None and doc["torch"]["num_threads"] == 16 and source == f"/dev/shm/{path.name}"


def test_reader_does_not_follow_a_symlink(target, tmp_path):
    pid, path = target
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(good(pid)))
    path.symlink_to(secret)
    doc, reason = read_document(Roots(), pid)
    assert doc is None and "symlink" in reason


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to another user")
def test_reader_refuses_a_document_owned_by_another_user(target):
    pid, path = target
    path.write_text(json.dumps(good(pid)))
    os.chown(path, 65534, 65534)
    doc, reason = read_document(Roots(), pid)
    assert doc is None and "owned by uid 65534" in reason


def test_reader_refuses_oversized_fifo_malformed_stale_and_foreign(target):
    pid, path = target
    path.write_bytes(b"{" + b" " * (MAX_BYTES + 10) + b"}")
    assert "cap" in read_document(Roots(), pid)[1]
    path.unlink()
    os.mkfifo(path)
    assert "not a regular file" in read_document(Roots(), pid)[1]  # and it did not hang
    path.unlink()
    path.write_bytes(b"\xff\xfe not json")
    assert "not valid JSON" in read_document(Roots(), pid)[1]
    stale = dict(good(pid), published_at=time.time() - 3600)
    path.write_text(json.dumps(stale))
    assert "stale" in read_document(Roots(), pid)[1]
    path.write_text(json.dumps(dict(good(pid), pid=pid + 1)))
    assert "names pid" in read_document(Roots(), pid)[1]
    path.write_text(json.dumps(dict(good(pid), dataloaders={"x": 1})))
    assert "wrong type" in read_document(Roots(), pid)[1]
    path.write_text("[1, 2, 3]")
    assert "not a JSON object" in read_document(Roots(), pid)[1]


def test_reader_says_how_to_attach_when_nothing_is_published(target):
    pid, _ = target
    doc, reason = read_document(Roots(), pid)
    assert doc is None and "envdoctor.attach()" in reason and "exec --attach" in reason


def test_reader_on_a_vanished_process_is_a_reason():
    doc, reason = read_document(Roots(), 2**22 + 12345)
    assert doc is None and "cannot read" in reason


def test_validate_on_junk_never_raises():
    for junk in (None, 1, "x", [], {"schema": SCHEMA}, {"schema": SCHEMA, "pid": 1, "published_at": "x"}):
        assert isinstance(validate(junk, 1), str)
    assert attach_module.LiveFacts({"torch": {"num_threads": True}}, "x").num_threads is None
    assert attach_module.LiveFacts({"dataloaders": "nope"}, "x").busiest_loader() is None


def test_preflight_shares_the_live_facts():
    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    r = run_py("""
        import json, torch, envdoctor
        torch.set_num_threads(64)
        results = envdoctor.preflight(only=["cpu.threads"], file=None)
        print(json.dumps(results[0].facts))
    """)
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    assert facts["live_threads"] == 64


def test_attach_sweeps_documents_that_killed_jobs_left_behind():
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "30"])
    old = time.time() - 3600
    paths = {}
    try:
        for label, pid in (("dead", dead.pid), ("alive", alive.pid)):
            path = Path("/dev/shm") / document_name(pid)
            path.write_text("{}")
            os.utime(path, (old, old))
            paths[label] = path
        fresh = Path("/dev/shm") / document_name(dead.pid + 7_000_000)  # no such pid, but rewritten just now
        fresh.write_text("{}")
        paths["fresh"] = fresh
        r = run_py("import envdoctor; envdoctor.attach(interval=60)")
        assert r.returncode == 0, r.stderr
        assert not paths["dead"].exists()
        assert paths["alive"].exists() and paths["fresh"].exists()
    finally:
        alive.kill()
        alive.wait()
        for path in paths.values():
            if path.exists():
                path.unlink()


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
                           max_leaves=20)
loader_like = st.fixed_dictionaries({}, optional={k: json_values | st.integers() for k in (
    "num_workers", "pin_memory", "prefetch_factor", "batch_bytes_max", "batch_size")})


@settings(max_examples=150, deadline=None)
@given(st.fixed_dictionaries({}, optional={"torch": json_values | st.fixed_dictionaries(
    {}, optional={"num_threads": json_values | st.integers()}), "env": json_values,
    "dataloaders": json_values | st.lists(loader_like, max_size=3)}))
def test_any_document_gives_bounded_live_facts_and_checks_that_judge_them(doc):
    from envdoctor.checks import shm_size
    from envdoctor.checks.shm_size import ShmFacts

    live = attach_module.LiveFacts(doc, "test")
    threads = live.num_threads
    assert threads is None or (isinstance(threads, int) and 0 < threads <= 1 << 16)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in live.env.items())
    loader = live.busiest_loader()
    if loader is not None:
        workers = loader.get("num_workers")
        assert workers is None or (isinstance(workers, int) and 0 <= workers <= 4096)

    facts = ShmFacts("/dev/shm", 64 * 1024**2, 60 * 1024**2, "tmpfs", "/dev/shm", live_loader=loader)
    config = shm_size.with_live_loader(facts, dict(shm_size.CHECK.config))
    if config.get("loader_source") == "live":
        assert config["num_workers"] == loader["num_workers"] and config["batch_bytes"] == loader["batch_bytes_max"]
    result = shm_size.judge(facts, dict(shm_size.CHECK.config))
    assert result.status.value in ("ok", "warn", "fail")


def test_ranks_started_by_torch_multiprocessing_spawn_publish(tmp_path):
    """Helper-41: attach() returned None in every rank of `torch.multiprocessing.spawn`
    (a common way to start DDP): any spawned child was taken for a DataLoader worker.
    A rank calls attach() itself and publishes; the module-level re-run of the parent's
    script in a spawned DataLoader worker still does not (test above)."""
    pytest.importorskip("torch", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    script = tmp_path / "ddp.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, time
        import envdoctor
        import torch.multiprocessing as mp

        def main(rank):
            publisher = envdoctor.attach(interval=0.2)
            time.sleep(0.6)
            with open(os.path.join({str(tmp_path)!r}, "rank-%d" % rank), "w") as f:
                f.write(json.dumps(publisher is not None and os.path.exists(publisher.path)))

        if __name__ == "__main__":
            mp.spawn(main, nprocs=2)
            print("done")
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(p.read_text()) for p in tmp_path.glob("rank-*")) == [True, True]
