"""gpu.health: is every GPU fit to start a job on?

Reads, per GPU, through NVML (never a CUDA context): name, UUID, PCI bus id,
memory total and used, temperature, power draw, clock throttle reasons,
uncorrectable ECC errors (volatile, since the driver loaded), pending page
retirements and row remaps, persistence mode, compute mode, MIG mode, and the
compute processes on it with their memory.

Why it matters: a GPU with uncorrectable ECC errors, or a page retirement or row
remap waiting for a reset, corrupts or kills the job that lands on it, often
hours in ("CUDA error: uncorrectable ECC error encountered"). A GPU that has
fallen off the bus (NVML: "GPU is lost", dmesg: Xid 79) or whose NVML calls hang
takes the whole job down with it. Memory another process already holds is
memory the job will not get: the classic "CUDA out of memory" on a GPU that
should have been empty (PITFALLS 10). A GPU held back by thermal or power
throttling runs every step slower, and in data-parallel training the slowest
GPU sets the pace for all of them.

Statuses: `fail` for uncorrectable ECC errors, a pending page retirement or row
remap, a failed row remap, a lost GPU, a GPU that did not answer NVML in time,
and compute mode Prohibited (no process may use the GPU). `warn` when memory
used by other processes exceeds `max_used_fraction` of the GPU (default 5%) or
`max_used_bytes` (default 0: off), and on active thermal, hardware-slowdown or
power-brake throttling (software power capping too, unless
`warn_sw_power_cap = false`: a GPU at its power limit under load is normal, so
node monitors may want it off). `skip` without an NVIDIA driver, with NVML's
reason. In `serve` the training job's own memory counts as used: raise
`max_used_fraction` to 1.0 there if that is noise.

How to fix: drain the node and reset the GPU (`nvidia-smi -r -i N`, with no
processes on it) or reboot; a failed row remap or ECC errors that return after a
reset mean the GPU must be replaced. Look for Xid errors with
`dmesg | grep -i xid`. Free memory held by stray processes
(`nvidia-smi --query-compute-apps=pid,used_memory --format=csv`, then end them)
or choose other GPUs with CUDA_VISIBLE_DEVICES. For throttling, check cooling,
airflow and power (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`).
"""

from __future__ import annotations

import os
from collections import namedtuple

from envdoctor.check import Check, Metric
from envdoctor.model import Finding, Result, Status, skip, verdict
from envdoctor.nvml import GpuInfo, NvmlHung
from envdoctor.units import format_bytes

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping

HOT_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")

RESET_FIX = "nvidia-smi -r -i {i}  # with no processes on GPU {i}; or reboot the node (drain it first)"
HUNG_FIX = "dmesg | grep -i xid  # then drain the node and reset GPU {i} (nvidia-smi -r -i {i}) or reboot"


class HealthFacts(namedtuple("HealthFacts", (
        "gpus",  # tuple[GpuInfo, ...]
        "own_pids",  # frozenset[int] = frozenset(): the target's pid: its memory is not "someone else's"
        "hung",  # str | None = None: NVML itself did not answer
), defaults=(frozenset(), None))):
    __slots__ = ()


def gather(ctx) -> HealthFacts:
    nvml = ctx.nvml
    own = frozenset({ctx.target.pid if ctx.target.pid is not None else os.getpid()})
    if getattr(nvml, "hung", None):
        return HealthFacts((), own, nvml.hung)
    try:
        return HealthFacts(tuple(nvml.devices()), own)
    except NvmlHung as exc:
        return HealthFacts((), own, str(exc))


def _label(g: GpuInfo) -> str:
    parts = [p for p in (g.pci_bus_id and f"PCI {g.pci_bus_id}", g.uuid) if p]
    return f"GPU {g.index}" + (f" ({', '.join(parts)})" if parts else "")


def _by_gpu(gpus, attr: str) -> dict[str, float]:
    return {str(g.index): getattr(g, attr) for g in gpus if getattr(g, attr) is not None}


