"""Precision and recall of envdoctor's leak detector over a generated corpus, and its cost.

Run: python benchmarks/leak_detector.py [--series 2000] [--seed 1]

The corpus holds the shapes a training job's memory takes, labelled by what they
are, not by what the detector says:
  leaks (positive): a straight climb; a climb under noise; a climb under a sawtooth
      whose troughs rise (a cache that is freed only in part); a climb with spikes;
  not leaks (negative): a steady level; steady with noise; steady with rare spikes;
      a sawtooth (allocate, free back to the same level); a step at a random point
      then a plateau; a climb that stopped in the first half of the window (warm-up).
Each series is 20-120 s of samples every 0.5-2 s, in bytes, with the leak's rise
over the window between 1.5x and 20x the detector's minimum rise. Noise is
Gaussian with a standard deviation up to the leak's total rise.

Prints precision, recall and the confusion counts per shape, then the cost of one
judgement (the check runs one per memory per run) and of one sample appended to a
bounded history (what serve pays every interval per target and memory).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from envdoctor import trend  # noqa: E402
from envdoctor.memsample import MemoryHistory, Sample  # noqa: E402

MIB = 1024**2
MIN_RISE = 32 * MIB
MIN_WINDOW = 10.0


def _times(rng: random.Random) -> list[float]:
    window = rng.uniform(20, 120)
    step = rng.uniform(0.5, 2.0)
    n = int(window / step) + 1
    return [i * step + rng.uniform(-0.05, 0.05) * step for i in range(n)]


def generate(rng: random.Random, kind: str) -> tuple[list[float], list[float]]:
    ts = _times(rng)
    window = ts[-1] - ts[0]
    base = rng.uniform(200, 4000) * MIB
    total = rng.uniform(1.5, 20) * MIN_RISE  # what a leak adds over the window
    slope = total / window
    noise = rng.uniform(0.05, 1.0) * total
    ys: list[float] = []
    period = rng.uniform(window / 12, window / 3)
    amplitude = rng.uniform(0.5, 3.0) * total
    step_at = rng.uniform(0.05, 0.95) * window
    stop_at = rng.uniform(0.2, 0.5) * window
    for t in ts:
        if kind == "leak":
            y = base + slope * t
        elif kind == "leak_noise":
            y = base + slope * t + rng.gauss(0, noise / 3)
        elif kind == "leak_sawtooth":
            y = base + slope * t + amplitude * ((t % period) / period)
        elif kind == "leak_spikes":
            y = base + slope * t + (rng.uniform(2, 6) * total if rng.random() < 0.03 else 0)
        elif kind == "steady":
            y = base
        elif kind == "steady_noise":
            y = base + rng.gauss(0, noise / 3)
        elif kind == "steady_spikes":
            y = base + (rng.uniform(2, 6) * total if rng.random() < 0.03 else 0)
        elif kind == "sawtooth":
            y = base + amplitude * ((t % period) / period) + rng.gauss(0, noise / 20)
        elif kind == "step":
            y = base + (total if t >= step_at else 0) + rng.gauss(0, noise / 20)
        elif kind == "warmup":
            y = base + slope * min(t, stop_at) * 2 + rng.gauss(0, noise / 20)
        else:
            raise ValueError(kind)
        ys.append(max(0.0, y))
    return ts, ys


POSITIVE = ("leak", "leak_noise", "leak_sawtooth", "leak_spikes")
NEGATIVE = ("steady", "steady_noise", "steady_spikes", "sawtooth", "step", "warmup")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    kinds = POSITIVE + NEGATIVE
    per_kind = {k: [0, 0] for k in kinds}  # flagged, total
    tp = fp = fn = tn = 0
    judge_seconds = 0.0
    points = 0
    for i in range(args.series):
        kind = kinds[i % len(kinds)]
        ts, ys = generate(rng, kind)
        t0 = time.perf_counter()
        verdict = trend.assess(ts, ys, min_window=MIN_WINDOW, min_rise=MIN_RISE)
        judge_seconds += time.perf_counter() - t0
        points += len(ts)
        per_kind[kind][1] += 1
        if verdict.rising:
            per_kind[kind][0] += 1
        if kind in POSITIVE:
            tp += verdict.rising
            fn += not verdict.rising
        else:
            fp += verdict.rising
            tn += not verdict.rising
    precision = tp / (tp + fp) if tp + fp else float("nan")
    recall = tp / (tp + fn) if tp + fn else float("nan")
    print(f"corpus: {args.series} series (seed {args.seed}), {points} samples, min_rise {MIN_RISE // MIB} MiB, "
          f"min_window {MIN_WINDOW:g} s")
    print(f"precision {precision:.3f}  recall {recall:.3f}  (tp {tp}, fp {fp}, fn {fn}, tn {tn})")
    for kind in kinds:
        flagged, total = per_kind[kind]
        label = "leak    " if kind in POSITIVE else "not leak"
        print(f"  {label} {kind:<14} flagged {flagged:>4}/{total:<4}")
    print(f"cost: {judge_seconds / args.series * 1e3:.2f} ms per judgement "
          f"({points / args.series:.0f} samples on average, thinned to <= {trend.MAX_POINTS})")

    history = MemoryHistory(maxlen=720)
    n = 20000
    t0 = time.perf_counter()
    for i in range(n):
        history.add("pid:1", Sample(float(i), {"rss": float(i * 4096)}, {}))
    per_sample = (time.perf_counter() - t0) / n
    print(f"cost: {per_sample * 1e6:.2f} us per sample appended to a bounded history (maxlen 720)")


if __name__ == "__main__":
    main()
