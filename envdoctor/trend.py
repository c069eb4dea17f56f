"""Is a memory series really growing, how fast, and when does it run out?

Pure functions over (seconds, bytes) samples; no numpy (the daemon must not pull
it in, and a few hundred points do not need it).

Why these statistics. Memory of a training job is not a line: the caching
allocator and Python's arenas move in steps, DataLoader batches come and go in a
sawtooth, and a process grows once at start (model, optimizer state, first
batch) and then plateaus. A least-squares slope calls every one of those a leak
(one outlier or one step tilts it). So:

- the slope is Theil-Sen's (the median of all pairwise slopes): robust to up to
  29% outliers, and zero for a step unless the step sits mid-window;
- it counts only when a Mann-Kendall test says the series rises monotonically
  (S > 0 at significance `alpha`, with the tie correction: memory figures repeat);
- and when the growth is *sustained*: the recent half of the window rises too
  (a step then plateau is flat by then), and the floor rises (the lowest values
  of the last quarter sit above those of the first quarter: a sawtooth that frees
  back to the same level does not, a leak under a sawtooth does);
- and when it matters: the window is at least `min_window` seconds and the
  fitted rise over it at least `min_rise` bytes (a few KiB of arena growth over
  ten seconds projects nothing useful).

Time to exhaustion is headroom / slope: how long until the tightest limit is
reached at the current rate. It is a projection of the present rate, which is
what an operator can act on; a leak that accelerates arrives sooner.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from array import array
from collections import namedtuple

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Sequence

# Above this many points, judge an evenly thinned series: the pairwise slopes and the
# Mann-Kendall sum are O(n^2) in pure Python. serve judges every process's history
# (720 points) every run: at 160 points that was 2.5-3.1 ms a series, ~0.35 s of CPU a
# run with 64 processes, more than all the other checks together. At 64 points (2016
# pairs) it is 0.37-0.48 ms, and on 720 noisy points the slope moved by under 1 %
# (benchmarks/serve_run_cpu.py --history-points 720 measures the whole run).
MAX_POINTS = 64
# From this many samples on (over an hour at serve's 15 s), thin on a grid fixed in time
# (thin_on_grid), whose picks, and so their fit, stay the same from run to run.
GRID_FROM = 4 * MAX_POINTS
# A single step fits this much better than the line (mean absolute residuals): a step, not a leak.
STEP_RATIO = 0.6


class Trend(namedtuple("Trend", (
        "rising",  # bool: a sustained, significant rise of at least min_rise
        "slope",  # float: Theil-Sen, units per second (0.0 when it cannot be told)
        "rise",  # float: slope x window: what the trend added over the window
        "window",  # float: seconds between the first and the last sample
        "points",  # int
        "p_value",  # float: Mann-Kendall, two-sided; 1.0 when it cannot be told
        "level",  # float: the series now: the median of its last few samples
        "reason",  # str: why it is or is not rising, in words
))):
    """What a series does over its window."""

    __slots__ = ()

    def to_dict(self) -> dict:
        return {"rising": self.rising, "slope_per_second": self.slope, "rise": self.rise,
                "window_seconds": self.window, "points": self.points, "p_value": self.p_value,
                "level": self.level, "reason": self.reason}


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    if n == 0:
        raise ValueError("median of nothing")
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def thin(ts: Sequence[float], ys: Sequence[float], max_points: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """At most `max_points` evenly spaced samples, first and last kept."""
    n = len(ts)
    if n <= max_points:
        return list(ts), list(ys)
    idx = sorted({round(i * (n - 1) / (max_points - 1)) for i in range(max_points)})
    return [ts[i] for i in idx], [ys[i] for i in idx]


def _increasing(ts: Sequence[float]) -> bool:
    return all(map(operator.lt, ts, itertools.islice(ts, 1, None)))


def _sorted_slopes(ts: Sequence[float], ys: Sequence[float]) -> list[float]:
    """Every pairwise slope (ys[j] - ys[i]) / (ts[j] - ts[i]), i < j, sorted. For strictly
    increasing times (every series serve keeps) each row is computed by map() in C: the
    same numbers as the comprehension, in a quarter of its time."""
    if _increasing(ts):
        slopes: list[float] = []
        for i in range(len(ts) - 1):
            t_i, y_i = ts[i], ys[i]
            slopes += map(operator.truediv, map(operator.sub, ys[i + 1:], itertools.repeat(y_i)),
                          map(operator.sub, ts[i + 1:], itertools.repeat(t_i)))
    else:
        slopes = [(ys[j] - ys[i]) / (ts[j] - ts[i])
                  for i in range(len(ts)) for j in range(i + 1, len(ts)) if ts[j] != ts[i]]
    slopes.sort()
    return slopes


def _theil_sen_of(slopes: list[float], ts: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    if not slopes:
        return 0.0, (_median(ys) if ys else 0.0)
    slope = _median(slopes)
    return slope, _median([y - slope * t for t, y in zip(ts, ys)])


def thin_on_grid(ts: Sequence[float], ys: Sequence[float], max_points: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """Between about max_points/2 and max_points samples: the first one in each cell of a
    time grid fixed to the clock (cells of a power of two seconds), the oldest cell left
    out (the history may have dropped part of it).

    A long history slides by one sample a run. Evenly spaced indices (thin()) then pick
    64 new samples every run; the grid keeps the same ones until a cell is entered or
    emptied (at 720 samples 15 s apart, cells of 256 s: about 2 runs in 17), so the fit
    of those samples is kept between (see _fit_kept). The newest samples wait for their
    cell's first one to be picked: the slope lags by up to one cell; `level` does not.
    """
    window = ts[-1] - ts[0]
    if len(ts) <= max_points or not 0 < window < math.inf:
        return thin(ts, ys, max_points)
    try:
        cell = 2.0 ** math.ceil(math.log2(window / (max_points - 2)))
        # the first sample at or after each cell's start, from the second cell on (ts ascend)
        starts = range(math.floor(ts[0] / cell) + 1, math.floor(ts[-1] / cell) + 1)
    except (ValueError, OverflowError, ZeroDivisionError):  # times no clock gives: too close or too far for a grid
        return thin(ts, ys, max_points)
    picks = sorted({bisect.bisect_left(ts, k * cell) for k in starts})
    if len(picks) < max_points // 4:  # samples far apart (a paused daemon): every cell is sparse
        return thin(ts, ys, max_points)
    return [ts[i] for i in picks], [ys[i] for i in picks]


# Fits of the points thin_on_grid picked, by those points: serve judges every process's
# history every run, and its picks change in about 2 runs of 17. ~430 bytes a fit; when
# full, the older half goes (64 processes add ~24 a run: ~200 KiB at most).
_FITS_KEPT = 1024
_fits: dict[int, tuple[tuple[int, float, float, float], tuple[float, float, int, float]]] = {}


def _fit_kept(ts: list[float], ys: list[float]) -> tuple[float, float, int, float]:
    """_fit(ts, ys), kept by the points' values: by a hash of them, checked against their
    number and ends (the points themselves would cost more memory than the fits save CPU)."""
    key = hash((tuple(ts), tuple(ys)))
    check = (len(ts), ts[0], ts[-1], ys[-1])
    kept = _fits.get(key)
    if kept is not None and kept[0] == check:
        return kept[1]
    fit = _fit(ts, ys)
    if len(_fits) >= _FITS_KEPT:
        for old in list(itertools.islice(_fits, _FITS_KEPT // 2)):  # the first kept: the oldest picks
            del _fits[old]
    _fits[key] = (check, fit)
    return fit


def theil_sen(ts: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept): the median of the pairwise slopes, and the median of y - slope*t."""
    return _theil_sen_of(_sorted_slopes(ts, ys), ts, ys)


