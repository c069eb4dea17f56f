"""The environment changes `envdoctor exec --fix` makes, worked out from results.

A check says what would fix it as data: `Result.fix_env` ({"OMP_NUM_THREADS":
"2"}), merged from its findings by model.verdict. Where a check does not give
that yet, the rules below derive the same changes from the check's facts, so
`--fix` works with the checks as they are and switches to `fix_env` check by
check as they adopt it (a non-empty `fix_env` always wins).

Only environment variables are changed, and only in the environment handed to
the command: nothing here writes a file or touches the running system. What
cannot be fixed from inside a container (a 64 MiB /dev/shm, a driver too old)
has no change here; the caller says so, with the check's outside fix.
`--keep VAR` protects a variable: the change is reported as kept, not made.
"""

from __future__ import annotations


from envdoctor.record import Record, Value

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Sequence

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
DETERMINISTIC_CUBLAS = ":4096:8"
_LOUD = ("warn", "fail", "error")


class Change(Value):
    """One variable set for the command: from `old` to `new` (None: unset), and why."""

    def __init__(
        self,
        name: str,
        old: str | None,
        new: str | None,
        reason: str,
        check: str,
    ) -> None:
        self.name = name
        self.old = old
        self.new = new
        self.reason = reason
        self.check = check

    def describe(self) -> str:
        """`OMP_NUM_THREADS 16 -> 2 (2 CPUs of cgroup quota)`; an unset variable shows as `unset`."""
        return (f"{self.name} {self.old if self.old is not None else 'unset'} -> "
                f"{self.new if self.new is not None else 'unset'} ({self.reason})")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "from": self.old, "to": self.new, "reason": self.reason, "check": self.check}


class FixPlan(Record):
    def __init__(
        self,
        changes: list[Change],  # to apply
        kept: list[Change],  # wanted, but protected by --keep
    ) -> None:
        self.changes = changes
        self.kept = kept


def _cpus(value: Any) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{number:g}" if number == int(number) else f"{number:.2f}".rstrip("0")


_SOURCES = {"cgroup quota": "cgroup quota", "affinity": "the affinity mask", "online CPUs": "the CPUs online"}


def _thread_reason(facts: Mapping[str, Any]) -> str:
    """Where the thread count comes from: `2 CPUs of cgroup quota / 4 local ranks`."""
    effective = facts.get("effective_cpus")
    if effective is None:
        online = facts.get("affinity_cpus") or facts.get("online_cpus")
        text = f"{online} visible CPUs" if online else "the CPUs visible"
    else:
        source = _SOURCES.get(facts.get("limited_by") or "", "this machine")
        text = f"{_cpus(effective)} CPU{'' if float(effective) == 1 else 's'} of {source}"
    ranks = facts.get("processes_per_node") or 1
    if isinstance(ranks, int) and ranks > 1:
        text += f" / {ranks} local ranks"
    workers = facts.get("num_workers") or 0
    if isinstance(workers, int) and workers > 0:
        text += f" less {workers} DataLoader workers"
    return text


def _threads(result: Mapping[str, Any]) -> dict[str, str]:
    """cpu.threads: every thread variable set to the CPUs each local rank may use."""
    recommended = result.get("facts", {}).get("recommended_threads")
    if not isinstance(recommended, int) or recommended < 1:
        return {}
    return {name: str(recommended) for name in THREAD_VARS}


def _device_order(result: Mapping[str, Any]) -> dict[str, str]:
    """cuda.visible_devices: mixed GPU models numbered by CUDA's fastest-first order."""
    if "CUDA_DEVICE_ORDER=PCI_BUS_ID" in (result.get("remediation") or ""):
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    return {}


def _cublas(result: Mapping[str, Any]) -> dict[str, str]:
    """torch.cudnn: deterministic algorithms requested without a deterministic cuBLAS workspace."""
    facts = result.get("facts", {})
    if facts.get("deterministic_algorithms") and facts.get("cublas_deterministic") is False:
        return {"CUBLAS_WORKSPACE_CONFIG": DETERMINISTIC_CUBLAS}
    return {}


