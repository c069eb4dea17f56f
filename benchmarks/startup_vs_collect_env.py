#!/usr/bin/env python3
"""How long `envdoctor check` takes next to `python -m torch.utils.collect_env`.

collect_env is what people run today to see their torch/CUDA setup; it imports
torch (seconds). envdoctor never imports torch: its torch facts are read from
torch's files (version.py, dist-info, the arch string in libtorch_python.so). So:

  cold  caches off (ENVDOCTOR_NO_CACHE=1 and a fresh XDG_CACHE_HOME each run):
        onnx and onnxruntime are imported for their limits; target <= 0.2x.
  warm  the cache is primed (onnx's limits come from it); target <= 0.05x.

Python bytecode: where PYTHONDONTWRITEBYTECODE is set (this workplace sets it),
an editable envdoctor would recompile its own modules on every start, which no
installed copy does (pip compiles at install time, as it did for torch). The
variable is dropped for all three commands and one priming run writes the
bytecode, so what is timed is what a user's install runs. --keep-bytecode-env
times it as set.

--importtime prints where one warm envdoctor start spends its time
(`python -X importtime`, the slowest imports by cumulative time).

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

from install_kind import editable_note

COLD_TARGET = 0.2
WARM_TARGET = 0.05


def envdoctor_command(python: str) -> list[str]:
    # The console script beside the interpreter (a bare "python3" is looked up on PATH first: its
    # parent "." would find the repository's envdoctor/ package directory instead).
    script = Path(shutil.which(python) or python).parent / "envdoctor"
    if script.is_file():
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


def importtime(python: str, args: list[str], env: dict[str, str], top: int = 15) -> list[tuple[float, str]]:
    """The slowest top-level imports of one warm `python -m envdoctor ARGS` run, by cumulative ms
    (run twice: `-m` has its own entry-point cache entry, primed by the first run)."""
    for _ in range(2):
        proc = subprocess.run([python, "-X", "importtime", "-m", "envdoctor", *args], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, env=env, stdin=subprocess.DEVNULL)
    rows = []
    for line in proc.stderr.decode("utf-8", "replace").splitlines():
        parts = line.split("|")
        if line.startswith("import time:") and len(parts) == 3 and parts[1].strip().isdigit():
            name = parts[2]
            if len(name) - len(name.lstrip()) <= 1:  # top level only: nested ones are inside these
                rows.append((int(parts[1]) / 1000, name.strip()))
    return sorted(rows, reverse=True)[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch and envdoctor (default: this one)")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON object")
    parser.add_argument("--keep-bytecode-env", action="store_true",
                        help="keep PYTHONDONTWRITEBYTECODE as set (modules recompiled on every start)")
    parser.add_argument("--importtime", action="store_true", help="also show the slowest imports of one warm start")
    parser.add_argument("--import-torch", action="store_true",
                        help="also time `python -c 'import torch'` (for scale; not part of the ratios)")
    parser.add_argument("extra", nargs="*", help="extra arguments for `envdoctor check` (after --)")
    args = parser.parse_args(argv)

    dropped = ("ENVDOCTOR_NO_CACHE", "XDG_CACHE_HOME") + (() if args.keep_bytecode_env else ("PYTHONDONTWRITEBYTECODE",))
    base_env = {k: v for k, v in os.environ.items() if k not in dropped}
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
        if args.import_torch:
            times["import_torch"] = []
        for i in range(args.rounds):
            cold_dir = work / f"cold-{i}"
            times["collect_env"].append(timed(collect, base_env, (0,)))
            times["cold"].append(timed(check, dict(base_env, XDG_CACHE_HOME=str(cold_dir), ENVDOCTOR_NO_CACHE="1"), ok_check))
            times["warm"].append(timed(check, warm_env, ok_check))
            if args.import_torch:
                times["import_torch"].append(timed([args.python, "-c", "import torch"], base_env, (0,)))
            shutil.rmtree(cold_dir, ignore_errors=True)
        slowest = importtime(args.python, ["check", "--format", "json", *args.extra], warm_env) if args.importtime else []
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {name: statistics.median(values) for name, values in times.items()}
    cold_ratio = med["cold"] / med["collect_env"]
    warm_ratio = med["warm"] / med["collect_env"]
    cold_ok, warm_ok = cold_ratio <= COLD_TARGET, warm_ratio <= WARM_TARGET
    print(f"rounds: {args.rounds} (interleaved), medians in seconds")
    note = editable_note(args.python)
    if note:
        print(note)
    print(f"  python -m torch.utils.collect_env     {med['collect_env']:7.3f}")
    print(f"  envdoctor check, cold (caches off)    {med['cold']:7.3f}   {cold_ratio:5.2f}x   target <= {COLD_TARGET}x  "
          + ("met" if cold_ok else "MISSED"))
    print(f"  envdoctor check, warm cache           {med['warm']:7.3f}   {warm_ratio:5.2f}x   target <= {WARM_TARGET}x  "
          + ("met" if warm_ok else "MISSED"))
    if "import_torch" in med:
        print(f"  python -c 'import torch' (for scale) {med['import_torch']:7.3f}")
    if slowest:
        print("slowest imports of one warm start (cumulative ms, python -X importtime):")
        for ms, name in slowest:
            print(f"  {ms:7.1f}  {name}")
    if args.json:
        print(json.dumps({"medians_seconds": med, "samples_seconds": times, "cold_ratio": cold_ratio,
                          "warm_ratio": warm_ratio, "cold_target": COLD_TARGET, "warm_target": WARM_TARGET,
                          "command": check}))
    return 0 if cold_ok and warm_ok else 1


if __name__ == "__main__":
    sys.exit(main())
