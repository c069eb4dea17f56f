"""cuda.runtime: the judge on plain facts, the parsers under hypothesis, and whole runs
through the runner with a fake NVML and a stub CUDA torch."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import envdoctor.nvml
from envdoctor.checks.cuda_runtime import (
    CHECK, Gpu, RuntimeFacts, format_cudnn_version, judge, parse_arch, parse_cuda_version,
)
from envdoctor.context import Session
from envdoctor.errors import ParseError, Unavailable
from envdoctor.model import Status
from envdoctor.runner import Plan, run_one
from fake_pynvml import FakeDevice, FakeNvml

CU121 = {
    "python": "/opt/venv/bin/python", "torch_version": "2.4.0+cu121", "torch_cuda_version": "12.1",
    "torch_hip_version": None, "arch_list": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"],
    "cuda_available": True, "device_count": 1, "cudnn_available": True, "cudnn_version": 90100, "errors": {},
    "warnings": [],
}
CPU_ONLY = {"python": "/opt/venv/bin/python", "torch_version": "2.4.0+cpu", "torch_cuda_version": None,
            "torch_hip_version": None, "arch_list": [], "cuda_available": False, "device_count": 0,
            "cudnn_available": False, "cudnn_version": None, "errors": {}}
H100 = Gpu(0, "NVIDIA H100 80GB HBM3", (9, 0))


def facts(torch=None, *, gpus=(H100,), driver="550.54.15", driver_cuda=(12, 4), nvml_reason=None, launch_blocking=None):
    return RuntimeFacts(dict(CU121 if torch is None else torch), nvml_reason, driver if gpus else None,
                        driver_cuda if gpus else None, tuple(gpus), launch_blocking)


def with_torch(**changes):
    t = dict(CU121)
    t.update(changes)
    return t


# -- parsers -------------------------------------------------------------------------------


def test_parse_cuda_version():
    assert parse_cuda_version("12.1") == (12, 1)
    assert parse_cuda_version("11.8.89") == (11, 8)
    for bad in ("", "12", "twelve.one", "12.x", None, 12.1, "1.2a"):
        with pytest.raises(ParseError):
            parse_cuda_version(bad)


def test_parse_arch():
    assert parse_arch("sm_86") == parse_arch("sm_86")
    a = parse_arch("sm_86")
    assert (a.ptx, a.major, a.minor, a.variant, a.name) == (False, 8, 6, "", "sm_86")
    assert parse_arch("sm_100").major == 10 and parse_arch("sm_100").minor == 0
    assert parse_arch("sm_120").major == 12
    assert parse_arch("compute_90").ptx
    assert parse_arch("sm_90a").variant == "a"
    for bad in ("", "sm86", "sm_", "gfx90a", "sm_8", "compute_x", None):
        with pytest.raises(ParseError):
            parse_arch(bad)


def test_arch_compatibility_rules():
    sm80, sm90a, ptx90, sm100f = parse_arch("sm_80"), parse_arch("sm_90a"), parse_arch("compute_90"), parse_arch("sm_100f")
    assert sm80.runs_on((8, 0)) and sm80.runs_on((8, 6)) and sm80.runs_on((8, 9))
    assert not sm80.runs_on((9, 0)) and not sm80.runs_on((7, 5))  # SASS stays within its major
    assert sm90a.runs_on((9, 0)) and not sm90a.runs_on((10, 0))  # arch-specific: exactly 9.0
    assert ptx90.runs_on((9, 0)) and ptx90.runs_on((12, 0)) and not ptx90.runs_on((8, 9))  # PTX: forward
    assert sm100f.runs_on((10, 3)) and not sm100f.runs_on((12, 0))


def test_format_cudnn_version():
    assert format_cudnn_version(90100) == "9.1.0"
    assert format_cudnn_version(8902) == "8.9.2"
    assert format_cudnn_version(None) is None and format_cudnn_version(True) is None


@given(st.one_of(st.text(max_size=20), st.integers(), st.none(), st.floats()))
def test_parsers_return_a_value_or_parse_error(value):
    for parser in (parse_cuda_version, parse_arch):
        try:
            parser(value)
        except ParseError:
            pass
    assert format_cudnn_version(value) is None or isinstance(format_cudnn_version(value), str)


# -- judging -------------------------------------------------------------------------------


def test_matching_build_driver_and_gpu_is_ok():
    r = judge(facts(), {})
    assert r.status is Status.OK, r.summary
    assert "2.4.0+cu121" in r.summary and "550.54.15" in r.summary and "9.0" in r.summary
    assert r.facts["gpus"][0]["kernels"] == "sass"
    assert r.facts["arch_supported"] == {"0": 1}
    assert r.facts["cudnn_version_text"] == "9.1.0"


def test_cpu_only_torch_on_a_gpu_node_fails_with_the_pip_command():
    r = judge(facts(CPU_ONLY), {})
    assert r.status is Status.FAIL
    assert "CPU-only" in r.summary and "_cuda_getDevice" in r.summary and "H100" in r.summary
    assert r.remediation == "pip install --force-reinstall torch==2.4.0 --index-url https://download.pytorch.org/whl/cu124"


def test_rocm_torch_on_an_nvidia_node_fails():
    r = judge(facts(dict(CPU_ONLY, torch_version="2.4.0+rocm6.1", torch_hip_version="6.1")), {})
    assert r.status is Status.FAIL and "ROCm" in r.summary


def test_driver_of_an_older_major_fails():
    r = judge(facts(with_torch(torch_version="2.4.0+cu121"), driver="470.82", driver_cuda=(11, 4)), {})
    assert r.status is Status.FAIL
    assert "supports CUDA up to 11.4" in r.summary and "too old" in r.summary and "R525" in r.summary
    assert "whl/cu118" in r.remediation  # the newest wheel that driver runs


def test_driver_of_an_older_minor_warns_minor_version_compatibility():
    r = judge(facts(with_torch(torch_version="2.6.0+cu126", torch_cuda_version="12.6"), driver_cuda=(12, 2)), {})
    assert r.status is Status.WARN
    assert "minor version compatibility" in r.summary
    # torch 2.6 was published for cu118, cu124 and cu126 (no cu121: helper-97); within CUDA 12
    assert "torch==2.6.0 --index-url https://download.pytorch.org/whl/cu124" in r.remediation


def test_a_fix_names_only_a_published_wheel_or_says_to_pick_one():
    """Helper-97: 2.8.0 on a CUDA 12.2 driver was told 'torch==2.8.0 ... whl/cu121' (no such wheel)."""
    r = judge(facts(with_torch(torch_version="2.8.0+cu128", torch_cuda_version="12.8"), driver_cuda=(11, 8)), {})
    assert r.status is Status.FAIL and "torch==2.8.0" not in r.remediation, r.remediation
    assert "whl/cu118  # a release published for cu118" in r.remediation
    r = judge(facts(with_torch(torch_version="2.8.0+cu128", torch_cuda_version="12.8"), driver_cuda=(12, 2)), {})
    assert "torch==2.8.0 --index-url https://download.pytorch.org/whl/cu126" in r.remediation  # same major, published


def test_a_driver_below_the_minor_compatibility_floor_fails():
    """Helper-97: CUDA 11.0's own 450.36.06 is below 450.80.02, where minor version compatibility starts."""
    r = judge(facts(with_torch(torch_version="2.0.1+cu118", torch_cuda_version="11.8"), driver="450.36.06",
                    driver_cuda=(11, 0)), {})
    assert r.status is Status.FAIL and "below R450.80.02" in r.summary, r.summary
    r = judge(facts(with_torch(torch_version="2.0.1+cu118", torch_cuda_version="11.8"), driver="450.80.02",
                    driver_cuda=(11, 0)), {})
    assert r.status is Status.WARN


