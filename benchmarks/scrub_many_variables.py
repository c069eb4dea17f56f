"""What redaction costs when a process holds many variables, and what one such process costs serve.

    .venv/bin/python benchmarks/scrub_many_variables.py [--variables 70000] [--rounds 3]

Every value of an unknown or secret-named variable is masked wherever it appears in
what envdoctor shows of that process, in each of its spellings. helper-70 started one
process with 70,000 variables and every serve run took seconds; helper-72 fed the
scrubber random text that held thousands of the values' first characters. Printed:

- `envdoctor serve --once` over the node and one `sleep` holding `--variables`
  variables (selected by `[serve] select_env`), against the same with a `sleep` of
  this shell's environment: median wall seconds and peak RSS;
- scrubbing a 1 MB training log and 400 KB of base64 with N random 12-character
  values (N from a few to 100,000): median seconds of `--rounds`.
Figures vary with the machine's load; compare runs of two versions in one sitting.
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import statistics
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _value(rng: random.Random, n: int = 12) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n))


def _median_seconds(action, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def scrub_costs(rounds: int) -> None:
    from envdoctor import redact  # here: serve_once_costs runs first, from a small process (see there)

    rng = random.Random(5)
    log = "step 1234 loss=0.2345 lr=0.0001 grad_norm=1.23 throughput 123.4 samples/s\n" * 14000
    blob = base64.b64encode(random.Random(6).randbytes(300_000)).decode()
    print(f"scrubbing ({rounds} rounds, median): {len(log) / 1e6:.2f} MB of log, {len(blob) / 1e3:.0f} KB of base64")
    for count in (8, 64, 256, 5000, 100_000):
        scrubber = redact.Scrubber(redact.secret_values([{f"APP_{i}": _value(rng) for i in range(count)}]))
        scrubber.text("warm up")
        print(f"  {count:>7} values: log {_median_seconds(lambda: scrubber.text(log), rounds):6.3f} s, "
              f"base64 {_median_seconds(lambda: scrubber.text(blob), rounds):6.3f} s")


def serve_once_costs(variables: int, rounds: int) -> None:
    tag = f"ENVDOCTOR_BENCH_{os.getpid()}"
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as work:
        config = Path(work) / "envdoctor.toml"
        config.write_text(f'[serve]\nselect_env = ["{tag}"]\n')
        for label, extra in (("this shell's environment", {}),
                             (f"{variables} variables", {f"U{i:05d}": _value(rng) for i in range(variables)})):
            target = subprocess.Popen(["sleep", "600"], env={**os.environ, tag: "1", **extra})
            try:
                times, peaks = [], []
                for _ in range(rounds):
                    started = time.perf_counter()
                    serve = subprocess.Popen([sys.executable, "-m", "envdoctor", "serve", "--once", "--config", str(config)],
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    # its own peak RSS (and its children's). A child started by vfork counts the parent's
                    # pages as its own until it execs: so this runs before anything grows this process
                    _, status, usage = os.wait4(serve.pid, 0)
                    serve.returncode = os.waitstatus_to_exitcode(status)
                    times.append(time.perf_counter() - started)
                    peaks.append(usage.ru_maxrss / 1024)
                    if serve.returncode != 0:
                        raise SystemExit(f"serve --once exited {serve.returncode}")
            finally:
                target.kill()
                target.wait()
            print(f"serve --once over the node and one sleep with {label}: {statistics.median(times):.2f} s, "
                  f"peak RSS {statistics.median(peaks):.0f} MiB (medians of {rounds})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variables", type=int, default=70_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    serve_once_costs(args.variables, args.rounds)
    scrub_costs(args.rounds)


if __name__ == "__main__":
    main()
