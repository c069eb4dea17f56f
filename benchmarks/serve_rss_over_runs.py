"""serve's RSS as its runs add up, in one process: where the steady figure comes from.

    .venv/bin/python benchmarks/serve_rss_over_runs.py [--targets 64] [--runs 760] [--every 100] [--history 720]

Starts N `sleep` processes (not this process's children: serve never examines its own)
tagged with an environment variable that a `[serve] select_env` config selects, builds the daemon as `envdoctor serve` does (its malloc
settings included; no HTTP server, no CLI), and makes `--runs` runs back to back, each
followed by the daemon's end-of-run collection, printing VmRSS and RssAnon every
`--every` runs. Each process's memory history fills in `--history` runs (720 by
default, the daemon's: three hours at 15 s), so the last lines are the steady state
that the issue's RSS line is about, reached in about a minute instead of three hours.
`--history 8` keeps histories short, which tells what a full history costs.
Interpreter options apply as usual: `PYTHONOPTIMIZE=2` compares bytecode without
docstrings and asserts. RSS is noisy run to run by ~0.3 MiB: compare medians.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path


def rss_line() -> str:
    fields = {line.split(":")[0]: int(line.split()[1]) for line in open("/proc/self/status")
              if line.startswith(("VmRSS:", "RssAnon:"))}
    return f"VmRSS {fields['VmRSS'] / 1024:5.1f} MiB  RssAnon {fields['RssAnon'] / 1024:5.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)  # None under -OO
    parser.add_argument("--targets", type=int, default=64)
    parser.add_argument("--runs", type=int, default=760)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--history", type=int, default=720, help="samples kept per process (the daemon keeps 720)")
    args = parser.parse_args()

    tag = f"ENVDOCTOR_RSS_RUNS_{os.getpid()}"
    tmp = Path(tempfile.mkdtemp(prefix="envdoctor-rss-runs-"))
    (tmp / "envdoctor.toml").write_text(f'[serve]\nmax_targets = {args.targets + 8}\nselect_env = ["{tag}"]\n')
    marker = f"{3600 + os.getpid() % 1000}"  # a sleep length that names our sleepers for the cleanup
    # started by a shell that exits at once: the sleepers are reparented, not our children
    subprocess.run(["sh", "-c", f"for i in $(seq {args.targets}); do sleep {shlex.quote(marker)} & done"],
                   env={**os.environ, tag: "1"}, check=True)
    try:
        from envdoctor import log
        from envdoctor.memsample import MemoryHistory
        from envdoctor.serve import Daemon, Options, malloc

        malloc.limit_arenas()  # as Daemon.run does before its first run
        malloc.map_large_blocks_apart()
        log.configure("info", open(os.devnull, "w"))  # made as the daemon makes them, not shown
        scheduler = Daemon(Options(once=True, config_file=str(tmp / "envdoctor.toml"))).scheduler
        if args.history != scheduler.history.maxlen:
            scheduler.history = MemoryHistory(maxlen=args.history)
        print(f"{args.targets} sleepers + node, history {args.history}, {args.runs} runs back to back")
        print(f"  built    {rss_line()}")
        for run in range(1, args.runs + 1):
            scheduler.run_once()
            scheduler.collect_garbage()
            if run % args.every == 0 or run == args.runs:
                print(f"  run {run:4d} {rss_line()}", flush=True)
    finally:
        subprocess.run(["pkill", "-f", f"^sleep {marker}$"])
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()


if __name__ == "__main__":
    main()