def _fit(ts: Sequence[float], ys: Sequence[float]) -> tuple[float, float, int, float]:
    """theil_sen() and mann_kendall() together: with strictly increasing times the sign of
    each pairwise slope is the sign Mann-Kendall counts, so S is read off the sorted slopes
    instead of a second O(n^2) loop in Python."""
    slopes = _sorted_slopes(ts, ys)
    slope, intercept = _theil_sen_of(slopes, ts, ys)
    if not _increasing(ts):
        return (slope, intercept) + mann_kendall(ys)
    s = (len(slopes) - bisect.bisect_right(slopes, 0.0)) - bisect.bisect_left(slopes, 0.0)
    return slope, intercept, s, _mann_kendall_p(s, ys)


def mann_kendall(ys: Sequence[float]) -> tuple[int, float]:
    """(S, two-sided p) of the Mann-Kendall trend test, with the variance corrected for ties."""
    n = len(ys)
    if n < 3:
        return 0, 1.0
    s = 0
    for i in range(n - 1):
        yi = ys[i]
        for j in range(i + 1, n):
            d = ys[j] - yi
            s += (d > 0) - (d < 0)
    return s, _mann_kendall_p(s, ys)


def _mann_kendall_p(s: int, ys: Sequence[float]) -> float:
    n = len(ys)
    if n < 3:
        return 1.0
    counts: dict[float, int] = {}
    for y in ys:
        counts[y] = counts.get(y, 0) + 1
    var = (n * (n - 1) * (2 * n + 5) - sum(c * (c - 1) * (2 * c + 5) for c in counts.values() if c > 1)) / 18.0
    if var <= 0:
        return 1.0
    z = (s - 1) / math.sqrt(var) if s > 0 else (s + 1) / math.sqrt(var) if s < 0 else 0.0
    return math.erfc(abs(z) / math.sqrt(2.0))


