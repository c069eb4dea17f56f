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
  threads it may run. The others take one integer; MKL_NUM_THREADS only as digits
  alone: with a blank or a sign (' 2', '+2') MKL refuses it, and torch runs one thread.
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
torch.set_num_threads(os.cpu_count()), give it the same number instead. More
processes per node than CPUs: fewer ranks per node (torchrun --nproc-per-node) or
more CPUs for the job; no thread setting clears that.
"""

from __future__ import annotations

import math
import os
from collections import namedtuple

from envdoctor.cgroup import EffectiveCpus, effective_cpus
from envdoctor.check import Check, Metric
from envdoctor.errors import ParseError
from envdoctor.quoted import quoted_value
from envdoctor.model import Finding, Result, Status, skip, verdict

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping

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
    if name == "MKL_NUM_THREADS" and value.strip().lstrip("+").isdigit() and not (value.isascii() and value.isdigit()):
        # libgomp, OpenBLAS and numexpr read ' 2', '2 ' and '+2' as 2; MKL refuses them (helper-80)
        raise ParseError("MKL reads digits alone, without blanks or a sign")
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
        if part.startswith("+"):  # strtoul (libgomp), atoi (OpenBLAS) and int() take a sign: +1 is 1 thread
            part = part[1:]
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


class ThreadFacts(namedtuple("ThreadFacts", (
        "variables",  # Mapping[str, str]: the thread variables that are set, as set
        "local_world_size",  # str | None: LOCAL_WORLD_SIZE as set, None when unset
        "cpus",  # EffectiveCpus
        "notes",  # tuple[str, ...] = ()
        "live_threads",  # int | None = None: torch.get_num_threads() in the attached job (envdoctor.attach)
        "live_workers",  # int | None = None: DataLoader workers the attached job runs
), defaults=((), None, None))):
    __slots__ = ()


def _whose_cpus(ctx) -> int | None:
    """Whose CPUs the row weighs: the target's own, or for serve's node target PID 1's, the
    node's init. The daemon stands in for the node everywhere else, but its own limits are
    not the node's: read from the daemon, the systemd unit's CPUQuota=20% made every node's
    row warn "0.2 effective CPUs", and the alert fire (helper-115); a DaemonSet's CPU limit
    would too. Where that procfs's PID 1 is the daemon itself (a container's entrypoint
    without the host's PID namespace), the daemon's own are all there is to read."""
    if ctx.target.kind != "node":
        return ctx.target.pid
    try:
        if os.readlink(ctx.roots.proc(None)) == "1":  # <procfs>/self -> "1": we are its PID 1
            return None
    except OSError:
        pass
    return 1


def gather(ctx) -> ThreadFacts:
    env = ctx.env  # Unavailable (unreadable environ) becomes a skip in the runner
    cpus = effective_cpus(ctx.roots, _whose_cpus(ctx), ctx.host.fact)  # one quota lookup per cgroup per run
    from envdoctor.attach_reader import live_facts

    live = live_facts(ctx)
    # /proc/N/environ is the environment the job started with; a job that sets its thread
    # variables itself (os.environ[...] = "1" before `import torch`, a common pattern) shows
    # them in its live view, which wins (helper-75: "OMP_NUM_THREADS unset" for a job at 1)
    published = live.env
    variables = {name: published.get(name, env.get(name)) for name in THREAD_VARS if name in published or name in env}
    changed = sorted(name for name in published if name in THREAD_VARS and published[name] != env.get(name))
    loader = live.busiest_loader() or {}
    workers = loader.get("num_workers")
    # a document that was there but refused is said: the verdict is then without the live view
    notes = (f"the job's live view was not used: {live.refused}",) if live.refused else ()
    if changed:
        notes += (f"{', '.join(f'{n}={published[n]}' for n in changed)} as the running job set it "
                  "(live; its environment at start said otherwise)",)
    return ThreadFacts(variables, env.get("LOCAL_WORLD_SIZE"), cpus, notes=notes, live_threads=live.num_threads,
                       live_workers=workers if isinstance(workers, int) and workers >= 0 else None)


def _fmt_cpus(cpus: float) -> str:
    """2, 0.5, 1.25; a quota under 0.005 CPU in two significant digits (0.001), not "0."."""
    if cpus == int(cpus):
        return f"{cpus:g}"
    text = f"{cpus:.2f}".rstrip("0").rstrip(".")
    return text if text != "0" else f"{cpus:.2g}"


def local_world_size(value: str | None) -> int | None:
    """LOCAL_WORLD_SIZE (ranks on this node) when it is a positive integer, else None."""
    if value is None:
        return None
    try:
        return parse_thread_count("LOCAL_WORLD_SIZE", value)[0]
    except ParseError:
        return None


def per_process_share(cpus: float, processes: int, workers: int = 0) -> int:
    """Threads one process may run: its share of `cpus` among `processes`, less one CPU
    per DataLoader worker (torch runs one thread in each), never below 1."""
    return max(1, math.floor(cpus / processes + 1e-9) - workers)


# Not a setting a user gives: exec puts the count of `torchrun --nproc-per-node N` in
# processes_per_node, and this key says where it came from, so the line does not say "config".
PROCESSES_SOURCE = "processes_per_node_from"


def _processes(facts: ThreadFacts, settings: Mapping[str, Any]) -> tuple[int, str, str | None]:
    """(processes per node, where that number came from, a note when LOCAL_WORLD_SIZE is unusable)."""
    configured = int(settings["processes_per_node"] or 0)
    if facts.local_world_size is not None:
        count = local_world_size(facts.local_world_size)
        if count is not None:
            return count, "LOCAL_WORLD_SIZE", None
        note = f"LOCAL_WORLD_SIZE={facts.local_world_size!r} is not a positive integer (see dist.env); ignored"
        return max(1, configured), "config" if configured > 0 else "default", note
    if configured > 0:
        return configured, settings.get(PROCESSES_SOURCE) or "config processes_per_node", None
    return 1, "default", None


class Budget(namedtuple("Budget", (
        "effective",  # float | None
        "visible",  # int | None: cores a runtime sees when left to itself (affinity, else online)
        "processes",  # int
        "processes_from",  # str
        "workers",  # int
        "where",  # str: what limits the CPUs, in words
        "recommended",  # int | None
        "text",  # str: "4 effective CPUs (...) leaves 4 threads per process"
        "note",  # str | None
))):
    """The threads one process may run: its share of the effective CPUs, and how that was worked out."""

    __slots__ = ()


def _budget(facts: ThreadFacts, settings: Mapping[str, Any]) -> Budget:
    cpus = facts.cpus
    effective, visible = cpus.cpus, cpus.affinity or cpus.online
    processes, processes_from, note = _processes(facts, settings)
    workers = max(0, int(settings["num_workers"] or 0))
    if not workers and facts.live_workers:
        workers = facts.live_workers  # what the running job's DataLoader really starts (envdoctor.attach)
    where = f"{cpus.limited_by}" + (f" {cpus.quota.path}" if cpus.limited_by == "cgroup quota" and cpus.quota.path else "")
    if effective is None:
        recommended = per_process_share(visible, processes, workers) if visible is not None else None
        return Budget(None, visible, processes, processes_from, workers, where, recommended, "", note)
    recommended = per_process_share(effective, processes, workers)
    per = f" / {processes} processes per node ({processes_from})" if processes > 1 else ""
    per += f" less {_count(workers, 'DataLoader worker')} each" if workers else ""
    # helper-90: "0.5 CPUs less 3 workers leaves 1 thread" read as arithmetic; below one the
    # share is a floor, and said so
    floor = math.floor(effective / processes + 1e-9) - workers < 1
    leaves = ("leaves less than one CPU per process: 1 thread each, the least" if floor
              else f"leaves {_count(recommended, 'thread')} per process")
    text = f"{_fmt_cpus(effective)} effective CPUs ({where}){per} {leaves}"
    return Budget(effective, visible, processes, processes_from, workers, where, recommended, text, note)


def _counts(facts: ThreadFacts) -> dict[str, tuple[int, ...]]:
    """The thread counts of the variables that parse."""
    counts = {}
    for name, value in facts.variables.items():
        try:
            counts[name] = parse_thread_count(name, value)
        except ParseError:
            pass
    return counts


def _fix(budget: Budget) -> tuple[str, dict[str, str]]:
    """The five variables set to the per-process share: as a command and as environment changes."""
    env = {name: str(budget.recommended or 1) for name in THREAD_VARS}
    return "export " + " ".join(f"{k}={v}" for k, v in env.items()), env


def _finding(status: Status, message: str, budget: Budget) -> Finding:
    fix, env = _fix(budget)
    return Finding(status, message, fix, env=env)


def _rule_invalid_values(facts: ThreadFacts, budget: Budget) -> list[Finding]:
    """A value that is not a thread count is ignored: one thread per visible core again."""
    found = []
    for name, value in facts.variables.items():
        try:
            parse_thread_count(name, value)
        except ParseError as exc:
            found.append(_finding(Status.FAIL, f"{name}={quoted_value(value)} is invalid: {exc}; expected a positive integer, "
                                  f"and {_ignored(name, value)}", budget))
    return found


def _ignored(name: str, value: str) -> str:
    """What the runtime does with a value it cannot read. MKL refuses it and torch runs one
    thread, whatever OMP_NUM_THREADS says (measured: torch 2.13's MKL build, MKL_NUM_THREADS
    ' 2', '+2', 'abc' or '2,2': torch.get_num_threads() 1; '0': one per core)."""
    if name == "MKL_NUM_THREADS" and not (value.isascii() and value.isdigit()):
        return "MKL refuses it: torch then runs one thread, whatever the CPUs and OMP_NUM_THREADS"
    return "the runtime ignores it and starts one thread per visible core"


def _rule_disagree(facts: ThreadFacts, budget: Budget) -> list[Finding]:
    """Set variables should agree: each library sizes its own pool from its own."""
    outer = {name: c[0] for name, c in _counts(facts).items()}
    if len(set(outer.values())) <= 1:
        return []
    listed = ", ".join(f"{n}={facts.variables[n]}" for n in outer)
    return [_finding(Status.WARN, f"thread variables disagree: {listed}; expected one value for all", budget)]


def _rule_oversubscribed(facts: ThreadFacts, budget: Budget) -> list[Finding]:
    """More threads per process than its share of the effective CPUs."""
    if budget.effective is None or budget.recommended is None:
        return []
    counts = _counts(facts)
    over = {n: math.prod(c) for n, c in counts.items() if math.prod(c) > budget.recommended}
    if not over:
        return []
    listed = ", ".join(f"{n}={facts.variables[n]}" + (f" ({t} threads)" if len(counts[n]) > 1 else "")
                       for n, t in over.items())
    return [_finding(Status.WARN, f"oversubscribed: {listed}; {budget.text}", budget)]


def _rule_unset(facts: ThreadFacts, budget: Budget) -> list[Finding]:
    """An unset variable means one thread per visible core, more than the share."""
    if budget.effective is None or budget.visible is None or budget.recommended is None:
        return []
    omp_set = "OMP_NUM_THREADS" in _counts(facts)
    unset = [name for name in THREAD_VARS
             if name not in facts.variables and name != "VECLIB_MAXIMUM_THREADS"
             and not (name in _FALLS_BACK_TO_OMP and omp_set)  # follows OMP_NUM_THREADS, judged above
             and budget.visible > budget.recommended]
    if not unset:
        return []
    return [_finding(Status.WARN, f"{', '.join(unset)} unset: the runtime starts one thread per visible core "
                     f"({budget.visible}) in each process, but {budget.text}", budget)]


def _rule_too_many_processes(facts: ThreadFacts, budget: Budget) -> list[Finding]:
    """More ranks per node than CPUs: oversubscribed even at one thread each."""
    if budget.effective is None or budget.processes <= 1 or budget.processes <= budget.effective + 1e-9:
        return []
    fix, env = _fix(budget)  # one thread each is still right; alone it cannot clear this (helper-42)
    most = max(1, int(budget.effective + 1e-9))
    # the command first and the advice as a shell comment: the line pastes (helper-54)
    fix = (f"{fix}; # and run at most {most} process{'es' if most > 1 else ''} per node "
           f"(torchrun --nproc-per-node={most}), or give the job more CPUs (cgroup quota, affinity)")
    return [Finding(Status.WARN, f"{budget.processes} processes per node on {_fmt_cpus(budget.effective)} effective "
                    "CPUs oversubscribe even at one thread each; expected at most one process per CPU", fix, env=env)]


def _rule_live_threads(facts: ThreadFacts, budget: Budget) -> list[Finding]:
    """The attached job's torch runs more intra-op threads than its share (set in code, or its default)."""
    live = facts.live_threads
    if live is None or budget.recommended is None or budget.effective is None or live <= budget.recommended:
        return []
    loaders = f" + {_count(budget.workers, 'DataLoader worker')} (one thread each)" if budget.workers else ""
    fix, env = _fix(budget)
    return [Finding(Status.WARN, f"the running job's torch uses {_count(live, 'intra-op thread')} (live: "
                    f"torch.set_num_threads or its default){loaders} = {live + budget.workers} busy threads on "
                    f"{_fmt_cpus(budget.effective)} effective CPUs ({budget.where}); expected <= "
                    f"{_count(budget.recommended, 'thread')} in the main process",
                    f"{fix}; # and torch.set_num_threads({budget.recommended}) in the script", env=env)]


