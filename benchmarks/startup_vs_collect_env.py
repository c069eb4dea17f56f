#!/usr/bin/env python3
"""How long `envdoctor check` takes next to `python -m torch.utils.collect_env`.

collect_env is what people run today to see their torch/CUDA setup; it imports
torch (seconds). envdoctor never imports torch in its own process: its torch
facts come from a probe subprocess, cached per interpreter and torch install. So:

  cold  the probe cache is empty (a fresh XDG_CACHE_HOME each run): envdoctor
        pays for one `import torch` in the probe, alongside its other checks;
        target <= 0.9x collect_env.
  warm  the cache is primed: no interpreter is started for torch at all;
        target <= 0.1x collect_env.

The three commands run interleaved, round after round, so drift in the machine's
load or disk cache hits all of them alike; the medians are compared. Output goes
to /dev/null (`--format json` for envdoctor). Exit status 0 when both targets are
met, 1 when not (the numbers are printed either way).

    python benchmarks/startup_vs_collect_env.py [--rounds 7] [--json] [-- EXTRA envdoctor ARGS]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COLD_TARGET = 0.9
WARM_TARGET = 0.1


def envdoctor_command(python: str) -> list[str]:
    script = Path(python).parent / "envdoctor"
    if script.exists():
        return [str(script)]
    return [python, "-m", "envdoctor"]


def timed(cmd: list[str], env: dict[str, str], ok_codes: tuple[int, ...]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    if proc.returncode not in ok_codes:
        tail = proc.stderr.decode("utf-8", "replace")[-800:]
        raise SystemExit(f"{' '.join(cmd)} exited with {proc.returncode}: {tail}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch and envdoctor (default: this one)")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    parser.add_argument("extra", nargs="*", help="extra arguments for `envdoctor check` (after --)")
    args = parser.parse_args(argv)

    base_env = {k: v for k, v in os.environ.items() if k not in ("ENVDOCTOR_NO_CACHE", "XDG_CACHE_HOME")}
    base_env["PYTHONWARNINGS"] = "ignore"  # collect_env's runpy warning is not part of the measurement
    collect = [args.python, "-m", "torch.utils.collect_env"]
    check = envdoctor_command(args.python) + ["check", "--format", "json", *args.extra]
    ok_check = (0, 1)  # 1: some check found a problem here; the run itself worked

    work = Path(tempfile.mkdtemp(prefix="envdoctor-bench-"))
    try:
        warm_env = dict(base_env, XDG_CACHE_HOME=str(work / "warm"))
        timed(check, warm_env, ok_check)  # prime the warm cache (and the OS page cache for everyone)
        timed(collect, base_env, (0,))
        times: dict[str, list[float]] = {"collect_env": [], "cold": [], "warm": []}
        for i in range(args.rounds):
            cold_dir = work / f"cold-{i}"
            times["collect_env"].append(timed(collect, base_env, (0,)))
            times["cold"].append(timed(check, dict(base_env, XDG_CACHE_HOME=str(cold_dir)), ok_check))
            times["warm"].append(timed(check, warm_env, ok_check))
            shutil.rmtree(cold_dir, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {name: statistics.median(values) for name, values in times.items()}
    cold_ratio = med["cold"] / med["collect_env"]
    warm_ratio = med["warm"] / med["collect_env"]
    cold_ok, warm_ok = cold_ratio <= COLD_TARGET, warm_ratio <= WARM_TARGET
    print(f"rounds: {args.rounds} (interleaved), medians in seconds")
    print(f"  python -m torch.utils.collect_env     {med['collect_env']:7.3f}")
    print(f"  envdoctor check, cold probe cache     {med['cold']:7.3f}   {cold_ratio:5.2f}x   target <= {COLD_TARGET}x  "
          + ("met" if cold_ok else "MISSED"))
    print(f"  envdoctor check, warm probe cache     {med['warm']:7.3f}   {warm_ratio:5.2f}x   target <= {WARM_TARGET}x  "
          + ("met" if warm_ok else "MISSED"))
    if args.json:
        print(json.dumps({"medians_seconds": med, "samples_seconds": times, "cold_ratio": cold_ratio,
                          "warm_ratio": warm_ratio, "cold_target": COLD_TARGET, "warm_target": WARM_TARGET,
                          "command": check}))
    return 0 if cold_ok and warm_ok else 1


if __name__ == "__main__":
    sys.exit(main())
