"""preflight.live: what only a look from inside the training script can tell.

What it reads: the live torch of the script that called envdoctor.preflight()
(envdoctor.inprocess.live_torch_facts: torch.cuda.is_initialized(), and once the
script has initialised CUDA, the device count and memory_reserved /
memory_allocated per GPU; torch.get_num_threads()), the process's
CUDA_VISIBLE_DEVICES and LOCAL_WORLD_SIZE, and its effective CPUs (affinity and
cgroup quota, envdoctor.cgroup.effective_cpus).

Why it matters: `envdoctor check` sees a fresh interpreter's defaults. The script
is what sets things: CUDA_VISIBLE_DEVICES changed after CUDA started is silently
ignored; torch.set_num_threads(os.cpu_count()) shows in no environment variable
yet oversubscribes a container's quota; the caching allocator holding far more
than the tensors use is fragmentation or a cache growing between phases.

It runs only in the `inprocess` mode (preflight() and attach()): outside the
script there is no live torch to read, so `envdoctor check` lists it and never
runs it. It never initialises CUDA itself (see envdoctor.inprocess).

Statuses: `warn` for CUDA_VISIBLE_DEVICES naming another number of devices than
CUDA was initialised with, reserved memory at least `fragmentation_bytes` above
allocated and more than twice it, intra-op threads above the process's share of
its effective CPUs; `skip` without torch; `ok` otherwise, with what was seen.

How to fix: set CUDA_VISIBLE_DEVICES in the shell or launcher, before python
starts; `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` or
torch.cuda.empty_cache() between phases; torch.set_num_threads(N) with the share
the check names (and OMP_NUM_THREADS=N before launch).
"""

from __future__ import annotations

from collections import namedtuple

from envdoctor import visible_devices as vd
from envdoctor.check import Check
from envdoctor.checks.cpu_threads import local_world_size, per_process_share
from envdoctor.errors import ParseError
from envdoctor.model import Finding, Result, Status, verdict
from envdoctor.units import format_bytes

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping

GIB = 1024**3


class LiveFacts(namedtuple("LiveFacts", (
        "torch",  # Mapping[str, Any]: live_torch_facts()
        "env",  # Mapping[str, str]: CUDA_VISIBLE_DEVICES and LOCAL_WORLD_SIZE, when set
        "effective_cpus",  # float | None
))):
    __slots__ = ()


def gather(ctx) -> LiveFacts:
    from envdoctor.cgroup import effective_cpus

    env = {k: v for k, v in ctx.env.items() if k in ("CUDA_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE")}
    return LiveFacts(ctx.torch, env, effective_cpus(ctx.roots, ctx.target.pid).cpus)


def listed_count(value: str) -> int | None:
    """How many devices CUDA_VISIBLE_DEVICES names, read the way CUDA reads it
    (envdoctor.visible_devices); None when the value is broken (cuda.visible_devices says how)."""
    try:
        parsed = vd.parse(value)
    except ParseError:
        return None
    if parsed.duplicate is not None:
        return None
    if parsed.stop is None:
        return len(parsed.visible)
    hides_all_on_purpose = (parsed.bad_token or "").strip() in ("", "-1") and not parsed.visible and not parsed.ignored
    return 0 if hides_all_on_purpose else None


def thread_share(effective_cpus: float | None, env: Mapping[str, str]) -> int | None:
    """Threads one process may run: its effective CPUs split among the ranks on this
    node (cpu.threads' rule, without DataLoader workers: the script's own threads)."""
    if not effective_cpus:
        return None
    return per_process_share(effective_cpus, local_world_size(env.get("LOCAL_WORLD_SIZE")) or 1)


