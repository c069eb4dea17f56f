"""Structured fixes: where an environment change fixes a finding, the result carries it
as data (`Result.fix_env`, JSON `fix_env`; a string sets, None/null unsets), beside the
human fix, through the runner; and every distinct fix of a check is kept, not the first.
Also the declared modes: serve and exec never select an intrusive check."""

from __future__ import annotations

import json
from pathlib import Path

import envdoctor.nvml
from envdoctor import pipeline
from envdoctor.checks import cpu_threads, cuda_runtime, cuda_visible_devices, dist_env, torch_cudnn
from envdoctor.checks.cpu_threads import THREAD_VARS
from envdoctor.config import Config
from envdoctor.context import Roots, Session, Target
from envdoctor.model import Status
from envdoctor.registry import load
from envdoctor.runner import Plan, run_one
from fake_pynvml import FakeDevice, FakeNvml

FIXTURES = Path(__file__).parent / "fixtures"
CU121 = {"python": "/opt/venv/bin/python", "torch_version": "2.4.0+cu121", "torch_cuda_version": "12.1",
         "torch_hip_version": None, "arch_list": ["sm_80", "sm_86", "sm_90"], "cuda_available": True,
         "device_count": 1, "cudnn_available": True, "cudnn_version": 90100, "errors": {}, "warnings": [],
         "cudnn_enabled": True, "cudnn_benchmark": False, "cudnn_deterministic": False,
         "deterministic_algorithms": False, "deterministic_warn_only": False}


def run(check, env, *, torch=None, devices=None, roots=Roots()):
    fake = FakeNvml(devices=devices if devices is not None else [FakeDevice()])
    session = Session(env_override=env, roots=roots, torch_factory=lambda _s: dict(torch or CU121),
                      nvml_factory=lambda: envdoctor.nvml.connect(lib=fake, timeout=2.0))
    return run_one(Plan(check, dict(check.defaults), 30), session)


def test_cpu_threads_fix_sets_the_five_variables_to_the_share():
    base = FIXTURES / "cgroup_v1_quota"  # a 2-CPU quota
    roots = Roots(procfs=base / "procfs", sysfs=base / "sys", rootfs=base)
    r = run(cpu_threads.CHECK, {"OMP_NUM_THREADS": "16"}, roots=roots)
    assert r.status is Status.WARN, r.summary
    assert r.fix_env == dict.fromkeys(THREAD_VARS, "2")
    assert r.remediation == "export " + " ".join(f"{v}=2" for v in THREAD_VARS)
    assert json.loads(json.dumps(r.to_dict()))["fix_env"]["OMP_NUM_THREADS"] == "2"
    assert run(cpu_threads.CHECK, dict.fromkeys(THREAD_VARS, "2"), roots=roots).fix_env == {}


def test_visible_devices_fix_drops_the_bad_entry():
    r = run(cuda_visible_devices.CHECK, {"CUDA_VISIBLE_DEVICES": "0,1,,2"}, devices=[FakeDevice() for _ in range(4)])
    assert r.status is Status.FAIL, r.summary
    assert r.fix_env == {"CUDA_VISIBLE_DEVICES": "0,1,2"}
    r = run(cuda_visible_devices.CHECK, {"CUDA_VISIBLE_DEVICES": '"0,1"'}, devices=[FakeDevice() for _ in range(2)])
    assert r.fix_env == {"CUDA_VISIBLE_DEVICES": "0,1"}, r.summary


