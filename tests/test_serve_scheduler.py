"""The scheduler's run over many targets, and the watchdog under the load serve puts on it."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from envdoctor.watchdog import DONE, Watchdog, default_watchdog


def test_watchdog_backlog_from_many_callers_never_starves():
    """serve runs several targets at once, each starting all its checks: far more calls
    than workers. Every queued call must still get a worker (a miscounted idle pool
    once let the workers retire while calls waited, and every check 'timed out
    waiting for a free worker')."""
    wd = Watchdog(max_workers=4, name=f"test-{os.getpid()}")
    kinds: list[str] = []
    lock = threading.Lock()

    def caller(i: int) -> None:
        for round_ in range(3):
            pending = [wd.start((i, round_, j), lambda: time.sleep(0.01)) for j in range(10)]
            deadline = time.monotonic() + 30
            outcomes = [p.wait(deadline) for p in pending]
            with lock:
                kinds.extend(o.kind for o in outcomes)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(kinds) == 8 * 3 * 10
    assert set(kinds) == {DONE}, {k: kinds.count(k) for k in set(kinds)}
    assert wd.threads() <= 4


SCRIPT = r"""
import sys, json
from envdoctor.serve import Daemon, Options
d = Daemon(Options(once=True, config_file=sys.argv[1]))
snap = d.scheduler.run_once()
print(json.dumps({"torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
                  "onnxruntime": "onnxruntime" in sys.modules,
                  "metrics": snap.metrics.decode(), "targets": list(snap.targets)}))
"""


def test_one_run_bounded_by_max_targets_without_torch_in_the_daemon(tmp_path):
    import json
    import sys

    tag = f"ENVDOCTOR_SCHED_{os.getpid()}"
    # orphans (not envdoctor's children, which are never targets): the shell exits at once
    subprocess.run(["sh", "-c", "for i in 1 2 3 4; do sleep 30 & done"], env={**os.environ, tag: "1"}, check=True)
    cfg = tmp_path / "envdoctor.toml"
    cfg.write_text(f"[serve]\nmax_targets = 3\nselect_env = [\"{tag}\"]\n")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(cfg)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["torch"] == [] and data["onnxruntime"] is False
    assert len(data["targets"]) == 3 and data["targets"][0] == "node"
    metrics = data["metrics"]
    overflow = next(float(l.split()[1]) for l in metrics.splitlines() if l.startswith("envdoctor_targets_overflow_total "))
    assert overflow >= 2
    pid_target = data["targets"][1]
    assert f'envdoctor_check_status{{check="cpu.threads",status="ok",target="{pid_target}"}} 1.0' in metrics
    assert f'check="gpu.health",status="ok",target="{pid_target}"' not in metrics  # node-wide: once, on the node
    # torch checks on a process skip with the reason (facts come from files), never a probe
    assert f'envdoctor_check_status{{check="torch.cudnn",status="skip",target="{pid_target}"}} 1.0' in metrics


def test_every_series_serve_emits_is_documented_with_its_labels(tmp_path):
    import re
    import sys
    from pathlib import Path

    import json

    (tmp_path / "envdoctor.toml").write_text("")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "envdoctor.toml")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr

    metrics = json.loads(out.stdout)["metrics"]
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    seen = set()
    for line in metrics.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-z_]+)(?:\{(.*)\})? ", line)
        name, labels = m.group(1), re.findall(r'([a-z_]+)="', m.group(2) or "")
        if name in seen:
            continue
        seen.add(name)
        row = next((r for r in readme.splitlines() if r.startswith(f"| `{name}`")), None)
        assert row is not None, f"{name} is not documented in the README"
        for label in labels:
            assert f"`{label}`" in row, f"label {label} of {name} is not documented"
    assert "envdoctor_target_info" in seen and "envdoctor_targets_overflow_total" in seen


