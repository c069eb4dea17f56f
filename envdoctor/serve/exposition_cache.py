"""prometheus_client's text exposition, with each line's name and labels kept from
the run before.

Why: on a settled node serve renders the same series run after run (64 torch
processes: ~800 samples of durations, facts and target info), and only their values
change. prometheus_client escapes and validates every label of every sample on every
render: 9.1 ms of a ~135 ms run, 5.2 ms this way. Here each family's header lines and each
sample's `name{labels} ` are prometheus_client's own bytes, rendered once the first
time that series appears (by `generate_latest`, over that one family or sample); only
the value is spelt anew each run, by prometheus_client's `floatToGoString`. So the
bytes are generate_latest's, as a test compares family by family.

A family the line grammar `name{labels} value` does not cover as is (a sample with a
timestamp or an exemplar, or the OpenMetrics `_created`/`_gsum`/`_gcount` samples that
generate_latest moves into gauges of their own) is rendered whole by generate_latest.
What a run did not use is forgotten, so the memory follows the series a node has now.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Iterable, Iterator

_MOVED_SUFFIXES = ("_created", "_gsum", "_gcount")  # samples generate_latest renders apart


class _One:
    """A collector over families already made."""

    def __init__(self, *families: Metric):
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def _generate(*families: Metric) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_One(*families))  # type: ignore[arg-type]
    return generate_latest(registry).decode("utf-8")


def _bare(family: Metric) -> Metric:
    """The family's name, help and type, without samples."""
    return Metric(family.name, family.documentation, family.type)


def _renders_as_lines(family: Metric) -> bool:
    moved = {family.name + suffix for suffix in _MOVED_SUFFIXES}
    return all(s.timestamp is None and s.exemplar is None and s.name not in moved for s in family.samples)


class ExpositionCache:
    """generate_latest's output for a run's collectors, from lines remembered by series."""

    def __init__(self) -> None:
        self._headers: dict[tuple[str, str, str], str] = {}
        self._prefixes: dict[tuple, str] = {}

    def _header(self, family: Metric) -> str:
        return _generate(_bare(family))

    def _prefix(self, family: Metric, sample) -> str:
        alone = _bare(family)
        alone.samples = [sample._replace(value=0.0)]
        line = _generate(alone).rstrip("\n").rsplit("\n", 1)[-1]
        return line[: -len(floatToGoString(0.0))]  # "name{labels} ": a label value may hold spaces, the value none

    def render(self, *collectors: object) -> bytes:
        headers: dict[tuple[str, str, str], str] = {}
        prefixes: dict[tuple, str] = {}
        out: list[str] = []
        for family in _families(collectors):
            if not _renders_as_lines(family):
                out.append(_generate(family))
                continue
            key = (family.name, family.type, family.documentation)
            header = headers.get(key) or self._headers.get(key) or self._header(family)
            headers[key] = header
            out.append(header)
            for sample in family.samples:
                series = (family.name, family.type, sample.name, tuple(sample.labels.items()))
                prefix = prefixes.get(series) or self._prefixes.get(series) or self._prefix(family, sample)
                prefixes[series] = prefix
                out.append(prefix)
                out.append(floatToGoString(sample.value))
                out.append("\n")
        self._headers, self._prefixes = headers, prefixes
        return "".join(out).encode("utf-8")

    def __len__(self) -> int:
        return len(self._prefixes)


def _families(collectors: Iterable[object]) -> Iterator[Metric]:
    for collector in collectors:
        yield from collector.collect()  # type: ignore[attr-defined]
