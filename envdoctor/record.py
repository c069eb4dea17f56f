"""The base of envdoctor's value objects (results, findings, checks, plans, settings).

Why not dataclasses: `import dataclasses` imports `inspect` (and with it ast, dis and
tokenize), and every `@dataclass` compiles its methods when its module is imported.
On `envdoctor exec`'s pre-flight, which runs on every container start before the job,
that was about 19 ms of its 60 ms of imports (measured 2026-11-26 with
benchmarks/exec_vs_import_torch.py and `python -X importtime`). Here each class
writes its `__init__` out, so its fields and their defaults read where they are
declared, and takes equality and `repr` from `types.SimpleNamespace`, which is C.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


class Record(SimpleNamespace):
    """Fields are what `__init__` assigns. Equal when of the same fields and values."""

    # copy and pickle rebuild the instance from its fields without calling __init__
    # (SimpleNamespace's own __reduce__ calls the class with no arguments)
    __reduce__ = object.__reduce__

    def replace(self, **changes: Any) -> Any:
        """A copy with some fields changed (what dataclasses.replace did); an unknown
        field is a TypeError, as it was there."""
        unknown = set(changes) - set(vars(self))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(sorted(unknown))}")
        copy = SimpleNamespace.__new__(type(self))
        copy.__dict__.update(vars(self), **changes)
        return copy


class Value(Record):
    """A Record meant to stay as built (the frozen dataclasses it replaces): hashable by
    its fields, so it can be a dict key or a set member. Nothing stops an assignment."""

    def __hash__(self) -> int:
        return hash(tuple(vars(self).items()))
