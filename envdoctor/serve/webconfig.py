"""The web config file (`--web.config.file`): TLS, client certificates and basic auth.

It is the exporter-toolkit's format, so one file can serve node_exporter and
envdoctor on the same node and mean the same thing to both:

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12             # the default, as in the toolkit; max is TLS13
    basic_auth_users:
      prometheus: $2b$10$...         # bcrypt hashes, never passwords

Read once at start and checked whole: an unknown key, a malformed hash, a missing
certificate or a client CA without a client-auth policy stops the start (exit 2)
with the key named, as the toolkit's strict YAML does. Keys the toolkit knows but
envdoctor does not implement (rate_limit, cipher_suites, client_allowed_sans, the
client-auth types that accept an unverified certificate: Python's ssl always
verifies a certificate it asks for) are refused the same way rather than ignored,
so a file never silently means less here than it does to node_exporter.

Passwords are checked with the `bcrypt` package. An unknown user is checked
against a dummy hash so the answer takes as long as for a known one; a right
answer is remembered (by a digest of user, password and hash) so a scraper with
the right password does not pay bcrypt's cost on every scrape, as the toolkit's
own cache does.
"""

from __future__ import annotations

import functools
import hashlib
import re
import ssl
import threading
from pathlib import Path

from envdoctor.record import Record

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping

TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
            "prefer_server_cipher_suites", "cert", "key", "client_ca"}
NOT_IMPLEMENTED = {
    "rate_limit": "rate limiting",
    "tls_server_config.cipher_suites": "choosing cipher suites",
    "tls_server_config.curve_preferences": "choosing curves",
    "tls_server_config.client_allowed_sans": "matching client SANs",
}
TOP_KEYS = {"tls_server_config", "basic_auth_users", "http_server_config", "rate_limit"}
HTTP_KEYS = {"http2", "headers"}
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# The toolkit's names; the two that accept a certificate without verifying it cannot
# be had with Python's ssl module, which verifies every certificate it requests.
CLIENT_AUTH = {"": ssl.CERT_NONE, "NoClientCert": ssl.CERT_NONE,
               "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL, "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
UNVERIFIED_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# The only headers the toolkit lets a config set, exactly so spelled, and the values it
# allows where it names them (exporter-toolkit web/handler.go, extraHTTPHeaders): any
# other header, or X-Frame-Options: DENY, stops node_exporter at start, so it stops us too.
ALLOWED_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None, "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"), "X-XSS-Protection": None, "Content-Security-Policy": None,
}
# $2a$/$2b$/$2x$/$2y$, a two-digit cost, then 53 characters of bcrypt's base64 (salt and digest).
_BCRYPT = re.compile(rb"\$2[abxy]\$(\d\d)\$[./A-Za-z0-9]{53}")
# One check at cost 16 takes ~6 s on a 2-core CI machine (measured: cost 14, 1.6 s); 17 would
# pass Prometheus' default 10 s scrape timeout. htpasswd's default is 5, the toolkit's docs use 10.
MAX_COST = 16
MAX_FILE_BYTES = 1 << 20  # a web config is a few hundred bytes; a bigger file is a mistake
# A header name is an RFC 9110 token; a value has no control characters (a CR or LF in
# one would end the header early and let the config write a second one, or a body).
_HEADER_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")


@functools.lru_cache(maxsize=1)
def _dummy_hash() -> bytes:
    """What an unknown user's password is checked against, so that answering "no such
    user" takes as long as a wrong password. Made when a config with users is loaded, not
    at import: hashing at cost 10 took ~60 ms of CPU at every start, and bcrypt's module
    stayed resident in every daemon, those without basic auth too."""
    import bcrypt

    return bcrypt.hashpw(b"envdoctor-dummy-password", bcrypt.gensalt(rounds=10))