def test_before_cuda_11_the_driver_must_match_exactly():
    r = judge(facts(with_torch(torch_cuda_version="10.2", arch_list=["sm_70", "sm_75"]), gpus=[Gpu(0, "V100", (7, 0))],
                    driver_cuda=(10, 1)), {})
    assert r.status is Status.FAIL


def test_gpu_newer_than_every_kernel_but_covered_by_ptx_warns():
    t = with_torch(arch_list=["sm_80", "sm_86", "compute_86"])
    r = judge(facts(t), {})
    assert r.status is Status.WARN
    assert "JIT-compiling compute_86 PTX" in r.summary and "sm_90" in r.summary
    assert r.facts["gpus"][0]["kernels"] == "ptx"


def test_ptx_only_gpu_with_an_older_minor_driver_fails():
    t = with_torch(torch_version="2.6.0+cu126", torch_cuda_version="12.6", arch_list=["sm_80", "compute_80"])
    r = judge(facts(t, driver_cuda=(12, 2)), {})
    assert r.status is Status.FAIL
    assert "does not JIT newer PTX" in r.summary


def test_gpu_without_any_kernel_fails():
    t = with_torch(arch_list=["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86"])
    r = judge(facts(t, gpus=[Gpu(0, "NVIDIA B200", (10, 0))], driver_cuda=(12, 8)), {})
    assert r.status is Status.FAIL
    assert "no kernel image is available" in r.summary and "sm_100" in r.summary
    assert r.facts["arch_supported"] == {"0": 0}


