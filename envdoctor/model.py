"""The result model every check returns and every exporter reads.

A result is one judgement about one target: a status, a one-line summary written
like an NHC message (subject, observed, expected), the one-line fix a user can
paste, and the typed facts it was judged on. Facts stay machine-readable (bytes
as integers, never "64M") so JSON consumers and Prometheus gauges get numbers.
"""

from __future__ import annotations

import enum
import os
import re
import time
from collections.abc import Mapping

from envdoctor.record import Record, Value

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Iterable

SCHEMA = "envdoctor.report/v1"


class Status(str, enum.Enum):
    """How a check judged its target; ordered by how loudly it should speak."""

    OK = "ok"
    SKIP = "skip"  # cannot apply here (no GPU, no torch, no permission); reason given
    WARN = "warn"
    FAIL = "fail"
    ERROR = "error"  # the check itself broke or timed out; the run went on

    @property
    def severity(self) -> int:
        return _SEVERITY[self]

    def __str__(self) -> str:  # so f"{status}" prints "warn", not "Status.WARN"
        return self.value


_SEVERITY = {Status.OK: 0, Status.SKIP: 0, Status.WARN: 1, Status.FAIL: 2, Status.ERROR: 2}


class Result(Record):
    """One check's verdict on one target.

    Checks build these with the helpers below and leave `check`, `target` and
    `duration_seconds` empty: the runner fills them in, so a check cannot lie
    about who it is or how long it took.
    """

    def __init__(
        self,
        status: Status,
        summary: str,
        remediation: str = "",
        facts: dict[str, Any] | None = None,
        check: str = "",
        target: str = "",
        duration_seconds: float = 0.0,
        fix_env: dict[str, str | None] | None = None,  # environment changes that would fix it (None: unset)
    ) -> None:
        self.status = status
        self.summary = summary
        self.remediation = remediation
        self.facts = {} if facts is None else facts
        self.check = check
        self.target = target
        self.duration_seconds = duration_seconds
        self.fix_env = {} if fix_env is None else fix_env

    def to_dict(self) -> dict[str, Any]:
        out = {
            "check": self.check,
            "target": self.target,
            "status": self.status.value,
            "summary": self.summary,
            "remediation": self.remediation,
            "facts": self.facts,
            "duration_seconds": round(self.duration_seconds, 6),
        }
        if self.fix_env:
            out["fix_env"] = dict(self.fix_env)
        return out


def ok(summary: str, **facts: Any) -> Result:
    return Result(Status.OK, summary, "", facts)


def warn(summary: str, fix: str, **facts: Any) -> Result:
    return Result(Status.WARN, summary, fix, facts)


def fail(summary: str, fix: str, **facts: Any) -> Result:
    return Result(Status.FAIL, summary, fix, facts)


def skip(reason: str, **facts: Any) -> Result:
    return Result(Status.SKIP, reason, "", facts)


def error(summary: str, **facts: Any) -> Result:
    return Result(Status.ERROR, summary, "", facts)


class Finding(Value):
    """One thing a check noticed: how loud, what (subject, observed, expected), the
    fix a person can paste, and the environment changes that would fix it as data
    (`{"OMP_NUM_THREADS": "2"}`), so `envdoctor exec --fix` can apply them.

    In `env` a string sets the variable, the empty string included (an empty
    CUDA_VISIBLE_DEVICES means "no GPU", not "unset"), and None unsets it
    (`{"CUDA_LAUNCH_BLOCKING": None}`): the one convention whoever applies them follows."""

    def __init__(
        self,
        status: Status,
        message: str,
        fix: str = "",
        env: Mapping[str, str | None] | None = None,
    ) -> None:
        self.status = status
        self.message = message
        self.fix = fix
        self.env = {} if env is None else env


def as_finding(item: "Finding | tuple") -> Finding:
    """A Finding from a Finding or a (status, message[, fix]) tuple, the older shape."""
    if isinstance(item, Finding):
        return item
    status, message, *rest = item
    return Finding(status, message, rest[0] if rest else "")


def loudest_first(findings: Iterable["Finding | tuple"]) -> list[Finding]:
    # stable: same-status findings keep their order
    return sorted((as_finding(f) for f in findings), key=lambda f: -f.status.severity)


_OPENS, _CLOSES = "([{", ")]}"


