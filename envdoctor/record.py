"""The base of envdoctor's value objects (results, findings, checks, plans, settings).

Why not dataclasses: `import dataclasses` imports `inspect` (and with it ast, dis and
tokenize), and every `@dataclass` compiles its methods when its module is imported.
On `envdoctor exec`'s pre-flight, which runs on every container start before the job,
that was about 19 ms of its 60 ms of imports (measured 2026-11-26 with
benchmarks/exec_vs_import_torch.py and `python -X importtime`). Here each class
writes its `__init__` out, so its fields and their defaults read where they are
declared; `repr`, equality, `replace()` and the hash of the frozen kinds keep
dataclasses' meaning (tests/test_record.py).
"""

from __future__ import annotations

from types import SimpleNamespace

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any


class Record(SimpleNamespace):
    """Fields are the parameters of `__init__`, which assigns them. Equal when of the same
    class with equal fields, and shown by them, as dataclasses were; what else an instance
    keeps (a cache) is neither compared nor shown."""

    # copy and pickle rebuild the instance from its attributes without calling __init__
    # (SimpleNamespace's own __reduce__ calls the class with no arguments)
    __reduce__ = object.__reduce__

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in vars(cls):  # `case Finding(status, message)`, as with a dataclass
            cls.__match_args__ = cls.field_names()

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The parameters of `__init__`, in order: the fields."""
        code = cls.__init__.__code__
        return code.co_varnames[1:code.co_argcount + code.co_kwonlyargcount]

    # fields left out of repr (long, or a secret's digest), as dataclasses' field(repr=False)
    _repr_hidden: tuple[str, ...] = ()

    def __repr__(self) -> str:
        shown = (f"{name}={getattr(self, name)!r}" for name in self.field_names() if name not in self._repr_hidden)
        return f"{type(self).__name__}({', '.join(shown)})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):  # another namespace is not equal for its attributes alone
            return False if isinstance(other, SimpleNamespace) else NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.field_names())

    def __ne__(self, other: object) -> bool:  # SimpleNamespace's own would compare attributes
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment] - mutable: unhashable, as a dataclass with eq

    def replace(self, **changes: Any) -> Any:
        """A new instance with some fields changed, built by `__init__` as dataclasses.replace
        built it: its checks run again (a Check's id) and what it derives is derived anew (a
        Session's environment). An unknown field is a TypeError, as it was there."""
        names = self.field_names()
        unknown = set(changes) - set(names)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(sorted(unknown))}")
        return type(self)(**{name: getattr(self, name) for name in names if name not in changes}, **changes)


class Value(Record):
    """A Record meant to stay as built (the frozen dataclasses it replaces): hashable by
    its fields, so it can be a dict key or a set member. Nothing stops an assignment."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(getattr(self, name) for name in self.field_names()))
