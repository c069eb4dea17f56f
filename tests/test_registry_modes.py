"""registry.NOT_IN_EXEC (envdoctor's checks that exec's pre-flight does not import) says
what each check's own `modes` say, and exec treats those ids as it did when it imported
them: known to the config, refused by --only with the same reason."""

from __future__ import annotations

import os
import subprocess
import sys

from exec_log import events

from envdoctor import registry

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_table_is_every_builtin_check_that_does_not_run_in_exec():
    builtins = [ep for ep in registry.entry_points_of(registry.GROUP) if ep.value.startswith(registry.BUILTIN_MODULE_PREFIX)]
    assert len(builtins) >= 13
    not_in_exec = {ep.value: ep.load().id for ep in builtins if not ep.load().runs_in("exec")}
    assert not_in_exec == registry.NOT_IN_EXEC


def test_a_load_for_exec_imports_none_of_them_and_names_them():
    code = ("import sys\nfrom envdoctor import registry\n"
            "r = registry.load(for_exec=True)\n"
            "print(sorted(r.not_in_exec))\n"
            "print(sorted(m for m in sys.modules if m.startswith('envdoctor.checks.')))\n"
            "print(sorted(r.checks))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True,
                         timeout=60).stdout.splitlines()
    assert eval(out[0]) == sorted(registry.NOT_IN_EXEC.values())
    imported = eval(out[1])
    assert not [m for m in imported if f"{m}:CHECK" in registry.NOT_IN_EXEC], imported
    assert set(eval(out[2])) == {c.id for c in registry.load().checks.values() if c.runs_in("exec")}


def _exec(*args, env=None):
    full = {**os.environ, "PYTHONPATH": REPO, **(env or {})}
    full.pop("ENVDOCTOR_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "envdoctor", "exec", *args], capture_output=True, text=True,
                          env=full, timeout=120, cwd=REPO)


def test_only_naming_one_is_refused_with_the_reason_it_always_had():
    proc = _exec("--only", "onnx.opset,shm.size", "--", "true")
    assert proc.returncode == 2, proc.stderr
    line = events(proc.stderr)[-1]["msg"]
    assert "--only onnx.opset: does not run in exec" in line and "exec runs: cpu.threads" in line, line
    proc = _exec("--", "true", env={"ENVDOCTOR_ONLY": "torch.pin_memory,dist.master_port"})
    assert proc.returncode == 2
    assert "the config's only (or ENVDOCTOR_ONLY) dist.master_port, torch.pin_memory: does not run in exec" \
        in events(proc.stderr)[-1]["msg"]


def test_their_ids_are_known_to_skip_and_to_the_config():
    proc = _exec("--skip", "onnx.opset", "--", "true",
                 env={"ENVDOCTOR_CHECK__ONNX_OPSET__ENABLED": "false", "ENVDOCTOR_CHECK__TORCH_PIN_MEMORY__TIMEOUT": "5"})
    assert proc.returncode == 0, proc.stderr
    assert events(proc.stderr)[-1]["action"] == "start"
    proc = _exec("--only", "onnx.opsett", "--", "true")  # a typo is still a typo
    assert proc.returncode == 2 and "unknown check id 'onnx.opsett'" in proc.stderr
