"""The HTTP side of `serve`: /metrics, /report, /healthz and an index, nothing else.

Every answer is bytes the scheduler already made (serve.snapshot); a request never
runs a check, renders metrics or touches /proc. The server is the standard
library's threading HTTP server: one short-lived thread per connection, each with
a socket timeout so a slow or silent client cannot hold a thread for long. With
TLS the handshake happens in that thread too, never in the accepting loop.
Requests are not logged (one line per scrape would drown the events that matter).
"""

from __future__ import annotations

import base64
import errno
import selectors
import socket
import ssl
import threading
import time
import urllib.parse
from email.errors import MissingHeaderBodySeparatorDefect
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from envdoctor import __version__, deadman, log  # log here: with no descriptor left, no import can be read
from envdoctor.serve.bell import Bell
from envdoctor.serve.snapshot import Snapshot, age
from envdoctor.serve.webconfig import WebConfig

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Callable

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REQUEST_TIMEOUT = 10.0  # seconds a connection may sit idle or half-sent before it is closed
# The socket timeout bounds each read, not a request: a client that sends one byte every
# 9 s (slowloris) would hold its thread for days. Every request, from the wait for its
# first byte to its answer written (TLS handshake included), gets REQUEST_DEADLINE seconds
# in all; past it the connection is shut down. And at most MAX_CONNECTIONS are served at
# once (one thread each); a new connection beyond that takes the slot of the one that has
# waited longest. Closing the new one instead let anyone who could open 128 idle sockets,
# before any TLS handshake or password, fail every scrape for as long as they reconnected
# (helper-40; node_exporter answered through 300): a scrape is quick, an idle flood is old.
REQUEST_DEADLINE = 30.0
HANDSHAKE_LOG_SECONDS = 10.0  # a failing TLS handshake is logged at most this often (with how many failed)
MAX_CONNECTIONS = 128
INDEX = """<!doctype html>
<html><head><title>envdoctor serve</title></head>
<body><h1>envdoctor serve {version}</h1>
<p>Checks the environment of every training process on this node; answers from the last completed run.</p>
<ul>
<li><a href="metrics">/metrics</a>: Prometheus exposition</li>
<li><a href="report">/report</a>: the JSON report of every target</li>
<li><a href="healthz">/healthz</a>: 200 while the last run is fresh, else 503 with the reason</li>
</ul></body></html>
"""


def accepts_gzip(header: str) -> bool:
    """Whether an Accept-Encoding header allows gzip: named (or `*`) with a q above 0
    (RFC 9110 12.5.3; `gzip;q=0` means "not gzip")."""
    allowed: dict[str, bool] = {}
    for item in header.split(","):
        name, _, params = item.strip().partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        allowed[name.strip().lower()] = q > 0
    return allowed.get("gzip", allowed.get("*", False))


class Health:
    """What /healthz needs from the scheduler: the interval, what is stuck now, and why the
    runs fail when they do (None while they complete)."""

    def __init__(self, interval: Callable[[], float], stuck: Callable[[], list[str]],
                 failing: Callable[[], str | None] = lambda: None):
        self.interval = interval
        self.stuck = stuck
        self.failing = failing


# accept() failing for want of a resource: the connection waits in the queue (Go's net/http
# retries these after a growing delay too)
ACCEPT_RESOURCE_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def _say_accept_failing(exc: OSError) -> None:
    fields = {"reason": exc.strerror or str(exc)}
    if exc.errno in (errno.EMFILE, errno.ENFILE):
        fields["hint"] = "raise the daemon's open-files limit (LimitNOFILE=, ulimit -n)"
    log.event("error", "cannot accept connections; retrying", **fields)