def test_gpu_older_than_the_build_suggests_an_older_torch():
    t = with_torch(arch_list=["sm_70", "sm_75", "sm_80"])
    r = judge(facts(t, gpus=[Gpu(0, "Tesla K80", (3, 7))]), {})
    assert r.status is Status.FAIL and "older torch" in r.remediation


def test_newer_minor_in_the_same_major_runs_on_sass():
    r = judge(facts(gpus=[Gpu(0, "NVIDIA L4", (8, 9))]), {})  # sm_86 SASS covers 8.9
    assert r.status is Status.OK


def test_arch_specific_entry_only_covers_its_exact_gpu():
    t = with_torch(arch_list=["sm_80", "sm_90a"])
    assert judge(facts(t), {}).status is Status.OK
    r = judge(facts(t, gpus=[Gpu(0, "future", (9, 5))]), {})
    assert r.status is Status.FAIL


def test_several_gpus_each_judged():
    gpus = [H100, Gpu(1, "Tesla K80", (3, 7))]
    r = judge(facts(gpus=gpus), {})
    assert r.status is Status.FAIL
    assert r.facts["arch_supported"] == {"0": 1, "1": 0}
    assert "GPU 1" in r.summary and "GPU 0 " not in r.summary


def test_torch_cannot_see_the_gpus_nvml_sees_warns_with_its_warning():
    t = with_torch(cuda_available=False,
                   warnings=["UserWarning: CUDA initialization: The NVIDIA driver on your system is too old (found version 11040)"])
    r = judge(facts(t), {})
    assert r.status is Status.WARN
    assert "is_available() is False" in r.summary and "found version 11040" in r.summary


def test_cudnn_mismatch_fails_and_missing_cudnn_warns():
    t = with_torch(cudnn_version=None, errors={"cudnn_version": "RuntimeError: cuDNN version incompatibility: PyTorch was compiled against (9, 1, 0) but found runtime version (8, 9, 2)"})
    r = judge(facts(t), {})
    assert r.status is Status.FAIL and "cuDNN version incompatibility" in r.summary
    assert "LD_LIBRARY_PATH" in r.remediation
    r = judge(facts(with_torch(cudnn_available=False, cudnn_version=None)), {})
    assert r.status is Status.WARN and "no cuDNN" in r.summary


def test_a_cudnn_mismatch_torch_is_told_to_skip_warns_instead():
    """helper-86: with PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 torch loads a cuDNN of another
    version instead of raising (torch/backends/cudnn/__init__.py); it was still "does not load"."""
    t = with_torch(errors={"cudnn_version": "RuntimeError: cuDNN version incompatibility: torch was built for "
                                           "cuDNN 9.20.0.48 but the installed cuDNN is 9.10"})
    r = judge(facts(t)._replace(skip_cudnn_check="1"), {})
    assert r.status is Status.WARN and "PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1" in r.summary, r.summary
    assert r.remediation.startswith("unset PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK")
    for other in (None, "0", "true"):  # torch compares with "1"
        assert judge(facts(t)._replace(skip_cudnn_check=other), {}).status is Status.FAIL, other


def test_launch_blocking_warns_a_cuda_torch_on_a_gpu_node_and_without_one():
    r = judge(facts(launch_blocking="1"), {})
    assert r.status is Status.WARN and r.remediation == "unset CUDA_LAUNCH_BLOCKING"
    assert r.facts["CUDA_LAUNCH_BLOCKING"] == "1"
    r = judge(facts(gpus=(), nvml_reason="no NVIDIA driver here", launch_blocking="1"), {})  # an image built off-GPU
    assert r.status is Status.WARN and "no NVIDIA GPU visible" in r.summary
    assert judge(facts(launch_blocking="0"), {}).status is Status.OK


