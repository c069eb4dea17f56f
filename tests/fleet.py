"""A fleet on one machine: `envdoctor serve` daemons as separate nodes, and one real
Prometheus scraping them with deploy/prometheus's rules loaded.

Each node runs in its own pid and mount namespace (tests/fleet_node.py): its own
process table, its own /dev/shm, its own GPUs (NVML is the one fake), the real serve
on a loopback port it picks itself. Used by tests/test_deploy_grafana.py and
benchmarks/fleet_simulation.py. Loopback only; every process is started under
`timeout`, and stop() (or leaving the `with`) ends them all.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RULES = REPO / "deploy/prometheus/envdoctor.rules.yml"
_LISTENING = re.compile(r"msg=listening address=(127\.0\.0\.1:\d+)")


def can_run() -> str | None:
    """Why a fleet cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (a pid and mount namespace and a tmpfs /dev/shm per node)"
    for tool in ("unshare", "prometheus", "timeout"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (prometheus: Debian package 'prometheus'; scripts/test.sh installs it)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    total = 0.0
    for number, unit in re.findall(r"(\d+)(ms|s|m|h|d)", duration):
        total += int(number) * units[unit]
    return total


def compressed_rules(dst: Path, factor: float, src: Path = RULES) -> Path:
    """The shipped rules with every `for:` divided by `factor` (15m -> 15s at 60), so
    a simulation sees alerts fire in seconds; expressions and thresholds unchanged."""
    doc = yaml.safe_load(src.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = f"{max(1, round(_seconds(rule['for']) / factor))}s"
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dst


@dataclass
class Node:
    name: str
    spec: dict
    proc: subprocess.Popen
    log: Path
    address: str | None = None
    workloads: list[int] = field(default_factory=list)
    serve_pid: int | None = None  # as the host sees it, for CPU and RSS


class Fleet:
    def __init__(self, specs: dict[str, dict], workdir: Path, *, deadline: float = 300, interval: float = 5,
                 scrape_interval: str = "2s", evaluation_interval: str = "1s", rules: list[Path] | None = None):
        self.specs = specs
        self.workdir = workdir
        self.deadline = deadline
        self.interval = interval
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.rules = [RULES] if rules is None else rules
        self.nodes: dict[str, Node] = {}
        self.prometheus: subprocess.Popen | None = None
        self.prometheus_url = ""

    # -- start --------------------------------------------------------------------------
    def __enter__(self) -> "Fleet":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 180) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "envdoctor.toml"
        config.write_text('[serve]\nselect_comm = ["train*"]\n')
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.workdir),
               "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
        for name, spec in self.specs.items():
            env["XDG_CACHE_HOME"] = str(self.workdir / name / "cache")  # each node its own, cold, as on a fresh node
            spec = {**spec, "serve_args": ["--interval", str(self.interval), "--config", str(config)]}
            log = self.workdir / f"{name}.log"
            cmd = ["timeout", "--kill-after=5", str(int(self.deadline) + 15),
                   "unshare", "--pid", "--fork", "--mount-proc", "--mount", "--kill-child",
                   sys.executable, str(HERE / "fleet_node.py"), json.dumps(spec), str(self.deadline),
                   str(self.workdir / name)]
            with open(log, "wb") as out:
                proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=dict(env), start_new_session=True)
            self.nodes[name] = Node(name, spec, proc, log)
        end = time.monotonic() + timeout
        for node in self.nodes.values():
            while node.address is None:
                text = node.log.read_text(errors="replace")
                match = _LISTENING.search(text)
                line = next((l for l in text.splitlines() if l.startswith("FLEET_NODE ")), None)
                if match and line:
                    node.address = match.group(1)
                    node.workloads = json.loads(line.split(" ", 1)[1])["workloads"]
                    node.serve_pid = self._serve_pid(node)
                elif node.proc.poll() is not None:
                    raise RuntimeError(f"{node.name} exited {node.proc.returncode}: {text[-2000:]}")
                elif time.monotonic() > end:
                    raise RuntimeError(f"{node.name} did not start serving in {timeout:.0f} s: {text[-2000:]}")
                else:
                    time.sleep(0.2)
        self._start_prometheus(end)

    @staticmethod
    def _serve_pid(node: Node) -> int | None:
        """serve's pid as the host sees it: the process under this node's `timeout`
        (timeout -> unshare -> node init -> serve) that was started with --serve."""
        import psutil

        try:
            for child in psutil.Process(node.proc.pid).children(recursive=True):
                if "--serve" in child.cmdline():
                    return child.pid
        except psutil.Error:
            pass
        return None

    def _start_prometheus(self, end: float) -> None:
        port = _free_port()
        config = {
            "global": {"scrape_interval": self.scrape_interval, "scrape_timeout": self.scrape_interval,
                       "evaluation_interval": self.evaluation_interval},
            "rule_files": [str(r) for r in self.rules],
            "scrape_configs": [{"job_name": "envdoctor", "static_configs": [
                {"targets": [n.address], "labels": {"instance": n.name}} for n in self.nodes.values()]}],
        }
        path = self.workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.prometheus_url = f"http://127.0.0.1:{port}"
        with open(self.workdir / "prometheus.log", "wb") as out:
            self.prometheus = subprocess.Popen(
                ["timeout", "--kill-after=5", str(int(self.deadline) + 15), "prometheus", f"--config.file={path}",
                 f"--storage.tsdb.path={self.workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                 "--log.level=warn"], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        while True:
            try:
                with urllib.request.urlopen(self.prometheus_url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.prometheus.poll() is not None or time.monotonic() > end:
                raise RuntimeError("prometheus did not start: " + (self.workdir / "prometheus.log").read_text()[-2000:])
            time.sleep(0.2)

    # -- ask ------------------------------------------------------------------------------
    def query(self, expr: str) -> list[dict]:
        url = self.prometheus_url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"query {expr!r}: {body}")
        return body["data"]["result"]

    def wait_for(self, expr: str, count: int, timeout: float) -> list[dict]:
        """Poll until `expr` returns at least `count` series, or the timeout."""
        end = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if len(result) >= count or time.monotonic() > end:
                return result
            time.sleep(0.5)

    # -- stop -----------------------------------------------------------------------------
    def stop(self) -> None:
        procs = [n.proc for n in self.nodes.values()] + ([self.prometheus] if self.prometheus else [])
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        end = time.monotonic() + 15
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=10)


def serve_answers_healthz(args: list[str], timeout: float = 60) -> tuple[int, str, str]:
    """Start the real `envdoctor serve ARGS` (its listen address forced onto
    127.0.0.1:0), wait for /healthz to say 200, stop it with SIGTERM.
    Returns (exit code, the /healthz body, the log)."""
    args = [a for a in args if not a.startswith("--web.listen-address")]
    proc = subprocess.Popen([sys.executable, "-m", "envdoctor", "serve", *args, "--web.listen-address=127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"})
    log, body, end = [], "", time.monotonic() + timeout
    try:
        address = None
        while address is None and time.monotonic() < end and proc.poll() is None:
            line = proc.stdout.readline()
            log.append(line)
            match = _LISTENING.search(line)
            address = match.group(1) if match else None
        while address and time.monotonic() < end:
            try:
                with urllib.request.urlopen(f"http://{address}/healthz", timeout=5) as r:
                    body = r.read().decode()
                    break
            except OSError:
                time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        log.append(out)
    return proc.returncode, body, "".join(log)
