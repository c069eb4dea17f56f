"""On a real NVIDIA GPU: every NVML and CUDA path against the real driver.

Marked `gpu`: `scripts/gpu-test.sh` runs this file on a machine with a GPU; here,
without a driver, every test skips with the reason. The fake NVML covers what a
real GPU cannot be made to do on purpose (a hung or lost GPU, ECC faults).
Figures a test measures are printed (`-s`) so the run's log can be quoted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import cli, stop_job

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu():
    """The real NVML facade, or skip with the reason there is none."""
    from envdoctor import nvml
    from envdoctor.errors import Unavailable

    try:
        facade = nvml.connect()
        if facade.device_count() < 1:
            pytest.skip("NVML has no GPU here")
    except Unavailable as exc:
        pytest.skip(f"no NVIDIA GPU: {exc}")
    return facade


def _torch_cuda_or_skip():
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=300)
    if probe.returncode != 0 or probe.stdout.strip() != "True":
        pytest.skip(f"no CUDA torch in {sys.executable}: {probe.stdout.strip()} {probe.stderr[-200:]}")


def _rows(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    assert "Traceback" not in proc.stderr, proc.stderr
    return {r["check"]: r for r in json.loads(proc.stdout)["results"]}


def test_gpu_health_is_ok_on_a_healthy_gpu_with_every_field_read(gpu):
    rows = _rows(cli("check", "--only", "gpu.health", "-f", "json", timeout=120))
    row = rows["gpu.health"]
    print("gpu.health:", row["status"], row["summary"])
    assert row["status"] in ("ok", "warn"), row  # warn only for memory held by others or throttling, said below
    if row["status"] == "warn":
        assert "held by" in row["summary"] or "throttl" in row["summary"], row
    for g in gpu.devices(max_age=0):
        print("GPU", g.index, g.name, g.uuid, "cc", g.compute_capability, "mem", g.memory_total_bytes,
              "unsupported:", g.unsupported, "errors:", g.errors)
        assert not g.timed_out and not g.lost and not g.errors, g
        assert g.uuid.startswith("GPU-") and g.memory_total_bytes > 0 and g.compute_capability


def test_cuda_runtime_is_ok_and_torch_facts_equal_what_import_torch_says(gpu):
    _torch_cuda_or_skip()
    truth = json.loads(subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import json, torch
        print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda,
                          "arch": torch.cuda.get_arch_list(), "cudnn": torch.backends.cudnn.version()}))
    """)], capture_output=True, text=True, check=True, timeout=300).stdout)
    proc = cli("check", "--only", "cuda.runtime", "-f", "json", env={"ENVDOCTOR_NO_CACHE": "1"}, timeout=300)
    report = json.loads(proc.stdout)
    row = _rows(proc)["cuda.runtime"]
    print("import torch:", truth)
    print("cuda.runtime:", row["status"], row["summary"])
    assert row["status"] == "ok", row
    system = report["system"]
    assert system.get("torch_version") == truth["version"]
    assert system.get("torch_cuda_version") == truth["cuda"]
    facts = row["facts"]
    arch = facts.get("arch_list") or facts.get("torch_arch_list")
    if arch is not None:
        assert sorted(arch) == sorted(truth["arch"]), (arch, truth["arch"])


def test_visible_devices_resolve_indices_and_real_uuids_and_a_wrong_uuid_fails(gpu):
    first = gpu.devices(max_age=0)[0]
    by_index = _rows(cli("check", "--only", "cuda.visible_devices", "-f", "json", env={"CUDA_VISIBLE_DEVICES": "0"}))
    by_uuid = _rows(cli("check", "--only", "cuda.visible_devices", "-f", "json",
                        env={"CUDA_VISIBLE_DEVICES": first.uuid}))
    short = _rows(cli("check", "--only", "cuda.visible_devices", "-f", "json",
                      env={"CUDA_VISIBLE_DEVICES": first.uuid[:12]}))  # a unique UUID prefix, as CUDA accepts
    wrong = _rows(cli("check", "--only", "cuda.visible_devices", "-f", "json",
                      env={"CUDA_VISIBLE_DEVICES": "GPU-00000000-0000-0000-0000-000000000000"}))
    for name, rows in (("index", by_index), ("uuid", by_uuid), ("prefix", short), ("wrong", wrong)):
        print(name, rows["cuda.visible_devices"]["status"], rows["cuda.visible_devices"]["summary"])
    assert by_index["cuda.visible_devices"]["status"] == "ok"
    assert by_uuid["cuda.visible_devices"]["status"] == "ok"
    assert by_uuid["cuda.visible_devices"]["facts"].get("visible_count", 1) == 1
    assert wrong["cuda.visible_devices"]["status"] == "fail"


