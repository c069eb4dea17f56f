"""pin_memory: what page-locked host memory buys here, and what the job's CPU can spare.

What it reads
  - NVML: whether there is an NVIDIA GPU, and which GPUs have compute processes;
  - with a GPU and a CUDA build of torch: a short measurement (envdoctor's only
    probe that creates a CUDA context, on one idle GPU, for well under a second
    of transfers): host-to-device copy bandwidth from pageable and from pinned
    memory, and the CPU seconds spent pinning per GiB (what
    DataLoader(pin_memory=True)'s pin thread pays for every batch). It makes the
    driver calls torch makes for these, through libcuda in a process of its own,
    without importing torch (envdoctor/probe/copy_probe.py). One measurement
    serves this boot for a day, per GPU and driver (the disk cache;
    ENVDOCTOR_NO_CACHE=1 measures every time). Not made when every GPU already
    has compute processes, so it never takes from a running job: then a figure
    measured earlier this boot is shown, or the check skips;
  - for an attached job (envdoctor.attach): whether its DataLoaders pin memory;
  - for a `--pid` target: the process's CPU time (utime + stime of
    <procfs>/PID/stat) over a short window against the CPUs it may use (affinity
    mask and cgroup quota, envdoctor.cgroup.effective_cpus).

Why it matters (PITFALLS 4)
  pin_memory=True page-locks each batch so the copy to the GPU can use DMA: faster
  copies, but a CPU cost (copying into the locked buffer, in one thread of the
  training process) and locked RAM. One of the source notes saw the CPU pinned at
  99% at each epoch boundary; turning pin_memory off fixed it. Without a GPU
  torch's DataLoader does not pin at all (pin_memory=True is ignored, with a warning). The trade is worth it when the measured pinned bandwidth is
  clearly higher and the process has CPU to spare.

Statuses
  warn   the --pid target uses at least `saturation_ratio` of its effective CPUs
         (both numbers named); pinned copies are not clearly faster than pageable
         ones (speedup below `min_speedup`) yet cost CPU.
  skip   no GPU: pinning has no effect (and the --pid target, if any, has CPU to
         spare); a GPU but nothing measured (all busy with no figure from earlier
         this boot, disabled, no CUDA torch, no libcuda.so.1, measure_bytes outside
         1 MiB to 1 GiB), with the reason.
  ok     measured: the bandwidths, the speedup and the CPU cost, with advice.
  error  the measurement broke (out of memory, a lost GPU): the reason.

How to fix
  DataLoader(..., pin_memory=False) when the CPU is the bottleneck or pinning
  gains little; otherwise give the job more CPU (docker run --cpus=N, a larger
  Kubernetes CPU limit) so the pin thread does not compete with the workers.
"""

from __future__ import annotations

import math
import os
import time
from collections import namedtuple
from collections.abc import Mapping

from envdoctor.check import Check, Metric
from envdoctor.errors import ParseError, Unavailable, short_reason
from envdoctor.model import Finding, Result, Status, skip, verdict
from envdoctor.paths import read_text
from envdoctor.units import format_bytes

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any

GB = 1e9
MIN_MEASURE_BYTES = 1024**2  # below this a copy is over before the clock can tell
MAX_MEASURE_BYTES = 1024**3  # the measurement holds this much on the host (twice) and on the GPU
_MAX_DIGITS = 20


def parse_proc_stat_cpu_ticks(text: Any) -> int:
    """utime + stime (clock ticks) from /proc/N/stat.

    The second field is the command name in parentheses and may itself hold spaces
    and parentheses, so the fields are counted from the LAST ')'. ParseError on
    anything that is not a stat line.
    """
    if not isinstance(text, str):
        raise ParseError(f"stat must be text, got {type(text).__name__}")
    close = text.rfind(")")
    if close < 0 or "(" not in text[:close]:
        raise ParseError("stat line has no '(comm)' field")
    rest = text[close + 1:].split()
    # rest[0] is field 3 (state); utime and stime are fields 14 and 15.
    if len(rest) < 13:
        raise ParseError(f"stat line has {len(rest) + 2} fields; expected at least 15")
    total = 0
    for field in rest[11:13]:
        if not field.isascii() or not field.isdigit() or len(field) > _MAX_DIGITS:
            raise ParseError(f"stat utime/stime {field!r} is not a tick count")
        total += int(field)
    return total