def test_visible_devices_fix_orders_mixed_gpus_by_pci_bus():
    mixed = [FakeDevice(), FakeDevice(name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0))]
    r = run(cuda_visible_devices.CHECK, {"CUDA_VISIBLE_DEVICES": "1"}, devices=mixed)
    assert r.status is Status.WARN and r.fix_env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, r.summary
    ordered = run(cuda_visible_devices.CHECK, {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, devices=mixed)
    assert ordered.status is Status.OK and ordered.fix_env == {}


def test_cudnn_fix_sets_the_workspace_config_and_keeps_every_fix():
    t = dict(CU121, deterministic_algorithms=True, cudnn_benchmark=True, cudnn_deterministic=True)
    r = run(torch_cudnn.CHECK, {}, torch=t)
    assert r.status is Status.FAIL, r.summary
    assert r.fix_env == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    # two findings, two fixes (the older code kept only the loudest one's)
    assert "export CUBLAS_WORKSPACE_CONFIG=:4096:8" in r.remediation
    assert "torch.backends.cudnn.benchmark = False" in r.remediation


def test_runtime_fix_unsets_launch_blocking():
    r = run(cuda_runtime.CHECK, {"CUDA_LAUNCH_BLOCKING": "1"})
    assert r.status is Status.WARN, r.summary
    assert r.fix_env == {"CUDA_LAUNCH_BLOCKING": None}
    assert json.loads(json.dumps(r.to_dict()))["fix_env"] == {"CUDA_LAUNCH_BLOCKING": None}  # null: unset


def test_dist_env_fixes_the_switches_left_on():
    env = {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "INFO"}
    r = run(dist_env.CHECK, env)
    assert r.status is Status.WARN, r.summary
    assert r.fix_env == {"NCCL_P2P_DISABLE": None, "NCCL_IB_DISABLE": None, "NCCL_DEBUG": "WARN"}
    assert r.remediation.count(";") == 2  # three fixes, each kept
    # a missing partner has no unambiguous variable fix: text only
    r = run(dist_env.CHECK, {"WORLD_SIZE": "2"})
    assert r.status is Status.FAIL and r.fix_env == {}


def test_serve_selects_no_intrusive_check_and_exec_only_one_released_before_the_job():
    registry = load(autoload_plugins=False)
    intrusive = {c.id for c in registry.checks.values() if c.intrusive}
    assert intrusive == {"torch.pin_memory", "onnx.opset", "dist.master_port", "dist.consistency"}
    for check in registry.checks.values():
        assert check.modes, check.id
    session = Session(target=Target(), env_override={})
    allowed = {"serve": set(), "exec": {"dist.consistency"}}  # its exchange store closes before the job starts
    for mode in ("serve", "exec"):
        plans = [p for p in pipeline.plan(registry, Config(), pipeline.Selection()) if p.check.runs_in(mode)]
        chosen = {p.check.id for p in plans}
        assert chosen and chosen & intrusive == allowed[mode], (mode, chosen)
        assert "preflight.live" not in chosen
    rows = pipeline.run_checks(registry, Config(), session, pipeline.Selection(only=["dist.master_port"]), mode="serve")
    assert [r.status for r in rows] == [Status.SKIP] and "intrusive" in rows[0].summary


def test_a_hand_made_plan_gets_the_declared_defaults():
    """Checks read settings["key"] without restating defaults: the engine supplies every declared key."""
    from envdoctor.checks import shm_size

    base = FIXTURES / "shm_docker_64m"
    session = Session(roots=Roots(procfs=base / "procfs", sysfs=base / "sys", rootfs=base), env_override={})
    r = run_one(Plan(shm_size.CHECK, {"recommended_bytes": 32 * 1024**2}, 10), session)
    assert r.status is not Status.ERROR, r.summary  # no KeyError for the keys the plan left out
    assert r.facts["min_bytes"] == 256 * 1024**2 and r.facts["recommended_bytes"] == 32 * 1024**2


def test_a_fix_that_unsets_a_variable_unsets_it_never_sets_the_string_none():
    """cuda.runtime's fix for CUDA_LAUNCH_BLOCKING=1 is env={"CUDA_LAUNCH_BLOCKING": None}:
    exec --fix used to hand the job CUDA_LAUNCH_BLOCKING='None'."""
    from envdoctor import envfix

    result = {"check": "cuda.runtime", "status": "warn", "fix_env": {"CUDA_LAUNCH_BLOCKING": None}}
    fix = envfix.plan([result], {"CUDA_LAUNCH_BLOCKING": "1", "PATH": "/bin"})
    assert [(c.name, c.old, c.new) for c in fix.changes] == [("CUDA_LAUNCH_BLOCKING", "1", None)]
    assert fix.changes[0].describe().startswith("CUDA_LAUNCH_BLOCKING 1 -> unset (")
    assert envfix.apply({"CUDA_LAUNCH_BLOCKING": "1", "PATH": "/bin"}, fix.changes) == {"PATH": "/bin"}
    assert envfix.plan([result], {"PATH": "/bin"}).changes == []  # already unset: nothing to do
