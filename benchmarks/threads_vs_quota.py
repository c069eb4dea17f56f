"""Torch matmul throughput inside a CPU-quota cgroup: threads matched to the quota
versus oversubscribed (what an unset OMP_NUM_THREADS or os.cpu_count() gives).

Run as root (it creates and removes a cgroup):

    .venv/bin/python benchmarks/threads_vs_quota.py --cpus 1 --over 16 --reps 5

Each measurement is a fresh worker process: it imports torch, sets its thread count
(torch.set_num_threads and OMP_NUM_THREADS), is moved into the cgroup, then runs
square float32 matmuls for a fixed wall-clock time and reports GFLOP/s. Matched and
oversubscribed runs alternate so drift on the machine hits both alike. It prints
each run, the medians, the ratio, and how often the kernel throttled the group
(cpu.stat nr_throttled / throttled time) under each setting.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path


# ----------------------------------------------------------------------------- worker


def worker(threads: int, seconds: float, size: int, warmup: float) -> None:
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    print("READY", flush=True)
    sys.stdin.readline()  # the parent moves us into the cgroup, then says go
    end_warmup = time.perf_counter() + warmup
    while time.perf_counter() < end_warmup:
        torch.mm(a, b)
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        torch.mm(a, b)
        count += 1
    elapsed = time.perf_counter() - start
    print(f"GFLOPS {2 * size**3 * count / elapsed / 1e9:.4f} threads={torch.get_num_threads()}", flush=True)


# ----------------------------------------------------------------------------- cgroup


class Cgroup:
    """A cgroup with a CPU quota on whichever hierarchy carries the cpu controller."""

    def __init__(self, cpus: float):
        self.name = f"envdoctor-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.path, self.top, self.version = self._create(cpus)

    def _create(self, cpus: float) -> tuple[Path, Path, str]:
        period = 100000
        quota = int(cpus * period)
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(tail) < 3 or fields[3] != "/":
                continue
            top = Path(fields[4])
            if tail[0] == "cgroup" and "cpu" in tail[2].split(","):
                path = top / self.name
                path.mkdir()
                (path / "cpu.cfs_period_us").write_text(str(period))
                (path / "cpu.cfs_quota_us").write_text(str(quota))
                return path, top, "v1"
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if tail and tail[0] == "cgroup2" and fields[3] == "/":
                top = Path(fields[4])
                if "cpu" not in (top / "cgroup.controllers").read_text().split():
                    continue
                if "cpu" not in (top / "cgroup.subtree_control").read_text().split():
                    (top / "cgroup.subtree_control").write_text("+cpu")
                path = top / self.name
                path.mkdir()
                (path / "cpu.max").write_text(f"{quota} {period}")
                return path, top, "v2"
        raise SystemExit("no cgroup hierarchy with the cpu controller is mounted")

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def throttling(self) -> tuple[int, float]:
        """(periods throttled, seconds throttled) so far."""
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines() if line.strip())
        if self.version == "v1":
            return int(stat.get("nr_throttled", 0)), int(stat.get("throttled_time", 0)) / 1e9
        return int(stat.get("nr_throttled", 0)), int(stat.get("throttled_usec", 0)) / 1e6

    def remove(self) -> None:
        for _ in range(200):
            try:
                for pid in (self.path / "cgroup.procs").read_text().split():
                    try:
                        (self.top / "cgroup.procs").write_text(pid)
                    except OSError:
                        pass
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.05)
        print(f"warning: could not remove {self.path}", file=sys.stderr)


# ----------------------------------------------------------------------------- driver


def measure(cgroup: Cgroup, threads: int, args) -> tuple[float, int, float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--threads", str(threads),
           "--seconds", str(args.seconds), "--size", str(args.size), "--warmup", str(args.warmup)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        ready = proc.stdout.readline()
        if not ready.startswith("READY"):
            raise SystemExit(f"worker did not start: {ready!r}")
        cgroup.add(proc.pid)
        before = cgroup.throttling()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        proc.wait(timeout=args.seconds * 20 + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    after = cgroup.throttling()
    if not line.startswith("GFLOPS"):
        raise SystemExit(f"worker failed: {line!r}")
    return float(line.split()[1]), after[0] - before[0], after[1] - before[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpus", type=float, default=1.0, help="CPU quota of the cgroup (default 1)")
    parser.add_argument("--over", type=int, default=16, help="threads in the oversubscribed runs (default 16)")
    parser.add_argument("--matched", type=int, default=0, help="threads in the matched runs (default: the quota, at least 1)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured wall time per run")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--size", type=int, default=512, help="matrix side (float32)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.threads, args.seconds, args.size, args.warmup)
        return
    if os.geteuid() != 0:
        raise SystemExit("run as root: the benchmark creates a cgroup")

    matched = args.matched or max(1, math.floor(args.cpus))
    cgroup = Cgroup(args.cpus)
    print(f"cgroup {cgroup.version} {cgroup.path}: quota {args.cpus:g} CPUs; host {os.cpu_count()} CPUs; "
          f"affinity {len(os.sched_getaffinity(0))}; {args.size}x{args.size} float32 matmul, "
          f"{args.reps} reps x {args.seconds:g} s")
    results: dict[int, list[tuple[float, int, float]]] = {matched: [], args.over: []}
    try:
        for rep in range(args.reps):
            for threads in (matched, args.over):
                gflops, periods, throttled = measure(cgroup, threads, args)
                results[threads].append((gflops, periods, throttled))
                print(f"  rep {rep + 1}: {threads:3d} threads  {gflops:8.3f} GFLOP/s  "
                      f"throttled {periods:4d} periods, {throttled:6.2f} s")
    finally:
        cgroup.remove()

    med = {t: statistics.median(r[0] for r in rs) for t, rs in results.items()}
    thr = {t: statistics.median(r[2] for r in rs) for t, rs in results.items()}
    print(f"median matched ({matched} threads):       {med[matched]:8.3f} GFLOP/s, throttled {thr[matched]:.2f} s/run")
    print(f"median oversubscribed ({args.over} threads): {med[args.over]:8.3f} GFLOP/s, throttled {thr[args.over]:.2f} s/run")
    print(f"ratio matched / oversubscribed: {med[matched] / med[args.over]:.2f}x")


if __name__ == "__main__":
    main()
