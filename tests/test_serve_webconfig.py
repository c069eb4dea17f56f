"""The web config file means the same to envdoctor serve as to node_exporter.

Unit tests over files written here; then the real comparison: one file (TLS,
mTLS, basic auth) given to Debian's prometheus-node-exporter and to envdoctor,
and curl gets the same answer from both for every client."""

from __future__ import annotations

import subprocess
import time

import bcrypt
import pytest

from envdoctor.serve import webconfig
from helpers import cli
from serve_support import NodeExporter, Serve, curl, make_certs

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


def write(tmp_path, text: str):
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, key", [
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  bogus: 1\n", "tls_server_config.bogus"),
    ("basic_auth_user:\n  a: b\n", "basic_auth_user"),
    ("basic_auth_users:\n  alice: notahash\n", "basic_auth_users.alice"),
    ("http_server_config:\n  http3: true\n", "http_server_config.http3"),
    ("rate_limit:\n  burst: 1\n", "rate_limit"),
    ("tls_server_config:\n  client_auth_type: Sometimes\n  cert_file: a\n  key_file: b\n", "tls_server_config.client_auth_type"),
    ("tls_server_config:\n  key_file: b\n", "tls_server_config.cert_file"),
])
def test_bad_files_name_the_key(tmp_path, text, key):
    with pytest.raises(webconfig.WebConfigError) as info:
        webconfig.load(str(write(tmp_path, text)))
    assert info.value.key == key


@pytest.mark.parametrize("text, line, problem", [
    ("basic_auth_users:\n  alice: [\n", 2, "expected the node content, but found '<stream end>'"),
    ('http_server_config:\n  headers:\n    X: "open\n', 3, "found unexpected end of stream"),
    ("tls_server_config:\n  cert_file: [a, b", 2, "expected ',' or ']'"),  # never a line past the end
])
def test_broken_yaml_names_the_line_and_the_parsers_problem(tmp_path, text, line, problem):
    """It said only "while parsing a flow node": no line, and not what was wrong (helper-18)."""
    path = write(tmp_path, text)
    with pytest.raises(webconfig.WebConfigError) as info:
        webconfig.load(str(path))
    assert str(info.value).startswith(f"{path}:{line}: not valid YAML: {problem}"), str(info.value)