RULES = (_rule_invalid_values, _rule_disagree, _rule_oversubscribed, _rule_unset, _rule_live_threads,
         _rule_too_many_processes)


def _facts_out(facts: ThreadFacts, budget: Budget, findings: list[Finding]) -> dict[str, Any]:
    cpus = facts.cpus
    out: dict[str, Any] = {
        "effective_cpus": budget.effective,
        "affinity_cpus": cpus.affinity,
        "online_cpus": cpus.online,
        "limited_by": cpus.limited_by,
        **cpus.quota.to_facts(),
        "processes_per_node": budget.processes,
        "processes_per_node_source": budget.processes_from,
        "num_workers": budget.workers,
        "recommended_threads": budget.recommended,
        "live_threads": facts.live_threads,
        "live_workers": facts.live_workers,
        "variables": dict(facts.variables),
        "findings": [f"{f.status.value}: {f.message}" for f in findings],
    }
    notes = list(dict.fromkeys([*cpus.notes, *cpus.quota.notes, *facts.notes, *([budget.note] if budget.note else [])]))
    if notes:
        out["notes"] = notes
    return out


def judge(facts: ThreadFacts, settings: Mapping[str, Any]) -> Result:
    budget = _budget(facts, settings)
    findings = [finding for rule in RULES for finding in rule(facts, budget)]
    out = _facts_out(facts, budget, findings)
    if not findings and budget.effective is None:
        return skip("cannot tell how many CPUs the target may use: "
                    + ("; ".join(out.get("notes", [])) or "no affinity, quota or online count"), **out)
    # a value with a blank at an end quoted: shown bare, ' 4' read as "4" (helper-80)
    set_vars = ", ".join(f"{k}={v!r}" if v != v.strip() else f"{k}={v}"
                         for k, v in facts.variables.items()) or "no thread variables set"
    ok_summary = (f"threads fit: {set_vars}; {_fmt_cpus(budget.effective or 0)} effective CPUs ({budget.where}), "
                  f"{_count(budget.processes, 'process', 'processes')} per node, up to "
                  f"{_count(budget.recommended or 1, 'thread')} each")
    return verdict(findings, out, ok_summary)


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


CHECK = Check(
    id="cpu.threads",
    title="Thread pools (OMP/MKL/OpenBLAS) fit the CPUs the container's quota and affinity allow",
    gather=gather,
    judge=judge,
    modes=("check", "serve", "exec", "inprocess"),  # reads the environment and cgroup files: cheap, harmless
    intrusive=False,
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
