"""cpu.threads: thread-pool sizes against the CPUs the target can really use.

What it reads: the target's CPU affinity (sched_getaffinity, or Cpus_allowed_list
under the procfs root), its cgroup CPU quota (v1 cpu.cfs_quota_us/cpu.cfs_period_us,
v2 cpu.max; the tightest level on the cgroup path wins), the CPUs online, and the
variables OMP_NUM_THREADS, MKL_NUM_THREADS, OPENBLAS_NUM_THREADS,
VECLIB_MAXIMUM_THREADS and NUMEXPR_NUM_THREADS, plus LOCAL_WORLD_SIZE (ranks on
this node).

Why it matters: OpenMP, MKL, OpenBLAS and torch size their pools from the cores
they see, and a container's CPU limit is a CFS quota that hides nothing: a 4-CPU
container on a 128-core host starts 128 threads per process, the quota is spent
in a few milliseconds of each period, and every thread then waits for the next
one; spinning OpenMP barriers make it worse. Training crawls at 99% CPU. Recipes
that set these variables to multiprocessing.cpu_count() do the same, since that
counts the host's cores too. With several ranks per node each rank needs its share.

What it judges:
- fail: a variable set to something that is not a positive integer ("0", "auto",
  "4.0", '"4"' with the quotes kept): the runtime ignores it, prints at best a
  warning, and falls back to one thread per visible core. OMP_NUM_THREADS may be a
  comma list ("4,2") giving the team size of each nested level; it is accepted, its
  first entry is compared with the other variables, and since OpenMP activates as
  many nesting levels as the list has entries, the product (8) is counted as the
  threads it may run. The others take one integer.
- warn: set variables disagree (OMP_NUM_THREADS=4, MKL_NUM_THREADS=16).
- warn: threads per process exceed the target's share of CPUs: the effective CPUs
  (min of affinity and quota) divided by the processes per node (LOCAL_WORLD_SIZE,
  else config processes_per_node), less one CPU per DataLoader worker (config
  num_workers; torch runs one thread in each worker), never below 1.
- warn: a variable is unset where its default would oversubscribe: unset
  OMP_NUM_THREADS means one thread per visible core; MKL, OpenBLAS and numexpr fall
  back to OMP_NUM_THREADS, then to one per visible core. VECLIB_MAXIMUM_THREADS is
  read only by Apple's Accelerate and is never required here.
- warn: more processes per node than effective CPUs, even at one thread each.
- skip: the effective CPUs cannot be found and the variables give nothing to judge.

How to fix: export the number the check prints for all five variables, before
Python starts (`export OMP_NUM_THREADS=4 MKL_NUM_THREADS=4 ...`, `docker run -e
OMP_NUM_THREADS=4 ...`, or `env:` in a Kubernetes pod); if the script calls
torch.set_num_threads(os.cpu_count()), give it the same number instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from envdoctor.cgroup import EffectiveCpus, effective_cpus
from envdoctor.check import Check, Metric
from envdoctor.errors import ParseError
from envdoctor.model import Result, Status, fail, ok, skip, warn, worst

THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
# Libraries that fall back to OMP_NUM_THREADS when their own variable is unset.
_FALLS_BACK_TO_OMP = ("MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
_MAX_DIGITS = 9  # a billion threads is already absurd; keeps products of lists small
_MAX_LEVELS = 16


def parse_thread_count(name: str, value: str) -> tuple[int, ...]:
    """The thread counts a variable asks for: one per nesting level for OMP_NUM_THREADS
    ("4,2" -> (4, 2)), exactly one for the others. Raises ParseError saying why otherwise."""
    if not isinstance(value, str):
        raise ParseError(f"{name} must be text, got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise ParseError("it is empty")
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        raise ParseError("the quotes are part of the value (env files and YAML keep them); drop them")
    parts = text.split(",") if name == "OMP_NUM_THREADS" else [text]
    if len(parts) > _MAX_LEVELS:
        raise ParseError(f"it lists {len(parts)} nesting levels; more than {_MAX_LEVELS} is not a real setting")
    counts = []
    for part in parts:
        part = part.strip()
        if not part.isascii() or not part.isdigit():
            if name != "OMP_NUM_THREADS" and "," in text:
                raise ParseError("only OMP_NUM_THREADS takes a comma list; this one takes a single integer")
            raise ParseError(f"{part!r} is not a positive integer")
        if len(part) > _MAX_DIGITS:
            raise ParseError(f"{part!r} is not a plausible thread count")
        count = int(part)
        if count == 0:
            raise ParseError("0 is not a thread count")
        counts.append(count)
    return tuple(counts)


@dataclass(frozen=True)
class ThreadFacts:
    variables: Mapping[str, str]  # the thread variables that are set, as set
    local_world_size: str | None  # LOCAL_WORLD_SIZE as set, None when unset
    cpus: EffectiveCpus
    notes: tuple[str, ...] = field(default=())
    live_threads: int | None = None  # torch.get_num_threads() in the attached job (envdoctor.attach)
    live_workers: int | None = None  # DataLoader workers the attached job runs


def gather(ctx) -> ThreadFacts:
    env = ctx.env  # Unavailable (unreadable environ) becomes a skip in the runner
    variables = {name: env[name] for name in THREAD_VARS if name in env}
    cpus = effective_cpus(ctx.roots, ctx.target.pid)
    from envdoctor.attach_reader import live_facts

    live = live_facts(ctx)
    loader = live.busiest_loader() or {}
    workers = loader.get("num_workers")
    return ThreadFacts(variables, env.get("LOCAL_WORLD_SIZE"), cpus, live_threads=live.num_threads,
                       live_workers=workers if isinstance(workers, int) and workers >= 0 else None)


def _fmt_cpus(cpus: float) -> str:
    return f"{cpus:g}" if cpus == int(cpus) else f"{cpus:.2f}".rstrip("0")


def _processes(facts: ThreadFacts, config: Mapping[str, Any]) -> tuple[int, str, str | None]:
    """(processes per node, where that number came from, a note when LOCAL_WORLD_SIZE is unusable)."""
    configured = int(config.get("processes_per_node", 0) or 0)
    if facts.local_world_size is not None:
        try:
            (count,) = parse_thread_count("LOCAL_WORLD_SIZE", facts.local_world_size)
            return count, "LOCAL_WORLD_SIZE", None
        except (ParseError, ValueError):
            note = f"LOCAL_WORLD_SIZE={facts.local_world_size!r} is not a positive integer (see dist.env); ignored"
            return max(1, configured), "config" if configured > 0 else "default", note
    if configured > 0:
        return configured, "config processes_per_node", None
    return 1, "default", None


def judge(facts: ThreadFacts, config: Mapping[str, Any]) -> Result:
    findings: list[tuple[Status, str]] = []
    notes = list(dict.fromkeys([*facts.cpus.notes, *facts.cpus.quota.notes, *facts.notes]))

    # 1. every value that is set must be a thread count
    counts: dict[str, tuple[int, ...]] = {}
    for name, value in facts.variables.items():
        try:
            counts[name] = parse_thread_count(name, value)
        except ParseError as exc:
            findings.append((Status.FAIL, f"{name}={value!r} is invalid: {exc}; expected a positive integer, "
                                          "and the runtime ignores it and starts one thread per visible core"))

    # 2. the ones that are set should agree
    outer = {name: c[0] for name, c in counts.items()}
    if len(set(outer.values())) > 1:
        listed = ", ".join(f"{n}={facts.variables[n]}" for n in outer)
        findings.append((Status.WARN, f"thread variables disagree: {listed}; expected one value for all"))

    # 3. threads against the CPUs this process may use
    cpus = facts.cpus
    effective = cpus.cpus
    visible = cpus.affinity or cpus.online
    processes, processes_from, lws_note = _processes(facts, config)
    if lws_note:
        notes.append(lws_note)
    workers = max(0, int(config.get("num_workers", 0) or 0))
    if not workers and facts.live_workers:
        workers = facts.live_workers  # what the running job's DataLoader really starts
    where = f"{cpus.limited_by}" + (f" {cpus.quota.path}" if cpus.limited_by == "cgroup quota" and cpus.quota.path else "")

    recommended = None
    if effective is not None:
        recommended = max(1, math.floor(effective / processes + 1e-9) - workers)
        share = f"{_fmt_cpus(effective)} effective CPUs ({where})"
        per = f" / {processes} processes per node ({processes_from})" if processes > 1 else ""
        per += f" less {workers} DataLoader workers each" if workers else ""
        budget = f"{share}{per} leaves {_count(recommended, 'thread')} per process"

        threads = {name: math.prod(c) for name, c in counts.items()}
        over = {n: t for n, t in threads.items() if t > recommended}
        if over:
            listed = ", ".join(f"{n}={facts.variables[n]}" + (f" ({t} threads)" if len(counts[n]) > 1 else "")
                               for n, t in over.items())
            findings.append((Status.WARN, f"oversubscribed: {listed}; {budget}"))

        if visible is not None:
            omp = threads.get("OMP_NUM_THREADS")
            unset = []
            for name in THREAD_VARS:
                if name in facts.variables or name == "VECLIB_MAXIMUM_THREADS":
                    continue
                if name in _FALLS_BACK_TO_OMP and omp is not None:
                    continue  # follows OMP_NUM_THREADS, judged above
                if visible > recommended:
                    unset.append(name)
            if unset:
                findings.append((Status.WARN, f"{', '.join(unset)} unset: the runtime starts one thread per visible core "
                                              f"({visible}) in each process, but {budget}"))

        live = facts.live_threads
        if live is not None and live > recommended:
            loaders = f" + {_count(workers, 'DataLoader worker')} (one thread each)" if workers else ""
            findings.append((Status.WARN, f"the running job's torch uses {_count(live, 'intra-op thread')} (live: "
                                          f"torch.set_num_threads or its default){loaders} = {live + workers} busy threads "
                                          f"on {_fmt_cpus(effective)} effective CPUs ({where}); expected <= "
                                          f"{_count(recommended, 'thread')} in the main process"))

        if processes > 1 and processes > effective + 1e-9:
            findings.append((Status.WARN, f"{processes} processes per node on {_fmt_cpus(effective)} effective CPUs "
                                          "oversubscribe even at one thread each; expected at most one process per CPU"))
    elif visible is not None:
        recommended = max(1, visible // processes - workers)

    n = recommended or 1
    fix = "export " + " ".join(f"{name}={n}" for name in THREAD_VARS)
    if facts.live_threads is not None and recommended is not None and facts.live_threads > recommended:
        fix = f"torch.set_num_threads({n}) in the script; " + fix
    result_facts: dict[str, Any] = {
        "effective_cpus": effective,
        "affinity_cpus": cpus.affinity,
        "online_cpus": cpus.online,
        "limited_by": cpus.limited_by,
        **cpus.quota.to_facts(),
        "processes_per_node": processes,
        "processes_per_node_source": processes_from,
        "num_workers": workers,
        "recommended_threads": recommended,
        "live_threads": facts.live_threads,
        "live_workers": facts.live_workers,
        "variables": dict(facts.variables),
        "findings": [f"{s.value}: {m}" for s, m in findings],
    }
    if notes:
        result_facts["notes"] = notes

    if not findings:
        if effective is None:
            return skip("cannot tell how many CPUs the target may use: " + ("; ".join(notes) or "no affinity, quota or online count"),
                        **result_facts)
        set_vars = ", ".join(f"{k}={v}" for k, v in facts.variables.items()) or "no thread variables set"
        return ok(f"threads fit: {set_vars}; {_fmt_cpus(effective)} effective CPUs ({where}), "
                  f"{_count(processes, 'process', 'processes')} per node, up to {_count(recommended, 'thread')} each", **result_facts)

    status = worst([s for s, _ in findings])
    # the loudest finding first: it is the one a Slurm drain reason or a log line keeps
    ordered = [m for s, m in sorted(findings, key=lambda f: -f[0].severity)]
    summary = "; ".join(ordered)
    if status is Status.FAIL:
        return fail(summary, fix, **result_facts)
    return warn(summary, fix, **result_facts)


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


CHECK = Check(
    id="cpu.threads",
    title="Thread pools (OMP/MKL/OpenBLAS) fit the CPUs the container's quota and affinity allow",
    run=lambda ctx: judge(gather(ctx), ctx.config),
    explain=__doc__ or "",
    config={
        "processes_per_node": 0,  # 0: take LOCAL_WORLD_SIZE, else 1
        "num_workers": 0,  # DataLoader workers per process, each running one torch thread
    },
    metrics=(
        Metric("cpu_effective", "effective_cpus", "CPUs the target can use at once: min(affinity mask, cgroup CPU quota)"),
        Metric("cpu_quota_cpus", "quota_cpus", "The target's tightest cgroup CPU quota in CPUs (absent when there is none)"),
    ),
)