def fix_clauses(fix: str) -> list[str]:
    """A fix's steps: split at "; ", but not inside brackets or `code` ("lower
    num_workers (slower loading; num_workers=0 uses no shared memory)" is one step)."""
    clauses, start, depth, in_code = [], 0, 0, False
    for i, char in enumerate(fix):
        if char == "`":
            in_code = not in_code
        elif in_code:
            continue
        elif char in _OPENS:
            depth += 1
        elif char in _CLOSES:
            depth = max(0, depth - 1)
        elif char == ";" and depth == 0 and fix.startswith("; ", i):
            clauses.append(fix[start:i])
            start = i + 2
    clauses.append(fix[start:])
    return [c for c in clauses if c]


def join_fixes(findings: Iterable[Finding]) -> str:
    """Every distinct fix of a check's findings, worst finding first, as one line.

    A check reports one result, but each of its findings needs its own fix: a
    user who fixes only the first would meet the next on the following run. Fixes
    are compared clause by clause ("; "): two findings of one cause often share a
    step (cpu.threads' unset variables and the live thread count both say `export
    OMP_NUM_THREADS=...`), and the line should give it once.
    """
    # A fix's shell comment ("export X=eth0  # exact names, see ...", "# and ...") is kept whole
    # and goes to the end of the line, so a pasted line runs every command: left in place it
    # commented out every step after it (helper-54, helper-55).
    commands: list[str] = []
    comments: list[str] = []
    for finding in loudest_first(findings):
        command, comment = _split_comment(finding.fix or "")
        for clause in fix_clauses(command) if command else ():
            if clause and clause not in commands:
                commands.append(clause)
        if comment and comment not in comments:
            comments.append(comment)
    line, note = "; ".join(commands), "; ".join(comments)
    if not note:
        return line
    return f"{line}  # {note}" if line else f"# {note}"


def _split_comment(fix: str) -> tuple[str, str]:
    """(the commands, the shell comment after them) of one fix: the comment starts at a
    clause that begins with "#" or at the first "  # "."""
    clauses = fix_clauses(fix) if fix else []
    for index, clause in enumerate(clauses):
        if clause.startswith("#"):
            return "; ".join(clauses[:index]), "; ".join([clause[1:].strip(), *clauses[index + 1:]])
        if "  # " in clause:
            head, _, tail = clause.partition("  # ")
            return "; ".join([*clauses[:index], head.rstrip()]), "; ".join([tail.strip(), *clauses[index + 1:]])
    return fix, ""


def verdict(findings: Iterable[Finding], facts: Mapping[str, Any], ok_summary: str, *, note: str = "") -> Result:
    """The one way a check turns its findings into a result.

    No warn/fail finding: `ok` with `ok_summary`. Otherwise the loudest status,
    the messages loudest first, every distinct fix, and the environment changes
    of every finding (the loudest finding wins where two set the same variable).
    `note` is context appended to the summary in parentheses either way.
    """
    loud = [f for f in loudest_first(findings) if f.status in (Status.WARN, Status.FAIL, Status.ERROR)]
    suffix = f" ({note})" if note else ""
    if not loud:
        return Result(Status.OK, ok_summary + suffix, "", dict(facts))
    env: dict[str, str | None] = {}
    for finding in loud:
        for name, value in finding.env.items():
            env.setdefault(name, value)
    return Result(worst([f.status for f in loud]), "; ".join(f.message for f in loud) + suffix,
                  join_fixes(loud), dict(facts), fix_env=env)


def malformed(result: Result) -> str | None:
    """What is wrong with a Result a check built by hand, or None. The report, serve's
    metrics and exec's --fix read these fields as their types, and one plug-in's
    `Result(Status.WARN, None)` or `env={"BAD NAME": 5}` broke every command that ran it,
    all the other checks' results with it. Cheap enough for every result of every run:
    the fields, not a walk of the facts (their values are rendered whatever they are)."""
    if not isinstance(result.status, Status):
        return f"status is {result.status!r}, not an envdoctor.model.Status"
    for name in ("summary", "remediation"):
        value = getattr(result, name)
        if not isinstance(value, str):
            return f"{name} is {_a(value)}, not a str"
    if not isinstance(result.facts, dict):
        return f"facts is {_a(result.facts)}, not a dict"
    odd = next((key for key in result.facts if not isinstance(key, str)), None)
    if odd is not None:
        return f"facts has the key {odd!r}, not a str"
    if not isinstance(result.fix_env, Mapping):
        return f"fix_env is {_a(result.fix_env)}, not a dict"
    for name, value in result.fix_env.items():
        if not isinstance(name, str) or not _VARIABLE.fullmatch(name):  # as --keep takes them: `A B` is no variable
            return f"an environment change names {name!r}, not a variable (a Finding's env)"
        if value is not None and (not isinstance(value, str) or "\0" in value or not _encodable(value)):
            return f"the environment change for {name} is {value!r}, not a str or None (a Finding's env)"
    return None