def test_launch_blocking_changes_nothing_for_a_cpu_only_torch():
    """Helper-42: a warning whose own summary said "CPU-only: nothing to match"."""
    r = judge(facts(CPU_ONLY, gpus=(), nvml_reason="no NVIDIA driver here", launch_blocking="1"), {})
    assert r.status is Status.SKIP and "CPU-only" in r.summary
    assert r.facts["CUDA_LAUNCH_BLOCKING"] == "1"


def test_no_gpu_skips_with_nvml_reason_and_keeps_versions():
    r = judge(facts(CPU_ONLY, gpus=(), nvml_reason="no NVIDIA driver here (libnvidia-ml.so.1 not found)"), {})
    assert r.status is Status.SKIP
    assert "libnvidia-ml.so.1 not found" in r.summary and "CPU-only" in r.summary
    assert r.facts["torch_version"] == "2.4.0+cpu" and r.facts["torch_cuda_version"] is None


def test_cuda_build_without_gpus_says_how_to_give_a_container_its_gpus():
    r = judge(facts(gpus=(), nvml_reason="no NVIDIA driver here"), {})
    assert r.status is Status.SKIP and "--gpus all" in r.summary and "CUDA build" in r.summary


# -- whole runs ----------------------------------------------------------------------------


def session(torch_facts, fake=None, env=None):
    def nvml_factory():
        if fake is None:
            raise Unavailable("no NVIDIA driver here (libnvidia-ml.so.1 not found)")
        return envdoctor.nvml.connect(lib=fake, timeout=2.0)

    def torch_factory(_session):
        if isinstance(torch_facts, Exception):
            raise torch_facts
        return dict(torch_facts)

    return Session(env_override=env or {}, nvml_factory=nvml_factory, torch_factory=torch_factory)


def test_through_the_runner_with_fake_nvml_cpu_torch_on_gpu_node():
    fake = FakeNvml(devices=[FakeDevice(), FakeDevice()], driver="550.54.15", cuda=12040)
    r = run_one(Plan(CHECK, {}, 90), session(CPU_ONLY, fake))
    assert r.status is Status.FAIL and r.check == "cuda.runtime"
    assert "2 NVIDIA GPUs" in r.summary and "whl/cu124" in r.remediation
    assert r.facts["driver_cuda_version"] == "12.4"


def test_through_the_runner_with_fake_nvml_matching_build():
    fake = FakeNvml(devices=[FakeDevice(compute_capability=(8, 0), name="NVIDIA A100-SXM4-80GB")], driver="535.104.05", cuda=12020)
    r = run_one(Plan(CHECK, {}, 90), session(with_torch(torch_version="2.1.2+cu118", torch_cuda_version="11.8"), fake,
                                             env={"CUDA_LAUNCH_BLOCKING": "1"}))
    assert r.status is Status.WARN and "CUDA_LAUNCH_BLOCKING=1" in r.summary
    assert r.facts["gpus"] == [{"index": 0, "name": "NVIDIA A100-SXM4-80GB", "capability": "8.0", "kernels": "sass"}]


def test_no_torch_skips_naming_the_interpreter():
    r = run_one(Plan(CHECK, {}, 90), session(Unavailable("no torch in /usr/bin/python3")))
    assert r.status is Status.SKIP and r.summary.startswith("no torch in /usr/bin/python3")


def test_stub_cuda_torch_through_the_real_probe(tmp_path):
    """A CUDA-build stub torch in a real venv, probed for real, judged with a fake NVML."""
    from envdoctor.probe import run_probe
    from test_probe import make_stub_python

    python = make_stub_python(tmp_path)
    fake = FakeNvml(devices=[FakeDevice(compute_capability=(12, 0), name="NVIDIA RTX PRO 6000")], driver="575.51", cuda=12090)
    s = Session(env_override={}, nvml_factory=lambda: envdoctor.nvml.connect(lib=fake, timeout=2.0),
                torch_factory=lambda _s: run_probe(str(python), use_cache=False))
    r = run_one(Plan(CHECK, {}, 90), s)
    assert r.status is Status.WARN, r.summary  # sm_120 reachable only through compute_90 PTX
    assert "JIT-compiling compute_90" in r.summary


