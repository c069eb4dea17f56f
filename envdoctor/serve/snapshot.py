"""One completed run, rendered once: what every request is answered from.

The scheduler builds a Snapshot at the end of a run and swaps it in whole (one
attribute assignment, atomic under the GIL); a request reads the attribute once
and copies bytes. Nothing a client sends can make the daemon render or run checks.
"""

from __future__ import annotations

import time

from envdoctor.record import Value


class Snapshot(Value):
    def __init__(
        self,
        metrics: bytes,  # Prometheus text exposition, no timestamps
        metrics_gzip: bytes,  # the same, compressed once per run for scrapers that accept gzip (Prometheus does)
        report: bytes,  # the JSON report of every target (schema envdoctor.report/v1)
        completed_at: float,  # Unix time the run finished
        completed_monotonic: float,  # the same, on the monotonic clock (for /healthz)
        run_seconds: float,
        targets: tuple[str, ...] | None = None,
    ) -> None:
        self.metrics = metrics
        self.metrics_gzip = metrics_gzip
        self.report = report
        self.completed_at = completed_at
        self.completed_monotonic = completed_monotonic
        self.run_seconds = run_seconds
        self.targets = () if targets is None else targets


def empty() -> Snapshot:
    """Before the first run completes: /metrics answers 503, /healthz says why."""
    return Snapshot(metrics=b"", metrics_gzip=b"", report=b"", completed_at=0.0, completed_monotonic=float("-inf"), run_seconds=0.0)


def age(snapshot: Snapshot, now: float | None = None) -> float:
    """Seconds since the snapshot's run completed (infinite before the first)."""
    return (time.monotonic() if now is None else now) - snapshot.completed_monotonic
