"""/report's bytes: the run's report as json.dumps writes it, encoded a target at a time.

Why: json.dumps keeps every piece it writes (a key, a value, a separator: ~20,000
small strings over 64 targets) in one list until it joins them, 1.2 MiB at the
run's highest point, and Python's allocator keeps the arena those pieces needed
after they are freed. Encoded a target's rows at a time the pieces of one target
are freed before the next are made. Measured in one process over 64 sleepers
after 12 runs, two pairs alternately: 13 arenas and 32.5-32.7 MiB of RSS against 14
and 33.4-33.5 MiB. The bytes are the same as one json.dumps of the whole report
(a test compares them).
"""

from __future__ import annotations

import json

from envdoctor.model import Report

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Sequence

    from envdoctor.model import Result

_EMPTY_RESULTS = '"results": []}'  # how the report without rows ends: results is its last key


def encode(report: Report, groups: Sequence[Sequence[Result]]) -> bytes:
    """The report's JSON and a newline. `groups`: its results split by target, in order
    (their concatenation is report.results, as the scheduler makes them). A report of
    another kind than the plain Report (a subclass's to_dict may derive fields from its
    results, or filter them: helper-109) is written whole."""
    head = json.dumps(report.replace(results=[]).to_dict(), default=str) if type(report) is Report else ""
    if not head.endswith(_EMPTY_RESULTS):  # a report laid out otherwise: written whole
        return (json.dumps(report.to_dict(), default=str) + "\n").encode()
    rows = (json.dumps([r.to_dict() for r in group], default=str)[1:-1] for group in groups if group)
    return "".join((head[:-3], "[", ", ".join(rows), "]}\n")).encode()
