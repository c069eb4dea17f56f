"""serve against the real thing: torch processes in a 0.5-CPU cgroup and in a 64 MiB
/dev/shm namespace, a real Prometheus scraping it, node_exporter reading the
textfile, and a bounded soak of concurrent scrapes while processes come and go."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

from serve_support import NodeExporter, Serve, free_port, get, wait_until
from test_real_cgroup import _make_limited_cgroup, _remove
from test_real_shm import _namespace_or_skip

pytestmark = pytest.mark.real

WORKLOAD = "import sys, time, torch; print('ready', flush=True); time.sleep(120)"


def _workload(tmp_path, shell: str, env: dict) -> subprocess.Popen:
    """`shell` ends by exec'ing $WORKLOAD_PY: the pid stays the Popen's (sh, unshare and python exec in turn)."""
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    return subprocess.Popen(["sh", "-c", shell], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env, "WORKLOAD_PY": f"{sys.executable} {script}"})


def _ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "ready", proc.stderr.read()


def _sample(body: str, name: str, target: str) -> float | None:
    for line in body.splitlines():
        if line.startswith(name + "{") and f'target="{target}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


class Prometheus:
    def __init__(self, tmp_path, serve_port: int):
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip("Debian's prometheus is not installed (scripts/test.sh installs it)")
        self.port = free_port()
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
                       f"  - job_name: envdoctor\n    static_configs:\n      - targets: ['127.0.0.1:{serve_port}']\n")
        self.proc = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def query(self, promql: str) -> list:
        code, body, _ = get(f"http://127.0.0.1:{self.port}/api/v1/query?query={urllib.parse.quote(promql)}", timeout=5)
        if code != 200:
            return []
        return json.loads(body)["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def test_workloads_found_judged_scraped_and_gone_after_exit(tmp_path):
    _namespace_or_skip()
    cgroup = _make_limited_cgroup()
    procs: list[subprocess.Popen] = []
    serve = prom = None
    try:
        quota = _workload(tmp_path, f"echo $$ > {cgroup.path / 'cgroup.procs'} && exec $WORKLOAD_PY", {"OMP_NUM_THREADS": "16"})
        small_shm = _workload(tmp_path, "exec unshare -m sh -c 'mount --make-rprivate / && "
                              "mount -t tmpfs -o size=64m tmpfs /dev/shm && exec $WORKLOAD_PY'", {})
        procs = [quota, small_shm]
        for p in procs:
            _ready(p)
        # the process in the namespace is the python that unshare's shell exec'd: same pid as small_shm
        interval = 2
        serve = Serve("--interval", str(interval))
        prom = Prometheus(tmp_path, serve.port)
        a, b = f"pid:{quota.pid}", f"pid:{small_shm.pid}"

        def both_judged():
            code, body, _ = get(serve.url + "/metrics")
            text = body.decode()
            ok = code == 200 and _sample(text, "envdoctor_cpu_effective", a) is not None \
                and _sample(text, "envdoctor_shm_size_bytes", b) is not None
            return text if ok else None

        body = wait_until(both_judged, timeout=3 * interval + 30)
        assert body, "serve did not report both workload processes"
        assert _sample(body, "envdoctor_cpu_effective", a) == 0.5
        assert f'envdoctor_check_status{{check="cpu.threads",status="warn",target="{a}"}} 1.0' in body
        assert _sample(body, "envdoctor_shm_size_bytes", b) == 64 * 1024**2
        assert f'envdoctor_check_status{{check="shm.size",status="fail",target="{b}"}} 1.0' in body
        assert f'source="torch",target="{a}"' in body
        report = json.loads(get(serve.url + "/report")[1])
        rows = {(r["check"], r["target"]): r for r in report["results"]}
        assert "OMP_NUM_THREADS=1" in rows[("cpu.threads", a)]["remediation"]
        assert ("gpu.health", a) not in rows and ("gpu.health", "node") in rows  # node-wide checks run once

        series = wait_until(lambda: prom.query(f'envdoctor_shm_size_bytes{{target="{b}"}}'), timeout=60)
        assert series and float(series[0]["value"][1]) == 64 * 1024**2
        assert prom.query(f'envdoctor_target_info{{target="{a}",source="torch"}}')
        assert prom.query('up{job="envdoctor"} == 1')

        for p in procs:
            p.kill()
            p.wait()
        gone = wait_until(lambda: (lambda t: a not in t and b not in t and "envdoctor_target_info" in t)(
            get(serve.url + "/metrics")[1].decode()), timeout=3 * interval + 30)
        assert gone, "series of exited processes are still served"
        serve.wait_for(f"msg=\"target gone\" target={a}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if prom is not None:
            prom.stop()
        if serve is not None:
            assert serve.stop() == 0
        _remove(cgroup)


def test_node_exporter_reads_the_textfile(tmp_path):
    out = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--once", "--textfile", str(tmp_path / "envdoctor.prom")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "envdoctor.prom").read_text()
    assert "envdoctor_check_status{" in text and not [n for n in os.listdir(tmp_path) if n != "envdoctor.prom"]
    node = NodeExporter("--collector.textfile", f"--collector.textfile.directory={tmp_path}")
    try:
        code, body, _ = get(f"http://127.0.0.1:{node.port}/metrics")
    finally:
        node.stop()
    body = body.decode()
    assert code == 200
    assert "node_textfile_scrape_error 0" in body
    assert 'envdoctor_check_status{check="shm.size",status=' in body and 'target="node"' in body
    # the README says which checks a daemon runs: gpu.health on the node, and never onnx.opset
    assert 'check="gpu.health"' in text and 'check="onnx.opset"' not in text and "envdoctor_onnx_" not in text


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


def test_soak_concurrent_scrapes_while_processes_come_and_go(tmp_path):
    """Bounded: 30 s, 8 scrapers on the loopback, short processes selected by an env var."""
    tag = f"ENVDOCTOR_SOAK_{os.getpid()}"
    cfg = tmp_path / "envdoctor.toml"
    cfg.write_text(f"[serve]\ninterval = 1\nselect_env = [\"{tag}\"]\n")
    serve = Serve("--config", str(cfg))
    failures: list[str] = []
    counts = [0] * 8
    stop = threading.Event()
    children: list[subprocess.Popen] = []
    try:
        wait_until(lambda: get(serve.url + "/metrics")[0] == 200, timeout=60)
        time.sleep(2)
        threads_before = _threads(serve.proc.pid)

        def scrape(i: int) -> None:
            while not stop.is_set():
                try:
                    code, body, _ = get(serve.url + "/metrics", timeout=5)
                    if code != 200 or not body.endswith(b"\n"):
                        failures.append(f"status {code}")
                except Exception as exc:
                    failures.append(repr(exc))
                counts[i] += 1

        workers = [threading.Thread(target=scrape, args=(i,), daemon=True) for i in range(8)]
        for w in workers:
            w.start()
        deadline = time.monotonic() + 30
        seen_targets = set()
        while time.monotonic() < deadline:
            children.append(subprocess.Popen(["sleep", "2"], env={**os.environ, tag: "1"}))
            children = [c for c in children if c.poll() is None]
            body = get(serve.url + "/metrics")[1].decode()
            seen_targets.update(l.split('target="')[1].split('"')[0] for l in body.splitlines()
                                if l.startswith("envdoctor_target_info{") and 'source="selector"' in l)
            time.sleep(0.5)
        stop.set()
        for w in workers:
            w.join(timeout=10)
        for c in children:
            c.wait()
        time.sleep(3)  # every selected process has exited: let a run or two drop them
        threads_after = _threads(serve.proc.pid)
        body = get(serve.url + "/metrics")[1].decode()
    finally:
        stop.set()
        for c in children:
            if c.poll() is None:
                c.kill()
        code = serve.stop()
    assert code == 0
    assert not failures, failures[:5]
    assert sum(counts) > 100
    assert len(seen_targets) >= 5  # processes really came and went under the scrapes
    assert 'source="selector"' not in body  # and none of them is still served
    # bounded, not leaking: every run's checks share the process-wide watchdog, whose pool
    # grows to its cap while many short targets come and go and never past it
    from envdoctor.watchdog import Watchdog

    assert threads_after <= threads_before + Watchdog().max_workers, (threads_before, threads_after)
