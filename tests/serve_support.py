"""Helpers for the serve tests: start the daemon and node_exporter on free loopback
ports, make real certificates with openssl, ask with curl. Every process started
here is stopped by the caller's fixture, also when a test fails."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """A running `envdoctor serve` subprocess; its stderr lines are collected."""

    def __init__(self, *args: str, env: dict | None = None, cwd=None, command: list[str] | None = None):
        full_env = dict(os.environ)
        full_env.pop("ENVDOCTOR_CONFIG", None)
        full_env.update(env or {})
        command = command or [sys.executable, "-m", "envdoctor"]
        self.proc = subprocess.Popen([*command, "serve", "--web.listen-address", "127.0.0.1:0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env, cwd=cwd)
        self.lines: list[str] = []
        self._queue: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.port = 0
        line = self.wait_for("listening", timeout=60)
        self.port = int(re.search(r"address=\S+:(\d+)", line).group(1))

    def _pump(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            self._queue.put(line)

    def wait_for(self, text: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        for line in list(self.lines):
            if text in line:
                return line
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self._queue.empty():
                    break
                continue
            if text in line:
                return line
        raise AssertionError(f"no log line with {text!r} within {timeout} s; stderr so far:\n" + "\n".join(self.lines))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def get(url: str, timeout: float = 10) -> tuple[int, bytes, dict]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def wait_until(predicate, timeout: float, step: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


def need(tool: str | None, name: str) -> str:
    if not tool:
        pytest.skip(f"{name} is not installed (scripts/test.sh installs it)")
    return tool


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run([need(shutil.which("openssl"), "openssl"), *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(d: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 signed by it, a client certificate signed
    by it, and a client certificate from an unrelated CA (refused under mTLS)."""
    def ca(name: str) -> None:
        # keyUsage as a real CA has it: Python 3.13's default client context verifies
        # strictly (VERIFY_X509_STRICT) and refuses a CA certificate without one.
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)

    def leaf(name: str, issuer: str, ext: str) -> None:
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                "-out", f"{name}.csr", cwd=d)
        (d / f"{name}.ext").write_text(ext)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{issuer}.crt", "-CAkey", f"{issuer}.key",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=d)

    ca("ca")
    ca("otherca")
    leaf("server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    leaf("client", "ca", "extendedKeyUsage=clientAuth\n")
    leaf("stranger", "otherca", "extendedKeyUsage=clientAuth\n")
    return {n: d / f"{n}.crt" for n in ("ca", "otherca", "server", "client", "stranger")}


def curl(url: str, *args: str) -> str:
    """The HTTP status curl saw, or 'fail' when no HTTP answer came (TLS refused, reset)."""
    out = subprocess.run([need(shutil.which("curl"), "curl"), "-s", "-o", "/dev/null", "-w", "%{http_code}",
                          "--max-time", "10", *args, url], capture_output=True, text=True, timeout=30)
    code = out.stdout.strip()
    return code if out.returncode == 0 and code != "000" else "fail"


class NodeExporter:
    """Debian's prometheus-node-exporter with only the collectors asked for."""

    def __init__(self, *args: str):
        need(NODE_EXPORTER, "prometheus-node-exporter")
        self.port = free_port()
        self.proc = subprocess.Popen([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{self.port}",
                                      "--collector.disable-defaults", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"node_exporter exited: {self.proc.stderr.read()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("node_exporter did not start listening")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


RUNS_COUNTING = r"""
import json, sys
from envdoctor import redact
from envdoctor.serve import Daemon, Options
secrets = json.loads(sys.argv[2])
counted = []  # what `patch` counts, for our jobs only: other processes on the node come and go
exec(sys.argv[4])
d = Daemon(Options(once=True, config_file=sys.argv[1]))
runs = []
for _ in range(int(sys.argv[3])):
    counted.clear()
    snap = d.scheduler.run_once()
    runs.append({"counted": len(counted), "report": snap.report.decode(), "targets": list(snap.targets)})
print(json.dumps(runs))
"""


def runs_over_jobs_with_secrets(patch: str, tmp_path: Path, name: str, runs: int = 2,
                                jobs: int = 2) -> tuple[list[dict], list[int], list[str]]:
    """`runs` serve runs in one process over `jobs` orphaned sleepers, as a job's processes
    are to the daemon. Each holds its own secret in HF_TOKEN and, quoted by cpu.threads'
    finding, in OMP_NUM_THREADS=4<secret>. `patch` (Python, run before the daemon is made,
    with `redact`, the jobs' `secrets` and a list `counted` at hand) appends to `counted`
    what a run should do less. Returns (each run's "counted", "report" and "targets", the
    sleepers' pids, their secrets); the sleepers are gone by then."""
    import json

    tag = f"ENVDOCTOR_{name}_{os.getpid()}"
    secrets = [f"hf_{os.getpid()}Qz8vN3xT5mK1pL7wR{n}" for n in range(jobs)]
    pids = []
    try:
        for secret in secrets:
            out = subprocess.run(["sh", "-c", "sleep 30 > /dev/null 2>&1 & echo $!"], check=True, capture_output=True,
                                 text=True, env={**os.environ, tag: "1", "HF_TOKEN": secret, "OMP_NUM_THREADS": f"4{secret}"})
            pids.append(int(out.stdout))
        cfg = tmp_path / "envdoctor.toml"
        cfg.write_text(f"[serve]\nselect_env = [\"{tag}\"]\n")
        out = subprocess.run([sys.executable, "-c", RUNS_COUNTING, str(cfg), json.dumps(secrets), str(runs), patch],
                             capture_output=True, text=True, timeout=120)
    finally:
        for pid in pids:
            os.kill(pid, 9)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), pids, secrets


def assert_each_jobs_secret_masked(run: dict, pids: list[int], secrets: list[str]) -> None:
    """The run examined every job, and its report shows no secret, whole or cut, while each
    job's cpu.threads row still says which variable was wrong."""
    import json

    labels = {f"pid:{pid}" for pid in pids}
    assert labels <= set(run["targets"]), run["targets"]
    assert all(secret not in run["report"] and secret[:12] not in run["report"] for secret in secrets)
    rows = [r for r in json.loads(run["report"])["results"] if r["target"] in labels and r["check"] == "cpu.threads"]
    assert [r["summary"].split(" is invalid")[0] for r in rows] == ["OMP_NUM_THREADS='4***'"] * len(pids)
