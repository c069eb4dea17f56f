"""Every output form, checked by its real consumer: the JSON schema, an XML parser
for JUnit, promtool for the Prometheus exposition. Golden files pin the exact
output of a fixed report; `pytest --update-golden` rewrites them after a deliberate change."""

from __future__ import annotations

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from envdoctor.check import Check, Metric
from envdoctor.exporters import FORMATS, ExportOptions, render
from envdoctor.model import Report, Result, Status, ok

GOLDEN = Path(__file__).parent / "golden"
EXTENSIONS = {"text": "txt", "json": "json", "markdown": "md", "junit": "xml", "prometheus": "prom", "compact": "log"}


def _result(check, status, summary, fix="", facts=None, target="self", duration=0.25):
    return Result(Status(status), summary, fix, facts or {}, check, target, duration)


def fixed_report() -> Report:
    return Report(
        host="node-7", version="0.1.0", started_at="2026-11-22T06:00:00+00:00", target="self", duration_seconds=1.5,
        system={"os": "Debian GNU/Linux 12 (bookworm)", "kernel": "6.1.0", "python_version": "3.11.7",
                "python_executable": "/usr/bin/python3", "cpu_model": "AMD EPYC", "cpu_logical": 128, "cpu_affinity": 128,
                "cpu_quota": 4.0, "memory_total_bytes": 512 * 1024**3, "shm_size_bytes": 64 * 1024**2,
                "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1234", "compute_capability": "9.0",
                          "memory_total_bytes": 80 * 1024**3}],
                "driver_version": "550.54.15", "unavailable": {}},
        results=[
            _result("shm.size", "fail", "/dev/shm is 64 MiB; DataLoader workers need >= 1 GiB",
                    "docker run --shm-size=16g ... (or --ipc=host)", {"size_bytes": 64 * 1024**2, "free_bytes": 60 * 1024**2}),
            _result("cpu.threads", "warn", "OMP_NUM_THREADS is unset in a 4-CPU quota on 128 visible cores",
                    "export OMP_NUM_THREADS=4 MKL_NUM_THREADS=4", {"effective_cpus": 4.0}),
            _result("gpu.health", "ok", "1 GPU healthy", facts={"memory_used_bytes": {"0": 1024**3}}),
            _result("torch.cudnn", "skip", "no torch in /usr/bin/python3"),
            _result("onnx.opset", "error", "timed out after 15 s | stuck at onnx_opset.py:40"),
        ],
    )


CATALOG = {
    "shm.size": Check(id="shm.size", title="t", run=lambda c: ok("x"), metrics=(
        Metric("shm_size_bytes", "size_bytes", "Size of the target's /dev/shm."),
        Metric("shm_free_bytes", "free_bytes", "Free bytes in the target's /dev/shm."))),
    "cpu.threads": Check(id="cpu.threads", title="t", run=lambda c: ok("x"), metrics=(
        Metric("cpu_effective", "effective_cpus", "CPUs the target can use: affinity and cgroup quota."),)),
    "gpu.health": Check(id="gpu.health", title="t", run=lambda c: ok("x"), metrics=(
        Metric("gpu_memory_used_bytes", "memory_used_bytes", "GPU memory in use.", label="gpu"),)),
}
OPTIONS = ExportOptions(catalog=CATALOG, fail_on="fail", color=False, width=120)


@pytest.mark.parametrize("fmt", FORMATS)
def test_golden_output(fmt, update_golden):
    text = render(fmt, fixed_report(), OPTIONS)
    path = GOLDEN / f"report.{EXTENSIONS[fmt]}"
    if update_golden or not path.exists():
        path.write_text(text)
        if not update_golden:
            pytest.fail(f"wrote missing golden file {path}; check it in and run again")
    assert text == path.read_text(), f"{fmt} output changed; if intended, run pytest --update-golden"


