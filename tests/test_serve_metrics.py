"""serve's exposition: the check state set is re-rendered only when a status changed,
and what a scrape gets is byte for byte what one render of everything gives."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from envdoctor.model import Report, Result, Status
from envdoctor.registry import load
from envdoctor.serve import metrics
from envdoctor.serve.discovery import TargetInfo
from envdoctor.exporters import prometheus_format


def _report(statuses: dict[tuple[str, str], Status], duration: float = 0.01) -> Report:
    results = [Result(status, f"{check} is {status.value}", check=check, target=target, duration_seconds=duration,
                      facts={"size_bytes": 64 * 2**20} if check == "shm.size" else {})
               for (check, target), status in statuses.items()]
    return Report(host="h", version="0", started_at="2026-11-23T00:00:00+00:00", target="node", results=results,
                  system={"python_version": "3.11"})


def _serve_families(targets: list[TargetInfo]) -> metrics.ServeCollector:
    stats = {"targets": len(targets), "targets_overflow_total": 0, "runs_total": 3, "last_run_duration_seconds": 0.1,
             "call_timeouts_total": 0, "stuck_calls": 0}
    return metrics.ServeCollector(targets, stats, {"cpu.threads": 1})


def _one_render(report: Report, catalog, serve: metrics.ServeCollector) -> bytes:
    """Everything in one registry, as serve rendered it before the state set was kept."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(prometheus_format.ReportCollector(report, catalog))
    registry.register(serve)
    return generate_latest(registry)


TARGETS = [TargetInfo("node", None, "node"), TargetInfo("pid:41", 41, "selector", comm="python")]
SETTLED = {("cpu.threads", "node"): Status.OK, ("shm.size", "node"): Status.WARN,
           ("cpu.threads", "pid:41"): Status.FAIL, ("shm.size", "pid:41"): Status.ERROR}


def test_the_kept_state_set_gives_the_bytes_one_render_gives():
    catalog = load(autoload_plugins=False).checks
    states = metrics.StateRendering()
    for duration in (0.01, 0.02):  # the second render reuses the state set's bytes
        report = _report(SETTLED, duration)
        serve = _serve_families(TARGETS)
        body = metrics.render(report, catalog, serve, states)
        assert body == _one_render(report, catalog, serve)
        kept = states._last[1]  # a view into the exposition the snapshot holds, not a copy of its own
        assert isinstance(kept, memoryview) and kept.obj is body and body.startswith(kept)
    assert metrics.render(report, catalog, serve) == _one_render(report, catalog, serve)  # no kept state set


def test_the_state_set_is_rendered_again_only_when_a_row_changed(monkeypatch):
    calls = []
    real = prometheus_format.state_families

    def counted(results):
        calls.append(len(results))
        return real(results)

    monkeypatch.setattr(prometheus_format, "state_families", counted)
    catalog = load(autoload_plugins=False).checks
    states = metrics.StateRendering()

    def scrape(statuses: dict[tuple[str, str], Status]) -> str:
        return metrics.render(_report(statuses), catalog, _serve_families(TARGETS), states).decode()

    scrape(SETTLED)
    scrape(SETTLED)
    assert calls == [4]

    verdict = {**SETTLED, ("cpu.threads", "pid:41"): Status.OK}  # the process was fixed
    text = scrape(verdict)
    assert calls == [4, 4]
    assert 'envdoctor_check_status{check="cpu.threads",status="ok",target="pid:41"} 1.0' in text
    assert 'envdoctor_check_status{check="cpu.threads",status="fail",target="pid:41"} 0.0' in text

    gone = {k: v for k, v in verdict.items() if k[1] == "node"}  # the process exited
    text = scrape(gone)
    assert calls == [4, 4, 2]
    assert 'target="pid:41"' not in text.split("# HELP envdoctor_check_duration_seconds")[0]
    assert 'envdoctor_check_success{check="shm.size",target="node"} 1.0' in text