# check id -> (derive the changes from a result without fix_env, why in a few words)
_RULES: dict[str, tuple[Callable[[Mapping[str, Any]], dict[str, str]], Callable[[Mapping[str, Any]], str]]] = {
    "cpu.threads": (_threads, _thread_reason),
    "cuda.visible_devices": (_device_order, lambda facts: "GPU models differ: CUDA's order would not be nvidia-smi's"),
    "torch.cudnn": (_cublas, lambda facts: "deterministic algorithms need a deterministic cuBLAS workspace"),
}


def wanted(result: Mapping[str, Any]) -> dict[str, str | None]:
    """The variables that would fix `result` (a Result.to_dict()): its fix_env, else a rule's.
    None unsets the variable (model.Finding's convention), never the string "None"."""
    if result.get("status") not in _LOUD:
        return {}
    given = result.get("fix_env") or {}
    if given:
        return {str(k): (None if v is None else str(v)) for k, v in given.items()}
    rule = _RULES.get(result.get("check", ""))
    return rule[0](result) if rule else {}


_REASON_CHARS = 200


def reason(result: Mapping[str, Any], name: str | None = None) -> str:
    """Why `name` is changed, in a few words: the rule's, when its rule derives that change;
    else what the check found (its summary), so a fix is never explained by another finding's
    words (`CUDA_VISIBLE_DEVICES=0,x,1` was logged as "GPU models differ")."""
    rule = _RULES.get(result.get("check", ""))
    if rule and (name is None or name in rule[0](result)):
        return rule[1](result.get("facts", {}))
    summary = str(result.get("summary") or "").strip()
    if not summary:
        return f"from {result.get('check')}"
    name, sep, rest = summary.partition("': ")  # `CUDA_VISIBLE_DEVICES='0,x,1': entry ...`: the log shows the value
    if sep and "=" in name and " " not in name.split("=", 1)[0]:
        summary = rest
    return summary if len(summary) <= _REASON_CHARS else summary[:_REASON_CHARS - 1].rstrip() + "…"


def plan(results: Sequence[Mapping[str, Any]], env: Mapping[str, str], keep: Sequence[str] = ()) -> FixPlan:
    """What --fix changes in `env`: each variable once (the first result, loudest in the
    caller's order, wins), nothing that already has the wanted value, nothing in `keep`."""
    protected = set(keep)
    seen: set[str] = set()
    changes: list[Change] = []
    kept: list[Change] = []
    for result in results:
        for name, value in wanted(result).items():
            if name in seen:
                continue
            seen.add(name)
            if env.get(name) == value:
                continue
            change = Change(name, env.get(name), value, reason(result, name), str(result.get("check", "")))
            (kept if name in protected else changes).append(change)
    # only a kept variable the job set holds the others: one it left unset has no value for them
    # to disagree with (helper-53: --keep VECLIB_MAXIMUM_THREADS, unset, left OMP=16 unfixed)
    held = next((name for name in keep if name in THREAD_VARS and env.get(name) is not None), None)
    if held is not None:
        # `--keep` of a thread variable: the thread counts are the job's decision. Those it did
        # not set stay unset (MKL and OpenBLAS follow OMP_NUM_THREADS then); those it set stay as
        # set. Set to the fix, they disagreed with the kept one, and the re-judged row blamed on
        # the job a disagreement --fix had made (helper-38, helper-49; helper-52 for MKL).
        follow = [c for c in changes if c.name in THREAD_VARS]
        changes = [c for c in changes if c not in follow]
        kept += [Change(c.name, c.old, c.new, f"{c.reason}; " + (f"left unset beside the kept {held}"
                                                                 if c.old is None else "left as the job set it, "
                                                                 f"beside the kept {held}"), c.check)
                 for c in follow]
    return FixPlan(changes, kept)


def apply(env: Mapping[str, str], changes: Sequence[Change]) -> dict[str, str]:
    """A copy of `env` with `changes` made (a change to None unsets the variable)."""
    out = dict(env)
    for change in changes:
        if change.new is None:
            out.pop(change.name, None)
        else:
            out[change.name] = change.new
    return out
