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
