"""Writes envdoctor-fleet.json, the Grafana dashboard: fleet -> node -> process.

Generated rather than hand-edited so that every panel has the same shape (one
Prometheus query each, a datasource variable, no hard-coded uids) and the test in
tests/test_deploy_grafana.py can run each panel's query against a real Prometheus.
Run `python deploy/grafana/generate.py` after changing a panel; the test fails if
the JSON beside it was not regenerated.

Variables: $instance (nodes, from envdoctor_build_info), $target (that node's
targets: node, pid:N). Queries over the fleet use the recording rules in
deploy/prometheus/envdoctor.rules.yml, so Prometheus must load them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "envdoctor-fleet.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
NODE = 'instance=~"$instance"'
PROC = 'instance=~"$instance",target=~"$target"'

# (row title, [(panel type, title, query, legend or table columns, width, description)])
ROWS = [
    ("Fleet", [
        ("stat", "Nodes reporting", "count(count by (instance) (envdoctor_last_run_timestamp_seconds))", "", 4,
         "Nodes with an envdoctor run, counted once each (serve, or an epilog's textfile through node_exporter)."),
        ("stat", "Nodes with a failing check", 'count(count by (instance) (envdoctor_check_status{status="fail"} == 1)) or vector(0)', "", 4,
         "Nodes where any target has a check at fail."),
        ("stat", "Targets up", 'sum(up{job="envdoctor"}) / count(up{job="envdoctor"})', "", 4,
         "Share of envdoctor scrape targets that answer."),
        ("bargauge", "Nodes per check and status", 'check_status:envdoctor_nodes:count{status=~"fail|warn|error"}', "{{check}} {{status}}", 12,
         "Recording rule: nodes with at least one target in that status."),
        ("table", "Processes per check and status", "check_status:envdoctor_processes:count", "check,status", 12,
         "Recording rule: pid:N targets in each status, fleet-wide."),
        ("table", "Soonest memory exhaustion per node", "bottomk(20, instance:envdoctor_memory_exhaustion_eta_seconds:min)", "instance", 12,
         "Recording rule: the smallest time to exhaustion over a node's processes and memories."),
        ("table", "envdoctor alerts (pending and firing)", 'ALERTS{alertname=~"Envdoctor.*"}', "alertname,alertstate,instance,check,target,memory,severity", 24,
         "From deploy/prometheus/envdoctor.rules.yml; the runbook of each is `envdoctor explain ID`."),
    ]),
    ("Node $instance", [
        ("table", "Checks not ok", f'envdoctor_check_status{{{NODE},status=~"fail|warn|error"}} == 1', "instance,check,target,status", 12,
         "Every target's checks at fail, warn or error on the chosen nodes; /report on the node has the fix."),
        ("table", "Processes watched", f'envdoctor_target_info{{{NODE}, target=~"pid:.+"}}', "instance,target,pid,comm", 12,
         "One row per process examined (envdoctor_target_info without the node's own row), to join on."),
        ("timeseries", "Check duration", f"max by (instance, check) (envdoctor_check_duration_seconds{{{NODE}}})", "{{instance}} {{check}}", 12,
         "Slowest target per check; a check near its timeout is about to end in error."),
        ("stat", "Seconds since the last completed run", f"time() - envdoctor_last_run_timestamp_seconds{{{NODE}}}", "{{instance}}", 6,
         "More than three intervals makes /healthz answer 503."),
        ("table", "envdoctor version", f"envdoctor_build_info{{{NODE}}}", "instance,version,python_version", 6, ""),
        ("stat", "Processes hung (D state)", f"envdoctor_targets_hung{{{NODE}}}", "{{instance}}", 6,
         "Processes whose /proc files envdoctor cannot read: in uninterruptible sleep, most often stuck in the GPU "
         "driver or on a dead mount; /healthz on the node names the pids (alert EnvdoctorProcessHung)."),
        ("timeseries", "GPU memory used", f"envdoctor_gpu_memory_used_bytes{{{NODE}}}", "{{instance}} gpu {{gpu}}", 12,
         "From NVML (gpu.health); memory other processes hold before a job starts is a common OOM cause."),
        ("timeseries", "GPU uncorrectable ECC errors", f"envdoctor_gpu_ecc_uncorrected_errors{{{NODE}}}", "{{instance}} gpu {{gpu}}", 12,
         "Any is a fail: drain the node and reset or replace the GPU."),
    ]),
    ("Process $target", [
        ("table", "Status of every check", f"envdoctor_check_status{{{PROC}}} == 1", "instance,target,check,status", 12,
         "The current status per check for the chosen targets."),
        ("timeseries", "Memory growth", f"envdoctor_memory_growth_bytes_per_second{{{PROC}}}", "{{instance}} {{target}} {{memory}}", 12,
         "Sustained growth per memory (memory.cache_growth)."),
        ("timeseries", "Time to memory exhaustion", f"envdoctor_memory_exhaustion_eta_seconds{{{PROC}}}", "{{instance}} {{target}} {{memory}}", 12,
         "At the current growth rate; the alert fires under two hours."),
        ("timeseries", "/dev/shm size", f"envdoctor_shm_size_bytes{{{PROC}}}", "{{instance}} {{target}}", 6,
         "DataLoader workers need far more than Docker's 64 MiB."),
        ("timeseries", "Effective CPUs", f"envdoctor_cpu_effective{{{PROC}}}", "{{instance}} {{target}}", 6,
         "min(affinity, cgroup quota): thread pools should not exceed it."),
    ]),
]

UNITS = {"Memory growth": "Bps", "Time to memory exhaustion": "s", "/dev/shm size": "bytes", "GPU memory used": "bytes",
         "Check duration": "s", "Seconds since the last completed run": "s", "Soonest memory exhaustion per node": "s",
         "Targets up": "percentunit"}


def _panel(pid, kind, title, expr, legend, width, description, x, y):
    table = kind == "table"
    panel = {
        "id": pid, "type": kind, "title": title, "description": description, "datasource": DS,
        "gridPos": {"h": 8, "w": width, "x": x, "y": y},
        "targets": [{"refId": "A", "datasource": DS, "expr": expr, "instant": table or kind in ("stat", "bargauge"),
                     "range": not (table or kind in ("stat", "bargauge")), "format": "table" if table else "time_series",
                     "legendFormat": "" if table else legend}],
        "fieldConfig": {"defaults": {"unit": UNITS.get(title, "short")}, "overrides": []},
        "options": {},
    }
    if table:
        keep = legend.split(",") + ["Value"]
        panel["transformations"] = [{"id": "filterFieldsByName", "options": {"include": {"names": keep}}}]
    return panel


def build() -> dict:
    panels, pid, y = [], 1, 0
    for row_title, row in ROWS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y, x = pid + 1, y + 1, 0
        for spec in row:
            width = spec[4]
            if x + width > 24:
                x, y = 0, y + 8
            panels.append(_panel(pid, *spec, x=x, y=y))
            pid, x = pid + 1, x + width
        y += 8
    variable = lambda name, query, label: {  # noqa: E731
        "name": name, "label": label, "type": "query", "datasource": DS, "refresh": 2, "multi": True,
        "includeAll": True, "allValue": ".+", "current": {"text": "All", "value": "$__all"},
        "query": {"query": query, "refId": name}, "definition": query, "sort": 1}
    return {
        "title": "envdoctor fleet", "uid": "envdoctor-fleet", "tags": ["envdoctor", "gpu"],
        "schemaVersion": 39, "version": 1, "editable": True, "timezone": "utc", "refresh": "1m",
        "time": {"from": "now-6h", "to": "now"},
        "description": "GPU training environments across the fleet, from envdoctor serve on every node.",
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0},
            variable("instance", "label_values(envdoctor_build_info, instance)", "node"),
            variable("target", 'label_values(envdoctor_check_status{instance=~"$instance"}, target)', "target"),
        ]},
        "annotations": {"list": []},
        "links": [],
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=False) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)
