"""How a check declares itself: metadata as data, plus one function.

A check module exposes `CHECK = Check(...)` and an entry point in the
`envdoctor.checks` group names it. Everything the engine needs to know about a
check (its id, what it needs, its config keys and their defaults, the metrics its
facts become) is here as data, so there is no second list to keep in step: the
config validator, `envdoctor checks`, `envdoctor explain` and the Prometheus
exporter all read the same declaration.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from envdoctor.context import Context
    from envdoctor.model import Result

ID_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")

# What a check may need. A check that declares a need is skipped, with the reason,
# when the need cannot be met here, before its function runs.
NEEDS = ("nvml", "torch", "onnx")


@dataclass(frozen=True)
class Metric:
    """A fact exported as a Prometheus gauge.

    `fact` names a key of Result.facts. When `label` is set the fact is a mapping
    {label value: number} and becomes one sample per entry (for example
    `memory="host"` / `memory="gpu0"`). Label values must be bounded names, never
    free-form text (DESIGN principle 3).
    """

    name: str  # without the envdoctor_ prefix, base unit in the name: "shm_size_bytes"
    fact: str
    help: str
    label: str | None = None


@dataclass(frozen=True)
class Check:
    id: str
    title: str  # one line: what the check protects against
    run: Callable[["Context"], "Result"]
    explain: str = ""  # what it reads, why it matters to a CUDA job, how to fix it
    needs: tuple[str, ...] = ()
    enabled: bool = True  # on by default?
    timeout: float | None = None  # seconds; None means the run's default
    config: dict[str, Any] = field(default_factory=dict)  # keys and defaults
    metrics: tuple[Metric, ...] = ()

    def __post_init__(self) -> None:
        if not ID_PATTERN.match(self.id):
            raise ValueError(f"check id {self.id!r} is not a dotted lower-case id like 'shm.size'")
        unknown = set(self.needs) - set(NEEDS)
        if unknown:
            raise ValueError(f"check {self.id}: unknown needs {sorted(unknown)}; known: {NEEDS}")
