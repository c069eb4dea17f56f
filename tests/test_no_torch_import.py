"""envdoctor's own process never imports torch (DESIGN principles 1 and 5).

Torch facts come from torch's files (envdoctor.torchfacts), the probe subprocess
only when no file says. These tests run every registered check, and then the CLI,
in a fresh interpreter that records (and refuses) any attempt to import torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

GUARD = """
import sys
ATTEMPTS = []
class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            ATTEMPTS.append(name)
            raise ImportError("envdoctor's process must not import " + name)
        return None
sys.meta_path.insert(0, _NoTorch())
"""


def run(code: str, tmp_path) -> subprocess.CompletedProcess:
    # The cache lives in <XDG_CACHE_HOME>/envdoctor: keep it out of the working
    # directory, which `-c` puts on sys.path (a folder named envdoctor there would
    # shadow the package).
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("ENVDOCTOR_NO_CACHE", None)
    env.pop("ENVDOCTOR_CONFIG", None)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-c", GUARD + textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=180, cwd=work)


RUN_ALL_CHECKS = """
import json
from envdoctor import registry, runner
from envdoctor.context import Session
reg = registry.load()
plans = [runner.Plan(c, dict(c.config), max(c.timeout or 0, runner.DEFAULT_TIMEOUT)) for c in reg.checks.values()]
session = Session()
results = runner.run(plans, session)
by_id = {r.check: r.status.value for r in results}
torch_facts = session.computed("torch") or {}
print(json.dumps({"attempts": ATTEMPTS, "torch_loaded": "torch" in sys.modules, "results": by_id,
                  "source": torch_facts.get("source"), "torch_version": torch_facts.get("torch_version")}))
"""


@pytest.mark.real
def test_running_every_registered_check_never_imports_torch(tmp_path):
    for round_ in ("cold", "warm"):
        proc = run(RUN_ALL_CHECKS, tmp_path)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["attempts"] == [] and out["torch_loaded"] is False, (round_, out)
        # the torch checks did run (from torch's files), not skip for want of torch
        assert {"cuda.runtime", "torch.cudnn", "torch.pin_memory"} <= set(out["results"])
        assert out["results"]["cuda.runtime"] != "error", out
        assert out["source"] == "files" and out["torch_version"], (round_, out)
        # no probe ran, so none left a cache entry
        assert not list((tmp_path / "cache").glob("envdoctor/torch-probe-*")), round_


CLI = """
import runpy, json
sys.argv = ["envdoctor", "check", "--format", "json"]
code = 0
try:
    runpy.run_module("envdoctor", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
sys.stderr.write(json.dumps({"attempts": ATTEMPTS, "torch_loaded": "torch" in sys.modules, "code": code}) + "\\n")
"""


@pytest.mark.real
def test_cli_check_never_imports_torch(tmp_path):
    for round_ in ("cold", "warm"):
        proc = run(CLI, tmp_path)
        verdict = json.loads(proc.stderr.strip().splitlines()[-1])
        assert verdict["attempts"] == [] and verdict["torch_loaded"] is False, (round_, verdict)
        assert verdict["code"] in (0, 1), proc.stderr
        report = json.loads(proc.stdout)
        rows = {r["check"]: r for r in report["results"]}
        assert rows["torch.cudnn"]["facts"]["torch_version"], rows["torch.cudnn"]


@pytest.mark.real
def test_importtime_of_the_cli_lists_no_torch_module(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("ENVDOCTOR_CONFIG", None)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "envdoctor", "check", "--format", "json"],
                          capture_output=True, text=True, env=env, timeout=180, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    modules = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert len(modules) > 50  # importtime did report
    assert not [m for m in modules if m == "torch" or m.startswith("torch.")]