def _orphan_sleeper(seconds: int = 30) -> int:
    """A process that is not our child (envdoctor's own children are never targets)."""
    out = subprocess.run(["sh", "-c", f"sleep {seconds} > /dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def _scheduler(fake, interval: float = 2.0):
    from envdoctor import nvml, pipeline
    from envdoctor.config import Config
    from envdoctor.context import Roots
    from envdoctor.serve.scheduler import Scheduler
    from envdoctor.serve.settings import Settings

    return Scheduler(pipeline.load_registry(), Config(timeout=3), Settings(interval=interval), Roots(),
                     default_watchdog(), nvml_factory=lambda: nvml.connect(lib=fake, timeout=0.5))


def test_processes_nvml_lists_become_targets_and_gpu_health_runs_on_the_node():
    from fake_pynvml import GIB, FakeDevice, FakeNvml

    pid = _orphan_sleeper()
    try:
        fake = FakeNvml(devices=[FakeDevice(processes=[(pid, 2 * GIB)], memory_used=2 * GIB)])
        snap = _scheduler(fake).run_once()
        text = snap.metrics.decode()
        assert f"pid:{pid}" in snap.targets
        assert f'source="nvml",target="pid:{pid}"' in text
        assert 'envdoctor_check_status{check="gpu.health",status="error",target="node"} 0.0' in text
        assert 'envdoctor_gpu_memory_used_bytes{gpu="0",target="node"}' in text
        assert 'envdoctor_gpu_info{gpu="0",name="NVIDIA H100 80GB HBM3",pci_bus_id="' in text  # to join on
        readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
        assert "| `envdoctor_gpu_info` | `target`, `gpu`, `uuid`, `pci_bus_id`, `name` |" in readme
    finally:
        os.kill(pid, 9)


def test_targets_are_examined_one_at_a_time_and_slow_ones_overlap(monkeypatch):
    """16 processes examined at once cost 2.5x the CPU of one at a time (GIL hand-offs at
    every read), so a run's targets are one chain: each one's memory sample and checks,
    in turn. A call still running after SLOW_CHECK_SECONDS (a hung read waiting out its
    timeout) is left behind while the rest go on, so a node of slow processes still takes
    about one's time, not the sum, and each target keeps its own rows, in order."""
    from fake_pynvml import FakeNvml
    from envdoctor import runner
    from envdoctor.context import HostSession
    from envdoctor.serve.discovery import TargetInfo

    sched = _scheduler(FakeNvml(devices=[]))
    pids = [_orphan_sleeper() for _ in range(6)]
    targets = [TargetInfo(label=f"pid:{pid}", pid=pid, source="test", comm="sleep") for pid in pids]
    lock = threading.Lock()
    running, most, sampled = [0], [0], []

    def sample(seconds):
        def fn(target, host):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
                sampled.append(target.label)
            time.sleep(seconds)
            with lock:
                running[0] -= 1
        return fn

    def examine_all():
        host = HostSession(roots=sched.roots, watchdog=sched.watchdog, nvml_factory=sched.nvml_factory)
        return sched._examine_all(targets, host)

    try:
        monkeypatch.setattr(runner, "SLOW_CHECK_SECONDS", 30.0)
        monkeypatch.setattr(sched, "_sample_memory", sample(0.02))
        rows = examine_all()
        assert sampled == [t.label for t in targets], "each target sampled once, in turn"
        assert most[0] == 1, "quick targets overlapped"
        assert [{r.target for r in target_rows} for target_rows in rows] == [{t.label} for t in targets]
        checks = [r.check for r in rows[0]]
        assert "cpu.threads" in checks and checks == sorted(checks) and "gpu.health" not in checks  # node-only

        monkeypatch.setattr(runner, "SLOW_CHECK_SECONDS", 0.05)
        monkeypatch.setattr(sched, "_sample_memory", sample(1.0))
        most[0] = 0
        started = time.monotonic()
        rows = examine_all()
        assert most[0] == 6, "slow targets waited for one another"
        assert time.monotonic() - started < 6 * 1.0
        assert [{r.target for r in target_rows} for target_rows in rows] == [{t.label} for t in targets]
    finally:
        for pid in pids:
            os.kill(pid, 9)


def test_a_hung_memory_sample_costs_its_own_call_not_the_run_or_the_other_targets(monkeypatch):
    """A process's memory sample is the first call of its part of the run's chain: one
    that never returns (a /proc file that blocks) is left behind, every target still gets
    its checks, the run ends at the call's timeout, /healthz's list names it, and the next
    run does not start it again while it is stuck."""
    from fake_pynvml import FakeNvml
    from envdoctor.context import HostSession
    from envdoctor.serve.discovery import TargetInfo

    sched = _scheduler(FakeNvml(devices=[]))  # Config(timeout=3)
    pids = [_orphan_sleeper() for _ in range(3)]
    targets = [TargetInfo(label=f"pid:{pid}", pid=pid, source="test", comm="sleep") for pid in pids]
    release = threading.Event()
    sampled: list[str] = []

    def sample(target, host):
        sampled.append(target.label)
        if target.pid == pids[1]:
            release.wait(60)

    monkeypatch.setattr(sched, "_sample_memory", sample)

    def examine_all():
        host = HostSession(roots=sched.roots, watchdog=sched.watchdog, nvml_factory=sched.nvml_factory)
        started = time.monotonic()
        rows = sched._examine_all(targets, host)
        return rows, time.monotonic() - started

    try:
        rows, took = examine_all()
        assert sampled == [t.label for t in targets]
        assert 2.5 < took < 15, took  # the hung sample's 3 s timeout, not 60 s
        for target, target_rows in zip(targets, rows):
            assert "cpu.threads" in {r.check for r in target_rows} and {r.target for r in target_rows} == {target.label}
        stuck = [c.split(" for ")[0] for c in sched.stuck_calls() if c.startswith("memory.sample")]
        assert stuck == [f"memory.sample:pid:{pids[1]}"]  # (the watchdog is the process's: other tests' may be there)

        sampled.clear()
        rows, took = examine_all()
        assert sampled == [targets[0].label, targets[2].label], "the stuck sample was started again"
        assert took < 2.5 and "cpu.threads" in {r.check for r in rows[1]}
    finally:
        release.set()
        for pid in pids:
            os.kill(pid, 9)


def test_a_targets_secrets_are_masked_in_its_rows_whether_its_session_was_let_go_or_not(monkeypatch):
    """A process's rows are redacted with its environment. Once its checks have all
    returned, its session lets go of what it read (the chain's worker takes the secret
    values first); when a check had not returned by then, the values are read from the
    session as it is. Either way the secret never reaches a row."""
    from fake_pynvml import FakeNvml
    from envdoctor.context import HostSession
    from envdoctor.serve import scheduler as scheduler_module
    from envdoctor.serve.discovery import TargetInfo

    secret = "hf_Zq8vN3xT5mK1pL7wR2cY9bJ4"
    out = subprocess.run(["sh", "-c", "sleep 30 > /dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True,
                         env={**os.environ, "HF_TOKEN": secret, "CUDA_VISIBLE_DEVICES": f"0,{secret}",
                              "OMP_NUM_THREADS": secret, "LOCAL_RANK": f"x{secret}"})
    pid = int(out.stdout.strip())
    sched = _scheduler(FakeNvml(devices=[]))
    target = TargetInfo(label=f"pid:{pid}", pid=pid, source="test", comm="sleep")
    try:
        for let_go in (True, False):
            if not let_go:
                monkeypatch.setattr(scheduler_module._Examination, "let_go", lambda self: None)
            host = HostSession(roots=sched.roots, watchdog=sched.watchdog, nvml_factory=sched.nvml_factory)
            sched._own_env = dict(os.environ)
            rows = sched._examine_all([target], host)[0]
            visible = next(r for r in rows if r.check == "cuda.visible_devices")
            assert visible.status.value in ("fail", "warn"), visible  # it read the variable and judged it
            text = repr([(r.summary, r.remediation, r.facts) for r in rows])
            assert secret not in text and secret[:12] not in text, (let_go, text)
    finally:
        os.kill(pid, 9)


def test_a_hung_gpu_costs_one_stuck_call_not_the_daemon():
    """NVML blocks on one device: the run still completes, the check says it is stuck,
    the next run does not start it again, and /healthz names it."""
    from fake_pynvml import FakeDevice, FakeNvml
    from envdoctor.serve import httpd

    fake = FakeNvml(devices=[FakeDevice(hang="temperature"), FakeDevice()])
    sched = _scheduler(fake)
    try:
        first = sched.run_once()
        second = sched.run_once()
        for snap in (first, second):
            assert snap.metrics and 'check="cpu.threads",status="ok",target="node"} 1.0' in snap.metrics.decode()
        assert 'envdoctor_check_status{check="gpu.health",status="ok",target="node"} 0.0' in second.metrics.decode()
        assert float(next(l.split()[1] for l in second.metrics.decode().splitlines()
                          if l.startswith("envdoctor_call_timeouts_total "))) >= 1
        code, text = httpd.healthz(second, httpd.Health(lambda: 2.0, sched.stuck_calls), now=second.completed_monotonic + 7)
        stuck = sched.stuck_calls()
        assert stuck and code == 503 and stuck[0].split(" for ")[0] in text
    finally:
        fake.release()


GC_SCRIPT = r"""
import gc, json, sys, threading, weakref
gc.disable()  # only the daemon's own collections may free anything here
from envdoctor.serve import Daemon, Options
sched = Daemon(Options(once=True, interval=1.0, config_file=sys.argv[1])).scheduler
left = []
real_run = sched.run_once

def run_once():
    snap = real_run()
    box = {}
    box["self"] = box  # a cycle left by a run, as a kept exception's traceback or a session's lazy facts leave
    left.append(weakref.ref(cycle := type("Cycle", (), {})()))
    cycle.box, cycle.me = box, cycle
    if len(left) >= 3:
        sched.stop.set()
    return snap

sched.run_once = run_once
loop = threading.Thread(target=sched.loop)
loop.start()
loop.join(60)
print(json.dumps({"runs": len(left), "alive": sum(ref() is not None for ref in left), "targets": len(sched.snapshot.targets),
                  "frozen": gc.get_freeze_count(), "garbage_after": gc.collect()}))
"""


def test_the_loop_frees_each_runs_cycles_itself(tmp_path):
    """A run leaves thousands of objects in reference cycles; left to the collector's own
    schedule they outlived several runs (RSS 45 -> 57 MiB in 30 runs with 64 targets).
    With automatic collection off, nothing a run left may still be alive after the loop,
    and what lives for the daemon's life is frozen out of later collections."""
    import json
    import sys

    # with a process to examine: what a run leaves behind is mostly its targets' (a kept
    # memory sampler once held the run's node facts, and gc.freeze kept the first run's)
    tag = f"ENVDOCTOR_GC_{os.getpid()}"
    subprocess.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 &"], env={**os.environ, tag: "1"}, check=True)
    config = tmp_path / "envdoctor.toml"
    config.write_text(f'[serve]\nselect_env = ["{tag}"]\n')
    out = subprocess.run([sys.executable, "-c", GC_SCRIPT, str(config)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["runs"] == 3 and seen["targets"] >= 2, seen  # the node and the sleeper
    assert seen["alive"] == 0, seen
    assert seen["frozen"] > 1000, seen  # the modules' objects, frozen after the first run
    assert seen["garbage_after"] < 500, seen  # a run alone leaves ~11,000 in cycles



NO_CYCLES_SCRIPT = r"""
import gc, json, sys
from envdoctor.serve import Daemon, Options
sched = Daemon(Options(once=True, config_file=sys.argv[1])).scheduler
for _ in range(2):  # the checks' lazy imports, the first run's freeze
    sched.run_once()
    sched.collect_garbage()
gc.disable()
snap = sched.run_once()
print(json.dumps({"targets": len(snap.targets), "in_cycles": gc.collect()}))
"""


def test_a_run_over_processes_without_torch_leaves_no_reference_cycles(tmp_path):
    r"""Each process's session held its lazy facts through bound methods of itself, and a
    "no torch" (and the node's "no NVIDIA driver") kept frames that held the session: ~60
    objects in cycles per process, alive until the run's end, and the daemon's memory
    stays at a run's high-water mark. Now a run over such processes leaves none."""
    import json
    import sys

    tag = f"ENVDOCTOR_NOCYCLE_{os.getpid()}"
    marker = f"{3100 + os.getpid() % 1000}.5"
    subprocess.run(["sh", "-c", f"for i in 1 2 3; do sleep {marker} >/dev/null 2>&1 & done"],
                   env={**os.environ, tag: "1"}, check=True)
    try:
        config = tmp_path / "envdoctor.toml"
        config.write_text(f'[serve]\nselect_env = ["{tag}"]\n')
        out = subprocess.run([sys.executable, "-c", NO_CYCLES_SCRIPT, str(config)], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-2000:]
        seen = json.loads(out.stdout.strip().splitlines()[-1])
        assert seen["targets"] >= 4, seen  # the node and the three sleepers
        assert seen["in_cycles"] == 0, seen
    finally:
        subprocess.run(["pkill", "-f", f"^sleep {marker}$"])


SLEEP_SCRIPT = r"""
import json, sys, threading, time
from envdoctor.serve import Daemon, Options
sched = Daemon(Options(once=True, config_file=sys.argv[1])).scheduler
runs, reloads = [], []
real_run = sched.run_once
sched.run_once = lambda: runs.append(time.monotonic()) or real_run()
sched._reload = lambda: reloads.append(time.monotonic()) or (sched.config, sched.settings)

def until(condition, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)

def wakeups(thread):
    with open(f"/proc/self/task/{thread.native_id}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("voluntary_ctxt_switches:"))

loop = threading.Thread(target=sched.loop)
loop.start()
until(lambda: len(runs) == 1)
time.sleep(0.5)  # the first run's garbage collection is over: the loop sleeps toward its next run
before = wakeups(loop)
time.sleep(1.0)
idle_wakeups = wakeups(loop) - before
t = time.monotonic()
sched.reload_requested.set()
until(lambda: len(runs) == 2)
reload_after = (reloads[0] - t) if reloads else None
t = time.monotonic()
sched.stop.set()
loop.join(10)
print(json.dumps({"idle_wakeups": idle_wakeups, "reload_after": reload_after, "runs": len(runs),
                  "stopped_after": time.monotonic() - t, "alive": loop.is_alive()}))
"""


def test_the_loop_sleeps_through_its_interval_and_wakes_at_once_to_stop_or_reload(tmp_path):
    """Between runs the loop waits once for the whole interval (it looked up every 0.2 s,
    five wakeups a second of an idle daemon's CPU), and stop or SIGHUP's reload still
    end that wait at once."""
    import json
    import sys

    config = tmp_path / "envdoctor.toml"
    config.write_text("[serve]\ninterval = 3600\nmax_targets = 1\n")
    out = subprocess.run([sys.executable, "-c", SLEEP_SCRIPT, str(config)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["idle_wakeups"] <= 1, seen
    assert seen["reload_after"] is not None and seen["reload_after"] < 1.0, seen
    assert seen["runs"] == 2 and not seen["alive"] and seen["stopped_after"] < 1.0, seen


def test_healthz_names_a_stuck_calls_kind_and_target_not_what_its_key_read():
    """A stuck call's key can carry what a check read from a process: dist.env's name
    lookup keys on MASTER_ADDR's host, which held a secret in helper-65's test, and
    /healthz is not redacted. It shows the kind and a target label only."""
    from fake_pynvml import FakeNvml

    sched = _scheduler(FakeNvml(devices=[]))
    secret = "k23WIK6VmIJ2OOD2NiNW9LOocCE4mD"
    fake = {("resolve", f"{secret}.example", None): time.time() - 2, ("memory.sample", "pid:4242"): time.time() - 3,
            ("cpu.threads", "node"): None}

    class Dog:
        def stuck(self):
            return fake

    sched.watchdog = Dog()
    names = sched.stuck_calls()
    assert not any(secret in n for n in names), names
    assert [n.split(" for ")[0] for n in names] == ["cpu.threads:node", "memory.sample:pid:4242", "resolve:...:..."]


def test_a_target_left_out_for_max_targets_is_not_logged_as_gone():
    """helper-67: when max_targets shrank on SIGHUP, processes still running were logged
    `target gone`. One left out for the bound says so; one that exited is gone."""
    import io

    from fake_pynvml import FakeNvml
    from envdoctor import log
    from envdoctor.serve import discovery

    sched = _scheduler(FakeNvml(devices=[]))
    node = discovery.TargetInfo("node", None, "node")
    stream = io.StringIO()
    log.configure("info", stream)
    try:
        sched._log_changes(discovery.Found([node, discovery.TargetInfo("pid:11", 11, "torch"),
                                            discovery.TargetInfo("pid:12", 12, "torch")]), 0.1)
        sched._log_changes(discovery.Found([node], overflow=1, left_out=frozenset({"pid:11"})), 0.1)
    finally:
        log.configure("info", None)
    lines = stream.getvalue().splitlines()
    assert any('msg="target no longer examined" target=pid:11 reason="more targets than max_targets"' in line
               for line in lines), lines
    assert any('msg="target gone" target=pid:12' in line for line in lines), lines
    assert not any('msg="target gone" target=pid:11' in line for line in lines), lines


def test_a_secret_a_process_took_as_its_name_is_masked_in_target_info_and_the_log(tmp_path):
    """helper-70: a process that names itself (prctl PR_SET_NAME, `exec -a`) with the value of
    its secret variable showed it in envdoctor_target_info's comm and in `target appeared`:
    the comm is redacted with the process's environment, as its rows are."""
    import sys

    tag = f"ENVDOCTOR_COMM_{os.getpid()}"
    # 15 characters (all of it fits in a comm); a longer token, which the kernel cuts to its
    # first 15, shown until helper-73; and non-ASCII ones, cut at 15 bytes: after a whole "é"
    # (14 characters) or through one (U+FFFD), whose first 13-14 characters showed (helper-82)
    for secret in ("Zq9xLmP4wR7tY2k", "ghp_R4nd0mT0kenValue9876543210", "Zq9vK2mPxU7iRé4tLw8YbN3cE",
                   "Zq9vK2mPxU7iR4éLw8YbN3cE"):
        code = ("import ctypes, sys, time; ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0); "
                "sys.stdout.write('named\\n'); sys.stdout.flush(); time.sleep(120)")
        named = subprocess.Popen([sys.executable, "-c", code, secret], stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, tag: "1", "MY_API_TOKEN": secret})
        try:
            assert named.stdout.readline() == "named\n"
            assert Path(f"/proc/{named.pid}/comm").read_bytes().strip() == secret.encode()[:15]
            cfg = tmp_path / "envdoctor.toml"
            cfg.write_text(f'[serve]\nselect_env = ["{tag}"]\n')
            out = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--once", "--config", str(cfg)],
                                 capture_output=True, text=True, timeout=120)
        finally:
            named.kill()
            named.wait()
        assert out.returncode == 0, out.stderr
        info = [l for l in out.stdout.splitlines() if l.startswith("envdoctor_target_info{") and f'pid="{named.pid}"' in l]
        assert len(info) == 1 and 'comm="___"' in info[0], info  # the mask, as label_value spells a '*'
        appeared = [l for l in out.stderr.splitlines() if f"target=pid:{named.pid}" in l]
        assert appeared and all(l.endswith("comm=___") for l in appeared), appeared
        assert secret[:12] not in out.stdout + out.stderr


def test_a_lasting_overflow_is_logged_when_it_starts_changes_and_ends_not_every_run():
    """helper-69: `more targets than max_targets` came every run (240 lines an hour at 15 s).
    It is said when it starts, when max_targets changes, and when it ends."""
    import io

    from fake_pynvml import FakeNvml
    from envdoctor import log
    from envdoctor.serve import discovery

    sched = _scheduler(FakeNvml(devices=[]))
    node = discovery.TargetInfo("node", None, "node")
    stream = io.StringIO()
    log.configure("info", stream)
    try:
        for overflow in (2, 2, 2, 3, 3, 0, 0, 1):
            sched._log_changes(discovery.Found([node], overflow=overflow), 0.1)
    finally:
        log.configure("info", None)
    said = [line.split(" msg=", 1)[1] for line in stream.getvalue().splitlines()]
    limit = sched.settings.max_targets
    assert said == [f'"more targets than max_targets" overflow=2 max_targets={limit}',  # not again at 3 (helper-73)
                    f'"targets within max_targets again" targets=1 max_targets={limit}',
                    f'"more targets than max_targets" overflow=1 max_targets={limit}'], said


def test_the_node_alone_by_choice_is_no_warning(monkeypatch):
    """helper-81: the Slurm epilog sets max_targets = 1 (the node only) on purpose, and slurmd's
    log got a warning at every job's end. With max_targets = 1 it is said at info."""
    import io

    from fake_pynvml import FakeNvml
    from envdoctor import log
    from envdoctor.serve import discovery

    sched = _scheduler(FakeNvml(devices=[]))
    monkeypatch.setattr(sched.settings, "max_targets", 1)
    stream = io.StringIO()
    log.configure("info", stream)
    try:
        sched._log_changes(discovery.Found([discovery.TargetInfo("node", None, "node")], overflow=5), 0.1)
    finally:
        log.configure("info", None)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "level=info" in lines[0] and "max_targets=1" in lines[0], lines


def test_a_textfile_that_cannot_be_written_is_logged_once_while_it_lasts(tmp_path):
    import io

    from envdoctor import log
    from envdoctor.serve import Daemon, Options
    from envdoctor.serve.snapshot import Snapshot

    blocker = tmp_path / "x.prom"
    blocker.mkdir()  # a directory where the file should be: not written, for the same reason each run
    daemon = Daemon(Options(once=True, textfile=blocker))
    snap = Snapshot(b"envdoctor_up 1\n", b"", b"{}\n", 0.0, 0.0, 0.0)
    stream = io.StringIO()
    log.configure("info", stream)
    try:
        for _ in range(3):
            daemon._write_textfile(snap)
        blocker.rmdir()
        daemon._write_textfile(snap)
        daemon._write_textfile(snap)
    finally:
        log.configure("info", None)
    msgs = [line.split(" msg=", 1)[1].split('"')[1] for line in stream.getvalue().splitlines()]
    assert msgs == ["textfile not written", "textfile written again"], stream.getvalue()
    assert blocker.read_bytes() == b"envdoctor_up 1\n"


def test_report_system_holds_the_nodes_facts_gathered_every_few_minutes(monkeypatch):
    """/report's `system` said only the daemon's Python version (helper-91): a platform
    engineer reading it could not tell the node's kernel, OS or driver. It now holds the
    node's facts as `check` reports them, gathered at the first run and again every
    SYSTEM_FACTS_SECONDS, not every run."""
    import json

    from envdoctor import sysfacts
    from envdoctor.serve import Daemon, Options
    from envdoctor.serve import scheduler as scheduler_module

    calls = []
    real = sysfacts.gather
    monkeypatch.setattr(sysfacts, "gather", lambda *a, **k: calls.append(1) or real(*a, **k))
    scheduler = Daemon(Options(once=True)).scheduler
    system = json.loads(scheduler.run_once().report)["system"]
    assert system["kernel"] == Path("/proc/sys/kernel/osrelease").read_text().strip()
    assert system["cpu_logical"] == os.cpu_count() and system["memory_total_bytes"] > 0
    if Path("/etc/os-release").exists():
        assert system["os"] and system["os"] in Path("/etc/os-release").read_text()
    assert "gpus" in system or "gpus" in system["unavailable"]  # the driver's facts, or why there are none
    scheduler.run_once()
    assert len(calls) == 1  # not again within SYSTEM_FACTS_SECONDS
    monkeypatch.setattr(scheduler, "_system_at", time.monotonic() - scheduler_module.SYSTEM_FACTS_SECONDS)
    assert json.loads(scheduler.run_once().report)["system"]["kernel"] == system["kernel"]
    assert len(calls) == 2


def test_a_stuck_system_fact_is_named_by_healthz_and_delays_only_one_run(monkeypatch):
    """helper-100: /healthz said `sysfacts:...:node` for a hung item; its name is envdoctor's
    own ("os"), not something read from a process, so it is shown."""
    import threading

    from envdoctor import sysfacts
    from envdoctor.serve import Daemon, Options

    release = threading.Event()
    items = dict(sysfacts._ITEMS)
    monkeypatch.setattr(sysfacts, "_ITEMS", tuple((name, (lambda s: release.wait(60)) if name == "os" else fn)
                                                  for name, fn in items.items()))
    monkeypatch.setattr(sysfacts, "SERVE_TIMEOUT", 0.5)
    scheduler = Daemon(Options(once=True)).scheduler
    try:
        scheduler.run_once()
        assert any(n.startswith("sysfacts:os:node for ") for n in scheduler.stuck_calls()), scheduler.stuck_calls()
    finally:
        release.set()


RUN_OPENS_SCRIPT = r"""
import json, os, sys
from envdoctor.serve import Daemon, Options
pids = [int(p) for p in sys.argv[2:]]
sched = Daemon(Options(once=True, config_file=sys.argv[1])).scheduler
sched.run_once()  # the checks' lazy imports
opened = []
def hook(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
        opened.append(os.fsdecode(args[0]))
sys.addaudithook(hook)
from envdoctor.paths import Roots
resolved, real_resolved_in = [], Roots.resolved_in
def resolved_in(self, pid, path, *args):
    resolved.append(pid)
    return real_resolved_in(self, pid, path, *args)
Roots.resolved_in = resolved_in
snap = sched.run_once()
shm = {r["target"]: r["facts"] for r in json.loads(snap.report)["results"] if r["check"] == "shm.size"}
print(json.dumps({"opened": {p: {name: opened.count(f"/proc/{p}/{name}") for name in ("status", "cgroup", "mountinfo")}
                             for p in pids},
                  "resolved": {p: resolved.count(p) for p in pids},
                  "shm": {p: shm.get(f"pid:{p}") for p in pids}, "targets": list(snap.targets)}))
"""


def _one_run_opens(tmp_path: Path, tag: str, pids: list[int]) -> dict:
    """What one serve run (after a first) opened of each of `pids`' /proc files, and their
    shm.size facts, with `[serve] select_env` naming `tag`."""
    import json
    import sys

    config = tmp_path / "envdoctor.toml"
    config.write_text(f'[serve]\nselect_env = ["{tag}"]\n')
    out = subprocess.run([sys.executable, "-c", RUN_OPENS_SCRIPT, str(config), *map(str, pids)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_run_reads_each_targets_status_and_cgroup_once(tmp_path):
    """The memory sample and the live-view lookup (the pid in the process's namespace,
    its uid) both read /proc/N/status, and discovery (the container's labels) and the CPU
    quota lookup /proc/N/cgroup: twice a run per process each, where the run's memo
    makes it once. Where /dev/shm leads (its links) is worked out once too, for the
    memory sample and shm.size."""
    tag = f"ENVDOCTOR_STATUS_{os.getpid()}"
    marker = f"{3200 + os.getpid() % 1000}.5"
    out = subprocess.run(["sh", "-c", f"for i in 1 2; do sleep {marker} >/dev/null 2>&1 & echo $!; done"],
                         env={**os.environ, tag: "1"}, capture_output=True, text=True, check=True)
    pids = [int(p) for p in out.stdout.split()]
    try:
        seen = _one_run_opens(tmp_path, tag, pids)
        assert all(f"pid:{p}" in seen["targets"] for p in pids), seen
        assert [seen["opened"][str(p)]["status"] for p in pids] == [1, 1], seen
        assert [seen["opened"][str(p)]["cgroup"] for p in pids] == [1, 1], seen
        assert [seen["resolved"][str(p)] for p in pids] == [1, 1], seen  # where /dev/shm leads: the sample's, shared
    finally:
        subprocess.run(["pkill", "-f", f"^sleep {marker}$"])


def test_processes_seeing_one_shm_from_one_mount_namespace_share_its_mount_lookup(tmp_path):
    """shm.size reads the mount table to know whether /dev/shm is a mount of its own; the
    processes of one mount namespace that see the same directory share that answer in a
    run (a node's table holds a line per mount of every pod). One in a namespace of its
    own, with a 64 MiB tmpfs there, keeps its own answer."""
    import shutil

    import pytest

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private /dev/shm")
    tag = f"ENVDOCTOR_SHMNS_{os.getpid()}"
    marker = f"{3300 + os.getpid() % 1000}.5"
    out = subprocess.run(["sh", "-c", f"for i in 1 2; do sleep {marker} >/dev/null 2>&1 & echo $!; done"],
                         env={**os.environ, tag: "1"}, capture_output=True, text=True, check=True)
    pids = [int(p) for p in out.stdout.split()]
    inner = subprocess.Popen(["unshare", "-m", "sh", "-c", "mount --make-rprivate / && "
                              f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec sleep {marker}"],
                             env={**os.environ, tag: "1"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not os.readlink(f"/proc/{inner.pid}/exe").endswith("sleep"):
            time.sleep(0.05)
        seen = _one_run_opens(tmp_path, tag, [*pids, inner.pid])
        rows = {int(p): facts for p, facts in seen["shm"].items()}
        # the two host-namespace sleepers: one read at most (the node's row, in the same
        # namespace, may have answered it already); each read its own before
        assert sum(seen["opened"][str(p)]["mountinfo"] for p in pids) <= 1, seen
        host = os.statvfs("/dev/shm")
        for pid in pids:
            assert rows[pid]["size_bytes"] == host.f_blocks * host.f_frsize, rows
        assert rows[inner.pid]["size_bytes"] == 64 * 1024 * 1024, rows
        assert rows[inner.pid]["fstype"] == "tmpfs" and rows[inner.pid]["own_mount"] is True, rows
    finally:
        inner.kill()
        inner.wait()
        subprocess.run(["pkill", "-f", f"^sleep {marker}$"])



CHROOTS_SHARING_ONE_SHM = r"""
set -e
mount --make-rprivate /
mount -t tmpfs -o size=16m tmpfs "$T/t"
for root in "$T/t/sub" "$T/r"; do
    mkdir -p "$root/dev/shm" "$root/usr"
    for l in bin lib lib64 sbin; do ln -s "usr/$l" "$root/$l"; done
    mount --bind /usr "$root/usr"
done
mount --bind "$T/t/sub/dev/shm" "$T/r/dev/shm"
chroot "$T/t/sub" /usr/bin/sleep "$MARKER" &
chroot "$T/r" /usr/bin/sleep "$MARKER" &
wait
"""


def test_two_chroots_sharing_one_shm_directory_keep_their_own_mount_answers(tmp_path):
    """helper-107: one /dev/shm directory seen from two chroots in one mount namespace:
    for the one whose root lies inside the tmpfs, the tmpfs's mount is outside its root
    and not in its table; for the other it is a bind mount of its own. The run's shared
    lookup gave both the first one's answer. Each row must be what `check --pid` says."""
    import json
    import shutil
    import sys

    import pytest

    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("unshare", "chroot")) or not os.path.islink("/lib"):
        pytest.skip("needs root, unshare(1), chroot(1) and a merged /usr")
    tag = f"ENVDOCTOR_CHROOTS_{os.getpid()}"
    marker = f"{3400 + os.getpid() % 1000}.5"
    (tmp_path / "t").mkdir()
    env = {**os.environ, tag: "1", "T": str(tmp_path), "MARKER": marker}
    outer = subprocess.Popen(["unshare", "-m", "sh", "-c", CHROOTS_SHARING_ONE_SHM], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 15
        pids: list[int] = []
        while time.monotonic() < deadline and len(pids) < 2:
            time.sleep(0.1)
            found = subprocess.run(["pgrep", "-xf", f"/usr/bin/sleep {marker}"], capture_output=True, text=True)
            pids = sorted(int(p) for p in found.stdout.split())
        assert len(pids) == 2, outer.stderr.read().decode() if outer.poll() is not None else pids
        seen = _one_run_opens(tmp_path, tag, pids)
        for pid in pids:
            out = subprocess.run([sys.executable, "-m", "envdoctor", "check", "--pid", str(pid), "-f", "json",
                                  "--only", "shm.size"], capture_output=True, text=True, timeout=120)
            alone = next(r["facts"] for r in json.loads(out.stdout)["results"] if r["check"] == "shm.size")
            served = seen["shm"][str(pid)]
            assert (served["fstype"], served["own_mount"]) == (alone["fstype"], alone["own_mount"]), (pid, served, alone)
        answers = {(seen["shm"][str(p)]["fstype"], seen["shm"][str(p)]["own_mount"]) for p in pids}
        assert len(answers) == 2, answers  # the case is real only while the two views differ
    finally:
        os.killpg(outer.pid, 9)
        outer.wait()
        subprocess.run(["pkill", "-xf", f"/usr/bin/sleep {marker}"])


COUNT_SCRUBBED = """
real = redact.Scrubber._scrub
redact.Scrubber._scrub = lambda self, value: (counted.append(value) if any(self.spans(s) for s in secrets)
                                              else None) or real(self, value)
"""


def test_a_jobs_scrubber_carries_what_it_scrubbed_into_the_next_run(tmp_path):
    """Each job's texts are scrubbed once, not every run: the scrubber of a set of secrets
    is kept from one run to the next (redact.Scrubber.next_pass). Its answers must stay
    those of a fresh one: every process's own secret masked, in both runs."""
    from serve_support import assert_each_jobs_secret_masked, runs_over_jobs_with_secrets

    (first, second), pids, secrets = runs_over_jobs_with_secrets(COUNT_SCRUBBED, tmp_path, "SCRUB")
    for run in (first, second):
        assert_each_jobs_secret_masked(run, pids, secrets)  # its own secret masked, in both runs
    assert second["counted"] < first["counted"] / 2, (first["counted"], second["counted"])  # texts scrubbed


def test_last_run_timestamp_is_the_runs_start_to_the_millisecond(monkeypatch):
    """helper-116: it was report.started_at, whole seconds, so a daemon's first run could
    read as starting before the daemon itself (…514 against start_time …514.317)."""
    import types

    from fake_pynvml import FakeNvml
    from envdoctor.serve import scheduler as scheduler_module

    clock = types.SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("__")})
    clock.time = lambda: 1795839514.317
    monkeypatch.setattr(scheduler_module, "time", clock)
    sched = _scheduler(FakeNvml(devices=[]))
    snap = sched.run_once()
    text = snap.metrics.decode()
    assert "envdoctor_last_run_timestamp_seconds 1.795839514317e+09" in text, text[-2000:]
    assert "envdoctor_start_time_seconds 1.795839514317e+09" in text
    import json

    assert json.loads(snap.report)["started_at"] == "2026-11-28T04:18:34+00:00"  # the JSON contract's whole seconds