def _rule_visible_devices_too_late(facts: LiveFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """CUDA_VISIBLE_DEVICES changed after CUDA started: it has no effect any more."""
    t, cvd = facts.torch, facts.env.get("CUDA_VISIBLE_DEVICES")
    if not t.get("cuda_initialized") or cvd is None:
        return []
    listed, count, physical = listed_count(cvd), t.get("device_count"), t.get("nvml_device_count")
    if listed is None or not isinstance(count, int) or listed == count or (physical is not None and listed > physical):
        return []
    return [Finding(Status.WARN, f"CUDA_VISIBLE_DEVICES={cvd!r} names {listed} device(s) but CUDA was initialised with "
                    f"{count}: it was set after CUDA started, so it has no effect; expected it set before anything "
                    "touches CUDA", "set CUDA_VISIBLE_DEVICES in the shell or the launcher, before python starts")]


def _rule_fragmentation(facts: LiveFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """The caching allocator holds far more than the tensors use."""
    if not facts.torch.get("cuda_initialized"):
        return []
    found = []
    for index, mem in sorted((facts.torch.get("cuda_memory") or {}).items()):
        reserved, allocated = mem.get("reserved_bytes"), mem.get("allocated_bytes")
        if not isinstance(reserved, int) or not isinstance(allocated, int):
            continue
        if reserved - allocated >= int(settings["fragmentation_bytes"]) and allocated < reserved / 2:
            found.append(Finding(Status.WARN, f"GPU {index}: the caching allocator holds {format_bytes(reserved)} but "
                                 f"tensors use only {format_bytes(allocated)}: fragmentation or a cache growing between "
                                 "phases; expected reserved close to allocated",
                                 "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # or torch.cuda.empty_cache() "
                                 "between phases"))
    return found


def _rule_threads(facts: LiveFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """torch.set_num_threads() above the process's share of its effective CPUs."""
    threads, share = facts.torch.get("num_threads"), thread_share(facts.effective_cpus, facts.env)
    if not isinstance(threads, int) or share is None or threads <= share:
        return []
    ranks = facts.env.get("LOCAL_WORLD_SIZE")
    return [Finding(Status.WARN, f"torch runs {threads} intra-op threads but this process has {facts.effective_cpus:g} "
                    "effective CPUs" + (f" shared by LOCAL_WORLD_SIZE={ranks} ranks" if ranks else "")
                    + f": oversubscribed, expected <= {share}",
                    f"torch.set_num_threads({share})  # and export OMP_NUM_THREADS={share} before launch")]


RULES = (_rule_visible_devices_too_late, _rule_fragmentation, _rule_threads)


def _notes(facts: LiveFacts) -> list[str]:
    """What was seen, for the ok summary."""
    t = facts.torch
    if not t.get("cuda_initialized"):
        notes = ["CUDA not initialised yet: CUDA_VISIBLE_DEVICES may still be changed"]
    else:
        notes = ["CUDA is already initialised: changes to CUDA_VISIBLE_DEVICES from here on are ignored"]
        for index, mem in sorted((t.get("cuda_memory") or {}).items()):
            reserved, allocated = mem.get("reserved_bytes"), mem.get("allocated_bytes")
            if isinstance(reserved, int) and isinstance(allocated, int):
                notes.append(f"GPU {index}: {format_bytes(reserved)} reserved, {format_bytes(allocated)} allocated")
    return notes + [f"torch uses {t.get('num_threads')} intra-op threads"]


def judge(facts: LiveFacts, settings: Mapping[str, Any]) -> Result:
    t = facts.torch
    out: dict[str, Any] = {"cuda_initialized": t.get("cuda_initialized"), "num_threads": t.get("num_threads"),
                           "device_count": t.get("device_count"), "cuda_memory": t.get("cuda_memory", {})}
    if "CUDA_VISIBLE_DEVICES" in facts.env:
        out["CUDA_VISIBLE_DEVICES"] = facts.env["CUDA_VISIBLE_DEVICES"]
    out["effective_cpus"], out["thread_share"] = facts.effective_cpus, thread_share(facts.effective_cpus, facts.env)
    findings = [finding for rule in RULES for finding in rule(facts, settings)]
    return verdict(findings, out, "; ".join(_notes(facts)))


CHECK = Check(
    id="preflight.live",
    title="Inside the training script: CUDA_VISIBLE_DEVICES set in time, allocator not fragmented, threads fit the CPUs",
    gather=gather,
    judge=judge,
    explain=__doc__ or "",
    needs=("torch",),
    modes=("inprocess",),  # needs the script's live torch; `envdoctor check` has none to read
    intrusive=False,
    config={"fragmentation_bytes": GIB},  # warn when reserved exceeds allocated by this much (and by 2x)
)