class CpuSample(namedtuple("CpuSample", (
        "pid",  # int
        "used_cpus",  # float | None: CPUs' worth of time used over the window
        "window_seconds",  # float
        "effective_cpus",  # float | None
        "limited_by",  # str
        "reason",  # str | None = None: why it could not be measured
), defaults=(None,))):
    __slots__ = ()


class PinFacts(namedtuple("PinFacts", (
        "cpu",  # CpuSample | None: None for the `self` target
        "gpu_count",  # int
        "nvml_reason",  # str | None
        "measurement",  # Mapping[str, Any] | None: the probe's pin_memory facts
        "not_measured",  # str | None: why there is no measurement, when there is a GPU
        "live_pin_memory",  # bool | None = None: the attached job's DataLoaders pin (envdoctor.attach); None: unknown
), defaults=(None,))):
    __slots__ = ()


def _sample_cpu(ctx, window: float) -> CpuSample:
    from envdoctor.cgroup import effective_cpus

    pid = ctx.target.pid
    eff = effective_cpus(ctx.roots, pid)
    stat = ctx.proc("stat")
    try:
        hz = os.sysconf("SC_CLK_TCK")
        t0, ticks0 = time.monotonic(), parse_proc_stat_cpu_ticks(read_text(stat))
        time.sleep(window)
        t1, ticks1 = time.monotonic(), parse_proc_stat_cpu_ticks(read_text(stat))
    except (OSError, ParseError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        return CpuSample(pid, None, window, eff.cpus, eff.limited_by, f"cannot sample {stat}: {reason}")
    used = (ticks1 - ticks0) / hz / max(t1 - t0, 1e-6)
    return CpuSample(pid, max(used, 0.0), t1 - t0, eff.cpus, eff.limited_by)


def _pick_idle_gpu(gpus) -> Any | None:
    for g in gpus:
        if not getattr(g, "lost", False) and not getattr(g, "timed_out", False) and not g.processes:
            return g
    return None


# -- the measurement's cache ---------------------------------------------------------------
# A GPU's copy rates are a fact of its link and this boot, not of a run: measuring
# costs a CUDA context (0.2-0.3 s on an H200) and 128 MiB copied a dozen times, on
# the GPU a job is about to use. So one measurement serves every `check` of this
# boot for a day (diskcache's limit), per GPU, driver and measurement size; a
# reboot (a new boot id) or a driver reload measures again. ENVDOCTOR_NO_CACHE=1
# measures every time.
MEASUREMENT_SCHEMA = "envdoctor.pin-memory/1"
MAX_CACHED_SECONDS = 24 * 3600 + 60  # diskcache keeps an entry a day; its measurement is no older


def _boot_id(ctx) -> str | None:
    try:
        text = read_text(ctx.roots.procfs / "sys" / "kernel" / "random" / "boot_id").strip()
    except OSError:
        return None
    return text if 0 < len(text) <= 64 else None


def _measurement_key(ctx, gpu, params: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a cached measurement must match; None when it cannot be told apart (no
    boot id, no GPU UUID, no driver version): then nothing is cached."""
    boot = _boot_id(ctx)
    try:
        driver = ctx.nvml.driver_version()
    except Exception:  # Unavailable, a hung NVML: nothing to key on
        driver = None
    if not boot or not getattr(gpu, "uuid", None) or not driver:
        return None
    return {"boot_id": boot, "gpu_uuid": gpu.uuid, "driver": driver, "params": dict(params)}


def _cache_path(key: Mapping[str, Any]):
    import hashlib

    from envdoctor import diskcache

    digest = hashlib.sha256(f"{key['boot_id']}|{key['gpu_uuid']}".encode()).hexdigest()[:20]
    return diskcache.cache_dir() / f"pin-memory-{digest}.json"


def _cached_measurement(key: Mapping[str, Any] | None) -> dict[str, Any] | None:
    from envdoctor import diskcache

    if key is None or not diskcache.enabled():
        return None
    hit = diskcache.read(_cache_path(key), MEASUREMENT_SCHEMA, dict(key))
    if hit is None or hit.get("errors") or unusable(hit) or not _number(hit.get("measured_at")):
        return None  # a damaged or planted entry is a miss: measure again (and overwrite it)
    return hit


def _keep_measurement(key: Mapping[str, Any] | None, m: Mapping[str, Any]) -> None:
    """Only a measurement that gave both figures is kept; a failure is tried again."""
    from envdoctor import diskcache

    if key is None or not diskcache.enabled() or m.get("errors") or m.get("error") or unusable(m):
        return
    diskcache.write(_cache_path(key), MEASUREMENT_SCHEMA, dict(key), dict(m))


def _earlier(ctx, gpus, params) -> tuple[Any, dict[str, Any]] | None:
    """A measurement made earlier this boot on any of these GPUs, with its GPU."""
    for gpu in gpus:
        if getattr(gpu, "lost", False) or getattr(gpu, "timed_out", False):
            continue
        hit = _cached_measurement(_measurement_key(ctx, gpu, params))
        if hit is not None:
            return gpu, hit
    return None


def _labelled(m: Mapping[str, Any], gpu, cached: bool) -> dict[str, Any]:
    out = dict(m)
    out["nvml_index"] = gpu.index
    out["gpu_name"] = gpu.name
    out["cached"] = cached
    return out


def _measure(ctx, gpus, cfg) -> tuple[Mapping[str, Any] | None, str | None]:
    from envdoctor.probe import ProbeError, run_copy_measurement

    if not cfg["measure"]:
        return None, "measurement disabled ([check.\"torch.pin_memory\"] measure = false)"
    try:
        t = ctx.torch
    except Unavailable as exc:
        return None, f"cannot measure: {exc}"
    if not t.get("torch_cuda_version") or t.get("cuda_available") is False:  # None (from files): the measurement finds out
        return None, f"cannot measure: torch {t.get('torch_version')} in {t.get('python')} cannot use CUDA here"
    size = int(cfg["measure_bytes"])
    if not MIN_MEASURE_BYTES <= size <= MAX_MEASURE_BYTES:
        return None, (f"measure_bytes = {size} is outside {format_bytes(MIN_MEASURE_BYTES)} to "
                      f"{format_bytes(MAX_MEASURE_BYTES)}: too little to time a copy, or more host and GPU "
                      "memory than a check should take ([check.\"torch.pin_memory\"] measure_bytes)")
    if not float(cfg["measure_timeout_seconds"]) > 0:  # config allows 0 for any key; here it could only fail
        return None, ("measure_timeout_seconds = 0 leaves no time to measure "
                      "([check.\"torch.pin_memory\"] measure_timeout_seconds, default 25)")
    params = {"size_bytes": size, "repeats": int(cfg["measure_repeats"]), "device": 0}
    gpu = _pick_idle_gpu(gpus)
    if gpu is None:
        earlier = _earlier(ctx, gpus, params)
        if earlier is not None:  # busy now, measured while it was idle: the link has not changed
            return _labelled(earlier[1], earlier[0], True), None
        return None, "every GPU has compute processes on it; not measuring, so as not to take from them"
    key = _measurement_key(ctx, gpu, params)
    cached = _cached_measurement(key)
    if cached is not None:
        return _labelled(cached, gpu, True), None
    # Pin the probe to the idle GPU by UUID: NVML's index and CUDA's can differ.
    env = {"CUDA_VISIBLE_DEVICES": gpu.uuid} if gpu.uuid else {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(gpu.index)}
    limit = float(cfg["measure_timeout_seconds"])
    hint = ("raise the limit with [check.\"torch.pin_memory\"] measure_timeout_seconds "
            "(ENVDOCTOR_CHECK__TORCH_PIN_MEMORY__MEASURE_TIMEOUT_SECONDS)")
    if ctx.session.probe_timeout is not None and ctx.session.probe_timeout < limit:
        limit = ctx.session.probe_timeout  # a run-wide --timeout bounds the measurement too
        hint = "the run's --timeout bounds it; give the run more time"
    try:
        m = dict(run_copy_measurement(params, timeout=limit, env=env, raise_hint=hint))
    except Unavailable as exc:  # no driver library here (a container without the `compute` capability)
        return None, f"cannot measure: {exc}"
    except ProbeError as exc:
        return {"error": str(exc)}, None
    m["measured_at"] = time.time()
    _keep_measurement(key, m)
    return _labelled(m, gpu, False), None


def _live_pin(ctx) -> bool | None:
    from envdoctor.attach_reader import live_facts

    loaders = live_facts(ctx).dataloaders
    flags = [d.get("pin_memory") for d in loaders if isinstance(d.get("pin_memory"), bool)]
    return any(flags) if flags else None


def gather(ctx) -> PinFacts:
    cfg = ctx.settings
    cpu = _sample_cpu(ctx, float(cfg["window_seconds"])) if ctx.target.pid is not None else None
    live = _live_pin(ctx)
    try:
        gpus = [g for g in ctx.nvml.devices()]
    except Unavailable as exc:
        return PinFacts(cpu, 0, str(exc), None, None, live)
    if not gpus:
        return PinFacts(cpu, 0, "NVML sees 0 GPUs", None, None, live)
    measurement, reason = _measure(ctx, gpus, cfg)
    return PinFacts(cpu, len(gpus), None, measurement, reason, live)


FIX_CPU = "DataLoader(..., pin_memory=False)  # or give the job more CPU: docker run --cpus=N"


def _cpu_facts(cpu: CpuSample | None) -> dict[str, Any]:
    if cpu is None:
        return {}
    out: dict[str, Any] = dict(pid=cpu.pid, cpu_used=None if cpu.used_cpus is None else round(cpu.used_cpus, 3),
                               cpu_effective=cpu.effective_cpus, cpu_limited_by=cpu.limited_by,
                               cpu_window_seconds=round(cpu.window_seconds, 3))
    if not cpu.reason and cpu.effective_cpus and cpu.used_cpus is not None:
        out["cpu_used_ratio"] = round(cpu.used_cpus / cpu.effective_cpus, 3)
    return out


def _cpu_note(cpu: CpuSample | None) -> str:
    """What the CPU sample showed, in words ("" when there was none)."""
    if cpu is None:
        return ""
    if cpu.reason or not cpu.effective_cpus or cpu.used_cpus is None:
        return cpu.reason or ""
    ratio = cpu.used_cpus / cpu.effective_cpus
    return (f"pid {cpu.pid} used {cpu.used_cpus:.2f} of its {cpu.effective_cpus:g} effective CPUs "
            f"({ratio:.0%}, limit set by {cpu.limited_by}) over {cpu.window_seconds:.1f} s")


def _cpu_saturated(cpu: CpuSample | None, settings: Mapping[str, Any]) -> bool:
    return (cpu is not None and not cpu.reason and bool(cpu.effective_cpus) and cpu.used_cpus is not None
            and cpu.used_cpus / cpu.effective_cpus >= float(settings["saturation_ratio"]))


def _rule_cpu_saturated(facts: PinFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """A --pid target at its CPU limit: the pin thread competes with the DataLoader workers."""
    if not _cpu_saturated(facts.cpu, settings):
        return []
    return [Finding(Status.WARN, _cpu_note(facts.cpu) + f"; expected below {float(settings['saturation_ratio']):.0%}: "
                    "at its CPU limit, the DataLoader's pin-memory thread competes with the workers and pinning "
                    "adds to the load", FIX_CPU)]


MIN_RATE, MAX_RATE = 1e6, 1e13  # 1 MB/s to 10 TB/s: a copy outside them is a driver's garbage, not a link
MAX_PIN_CPU_SECONDS_PER_GIB = 1000.0


def _number(value: Any, *, positive: bool = False, at_most: float = math.inf) -> bool:
    """A finite real number (not a bool) up to `at_most`, above 0 when `positive`,
    else at least 0 (and not -0.0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    if value > at_most:
        return False
    return value > 0 if positive else value >= 0 and math.copysign(1.0, value) > 0


def unusable(m: Mapping[str, Any]) -> str | None:
    """Why a measurement's figures cannot be judged, or None. What the probe printed
    and what the cache holds both come from outside: a driver that printed a string
    for a rate, NaN or a negative figure, must not become a crash or an "ok" row."""
    if not isinstance(m.get("errors", {}), Mapping):
        return f"its errors field is {type(m.get('errors')).__name__}, not a table"
    for name in ("pinned_bytes_per_second", "pageable_bytes_per_second"):
        value = m.get(name)
        if not _number(value, positive=True, at_most=MAX_RATE) or value < MIN_RATE:
            return f"{name} is {value!r}, not a rate from 1 MB/s to 10 TB/s"
    if not _number(m.get("pin_cpu_seconds_per_gib"), at_most=MAX_PIN_CPU_SECONDS_PER_GIB):
        return f"pin_cpu_seconds_per_gib is {m.get('pin_cpu_seconds_per_gib')!r}, not a number from 0 to 1000"
    size = m.get("size_bytes")
    if isinstance(size, bool) or not isinstance(size, int) or not MIN_MEASURE_BYTES <= size <= MAX_MEASURE_BYTES:
        return f"size_bytes is {size!r}, not a size from {format_bytes(MIN_MEASURE_BYTES)} to {format_bytes(MAX_MEASURE_BYTES)}"
    at, now = m.get("measured_at"), time.time()
    if at is not None and not (_number(at) and now - MAX_CACHED_SECONDS <= at <= now + 60):
        return f"measured_at is {at!r}, not a time in the last day"
    return None


def _rule_measurement_broke(m: Mapping[str, Any]) -> list[Finding]:
    """The probe failed (out of memory, a lost GPU) or returned no usable figures."""
    if m.get("error"):
        return [Finding(Status.ERROR, f"the pin_memory measurement broke: {m['error']}")]
    errors = m.get("errors")
    merr = errors.get("measure") if isinstance(errors, Mapping) else None
    if merr:
        return [Finding(Status.ERROR, f"the pin_memory measurement on GPU {m.get('nvml_index')} failed: {merr}")]
    if not m.get("pinned_bytes_per_second") or not m.get("pageable_bytes_per_second"):
        return [Finding(Status.ERROR, "the pin_memory measurement returned no bandwidth")]
    why = unusable(m)
    if why:
        return [Finding(Status.ERROR, f"the pin_memory measurement returned figures that make no sense: {why}")]
    return []


def _measured(m: Mapping[str, Any]) -> str:
    pinned, pageable = m["pinned_bytes_per_second"], m["pageable_bytes_per_second"]
    return (f"host-to-device on GPU {m.get('nvml_index')} ({m.get('gpu_name')}): pinned {pinned / GB:.1f} GB/s vs "
            f"pageable {pageable / GB:.1f} GB/s ({pinned / pageable:.1f}x) over {format_bytes(m.get('size_bytes') or 0)}; "
            f"pinning costs {m.get('pin_cpu_seconds_per_gib'):.2f} CPU s per GiB" + _when(m))


def _when(m: Mapping[str, Any]) -> str:
    """For a measurement taken from the cache: when it was made, and how to redo it."""
    at = m.get("measured_at")
    if not m.get("cached") or not isinstance(at, (int, float)):
        return ""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    return f" (measured {stamp}, earlier this boot; ENVDOCTOR_NO_CACHE=1 measures again)"


def _rule_gains_little(m: Mapping[str, Any], settings: Mapping[str, Any]) -> list[Finding]:
    """Pinned copies not clearly faster than pageable ones: the CPU cost buys nothing."""
    speedup = m["pinned_bytes_per_second"] / m["pageable_bytes_per_second"]
    if speedup >= float(settings["min_speedup"]):
        return []
    return [Finding(Status.WARN, _measured(m) + f": pinning gains little here (expected >= "
                    f"{float(settings['min_speedup']):g}x) but costs CPU", "DataLoader(..., pin_memory=False)")]


def _measurement_facts(m: Mapping[str, Any]) -> dict[str, Any]:
    pinned, pageable = m.get("pinned_bytes_per_second"), m.get("pageable_bytes_per_second")
    out = dict(pinned_bytes_per_second=pinned, pageable_bytes_per_second=pageable,
               pin_cpu_seconds_per_gib=m.get("pin_cpu_seconds_per_gib"), measure_bytes=m.get("size_bytes"),
               measured_gpu=m.get("nvml_index"), context_seconds=m.get("context_seconds"),
               measured_at=m.get("measured_at"), measurement_cached=m.get("cached"))
    if pinned and pageable:
        out["pinned_speedup"] = round(pinned / pageable, 3)
    return out


def _live_note(facts: PinFacts, out: dict[str, Any]) -> list[str]:
    """What the attached job's DataLoaders ask for. Without a GPU, pin_memory=True is no
    finding: torch's DataLoader pins only when CUDA is available (its iterator's
    _pin_memory is False otherwise, and torch warns), so it costs nothing (helper-42)."""
    if facts.live_pin_memory and facts.gpu_count == 0:
        out["live_pin_memory"] = True
        return ["the running job's DataLoaders ask for pin_memory=True (live), which torch ignores without a GPU"]
    if facts.live_pin_memory is None:
        return []
    out["live_pin_memory"] = facts.live_pin_memory
    return ["the running job's DataLoaders " + ("pin memory (pin_memory=True, live)" if facts.live_pin_memory
                                                 else "do not pin (pin_memory=False, live)")]


def _judge_unmeasured(facts: PinFacts, cpu_findings: list[Finding], out: dict[str, Any]) -> Result:
    """No figures: no GPU (pinning has no effect), or a GPU that was not measured."""
    notes = [n for n in [_cpu_note(facts.cpu)] if n and not cpu_findings] + _live_note(facts, out)
    if facts.gpu_count == 0:
        out["nvml_unavailable"] = facts.nvml_reason
        no_gpu = (f"pinning has no effect without a GPU ({short_reason(facts.nvml_reason)}): torch's DataLoader does not "
                  "pin then, whatever pin_memory says")
        return verdict(cpu_findings, out, "", note=no_gpu) if cpu_findings else skip("; ".join([no_gpu] + notes), **out)
    reason = facts.not_measured or "not measured"
    if cpu_findings:
        return verdict(cpu_findings, out, "", note=f"bandwidth {reason}")
    if facts.cpu is not None and not facts.cpu.reason:
        return verdict([], out, "; ".join(notes + [f"bandwidth {reason}"]))
    return skip(f"pinned vs pageable bandwidth not measured: {reason}", **out)


def judge(facts: PinFacts, settings: Mapping[str, Any]) -> Result:
    out: dict[str, Any] = {"gpu_count": facts.gpu_count, **_cpu_facts(facts.cpu)}
    cpu_findings = _rule_cpu_saturated(facts, settings)
    m = facts.measurement
    if facts.gpu_count == 0 or m is None:
        return _judge_unmeasured(facts, cpu_findings, out)
    broke = _rule_measurement_broke(m)
    if broke:  # figures that make no sense are not passed on as facts
        return verdict(broke, out, "")
    out.update(_measurement_facts(m))
    advice = "keep pin_memory=True" + (" while the process has CPU to spare" if facts.cpu is not None else "")
    note = "" if cpu_findings else _cpu_note(facts.cpu)
    ok_summary = "; ".join(part for part in [_measured(m) + f": {advice}", note, *_live_note(facts, out)] if part)
    return verdict(cpu_findings + _rule_gains_little(m, settings), out, ok_summary)


CHECK = Check(
    id="torch.pin_memory",
    title="pin_memory=True pays off here: pinned vs pageable bandwidth, and CPU to spare",
    gather=gather,
    judge=judge,
    # The bandwidth measurement creates a CUDA context on an idle GPU (in a probe
    # process, but on the GPU a job is about to use) for up to measure_timeout_seconds:
    # intrusive, so `envdoctor check` only; never serve, exec or inside the script.
    modes=("check",),
    intrusive=True,
    explain=__doc__ or "",
    timeout=90.0,
    config={
        "measure": True,
        "measure_bytes": 128 * 1024**2,
        "measure_repeats": 5,
        "measure_timeout_seconds": 25.0,
        "window_seconds": 0.5,
        "saturation_ratio": 0.9,
        "min_speedup": 1.2,
    },
    metrics=(
        Metric("pin_memory_pinned_bytes_per_second", "pinned_bytes_per_second",
               "Host-to-device copy bandwidth from pinned (page-locked) host memory"),
        Metric("pin_memory_pageable_bytes_per_second", "pageable_bytes_per_second",
               "Host-to-device copy bandwidth from ordinary pageable host memory"),
        Metric("pin_memory_cpu_seconds_per_gib", "pin_cpu_seconds_per_gib",
               "CPU seconds spent page-locking and copying one GiB into pinned memory"),
        Metric("process_cpu_used", "cpu_used", "CPUs' worth of time the target process used over the sample window"),
    ),
)
