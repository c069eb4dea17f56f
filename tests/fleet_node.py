"""One simulated GPU node for the fleet tests and benchmarks/fleet_simulation.py.

Run as root inside `unshare --pid --fork --mount-proc --mount` (tests/fleet.py does),
so that this node has its own process table and its own /dev/shm, as a real node
has. It then:
1. mounts a tmpfs of the planted size on /dev/shm (Docker's 64m is a planted fault);
2. starts the node's workload processes: `sleep` run under the name `train` (so
   serve's `select_comm = ["train*"]` finds them) with the planted environment
   (OMP_NUM_THREADS=64, CUDA_VISIBLE_DEVICES=0,x, ...);
3. hands envdoctor's NVML facade this node's GPUs (tests/fake_pynvml.py: the only
   fake; everything else is real), the workloads listed as GPU processes;
4. runs the real `envdoctor serve` in a child process, on 127.0.0.1:0 (pid 1 of the
   node stays the workloads' parent: serve never examines its own children).

It prints one line `FLEET_NODE {"workloads": [pid, ...]}` (pids as this node sees
them, which is what serve's pid:N labels carry) before serving, and stops itself
after --deadline seconds whatever happens to its parent.

Spec (JSON, argument 1): {"shm": "1g", "gpus": [{FakeDevice kwargs}],
"workloads": [{"env": {...}, "gpu": 0}], "serve_args": [...]}.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GIB = 1024**3


# A workload that leaks host memory at a steady rate ({"leak_mib_per_second": N}), up to a cap,
# as a training loop that keeps every step's graph does: memory.cache_growth's case.
LEAK = """
import sys, time
rate, cap, keep = float(sys.argv[1]), int(sys.argv[2]), []
while len(keep) * 4 < cap:
    block = bytearray(4 << 20)
    block[::4096] = b"x" * len(block[::4096])
    keep.append(block)
    time.sleep(4 / rate)
time.sleep(3600)
"""


def _start_workloads(spec: dict, workdir: Path, deadline: float) -> list[int]:
    train = workdir / "train"
    if not train.exists():
        train.symlink_to(subprocess.run(["sh", "-c", "command -v sleep"], capture_output=True, text=True).stdout.strip())
    leaky = workdir / "train-leaky"  # comm "train-leaky": serve's select_comm finds it too
    if not leaky.exists():
        leaky.symlink_to(sys.executable)
    pids = []
    for workload in spec.get("workloads", []):
        env = {"PATH": "/usr/bin:/bin", **workload.get("env", {})}
        rate = workload.get("leak_mib_per_second")
        argv = ([str(leaky), "-c", LEAK, str(rate), str(int(rate * (deadline + 5)))] if rate
                else [str(train), str(int(deadline) + 5)])
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
        pids.append(proc.pid)
    return pids


def _fake_nvml(spec: dict, pids: list[int]):
    import fake_pynvml

    gpus = [dict(g) for g in spec.get("gpus", [])]
    for workload, pid in zip(spec.get("workloads", []), pids):
        if workload.get("gpu") is not None:
            gpus[workload["gpu"]].setdefault("processes", []).append((pid, 2 * GIB))
    for gpu in gpus:
        gpu["processes"] = [tuple(p) for p in gpu.get("processes", [])]
    devices = [fake_pynvml.FakeDevice(**g) for g in gpus]
    if not devices:
        return fake_pynvml.FakeNvml(no_library=True)
    return fake_pynvml.FakeNvml(devices=devices, driver="550.54.15", cuda=12040)


def _init(spec: dict, deadline: float, workdir: Path) -> int:
    """pid 1 of the node: /dev/shm, the workloads (its children, not serve's: serve
    never examines its own children), then serve as a child it stops at the deadline."""
    workdir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={spec.get('shm', '1g')}", "fleet-shm", "/dev/shm"], check=True)
    pids = _start_workloads(spec, workdir, deadline)
    print("FLEET_NODE " + json.dumps({"workloads": pids}), flush=True)
    serve = subprocess.Popen([sys.executable, __file__, "--serve", json.dumps(spec), json.dumps(pids)])
    stop = lambda *_: serve.poll() is None and serve.terminate()  # noqa: E731
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    timer = threading.Timer(deadline, stop)
    timer.daemon = True
    timer.start()
    code = serve.wait()
    try:
        serve.wait(timeout=10)
    except subprocess.TimeoutExpired:
        serve.kill()
    return code


def _serve(spec: dict, pids: list[int]) -> int:
    import envdoctor.nvml

    fake = _fake_nvml(spec, pids)
    envdoctor.nvml.connect = functools.partial(envdoctor.nvml.connect, lib=fake)
    from envdoctor.cli import main as cli_main

    sys.argv = ["envdoctor", "serve", "--web.listen-address", "127.0.0.1:0", *spec.get("serve_args", [])]
    try:
        cli_main()
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        fake.release()
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        sys.exit(_serve(json.loads(sys.argv[2]), json.loads(sys.argv[3])))
    sys.exit(_init(json.loads(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])))