def test_json_matches_the_published_schema():
    schema = json.loads(resources.files("envdoctor").joinpath("schema/report-v1.json").read_text())
    document = json.loads(render("json", fixed_report(), OPTIONS))
    jsonschema.validate(document, schema)
    assert document["schema"] == "envdoctor.report/v1"
    assert document["results"][0]["facts"]["size_bytes"] == 64 * 1024**2  # bytes stay integers
    document["results"][0]["status"] = "bad"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, schema)


def test_junit_parses_and_maps_statuses():
    root = ET.fromstring(render("junit", fixed_report(), OPTIONS))
    suite = root.find("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert suite.get("tests") == "5" and suite.get("failures") == "1" and suite.get("errors") == "1" and suite.get("skipped") == "1"
    assert cases["shm.size"].find("failure").get("message").startswith("/dev/shm is 64 MiB")
    assert "docker run --shm-size=16g" in cases["shm.size"].find("failure").text
    assert cases["onnx.opset"].find("error") is not None
    assert cases["torch.cudnn"].find("skipped").get("message") == "no torch in /usr/bin/python3"
    assert cases["cpu.threads"].find("failure") is None and "WARN" in cases["cpu.threads"].find("system-out").text
    assert {p.get("name") for p in suite.find("properties")} >= {"envdoctor.version", "os", "gpus"}
    # with --fail-on warn a warning is a failure
    root = ET.fromstring(render("junit", fixed_report(), ExportOptions(catalog=CATALOG, fail_on="warn")))
    assert root.find("testsuite").get("failures") == "2"
    assert root.find("testsuite/testcase[@name='cpu.threads']/failure").get("type") == "warn"


def test_prometheus_state_set_and_fact_gauges():
    text = render("prometheus", fixed_report(), OPTIONS)
    assert 'envdoctor_check_status{check="shm.size",status="fail",target="self"} 1.0' in text
    assert 'envdoctor_check_status{check="shm.size",status="ok",target="self"} 0.0' in text
    assert 'envdoctor_check_success{check="onnx.opset",target="self"} 0.0' in text
    assert 'envdoctor_shm_size_bytes{target="self"} 6.7108864e+07' in text
    assert 'envdoctor_gpu_memory_used_bytes{gpu="0",target="self"} 1.073741824e+09' in text
    assert 'envdoctor_build_info{python_version="3.11.7",version="0.1.0"} 1.0' in text
    # every result has exactly one status at 1
    ones = [l for l in text.splitlines() if l.startswith("envdoctor_check_status{") and l.endswith(" 1.0")]
    assert len(ones) == 5


@pytest.mark.real
def test_promtool_accepts_the_exposition(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; the test script installs it)")
    text = render("prometheus", fixed_report(), OPTIONS)
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", "promtool lint findings: " + proc.stdout + proc.stderr


def test_markdown_is_pasteable():
    text = render("markdown", fixed_report(), OPTIONS)
    assert text.startswith("## envdoctor report: node-7")
    assert "| ❌ fail | `shm.size` |" in text
    assert "\\|" in text  # a pipe inside a summary is escaped, the table stays a table
    assert "docker run --shm-size=16g" in text.split("### Fixes")[1]


def test_markdown_splits_a_fix_into_its_steps_not_inside_brackets_or_code():
    """shm.size's "or lower DataLoader num_workers (slower loading; num_workers=0 ...)"
    came out as two lines, neither of which could be pasted (helper-18)."""
    fix = ("docker run --shm-size=16g ...; or lower DataLoader num_workers (slower loading; num_workers=0 "
           "uses no shared memory but the GPU waits); `a; b` stays whole")
    report = fixed_report()
    report.results[0] = _result("shm.size", "fail", "too small", fix)
    fixes = render("markdown", report, OPTIONS).split("### Fixes")[1]
    steps = [line.strip() for line in fixes.splitlines() if line.startswith("  ") and not line.strip().startswith("```")]
    assert steps[:3] == ["docker run --shm-size=16g ...",
                         "or lower DataLoader num_workers (slower loading; num_workers=0 uses no shared memory but the GPU waits)",
                         "`a; b` stays whole"], steps


def test_text_has_no_ansi_unless_asked():
    plain = render("text", fixed_report(), OPTIONS)
    assert "\x1b[" not in plain and "FAIL" in plain and "shm.size" in plain
    coloured = render("text", fixed_report(), ExportOptions(catalog=CATALOG, color=True))
    assert "\x1b[" in coloured


def test_the_text_table_says_the_rest_of_a_huge_cell_instead_of_wrapping_it_for_minutes():
    """Helper-39: a plug-in's 20 MB summary kept `check` wrapping it past 120 s (1 MB: 1 s)."""
    import time

    report = fixed_report()
    report.results.append(_result("acme.huge", "warn", "x" * 20_000_000, ""))
    started = time.monotonic()
    text = render("text", report, OPTIONS)
    assert time.monotonic() - started < 30
    import re

    def compact(value: str) -> str:  # the cell is wrapped across the table's lines and borders
        return re.sub(r"[\s│]", "", value)

    from envdoctor.exporters.text_format import CELL_CHARS

    assert compact(f"({20_000_000 - CELL_CHARS} more characters; -f json has them all)") in compact(text)
    assert len(render("json", report, OPTIONS)) > 20_000_000  # JSON keeps every character


def _gpu_report(gpus, extra_checks=()):
    from envdoctor.checks.gpu_health import CHECK as GPU_HEALTH

    catalog = {"gpu.health": GPU_HEALTH, **{c.id: c for c in extra_checks}}
    results = [_result("gpu.health", "ok", "2 GPUs healthy", target="node",
                       facts={"gpus": gpus, "memory_used_bytes": {"0": 1024**3}})]
    results += [_result(c.id, "ok", "x", target="node", facts={"things": gpus}) for c in extra_checks]
    report = Report(host="n", version="0.1.0", started_at="2026-11-26T06:00:00+00:00", target="node",
                    duration_seconds=1.0, system={"python_version": "3.11.7"}, results=results)
    return render("prometheus", report, ExportOptions(catalog=catalog, fail_on="fail", color=False, width=120))


def test_gpu_info_names_each_gpus_uuid_pci_bus_id_and_model_to_join_on():
    gpus = [{"index": 0, "uuid": "GPU-aaaa", "pci_bus_id": "00000000:18:00.0", "name": "NVIDIA H100 80GB HBM3"},
            {"index": 1, "uuid": None, "pci_bus_id": "00000000:2A:00.0", "name": "x" * 300}]  # a uuid NVML did not give
    text = _gpu_report(gpus)
    assert ('envdoctor_gpu_info{gpu="0",name="NVIDIA H100 80GB HBM3",pci_bus_id="00000000:18:00.0",'
            'target="node",uuid="GPU-aaaa"} 1.0') in text
    assert f'envdoctor_gpu_info{{gpu="1",name="{"x" * 128}",pci_bus_id="00000000:2A:00.0",target="node",uuid=""}} 1.0' in text
    assert 'envdoctor_gpu_memory_used_bytes{gpu="0",target="node"}' in text  # the same gpu label, to join on
    promtool = shutil.which("promtool")
    if promtool is not None:
        proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr


def test_a_plugins_malformed_info_metric_costs_its_own_series_only():
    def plugin(id_, info):
        return Check(id=id_, title="t", run=lambda c: ok("x"), metrics=(Metric(f"{id_.replace('.', '_')}_info", "things", "h", info=info),))

    bad = [plugin("acme.target", (("target", "index"),)),     # would clash with the target label
           plugin("acme.twice", (("gpu", "index"), ("gpu", "uuid"))),
           plugin("acme.badname", (("not-a-label", "index"),))]
    good = plugin("acme.good", (("thing", "index"),))
    text = _gpu_report([{"index": 0, "uuid": "GPU-a"}, "not a mapping"], [*bad, good])
    assert 'envdoctor_acme_good_info{target="node",thing="0"} 1.0' in text
    assert "acme_target_info" not in text and "acme_twice_info" not in text and "acme_badname_info" not in text
    assert 'envdoctor_gpu_info{gpu="0",name="",pci_bus_id="",target="node",uuid="GPU-a"} 1.0' in text
