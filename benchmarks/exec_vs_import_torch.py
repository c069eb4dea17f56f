#!/usr/bin/env python3
"""What `envdoctor exec -- true` adds to a container start, next to `import torch`.

`envdoctor exec` runs on every start of a training container, before the job. What
it adds is `envdoctor exec -- true` less `true` alone, compared with what the job
pays anyway for `python -c "import torch"` in the same venv:

  cold  ENVDOCTOR_NO_CACHE=1: no torch-probe cache, so the torch facts cost one
        `import torch` in the probe; target: adds <= 0.15x import torch.
  warm  the probe cache is primed (a fresh XDG_CACHE_HOME, filled once);
        target: adds <= 0.05x import torch.

Two more rows say where the time goes (not targets):
  floor        `envdoctor --version`: the interpreter and the CLI's imports, the
               least any `envdoctor` command costs;
  cold, no torch checks   cold, with --skip cuda.runtime,torch.cudnn: everything but
               the torch probe.

All commands run interleaved, round after round, so drift in the machine's load
or disk cache hits all of them alike; the medians are compared. Exit status 0 when
both targets are met, 1 when not (the numbers are printed either way).

    python benchmarks/exec_vs_import_torch.py [--rounds 9] [--json]
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

from install_kind import editable_note

COLD_TARGET = 0.15
WARM_TARGET = 0.05


def envdoctor_command(python: str) -> list[str]:
    # The console script beside the interpreter (a bare "python3" is looked up on PATH first: its
    # parent "." would find the repository's envdoctor/ package directory instead).
    script = Path(shutil.which(python) or python).parent / "envdoctor"
    if script.is_file():
        return [str(script)]
    return [python, "-m", "envdoctor"]


def timed(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", "replace")[-800:]
        raise SystemExit(f"{' '.join(cmd)} exited with {proc.returncode}: {tail}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch and envdoctor (default: this one)")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    args = parser.parse_args(argv)

    true = shutil.which("true") or "/bin/true"
    base_env = {k: v for k, v in os.environ.items() if k not in ("ENVDOCTOR_NO_CACHE", "XDG_CACHE_HOME", "ENVDOCTOR_CONFIG")}
    envdoctor = envdoctor_command(args.python)
    commands = {
        "import torch": ([args.python, "-c", "import torch"], base_env),
        "true": ([true], base_env),
        "floor": ([*envdoctor, "--version"], base_env),
        "cold": ([*envdoctor, "exec", "--", true], dict(base_env, ENVDOCTOR_NO_CACHE="1")),
        "cold, no torch checks": ([*envdoctor, "exec", "--skip", "cuda.runtime,torch.cudnn", "--", true],
                                  dict(base_env, ENVDOCTOR_NO_CACHE="1")),
    }
    work = Path(tempfile.mkdtemp(prefix="envdoctor-bench-exec-"))
    try:
        commands["warm"] = ([*envdoctor, "exec", "--", true], dict(base_env, XDG_CACHE_HOME=str(work)))
        for cmd, env in commands.values():  # prime the warm cache and the OS page cache for everyone
            timed(cmd, env)
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.rounds):
            for name, (cmd, env) in commands.items():
                times[name].append(timed(cmd, env))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {name: statistics.median(values) for name, values in times.items()}
    torch = med["import torch"]
    added = {name: med[name] - med["true"] for name in ("floor", "cold", "cold, no torch checks", "warm")}
    ratio = {name: value / torch for name, value in added.items()}
    cold_ok, warm_ok = ratio["cold"] <= COLD_TARGET, ratio["warm"] <= WARM_TARGET
    print(f"rounds: {args.rounds} (interleaved), medians in seconds; 'adds' = less `true` alone")
    note = editable_note(args.python)
    if note:
        print(note)
    print(f"  python -c 'import torch'                      {torch:7.3f}")
    print(f"  true                                          {med['true']:7.3f}")
    print(f"  envdoctor exec -- true, cold (NO_CACHE)  adds {added['cold']:7.3f}  {ratio['cold']:5.2f}x  "
          f"target <= {COLD_TARGET}x  " + ("met" if cold_ok else "MISSED"))
    print(f"  envdoctor exec -- true, warm             adds {added['warm']:7.3f}  {ratio['warm']:5.2f}x  "
          f"target <= {WARM_TARGET}x  " + ("met" if warm_ok else "MISSED"))
    print(f"  where it goes: envdoctor --version       adds {added['floor']:7.3f}  {ratio['floor']:5.2f}x  "
          "(interpreter + CLI imports)")
    print(f"  where it goes: cold, no torch checks     adds {added['cold, no torch checks']:7.3f}  "
          f"{ratio['cold, no torch checks']:5.2f}x  (all but the torch probe)")
    if args.json:
        print(json.dumps({"medians_seconds": med, "samples_seconds": times, "added_seconds": added, "ratios": ratio,
                          "cold_target": COLD_TARGET, "warm_target": WARM_TARGET,
                          "commands": {name: cmd for name, (cmd, _) in commands.items()}}))
    return 0 if cold_ok and warm_ok else 1


if __name__ == "__main__":
    sys.exit(main())