def _where_in(name: str, exc: Exception, text: str) -> str:
    """file:line, where the YAML parser says it gave up (its marks count from 0; at the
    end of a file that ends in a newline, it names the empty line after: the last one)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = getattr(mark, "line", None)
    if not isinstance(line, int):
        return name
    return f"{name}:{min(line + 1, max(1, len(text.rstrip(chr(10)).split(chr(10)))))}"


def _yaml_problem(exc: Exception) -> str:
    """The parser's own words for what is wrong ("expected ',' or ']', but got '<stream end>'"),
    not only the context it was in ("while parsing a flow node")."""
    problem, context = getattr(exc, "problem", None), getattr(exc, "context", None)
    if problem:
        return f"{problem} ({context})" if context else str(problem)
    return str(exc).splitlines()[0]


class WebConfigError(ValueError):
    """The file cannot be used; the message names the file and the key."""

    def __init__(self, file: str, key: str | None, reason: str):
        where = f"{file}: {key}: " if key else f"{file}: "
        super().__init__(where + reason)
        self.file, self.key, self.reason = file, key, reason


class WebConfig(Record):
    """What the file says, settled: an ssl context (or None for plain HTTP) and the users."""

    def __init__(
        self,
        source: str | None = None,
        tls: ssl.SSLContext | None = None,
        client_auth: str = "NoClientCert",
        users: dict[str, bytes] | None = None,  # user -> bcrypt hash
        headers: dict[str, str] | None = None,
    ) -> None:
        self.source = source
        self.tls = tls
        self.client_auth = client_auth
        self.users = {} if users is None else users
        self.headers = {} if headers is None else headers
        self._ok: dict[bytes, float] = {}  # digests of passwords already checked: not a field, never shown
        self._lock = threading.Lock()

    @property
    def auth_required(self) -> bool:
        return bool(self.users)

    def check_password(self, user: str, password: str) -> bool:
        """True when `user` exists and `password` matches its hash (bcrypt, constant-ish time)."""
        stored = self.users.get(user)
        digest = hashlib.sha256(b"\0".join([user.encode(), password.encode(), stored or b""])).digest()
        if stored is not None:
            with self._lock:
                if digest in self._ok:
                    return True
        import bcrypt

        try:
            good = bcrypt.checkpw(password.encode("utf-8"), stored if stored is not None else _dummy_hash())
        except ValueError:
            good = False
        good = good and stored is not None
        if good:
            with self._lock:
                if len(self._ok) >= 256:
                    self._ok.clear()
                self._ok[digest] = 1.0
        return good


def _unique_keys_loader(yaml: Any) -> Any:
    """yaml's SafeLoader, refusing a key given twice in one mapping. PyYAML keeps the last;
    the toolkit's strict decoder stops node_exporter ("already set"). Two basic_auth_users
    tables would otherwise mean one thing to envdoctor and nothing to node_exporter."""

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, (str, int, float, bool)):
                    continue  # a key that is itself a mapping: refused later as no key of ours
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"{key!r} is given twice", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeys


def load(path: str | None) -> WebConfig:
    """Read and check the whole file; WebConfigError names what is wrong."""
    if not path:
        return WebConfig()
    import yaml  # only when a web config is given

    name = str(path)
    from envdoctor.paths import read_bytes

    try:
        # non-blocking, regular files only, at most MAX_FILE_BYTES: a FIFO hung the start,
        # /dev/zero filled memory until the OOM killer came
        text = read_bytes(path, MAX_FILE_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WebConfigError(name, None, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = yaml.load(text, Loader=_unique_keys_loader(yaml))
    except yaml.YAMLError as exc:
        raise WebConfigError(_where_in(name, exc, text), None, f"not valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:  # sequences nested hundreds deep: the parser recurses per level
        raise WebConfigError(name, None, "not a web config: nested too deeply") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise WebConfigError(name, None, "expected a mapping at the top (tls_server_config, basic_auth_users, ...)")
    base = Path(path).resolve().parent
    config = WebConfig(source=name)
    for key in data:
        if key not in TOP_KEYS:
            supported = sorted(TOP_KEYS - NOT_IMPLEMENTED.keys())  # rate_limit is known, then refused (helper-67)
            raise WebConfigError(name, str(key), f"unknown key; known: {', '.join(supported)}")
        if key in NOT_IMPLEMENTED:
            raise WebConfigError(name, key, f"{NOT_IMPLEMENTED[key]} is not supported by envdoctor serve")
    config.users = _users(name, data.get("basic_auth_users"))
    if config.users:
        _dummy_hash()  # now, not in the first scrape that names an unknown user
    config.headers = _http(name, data.get("http_server_config"))
    tls = data.get("tls_server_config")
    if tls is not None:
        config.tls, config.client_auth = _tls(name, tls, base)
    return config


def _users(name: str, users: Any) -> dict[str, bytes]:
    if users is None:
        return {}
    if not isinstance(users, dict):
        raise WebConfigError(name, "basic_auth_users", "expected a mapping of user: bcrypt hash")
    out = {}
    for user, hashed in users.items():
        key = f"basic_auth_users.{user}"
        if not isinstance(hashed, str):
            raise WebConfigError(name, key, "expected a bcrypt hash as a string")
        out[str(user)] = _bcrypt_hash(name, key, hashed)
    return out


def _hash_command() -> str:
    """A command that makes a bcrypt hash with this interpreter, which has bcrypt: htpasswd
    comes with Apache's utilities, which a GPU node seldom has (helper-67)."""
    import shlex
    import sys

    return (f"{shlex.quote(sys.executable or 'python3')} -c 'import bcrypt, getpass; "
            "print(bcrypt.hashpw(getpass.getpass().encode(), bcrypt.gensalt(10)).decode())'")