@pytest.mark.real
def test_real_run_on_this_machine(tmp_path, monkeypatch):
    """This machine: CPU torch; a GPU only if NVML finds one. Either way, no error."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    r = run_one(Plan(CHECK, {}, 90), Session(python=sys.executable))
    assert r.status in (Status.SKIP, Status.OK, Status.WARN, Status.FAIL), r.summary
    assert r.facts["torch_version"].startswith("2.")
    if r.facts.get("nvml_unavailable"):
        assert r.status is Status.SKIP and "NVML" in r.summary


def test_a_pascal_gpu_under_a_cuda_12_8_build_is_sent_to_the_same_releases_12_6_build():
    """Helper-97: 'install an older torch release' where the PyTorch 2.8 release notes say to
    use the CUDA 12.6 build of the same release, which still carries sm_50-sm_70."""
    t = with_torch(torch_version="2.8.0+cu128", torch_cuda_version="12.8",
                   arch_list=["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"])
    r = judge(facts(t, gpus=[Gpu(0, "NVIDIA GeForce GTX 1080", (6, 1))], driver_cuda=(12, 8)), {})
    assert r.status is Status.FAIL
    assert "torch==2.8.0 --index-url https://download.pytorch.org/whl/cu126" in r.remediation, r.remediation


def test_family_specific_ptx_runs_within_its_major_only():
    """Helper-97 (NVIDIA: family-specific targets are compatible within their family): compute_100f
    does not reach an sm_120 GPU; it reaches sm_103."""
    from envdoctor.checks.cuda_runtime import parse_arch

    assert not parse_arch("compute_100f").runs_on((12, 0))
    assert parse_arch("compute_100f").runs_on((10, 3))
    assert parse_arch("compute_90").runs_on((12, 0))  # plain PTX still JITs forward


def test_without_the_drivers_cuda_version_the_summary_claims_no_match():
    r = judge(facts(driver_cuda=None), {})
    assert "match not checked" in r.summary and "matches" not in r.summary, r.summary


def test_a_forward_compatibility_library_on_ld_library_path_makes_a_newer_build_a_warning(tmp_path):
    """Helper-97 (NVIDIA, CUDA Compatibility: forward compatibility): NGC images put
    cuda-compat's libcuda first on LD_LIBRARY_PATH, and a CUDA 13 torch runs on a 535 driver on
    data center GPUs; the check failed a job that works. gather() finds it in the target's view."""
    from envdoctor.checks.cuda_runtime import _forward_compat
    from envdoctor.context import Context, Roots

    compat = tmp_path / "usr/local/cuda/compat/lib"
    compat.mkdir(parents=True)
    (compat / "libcuda.so.580.65.06").write_bytes(b"")
    session = Session(env_override={"LD_LIBRARY_PATH": f"/usr/lib:/usr/local/cuda/compat/lib"},
                      roots=Roots(procfs=tmp_path / "proc", sysfs=tmp_path / "sys", rootfs=tmp_path))
    found = _forward_compat(Context(session))
    assert found == ("/usr/local/cuda/compat/lib/libcuda.so.580.65.06", "580.65.06")
    t = with_torch(torch_version="2.9.0+cu130", torch_cuda_version="13.0")
    plain = judge(facts(t, driver="535.183.01", driver_cuda=(12, 2)), {})
    assert plain.status is Status.FAIL
    covered = judge(facts(t, driver="535.183.01", driver_cuda=(12, 2))._replace(forward_compat=found), {})
    assert covered.status is Status.WARN and "forward compatibility library" in covered.summary, covered.summary
    too_old = judge(facts(t, driver="535.183.01", driver_cuda=(12, 2))._replace(
        forward_compat=("/x/compat/libcuda.so.570.1", "570.1")), {})
    assert too_old.status is Status.FAIL


def test_fixes_never_name_a_build_the_driver_cannot_run():
    """Helper-98: a CUDA 11.8 driver was offered the cu126 build for a Pascal GPU, and a driver
    below R450.80.02 a cu117 one, which needs that floor too."""
    t = with_torch(torch_version="2.8.0+cu128", torch_cuda_version="12.8", arch_list=["sm_75", "sm_80", "sm_90"])
    r = judge(facts(t, gpus=[Gpu(0, "Tesla P100", (6, 0))], driver="520.61.05", driver_cuda=(11, 8)), {})
    assert "whl/cu126" not in r.remediation, r.remediation
    r = judge(facts(with_torch(torch_version="2.0.1+cu118", torch_cuda_version="11.8"), driver="450.51.06",
                    driver_cuda=(11, 0)), {})
    assert r.status is Status.FAIL and r.remediation.startswith("upgrade the NVIDIA driver to 450.80.02"), r.remediation
    assert "whl/cu11" not in r.remediation
