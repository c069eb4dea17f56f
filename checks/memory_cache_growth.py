"""memory.cache_growth: memory that climbs until the job is killed, and when that will be.

What it reads, sampled over a window (`envdoctor check --window 60`, on the
target of --pid or on itself) or continuously (`envdoctor serve` keeps a bounded
history per process): the process's resident set (`rss`); its memory cgroup's
working set, usage less inactive file cache (`cgroup`, v1 and v2); bytes used in
its /dev/shm (`shm`: the whole mount's, which every process in a mount namespace
shares, so serve keeps one series per mount, shown on one process there while it lives);
its memory on each GPU from NVML's per-process accounting
(`gpuN`; absent where NVML cannot say: a container with its own PID namespace,
MIG); and, when the job is attached (envdoctor.attach), the caching allocator's
reserved and allocated bytes, inactive split bytes and allocation retries per
device (`cudaN_reserved`, `cudaN_allocated`). Each memory comes with the limit it
runs into: the tightest of the cgroup limit (every level; on cgroup v2 its
`memory.high` too, where the kernel throttles a job that grows past it: then the
time to the limit that kills is said too) and the host's available
memory for rss and cgroup, the mount's size for shm, the device's free memory for
GPU memory.

Why it matters (PITFALLS 5): a job whose memory creeps up is killed by the OOM
killer or by CUDA's "out of memory" hours into a run, and the loss is everything
since the last checkpoint. The classic cause is `total_loss += loss`: `loss` is a
tensor, so the sum keeps a reference to every iteration's autograd graph (its
saved activations) and host or GPU memory grows by a graph per step. On the GPU,
the caching allocator that reserves far more than tensors use (fragmentation), or
that has to free its cache and retry allocations, ends in the same "out of
memory" with plenty of memory reserved but unusable.

How it judges: a trend is a Theil-Sen slope (median of pairwise slopes) that a
Mann-Kendall test finds significant (p < alpha), over at least min_window_seconds,
adding at least min_rise_bytes over the window, still rising in the recent half,
with a rising floor, and not better explained by a single step: a sawtooth
(allocate, free), a one-time step (model loaded, first batch), a warm-up that
levelled off, or noise are not leaks. Time to exhaustion = headroom / slope
against the memory's tightest limit.

- fail: exhaustion within fail_horizon_seconds (default 3600: an hour is about
  the longest gap between checkpoints of a long run, and the least time a person
  paged by an alert needs to checkpoint and restart: inside it the job dies
  before anyone can act);
- warn: exhaustion within warn_horizon_seconds (default 86400: most training
  runs last a day or more and a person looks at a job at least daily: the run
  will not finish, but there is time to fix it at the next restart); the
  caching allocator reserving at least fragmentation_bytes more than it has
  allocated, with allocated below half of reserved; allocation retries rising
  during the window;
- ok: no sustained growth, or growth whose limit is further than the warn
  horizon (its slope and ETA are still in the summary and the gauges);
- skip: no window (`envdoctor check` without --window or the config's
  window_seconds), a window shorter than min_window_seconds, the node target, or
  the process exited before the window.

window_seconds in [check."memory.cache_growth"] is --window's default: set there
(in CI, say), every plain `envdoctor check` samples that long before it judges.

How to fix: host memory growing in a training loop: accumulate
`total_loss += loss.item()` (a float), not `loss`; `.detach()` what you keep
across iterations; look for lists and caches that grow per step. GPU reserved
far above allocated, or allocation retries: `export
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (segments grow in place instead
of fragmenting). /dev/shm filling: fewer DataLoader workers or a smaller
prefetch_factor, and remove leftover /dev/shm/torch_* segments of crashed jobs.
"""

from __future__ import annotations

import math
from collections import namedtuple

from envdoctor import trend
from envdoctor.check import Check, Metric
from envdoctor.errors import Unavailable
from envdoctor.model import Finding, Result, Status, skip, verdict
from envdoctor.record import Record
from envdoctor.units import format_bytes

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping, Sequence

MIB = 1024**2
GIB = 1024**3
HISTORY_FACT = "memory.history"  # serve registers its MemoryHistory as this host fact