def test_client_ca_without_a_policy_is_refused_like_the_toolkit(tmp_path):
    certs = make_certs(tmp_path)
    path = write(tmp_path, f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: {certs['ca'].name}\n")
    with pytest.raises(webconfig.WebConfigError, match="without a Client Auth Policy"):
        webconfig.load(str(path))


def test_relative_paths_are_relative_to_the_file_and_users_are_checked(tmp_path):
    make_certs(tmp_path)
    path = write(tmp_path, f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS13\n"
                           f"basic_auth_users:\n  alice: '{HASH}'\n")
    config = webconfig.load(str(path))
    assert config.tls is not None and config.tls.minimum_version.name == "TLSv1_3"
    assert config.check_password("alice", "s3cret")
    assert config.check_password("alice", "s3cret")  # the remembered answer
    assert not config.check_password("alice", "wrong")
    assert not config.check_password("mallory", "s3cret")  # checked against the dummy hash, still no


def test_serve_exits_2_naming_the_key(tmp_path):
    path = write(tmp_path, "tls_server_config:\n  cert_file: a\n  key_file: b\n  ciphers: x\n")
    out = cli("serve", "--web.config.file", str(path), timeout=60)
    assert out.returncode == 2
    assert "tls_server_config.ciphers" in out.stderr and "Traceback" not in out.stderr
    # the keys it offers are ones it takes: inline cert/key/client_ca are refused (helper-44)
    known = out.stderr.split("known: ", 1)[1].split(", ")
    assert "cert_file" in known and not {"cert", "key", "client_ca"} & {k.strip() for k in known}, out.stderr


@pytest.mark.real
def test_same_file_same_answers_as_node_exporter(tmp_path):
    certs = make_certs(tmp_path)
    path = write(tmp_path, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                           "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
                           f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    ca = str(certs["ca"])
    client = ["--cert", str(certs["client"]), "--key", str(tmp_path / "client.key")]
    stranger = ["--cert", str(certs["stranger"]), "--key", str(tmp_path / "stranger.key")]
    cases = {
        "plain http": ("http", []),
        "tls, no client cert": ("https", ["--cacert", ca, "-u", "prometheus:s3cret"]),
        "mtls, untrusted client cert": ("https", ["--cacert", ca, *stranger, "-u", "prometheus:s3cret"]),
        "mtls, no password": ("https", ["--cacert", ca, *client]),
        "mtls, wrong password": ("https", ["--cacert", ca, *client, "-u", "prometheus:nope"]),
        "mtls, unknown user": ("https", ["--cacert", ca, *client, "-u", "mallory:s3cret"]),
        "mtls, right password": ("https", ["--cacert", ca, *client, "-u", "prometheus:s3cret"]),
        "server not trusted by the client": ("https", [*client, "-u", "prometheus:s3cret"]),
    }
    node = NodeExporter(f"--web.config.file={path}", "--collector.loadavg")
    serve = None
    try:
        serve = Serve("--web.config.file", str(path), "--interval", "5")
        got = {}
        for name, (scheme, args) in cases.items():
            theirs = curl(f"{scheme}://127.0.0.1:{node.port}/metrics", *args)
            ours = curl(f"{scheme}://127.0.0.1:{serve.port}/metrics", *args)
            ours = "200" if ours == "503" else ours  # 503 = authorised, first run still going
            got[name] = (theirs, ours)
        assert all(theirs == ours for theirs, ours in got.values()), got
        assert got["mtls, right password"] == ("200", "200")
        assert got["mtls, wrong password"][0] == "401" and got["mtls, unknown user"][0] == "401"
        assert got["tls, no client cert"][0] == "fail" and got["plain http"][0] in ("400", "fail")
    finally:
        node.stop()
        if serve is not None:
            assert serve.stop() == 0


def test_the_start_up_line_says_what_is_on_without_masking_it(tmp_path):
    """The log redacts credential-shaped keys; the summary of the web config must not use
    one, or the line reads client_auth=*** and says nothing."""
    from envdoctor import log

    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  alice: '{bcrypt.hashpw(b'pw', bcrypt.gensalt(4)).decode()}'\n")
    line = log.format_line("info", "listening", webconfig.describe(webconfig.load(str(path))))
    assert "***" not in line and "web_users=1" in line and "tls=False" in line, line


BCRYPT_SCRIPT = r"""
import json, sys
from envdoctor.serve import Daemon, Options, webconfig
Daemon(Options(once=True))
plain = "bcrypt" in sys.modules
config = webconfig.load(sys.argv[1])
print(json.dumps({"plain": plain, "made": webconfig._dummy_hash.cache_info().currsize,
                  "unknown": config.check_password("mallory", "s3cret"), "alice": config.check_password("alice", "s3cret")}))
"""


def test_a_daemon_without_users_never_loads_bcrypt_and_one_with_users_is_ready_at_load(tmp_path):
    """The dummy hash an unknown user is checked against cost ~50 ms of CPU at every start,
    and bcrypt stayed resident, with or without basic auth: now both wait for a config with users."""
    import json
    import subprocess
    import sys

    path = write(tmp_path, f"basic_auth_users:\n  alice: '{HASH}'\n")
    out = subprocess.run([sys.executable, "-c", BCRYPT_SCRIPT, str(path)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"plain": False, "made": 1, "unknown": False, "alice": True}


def test_a_web_config_nested_too_deeply_is_refused(tmp_path):
    path = write(tmp_path, "a: " + "[" * 600 + "]" * 600 + "\n")
    with pytest.raises(webconfig.WebConfigError, match="nested too deeply"):
        webconfig.load(str(path))


def test_an_encrypted_key_is_refused_without_asking_for_its_passphrase(tmp_path):
    """OpenSSL asked for the passphrase on the terminal: a daemon started from one waited there."""
    from serve_support import openssl

    openssl("req", "-x509", "-newkey", "rsa:2048", "-days", "2", "-subj", "/CN=localhost", "-passout", "pass:secret",
            "-keyout", "enc.key", "-out", "enc.crt", cwd=tmp_path)
    path = write(tmp_path, "tls_server_config:\n  cert_file: enc.crt\n  key_file: enc.key\n")
    with pytest.raises(webconfig.WebConfigError, match="is encrypted") as info:
        webconfig.load(str(path))
    assert info.value.key == "tls_server_config.key_file"
    out = cli("serve", "--web.listen-address", "127.0.0.1:0", "--web.config.file", str(path), timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "pass phrase" not in out.stderr.lower() and "encrypted" in out.stderr


@pytest.mark.real
@pytest.mark.parametrize("text", [
    "http_server_config:\n  headers:\n    X-Frame-Options: deny\n    Content-Security-Policy: \"default-src 'none'\"\n",
    "http_server_config:\n  headers:\n    Set-Cookie: a=b\n",  # no header but the toolkit's five
    "http_server_config:\n  headers:\n    X-Frame-Options: DENY\n",  # its values, exactly so spelled
    "http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n",
    f"basic_auth_users:\n  a: '{HASH}'\nbasic_auth_users:\n  b: '{HASH}'\n",  # a key given twice
    f"basic_auth_users:\n  a: '{HASH}'\n  a: '{HASH}'\n",
    "http_server_config:\n  http2: maybe\n",  # helper-93: a Go bool's key took anything
    "http_server_config:\n  http2: .nan\n",
    "http_server_config:\n  http2: yes\n",
    "http_server_config:\n  http2: false\n",
    "http_server_config:\n  http2: y\n",  # helper-94: yaml.v2 reads it as true
    'http_server_config:\n  http2: "true"\n',  # a string is no bool to either
    "tls_server_config:\n  prefer_server_cipher_suites: maybe\n",
    "tls_server_config:\n  prefer_server_cipher_suites: true\n",
])
def test_node_exporter_and_envdoctor_start_with_the_same_files(tmp_path, text):
    """The same web config means the same to both, down to what stops them at start:
    envdoctor took any header and kept the last of two tables, where node_exporter refused."""
    import subprocess

    from serve_support import NODE_EXPORTER, need

    path = write(tmp_path, text)
    try:
        subprocess.run([need(NODE_EXPORTER, "prometheus-node-exporter"), "--web.listen-address=127.0.0.1:0",
                        f"--web.config.file={path}"], capture_output=True, timeout=3)
        node_exporter_starts = False  # it exited by itself: refused
    except subprocess.TimeoutExpired:
        node_exporter_starts = True  # still serving after 3 s (killed by run())
    out = cli("serve", "--once", "--web.config.file", str(path), timeout=60)
    assert out.returncode in (0, 2) and "Traceback" not in out.stderr, out.stderr
    assert (out.returncode == 0) is node_exporter_starts, out.stderr


def test_tls_versions_that_leave_no_handshake_are_refused_at_start(tmp_path):
    """Helper-40: min_version TLS13 with max_version TLS12 started with exit 0, and every
    handshake failed without a word in the log."""
    make_certs(tmp_path)
    path = write(tmp_path, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                           "  min_version: TLS13\n  max_version: TLS12\n")
    out = cli("serve", "--web.config.file", str(path), timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "tls_server_config.min_version" in out.stderr and "no client could connect" in out.stderr


def test_a_failed_tls_handshake_is_logged_at_most_every_ten_seconds(tmp_path):
    """Helper-40: a client CA the scraper's certificate does not match failed every scrape,
    and nothing reached the log (node_exporter logs each handshake error)."""
    certs = make_certs(tmp_path)
    path = write(tmp_path, "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                           "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n")
    stranger = ["--cert", str(certs["stranger"]), "--key", str(tmp_path / "stranger.key")]
    serve = Serve("--web.config.file", str(path), "--interval", "5")
    try:
        for _ in range(3):
            assert curl(f"https://127.0.0.1:{serve.port}/metrics", "--cacert", str(certs["ca"]), *stranger) in ("000", "fail")
        line = serve.wait_for("TLS handshake failed", timeout=10)
        assert "level=warn" in line and "client=127.0.0.1" in line, line
        time.sleep(0.5)
        assert sum("TLS handshake failed" in entry for entry in serve.lines) == 1, serve.lines  # not one a scrape
    finally:
        serve.stop()


def test_the_hash_command_a_bad_hash_suggests_makes_one_that_serve_accepts(tmp_path):
    """helper-67: htpasswd (Apache's utilities) is seldom on a GPU node, so the error also
    names a command of envdoctor's own interpreter. It is run here as the message gives it,
    with the password on its standard input (no terminal: a new session has none)."""
    path = write(tmp_path, "basic_auth_users:\n  prometheus: not-a-hash\n")
    with pytest.raises(webconfig.WebConfigError) as caught:
        webconfig.load(str(path))
    command = str(caught.value).split("without apache2-utils: ", 1)[1].removesuffix(")")
    made = subprocess.run(command, shell=True, input="s3cret-pw\n", capture_output=True, text=True,
                          start_new_session=True, timeout=60)
    assert made.returncode == 0, made.stderr
    hashed = made.stdout.strip().splitlines()[-1]
    assert hashed.startswith("$2b$10$"), made.stdout
    config = webconfig.load(str(write(tmp_path, f"basic_auth_users:\n  prometheus: '{hashed}'\n")))
    assert config.check_password("prometheus", "s3cret-pw")
    assert not config.check_password("prometheus", "wrong")
