"""/report's bytes are encoded a target at a time (envdoctor.serve.report_json), to keep
json.dumps' pieces of the whole report from living at once: the bytes must be those of
one json.dumps of the whole report, whatever the rows, their facts and their grouping."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from envdoctor.model import Report, Result, Status
from envdoctor.serve import report_json

AWKWARD = ["", 'say "hi"', "back\\slash", "two\nlines", "ünïcødé ✓", '"results": []}', "\udcff"]


def whole(report: Report) -> bytes:
    return (json.dumps(report.to_dict(), default=str) + "\n").encode()


def random_rows(rng: random.Random, target: str) -> list[Result]:
    rows = []
    for n in range(rng.randint(0, 5)):
        facts = {rng.choice(AWKWARD): rng.choice([1, 2.5, math.nan, None, True, rng.choice(AWKWARD),
                                                  Path("/dev/shm"), {"results": []}, [1, "x"]])
                 for _ in range(rng.randint(0, 4))}
        fix_env = {"OMP_NUM_THREADS": "1", "X": None} if rng.random() < 0.3 else None
        rows.append(Result(rng.choice(list(Status)), rng.choice(AWKWARD), rng.choice(AWKWARD), facts,
                           check=f"check.{n}", target=target, duration_seconds=rng.random(), fix_env=fix_env))
    return rows


def test_the_bytes_are_one_json_dumps_of_the_whole_report():
    rng = random.Random(7)
    for case in range(300):
        groups = [random_rows(rng, "node" if g == 0 else f"pid:{g}") for g in range(rng.randint(0, 6))]
        report = Report(host=rng.choice(AWKWARD), version="1", started_at="2026-11-27T00:00:00+00:00", target="node",
                        results=[r for rows in groups for r in rows],
                        system=rng.choice([{}, {"results": []}, {"os": rng.choice(AWKWARD)}]),
                        duration_seconds=rng.random())
        assert report_json.encode(report, groups) == whole(report), case


def test_a_report_with_no_rows():
    report = Report(host="h", version="1", started_at="t", target="node", results=[])
    assert report_json.encode(report, []) == whole(report)
    assert report_json.encode(report, [[], []]) == whole(report)
    assert json.loads(report_json.encode(report, []))["results"] == []


def test_a_report_of_another_kind_is_written_whole():
    """A Report subclass may derive a field from its results or filter them in to_dict:
    its head made without results would lie, so it is written by one json.dumps."""
    from envdoctor.model import Status

    class Counted(Report):
        def to_dict(self):
            doc = super().to_dict()
            return {"counts": self.counts(), **doc, "results": [r for r in doc["results"] if r["status"] != "skip"]}

    rows = [Result(Status.OK, "fine", check="a", target="node"), Result(Status.SKIP, "no torch", check="b", target="node")]
    report = Counted(host="h", version="1", started_at="t", target="node", results=rows)
    assert report_json.encode(report, [rows]) == whole(report)
