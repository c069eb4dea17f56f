"""The wheel installs checks/ and exporters/ under envdoctor.*, never as top-level
packages, and carries the schema and every built-in entry point."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BUILTINS = {"cuda.visible_devices", "cuda.runtime", "gpu.health", "shm.size", "cpu.threads", "torch.cudnn",
            "torch.pin_memory", "onnx.opset", "dist.env", "dist.master_port",
            "preflight.live", "dist.consistency", "memory.cache_growth"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the files git knows (tracked or not ignored): an in-tree
    build/ left by an earlier build would otherwise slip stale files into the wheel."""
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        if (REPO / rel).is_file():
            (source / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, source / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(out), str(source)], check=True, capture_output=True, text=True)
    (path,) = out.glob("envdoctor-*.whl")
    return path


def test_no_top_level_checks_or_exporters(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {n.split("/")[0] for n in names}
    assert "checks" not in top_level and "exporters" not in top_level, top_level
    assert top_level <= {"envdoctor", next(n for n in top_level if n.endswith(".dist-info"))}
    assert "envdoctor/checks/__init__.py" in names and "envdoctor/exporters/prometheus_format.py" in names
    assert "envdoctor/schema/report-v1.json" in names
    record = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("top_level.txt"))).decode() \
        if any(n.endswith("top_level.txt") for n in names) else "envdoctor\n"
    assert record.split() == ["envdoctor"]


def test_every_source_file_ships(wheel):
    """A package left out of pyproject's explicit list imports fine from the checkout and
    editable installs, and breaks only in a real install: compare the wheel with the tree."""
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"envdoctor/{p.relative_to(REPO / 'envdoctor')}" for p in (REPO / "envdoctor").rglob("*")
                if p.is_file() and "__pycache__" not in p.parts}
    for top in ("checks", "exporters"):
        expected |= {f"envdoctor/{top}/{p.relative_to(REPO / top)}" for p in (REPO / top).rglob("*.py")
                     if "__pycache__" not in p.parts}
    assert sorted(expected - names) == []


def test_every_builtin_check_is_an_entry_point_whose_module_is_shipped(wheel):
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    section = entry_points.split("[envdoctor.checks]")[1].split("\n[")[0]
    declared = {}
    for line in section.strip().splitlines():
        name, value = (part.strip() for part in line.split("="))
        declared[name] = value
    assert set(declared) == BUILTINS
    for value in declared.values():
        module = value.split(":")[0]
        assert module.replace(".", "/") + ".py" in names, f"{module} is declared but not in the wheel"
    assert "envdoctor = envdoctor.program:console_main" in entry_points


def test_readme_documents_every_check_and_metric():
    """DESIGN: every metric name and label is documented in the README."""
    from envdoctor import registry

    readme = (REPO / "README.md").read_text()
    loaded = registry.load(autoload_plugins=False)
    assert not loaded.failures, loaded.failures
    for check_id, check in loaded.checks.items():
        assert f"`{check_id}`" in readme, f"{check_id} is not in the README's check table"
        for metric in check.metrics:
            row = next((line for line in readme.splitlines() if f"`envdoctor_{metric.name}`" in line), None)
            assert row is not None, f"envdoctor_{metric.name} is not documented in the README"
            if metric.label:
                assert f"`{metric.label}`" in row, f"label {metric.label} of envdoctor_{metric.name} is not documented"
    for name in ("envdoctor_check_status", "envdoctor_check_success", "envdoctor_check_duration_seconds",
                 "envdoctor_build_info", "envdoctor_last_run_timestamp_seconds"):
        assert f"`{name}`" in readme
