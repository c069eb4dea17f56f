"""What this machine charges a fixed piece of work for starting cold: its CPU back to back
and after sleeping as long as serve does between runs.

    .venv/bin/python benchmarks/cold_start_reference.py [--pauses 0 1 15] [--repeats 7]

serve's runs cost more at the daemon's pace than back to back. On the 2-CPU virtual
machine these figures come from, a fixed workload that has nothing to do with
envdoctor (building and JSON-encoding a dict; reading every process's /proc/N/stat)
costs three to sixteen times its warm CPU when it starts after the CPU has been idle
for 15 s: the host had the CPU's caches, TLB and branch predictors for others. This
prints that machine effect beside the figure it inflates (serve_run_cpu.py
--reference), so that a run's cost at 15 s can be read against the same machine's
penalty for any work, not mistaken for serve's own.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import time


def cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def python_work() -> int:
    """Pure interpreter work, ~20 ms warm: dicts, lists, strings and a JSON encoding."""
    table = {str(i): [i, i * 2, {"k": i}] for i in range(15_000)}
    return len(json.dumps(table))


def procfs_work() -> int:
    """Kernel work as serve's discovery does it: every process's /proc/N/stat, read whole."""
    total = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb", buffering=0) as f:
                    total += len(f.read())
            except OSError:
                pass
    return total


WORKLOADS = {"python": python_work, "procfs": procfs_work}


def measure(work, pause: float, repeats: int) -> float:
    """Median CPU seconds of `work`, each time after sleeping `pause` seconds."""
    spent = []
    for _ in range(repeats):
        if pause > 0:
            time.sleep(pause)
        start = cpu_now()
        work()
        spent.append(cpu_now() - start)
    return statistics.median(spent)


def penalties(pause: float, repeats: int = 7) -> dict[str, tuple[float, float]]:
    """{workload: (warm ms, ms after `pause` s idle)}; warm is measured back to back."""
    out = {}
    for name, work in WORKLOADS.items():
        work()  # its first time pays for imports and caches once
        out[name] = (measure(work, 0.0, repeats) * 1000, measure(work, pause, repeats) * 1000)
    return out


def describe(pause: float, found: dict[str, tuple[float, float]]) -> str:
    return "; ".join(f"{name} {warm:.1f} ms back to back, {cold:.1f} ms after {pause:g} s idle ({cold / warm:.1f}x)"
                     for name, (warm, cold) in found.items())


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds, 0 or more."""
    value = float(text)
    if not math.isfinite(value) or value < 0 or value > 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a pause of 0 to 3600 seconds")
    return value


def count(text: str) -> int:
    """An argparse type: a whole number, 1 or more."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count of 1 or more")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--pauses", type=seconds, nargs="+", default=[1.0, 15.0],
                        help="idle pauses to measure after, in seconds (each workload is also timed back to back)")
    parser.add_argument("--repeats", type=count, default=7, help="times each workload runs per pause; the median is shown")
    args = parser.parse_args()
    for pause in args.pauses:
        print(f"reference work: {describe(pause, penalties(pause, args.repeats))}", flush=True)


if __name__ == "__main__":
    main()