def _say_accepting_again() -> None:
    log.event("info", "accepting connections again")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    request_deadline = REQUEST_DEADLINE
    max_connections = MAX_CONNECTIONS

    def __init__(self, address: tuple[str, int], snapshot: Callable[[], Snapshot], web: WebConfig, health: Health):
        host = address[0]
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            super().__init__(address, Handler)
        except OSError as exc:
            if host != EVERY_ADDRESS or exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                raise
            self.address_family = socket.AF_INET  # a host without IPv6: every IPv4 address
            super().__init__(("0.0.0.0", address[1]), Handler)
        self.snapshot = snapshot
        self.web = web
        self.health = health
        self.index = INDEX.format(version=__version__).encode()
        self._deadlines: dict[socket.socket, float] = {}  # every open connection -> when its request must be done
        self._deadlines_lock = threading.Lock()
        self._handshake_logged, self._handshakes_failed = -HANDSHAKE_LOG_SECONDS, 0
        self._wake = Bell()  # shutdown() rings the accept loop
        self._accept_backoff = 0.0  # seconds to wait before accepting again (get_request)
        self._stopping = False
        self._loop_ended = threading.Event()
        self._loop_ended.set()  # no loop running yet: shutdown() has nothing to wait for

    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Accept connections until shutdown(), waking only for a connection, for the
        earliest connection deadline, or for shutdown() itself. socketserver's own loop
        wakes every poll interval to look for shutdown, and each wake of an idle daemon
        cost ~0.4-1.2 ms of CPU here (a thread asleep for 0.5 s wakes with cold caches;
        `.dev`-measured: 60 wakes in 30 s, 70 ms): at 2 a second, a third of serve's
        whole CPU budget (0.5 % of a core) spent looking at nothing. `poll_interval` is
        taken for socketserver's signature and ignored."""
        self._loop_ended.clear()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self.socket, selectors.EVENT_READ, "accept")
                selector.register(self._wake.fileno(), selectors.EVENT_READ, "wake")
                while not self._stopping:
                    ready = selector.select(self._until_next_deadline())
                    if self._stopping:
                        break
                    for key, _events in ready:
                        if key.data == "accept":
                            self._handle_request_noblock()
                        else:
                            self._wake.drain()
                    self.service_actions()
                    if self._accept_backoff:
                        self._wake.wait(self._accept_backoff)  # shutdown() still ends it at once
        finally:
            self._loop_ended.set()

    def _until_next_deadline(self) -> float | None:
        """Seconds until the earliest open connection's deadline (None: none open)."""
        with self._deadlines_lock:
            earliest = min(self._deadlines.values(), default=None)
        return None if earliest is None else max(0.0, earliest - time.monotonic())

    def shutdown(self) -> None:
        """Stop serve_forever's loop and wait until it has ended (at once: it is rung)."""
        self._stopping = True
        self._wake.ring()
        self._loop_ended.wait()

    def server_close(self) -> None:
        super().server_close()
        wake = getattr(self, "_wake", None)  # also called by socketserver when the bind fails, before __init__ made it
        if wake is not None:
            wake.close()

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and self.server_address[0] == EVERY_ADDRESS:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 too, whatever the sysctl says
        super().server_bind()

    def get_request(self):
        try:
            sock, addr = self.socket.accept()
        except OSError as exc:
            # Out of descriptors or memory, the connection stays queued and the socket
            # readable: accepting again at once spun a CPU (8,130 failed accepts in 2 s),
            # and with no Python beat while idle, the deadman took it for a wedge and ended
            # the daemon (helper-105). Wait 5 ms, doubling to 1 s, as Go's net/http does.
            if exc.errno in ACCEPT_RESOURCE_ERRORS:
                first = not self._accept_backoff
                self._accept_backoff = min(1.0, max(0.005, self._accept_backoff * 2))
                if first:
                    _say_accept_failing(exc)
            raise
        if self._accept_backoff:
            self._accept_backoff = 0.0
            _say_accepting_again()
        sock.settimeout(REQUEST_TIMEOUT)
        return sock, addr  # with TLS, Handler.setup wraps it: the handshake runs in the request's thread

    def process_request(self, request, client_address) -> None:
        with self._deadlines_lock:
            oldest = None
            if len(self._deadlines) >= self.max_connections:  # the earliest deadline: the longest wait
                oldest = min(self._deadlines, key=self._deadlines.__getitem__)
                del self._deadlines[oldest]  # its slot is the new one's now; its thread sees the shutdown
            self._deadlines[request] = time.monotonic() + self.request_deadline
        if oldest is not None:
            try:
                oldest.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        super().process_request(request, client_address)  # a thread that cannot start: handle_error, shutdown_request

    def shutdown_request(self, request) -> None:
        """Every connection ends here (also when setup failed: a refused TLS handshake), so
        its slot is always given back."""
        self.forget(request)
        super().shutdown_request(request)

    def arm(self, sock: socket.socket) -> None:
        """A new request starts on `sock`: it has request_deadline seconds from now (later
        than its last: the accept loop, waiting for the earlier one, wakes and waits again)."""
        with self._deadlines_lock:
            if sock in self._deadlines:
                self._deadlines[sock] = time.monotonic() + self.request_deadline

    def forget(self, sock: socket.socket) -> None:
        with self._deadlines_lock:
            self._deadlines.pop(sock, None)

    def service_actions(self) -> None:
        """Called by serve_forever after each wake: shut down connections past their
        deadline (the thread blocked reading or writing them then returns at once)."""
        super().service_actions()
        now = time.monotonic()
        with self._deadlines_lock:
            late = [sock for sock, deadline in self._deadlines.items() if deadline <= now]
            for sock in late:  # shut down once: its thread returns and forgets it, its slot is free now
                del self._deadlines[sock]
        for sock in late:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request, client_address) -> None:
        """A client that hangs up is not an event worth a traceback. A TLS handshake that
        fails is said, at most once every HANDSHAKE_LOG_SECONDS: with a client CA the
        scraper's certificate does not match, every scrape failed and the log was silent
        (helper-40; node_exporter logs each one)."""
        import sys

        error = sys.exc_info()[1]
        if not isinstance(error, ssl.SSLError):
            return
        now = time.monotonic()
        with self._deadlines_lock:
            self._handshakes_failed += 1
            if now < self._handshake_logged + HANDSHAKE_LOG_SECONDS:
                return
            self._handshake_logged, failed, self._handshakes_failed = now, self._handshakes_failed, 0
        from envdoctor import log

        log.event("warn", "TLS handshake failed", client=str(client_address[0]) if client_address else "",
                  error=getattr(error, "reason", None) or str(error), failed_since_last=failed)

    @property
    def port(self) -> int:
        return self.server_address[1]


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"
    server_version = f"envdoctor/{__version__}"
    sys_version = ""
    timeout = REQUEST_TIMEOUT

    def handle_one_request(self) -> None:
        self.server.arm(self._raw)  # each request on a kept-alive connection gets its own deadline
        deadman.refresh()
        super().handle_one_request()

    def setup(self) -> None:
        # each connection beats the deadman: the CPU its handshake and requests spend is
        # Python running, and an idle daemon's main thread beats only once a minute (serve.mainbell)
        deadman.refresh()
        self._raw = self.request  # the accepted socket, the key of its deadline (TLS wraps a copy)
        tls = self.server.web.tls
        if tls is not None:
            raw = self.request
            first = raw.recv(8, socket.MSG_PEEK)
            if first[:1].isalpha():  # plain HTTP to the TLS port: answer as Go's server does, not a reset
                raw.sendall(b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                            b"Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
                raise ConnectionAbortedError("plain HTTP on the TLS port")
            # raises on a bad or missing client certificate: the connection is dropped
            self.request = tls.wrap_socket(raw, server_side=True)
        super().setup()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if isinstance(self.request, ssl.SSLSocket):
                self.request.close()

    def log_message(self, format: str, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _framing(self) -> str:
        """How the request says where it ends: "" (no body), "body" (one, which none of our
        answers reads, so the connection closes after the answer: kept open, the body's
        bytes would be read as the next request, one request in and two answers out, the
        smuggling shape), or why it cannot be trusted (answered 400, and closed). A proxy
        in front may read these differently from us (RFC 9112 5.1, 6.3): a space before a
        header's colon (http.server takes "Content-Length : 5" and every line after it for
        the body), two Content-Lengths, one that is not a number (helper-70: each gave two
        answers). Read once per request: both the answer and its headers ask."""
        said = getattr(self, "_framing_said", None)
        if said is not None and said[0] is self.headers:
            return said[1]
        framing = self._read_framing()
        self._framing_said = (self.headers, framing)
        return framing

    def _read_framing(self) -> str:
        # the parser stopped at a line it could not read, and took the rest for a body (its
        # other defects are MIME's: a multipart type without a boundary is a legal header here)
        payload = self.headers.get_payload()
        if any(isinstance(d, MissingHeaderBodySeparatorDefect) for d in self.headers.defects) or (
                isinstance(payload, str) and payload):
            return "a header line that is not NAME: VALUE"
        names = [name.lower() for name in self.headers.keys()]
        lengths = self.headers.get_all("Content-Length") or []
        if len(lengths) > 1:
            return "more than one Content-Length"
        length = lengths[0].strip() if lengths else ""
        if lengths and not (length.isascii() and length.isdigit()):  # an empty one too
            return "a Content-Length that is not a number"
        if "transfer-encoding" in names or length.strip("0"):
            return "body"
        return ""

    def _closes(self) -> bool:
        """The client asked to close the connection after this answer: `Connection: close`,
        also among other options (`keep-alive, close`), which http.server misses."""
        options = ",".join(self.headers.get_all("Connection") or []).lower().split(",")
        return "close" in (option.strip() for option in options)

    def _send(self, code: int, body: bytes, content_type: str, head: bool, extra: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in {**self.server.web.headers, **(extra or {})}.items():
            self.send_header(key, value)
        if self._framing() or self._closes():
            self.send_header("Connection", "close")  # also sets close_connection
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _authorised(self) -> bool:
        web = self.server.web
        if not web.auth_required:
            return True
        header = self.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):  # binascii.Error, and the bare ValueError b64decode raises on non-ASCII
            return False
        return bool(sep) and web.check_password(user, password)

    def _answer(self, head: bool) -> None:
        if self._bad_framing(head):
            return
        if not self._authorised():
            self._send(401, b"Unauthorized\n", "text/plain; charset=utf-8", head, {"WWW-Authenticate": "Basic"})
            return
        path = self.path.split("?", 1)[0]
        if path[:8].lower().startswith(("http://", "https://")):  # absolute form (RFC 9112 3.2.2), as a proxy sends
            path = urllib.parse.urlsplit(path).path or "/"
        snap = self.server.snapshot()
        if path == "/metrics":
            if not snap.metrics:
                self._send(503, b"no run has completed yet\n", "text/plain; charset=utf-8", head)
            elif accepts_gzip(self.headers.get("Accept-Encoding", "")):
                self._send(200, snap.metrics_gzip, METRICS_TYPE, head, {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"})
            else:
                self._send(200, snap.metrics, METRICS_TYPE, head, {"Vary": "Accept-Encoding"})
        elif path == "/report":
            if not snap.report:
                self._send(503, b'{"error": "no run has completed yet"}\n', "application/json", head)
            else:
                self._send(200, snap.report, "application/json", head)
        elif path == "/healthz":
            code, text = healthz(snap, self.server.health)
            self._send(code, text.encode(), "text/plain; charset=utf-8", head)
        elif path in ("/", "/index.html"):
            self._send(200, self.server.index, "text/html; charset=utf-8", head)
        else:
            self._send(404, b"not found: try /metrics, /report, /healthz\n", "text/plain; charset=utf-8", head)

    def _bad_framing(self, head: bool) -> bool:
        """Answer 400 (and close) to a request whose end cannot be trusted (see _framing)."""
        framing = self._framing()
        if framing in ("", "body"):
            return False
        self._send(400, f"bad request: {framing}\n".encode(), "text/plain; charset=utf-8", head)
        return True

    def _refuse(self) -> None:
        if self._bad_framing(False):
            return
        self._send(405, b"only GET and HEAD\n", "text/plain; charset=utf-8", False, {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def __getattr__(self, name: str):
        """Every other method (OPTIONS, TRACE, any word) is refused as POST is: 405 naming
        GET and HEAD. http.server answers a method it has no do_ for with 501 and its
        HTML error page."""
        if name.startswith("do_"):
            return self._refuse
        raise AttributeError(name)

    def version_string(self) -> str:
        return self.server_version  # http.server appends " " + sys_version: a trailing space


def healthz(snap: Snapshot, health: Health, now: float | None = None) -> tuple[int, str]:
    """200 while the last completed run is younger than three intervals; else 503 with what is stuck."""
    limit = 3 * health.interval()
    seconds = age(snap, now)
    stuck = health.stuck()
    if seconds < limit:
        note = f"; {len(stuck)} call(s) stuck: {', '.join(stuck)}" if stuck else ""
        return 200, f"ok: last run completed {seconds:.1f} s ago{note}\n"
    if snap.completed_at == 0.0:
        why = "no run has completed yet"
    else:
        why = f"the last completed run is {seconds:.0f} s old (limit {limit:g} s: three intervals)"
    failing = health.failing()
    if stuck:
        detail = f"; stuck: {', '.join(stuck)}"
    elif failing:  # not "slow": every run ends at once with this (helper-78)
        detail = f"; the runs fail: {failing}"
    elif snap.completed_at == 0.0:  # right after start: not "slow" (helper-116)
        detail = "; the first run is still going, and nothing is stuck past its deadline"
    else:
        detail = "; nothing is stuck past its deadline: the run is slow"
    return 503, f"unhealthy: {why}{detail}\n"


EVERY_ADDRESS = "::"  # ':PORT': IPv6 and IPv4 alike (dual stack), as node_exporter listens


def parse_address(text: str) -> tuple[str, int]:
    """node_exporter's HOST:PORT ([::1]:PORT for IPv6; ':PORT' means every address, IPv6
    and IPv4; Server falls back to IPv4's only where the host has no IPv6)."""
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()):
        raise ValueError(f"--web.listen-address must be HOST:PORT, not {text!r}")
    if int(port) > 65535:
        raise ValueError(f"--web.listen-address: port {port} in {text!r} is out of range (0 to 65535)")
    host = host.strip("[]")
    try:
        host.encode("idna")  # what the socket module does with a name; undecodable bytes raised TypeError there
    except UnicodeError:
        raise ValueError(f"--web.listen-address: {text!r} has no host name or address in it") from None
    return (host or EVERY_ADDRESS, int(port))


def show_address(host: str, port: int) -> str:
    """HOST:PORT as the flag takes it: an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def close(server: Server) -> None:
    """Stop the accept loop (at once) and close the listening socket."""
    server.shutdown()
    server.server_close()
