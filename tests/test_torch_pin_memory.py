"""torch.pin_memory: the /proc/N/stat parser, the judge on plain facts, the GPU path with
a fake NVML and a stand-in measurement, and the --pid path on real busy and idle processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

import envdoctor.nvml
import envdoctor.probe
from envdoctor.checks.torch_pin_memory import CHECK, CpuSample, PinFacts, judge, parse_proc_stat_cpu_ticks
from envdoctor.context import Session, Target
from envdoctor.errors import ParseError, Unavailable
from envdoctor.model import Status
from envdoctor.paths import Roots
from envdoctor.probe import ProbeError
from envdoctor.runner import Plan, run_one
from fake_pynvml import FakeDevice, FakeNvml
from helpers import dies_with_its_parent

CONFIG = dict(CHECK.config)
GB = 1e9
MEASURED = {"pinned_bytes_per_second": 24 * GB, "pageable_bytes_per_second": 9 * GB, "pin_cpu_seconds_per_gib": 0.21,
            "size_bytes": 128 * 1024**2, "nvml_index": 0, "gpu_name": "NVIDIA H100 80GB HBM3", "errors": {},
            "context_seconds": 0.3}
STAT = "4242 (python3 my (weird) name) R 1 4242 4242 0 -1 4194304 1234 0 0 0 {utime} {stime} 0 0 20 0 9 0 100 0 0"


def stat_line(utime, stime):
    return STAT.format(utime=utime, stime=stime)


# -- the parser ------------------------------------------------------------------------------


def test_parse_stat_counts_from_the_last_parenthesis():
    assert parse_proc_stat_cpu_ticks(stat_line(150, 50)) == 200
    for bad in ("", "4242 python R 1", "4242 (x) R 1 2 3", stat_line("1e3", 5), stat_line(-1, 5), None):
        with pytest.raises(ParseError):
            parse_proc_stat_cpu_ticks(bad)


@given(st.one_of(st.text(max_size=200), st.none(), st.binary(max_size=20)))
def test_stat_parser_returns_ticks_or_parse_error(text):
    try:
        value = parse_proc_stat_cpu_ticks(text)
    except ParseError:
        return
    assert isinstance(value, int) and value >= 0


@given(comm=st.text(max_size=16).filter(lambda s: "\n" not in s), utime=st.integers(0, 10**12), stime=st.integers(0, 10**12))
def test_stat_parser_reads_any_command_name(comm, utime, stime):
    line = f"7 ({comm}) S 1 7 7 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0 5 0 0"
    assert parse_proc_stat_cpu_ticks(line) == utime + stime


# -- judging ---------------------------------------------------------------------------------


def test_no_gpu_skips_saying_pinning_has_no_effect():
    r = judge(PinFacts(None, 0, "no NVIDIA driver here", None, None), CONFIG)
    assert r.status is Status.SKIP and "no effect without a GPU" in r.summary


def test_pid_at_its_cpu_limit_warns_naming_both_numbers():
    cpu = CpuSample(4242, 3.96, 0.5, 4.0, "cgroup quota")
    r = judge(PinFacts(cpu, 0, "no NVIDIA driver here", None, None), CONFIG)
    assert r.status is Status.WARN
    assert "3.96 of its 4 effective CPUs" in r.summary and "cgroup quota" in r.summary
    assert "pin_memory=False" in r.remediation
    assert r.facts["cpu_used"] == 3.96 and r.facts["cpu_effective"] == 4.0


def test_pid_with_cpu_to_spare_and_no_gpu_skips_with_the_numbers():
    cpu = CpuSample(4242, 0.4, 0.5, 4.0, "affinity")
    r = judge(PinFacts(cpu, 0, "no NVIDIA driver here", None, None), CONFIG)
    assert r.status is Status.SKIP and "0.40 of its 4 effective CPUs" in r.summary


def test_measured_gain_is_ok_with_advice():
    r = judge(PinFacts(None, 1, None, MEASURED, None), CONFIG)
    assert r.status is Status.OK
    assert "pinned 24.0 GB/s vs pageable 9.0 GB/s (2.7x)" in r.summary
    assert "0.21 CPU s per GiB" in r.summary and "keep pin_memory=True" in r.summary
    assert r.facts["pinned_bytes_per_second"] == 24 * GB and r.facts["pinned_speedup"] == pytest.approx(2.667, abs=1e-3)


def test_little_gain_warns():
    m = dict(MEASURED, pinned_bytes_per_second=10 * GB)
    r = judge(PinFacts(None, 1, None, m, None), CONFIG)
    assert r.status is Status.WARN and "gains little" in r.summary
    assert r.remediation == "DataLoader(..., pin_memory=False)"


def test_gpu_but_not_measured_skips_with_the_reason():
    r = judge(PinFacts(None, 2, None, None, "every GPU has compute processes on it"), CONFIG)
    assert r.status is Status.SKIP and "compute processes" in r.summary


def test_measurement_failures_are_errors_with_the_reason():
    r = judge(PinFacts(None, 1, None, {"error": "the pin_memory copy measurement did not finish within 25 s"}, None), CONFIG)
    assert r.status is Status.ERROR and "did not finish" in r.summary
    r = judge(PinFacts(None, 1, None, dict(MEASURED, errors={"measure": "OutOfMemoryError: CUDA out of memory"}), None), CONFIG)
    assert r.status is Status.ERROR and "out of memory" in r.summary


# -- the GPU path with a fake NVML and a stand-in measurement ----------------------------------


CUDA_TORCH = {"torch_version": "2.4.0+cu121", "torch_cuda_version": "12.1", "cuda_available": True, "python": sys.executable}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test its own cache: a measurement kept by one must not answer another."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("ENVDOCTOR_NO_CACHE", raising=False)


def gpu_session(fake, torch_facts=CUDA_TORCH, roots=None):
    def torch_factory(_s):
        if isinstance(torch_facts, Exception):
            raise torch_facts
        return torch_facts

    extra = {} if roots is None else {"roots": roots}
    return Session(env_override={}, torch_factory=torch_factory,
                   nvml_factory=lambda: envdoctor.nvml.connect(lib=fake, timeout=2.0), **extra)


def counting_measurement(monkeypatch, result=None):
    calls = []

    def measure(params, *, timeout=None, env=None, raise_hint=""):
        calls.append(env)
        return dict(result or {k: v for k, v in MEASURED.items() if k not in ("nvml_index", "gpu_name")})

    monkeypatch.setattr(envdoctor.probe, "run_copy_measurement", measure)
    return calls


def booted(tmp_path, boot_id):
    """A procfs root holding only a boot id: the one file the cache keys on."""
    proc = tmp_path / f"proc-{boot_id}"
    (proc / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(boot_id + "\n")
    return Roots(procfs=proc)


def test_one_measurement_serves_the_boot_and_says_when_it_was_made(monkeypatch):
    calls = counting_measurement(monkeypatch)
    fake = FakeNvml(devices=[FakeDevice(uuid="GPU-idle")])
    first = run_one(Plan(CHECK, CONFIG, 90), gpu_session(fake))
    second = run_one(Plan(CHECK, CONFIG, 90), gpu_session(fake))
    assert len(calls) == 1
    assert first.status is second.status is Status.OK
    assert first.facts["measurement_cached"] is False and "earlier this boot" not in first.summary
    assert second.facts["measurement_cached"] is True and "earlier this boot" in second.summary
    assert "ENVDOCTOR_NO_CACHE=1 measures again" in second.summary
    assert second.facts["pinned_bytes_per_second"] == first.facts["pinned_bytes_per_second"]
    assert second.facts["measured_at"] == first.facts["measured_at"]


def test_no_cache_measures_every_time(monkeypatch):
    calls = counting_measurement(monkeypatch)
    monkeypatch.setenv("ENVDOCTOR_NO_CACHE", "1")
    fake = FakeNvml(devices=[FakeDevice(uuid="GPU-idle")])
    for _ in range(2):
        assert run_one(Plan(CHECK, CONFIG, 90), gpu_session(fake)).facts["measurement_cached"] is False
    assert len(calls) == 2


def test_a_reboot_a_new_driver_or_another_size_measures_again(monkeypatch, tmp_path):
    calls = counting_measurement(monkeypatch)
    one, two = booted(tmp_path, "boot-one"), booted(tmp_path, "boot-two")
    run_one(Plan(CHECK, CONFIG, 90), gpu_session(FakeNvml(devices=[FakeDevice(uuid="GPU-a")]), roots=one))
    run_one(Plan(CHECK, CONFIG, 90), gpu_session(FakeNvml(devices=[FakeDevice(uuid="GPU-a")]), roots=one))
    assert len(calls) == 1
    run_one(Plan(CHECK, CONFIG, 90), gpu_session(FakeNvml(devices=[FakeDevice(uuid="GPU-a")]), roots=two))
    assert len(calls) == 2
    run_one(Plan(CHECK, CONFIG, 90), gpu_session(FakeNvml(devices=[FakeDevice(uuid="GPU-a")], driver="999.1"),
                                                 roots=two))
    assert len(calls) == 3
    run_one(Plan(CHECK, dict(CONFIG, measure_bytes=64 * 1024**2), 90),
            gpu_session(FakeNvml(devices=[FakeDevice(uuid="GPU-a")], driver="999.1"), roots=two))
    assert len(calls) == 4


@pytest.mark.parametrize("size", [0, 1024, 2 * 1024**3, 99999999999999])
def test_a_measurement_size_out_of_bounds_is_not_made_and_says_the_bounds(monkeypatch, size):
    calls = counting_measurement(monkeypatch)
    r = run_one(Plan(CHECK, dict(CONFIG, measure_bytes=size), 90), gpu_session(FakeNvml(devices=[FakeDevice()])))
    assert calls == [] and r.status is Status.SKIP
    assert f"measure_bytes = {size} is outside 1 MiB to 1 GiB" in r.summary


def test_a_failed_measurement_is_not_kept(monkeypatch):
    calls = counting_measurement(monkeypatch, dict(MEASURED, errors={"measure": "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2)"}))
    fake = FakeNvml(devices=[FakeDevice(uuid="GPU-idle")])
    for _ in range(2):
        assert run_one(Plan(CHECK, CONFIG, 90), gpu_session(fake)).status is Status.ERROR
    assert len(calls) == 2


def test_busy_gpus_show_the_figure_measured_while_one_was_idle(monkeypatch):
    calls = counting_measurement(monkeypatch)
    run_one(Plan(CHECK, CONFIG, 90), gpu_session(FakeNvml(devices=[FakeDevice(uuid="GPU-a")])))
    busy = FakeNvml(devices=[FakeDevice(uuid="GPU-a", processes=[(999, 10**9)])])
    r = run_one(Plan(CHECK, CONFIG, 90), gpu_session(busy))
    assert len(calls) == 1
    assert r.status is Status.OK and r.facts["measurement_cached"] is True and "earlier this boot" in r.summary


def test_measures_on_an_idle_gpu_pinned_by_uuid(monkeypatch):
    calls = []

    def measure(params, *, timeout=None, env=None, raise_hint=""):
        calls.append((params, env, timeout))
        return {k: v for k, v in MEASURED.items() if k not in ("nvml_index", "gpu_name")}

    monkeypatch.setattr(envdoctor.probe, "run_copy_measurement", measure)
    fake = FakeNvml(devices=[FakeDevice(uuid="GPU-busy", processes=[(999, 10**9)]), FakeDevice(uuid="GPU-idle")])
    r = run_one(Plan(CHECK, CONFIG, 90), gpu_session(fake))
    assert r.status is Status.OK, r.summary
    (params, env, timeout), = calls
    assert env == {"CUDA_VISIBLE_DEVICES": "GPU-idle"} and params["device"] == 0
    assert params["size_bytes"] == CONFIG["measure_bytes"] and timeout == CONFIG["measure_timeout_seconds"]
    assert r.facts["measured_gpu"] == 1


def test_busy_gpus_are_not_measured(monkeypatch):
    monkeypatch.setattr(envdoctor.probe, "run_copy_measurement", lambda *a, **k: pytest.fail("must not measure on a busy GPU"))
    fake = FakeNvml(devices=[FakeDevice(processes=[(999, 10**9)])])
    r = run_one(Plan(CHECK, CONFIG, 90), gpu_session(fake))
    assert r.status is Status.SKIP and "so as not to take from them" in r.summary


def test_measure_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(envdoctor.probe, "run_copy_measurement", lambda *a, **k: pytest.fail("measure = false"))
    r = run_one(Plan(CHECK, dict(CONFIG, measure=False), 90), gpu_session(FakeNvml(devices=[FakeDevice()])))
    assert r.status is Status.SKIP and "measure = false" in r.summary


def test_gpu_without_torch_skips_naming_the_interpreter():
    r = run_one(Plan(CHECK, CONFIG, 90), gpu_session(FakeNvml(devices=[FakeDevice()]), Unavailable("no torch in /x/python")))
    assert r.status is Status.SKIP and "no torch in /x/python" in r.summary


def test_cpu_torch_on_gpu_node_is_not_measured():
    cpu_torch = dict(CUDA_TORCH, torch_version="2.4.0+cpu", torch_cuda_version=None, cuda_available=False)
    r = run_one(Plan(CHECK, CONFIG, 90), gpu_session(FakeNvml(devices=[FakeDevice()]), cpu_torch))
    assert r.status is Status.SKIP and "cannot use CUDA" in r.summary


def test_hung_measurement_is_an_error(monkeypatch):
    def hung(*a, **k):
        raise ProbeError("the pin_memory copy measurement did not finish within 25 s (killed)")

    monkeypatch.setattr(envdoctor.probe, "run_copy_measurement", hung)
    r = run_one(Plan(CHECK, CONFIG, 90), gpu_session(FakeNvml(devices=[FakeDevice()])))
    assert r.status is Status.ERROR and "did not finish within 25 s" in r.summary


def _driver_library_loads() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_driver_library_loads(), reason="this machine has the NVIDIA driver's libcuda.so.1")
def test_without_the_driver_library_the_real_measurement_skips_with_the_loaders_reason():
    """The real copy probe, run where there is no libcuda.so.1 (a container given only
    the `utility` capability sees GPUs through NVML but has no CUDA library)."""
    with pytest.raises(Unavailable, match=r"cannot load libcuda\.so\.1.*No such file"):
        envdoctor.probe.run_copy_measurement({"size_bytes": 1024, "repeats": 1, "device": 0}, timeout=30)
    r = run_one(Plan(CHECK, CONFIG, 90), gpu_session(FakeNvml(devices=[FakeDevice(uuid="GPU-idle")])))
    assert r.status is Status.SKIP, r.summary
    assert "cannot measure: cannot load libcuda.so.1" in r.summary


def test_the_copy_probe_imports_nothing_but_the_standard_library():
    """It runs as `python -I -S`: torch (seconds) or envdoctor (a package that may
    not be importable there) must never be pulled in."""
    source = (envdoctor.probe._COPY_SCRIPT).read_text()
    tiny = '{"size_bytes": 1024, "repeats": 1}'  # where a driver is, the measurement is a short one
    proc = subprocess.run([sys.executable, "-I", "-S", "-X", "importtime", "-c", source, tiny],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "ctypes" in imported
    assert not {m for m in imported if m.split(".")[0] in ("torch", "envdoctor", "numpy")}, imported
    assert proc.stdout.startswith(envdoctor.probe.MARKER)


# -- the --pid path on real processes ------------------------------------------------------


def start(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL)


@pytest.mark.real
def test_busy_process_pinned_to_one_cpu_warns_and_idle_one_does_not():
    cpu = sorted(os.sched_getaffinity(0))[0]
    ready = "import os, sys, time; os.sched_setaffinity(0, {%d}); print(flush=True)" % cpu
    busy = subprocess.Popen([sys.executable, "-c", ready + "\nwhile True: pass"], stdout=subprocess.PIPE)
    idle = subprocess.Popen([sys.executable, "-c", ready + "\ntime.sleep(60)"], stdout=subprocess.PIPE)
    try:
        busy.stdout.readline(), idle.stdout.readline()  # both have set their affinity
        time.sleep(0.1)
        # Under a loaded CI runner the busy loop may not get its whole CPU: the
        # threshold is set where busy and idle are still far apart.
        config = dict(CONFIG, window_seconds=1.0, saturation_ratio=0.25)
        no_gpu = lambda: (_ for _ in ()).throw(Unavailable("no NVIDIA driver here"))  # noqa: E731
        r_busy = run_one(Plan(CHECK, config, 90), Session(target=Target(busy.pid), nvml_factory=no_gpu))
        r_idle = run_one(Plan(CHECK, config, 90), Session(target=Target(idle.pid), nvml_factory=no_gpu))
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()
    assert r_busy.status is Status.WARN, r_busy.summary
    assert r_busy.facts["cpu_effective"] <= 1.0 and r_busy.facts["cpu_used"] >= 0.25
    assert f"pid {busy.pid} used" in r_busy.summary and "effective CPU" in r_busy.summary
    assert r_idle.status is Status.SKIP, r_idle.summary
    assert r_idle.facts["cpu_used"] < 0.1
    assert "no effect without a GPU" in r_idle.summary


@pytest.mark.real
def test_process_that_exits_is_a_reason_not_a_crash():
    gone = start("pass")
    gone.wait()
    no_gpu = lambda: (_ for _ in ()).throw(Unavailable("no NVIDIA driver here"))  # noqa: E731
    r = run_one(Plan(CHECK, dict(CONFIG, window_seconds=0.05), 90), Session(target=Target(gone.pid), nvml_factory=no_gpu))
    assert r.status is Status.SKIP
    assert "cannot sample" in r.summary and f"/proc/{gone.pid}/stat" in r.summary


def test_the_copy_probe_dies_with_envdoctor_even_by_sigkill(tmp_path):
    """After SIGKILL no envdoctor code runs to kill the probe's group; a driver call hung
    in it would hold a CUDA context on the job's GPU. The probe asks the kernel to kill it
    when its parent dies (PR_SET_PDEATHSIG): shown here with the probe's own function, in
    a child that then waits for ever, under a parent killed with SIGKILL."""
    source = envdoctor.probe._COPY_SCRIPT.read_text()
    pidfile = tmp_path / "child.pid"
    child_code = (f"import os, time\nsrc = {source!r}\nns = {{'__name__': 'copy_probe'}}\nexec(src, ns)\n"
                  f"ns['die_with_parent'](os.getppid())\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
                  "time.sleep(120)\n")
    parent_code = (f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-I', '-S', '-c', {child_code!r}], "
                   "start_new_session=True)\ntime.sleep(120)\n")
    dies_with_its_parent(parent_code, pidfile, "the copy probe")


BAD_FIGURES = [
    ("pinned_bytes_per_second", "abc"), ("pinned_bytes_per_second", float("nan")),
    ("pageable_bytes_per_second", -5.0), ("pinned_bytes_per_second", float("inf")),
    ("pinned_bytes_per_second", [1]), ("pin_cpu_seconds_per_gib", "x"), ("pin_cpu_seconds_per_gib", None),
    ("size_bytes", "big"), ("size_bytes", -5), ("measured_at", 1e300), ("measured_at", float("nan")),
    ("measured_at", True), ("errors", "x"), ("errors", {"measure": "planted"}),
    ("pinned_bytes_per_second", 1e308), ("pinned_bytes_per_second", 5e-324), ("pageable_bytes_per_second", 999.0),
    ("pin_cpu_seconds_per_gib", -0.0), ("pin_cpu_seconds_per_gib", 1e9), ("measured_at", 0),
    ("measured_at", 1.0e9),
]


@pytest.mark.parametrize("field, value", BAD_FIGURES)
def test_a_probe_answer_that_makes_no_sense_is_an_error_row_and_is_not_kept(monkeypatch, field, value):
    """A driver printing a string, NaN or a negative number for a figure: one error row
    naming it (never a crash of the check, never an 'ok' with nan GB/s), and nothing cached."""
    calls = counting_measurement(monkeypatch, dict(MEASURED, **{field: value}))
    fake = FakeNvml(devices=[FakeDevice(uuid="GPU-idle")])
    for _ in range(2):
        r = run_one(Plan(CHECK, CONFIG, 90), gpu_session(fake))
        if field == "measured_at":  # the probe never sends it (the check stamps its own): ignored
            assert r.status is Status.OK, r.summary
        else:
            assert r.status is Status.ERROR, r.summary
            assert "the check broke" not in r.summary and field in r.summary or "planted" in r.summary, r.summary
    assert len(calls) == 2 if field != "measured_at" else len(calls) == 1


@pytest.mark.parametrize("field, value", BAD_FIGURES)
def test_a_damaged_cache_entry_is_a_miss_and_is_measured_again(monkeypatch, field, value):
    import json

    from envdoctor import diskcache

    calls = counting_measurement(monkeypatch)
    fake = FakeNvml(devices=[FakeDevice(uuid="GPU-a")])
    run_one(Plan(CHECK, CONFIG, 90), gpu_session(fake))
    (entry,) = (diskcache.cache_dir()).glob("pin-memory-*.json")
    data = json.loads(entry.read_text())
    data["facts"][field] = value
    entry.write_text(json.dumps(data))
    for busy in (False, True):
        devices = [FakeDevice(uuid="GPU-a", processes=[(999, 10**9)] if busy else [])]
        r = run_one(Plan(CHECK, CONFIG, 90), gpu_session(FakeNvml(devices=devices)))
        if busy:  # measured again while idle just above: that entry answers now
            assert r.status is Status.OK and r.facts["measurement_cached"] is True, r.summary
        else:
            assert r.status is Status.OK and r.facts["measurement_cached"] is False, r.summary
    assert len(calls) == 2


def test_a_zero_measurement_timeout_is_not_tried_and_says_so(monkeypatch):
    """0 passes the config (a plug-in's `*_timeout_seconds = 0` may mean "off"); here it
    could only ever time out, so the check says why it did not measure."""
    calls = counting_measurement(monkeypatch)
    r = run_one(Plan(CHECK, dict(CONFIG, measure_timeout_seconds=0.0), 90), gpu_session(FakeNvml(devices=[FakeDevice()])))
    assert calls == [] and r.status is Status.SKIP and "measure_timeout_seconds = 0" in r.summary


def test_a_live_pin_memory_without_a_gpu_is_no_finding_torch_ignores_it():
    """Helper-42: 'pin_memory=True only costs CPU and locked RAM' was false: without CUDA
    torch's DataLoader iterator does not pin (its _pin_memory is False; torch warns)."""
    r = judge(PinFacts(None, 0, "no NVIDIA driver here", None, None, live_pin_memory=True), CONFIG)
    assert r.status is Status.SKIP, r.summary
    assert "ask for pin_memory=True (live), which torch ignores without a GPU" in r.summary
    assert "locked RAM" not in r.summary and r.facts["live_pin_memory"] is True
