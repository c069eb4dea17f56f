"""deploy/README.md: every command in it runs here, verbatim but for `sudo`, each
platform's section in order in a sandbox: a mount namespace with /etc, /opt and
/usr/local overlaid (so installs land in a scratch layer, never on this machine);
from the unit's start on, a network namespace with only a loopback (so the unit's
:10061, every address, is private).
The few that need a cluster or systemd as PID 1 are named in NOT_HERE with what
runs in their place; a command added to the README without either fails the test."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "deploy/README.md"

START_UNIT = ("(exec $(sed -n 's/^ExecStart=//p' /etc/systemd/system/envdoctor.service) >serve.log 2>&1) & "
              "SERVE=$!; trap 'kill $SERVE' EXIT; "
              "for i in $(seq 150); do curl -sf http://localhost:10061/healthz >/dev/null && break; sleep 0.2; done")

# README command -> (why it cannot run here, what runs in its place: a shell line, or "" for nothing)
NOT_HERE = {
    "sudo systemctl daemon-reload": ("systemd is not PID 1 here", ""),
    "sudo systemctl enable --now envdoctor": ("systemd is not PID 1 here; the unit's own ExecStart is started", START_UNIT),
    "kubectl apply -k deploy/kubernetes": ("no cluster here; test_deploy_kubernetes validates what it applies", ""),
    "kubectl -n envdoctor rollout status daemonset/envdoctor": ("no cluster here", ""),
    "sudo .venv/bin/python benchmarks/fleet_simulation.py --nodes 50":
        ("a benchmark of minutes; test_deploy_grafana runs the same fleet code with 3 nodes", ""),
}


def _sections() -> dict[str, list[str]]:
    sections, current = {}, None
    in_block = False
    for line in README.read_text().splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
        elif line.startswith("```"):
            in_block = line.strip() == "```sh" if not in_block else False
        elif in_block and line.strip() and not line.lstrip().startswith("#"):
            sections.setdefault(current, []).append(line.strip())
    return sections


def _sandbox(tmp_path, commands, env_extra=None):
    """Run the commands in order under `unshare --mount`, in a copy of the repo; from
    the unit's start on, inside a further `unshare --net` with only a loopback (the
    installs before it need the package index)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for the sandbox")
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__",
                                                             ".pytest_cache", ".hypothesis"))
    head = ["set -uo pipefail"]
    for top in ("/etc", "/opt", "/usr/local"):
        upper, scratch = tmp_path / ("upper" + top.replace("/", "_")), tmp_path / ("work" + top.replace("/", "_"))
        upper.mkdir()
        scratch.mkdir()
        head.append(f"mount -t overlay overlay -o lowerdir={top},upperdir={upper},workdir={scratch} {top} || exit 97")
    steps = []
    for number, command in enumerate(commands):
        run = NOT_HERE[command][1] if command in NOT_HERE else re.sub(r"^sudo ", "", command)
        steps.append(f"echo '=== {number}'")
        steps.append(f"{run}; echo \"=== rc $?\"" if run else "echo '=== rc 0'")
    split = next((i for i, line in enumerate(steps) if START_UNIT in line), None)
    if split is not None:
        private = tmp_path / "loopback-only.sh"
        private.write_text("\n".join(["set -uo pipefail", "ip link set lo up", *steps[split - 1:]]))
        steps = steps[:split - 1] + [f"unshare --net bash {private}"]
    env = {**os.environ, **(env_extra or {})}
    proc = subprocess.run(["unshare", "--mount", "bash", "-c", "\n".join(head + steps)], cwd=work,
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode != 97, "overlay mount failed: " + proc.stderr
    outputs = {}
    for chunk in proc.stdout.split("=== ")[1:]:
        first, _, body = chunk.partition("\n")
        if first.startswith("rc "):
            outputs[last]["rc"] = int(first[3:])
        else:
            last = commands[int(first)]
            outputs[last] = {"out": body}
    assert set(outputs) == set(commands), proc.stdout[-3000:] + proc.stderr[-3000:]
    return outputs, proc


def test_every_readme_command_is_run_here_or_named_with_its_stand_in():
    commands = [c for cmds in _sections().values() for c in cmds]
    assert len(commands) >= 15
    assert set(NOT_HERE) <= set(commands), "NOT_HERE names a command the README no longer has"
    assert {"systemd", "Kubernetes", "Slurm", "Prometheus", "Grafana"} <= set(_sections())


@pytest.mark.real
def test_systemd_section(tmp_path):
    commands = _sections()["systemd"]
    out, proc = _sandbox(tmp_path, commands)
    failed = {c: o for c, o in out.items() if o.get("rc") != 0}
    assert failed == {}, f"{failed}\n{proc.stderr[-3000:]}"
    verify = next(c for c in commands if "systemd-analyze verify" in c)
    assert out[verify]["out"].strip() == ""
    healthz = next(c for c in commands if c.endswith("/healthz"))
    assert out[healthz]["out"].startswith("ok: last run completed")


@pytest.mark.real
def test_kubernetes_section(tmp_path):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl not installed (its kustomize renders the manifests offline)")
    commands = _sections()["Kubernetes"]
    out, proc = _sandbox(tmp_path, commands)
    assert all(o["rc"] == 0 for o in out.values()), out
    render = next(c for c in commands if c.startswith("kubectl kustomize"))
    assert "kind: DaemonSet" in out[render]["out"] and "kind: PodMonitor" in out[render]["out"]


@pytest.mark.real
def test_slurm_section(tmp_path):
    """The health program runs for real on this machine's state; a stand-in scontrol
    records what it would do (there is no Slurm here)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "scontrol.log"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (bin_dir / "scontrol").chmod(0o755)
    (bin_dir / "envdoctor").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m envdoctor "$@"\n')
    (bin_dir / "envdoctor").chmod(0o755)
    commands = _sections()["Slurm"]
    out, proc = _sandbox(tmp_path, commands, {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    installs = [c for c in commands if c.startswith("sudo install")]
    assert all(out[c]["rc"] == 0 for c in installs), out
    health = next(c for c in commands if "envdoctor-health.sh" in c and "install" not in c)
    calls = log.read_text() if log.exists() else ""
    assert out[health]["rc"] in (0, 1), out[health]
    if out[health]["rc"] == 1:  # this machine has a real problem: it says so in one line and drains
        assert out[health]["out"].startswith("envdoctor: ") and "State=DRAIN" in calls
    else:
        assert "State=DRAIN" not in calls
    assert not Path("/etc/slurm/envdoctor-health.sh").exists()  # the sandbox kept it off this machine


@pytest.mark.real
def test_prometheus_and_grafana_sections(tmp_path):
    commands = _sections()["Prometheus"] + _sections()["Grafana"]
    out, proc = _sandbox(tmp_path, commands)
    assert all(o["rc"] == 0 for o in out.values()), out
    generated = tmp_path / "repo/deploy/grafana/envdoctor-fleet.json"
    assert generated.read_text() == (REPO / "deploy/grafana/envdoctor-fleet.json").read_text()
