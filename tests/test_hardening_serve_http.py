"""Hostile HTTP against a real `envdoctor serve` on the loopback: bodies where none belong
(read as a second request before), a non-ASCII Authorization header (no answer at all
before), and web configs that would hang the start or every scrape."""

from __future__ import annotations

import base64
import re
import socket
import time

import bcrypt
import pytest

from envdoctor.serve import webconfig
from helpers import cli
from serve_support import Serve, get, wait_until

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


def exchange(port: int, data: bytes, wait: float = 3.0) -> bytes:
    """Send raw bytes, read until the server closes or `wait` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except OSError:  # a timeout, or a reset (a refused TLS handshake)
                break
            if not chunk:
                break
            out += chunk
        return out


def status_lines(raw: bytes) -> list[bytes]:
    """Every response's status line (a body ends in a bare newline, so the next may follow it)."""
    return re.findall(rb"(?:^|\n)(HTTP/1\.[01] \d{3}[^\r\n]*)", raw)


@pytest.fixture(scope="module")
def serve():
    started = Serve("--interval", "1")
    wait_until(lambda: get(started.url + "/metrics")[0] == 200, timeout=60)
    yield started
    started.stop()


SMUGGLED = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("head", [
    b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(SMUGGLED),
    b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(SMUGGLED),
    b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
])
def test_a_body_is_never_read_as_a_second_request(serve, head):
    """A request that carries a body gets one answer and the connection closes: the body
    was answered as a request of its own before (one request in, two answers out)."""
    raw = exchange(serve.port, head + SMUGGLED)
    lines = status_lines(raw)
    assert len(lines) == 1, raw[:2000]
    assert b"connection: close" in raw.lower()


