"""The monitor's own families, added beside the report's (exporters/prometheus_format).

The report's collector yields the check state set, success, duration, the facts a
check declares, build info and the last-run time. This one adds what only a
daemon over many targets has: one info series per target to join on, how many
targets were found and how many were dropped by `max_targets`, and the watchdog's
counters (calls that timed out, calls still stuck). Every label value is a bounded
name (a pid, a sanitised comm, a container id or pod uid), never free text.
"""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Callable, Iterable, Iterator, Mapping, Sequence

    from envdoctor.check import Check
    from envdoctor.model import Report, Result
    from envdoctor.serve.discovery import TargetInfo
    from envdoctor.serve.exposition_cache import ExpositionCache

PREFIX = "envdoctor_"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


def label_value(text: str, limit: int = 64) -> str:
    """A bounded, printable label value: unusual characters become '_', long ones are cut."""
    return _UNSAFE.sub("_", text)[:limit]


class ServeCollector:
    """Families about the run itself, from data gathered before rendering."""

    def __init__(self, targets: "list[TargetInfo]", stats: Mapping[str, float], check_timeouts: Mapping[str, int]):
        self.targets = targets
        self.stats = stats
        self.check_timeouts = check_timeouts

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(PREFIX + "target_info",
                                 "One series per examined target, value 1: join on target for its pid, command, container and pod.",
                                 labels=["target", "pid", "comm", "container_id", "pod_uid", "source"])
        for t in self.targets:
            info.add_metric([t.label, "" if t.pid is None else str(t.pid), label_value(t.comm),
                             t.container_id, t.pod_uid, t.source], 1.0)
        yield info
        s = self.stats
        yield _gauge("targets", "Targets examined in the last run (the node included).", s["targets"])
        yield _counter("targets_overflow", "Targets found but not examined because max_targets was reached.",
                       s["targets_overflow_total"])
        if "targets_unreadable" in s:
            yield _gauge("targets_unreadable", "Python processes the last run could not examine: their /proc/N/maps "
                         "is closed to the daemon (another user's, without CAP_SYS_PTRACE).", s["targets_unreadable"])
        if "targets_hung" in s:
            yield _gauge("targets_hung", "Processes the last run left out because a read of their /proc files has not "
                         "returned (a process in uninterruptible sleep, D state, holding its memory-map lock).",
                         s["targets_hung"])
        yield _counter("runs", "Completed runs since the daemon started.", s["runs_total"])
        if "start_time_seconds" in s:
            yield _gauge("start_time_seconds", "When this daemon started, in seconds since the epoch: a change is a restart.",
                         s["start_time_seconds"])
        yield _gauge("last_run_duration_seconds", "How long the last completed run took.", s["last_run_duration_seconds"])
        yield _counter("call_timeouts", "Bounded calls (checks, NVML reads, memory samples) that ran past their deadline.",
                       s["call_timeouts_total"])
        yield _gauge("stuck_calls", "Calls still running past their deadline now; each keeps one thread.", s["stuck_calls"])
        timeouts = CounterMetricFamily(PREFIX + "check_timeouts", "Runs of a check that timed out or found it still stuck.",
                                       labels=["check"])
        for check, count in sorted(self.check_timeouts.items()):
            timeouts.add_metric([check], float(count))
        yield timeouts


def _gauge(name: str, help: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(PREFIX + name, help)
    family.add_metric([], float(value))
    return family


def _counter(name: str, help: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(PREFIX + name, help)
    family.add_metric([], float(value))
    return family


class _Families:
    """A collector over families made by a function, for a registry of its own."""

    def __init__(self, make: Callable[[], Iterable[Metric]]):
        self.make = make

    def collect(self) -> Iterable[Metric]:
        return self.make()


class StateRendering:
    """check_status and check_success as rendered last, redone only when a row's
    (check, target, status) changed: a target that came or went, or a verdict.

    Why: they are most of the exposition (the state set is 5 samples per check per
    target: 2,736 of 3,622 lines with 64 targets) and on a settled node the same run
    after run: rendering them took 9 of the 16 ms the exposition cost a run. The
    bytes are prometheus_client's own, and the rest of the exposition follows them,
    as one render would order it."""

    def __init__(self) -> None:
        self._last: tuple[tuple, bytes | memoryview] | None = None  # (key, bytes), replaced whole

    def kept_in(self, exposition: bytes) -> None:
        """The run's whole exposition, which begins with the bytes last rendered: they are
        kept as a view into it from now on, not as a copy of their own. The snapshot holds
        the exposition until the next run's is made; a copy was ~280 KiB over 64 targets."""
        last = self._last
        if last is not None and exposition.startswith(last[1]):
            self._last = (last[0], memoryview(exposition)[:len(last[1])])

    def render(self, results: "Sequence[Result]") -> bytes | memoryview:
        from envdoctor.exporters.prometheus_format import state_families

        key = tuple((r.check, r.target, r.status) for r in results)
        last = self._last
        if last is not None and last[0] == key:
            return last[1]
        body = _exposition(_Families(lambda: state_families(results)))
        self._last = (key, body)
        return body


def _exposition(*collectors: object) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)  # type: ignore[arg-type]
    return generate_latest(registry)


def render(report: "Report", catalog: Mapping[str, "Check"], serve: ServeCollector,
           states: StateRendering | None = None, lines: "ExpositionCache | None" = None) -> bytes:
    """The whole exposition for one run, rendered once (a scrape copies these bytes).
    `states` and `lines`: the daemon's StateRendering and ExpositionCache, kept from run
    to run; None renders all anew."""
    from envdoctor.exporters.prometheus_format import ReportCollector

    states = states if states is not None else StateRendering()
    rest = (ReportCollector(report, catalog, with_states=False), serve)
    body = b"".join((states.render(report.results), lines.render(*rest) if lines is not None else _exposition(*rest)))
    states.kept_in(body)
    return body
