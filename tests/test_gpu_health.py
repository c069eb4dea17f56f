"""gpu.health over the fake NVML in every state, through the runner, including a
GPU whose NVML call never returns (bounded, marked, the others still judged)."""

from __future__ import annotations

import time

import pynvml
import pytest

from envdoctor import nvml
from envdoctor.checks.gpu_health import CHECK, HealthFacts, judge
from envdoctor.context import Session, Target
from envdoctor.errors import Unavailable
from envdoctor.model import Status
from envdoctor.runner import Plan, run, run_one
from fake_pynvml import GIB, FakeDevice, FakeNvml

DEFAULTS = dict(CHECK.config)


@pytest.fixture
def check():
    """check(devices=[...], config=..., **FakeNvml options) -> Result, through the runner."""
    made = []

    def go(devices=None, config=None, target=None, timeout=1.0, **options):
        fake = FakeNvml(devices=devices if devices is not None else [FakeDevice()], **options)
        made.append(fake)
        session = Session(target=target or Target(), env_override={},
                          nvml_factory=lambda: nvml.connect(lib=fake, timeout=timeout))
        return run_one(Plan(CHECK, {**DEFAULTS, **(config or {})}, 10), session)

    yield go
    for fake in made:
        fake.release()


def test_healthy_node_is_ok_with_typed_facts(check):
    r = check([FakeDevice(), FakeDevice(memory_used=GIB // 2, temperature=41)])
    assert r.status is Status.OK, r.summary
    assert "2 GPUs healthy (2x NVIDIA H100 80GB HBM3)" in r.summary and "hottest 41 C" in r.summary
    assert r.facts["gpu_count"] == 2
    assert r.facts["memory_total_bytes"] == {"0": 80 * GIB, "1": 80 * GIB}
    assert r.facts["memory_used_bytes"] == {"0": 0, "1": GIB // 2}
    assert r.facts["temperature_celsius"] == {"0": 34, "1": 41}
    assert r.facts["power_watts"] == {"0": 70.0, "1": 70.0}
    g = r.facts["gpus"][1]
    assert g["uuid"].startswith("GPU-") and g["compute_capability"] == [9, 0] and g["persistence_mode"] is True


@pytest.mark.parametrize(
    "device, words",
    [
        (FakeDevice(ecc_uncorrected=3), ["3 uncorrectable ECC errors", "expected 0"]),
        (FakeDevice(retired_pages_pending=True), ["page retirement pending", "reset"]),
        (FakeDevice(remapped_rows=(0, 1, 1, 0)), ["row remap pending"]),
        (FakeDevice(remapped_rows=(0, 8, 0, 1)), ["failed to remap", "replacing"]),
        (FakeDevice(lost=True), ["is lost", "fallen off the bus"]),
        (FakeDevice(compute_mode=2), ["Prohibited"]),
    ],
)
def test_faults_fail_and_name_the_gpu(check, device, words):
    r = check([FakeDevice(), device])
    assert r.status is Status.FAIL, r.summary
    assert r.summary.startswith("GPU 1 (PCI 00000000:19:00.0, GPU-" if not device.lost else "GPU 1 ")
    for word in words:
        assert word in r.summary
    assert r.remediation  # a command to paste
    assert "GPU 0" not in r.summary, "the healthy GPU is not blamed"


def test_reset_fix_names_the_gpu(check):
    r = check([FakeDevice(), FakeDevice(ecc_uncorrected=1)])
    assert r.remediation.startswith("nvidia-smi -r -i 1")


def test_memory_held_by_others_warns(check):
    r = check([FakeDevice(memory_used=12 * GIB, processes=[(4242, 12 * GIB)]), FakeDevice()])
    assert r.status is Status.WARN
    assert "GPU 0" in r.summary and "12 GiB of 80 GiB (15%)" in r.summary and "pids 4242" in r.summary
    assert "nvidia-smi --query-compute-apps" in r.remediation
    assert r.facts["memory_used_by_others_bytes"] == {"0": 12 * GIB, "1": 0}


def test_memory_other_mig_slices_hold_is_not_taken_from_the_job(check):
    """Helper-97: under MIG each instance has memory of its own; 60 GiB used on the GPU by
    other slices was a warn that the job would not get it."""
    mig = [FakeDevice(mig=True, mig_uuids=("MIG-a", "MIG-b"), memory_used=60 * GIB, processes=[(4242, None)])]
    assert check(mig).status is Status.OK
    assert check([FakeDevice(memory_used=60 * GIB, processes=[(4242, None)])]).status is Status.WARN


def test_memory_thresholds_are_configurable(check):
    busy = [FakeDevice(memory_used=2 * GIB)]
    assert check(busy).status is Status.OK  # 2.5% is under the default 5%
    r = check(busy, config={"max_used_bytes": GIB})
    assert r.status is Status.WARN and "or 1 GiB" in r.summary
    assert check([FakeDevice(memory_used=40 * GIB)], config={"max_used_fraction": 1.0}).status is Status.OK


def test_the_targets_own_memory_is_not_someone_elses(check):
    devices = [FakeDevice(memory_used=30 * GIB, processes=[(777, 30 * GIB)])]
    assert check(devices, target=Target(pid=777)).status is Status.OK
    assert check(devices, target=Target(pid=778)).status is Status.WARN


@pytest.mark.parametrize("mask, status", [(0x40, Status.WARN), (0x20, Status.WARN), (0x08, Status.WARN),
                                          (0x80, Status.WARN), (0x04, Status.WARN), (0x01, Status.OK), (0x10, Status.OK)])
def test_throttling(check, mask, status):
    r = check([FakeDevice(throttle=mask, temperature=88)])
    assert r.status is status, r.summary
    if status is Status.WARN:
        assert "throttling" in r.summary and "88 C" in r.summary


def test_power_cap_warning_can_be_turned_off(check):
    assert check([FakeDevice(throttle=0x04)], config={"warn_sw_power_cap": False}).status is Status.OK
    assert check([FakeDevice(throttle=0x44)], config={"warn_sw_power_cap": False}).status is Status.WARN


def test_exclusive_process_gpu_held_by_another_warns(check):
    r = check([FakeDevice(compute_mode=3, processes=[(99, GIB // 100)])])
    assert r.status is Status.WARN and "Exclusive_Process" in r.summary


def test_unsupported_fields_do_not_fail(check):
    r = check([FakeDevice(name="NVIDIA GeForce RTX 4090", unsupported={"ecc", "retired_pages", "remapped_rows", "mig_mode"})])
    assert r.status is Status.OK and r.facts["gpus"][0]["ecc_uncorrected"] is None
    assert r.facts["ecc_uncorrected"] == {}


def test_worst_finding_wins_and_all_are_listed(check):
    r = check([FakeDevice(memory_used=20 * GIB), FakeDevice(ecc_uncorrected=2), FakeDevice(throttle=0x40)])
    assert r.status is Status.FAIL
    assert len(r.facts["findings"]) == 3
    assert r.remediation.startswith("nvidia-smi -r -i 1")


def test_a_gpu_lost_later_is_still_named_by_its_last_known_identity():
    fake = FakeNvml(devices=[FakeDevice(), FakeDevice()])
    session = lambda: Session(env_override={}, nvml_factory=lambda: nvml.connect(lib=fake, timeout=1))  # noqa: E731
    assert run_one(Plan(CHECK, DEFAULTS, 5), session()).status is Status.OK
    fake.devices[1].lost = True
    r = run_one(Plan(CHECK, DEFAULTS, 5), session())
    assert r.status is Status.FAIL and r.summary.startswith(f"GPU 1 (PCI 00000000:19:00.0, {fake.devices[1].uuid}) is lost")


def test_a_hung_gpu_is_bounded_marked_and_the_others_judged(check):
    started = time.monotonic()
    r = check([FakeDevice(ecc_uncorrected=1), FakeDevice(hang="temperature"), FakeDevice()], timeout=0.5)
    elapsed = time.monotonic() - started
    assert elapsed < 2.5, f"took {elapsed:.2f} s"
    assert r.status is Status.FAIL
    assert "GPU 1" in r.summary and "did not answer NVML in time (temperature: timed out" in r.summary
    assert "GPU 0" in r.summary and "uncorrectable ECC" in r.summary  # the others are still judged
    assert r.facts["gpus"][1]["timed_out"] is True and r.facts["gpus"][2]["timed_out"] is False


def test_hung_nvml_init_fails_instead_of_skipping(check):
    started = time.monotonic()
    r = check(init_hangs=True, timeout=0.3)
    assert time.monotonic() - started < 2.5
    assert r.status is Status.FAIL and "nvmlInit did not return" in r.summary


def test_whole_run_with_a_hang_stays_within_the_timeout(check):
    fake = FakeNvml(devices=[FakeDevice(hang="handle"), FakeDevice()])
    try:
        session = Session(env_override={}, nvml_factory=lambda: nvml.connect(lib=fake, timeout=0.3))
        started = time.monotonic()
        [r] = run([Plan(CHECK, DEFAULTS, 5)], session)
        assert time.monotonic() - started < 2.5
        assert r.status is Status.FAIL and r.facts["gpus"][0]["timed_out"]
    finally:
        fake.release()


def test_no_driver_skips_with_nvmls_reason(check):
    r = check(no_library=True)
    assert r.status is Status.SKIP and "no NVIDIA driver" in r.summary and "--gpus all" in r.remediation


def test_no_gpus_skips(check):
    r = check(devices=[])
    assert r.status is Status.SKIP and "no GPU" in r.summary


def test_judge_directly_on_facts():
    from envdoctor.nvml import GpuInfo

    g = GpuInfo(index=0, name="Tesla T4", memory_total_bytes=16 * GIB, memory_used_bytes=0, temperature_c=50)
    assert judge(HealthFacts((g,)), DEFAULTS).status is Status.OK
    assert judge(HealthFacts((), hung="NVML device_count did not return"), DEFAULTS).status is Status.FAIL


def test_metrics_declared_with_gpu_label():
    names = {m.name: m for m in CHECK.metrics}
    assert {"gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_temperature_celsius", "gpu_power_watts"} <= set(names)
    assert all(m.label == "gpu" for m in CHECK.metrics if not m.info)
    assert names["gpu_info"].info[0] == ("gpu", "index")  # joins on the same gpu label as the gauges
    assert CHECK.needs == ("nvml",)