@pytest.mark.parametrize("headers, reason", [
    (b"Content-Length: 0\r\nContent-Length: %d\r\n" % len(SMUGGLED), b"more than one Content-Length"),
    (b"Content-Length : %d\r\n" % len(SMUGGLED), b"a header line that is not NAME: VALUE"),
    (b"Transfer-Encoding : chunked\r\n", b"a header line that is not NAME: VALUE"),
    (b"Content-Length: +%d\r\n" % len(SMUGGLED), b"a Content-Length that is not a number"),
    (b"Content-Length: %d, %d\r\n" % (len(SMUGGLED), len(SMUGGLED)), b"a Content-Length that is not a number"),
    (b"Content-Length: \r\n", b"a Content-Length that is not a number"),  # empty: helper-73
])
def test_a_request_whose_end_is_ambiguous_gets_400_and_the_connection_closes(serve, headers, reason):
    """helper-70: a proxy in front may read these framings differently from us (RFC 9112 5.1,
    6.3). http.server read the first Content-Length only, and took a header with a space
    before its colon, and every line after it, for the body: two answers for one request."""
    raw = exchange(serve.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n" + SMUGGLED)
    assert status_lines(raw) == [b"HTTP/1.1 400 Bad Request"], raw[:2000]
    assert b"connection: close" in raw.lower() and raw.endswith(b"bad request: " + reason + b"\n")


@pytest.mark.parametrize("headers", [
    b"Content-Type: multipart/form-data\r\n", b"Content-Type: multipart/mixed; boundary=abc\r\n",
    b"Content-Type: message/rfc822\r\nContent-Length: 0\r\n", b"MIME-Version: 1.0\r\nContent-Type: multipart/mixed\r\n",
])
def test_legal_headers_that_mime_finds_fault_with_are_answered(serve, headers):
    """helper-73: the header parser (email's) records MIME defects, and a message/* type gets a
    sub-message for a body; read as broken header lines, these legal requests got 400."""
    raw = exchange(serve.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"Connection: close\r\n\r\n")
    assert status_lines(raw) == [b"HTTP/1.1 200 OK"], raw[:500]


def test_keep_alive_still_serves_requests_without_a_body(serve):
    raw = exchange(serve.port, SMUGGLED + SMUGGLED)
    assert len(status_lines(raw)) == 2
    raw = exchange(serve.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n" + SMUGGLED)
    assert len(status_lines(raw)) == 2


@pytest.mark.parametrize("option", [b"close", b"keep-alive, close", b"Close, TE", b"close\r\nConnection: TE"])
def test_connection_close_among_other_options_closes_at_once(serve, option):
    """helper-70: http.server honours `Connection: close` only alone; with other options the
    connection stayed open until its idle deadline, and a client reading to the end waited."""
    started = time.monotonic()
    raw = exchange(serve.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: " + option + b"\r\n\r\n", wait=8)
    assert status_lines(raw) == [b"HTTP/1.1 200 OK"] and b"connection: close" in raw.lower()
    assert time.monotonic() - started < 8, "the server kept the connection open"


@pytest.mark.parametrize("target, answer", [
    (b"http://127.0.0.1/healthz", b"ok"), (b"HTTP://node:10061/metrics?x=1", b"envdoctor_build_info"),
    (b"https://node", b"<html"), (b"http://node/nothing", b"not found"),
    (b"http://node#/healthz", b"<html"),  # a fragment is no part of the path (helper-73)
])
def test_an_absolute_form_request_target_is_answered_as_its_path(serve, target, answer):
    """RFC 9112 3.2.2: a server accepts the absolute form (what a client sends a proxy);
    node_exporter does. It was answered 404 (helper-70)."""
    raw = exchange(serve.port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer in raw, raw[:500]


@pytest.fixture(scope="module")
def serve_auth(tmp_path_factory):
    path = tmp_path_factory.mktemp("web") / "web.yml"
    path.write_text(f"basic_auth_users:\n  alice: '{HASH}'\n")
    started = Serve("--interval", "1", "--web.config.file", str(path))
    yield started
    started.stop()


@pytest.mark.parametrize("header", [
    "Basic \u00e9\u00e9".encode("latin-1"),            # not ASCII: base64 raised a bare ValueError
    b"Basic " + base64.b64encode(b"alice:\xff\xfe"),  # not UTF-8
    b"Basic " + base64.b64encode(b"alice:" + b"x" * 200),  # over bcrypt's 72 bytes
    b"Basic " + base64.b64encode(b"alice:a\0b"),
    b"Basic !!!",
    b"Bearer abc",
])
def test_a_malformed_authorization_header_gets_401(serve_auth, header):
    raw = exchange(serve_auth.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: " + header + b"\r\n\r\n")
    assert status_lines(raw)[:1] == [b"HTTP/1.1 401 Unauthorized"], raw[:500]


def test_the_right_password_still_works(serve_auth):
    good = base64.b64encode(b"alice:s3cret")
    raw = exchange(serve_auth.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Basic " + good + b"\r\n\r\n")
    assert status_lines(raw)[0].split()[1] in (b"200", b"503")


def _with_cost(cost: int) -> str:
    return HASH[:4] + f"{cost:02d}" + HASH[6:]


def test_a_hash_with_a_huge_cost_is_refused_at_once(tmp_path):
    """Checking a $2b$31$ hash at load ran 2^31 rounds: the start hung for days; every scrape
    with it would take as long. Now the file is refused in one line, at once."""
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  alice: '{_with_cost(31)}'\n")
    started = time.monotonic()
    out = cli("serve", "--web.config.file", str(path), timeout=60)
    assert out.returncode == 2, out.stderr
    assert "basic_auth_users.alice" in out.stderr and "cost" in out.stderr and "Traceback" not in out.stderr
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("bad", ["$2b$10$short", "$2c$10$" + "a" * 53, "$2b$03$" + HASH[7:], "$2b$xx$" + HASH[7:],
                                 HASH[:7] + "!" * 53, "plain"],
                         ids=["short", "unknown-prefix", "cost-3", "cost-not-a-number", "not-base64", "plain"])
def test_hashes_that_are_not_bcrypt_are_named(tmp_path, bad):
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  alice: '{bad}'\n")
    with pytest.raises(webconfig.WebConfigError) as info:
        webconfig.load(str(path))
    assert info.value.key == "basic_auth_users.alice"


def test_a_good_hash_still_loads_and_checks(tmp_path):
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  alice: '{HASH}'\n  bob: '{HASH.replace('$2b$', '$2y$', 1)}'\n")
    config = webconfig.load(str(path))
    assert config.check_password("alice", "s3cret") and config.check_password("bob", "s3cret")
    assert not config.check_password("alice", "nope")


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "directory", "not_utf8"])
def test_a_web_config_that_is_not_a_small_file_is_refused_at_once(tmp_path, kind):
    """A FIFO hung the start (read_text waited for a writer); /dev/zero filled memory until
    the OOM killer came. Now: exit 2 with one line, within the subprocess timeout."""
    import os

    path = tmp_path / "web.yml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path = "/dev/zero"
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"basic_auth_users:\n  \xff\xfe: x\n")
    out = cli("serve", "--once", "--web.config.file", str(path), timeout=60)
    assert out.returncode == 2, out.stderr
    assert "bad web config" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("text", [
    'http_server_config:\n  headers:\n    X-A: "a\\r\\nSet-Cookie: evil=1"\n',
    'http_server_config:\n  headers:\n    "X A": "b"\n',
    'http_server_config:\n  headers:\n    X-A: {nested: map}\n',
    'http_server_config:\n  headers:\n    X-A:\n',
])
def test_a_header_that_would_split_the_response_is_refused(tmp_path, text):
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(webconfig.WebConfigError) as info:
        webconfig.load(str(path))
    assert info.value.key.startswith("http_server_config.headers.")


def test_the_toolkits_headers_still_load(tmp_path):
    path = tmp_path / "web.yml"
    path.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n"
                    "    Strict-Transport-Security: max-age=31536000; includeSubDomains\n    X-XSS-Protection: 0\n")
    assert webconfig.load(str(path)).headers == {"X-Frame-Options": "deny", "X-Content-Type-Options": "nosniff",
                                                 "X-XSS-Protection": "0",
                                                 "Strict-Transport-Security": "max-age=31536000; includeSubDomains"}


# -- slow and many clients, against the server class in this process (real sockets) ---------


@pytest.fixture
def small_server():
    """httpd.Server on a loopback port with a 2 s request deadline and room for 4 connections."""
    import threading

    from envdoctor.serve import httpd
    from envdoctor.serve.snapshot import empty

    server = httpd.Server(("127.0.0.1", 0), empty, webconfig.WebConfig(), httpd.Health(lambda: 15.0, lambda: []))
    server.request_deadline, server.max_connections = 2.0, 4
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.test_thread = thread
    yield server
    httpd.close(server)
    thread.join(timeout=5)


def _wakeups(thread) -> int:
    with open(f"/proc/self/task/{thread.native_id}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches:"))


def test_an_idle_accept_loop_sleeps_until_a_connection_or_shutdown(small_server):
    """socketserver's loop woke every poll interval (0.5 s) to look for shutdown; on this
    machine each wake of an idle thread cost ~0.4-1.2 ms of CPU, a third of serve's whole
    budget. Now it wakes for a connection, a connection's deadline or shutdown only, and
    shutdown still returns at once."""
    from envdoctor.serve import httpd

    time.sleep(0.3)
    before = _wakeups(small_server.test_thread)
    time.sleep(2.0)
    assert _wakeups(small_server.test_thread) - before <= 1
    with socket.create_connection(small_server.server_address[:2], timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert sock.recv(64).startswith(b"HTTP/1.1 ")  # it answers: the loop woke for the connection
    t0 = time.monotonic()
    httpd.close(small_server)
    small_server.test_thread.join(timeout=5)
    assert not small_server.test_thread.is_alive() and time.monotonic() - t0 < 0.5


def _closed_within(sock: socket.socket, seconds: float, drip: bytes = b"") -> bool:
    """Keep sending `drip` every half second (under the 10 s read timeout); True once the
    server has closed the connection, False if it is still open after `seconds`."""
    deadline = time.monotonic() + seconds
    sock.settimeout(0.5)
    while time.monotonic() < deadline:
        try:
            if drip:
                sock.sendall(drip)
            if sock.recv(4096) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def test_a_slowloris_client_is_cut_off_at_the_request_deadline(small_server):
    """One header line every half second never trips the per-read timeout; it held its
    thread for as long as it kept dripping. Now the whole request has a deadline."""
    with socket.create_connection(("127.0.0.1", small_server.port)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert _closed_within(s, 20.0, drip=b"X-Slow: 1\r\n")


def test_a_scrape_beyond_the_cap_takes_the_slot_of_the_oldest_idle_connection(small_server):
    """Helper-40: with every slot held by an idle socket, a new connection was closed at
    once, before TLS or auth: anyone who could connect failed every scrape for as long as
    they reconnected. The connection that has waited longest gives up its slot instead."""
    held = [socket.create_connection(("127.0.0.1", small_server.port)) for _ in range(4)]
    try:
        time.sleep(0.5)  # let the accept loop take all four
        assert exchange(small_server.port, SMUGGLED, wait=2.0).startswith(b"HTTP/1.1 503")  # answered (no run yet)
        assert _closed_within(held[0], 5.0)  # the oldest idle one went
        flood = [socket.create_connection(("127.0.0.1", small_server.port)) for _ in range(20)]  # reconnecting
        try:
            assert exchange(small_server.port, SMUGGLED, wait=2.0).startswith(b"HTTP/1.1 503")
        finally:
            for s in flood:
                s.close()
    finally:
        for s in held:
            s.close()
    time.sleep(0.5)
    assert _slots_come_back(small_server)


def _slots_come_back(server) -> bool:
    """Every evicted connection's slot and thread are given back."""
    return wait_until(lambda: len(server._deadlines) <= 1, timeout=20)


def test_failed_tls_handshakes_give_their_slots_back(tmp_path):
    """A handshake that fails ends in setup(), before finish(): the slot is still returned."""
    import threading

    from envdoctor.serve import httpd
    from envdoctor.serve.snapshot import empty
    from serve_support import make_certs

    make_certs(tmp_path)
    (tmp_path / "web.yml").write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    web = webconfig.load(str(tmp_path / "web.yml"))
    server = httpd.Server(("127.0.0.1", 0), empty, web, httpd.Health(lambda: 15.0, lambda: []))
    server.max_connections = 2
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        for _ in range(6):  # garbage instead of a ClientHello, and plain HTTP to the TLS port
            exchange(server.port, b"\x16\x03\x01garbage-not-a-handshake", wait=1.0)
            exchange(server.port, SMUGGLED, wait=1.0)
        import ssl

        context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.sendall(SMUGGLED)
                assert tls.recv(64).startswith(b"HTTP/1.1 503")
    finally:
        httpd.close(server)
        thread.join(timeout=5)


@pytest.mark.parametrize("which", ["cert_file", "key_file", "client_ca_file"])
def test_a_certificate_path_that_is_a_fifo_is_refused_not_waited_on(tmp_path, which):
    """OpenSSL opened the FIFO and waited for a writer: the start hung (timeout 10: rc 124)."""
    import os

    from serve_support import make_certs

    make_certs(tmp_path)
    os.mkfifo(tmp_path / "trap")
    files = {"cert_file": "server.crt", "key_file": "server.key", "client_ca_file": "ca.crt", which: "trap"}
    (tmp_path / "web.yml").write_text("tls_server_config:\n  client_auth_type: RequireAndVerifyClientCert\n"
                                      + "".join(f"  {k}: {v}\n" for k, v in files.items()))
    out = cli("serve", "--once", "--web.config.file", str(tmp_path / "web.yml"), timeout=60)
    assert out.returncode == 2, out.stderr
    assert f"tls_server_config.{which}" in out.stderr and "not a regular file" in out.stderr


def test_a_missing_key_file_names_its_key(tmp_path):
    from serve_support import make_certs

    make_certs(tmp_path)
    (tmp_path / "web.yml").write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: nothere.key\n")
    with pytest.raises(webconfig.WebConfigError) as info:
        webconfig.load(str(tmp_path / "web.yml"))
    assert info.value.key == "tls_server_config.key_file" and "No such file" in info.value.reason


EMFILE_SERVER = r"""
import os, resource, sys, threading, time
from envdoctor.serve import httpd
from envdoctor.serve.snapshot import empty
from envdoctor.serve.webconfig import WebConfig

server = httpd.Server(("127.0.0.1", 0), empty, WebConfig(), httpd.Health(lambda: 15.0, lambda: []))
open_now = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 4, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
threading.Thread(target=server.serve_forever, daemon=True).start()
print(server.server_address[1], flush=True)
sys.stdin.readline()  # until the test is done
"""


def test_an_accept_loop_out_of_descriptors_waits_instead_of_spinning():
    """helper-105: with no descriptor left, accept() fails and the connection stays queued,
    so the socket stays readable: the loop accepted again at once (8,130 failed accepts in
    2 s, a CPU), and an idle daemon's deadman took the spin for a wedge. It now waits 5 ms,
    doubling to 1 s, says so once, and accepts again once descriptors are free."""
    import os
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", EMFILE_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    clients: list[socket.socket] = []
    try:
        port = int(child.stdout.readline())
        for _ in range(12):  # more than the descriptors left: the rest wait in the listen queue
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)

        def cpu() -> float:
            with open(f"/proc/{child.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        before = cpu()
        time.sleep(3)
        assert cpu() - before < 0.5  # spinning, it was ~3 s of CPU in 3 s
        for sock in clients:
            sock.close()
        clients.clear()
        deadline = time.monotonic() + 20
        answered = b""
        while time.monotonic() < deadline and not answered.startswith(b"HTTP/1.1 "):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    answered = sock.recv(64)
            except OSError:
                time.sleep(0.2)
        assert answered.startswith(b"HTTP/1.1 "), answered
    finally:
        for sock in clients:
            sock.close()
        child.stdin.close()
        child.wait(timeout=10)
    err = child.stderr.read()
    assert err.count("cannot accept connections; retrying") == 1, err
    assert "LimitNOFILE" in err and "accepting connections again" in err, err