def step_residual(ys: Sequence[float]) -> float:
    """Mean absolute residual of the best single step (two levels, split where the
    squared error is least; each level its segment's median)."""
    n = len(ys)
    if n < 4:
        return 0.0
    prefix, prefix2 = [0.0], [0.0]
    for y in ys:
        prefix.append(prefix[-1] + y)
        prefix2.append(prefix2[-1] + y * y)

    def sse(a: int, b: int) -> float:
        m = b - a
        total = prefix[b] - prefix[a]
        return (prefix2[b] - prefix2[a]) - total * total / m

    k = min(range(2, n - 1), key=lambda k: sse(0, k) + sse(k, n))
    left, right = _median(ys[:k]), _median(ys[k:])
    return (sum(abs(y - left) for y in ys[:k]) + sum(abs(y - right) for y in ys[k:])) / n


def _floats(values: Sequence[float]) -> list[float]:
    """`values` as a list of floats. serve's history hands out array('d')s, which
    tolist() converts in one C call: half the time of float() on each element."""
    if isinstance(values, array) and values.typecode == "d":
        return values.tolist()
    return list(map(float, values))


def _finite(ts: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """The (t, y) pairs where both are finite numbers, as two lists of floats. A series
    with nothing to drop (every one serve keeps) is converted in C: a comprehension over
    720 pairs cost more than the fit of the 64 thinned from them."""
    t_all, y_all = _floats(ts), _floats(ys)
    # An inf or a NaN makes a sum inf or NaN, so a finite sum clears the whole series in
    # one C loop; a sum that overflows only sends a series of finite giants the long way.
    if math.isfinite(sum(t_all)) and math.isfinite(sum(y_all)):
        return t_all, y_all
    if all(map(math.isfinite, t_all)) and all(map(math.isfinite, y_all)):
        return t_all, y_all
    keep = [i for i, (t, y) in enumerate(zip(t_all, y_all)) if math.isfinite(t) and math.isfinite(y)]
    return [t_all[i] for i in keep], [y_all[i] for i in keep]


def assess(ts: Sequence[float], ys: Sequence[float], *, min_window: float, min_rise: float,
           alpha: float = 0.01, min_points: int = 8) -> Trend:
    """Judge one series. `ts` ascending seconds, `ys` the values (bytes)."""
    if len(ts) != len(ys):
        raise ValueError("ts and ys differ in length")
    t_all, y_all = _finite(ts, ys)
    n_all = len(t_all)
    if n_all == 0:
        return Trend(False, 0.0, 0.0, 0.0, 0, 1.0, 0.0, "no samples")
    level = _median(y_all[-3:])
    window = t_all[-1] - t_all[0]
    if n_all < min_points:
        return Trend(False, 0.0, 0.0, window, n_all, 1.0, level, f"{n_all} samples, need {min_points}")
    if window < min_window:
        return Trend(False, 0.0, 0.0, window, n_all, 1.0, level, f"window {window:.1f} s, need {min_window:g} s")
    if y_all.count(y_all[0]) == n_all:  # flat (a process that never touches /dev/shm): the fit's own answer, without the O(n^2)
        return Trend(False, 0.0, 0.0, window, n_all, 1.0, level, "no upward trend")
    if n_all > GRID_FROM:  # picks that stay put from run to run: their fit is kept
        t, y = thin_on_grid(t_all, y_all)
        slope, intercept, s, p = _fit_kept(t, y)
    else:  # evenly spaced picks move with every new sample: keeping their fit would only churn
        t, y = thin(t_all, y_all)
        slope, intercept, s, p = _fit(t, y)
    rise = slope * window

    def done(rising: bool, reason: str) -> Trend:
        return Trend(rising, slope, rise, window, n_all, p, level, reason)

    if s <= 0 or slope <= 0:
        return done(False, "no upward trend")
    if p >= alpha:
        return done(False, f"no significant trend (Mann-Kendall p={p:.3g} >= {alpha:g})")
    if rise < min_rise:
        return done(False, f"rise over the window {rise:.0f} below the minimum {min_rise:.0f}")
    half = len(t) // 2
    recent_slope, _ = theil_sen(t[half:], y[half:])
    recent_s, _ = mann_kendall(y[half:])
    if recent_s <= 0 or recent_slope < 0.25 * slope:
        return done(False, "rose earlier in the window, flat since (a step, then a plateau)")
    line = sum(abs(yi - (intercept + slope * ti)) for ti, yi in zip(t, y)) / len(y)
    step = step_residual(y)
    if step < STEP_RATIO * line:
        return done(False, "one step up, level before and after (a step is not a leak)")
    quarter = max(2, len(y) // 4)
    floor_before, floor_now = min(y[:quarter]), min(y[-quarter:])
    if floor_now - floor_before < 0.25 * rise:
        return done(False, "the floor does not rise (memory is freed back to the same level: a sawtooth)")
    return done(True, f"rising (Mann-Kendall p={p:.2g})")


def time_to_exhaustion(headroom: float | None, slope: float) -> float | None:
    """Seconds until `headroom` is used up at `slope` per second; None when it never is
    (no limit known, or not growing); 0 when there is no headroom left."""
    if headroom is None or slope <= 0 or not math.isfinite(slope):
        return None
    return max(0.0, headroom) / slope
