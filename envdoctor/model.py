"""The result model every check returns and every exporter reads.

A result is one judgement about one target: a status, a one-line summary written
like an NHC message (subject, observed, expected), the one-line fix a user can
paste, and the typed facts it was judged on. Facts stay machine-readable (bytes
as integers, never "64M") so JSON consumers and Prometheus gauges get numbers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

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


@dataclass
class Result:
    """One check's verdict on one target.

    Checks build these with the helpers below and leave `check`, `target` and
    `duration_seconds` empty: the runner fills them in, so a check cannot lie
    about who it is or how long it took.
    """

    status: Status
    summary: str
    remediation: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    check: str = ""
    target: str = ""
    duration_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "target": self.target,
            "status": self.status.value,
            "summary": self.summary,
            "remediation": self.remediation,
            "facts": self.facts,
            "duration_seconds": round(self.duration_seconds, 6),
        }


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


def join_fixes(findings) -> str:
    """Every distinct fix of a check's findings, worst finding first, as one line.

    A check reports one result, but each of its findings needs its own fix: a
    user who fixes only the first would meet the next on the following run.
    `findings` holds (status, message, fix) triples.
    """
    ordered = sorted(findings, key=lambda f: -f[0].severity)  # stable: same-status findings keep their order
    fixes: list[str] = []
    for _, _, fix in ordered:
        if fix and fix not in fixes:
            fixes.append(fix)
    return "; ".join(fixes)


def worst(statuses: list[Status]) -> Status:
    """The loudest status among several findings (OK when there are none)."""
    return max(statuses, key=lambda s: s.severity, default=Status.OK)


@dataclass
class Report:
    """Everything one run produced: the header facts, the system facts and the results."""

    host: str
    version: str
    started_at: str  # ISO 8601, UTC
    target: str
    results: list[Result]
    system: dict[str, Any] = field(default_factory=dict)
    duration_seconds: float = 0.0

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