LOSS_ITEM_FIX = ("accumulate total_loss += loss.item() (a float), not loss (a tensor that keeps every "
                 "iteration's graph); .detach() what you keep across iterations")
ALLOC_CONF_FIX = "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
ALLOC_CONF_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
SHM_FIX = ("find what fills the mount (ls -la /dev/shm; fuser -v /dev/shm/*: it may be another process on it); "
           "lower that job's DataLoader num_workers or prefetch_factor; remove leftover /dev/shm/torch_* segments "
           "of crashed jobs")

DESCRIBE = {"rss": "resident memory", "cgroup": "cgroup working set",
            "shm": "/dev/shm usage (the whole mount's, shared by every process on it)"}


class GrowthFacts(namedtuple("GrowthFacts", (
        "series",  # Mapping[str, tuple[Sequence[float], Sequence[float]]]: memory -> (times, bytes)
        "limits",  # Mapping[str, Any]: memory -> memsample.Limit (latest)
        "source",  # str: "window" or "history"
        "stopped",  # str | None = None: why sampling ended early
        "notes",  # tuple[str, ...] = ()
), defaults=(None, ()))):
    __slots__ = ()


def _live(ctx):
    from envdoctor.attach_reader import live_document

    return lambda: live_document(ctx.roots, ctx.target.pid)


def gather(ctx) -> GrowthFacts:
    from envdoctor.memsample import MemoryHistory, Sampler, sample_window

    if ctx.target.kind == "node":
        raise Unavailable("memory growth is judged per process, not for the node")
    label = ctx.target.label
    history = ctx.host.computed(HISTORY_FACT)
    if history is not None:
        latest = history.latest(label)
        if latest is None:
            raise Unavailable(f"no memory samples of {label} yet (serve samples every interval)")
        return GrowthFacts(history.series(label), dict(latest.limits), "history", None, tuple(latest.notes))
    window = float(ctx.config.get("window_seconds", 0) or 0)
    if window <= 0:
        raise Unavailable("needs a sampling window: memory growth is only seen over time",
                          "envdoctor check --window 60 [--pid PID] (or envdoctor serve, which samples continuously)")
    interval = max(0.05, float(ctx.config.get("interval_seconds", 1.0)))
    sampler = Sampler(ctx.roots, ctx.target.pid, ctx.nvml_or_none(), _live(ctx))
    history = MemoryHistory(maxlen=max(16, int(window / interval) + 2))
    stopped = sample_window(sampler, window, interval, history, label, getattr(ctx.session, "progress", None))
    latest = history.latest(label)
    if latest is None:
        raise Unavailable(f"{label} exited before it could be sampled: {stopped}")
    return GrowthFacts(history.series(label), dict(latest.limits), "window", stopped, tuple(latest.notes))


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def rate(bytes_per_second: float) -> str:
    return f"{format_bytes(int(bytes_per_second))}/s" if bytes_per_second >= 1024 else f"{bytes_per_second:.0f} B/s"


def _name(memory: str) -> str:
    if memory in DESCRIBE:
        return DESCRIBE[memory]
    if memory.startswith("gpu"):
        return f"GPU {memory[3:]} memory (NVML, per process)"
    if memory.startswith("cuda"):
        index, _, kind = memory[4:].partition("_")
        return f"CUDA caching allocator {kind} on device {index}"
    return memory


def _fix(memory: str) -> tuple[str, Mapping[str, str]]:
    if memory == "shm":
        return SHM_FIX, {}
    if memory.startswith("cuda") and memory.endswith("_reserved"):
        return f"{LOSS_ITEM_FIX}; if reserved runs far above allocated: {ALLOC_CONF_FIX}", {}
    return LOSS_ITEM_FIX, {}


class Growth(Record):
    """What the trends say: per memory its slope (0 when not rising) and time to exhaustion."""

    def __init__(
        self,
        trends: Mapping[str, Any],
        window: float,
        growth: dict[str, float] | None = None,
        eta: dict[str, float] | None = None,
        notes: list[str] | None = None,
    ) -> None:
        self.trends = trends
        self.window = window
        self.growth = {} if growth is None else growth
        self.eta = {} if eta is None else eta
        self.notes = [] if notes is None else notes