def _bcrypt_hash(name: str, key: str, hashed: str) -> bytes:
    """The hash as bytes, checked without paying its cost. Checking it with checkpw at its
    own cost ran 2^cost rounds: a $2b$31$ hash hung the start for days. So the shape is
    checked here, the salt by bcrypt at the cheapest cost, and a cost above MAX_COST is
    refused: every scrape with a wrong (or first) password would pay it."""
    raw = hashed.encode("utf-8", "replace")
    shape = _BCRYPT.fullmatch(raw)
    how = ("make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n', or without apache2-utils: "
           f"{_hash_command()}")
    if shape is None:
        raise WebConfigError(name, key, f"not a bcrypt hash ({how})")
    cost = int(shape.group(1))
    if not 4 <= cost <= MAX_COST:
        raise WebConfigError(name, key, f"bcrypt cost {cost} is outside 4..{MAX_COST} (one check at cost {cost} takes "
                                        f"about 2^{cost} rounds; scrapes would time out); {how}")
    import bcrypt

    try:
        bcrypt.checkpw(b"", raw[:4] + b"04" + raw[6:])  # raises ValueError on a salt bcrypt cannot use
    except ValueError:
        raise WebConfigError(name, key, f"not a bcrypt hash ({how})") from None
    return raw


def _http(name: str, http: Any) -> dict[str, str]:
    if http is None:
        return {}
    if not isinstance(http, dict):
        raise WebConfigError(name, "http_server_config", "expected a mapping")
    for key in http:
        if key not in HTTP_KEYS:
            raise WebConfigError(name, f"http_server_config.{key}", f"unknown key; known: {', '.join(sorted(HTTP_KEYS))}")
    _a_bool(name, "http_server_config.http2", http.get("http2"))
    headers = http.get("headers") or {}
    if not isinstance(headers, dict):
        raise WebConfigError(name, "http_server_config.headers", "expected a mapping of header: value")
    for header, value in headers.items():
        key = f"http_server_config.headers.{header}"
        if header not in ALLOWED_HEADERS:
            raise WebConfigError(name, key, f"this header can not be configured (as in node_exporter); "
                                            f"these can: {', '.join(ALLOWED_HEADERS)}")
        if not isinstance(value, (str, int, float)) or not _HEADER_VALUE.fullmatch(_scalar(value)):
            raise WebConfigError(name, key, "expected one line of text as the value (no control characters)")
        allowed = ALLOWED_HEADERS[header]
        if allowed is not None and _scalar(value) not in allowed:
            raise WebConfigError(name, key, f"expected one of {', '.join(allowed)} (as node_exporter), not {_scalar(value)!r}")
    return {str(k): _scalar(v) for k, v in headers.items()}


def _a_bool(name: str, key: str, value: Any) -> None:
    """A key the toolkit reads as a Go bool: YAML's true/false (yes/no/on/off and y/n too, as
    YAML 1.1 reads them) or nothing; anything else stops node_exporter at start, so it stops us too
    (helper-93: "maybe" and nan were taken). Its value changes nothing here: Python's ssl
    and http.server have no such switch."""
    # Go's yaml.v2 also reads y/Y/n/N as booleans, which PyYAML leaves as text (helper-94)
    if value is not None and not isinstance(value, bool) and value not in ("y", "Y", "n", "N"):
        raise WebConfigError(name, key, f"expected true or false, not {_scalar(value)!r}")