def _rule_lost(g: GpuInfo, facts: HealthFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """Fallen off the bus: nothing else about it can be read."""
    if not g.lost:
        return []
    return [Finding(Status.FAIL, f"{_label(g)} is lost: it has fallen off the bus (NVML: GPU is lost)",
                    HUNG_FIX.format(i=g.index))]


def _rule_hung(g: GpuInfo, facts: HealthFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """NVML queries that never answered: the GPU or its driver is hung."""
    if not g.timed_out:
        return []
    stuck = ", ".join(f"{k}: {v}" for k, v in g.errors.items()) or "no answer"
    return [Finding(Status.FAIL, f"{_label(g)} did not answer NVML in time ({stuck}): the GPU or its driver is hung",
                    HUNG_FIX.format(i=g.index))]


def _rule_memory_faults(g: GpuInfo, facts: HealthFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """Uncorrectable ECC errors, and retirements or remaps that wait for a reset."""
    name, i, found = _label(g), g.index, []
    if g.ecc_uncorrected:
        found.append(Finding(Status.FAIL, f"{name} has {g.ecc_uncorrected} uncorrectable ECC error"
                             f"{'s' if g.ecc_uncorrected != 1 else ''} since the driver loaded, expected 0",
                             RESET_FIX.format(i=i) + "; replace the GPU if they return"))
    if g.retired_pages_pending:
        found.append(Finding(Status.FAIL, f"{name} has a memory page retirement pending: it takes effect only after "
                             "a GPU reset", RESET_FIX.format(i=i)))
    if g.remapped_rows_failure:
        found.append(Finding(Status.FAIL, f"{name} failed to remap a memory row (no spare rows left): the GPU needs "
                             "replacing", f"drain the node and have GPU {i} ({g.uuid or 'see nvidia-smi -L'}) replaced"))
    elif g.remapped_rows_pending:
        found.append(Finding(Status.FAIL, f"{name} has a memory row remap pending: it takes effect only after a GPU "
                             "reset", RESET_FIX.format(i=i)))
    return found


def _rule_compute_mode(g: GpuInfo, facts: HealthFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """Prohibited, or Exclusive_Process held by another process: no context for the job."""
    if g.compute_mode == "prohibited":
        return [Finding(Status.FAIL, f"{_label(g)} is in compute mode Prohibited: no process can create a CUDA "
                        "context on it", f"nvidia-smi -i {g.index} -c DEFAULT")]
    if g.compute_mode == "exclusive_process" and any(pid not in facts.own_pids for pid, _ in g.processes):
        return [Finding(Status.WARN, f"{_label(g)} is in compute mode Exclusive_Process and another process holds "
                        "it: the job cannot create a context there", f"pick another GPU, or nvidia-smi -i {g.index} -c DEFAULT")]
    return []


def _used_by_others(g: GpuInfo, facts: HealthFacts) -> int | None:
    if g.memory_used_bytes is None or not g.memory_total_bytes:
        return None
    own = sum(used or 0 for pid, used in g.processes if pid in facts.own_pids)
    return max(0, g.memory_used_bytes - own)


def _rule_memory_taken(g: GpuInfo, facts: HealthFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """Memory other processes already hold: the job will not get it. Not on a GPU in MIG mode:
    each MIG instance has memory of its own, and what the GPU reports used is every slice's
    (NVIDIA's MIG User Guide; helper-97: a job on its own slice was told it would not get it)."""
    if g.mig_mode:
        return []
    used = _used_by_others(g, facts)
    max_fraction, max_bytes = float(settings["max_used_fraction"]), int(settings["max_used_bytes"])
    if used is None or not (used / g.memory_total_bytes > max_fraction or (max_bytes > 0 and used > max_bytes)):
        return []
    pids = [str(pid) for pid, _ in g.processes if pid not in facts.own_pids]
    held = f" (pids {', '.join(pids)})" if pids else ""
    limit = f"{max_fraction:.0%}" + (f" or {format_bytes(max_bytes)}" if max_bytes > 0 else "")
    return [Finding(Status.WARN, f"{_label(g)}: {format_bytes(used)} of {format_bytes(g.memory_total_bytes)} "
                    f"({used / g.memory_total_bytes:.0%}) is already used by other processes{held}, expected at most "
                    f"{limit}: the job will not get it",
                    "nvidia-smi --query-compute-apps=pid,used_memory --format=csv  # end the strays, or pick "
                    "free GPUs with CUDA_VISIBLE_DEVICES")]


def _rule_throttling(g: GpuInfo, facts: HealthFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """Thermal, power-brake (and by default software power cap) slowdowns."""
    hot = [r for r in g.throttle_reasons if r in HOT_REASONS or (settings["warn_sw_power_cap"] and r == "sw_power_cap")]
    if not hot:
        return []
    temp = f" at {g.temperature_c} C" if g.temperature_c is not None else ""
    power = f", {g.power_watts:.0f} W" if g.power_watts is not None else ""
    return [Finding(Status.WARN, f"{_label(g)} is throttling ({', '.join(hot)}){temp}{power}: every step runs slower",
                    f"nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER -i {g.index}  # check cooling, airflow and power supply")]


RULES = (_rule_hung, _rule_memory_faults, _rule_compute_mode, _rule_memory_taken, _rule_throttling)


def _gpu_findings(g: GpuInfo, facts: HealthFacts, settings: Mapping[str, Any]) -> list[Finding]:
    lost = _rule_lost(g, facts, settings)
    return lost or [finding for rule in RULES for finding in rule(g, facts, settings)]


# What "healthy" rests on, and how each is named when NVML did not report it.
HEALTH_FIELDS = (("ecc_uncorrected", "ECC errors"), ("retired_pages_pending", "page retirement"),
                 ("remapped_rows_pending", "row remaps"), ("throttle_reasons_mask", "throttling"),
                 ("memory_used_bytes", "memory use"))


def unverified(g: GpuInfo) -> list[str]:
    """The health signals NVML did not give for this GPU (not supported, or the query failed)."""
    return [label for attr, label in HEALTH_FIELDS if getattr(g, attr) is None]


def _ok_summary(gpus: tuple[GpuInfo, ...], others_used: Mapping[str, int]) -> str:
    """Healthy, naming only the signals NVML reported: "no ECC errors" is not said of a GPU nobody asked."""
    models: dict[str, int] = {}
    for g in gpus:
        models[g.name or "unknown"] = models.get(g.name or "unknown", 0) + 1
    kinds = ", ".join(f"{n}x {m}" for m, n in models.items())
    temps = [g.temperature_c for g in gpus if g.temperature_c is not None]
    hottest = f", hottest {max(temps)} C" if temps else ""
    checked = [label for attr, label in HEALTH_FIELDS if any(getattr(g, attr) is not None for g in gpus)]
    said = {"ECC errors": "no uncorrectable ECC errors", "page retirement": "no pending page retirement",
            "row remaps": "no pending row remap", "throttling": "no throttling",
            "memory use": f"at most {format_bytes(max(others_used.values(), default=0))} used by others"}
    summary = (f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} healthy ({kinds}): "
               + ", ".join(said[c] for c in checked) + hottest)
    gaps = [f"{_label(g)}: {', '.join(unverified(g))}" for g in gpus if unverified(g)]
    return summary + ("; not reported by NVML, so not verified: " + "; ".join(gaps) if gaps else "")


def _blind(gpus: tuple[GpuInfo, ...], facts_out: Mapping[str, Any]) -> Result | None:
    """A skip when NVML reported no health signal for any GPU: "healthy" would vouch for what nobody looked at."""
    if any(len(unverified(g)) < len(HEALTH_FIELDS) for g in gpus):
        return None
    return Result(Status.SKIP, f"NVML reports none of the health signals ({', '.join(l for _, l in HEALTH_FIELDS)}) "
                  f"for {'any GPU' if len(gpus) > 1 else _label(gpus[0])} (not supported or failed): health not verified",
                  "nvidia-smi -q  # see which fields this GPU and driver report", dict(facts_out))


def judge(facts: HealthFacts, settings: Mapping[str, Any]) -> Result:
    if facts.hung:
        hung = Finding(Status.FAIL, f"NVML did not answer: {facts.hung}",
                       "dmesg | grep -i xid  # then check nvidia-smi; drain the node and reset the GPUs or reboot")
        return verdict([hung], {"gpu_count": None, "gpus": [], "findings": [facts.hung]}, "")
    gpus = facts.gpus
    if not gpus:
        return skip("NVML reports no GPU on this node", gpu_count=0, gpus=[])
    findings = [finding for g in gpus for finding in _gpu_findings(g, facts, settings)]
    others_used = {str(g.index): used for g in gpus if not g.lost
                   for used in [_used_by_others(g, facts)] if used is not None}
    facts_out = {
        "gpu_count": len(gpus),
        "gpus": [g.to_dict() for g in gpus],
        "memory_used_bytes": _by_gpu(gpus, "memory_used_bytes"),
        "memory_total_bytes": _by_gpu(gpus, "memory_total_bytes"),
        "memory_used_by_others_bytes": others_used,
        "temperature_celsius": _by_gpu(gpus, "temperature_c"),
        "power_watts": _by_gpu(gpus, "power_watts"),
        "ecc_uncorrected": _by_gpu(gpus, "ecc_uncorrected"),
        "findings": [f.message for f in findings],
    }
    if not findings:
        blind = _blind(gpus, facts_out)
        if blind is not None:
            return blind
    return verdict(findings, facts_out, _ok_summary(gpus, others_used))


CHECK = Check(
    id="gpu.health",
    title="Every GPU is healthy and free: no ECC faults, pending resets, lost GPUs, stray memory or throttling",
    gather=gather,
    judge=judge,
    modes=("check", "serve", "exec", "inprocess"),  # NVML queries only: no CUDA context
    intrusive=False,
    explain=__doc__,
    needs=("nvml",),
    config={"max_used_fraction": 0.05, "max_used_bytes": 0, "warn_sw_power_cap": True},
    metrics=(
        Metric("gpu_memory_used_bytes", "memory_used_bytes", "GPU memory in use, as NVML reports it", label="gpu"),
        Metric("gpu_memory_total_bytes", "memory_total_bytes", "GPU memory in total", label="gpu"),
        Metric("gpu_temperature_celsius", "temperature_celsius", "GPU core temperature", label="gpu"),
        Metric("gpu_power_watts", "power_watts", "GPU power draw", label="gpu"),
        Metric("gpu_ecc_uncorrected_errors", "ecc_uncorrected", "Uncorrectable ECC errors since the driver loaded", label="gpu"),
        Metric("gpu_info", "gpus", "One series per GPU, value 1: join on gpu for its UUID, PCI bus id and model "
               "(dcgm-exporter's UUID and pci_bus_id labels)",
               info=(("gpu", "index"), ("uuid", "uuid"), ("pci_bus_id", "pci_bus_id"), ("name", "name"))),
    ),
)
