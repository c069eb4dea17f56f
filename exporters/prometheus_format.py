"""Prometheus text exposition of a report: what `serve` answers on /metrics.

- envdoctor_check_status{check,target,status}: a state set, 1 for the current
  status and 0 for the four others, so alerts can say `== 1` on `status="fail"`.
- envdoctor_check_success{check,target}: 1 when the check ran (any status but error).
- envdoctor_check_duration_seconds{check,target}.
- One gauge per fact a check declares in its `metrics` (check.Metric), e.g.
  envdoctor_shm_size_bytes{target}.
- envdoctor_build_info{version,python_version} 1, envdoctor_last_run_timestamp_seconds.

A private registry keeps process and GC metrics out; samples come from the report
already made, never from running checks inside a scrape.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric as PromMetric

from envdoctor.check import Check
from envdoctor.export import Exporter
from envdoctor.model import Report, Result, Status

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Iterator, Sequence

PREFIX = "envdoctor_"
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _number(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
        try:
            return float(value)
        except OverflowError:  # an integer past a float's range: no sample, not a broken exposition
            return None
    return None


def state_families(results: Sequence[Result]) -> Iterator[PromMetric]:
    """check_status and check_success: functions of each row's (check, target, status)
    alone, so a caller that sees those unchanged may reuse their rendering (serve does)."""
    status = GaugeMetricFamily(PREFIX + "check_status", "Current status of each check: 1 for the current status, 0 for the others.",
                               labels=["check", "target", "status"])
    success = GaugeMetricFamily(PREFIX + "check_success", "1 when the check ran to a verdict, 0 when it broke or timed out.",
                                labels=["check", "target"])
    for r in results:
        for s in Status:
            status.add_metric([r.check, r.target, s.value], 1.0 if r.status is s else 0.0)
        success.add_metric([r.check, r.target], 0.0 if r.status is Status.ERROR else 1.0)
    yield status
    yield success


def _info_value(value: object) -> str:
    """An info series' label value: the identifier as text, "" when absent, at most 128
    characters (a plug-in's runaway value must not make a runaway series)."""
    return "" if value is None else str(value)[:128]


class ReportCollector:
    """A custom collector yielding fresh families from one finished report.
    `with_states=False` leaves out state_families(), for a caller that renders them itself."""

    def __init__(self, report: Report, catalog: Mapping[str, Check], with_states: bool = True):
        self.report = report
        self.catalog = catalog
        self.with_states = with_states

    def collect(self) -> Iterator[PromMetric]:
        report = self.report
        if self.with_states:
            yield from state_families(report.results)
        duration = GaugeMetricFamily(PREFIX + "check_duration_seconds", "How long the check took in its last run.",
                                     labels=["check", "target"])
        for r in report.results:
            duration.add_metric([r.check, r.target], r.duration_seconds)
        yield duration
        yield from self._facts()
        info = InfoMetricFamily(PREFIX + "build", "envdoctor's version and the Python it runs on.",
                                labels=["version", "python_version"])
        info.add_metric([report.version, str(report.system.get("python_version", ""))], {})
        yield info
        last = GaugeMetricFamily(PREFIX + "last_run_timestamp_seconds", "When the report's run started, in Unix time.")
        started = getattr(report, "started_unix", None)  # a plug-in's Report-like object may lack it
        last.add_metric([], started if started is not None else datetime.fromisoformat(report.started_at).timestamp())
        yield last

    def _facts(self) -> Iterator[PromMetric]:
        families: dict[str, GaugeMetricFamily] = {}
        for r in self.report.results:
            check = self.catalog.get(r.check)
            if check is None:
                continue
            for m in check.metrics:
                info = getattr(m, "info", ())  # a Metric pickled before it had one
                extra = [label for label, _key in info] if info else ([m.label] if m.label else [])
                if not _NAME.match(PREFIX + m.name) or not all(_LABEL.match(x) and x != "target" for x in extra):
                    continue  # a plug-in's malformed declaration costs its gauge, not the whole exposition
                if len(set(extra)) != len(extra):
                    continue
                value = r.facts.get(m.fact) if isinstance(r.facts, Mapping) else None
                labels = ["target"] + extra
                family = families.get(m.name)
                if family is not None and list(family._labelnames) != labels:
                    continue  # two checks declaring one name with different labels: keep the first
                if family is None:
                    family = families[m.name] = GaugeMetricFamily(PREFIX + m.name, m.help, labels=labels)
                if info:
                    if isinstance(value, (list, tuple)):
                        for item in value:
                            if isinstance(item, Mapping):
                                family.add_metric([r.target] + [_info_value(item.get(key)) for _l, key in info], 1.0)
                elif m.label:
                    if isinstance(value, Mapping):
                        for label_value, v in sorted(value.items(), key=lambda item: str(item[0])):
                            number = _number(v)
                            if number is not None:
                                family.add_metric([r.target, str(label_value)], number)
                else:
                    number = _number(value)
                    if number is not None:
                        family.add_metric([r.target], number)
        yield from (f for f in families.values() if f.samples)


def render(report: Report, options) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReportCollector(report, options.catalog))
    return generate_latest(registry).decode("utf-8")


EXPORTER = Exporter(name="prometheus", render=render, content_type="text/plain; version=0.0.4; charset=utf-8", extension="prom",
                    help="Prometheus text exposition (what serve answers on /metrics)")