def _memories(facts: GrowthFacts) -> Mapping[str, tuple[list[float], list[float]]]:
    """The series that are amounts of memory (not retry counters or split bytes)."""
    return {k: v for k, v in facts.series.items() if not k.endswith(("_num_alloc_retries", "_inactive_split_bytes"))}


def _assess(facts: GrowthFacts, settings: Mapping[str, Any]) -> Growth:
    trends = {name: trend.assess(ts, ys, min_window=float(settings.get("min_window_seconds", 10.0)),
                                 min_rise=float(settings.get("min_rise_bytes", 32 * MIB)),
                                 alpha=float(settings.get("alpha", 0.01)))
              for name, (ts, ys) in sorted(_memories(facts).items())}
    return Growth(trends, max((t.window for t in trends.values()), default=0.0))


def _rule_growth_to_limit(facts: GrowthFacts, g: Growth, settings: Mapping[str, Any]) -> list[Finding]:
    """A significant rise that reaches its limit within a horizon; the soonest first (it kills the job)."""
    warn_h = float(settings.get("warn_horizon_seconds", 86400.0))
    fail_h = float(settings.get("fail_horizon_seconds", 3600.0))
    timed: list[tuple[float, Finding]] = []
    for name, tr in g.trends.items():
        g.growth[name] = tr.slope if tr.rising else 0.0
        if not tr.rising:
            continue
        limit = facts.limits.get(name)
        seconds = trend.time_to_exhaustion(limit.headroom if limit is not None else None, tr.slope)
        observed = (f"{_name(name)} grows {rate(tr.slope)} over {duration(tr.window)} "
                    f"(now {format_bytes(int(tr.level))}, Mann-Kendall p={tr.p_value:.1g})")
        if seconds is None:
            g.notes.append(f"{observed}, no limit known")
            continue
        g.eta[name] = seconds
        against = _named(limit)
        if seconds > warn_h:
            g.notes.append(f"{observed}: {against} runs out in {duration(seconds)}, beyond the {duration(warn_h)} "
                           "warn horizon")
            continue
        text = (f"{observed}: {against} runs out in {duration(seconds)}, "
                f"{format_bytes(max(0, limit.headroom))} left{_beyond(limit, tr.slope)}; expected no sustained growth")
        fix, env = _fix(name)
        timed.append((seconds, Finding(Status.FAIL if seconds <= fail_h else Status.WARN, text, fix, env)))
    return [f for _, f in sorted(timed, key=lambda item: item[0])]


def _named(limit: Any) -> str:
    """The limit and its size: `cgroup v2 memory limit /sys/.../memory.max (1 GiB)`."""
    return limit.name + (f" ({format_bytes(limit.limit)})" if limit.limit is not None else "")


def _beyond(limit: Any, slope: float) -> str:
    """For a throttling bound (cgroup v2 memory.high): what happens there, and when the
    limit beyond it kills the job at the same rate (helper-100: "it is not killed" read as
    safe while memory.max sat 124 MiB further up)."""
    if not getattr(limit, "throttles", False):
        return ""
    text = ", where the kernel throttles the job to a crawl"
    then = getattr(limit, "then", None)
    if then is not None:
        eta = trend.time_to_exhaustion(then.headroom, slope)
        text += f"; {_named(then)}, which kills it, runs out in {duration(eta)}" if eta is not None else ""
    return text


