"""The leak detector on synthetic series: each gate against the shape it exists for,
the statistics against known values, and any input without a crash."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envdoctor import trend

MIB = 1024**2
OPTS = dict(min_window=10.0, min_rise=32 * MIB)


def times(n=60, step=0.5):
    return [i * step for i in range(n)]


def test_theil_sen_recovers_a_line_and_ignores_outliers():
    ts = times()
    ys = [100 + 3 * t for t in ts]
    ys[5] = 1e9  # one wild sample
    ys[40] = -1e9
    slope, intercept = trend.theil_sen(ts, ys)
    assert slope == pytest.approx(3.0)
    assert intercept == pytest.approx(100.0)


def test_mann_kendall_known_values():
    s, p = trend.mann_kendall(list(range(10)))
    assert s == 45  # every pair rises
    assert p < 1e-4
    s, p = trend.mann_kendall([5.0] * 20)
    assert s == 0 and p == 1.0  # all ties: no evidence either way
    s, p = trend.mann_kendall([1, 3, 2, 3, 1, 2, 3, 1, 2, 1])
    assert p > 0.1


def test_a_steady_leak_is_rising_with_its_slope():
    ts = times()
    ys = [500 * MIB + 4 * MIB * t for t in ts]
    tr = trend.assess(ts, ys, **OPTS)
    assert tr.rising, tr.reason
    assert tr.slope == pytest.approx(4 * MIB)
    assert tr.rise == pytest.approx(4 * MIB * ts[-1])


def test_a_leak_under_noise_is_rising():
    rng = random.Random(7)
    ts = times(120)
    ys = [1000 * MIB + 2 * MIB * t + rng.gauss(0, 15 * MIB) for t in ts]
    tr = trend.assess(ts, ys, **OPTS)
    assert tr.rising, tr.reason
    assert tr.slope == pytest.approx(2 * MIB, rel=0.3)


def test_steady_is_not_rising():
    ts = times()
    tr = trend.assess(ts, [800 * MIB] * len(ts), **OPTS)
    assert not tr.rising and tr.slope == 0


def test_a_sawtooth_that_frees_back_is_not_a_leak():
    ts = times(80)
    ys = [300 * MIB + 100 * MIB * ((t % 6.0) / 6.0) for t in ts]
    tr = trend.assess(ts, ys, **OPTS)
    assert not tr.rising, tr


def test_a_sawtooth_whose_floor_rises_is_a_leak():
    ts = times(80)
    ys = [300 * MIB + 3 * MIB * t + 60 * MIB * ((t % 6.0) / 6.0) for t in ts]
    assert trend.assess(ts, ys, **OPTS).rising


@pytest.mark.parametrize("at", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_a_step_then_plateau_is_not_a_leak(at):
    ts = times(80)
    rng = random.Random(3)
    ys = [500 * MIB + (200 * MIB if t >= at * ts[-1] else 0) + rng.gauss(0, MIB) for t in ts]
    tr = trend.assess(ts, ys, **OPTS)
    assert not tr.rising, (at, tr.reason)


def test_growth_that_stopped_is_not_rising_now():
    ts = times(80)
    ys = [500 * MIB + 60 * MIB * min(t, 12.0) for t in ts]
    tr = trend.assess(ts, ys, **OPTS)
    assert not tr.rising
    assert "flat since" in tr.reason or "step" in tr.reason


def test_too_short_or_too_small_is_not_judged():
    ts = times(10, 0.5)  # 4.5 s
    ys = [100 * MIB + 50 * MIB * t for t in ts]
    assert "window" in trend.assess(ts, ys, **OPTS).reason
    ts = times(60)
    ys = [100 * MIB + 1024 * t for t in ts]  # 30 KiB over the window
    tr = trend.assess(ts, ys, **OPTS)
    assert not tr.rising and "minimum" in tr.reason


def test_time_to_exhaustion():
    assert trend.time_to_exhaustion(100 * MIB, MIB) == pytest.approx(100.0)
    assert trend.time_to_exhaustion(None, MIB) is None
    assert trend.time_to_exhaustion(100, 0.0) is None
    assert trend.time_to_exhaustion(-5, 1.0) == 0.0


def test_thinning_keeps_the_ends_and_bounds_the_cost():
    ts = list(range(5000))
    t, y = trend.thin(ts, ts, 160)
    assert len(t) <= 160 and t[0] == 0 and t[-1] == 4999


finite = st.floats(min_value=-1e15, max_value=1e15, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e6), st.one_of(finite, st.just(math.nan), st.just(math.inf))), max_size=60))
def test_any_series_gives_a_trend_not_a_crash(points):
    points.sort(key=lambda p: p[0])
    tr = trend.assess([p[0] for p in points], [p[1] for p in points], **OPTS)
    assert isinstance(tr.rising, bool)
    assert math.isfinite(tr.slope) or not tr.rising


def test_a_flat_series_answers_as_the_full_fit_does():
    """The shortcut for a constant series (no fit at all) must say what the fit says."""
    ts = [float(i) * 15 for i in range(200)]
    ys = [4096.0] * 200
    quick = trend.assess(ts, ys, min_window=10, min_rise=1)
    slope, _ = trend.theil_sen(*trend.thin(ts, ys))
    s, p = trend.mann_kendall(trend.thin(ts, ys)[1])
    assert (quick.rising, quick.slope, quick.p_value, quick.reason) == (False, slope, p, "no upward trend") == (False, 0.0, 1.0, "no upward trend")
    assert quick.points == 200 and quick.window == ts[-1] and quick.level == 4096.0


def _reference_fit(ts, ys):
    """Theil-Sen and Mann-Kendall as the textbook writes them: every pair, one at a time."""
    slopes = sorted((ys[j] - ys[i]) / (ts[j] - ts[i]) for i in range(len(ts)) for j in range(i + 1, len(ts))
                    if ts[j] != ts[i])
    slope = statistics.median(slopes)
    intercept = statistics.median([y - slope * t for t, y in zip(ts, ys)])
    s = sum((d > 0) - (d < 0) for i in range(len(ys)) for d in (ys[j] - ys[i] for j in range(i + 1, len(ys))))
    return slope, intercept, s


def test_the_joint_fit_gives_exactly_what_the_textbook_fits_give():
    """assess() builds each row of pairwise slopes in C and reads Mann-Kendall's S off the
    sorted slopes (their signs are the signs it counts when times increase): the same
    numbers, bit for bit, on noise, ties, steps and unevenly spaced times, and on
    repeated times, where S is counted pair by pair."""
    rng = random.Random(7)
    for case in range(400):
        n = rng.randint(3, 70)
        ts = sorted(rng.sample(range(1, 100_000), n)) if case % 4 else [15.0 * i for i in range(n)]
        if case % 9 == 0:
            ts[n // 2] = ts[n // 2 - 1]  # a repeated time
        ts = [float(t) for t in ts]
        kind = case % 3
        ys = ([float(rng.randint(0, 4)) for _ in ts] if kind == 0  # many ties
              else [1e9 + 3e3 * t + rng.gauss(0, 1e6) for t in ts] if kind == 1
              else [1e9 + (5e8 if i > n // 3 else 0) + rng.gauss(0, 1e5) for i in range(n)])
        slope, intercept, s, p = trend._fit(ts, ys)
        assert (slope, intercept, s) == _reference_fit(ts, ys), case
        assert (s, p) == trend.mann_kendall(ys), case


def test_a_long_history_sliding_by_a_sample_a_run_is_refitted_only_when_its_grid_moves(monkeypatch):
    """serve judges every process's 3-hour history (720 samples) every run, and each run
    slides it by one sample. The points judged come from a grid fixed in time, so they,
    and their O(n^2) fit, stay the same between the runs where a cell is entered or
    emptied; the answers stay those of a fit on the whole series."""
    rng = random.Random(3)
    step = 15.0
    samples = [(i * step + rng.uniform(-1.5, 1.5), 2e9 + 40_000 * i * step + rng.gauss(0, 5 * MIB)) for i in range(760)]
    fits = []
    real_fit = trend._fit
    monkeypatch.setattr(trend, "_fit", lambda ts, ys: fits.append(len(ts)) or real_fit(ts, ys))
    monkeypatch.setattr(trend, "_fits", {})
    slopes = []
    for run in range(40):
        window = samples[run:run + 720]
        tr = trend.assess([t for t, _ in window], [y for _, y in window], **OPTS)
        assert tr.rising, tr.reason
        assert tr.points == 720 and tr.level == pytest.approx(window[-1][1], abs=20 * MIB)
        slopes.append(tr.slope)
    assert all(trend.MAX_POINTS // 2 <= n <= trend.MAX_POINTS for n in fits), fits
    assert len(fits) <= 8, f"{len(fits)} fits in 40 runs"  # ~2 changes of the grid's picks in 17 runs
    ts, ys = [t for t, _ in samples[:720]], [y for _, y in samples[:720]]
    whole, _ = trend.theil_sen(ts, ys)  # every one of the 258,840 pairs
    # within 3 %, as the 64 evenly spaced samples judged before were (measured: -1.0 to +0.9 %)
    assert all(s == pytest.approx(whole, rel=0.03) for s in slopes), (whole, min(slopes), max(slopes))


def test_kept_fits_stay_bounded_and_keep_the_newest(monkeypatch):
    monkeypatch.setattr(trend, "_fits", {})
    series = [([float(t) for t in range(40)], [float(i + (t * 7919) % 97) for t in range(40)]) for i in range(3000)]
    for ts, ys in series:
        trend._fit_kept(ts, ys)
        assert len(trend._fits) <= trend._FITS_KEPT
    assert len(trend._fits) > trend._FITS_KEPT // 2  # the newer half was kept, not everything dropped
    calls = []
    real_fit = trend._fit
    monkeypatch.setattr(trend, "_fit", lambda ts, ys: calls.append(1) or real_fit(ts, ys))
    assert trend._fit_kept(*series[-1]) == real_fit(*series[-1]) and not calls  # the newest is still kept


def test_only_a_long_historys_fit_is_kept(monkeypatch):
    """A short history's evenly spaced picks move with every sample: keeping their fits
    would only push the long histories' fits out of the bounded store."""
    monkeypatch.setattr(trend, "_fits", {})
    rng = random.Random(5)
    for n in (40, 200, trend.GRID_FROM):
        ts = times(n, 15.0)
        trend.assess(ts, [1e9 + rng.gauss(0, 1e6) for _ in ts], **OPTS)
    assert trend._fits == {}
    ts = times(trend.GRID_FROM + 100, 15.0)
    trend.assess(ts, [1e9 + rng.gauss(0, 1e6) for _ in ts], **OPTS)
    assert len(trend._fits) == 1


