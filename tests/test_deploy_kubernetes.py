"""deploy/kubernetes: every manifest validates offline against the Kubernetes schemas
(strict: an unknown or misspelt field fails), the PodMonitor against the Prometheus
Operator's models, and the pieces agree with each other and with serve's flags."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="test extra: kubernetes-validate")

HERE = Path(__file__).resolve().parent.parent / "deploy/kubernetes"
MONITOR_FILES = ["namespace.yaml", "daemonset.yaml", "service.yaml", "podmonitor.yaml"]
VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]  # 1.30: recursiveReadOnly


def _docs():
    return [doc for name in MONITOR_FILES for doc in yaml.safe_load_all((HERE / name).read_text()) if doc]


def _by_kind():
    return {doc["kind"]: doc for doc in _docs()}


def _pod():
    return _by_kind()["DaemonSet"]["spec"]["template"]


@pytest.mark.parametrize("version", VERSIONS)
def test_core_manifests_validate_strictly(version):
    core = [d for d in _docs() if not d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {d["kind"] for d in core} == {"Namespace", "DaemonSet", "Service"}
    for doc in core:
        kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_has_teeth():
    daemonset = copy.deepcopy(_by_kind()["DaemonSet"])
    daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, VERSIONS[-1], strict=True)


def test_podmonitor_matches_the_operator_models():
    """Round trip through the prometheus-operator models: a field they do not know
    would be dropped (pydantic ignores extras), so equality proves every field known."""
    models = pytest.importorskip("cloudcoil.models.prometheus_operator.v1", reason="test extra: cloudcoil models")
    doc = _by_kind()["PodMonitor"]
    parsed = models.PodMonitor.model_validate(doc)
    assert parsed.model_dump(by_alias=True, exclude_unset=True, mode="json") == doc
    bogus = copy.deepcopy(doc)
    bogus["spec"]["podMetricsEndpoints"][0]["scrapeTimout"] = "10s"
    assert models.PodMonitor.model_validate(bogus).model_dump(by_alias=True, exclude_unset=True, mode="json") != bogus


def test_kustomization_renders_exactly_the_manifests():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed")
    proc = subprocess.run([kubectl, "kustomize", str(HERE)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rendered = sorted((d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(proc.stdout) if d)
    assert rendered == sorted((d["kind"], d["metadata"]["name"]) for d in _docs())


def test_pod_reads_the_host_read_only_through_the_path_flags():
    spec = _pod()["spec"]
    container = spec["containers"][0]
    assert spec["hostPID"] is True
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths == {"proc": "/proc", "sys": "/sys", "root": "/"}
    flags = dict(arg.split("=", 1) for arg in container["args"] if arg.startswith("--path."))
    assert flags == {"--path.procfs": mounts["proc"]["mountPath"], "--path.sysfs": mounts["sys"]["mountPath"],
                     "--path.rootfs": mounts["root"]["mountPath"]}
    assert all(mounts[name]["readOnly"] for name in host_paths)
    # helper-89: the top mount alone read-only left the host's submounts writable
    assert all(mounts[name].get("recursiveReadOnly") == "IfPossible" for name in host_paths)
    assert not any(mounts[name].get("mountPropagation") for name in host_paths)  # IfPossible requires None


def test_pod_drops_every_capability_but_the_two_and_cannot_escalate():
    ctx = _pod()["spec"]["containers"][0]["securityContext"]
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE", "DAC_READ_SEARCH"]}
    assert ctx["allowPrivilegeEscalation"] is False and ctx["readOnlyRootFilesystem"] is True
    assert ctx["privileged"] is False


def test_pod_requests_no_gpu_and_has_requests():
    resources = _pod()["spec"]["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in resources.get("limits", {}) and "nvidia.com/gpu" not in resources["requests"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]


def test_probes_service_and_podmonitor_point_at_the_same_port():
    container = _pod()["spec"]["containers"][0]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}
    listen = next(a for a in container["args"] if a.startswith("--web.listen-address="))
    assert listen.endswith(f":{port['metrics']}")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    kinds = _by_kind()
    labels = _pod()["metadata"]["labels"]
    assert kinds["Service"]["spec"]["selector"].items() <= labels.items()
    assert kinds["Service"]["spec"]["ports"][0]["targetPort"] == "metrics"
    monitor = kinds["PodMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= labels.items()
    assert monitor["podMetricsEndpoints"][0]["port"] == "metrics"
    assert labels[monitor["jobLabel"]] == "envdoctor"  # the rules' up{job="envdoctor"}


@pytest.mark.real
def test_the_containers_arguments_run_the_real_serve_to_a_healthy_healthz():
    """The DaemonSet's args as they are, each /host path mapped back to the host path
    it mounts (this test runs on the host), the listen address onto the loopback."""
    import fleet

    spec = _pod()["spec"]
    mount_of = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    host_of = {mount_of[v["name"]]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    args = []
    for arg in spec["containers"][0]["args"]:
        flag, _, value = arg.partition("=")
        args.append(f"{flag}={host_of[value]}" if value in host_of else arg)
    assert args[0] == "serve"
    code, body, log = fleet.serve_answers_healthz(args[1:])
    assert body.startswith("ok"), log
    assert code == 0, log
