"""CPU one `envdoctor serve` run costs over N target processes, measured in-process.

    .venv/bin/python benchmarks/serve_run_cpu.py [--targets 64] [--runs 20] [--rounds 3]

Starts N `sleep` processes (not our children: serve never examines its own) tagged
with an environment variable that a `[serve] select_env` config selects, builds the
daemon as `envdoctor serve --once` does, warms it with two runs, then times
`--runs` scheduler runs with getrusage (user + system CPU of this process, every
thread) and prints the median per run over `--rounds`, and what it means at a 15 s
interval in percent of one core (the issue's target: 0.5 %).

serve_vs_node_exporter.py measures the same from outside (the daemon's
/proc/PID/stat over an idle window); this one is quicker and runs the profile-able
code path, for comparing two versions of the code on one machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=64)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval", type=float, default=15.0)
    args = parser.parse_args()

    tag = f"ENVDOCTOR_RUNCPU_{os.getpid()}"
    tmp = Path(tempfile.mkdtemp(prefix="envdoctor-runcpu-"))
    config = tmp / "envdoctor.toml"
    config.write_text(f'[serve]\nmax_targets = {args.targets + 8}\nselect_env = ["{tag}"]\n')
    marker = f"{3600 + os.getpid() % 1000}"  # a sleep length that names our sleepers for the cleanup
    # started by a shell that exits at once: the sleepers are reparented, not our children
    subprocess.run(["sh", "-c", f"for i in $(seq {args.targets}); do sleep {marker} & done"],
                   env={**os.environ, tag: "1"}, check=True)
    try:
        from envdoctor.serve import Daemon, Options

        scheduler = Daemon(Options(once=True, config_file=str(config))).scheduler
        scheduler.run_once()
        scheduler.run_once()
        per_run = []
        for _ in range(args.rounds):
            c0, t0 = cpu_now(), time.perf_counter()
            for _ in range(args.runs):
                scheduler.run_once()
            per_run.append(((cpu_now() - c0) / args.runs, (time.perf_counter() - t0) / args.runs))
        cpu = statistics.median(c for c, _ in per_run)
        wall = statistics.median(w for _, w in per_run)
        print(f"{args.targets} targets + node: CPU {cpu * 1000:.1f} ms per run (rounds: "
              f"{', '.join(f'{c * 1000:.1f}' for c, _ in per_run)}), wall {wall * 1000:.1f} ms; "
              f"at a {args.interval:g} s interval {cpu / args.interval * 100:.2f} % of one core")
    finally:
        subprocess.run(["pkill", "-f", f"^sleep {marker}$"])


if __name__ == "__main__":
    main()