def test_a_real_torch_process_holding_gpu_memory_is_seen_with_its_memory(gpu):
    _torch_cuda_or_skip()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time, torch
        x = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # 512 MiB
        torch.cuda.synchronize()
        print("ready", flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 30
        seen = None
        while time.monotonic() < deadline and seen is None:
            for g in gpu.devices(max_age=0):
                for pid, used in g.processes:
                    if pid == holder.pid:
                        seen = used
            time.sleep(0.5)
        print("holder pid", holder.pid, "NVML per-process bytes:", seen)
        assert seen is not None, "NVML does not list the process (a container without host PID namespace?)"
        assert seen >= 512 * 1024 * 1024
    finally:
        holder.kill()
        holder.wait()


def test_envdoctor_itself_holds_no_gpu_memory(gpu):
    """check and preflight() never create a CUDA context: NVML never lists their process."""
    code = textwrap.dedent("""
        import sys, time, envdoctor
        envdoctor.preflight(file=None)
        from envdoctor.cli import app
        print("done", flush=True)
        time.sleep(20)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "done"
        listed = [(g.index, pid, used) for g in gpu.devices(max_age=0) for pid, used in g.processes if pid == proc.pid]
        smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
        print("NVML entries for envdoctor's pid:", listed, "| nvidia-smi compute apps:", smi.stdout.strip() or "none")
        assert listed == []
        assert str(proc.pid) not in smi.stdout.split(",")[0::2]
    finally:
        proc.kill()
        proc.wait()


SERVE_TWICE = """
import json, sys, time
from envdoctor.serve import Daemon, Options
daemon = Daemon(Options(once=True))
for _ in range(2):  # two runs: the second has a memory history to judge
    snap = daemon.scheduler.run_once()
    time.sleep(1)
print(json.dumps({"metrics": snap.metrics.decode(), "targets": list(snap.targets)}), flush=True)
time.sleep(20)      # still alive while the test asks NVML about it
"""


def test_serve_finds_a_gpu_process_with_its_memory_and_holds_none_itself(gpu):
    """The monitor's discovery through NVML on a real driver: the torch process holding
    512 MiB is a target (source nvml) with its per-process GPU memory sampled; the daemon
    itself is in no GPU's process list."""
    _torch_cuda_or_skip()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time, torch
        x = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        print("ready", flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    serve = None
    try:
        assert holder.stdout.readline().strip() == "ready"
        serve = subprocess.Popen([sys.executable, "-c", SERVE_TWICE], stdout=subprocess.PIPE, text=True)
        data = json.loads(serve.stdout.readline())
        target = f"pid:{holder.pid}"
        assert target in data["targets"], data["targets"]
        lines = [l for l in data["metrics"].splitlines() if f'target="{target}"' in l]
        print("serve on the GPU process:", *[l for l in lines if "target_info" in l or "gpu" in l or "memory" in l][:12], sep="\n  ")
        assert any("envdoctor_target_info" in l and 'source="nvml"' in l for l in lines)
        listed = [pid for g in gpu.devices(max_age=0) for pid, _ in g.processes if pid == serve.pid]
        print("NVML entries for serve's pid:", listed)
        assert listed == []
    finally:
        for proc in (holder, serve):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_pin_memory_measurement_gives_bandwidth_and_cpu_figures(gpu):
    _torch_cuda_or_skip()
    rows = _rows(cli("check", "--only", "torch.pin_memory", "-f", "json", env={"ENVDOCTOR_NO_CACHE": "1"}, timeout=300))
    row = rows["torch.pin_memory"]
    facts = row["facts"]
    print("torch.pin_memory:", row["status"], row["summary"])
    print("pinned B/s", facts.get("pinned_bytes_per_second"), "pageable B/s", facts.get("pageable_bytes_per_second"),
          "cpu s/GiB", facts.get("pin_cpu_seconds_per_gib"))
    if row["status"] == "skip":
        pytest.skip(f"torch.pin_memory does not measure in this mode: {row['summary']}")
    assert facts.get("pinned_bytes_per_second", 0) > 0 and facts.get("pageable_bytes_per_second", 0) > 0
    assert facts.get("pin_cpu_seconds_per_gib", 0) > 0


def test_the_measurement_is_made_once_a_boot(gpu, tmp_path):
    """A second check takes the figures from the cache (same boot, GPU and driver)."""
    _torch_cuda_or_skip()
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "ENVDOCTOR_NO_CACHE": ""}
    times, rows = [], []
    for _ in range(2):
        started = time.perf_counter()
        rows.append(_rows(cli("check", "--only", "torch.pin_memory", "-f", "json", env=env, timeout=300))["torch.pin_memory"])
        times.append(time.perf_counter() - started)
    print("torch.pin_memory, measured:", rows[0]["summary"], f"{times[0]:.2f} s")
    print("torch.pin_memory, cached:", rows[1]["summary"], f"{times[1]:.2f} s")
    if rows[0]["status"] == "skip":
        pytest.skip(f"torch.pin_memory does not measure here: {rows[0]['summary']}")
    assert rows[0]["facts"]["measurement_cached"] is False and rows[1]["facts"]["measurement_cached"] is True
    assert rows[1]["facts"]["pinned_bytes_per_second"] == rows[0]["facts"]["pinned_bytes_per_second"]
    assert "earlier this boot" in rows[1]["summary"]


# torch's own measurement, as the check made it before it called the driver itself:
# the reference the driver-level figures are held against.
TORCH_COPY_RATES = textwrap.dedent("""
    import json, time, torch
    size, repeats = 128 * 1024 * 1024, 5
    dst = torch.empty(size, dtype=torch.uint8, device="cuda")
    pageable = torch.empty(size, dtype=torch.uint8)
    pageable.fill_(1)
    def rate(src, non_blocking):
        dst.copy_(src, non_blocking=non_blocking)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            dst.copy_(src, non_blocking=non_blocking)
        torch.cuda.synchronize()
        return size * repeats / (time.perf_counter() - start)
    out = {"pageable": rate(pageable, False)}
    out["pinned"] = rate(pageable.pin_memory(), True)
    print(json.dumps(out))
""")


def test_the_driver_level_copy_rates_agree_with_torchs_own(gpu):
    """copy_probe.py makes torch's driver calls without torch: its pinned and pageable
    rates must be torch's, within the spread of repeated runs (best of three each)."""
    _torch_cuda_or_skip()
    from envdoctor.probe import run_copy_measurement

    params = {"size_bytes": 128 * 1024 * 1024, "repeats": 5, "device": 0}
    ours, theirs = [], []
    for _ in range(3):
        started = time.perf_counter()
        m = run_copy_measurement(params, timeout=120)
        wall = time.perf_counter() - started
        assert not m["errors"], m
        ours.append((m["pinned_bytes_per_second"], m["pageable_bytes_per_second"], wall, m["context_seconds"]))
        started = time.perf_counter()
        t = json.loads(subprocess.run([sys.executable, "-c", TORCH_COPY_RATES], capture_output=True, text=True,
                                      check=True, timeout=300).stdout.strip().splitlines()[-1])
        theirs.append((t["pinned"], t["pageable"], time.perf_counter() - started))
    for o, t in zip(ours, theirs):
        print(f"driver: pinned {o[0] / 1e9:.1f} GB/s pageable {o[1] / 1e9:.1f} GB/s in {o[2]:.2f} s "
              f"(context {o[3]:.3f} s) | torch: pinned {t[0] / 1e9:.1f} GB/s pageable {t[1] / 1e9:.1f} GB/s "
              f"in {t[2]:.2f} s")
    best_pinned, best_pageable = max(o[0] for o in ours), max(o[1] for o in ours)
    torch_pinned, torch_pageable = max(t[0] for t in theirs), max(t[1] for t in theirs)
    assert 0.67 < best_pinned / torch_pinned < 1.5, (ours, theirs)
    assert 0.67 < best_pageable / torch_pageable < 1.5, (ours, theirs)
    assert best_pinned > best_pageable and torch_pinned > torch_pageable


TORCH_TRUTH = textwrap.dedent("""
    import json, os, torch
    from torch.onnx import _constants
    print(json.dumps({"dir": os.path.dirname(torch.__file__), "version": torch.__version__,
                      "cuda": torch.version.cuda, "arch": torch.cuda.get_arch_list(),
                      "cudnn": torch.backends.cudnn.version(),
                      "onnx_default": getattr(_constants, "ONNX_DEFAULT_OPSET", None),
                      "onnx_max": getattr(_constants, "ONNX_MAX_OPSET", None)}))
""")


def test_every_fact_read_from_a_cuda_torchs_files_equals_import_torch(gpu):
    """check and serve read torch's facts from its files, never importing it. On the real CUDA
    build (another torch than the CPU one the suite has) each fact must be what torch says:
    its version, CUDA, arch list, cuDNN (from the nvidia-cudnn package's files) and the ONNX
    opsets that onnx.opset's fixes are capped by."""
    _torch_cuda_or_skip()
    from envdoctor.torchfacts import read_installation

    truth = json.loads(subprocess.run([sys.executable, "-c", TORCH_TRUTH], capture_output=True, text=True,
                                      check=True, timeout=300).stdout.strip().splitlines()[-1])
    facts = read_installation(truth["dir"])
    print("import torch:", {k: v for k, v in truth.items() if k != "arch"}, "arch", truth["arch"])
    print("from files:", {k: facts[k] for k in ("torch_version", "torch_cuda_version", "cudnn_version",
                                                 "onnx_default_opset", "onnx_max_opset", "read_seconds")},
          "arch", facts["arch_list"])
    assert facts["torch_version"] == truth["version"]
    assert facts["torch_cuda_version"] == truth["cuda"]
    assert sorted(facts["arch_list"]) == sorted(truth["arch"])
    assert facts["cudnn_version"] == truth["cudnn"], (facts["cudnn_version"], facts.get("cudnn_source"))
    assert facts["onnx_default_opset"] == truth["onnx_default"]
    assert facts["onnx_max_opset"] == truth["onnx_max"]


def test_cuda_settings_warn_on_a_cuda_torch_with_a_gpu(gpu):
    """On a CPU-only torch these settings are a skip note (they change nothing there); on a
    CUDA build with a GPU they serialise every kernel, or leave cuBLAS's workspace unset."""
    _torch_cuda_or_skip()
    rows = _rows(cli("check", "--only", "cuda.runtime,torch.cudnn", "-f", "json", timeout=300,
                     env={"CUDA_LAUNCH_BLOCKING": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096"}))
    for cid in ("cuda.runtime", "torch.cudnn"):
        print(cid, rows[cid]["status"], rows[cid]["summary"])
    assert rows["cuda.runtime"]["status"] == "warn" and "CUDA_LAUNCH_BLOCKING=1" in rows["cuda.runtime"]["summary"]
    assert rows["torch.cudnn"]["status"] == "warn" and "CUBLAS_WORKSPACE_CONFIG" in rows["torch.cudnn"]["summary"]


PINNING_JOB = textwrap.dedent("""
    import os, sys, time
    import envdoctor
    envdoctor.attach(interval=0.5)
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.zeros(64, 1024)), batch_size=8, num_workers=2, pin_memory=True)
    pinned = [batch[0].is_pinned() for batch in loader]
    print("pinned", all(pinned), flush=True)
    for _ in range(600):                    # bounded: at most 60 s
        if os.path.exists(sys.argv[1]):
            break
        time.sleep(0.1)
""")


def test_a_job_that_pins_on_a_gpu_is_told_it_pins_not_that_torch_ignores_it(gpu, tmp_path):
    """With a GPU torch's DataLoader really pins (the batches are page-locked): check --pid
    reports the live pin_memory=True as in effect, not the CPU-only note."""
    _torch_cuda_or_skip()
    stop = tmp_path / "stop"
    job = subprocess.Popen([sys.executable, "-c", PINNING_JOB, str(stop)], stdout=subprocess.PIPE, text=True)
    try:
        line = job.stdout.readline().strip()
        print("job:", line)
        assert line == "pinned True", line
        time.sleep(1.5)  # the hook's next publication names the DataLoader
        row = _rows(cli("check", "--pid", str(job.pid), "--only", "torch.pin_memory", "-f", "json",
                        timeout=300))["torch.pin_memory"]
        print("torch.pin_memory --pid:", row["status"], row["summary"])
        assert row["facts"].get("live_pin_memory") is True, row
        assert "pin memory (pin_memory=True, live)" in row["summary"]
        assert "ignores without a GPU" not in row["summary"] and row["facts"]["gpu_count"] >= 1
    finally:
        stop_job(job, stop)