def _scalar(value: Any) -> str:
    """A YAML scalar as the toolkit's Go decoder spells it into a string (true, not True)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _tls(name: str, tls: Any, base: Path) -> tuple[ssl.SSLContext | None, str]:
    if not isinstance(tls, dict):
        raise WebConfigError(name, "tls_server_config", "expected a mapping")
    for key in tls:
        full = f"tls_server_config.{key}"
        if full in NOT_IMPLEMENTED:
            raise WebConfigError(name, full, f"{NOT_IMPLEMENTED[full]} is not supported by envdoctor serve")
        if key not in TLS_KEYS:  # the known ones envdoctor takes: the inline PEM keys are refused below
            supported = sorted(TLS_KEYS - {"cert", "key", "client_ca"})
            raise WebConfigError(name, full, f"unknown key; known: {', '.join(supported)}")
    _a_bool(name, "tls_server_config.prefer_server_cipher_suites", tls.get("prefer_server_cipher_suites"))
    for inline in ("cert", "key", "client_ca"):
        if tls.get(inline):
            raise WebConfigError(name, f"tls_server_config.{inline}", f"inline PEM is not supported; use {inline}_file")
    auth = str(tls.get("client_auth_type") or "")
    if auth in UNVERIFIED_AUTH:
        raise WebConfigError(name, "tls_server_config.client_auth_type",
                             f"{auth} (a client certificate accepted without verification) is not supported; "
                             "use RequireAndVerifyClientCert or VerifyClientCertIfGiven with client_ca_file")
    if auth not in CLIENT_AUTH:
        raise WebConfigError(name, "tls_server_config.client_auth_type",
                             f"invalid ClientAuth {auth!r}; known: {', '.join(k for k in CLIENT_AUTH if k)}")
    enabled = any(tls.get(k) for k in ("cert_file", "key_file", "client_ca_file", "client_auth_type"))
    if not enabled:
        return None, auth or "NoClientCert"  # the toolkit's "no TLS config": plain HTTP
    if not tls.get("cert_file"):
        raise WebConfigError(name, "tls_server_config.cert_file", "missing one of cert or cert_file")
    if not tls.get("key_file"):
        raise WebConfigError(name, "tls_server_config.key_file", "missing one of key or key_file")

    def versions(key: str, default: str) -> ssl.TLSVersion:
        value = str(tls.get(key) or default)
        if value not in TLS_VERSIONS:
            raise WebConfigError(name, f"tls_server_config.{key}", f"unknown TLS version {value!r}; known: {', '.join(TLS_VERSIONS)}")
        return TLS_VERSIONS[value]

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    lowest, highest = versions("min_version", "TLS12"), versions("max_version", "TLS13")
    if lowest > highest:  # every handshake fails, and the daemon started as if all was well (helper-40)
        raise WebConfigError(name, "tls_server_config.min_version",
                             f"{tls.get('min_version')} is above max_version {tls.get('max_version') or 'TLS13'}: "
                             "no client could connect")
    context.minimum_version, context.maximum_version = lowest, highest
    cert, key = base / str(tls["cert_file"]), base / str(tls["key_file"])
    for field_name, path in (("cert_file", cert), ("key_file", key)):
        _regular(name, f"tls_server_config.{field_name}", path)
    try:
        context.load_cert_chain(cert, key, password=_refuse_passphrase)
    except _EncryptedKey:
        raise WebConfigError(name, "tls_server_config.key_file",
                             f"{key} is encrypted: give an unencrypted key (as node_exporter needs; "
                             f"openssl pkey -in {key} -out plain.key), readable by envdoctor only") from None
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(name, "tls_server_config.cert_file",
                             f"failed to load the certificate {cert} with key {key}: {getattr(exc, 'strerror', None) or exc}") from None
    context.verify_mode = CLIENT_AUTH[auth]
    ca = tls.get("client_ca_file")
    if ca:
        if context.verify_mode == ssl.CERT_NONE:
            raise WebConfigError(name, "tls_server_config.client_ca_file",
                                 "client CA's have been configured without a Client Auth Policy (set client_auth_type)")
        _regular(name, "tls_server_config.client_ca_file", base / str(ca))
        try:
            context.load_verify_locations(cafile=str(base / str(ca)))
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(name, "tls_server_config.client_ca_file",
                                 f"cannot load {base / str(ca)}: {getattr(exc, 'strerror', None) or exc}") from None
    elif context.verify_mode != ssl.CERT_NONE:
        context.load_default_certs(ssl.Purpose.CLIENT_AUTH)  # as the toolkit does: the system's roots
    return context, auth or "NoClientCert"


class _EncryptedKey(Exception):
    pass


def _refuse_passphrase() -> bytes:
    """Called by OpenSSL only for an encrypted key. Without it OpenSSL asked for the
    passphrase on the terminal, and a daemon started from one waited there for good."""
    raise _EncryptedKey()


def _regular(name: str, key: str, path: Path) -> None:
    """OpenSSL opens and reads a certificate path as it is: a FIFO there hung the start
    (waiting for a writer), /dev/zero would read forever. Only a regular file is loaded."""
    import stat

    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise WebConfigError(name, key, f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise WebConfigError(name, key, f"{path} is not a regular file")


def describe(config: WebConfig) -> Mapping[str, Any]:
    """For the start-up log line: what is on, never a secret. The keys avoid "auth" and
    "cert", which the log's redaction masks as credential-shaped ("client_auth=***" said nothing)."""
    return {"tls": config.tls is not None, "client_verify": config.client_auth, "web_users": len(config.users)}
