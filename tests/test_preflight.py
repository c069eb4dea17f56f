"""envdoctor.preflight(): live torch facts without initialising CUDA, the in-process row,
printing, strict mode; for real in a subprocess with this venv's torch, and in-process
with a fake torch that fails loudly if anything would initialise CUDA."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

import envdoctor.nvml
import envdoctor.registry
from envdoctor.check import Check
from envdoctor.context import Session
from envdoctor.errors import Unavailable, UsageError
from envdoctor.model import Status, fail, ok
from envdoctor.inprocess import LIVE_CHECK_ID, PreflightError, judge_live, live_torch_facts, preflight
from envdoctor.registry import Registry
from fake_pynvml import FakeDevice, FakeNvml

GIB = 1024**3


def run_script(code: str, env: dict | None = None, tmp_path=None) -> subprocess.CompletedProcess:
    import os

    full = dict(os.environ)
    full.pop("ENVDOCTOR_CONFIG", None)
    if tmp_path is not None:
        full["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full, timeout=120, cwd=tmp_path)


# -- for real, in a fresh interpreter with this venv's torch --------------------------------------


@pytest.mark.real
def test_preflight_reads_live_settings_and_never_initialises_cuda(tmp_path):
    proc = run_script("""
        import json, sys
        import envdoctor.probe
        def no_probe(*a, **k):
            raise AssertionError("preflight must read the live torch, not start a probe")
        envdoctor.probe._execute = no_probe
        import torch
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.deterministic = True
        torch.set_num_threads(1)
        import envdoctor
        import envdoctor
        results = envdoctor.preflight()
        print(json.dumps({"initialized": torch.cuda.is_initialized(),
                          "results": {r.check: r.to_dict() for r in results}}))
    """, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["initialized"] is False
    results = out["results"]
    cudnn = results["torch.cudnn"]["facts"]
    assert cudnn["cudnn_benchmark"] is True and cudnn["cudnn_deterministic"] is True and cudnn["live_settings"] is True
    live = results[LIVE_CHECK_ID]
    assert live["status"] == "ok" and "CUDA not initialised yet" in live["summary"]
    assert live["facts"]["num_threads"] == 1
    assert "envdoctor preflight:" in proc.stderr  # the compact report goes to stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.real
def test_preflight_imports_torch_when_the_script_has_not(tmp_path):
    proc = run_script("""
        import sys
        import envdoctor
        results = envdoctor.preflight(only=["torch.cudnn"], file=None)
        assert "torch" in sys.modules
        assert sys.modules["torch"].cuda.is_initialized() is False
        print([r.check for r in results], results[0].facts["live_settings"])
    """, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['torch.cudnn'] True"


@pytest.mark.real
def test_import_envdoctor_then_call_preflight_as_documented(tmp_path):
    proc = run_script("""
        import envdoctor
        results = envdoctor.preflight(file=None)
        print(len(results) > 0, envdoctor.PreflightError.__name__)
    """, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True PreflightError"


# -- a fake torch: anything that could initialise CUDA raises ------------------------------------


class _Forbidden:
    def __init__(self, calls, name):
        self.calls, self.name = calls, name

    def __call__(self, *args, **kwargs):
        self.calls.append(self.name)
        raise AssertionError(f"preflight called torch.cuda.{self.name}(), which can initialise CUDA")


def fake_torch(calls: list, *, initialized=False, reserved=0, allocated=0, count=2):
    forbidden = {name: _Forbidden(calls, name) for name in (
        "is_available", "init", "_lazy_init", "current_device", "get_device_capability", "get_device_properties",
        "synchronize", "mem_get_info", "set_device")}
    cuda = SimpleNamespace(
        get_arch_list=lambda: ["sm_80", "sm_90"],
        is_initialized=lambda: initialized,
        **forbidden,
    )
    if initialized:
        cuda.device_count = lambda: count
        cuda.memory_reserved = lambda i: reserved
        cuda.memory_allocated = lambda i: allocated
    else:
        cuda.device_count = _Forbidden(calls, "device_count")  # may fall back to cudaGetDeviceCount
        cuda.memory_reserved = _Forbidden(calls, "memory_reserved")
        cuda.memory_allocated = _Forbidden(calls, "memory_allocated")
    cudnn = SimpleNamespace(enabled=True, benchmark=True, deterministic=False, is_available=lambda: True,
                            version=lambda: 90100)
    return SimpleNamespace(
        __version__="2.4.0+cu121", __file__="/nonexistent/site-packages/torch/__init__.py",
        version=SimpleNamespace(cuda="12.1", hip=None, git_version="0"),
        cuda=cuda, backends=SimpleNamespace(cudnn=cudnn),
        are_deterministic_algorithms_enabled=lambda: True,
        is_deterministic_algorithms_warn_only_enabled=lambda: False,
        get_num_threads=lambda: 4, get_num_interop_threads=lambda: 4,
    )


def nvml_session(devices=2, env=None):
    fake = FakeNvml(devices=[FakeDevice() for _ in range(devices)])
    return Session(env_override=env or {}, nvml_factory=lambda: envdoctor.nvml.connect(lib=fake, timeout=2.0))


def test_live_facts_before_cuda_init_touch_nothing_that_initialises():
    calls: list = []
    facts = live_torch_facts(nvml_session(2), torch=fake_torch(calls))
    assert calls == []
    assert facts["cuda_initialized"] is False
    assert facts["cuda_available"] is True and facts["device_count"] == 2
    assert facts["cuda_available_source"].startswith("NVML")
    assert facts["cudnn_benchmark"] is True and facts["deterministic_algorithms"] is True
    assert facts["cudnn_version"] == 90100 and facts["live"] is True
    assert "cuda_memory" not in facts


def test_live_facts_without_nvml_say_cuda_unavailable():
    calls: list = []

    def no_nvml():
        raise Unavailable("no NVIDIA driver here")

    facts = live_torch_facts(Session(env_override={}, nvml_factory=no_nvml), torch=fake_torch(calls))
    assert calls == [] and facts["cuda_available"] is False and facts["nvml_device_count"] is None


def test_live_facts_after_the_script_initialised_cuda_read_memory():
    calls: list = []
    facts = live_torch_facts(nvml_session(2), torch=fake_torch(calls, initialized=True, reserved=6 * GIB, allocated=GIB))
    assert calls == []
    assert facts["cuda_initialized"] is True and facts["device_count"] == 2
    assert facts["cuda_memory"]["1"] == {"reserved_bytes": 6 * GIB, "allocated_bytes": GIB}


# -- the preflight.live row ------------------------------------------------------------------


def test_live_row_flags_fragmentation():
    facts = {"cuda_initialized": True, "device_count": 1, "num_threads": 4,
             "cuda_memory": {"0": {"reserved_bytes": 6 * GIB, "allocated_bytes": GIB}}}
    r = judge_live(facts, {})
    assert r.status is Status.WARN and "6 GiB" in r.summary and "1 GiB" in r.summary
    assert "expandable_segments:True" in r.remediation
    facts["cuda_memory"]["0"]["allocated_bytes"] = 5 * GIB
    assert judge_live(facts, {}).status is Status.OK


def test_live_row_flags_cuda_visible_devices_set_too_late():
    facts = {"cuda_initialized": True, "device_count": 4, "nvml_device_count": 4, "num_threads": 4, "cuda_memory": {}}
    r = judge_live(facts, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert r.status is Status.WARN and "set after CUDA started" in r.summary
    assert judge_live(facts, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}).status is Status.OK
    before = dict(facts, cuda_initialized=False)
    r = judge_live(before, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert r.status is Status.OK and "may still be changed" in r.summary


# -- running, printing, strict ------------------------------------------------------------------


def _fixed(status):
    return Check(id=f"test.{status}", title=status, run=lambda ctx: (fail("it broke", "do X") if status == "fail" else ok("fine")))


@pytest.fixture
def fake_world(monkeypatch):
    """A registry of torch.cudnn and preflight.live plus two fixed checks, and a fake torch in sys.modules."""
    from envdoctor.checks.preflight_live import CHECK as LIVE
    from envdoctor.checks.torch_cudnn import CHECK as CUDNN

    calls: list = []
    monkeypatch.setitem(sys.modules, "torch", fake_torch(calls))
    checks = {c.id: c for c in (CUDNN, LIVE, _fixed("fail"), _fixed("ok"))}
    monkeypatch.setattr(envdoctor.registry, "load", lambda autoload_plugins=None: Registry(checks, [], {}))
    monkeypatch.delenv("ENVDOCTOR_CONFIG", raising=False)
    return calls


def test_prints_one_line_per_problem_and_returns_every_result(fake_world, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    results = preflight(file=out)
    assert {r.check for r in results} == {"torch.cudnn", "test.fail", "test.ok", LIVE_CHECK_ID}
    text = out.getvalue()
    assert text.splitlines()[0].startswith("envdoctor preflight: 4 checks: 1 fail")
    assert "  FAIL  test.fail: it broke" in text and "fix: do X" in text
    assert "test.ok" not in text
    assert fake_world == []  # nothing that initialises CUDA was called


def test_strict_raises_with_the_results(fake_world, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PreflightError) as info:
        preflight(strict=True, file=None)
    assert "test.fail: it broke" in str(info.value)
    assert {r.check for r in info.value.results} >= {"test.fail", "test.ok"}
    assert preflight(strict=True, skip=["test.fail"], file=None)  # nothing failing: returns


def test_only_and_skip(fake_world, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert [r.check for r in preflight(only=["test.ok"], file=None)] == ["test.ok"]
    assert [r.check for r in preflight(only=[LIVE_CHECK_ID], file=None)] == [LIVE_CHECK_ID]
    assert LIVE_CHECK_ID not in {r.check for r in preflight(skip=[LIVE_CHECK_ID], file=None)}
    with pytest.raises(UsageError):
        preflight(only=["no.such_check"], file=None)
    # one id as a string is that id, not its letters ("unknown check id 't'")
    assert [r.check for r in preflight(only="test.ok", file=None)] == ["test.ok"]
    assert LIVE_CHECK_ID not in {r.check for r in preflight(skip=LIVE_CHECK_ID, file=None)}


def test_a_broken_config_file_does_not_stop_the_script(fake_world, tmp_path, monkeypatch):
    (tmp_path / "envdoctor.toml").write_text("[check.\"test.ok\"]\nno_such_key = 1\n")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    results = preflight(file=out)
    assert results and "config ignored" in out.getvalue()


def test_live_thread_count_set_by_the_script_is_judged_against_the_cpus():
    """torch.set_num_threads(64) shows in no environment variable: only the live look sees it."""
    facts = {"cuda_initialized": False, "num_threads": 64}
    r = judge_live(facts, {}, effective_cpus=2.0)
    assert r.status is Status.WARN and "64 intra-op threads" in r.summary and "expected <= 2" in r.summary
    assert r.remediation.startswith("torch.set_num_threads(2)")
    r = judge_live(facts, {"LOCAL_WORLD_SIZE": "8"}, effective_cpus=32.0)
    assert r.status is Status.WARN and "expected <= 4" in r.summary
    assert judge_live({"cuda_initialized": False, "num_threads": 2}, {}, effective_cpus=2.0).status is Status.OK
    assert judge_live(facts, {}, effective_cpus=None).status is Status.OK  # unknown CPUs: no verdict


@pytest.mark.real
def test_preflight_warns_on_a_live_set_num_threads(tmp_path):
    proc = run_script("""
        import os, torch, envdoctor
        torch.set_num_threads(4 * len(os.sched_getaffinity(0)))
        live = [r for r in envdoctor.preflight(file=None) if r.check == "preflight.live"][0]
        print(live.status.value, live.remediation.split("  #")[0])
    """, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    status, fix = proc.stdout.split(maxsplit=1)
    assert status == "warn" and fix.strip().startswith("torch.set_num_threads(")
