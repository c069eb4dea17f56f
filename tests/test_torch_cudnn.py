"""torch.cudnn: the CUBLAS_WORKSPACE_CONFIG parser, the judge on plain facts, and runs
through the runner with torch facts given directly (as the probe or preflight would)."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import envdoctor.nvml
from envdoctor.checks.torch_cudnn import CHECK, CudnnFacts, judge, parse_cublas_workspace_config
from envdoctor.context import Session
from envdoctor.errors import ParseError, Unavailable
from envdoctor.model import Status
from envdoctor.runner import Plan, run_one
from fake_pynvml import FakeDevice, FakeNvml

CUDA = {"torch_version": "2.4.0+cu121", "torch_cuda_version": "12.1", "cuda_available": True,
        "cudnn_enabled": True, "cudnn_benchmark": False, "cudnn_deterministic": False,
        "deterministic_algorithms": False, "deterministic_warn_only": False}
CPU = dict(CUDA, torch_version="2.4.0+cpu", torch_cuda_version=None, cuda_available=False)


def facts(cfg=None, **torch):
    t = dict(CUDA)
    t.update(torch)
    return CudnnFacts(t, cfg)


# -- the parser ------------------------------------------------------------------------------


def test_parse_workspace_config():
    assert parse_cublas_workspace_config(":4096:8") == ((4096, 8),)
    assert parse_cublas_workspace_config(" :16:8 ") == ((16, 8),)
    assert parse_cublas_workspace_config(":4096:2:16:8") == ((4096, 2), (16, 8))
    for bad in ("", "4096:8", ":4096", ":4096:8:16", ":a:8", ":0:8", ":-1:8", ":4096:8:", "::", None, 4096):
        with pytest.raises(ParseError):
            parse_cublas_workspace_config(bad)


@given(st.one_of(st.text(max_size=40), st.text(alphabet=":0123456789 ", max_size=30), st.none(), st.integers()))
def test_parser_returns_pairs_or_parse_error(value):
    try:
        pairs = parse_cublas_workspace_config(value)
    except ParseError:
        return
    assert pairs and all(size > 0 and count > 0 for size, count in pairs)


# -- judging ---------------------------------------------------------------------------------


def test_defaults_are_ok_and_state_the_trade_off():
    r = judge(facts(), {})
    assert r.status is Status.OK
    assert "benchmark=False" in r.summary and "shapes vary" in r.summary
    assert "interpreter defaults" in r.summary and "preflight()" in r.summary


def test_benchmark_on_states_its_trade_off():
    r = judge(facts(cudnn_benchmark=True), {})
    assert r.status is Status.OK and "fixed" in r.summary and "memory-hungry" in r.summary


def test_benchmark_and_deterministic_together_warn():
    r = judge(facts(cudnn_benchmark=True, cudnn_deterministic=True), {})
    assert r.status is Status.WARN
    assert "benchmark=True with cudnn.deterministic=True" in r.summary
    assert r.remediation == "torch.backends.cudnn.benchmark = False"


@pytest.mark.parametrize("cfg", [None, ":4096:2", ":4096:8:16:8", "garbage"])
def test_deterministic_algorithms_without_the_workspace_config_fail(cfg):
    r = judge(facts(cfg, deterministic_algorithms=True), {})
    assert r.status is Status.FAIL
    assert "Deterministic behavior was enabled" in r.summary
    assert r.remediation == "export CUBLAS_WORKSPACE_CONFIG=:4096:8"


@pytest.mark.parametrize("cfg", [":4096:8", ":16:8"])
def test_deterministic_algorithms_with_either_accepted_config_pass(cfg):
    r = judge(facts(cfg, deterministic_algorithms=True), {})
    assert r.status is Status.OK and r.facts["cublas_deterministic"] is True


def test_warn_only_mode_warns_instead_of_failing():
    r = judge(facts(None, deterministic_algorithms=True, deterministic_warn_only=True), {})
    assert r.status is Status.WARN and "warn_only" in r.summary


def test_malformed_workspace_config_warns():
    r = judge(facts("4096:8"), {})
    assert r.status is Status.WARN and "must start with ':'" in r.summary
    assert r.facts["CUBLAS_WORKSPACE_CONFIG"] == "4096:8"


def test_cudnn_disabled_warns():
    r = judge(facts(cudnn_enabled=False), {})
    assert r.status is Status.WARN and "enabled is False" in r.summary


def test_cpu_torch_skips_but_keeps_the_settings():
    r = judge(CudnnFacts(dict(CPU, deterministic_algorithms=True), None), {})
    assert r.status is Status.SKIP and "CPU-only" in r.summary
    assert r.facts["deterministic_algorithms"] is True and r.facts["applies"] is False


def test_cuda_build_without_gpu_skips_but_with_nvml_gpus_applies():
    no_gpu = dict(CUDA, cuda_available=False)
    assert judge(CudnnFacts(no_gpu, None), {}).status is Status.SKIP
    r = judge(CudnnFacts(dict(no_gpu, deterministic_algorithms=True), None, nvml_gpus=2), {})
    assert r.status is Status.FAIL


def test_malformed_config_warns_a_cuda_torch_even_without_a_gpu_and_is_said_for_a_cpu_only_one():
    r = judge(CudnnFacts(dict(CUDA, cuda_available=False), ":4096"), {})  # a CUDA build, no GPU visible here
    assert r.status is Status.WARN and "no GPU visible" in r.summary
    r = judge(CudnnFacts(CPU, ":4096"), {})  # no cuBLAS at all (helper-42: warned, "settings have no effect")
    assert r.status is Status.SKIP and "CPU-only" in r.summary and ":4096" in r.summary


def test_live_settings_are_labelled():
    r = judge(facts(live=True), {})
    assert "(live settings)" in r.summary and r.facts["live_settings"] is True


# -- runs ----------------------------------------------------------------------------------


def test_through_the_runner_reads_env_and_nvml():
    fake = FakeNvml(devices=[FakeDevice()], driver="550.54.15", cuda=12040)
    t = dict(CUDA, cuda_available=False, deterministic_algorithms=True)
    s = Session(env_override={"CUBLAS_WORKSPACE_CONFIG": ":16:8"}, torch_factory=lambda _s: t,
                nvml_factory=lambda: envdoctor.nvml.connect(lib=fake, timeout=2.0))
    r = run_one(Plan(CHECK, {}, 90), s)
    assert r.status is Status.OK and r.facts["applies"] is True, r.summary
    s = Session(env_override={}, torch_factory=lambda _s: t, nvml_factory=lambda: envdoctor.nvml.connect(lib=fake, timeout=2.0))
    assert run_one(Plan(CHECK, {}, 90), s).status is Status.FAIL


def test_no_torch_skips():
    def no_torch(_s):
        raise Unavailable("no torch in /usr/bin/python3")

    r = run_one(Plan(CHECK, {}, 90), Session(env_override={}, torch_factory=no_torch))
    assert r.status is Status.SKIP and "no torch in /usr/bin/python3" in r.summary


@pytest.mark.real
def test_real_run_on_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from envdoctor.probe import run_probe

    # the probe (a fresh interpreter) reports torch's defaults
    probed = Session(python=sys.executable, env_override={}, torch_factory=lambda s: run_probe(s.python))
    r = run_one(Plan(CHECK, {}, 90), probed)
    assert r.facts["cudnn_enabled"] is True and r.facts["cudnn_benchmark"] is False
    if r.facts["torch_cuda_version"] is None:
        assert r.status is Status.SKIP
    # the default, files only: the same torch, the live flags unknown (None), never guessed
    r = run_one(Plan(CHECK, {}, 90), Session(python=sys.executable, env_override={}))
    assert r.facts["torch_version"] == probed.need("torch")["torch_version"]
    assert r.facts["cudnn_enabled"] is None and r.facts["cudnn_benchmark"] is None
    if r.facts["torch_cuda_version"] is None:
        assert r.status is Status.SKIP
