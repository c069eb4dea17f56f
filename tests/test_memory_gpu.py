"""On a real NVIDIA GPU: the seed pitfall on CUDA, seen from outside.

Marked `gpu` (scripts/gpu-test.sh runs it; elsewhere it skips with the reason). An
attached job keeps every step's graph on the GPU (`total_loss += loss`); `envdoctor
check --pid N --window 12` must see the caching allocator's allocated bytes climb
(from the published document: attach reads them once the script initialised CUDA)
and, where NVML can attribute memory to the process (not in a container with its own
PID namespace), the per-process GPU memory too; the figures are printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import cli

pytestmark = pytest.mark.gpu

JOB = textwrap.dedent("""
    import time, torch, envdoctor
    envdoctor.attach(interval=1.0)
    w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    total_loss = 0
    print("ready", flush=True)
    for step in range(300):                      # bounded: ~60 s, ~10 GB at most
        x = torch.randn(4096, 1024, device="cuda")
        loss = (x @ w).relu().sum()              # saves 32 MiB of activations for backward
        total_loss += loss                       # the pitfall: every step's graph is kept
        torch.cuda.synchronize()
        time.sleep(0.2)
""")


def test_a_cuda_graph_leak_is_seen_in_the_allocator_and_gets_an_eta(tmp_path):
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=300)
    if probe.returncode != 0 or probe.stdout.strip() != "True":
        pytest.skip(f"no CUDA torch in {sys.executable}: {probe.stdout.strip()} {probe.stderr[-200:]}")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    job = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dict(os.environ))
    try:
        assert job.stdout.readline().strip() == "ready", job.stderr.read() if job.poll() is not None else ""
        proc = cli("check", "--pid", str(job.pid), "--only", "memory.cache_growth", "--window", "12",
                   "-f", "json", timeout=180)
    finally:
        job.kill()
        job.wait()
    row = json.loads(proc.stdout)["results"][0]
    facts = row["facts"]
    print(json.dumps({"status": row["status"], "summary": row["summary"],
                      "growth": facts["growth_bytes_per_second"], "eta": facts["exhaustion_eta_seconds"],
                      "notes": facts.get("notes")}, indent=1))
    assert row["status"] in ("warn", "fail"), row
    assert facts["growth_bytes_per_second"].get("cuda0_allocated", 0) > 10 * 1024**2
    assert facts["exhaustion_eta_seconds"].get("cuda0_allocated", 0) > 0
    assert "CUDA caching allocator allocated on device 0" in row["summary"]
    assert "loss.item()" in row["remediation"]
    if "gpu0" in facts["growth_bytes_per_second"]:  # NVML could attribute memory to the pid
        assert facts["growth_bytes_per_second"]["gpu0"] > 10 * 1024**2