def _rule_fragmentation(facts: GrowthFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """The caching allocator reserves far more than tensors use."""
    frag, found = float(settings.get("fragmentation_bytes", GIB)), []
    for name, (ts, ys) in sorted(_memories(facts).items()):
        if not name.endswith("_reserved"):
            continue
        device = name[len("cuda"):-len("_reserved")]
        allocated = facts.series.get(f"cuda{device}_allocated")
        if not allocated or not ys:
            continue
        reserved_now, allocated_now = ys[-1], allocated[1][-1]
        if reserved_now - allocated_now >= frag and allocated_now < reserved_now / 2:
            found.append(Finding(Status.WARN, f"CUDA device {device}: the caching allocator reserves "
                                 f"{format_bytes(int(reserved_now))} but tensors use {format_bytes(int(allocated_now))}: "
                                 "fragmentation, expected reserved close to allocated", ALLOC_CONF_FIX, ALLOC_CONF_ENV))
    return found


def _rule_alloc_retries(facts: GrowthFacts) -> list[Finding]:
    """Allocation retries during the window: the allocator had to free its cache to satisfy a request."""
    found = []
    for name, (ts, ys) in sorted(facts.series.items()):
        if name.endswith("_num_alloc_retries") and len(ys) >= 2 and ys[-1] > ys[0]:
            device = name[len("cuda"):].split("_", 1)[0]
            found.append(Finding(Status.WARN, f"CUDA device {device}: {ys[-1] - ys[0]:.0f} allocation retries during "
                                 "the window (the allocator freed its cache to satisfy a request): memory is close to "
                                 "running out or fragmented", ALLOC_CONF_FIX, ALLOC_CONF_ENV))
    return found


def _facts_out(facts: GrowthFacts, g: Growth) -> dict[str, Any]:
    out: dict[str, Any] = {
        "source": facts.source,
        "window_seconds": round(g.window, 3),
        "growth_bytes_per_second": {k: round(v, 3) for k, v in g.growth.items()},
        "exhaustion_eta_seconds": {k: round(v, 1) for k, v in g.eta.items()},
        "trends": {k: t.to_dict() for k, t in g.trends.items()},
        "limits": {k: v.to_dict() for k, v in facts.limits.items()},
    }
    if facts.stopped:
        out["stopped"] = facts.stopped
    if facts.notes:
        out["notes"] = list(facts.notes)
    return out


def judge(facts: GrowthFacts, settings: Mapping[str, Any]) -> Result:
    g = _assess(facts, settings)
    findings = _rule_growth_to_limit(facts, g, settings) + _rule_fragmentation(facts, settings) + _rule_alloc_retries(facts)
    out = _facts_out(facts, g)
    min_window = float(settings.get("min_window_seconds", 10.0))
    if not g.trends:
        return skip("no memory figure of the target could be read" + (f": {'; '.join(facts.notes)}" if facts.notes else ""),
                    **out)
    if g.window < min_window and not findings:
        more = ("serve judges it again each run as its history grows" if facts.source == "history"
                else f"envdoctor check --window {int(math.ceil(min_window * 3))}")
        sampled = f"{g.window:.1f} s" if duration(g.window) == duration(min_window) else duration(g.window)  # not "10 s, need 10 s"
        return skip(f"sampled {sampled}, need at least {duration(min_window)} ({more})"
                    + (f"; sampling stopped: {facts.stopped}" if facts.stopped else ""), **out)
    memories = _memories(facts)
    seen = ", ".join(f"{k} {format_bytes(int(memories[k][1][-1]))}" for k in g.trends)
    ok_summary = f"no sustained memory growth over {duration(g.window)} ({seen})"
    if g.notes:
        ok_summary = "; ".join(g.notes)
    elif facts.stopped:
        ok_summary += f"; sampling stopped: {facts.stopped}"
    return verdict(findings, out, ok_summary, note="; ".join(g.notes) if findings and g.notes else "")


CHECK = Check(
    id="memory.cache_growth",
    title="Memory (host, cgroup, /dev/shm, GPU, CUDA cache) is not climbing toward its limit",
    gather=gather,
    judge=judge,
    explain=__doc__ or "",
    modes=("check", "serve"),  # it samples over time: a window in check, continuously in serve
    intrusive=False,  # reads /proc, cgroup files and NVML's per-process accounting
    config={
        "window_seconds": 0.0,  # 0: no sampling (check --window sets it)
        "interval_seconds": 1.0,
        "min_window_seconds": 10.0,
        "min_rise_bytes": 32 * MIB,
        "alpha": 0.01,
        "warn_horizon_seconds": 86400.0,
        "fail_horizon_seconds": 3600.0,
        "fragmentation_bytes": GIB,
    },
    metrics=(
        Metric("memory_growth_bytes_per_second", "growth_bytes_per_second",
               "Sustained growth of the target's memory (Theil-Sen slope when a trend is significant, else 0)",
               label="memory"),
        Metric("memory_exhaustion_eta_seconds", "exhaustion_eta_seconds",
               "Seconds until the memory reaches its tightest limit at the current growth (absent when not growing)",
               label="memory"),
    ),
)
