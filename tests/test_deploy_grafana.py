"""deploy/grafana: the dashboard is what generate.py writes, and every panel's query
(and every variable's) returns data from a real Prometheus that scraped real
`envdoctor serve` instances (tests/fleet.py: separate nodes in their own namespaces,
planted problems, the rules of deploy/prometheus loaded)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
from pathlib import Path

import pytest

import fleet

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "deploy/grafana/envdoctor-fleet.json"


SPECS = {
    # a job leaking 8 MiB/s: the memory panels (growth, time to exhaustion) have a series to show
    "node-ok": {"shm": "1g", "gpus": [{}, {}], "workloads": [{"env": {}, "gpu": 0}, {"leak_mib_per_second": 8}]},
    "node-shm": {"shm": "64m", "gpus": [{}, {"ecc_uncorrected": 2}], "workloads": [{"env": {"OMP_NUM_THREADS": "64"}}]},
    "node-env": {"shm": "1g", "gpus": [{}], "workloads": [{"env": {"CUDA_VISIBLE_DEVICES": "0,x,1"}, "gpu": 0},
                                                            {"env": {"WORLD_SIZE": "2", "RANK": "3"}}]},
}


def _generator():
    spec = importlib.util.spec_from_file_location("grafana_generate", REPO / "deploy/grafana/generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _panels():
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def _promql(expr: str) -> str:
    """A panel's query as Grafana sends it with every node and target chosen ("All" is .+)."""
    return expr.replace("$instance", ".+").replace("$target", ".+")


def test_dashboard_is_what_the_generator_writes():
    assert DASHBOARD.read_text() == _generator().render(), "run: python deploy/grafana/generate.py"


def test_dashboard_shape():
    board = json.loads(DASHBOARD.read_text())
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "instance", "target"]
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Fleet", "Node $instance", "Process $target"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in _panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert len(panel["targets"]) == 1 and panel["targets"][0]["expr"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24


@pytest.fixture(scope="module")
def live_fleet(tmp_path_factory):
    reason = fleet.can_run()
    if reason:
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp(f"fleet-grafana-{os.getpid()}")
    with fleet.Fleet(SPECS, workdir, deadline=240, interval=2, scrape_interval="1s", evaluation_interval="1s") as f:
        assert len(f.wait_for('up{job="envdoctor"} == 1', len(SPECS), 60)) == len(SPECS)
        # every node has run its checks on its node and its workloads, and the rules have evaluated
        f.wait_for('count by (instance) (envdoctor_target_info{target=~"pid:.+"})', len(SPECS), 60)
        f.wait_for("check_status:envdoctor_processes:count", 1, 60)
        f.wait_for('ALERTS{alertname=~"Envdoctor.*"}', 1, 60)
        f.wait_for("envdoctor_memory_exhaustion_eta_seconds", 1, 90)  # the leak, judged over >= 10 s of samples
        f.wait_for("instance:envdoctor_memory_exhaustion_eta_seconds:min", 1, 60)  # and its recording rule
        yield f


# A series can be missing for a moment on a loaded machine: a scrape that outran its 1 s
# timeout marks the node's series stale, and a leak judged in one run may not be in the
# next. Each query is asked again for a while before its emptiness counts (CI saw
# node-ok's series and the ETA missing once, with the machine under a second job's load).
SETTLE_SECONDS = 30


def _eventually(ask, good):
    """ask() until good(answer), for up to SETTLE_SECONDS; the last answer either way."""
    end = time.monotonic() + SETTLE_SECONDS
    while True:
        answer = ask()
        if good(answer) or time.monotonic() > end:
            return answer
        time.sleep(1)


@pytest.mark.real
def test_every_panel_returns_data_from_real_serve_instances(live_fleet):
    empty = []
    for panel in _panels():
        expr = _promql(panel["targets"][0]["expr"])
        result = _eventually(lambda: live_fleet.query(expr), bool)
        if not result:
            empty.append(f"{panel['title']}: {expr}")
    assert empty == [], "panels with no data:\n" + "\n".join(empty)


@pytest.mark.real
def test_every_variable_lists_values(live_fleet):
    board = json.loads(DASHBOARD.read_text())
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]["query"])
        assert match, variable["query"]
        query = f"group by ({match.group(2)}) ({_promql(match.group(1))})"
        values = _eventually(lambda: {r["metric"].get(match.group(2)) for r in live_fleet.query(query)},
                             lambda found: found >= set(SPECS) if variable["name"] == "instance" else "node" in found)
        if variable["name"] == "instance":
            assert values == set(SPECS)
        else:
            assert "node" in values and any(v.startswith("pid:") for v in values)


@pytest.mark.real
def test_every_metric_the_rules_and_dashboard_name_is_one_serve_exports(live_fleet):
    named = set(re.findall(r"(?<![:\w])envdoctor_[a-z_]+(?![:\w])", DASHBOARD.read_text() + fleet.RULES.read_text()))
    exported = _eventually(lambda: {r["metric"]["__name__"] for r in live_fleet.query('{job="envdoctor",__name__=~"envdoctor_.+"}')},
                           lambda found: named <= found)
    assert {"envdoctor_check_status", "envdoctor_target_info", "envdoctor_last_run_timestamp_seconds"} <= named
    assert named - exported == set()