def test_a_long_series_of_absurd_times_gives_a_trend_not_a_crash():
    """The grid is taken from the times' span: spans no clock gives (infinite, subnormal,
    times at +-1e308, many repeats) fall back to evenly spaced samples, never an error."""
    rng = random.Random(11)
    odd = [0.0, -0.0, 5e-324, 1e-300, 1e300, -1e300, 1e308, -1e308, math.inf, -math.inf, math.nan, 1.0]
    for case in range(400):
        n = rng.randint(trend.GRID_FROM + 1, 600)
        kind = case % 4
        if kind == 0:
            ts = sorted(rng.choice(odd[:10]) + rng.random() * rng.choice([1, 1e-9, 1e9]) for _ in range(n))
        elif kind == 1:
            ts = [float(i // rng.randint(1, 50)) for i in range(n)]  # many repeated times
        elif kind == 2:
            ts = sorted(rng.uniform(-1e6, 1e6) for _ in range(n))
        else:
            ts = [5e-324 * i for i in range(n)]  # a span too small to divide
        ys = [rng.choice([rng.choice(odd), rng.gauss(1e9, 1e6)]) for _ in range(n)]
        tr = trend.assess(ts, ys, **OPTS)
        assert isinstance(tr.rising, bool), case


def test_finite_pairs_are_found_whether_or_not_the_sums_overflow():
    from envdoctor.trend import _finite

    big = 1.5e308  # finite, but two of them overflow a sum
    assert _finite([0, 1, 2], [big, big, big]) == ([0.0, 1.0, 2.0], [big, big, big])
    assert _finite([0, 1, 2, 3], [big, float("nan"), -big, 4]) == ([0.0, 2.0, 3.0], [big, -big, 4.0])
    assert _finite([0, float("inf"), 2], [1, 2, 3]) == ([0.0, 2.0], [1.0, 3.0])
    assert _finite([0, 1], [float("inf"), float("-inf")]) == ([], [])  # inf - inf is NaN: not finite either


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e6), st.one_of(finite, st.just(math.nan), st.just(math.inf), st.just(4096.0))),
                max_size=300))
def test_an_array_of_doubles_is_judged_as_the_same_list_is(points):
    """serve's history hands out array('d')s, converted by tolist() and checked for
    flatness by count(); a list takes float() of each element and the same count. The
    same Trend either way, flat, noisy or broken series alike."""
    from array import array

    points.sort(key=lambda p: p[0])
    ts, ys = [p[0] for p in points], [p[1] for p in points]
    assert trend.assess(array("d", ts), array("d", ys), **OPTS) == trend.assess(ts, ys, **OPTS)
    assert trend._finite(array("d", ts), array("d", ys)) == trend._finite(ts, ys)


def test_a_series_is_flat_only_when_every_value_is_the_same():
    """The flat shortcut answers without a fit (p exactly 1.0); one different value is fitted."""
    ts = [float(i) * 15 for i in range(400)]
    for ys, flat in (([0.0] * 400, True), ([-0.0] + [0.0] * 399, True), ([0.0] * 200 + [1.0] * 200, False),
                     ([1.0] * 200 + [0.0] * 200, False)):
        tr = trend.assess(ts, ys, min_window=10, min_rise=0)
        assert (tr.p_value == 1.0) is flat, (ys[:2], ys[-1], tr)