_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _a(value: Any) -> str:
    """'an int', 'a NoneType': the type of `value` with its article."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _encodable(text: str) -> bool:
    """What execve can be given: a lone surrogate ('\\ud800') is no byte, and --fix died on it."""
    try:
        text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return True


_MAX_DEPTH, _MAX_ITEMS, _MAX_INT_BITS = 64, 200_000, 13_000  # 13,000 bits: ~3,900 digits, under JSON's 4,300


def malformed_facts(facts: Mapping[str, Any], metrics: Iterable[Any] = ()) -> str | None:
    """What in a plug-in's facts no reader can take, or None: a key that is not a str at
    any depth (the report's JSON has only str keys, and a tuple key broke redaction), a
    structure deeper than 64 or holding itself, an integer too long for JSON, or a value
    a declared metric cannot be (`float()` of it fails). One walk, bounded; the
    built-in checks' facts, rendered by the same code every run, are not walked."""
    stack: list[tuple[Any, int, bool]] = [(facts, 0, False)]  # (value, depth, leaving it)
    on_path: set[int] = set()  # the containers above the one being looked at: a shared one is fine, a cycle is not
    seen = 0
    while stack:
        value, depth, leaving = stack.pop()
        if leaving:
            on_path.discard(id(value))
            continue
        seen += 1
        if seen > _MAX_ITEMS:
            return f"facts hold more than {_MAX_ITEMS} values"
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > _MAX_INT_BITS:
            return f"facts hold an integer of {value.bit_length()} bits, too long for a report"
        if isinstance(value, (str, bytes, int, float)) or value is None:
            continue
        if isinstance(value, Mapping):
            odd = next((key for key in value if not isinstance(key, str)), None)
            if odd is not None:
                return f"facts hold the key {odd!r}, not a str"
            children = list(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            children = list(value)
        else:
            continue
        if depth >= _MAX_DEPTH or id(value) in on_path:
            return f"facts are nested deeper than {_MAX_DEPTH} levels, or hold themselves"
        on_path.add(id(value))
        stack.append((value, depth, True))
        stack.extend((child, depth + 1, False) for child in children)
    for metric in metrics:
        value = facts.get(metric.fact)
        values = value.values() if metric.label and isinstance(value, Mapping) else [value]
        for number in values:
            if isinstance(number, (int, float)):
                try:
                    float(number)
                except OverflowError:
                    return f"the metric fact {metric.fact!r} holds {str(number)[:20]}..., too large for a number"
    return None


def worst(statuses: list[Status]) -> Status:
    """The loudest status among several findings (OK when there are none)."""
    return max(statuses, key=lambda s: s.severity, default=Status.OK)


def started_now() -> str:
    """This second in UTC as ISO 8601 (`2026-11-26T14:31:38+00:00`), a report's started_at:
    what datetime.now(timezone.utc).isoformat(timespec="seconds") gives, without
    importing datetime on exec's pre-flight (~1 ms of every container start). From
    time.time(), datetime's clock: gmtime() with no argument asks the C library's
    time(), whose coarse clock lags by up to a tick, and at a second's turn it named
    the second before the one datetime had just given (a suite run saw :59 for :00)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time()))


def host_name() -> str:
    """This machine's name, a report's host: what socket.gethostname() gives (glibc asks
    uname() for it), without importing socket on every start (~3 ms)."""
    return os.uname().nodename


class Report(Record):
    """Everything one run produced: the header facts, the system facts and the results."""

    def __init__(
        self,
        host: str,
        version: str,
        started_at: str,  # ISO 8601, UTC
        target: str,
        results: list[Result],
        system: dict[str, Any] | None = None,
        duration_seconds: float = 0.0,
        started_unix: float | None = None,
    ) -> None:
        self.host = host
        self.version = version
        self.started_at = started_at
        self.target = target
        self.results = results
        self.system = {} if system is None else system
        self.duration_seconds = duration_seconds
        # the same instant to the millisecond, for the metrics (started_at is whole seconds, the
        # JSON contract's): not in to_dict. None for a report read back from JSON
        self.started_unix = started_unix

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "host": self.host,
            "version": self.version,
            "started_at": self.started_at,
            "target": self.target,
            "duration_seconds": round(self.duration_seconds, 6),
            "system": self.system,
            "results": [r.to_dict() for r in self.results],
        }

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in Status}
        for r in self.results:
            counts[r.status.value] += 1
        return counts
