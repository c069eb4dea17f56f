"""The daemon end to end on the loopback: endpoints, lint, lifecycle, reload, bad starts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jsonschema
import pytest

from envdoctor.serve import httpd
from envdoctor.serve.snapshot import Snapshot, empty
from helpers import cli
from serve_support import Serve, get, wait_until


@pytest.fixture
def serve():
    started = Serve("--interval", "1")
    yield started
    started.stop()


def first_run(s: Serve) -> bytes:
    return wait_until(lambda: (lambda r: r[1] if r[0] == 200 else None)(get(s.url + "/metrics")), timeout=60)


def test_endpoints(serve):
    body = first_run(serve)
    assert b'envdoctor_check_status{check="shm.size",status="ok",target="node"}' in body or b'check="shm.size"' in body
    assert b"envdoctor_target_info{" in body and b"envdoctor_build_info{" in body
    code, report, headers = get(serve.url + "/report")
    assert code == 200 and headers["Content-Type"] == "application/json"
    data = json.loads(report)
    from importlib.resources import files
    jsonschema.validate(data, json.loads(files("envdoctor").joinpath("schema/report-v1.json").read_text()))
    assert {r["target"] for r in data["results"]} >= {"node"}
    code, text, _ = get(serve.url + "/healthz")
    assert code == 200 and text.startswith(b"ok: last run completed")
    code, index, _ = get(serve.url + "/")
    assert code == 200 and b'href="metrics"' in index
    assert get(serve.url + "/nothing")[0] == 404
    for method in ("POST", "OPTIONS", "TRACE", "FOO"):  # http.server said 501 to all but POST/PUT/DELETE/PATCH
        out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %header{allow}", "-X", method,
                              serve.url + "/metrics"], capture_output=True, text=True, timeout=30)
        assert out.stdout == "405 GET, HEAD", (method, out.stdout)
    _, _, headers = get(serve.url + "/")
    assert headers["Server"] == f"envdoctor/{httpd.__version__}"  # no trailing space


def test_gzip_for_scrapers_that_ask(serve):
    import gzip
    import urllib.request

    plain = first_run(serve)
    request = urllib.request.Request(serve.url + "/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=10) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        body = gzip.decompress(r.read())
    assert body.startswith(b"# HELP envdoctor_") and b"envdoctor_target_info" in body and len(body) > 0
    assert plain.split(b"\n")[0] == body.split(b"\n")[0]


def test_metrics_lint_clean(serve):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    body = first_run(serve)
    out = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_scrape_is_a_copy_of_the_last_run(serve):
    """Two scrapes between runs are byte-identical: nothing is re-rendered per request."""
    first_run(serve)
    serve.wait_for("listening")
    for _ in range(20):
        a, b = get(serve.url + "/metrics")[1], get(serve.url + "/metrics")[1]
        if a == b:
            break
    assert a == b


@pytest.mark.parametrize("how", ["taken", "not on this host"])
def test_an_address_it_cannot_take_now_is_one_line_and_exit_75_so_a_supervisor_retries(how):
    """A port another process holds (a predecessor still stopping) or an address not up yet
    at boot: a later start may succeed, so not 2, which the systemd unit's
    RestartPreventExitStatus=2 would hold for good (helper-64)."""
    import socket

    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        address = f"127.0.0.1:{holder.getsockname()[1]}" if how == "taken" else "192.0.2.1:10061"  # TEST-NET-1
        out = cli("serve", "--web.listen-address", address, timeout=60)
    finally:
        holder.close()
    assert out.returncode == 75, (out.returncode, out.stderr)
    [line] = out.stderr.splitlines()
    assert line.startswith(f"envdoctor: cannot listen on {address}: ") and line.endswith("exit 75 so that a supervisor tries again")
    assert "Traceback" not in out.stderr


def test_the_daemon_says_why_it_cannot_listen_with_the_code_for_it(tmp_path):
    """The same through Daemon itself (the typer command's path), and 2 for what a retry
    cannot mend: an address that is not one."""
    import socket

    from envdoctor.serve import EXIT_TEMPFAIL, Daemon, Options, StartError

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        with pytest.raises(StartError) as taken:
            Daemon(Options(listen_address=f"127.0.0.1:{holder.getsockname()[1]}", config_file=None))
    finally:
        holder.close()
    assert taken.value.code == EXIT_TEMPFAIL == 75 and "Address already in use" in str(taken.value)
    with pytest.raises(StartError) as garbage:
        Daemon(Options(listen_address="no-such-host.invalid:x", config_file=None))
    assert garbage.value.code == 2
    # an IP with an octet over 255 is a name to the resolver: said so, not only "Name or service not known" (helper-116)
    with pytest.raises(StartError) as not_an_ip:
        Daemon(Options(listen_address="256.1.1.1:10061", config_file=None))
    assert not_an_ip.value.code == 2
    assert "256.1.1.1 is not an IP address of this host, nor a name that resolves to one (" in str(not_an_ip.value)


def test_sigterm_and_sigint_stop_within_a_second():
    for sig in (signal.SIGTERM, signal.SIGINT):
        s = Serve("--interval", "1")
        first_run(s)
        t0 = time.monotonic()
        assert s.stop(sig) == 0
        assert time.monotonic() - t0 < 1.5  # a second, plus process teardown on a loaded runner
        assert any("stopping" in line for line in s.lines)


def test_a_stop_signal_the_invoker_ignores_stays_ignored():
    """`nohup`, `trap '' INT TERM`, a script's `serve &` (SIGINT ignored): the daemon put
    its own handler over the ignore and stopped (helper-36)."""
    s = Serve("--interval", "1", command=["bash", "-c", 'trap "" INT TERM; exec "$@"', "bash",
                                          sys.executable, "-m", "envdoctor"])
    try:
        first_run(s)
        for sig in (signal.SIGTERM, signal.SIGINT):
            s.proc.send_signal(sig)
        time.sleep(1.5)
        assert s.proc.poll() is None and not any("stopping" in line for line in s.lines)
    finally:
        s.proc.kill()
        s.proc.wait(timeout=30)


def test_sighup_reloads_and_keeps_the_old_config_when_bad(tmp_path):
    cfg = tmp_path / "envdoctor.toml"
    cfg.write_text("[serve]\ninterval = 1\nmax_targets = 1\n")
    s = Serve("--config", str(cfg))
    try:
        first_run(s)
        cfg.write_text("[serve]\ninterval = 1\nmax_targets = 5\n")
        s.proc.send_signal(signal.SIGHUP)
        line = s.wait_for("config reloaded")
        assert "max_targets=5" in line
        cfg.write_text("[serve]\ninterval = 1\nmax_target = 5\n")
        s.proc.send_signal(signal.SIGHUP)
        line = s.wait_for("config reload failed")
        assert "serve.max_target" in line and "level=error" in line
        time.sleep(1.5)
        assert s.proc.poll() is None and get(s.url + "/healthz")[0] == 200
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("args, text", [
    (["--interval", "0.1"], "--interval"),
    (["--web.listen-address", "nonsense"], "HOST:PORT"),
    (["--web.listen-address", "\udcff:10061"], "no host name or address"),  # undecodable bytes: a TypeError once
    (["--web.listen-address", "127.0.0.1:99999"], "port 99999 in '127.0.0.1:99999' is out of range (0 to 65535)"),
    (["--interval", "1e10"], "--interval"),
    (["--textfile", "/tmp/x.txt"], "*.prom"),
    (["--path.procfs", "/nonexistent"], "--path.procfs"),
])
def test_bad_usage_exits_2(args, text):
    out = cli("serve", *args, timeout=60)
    assert out.returncode == 2 and text in out.stderr and "Traceback" not in out.stderr


def test_bad_serve_table_exits_2_naming_file_line_and_key(tmp_path):
    cfg = tmp_path / "envdoctor.toml"
    cfg.write_text("fail_on = \"warn\"\n[serve]\nmax_targets = 0\n")
    out = cli("serve", "--config", str(cfg), "--once", timeout=60)
    assert out.returncode == 2 and "serve.max_targets" in out.stderr and ":3" in out.stderr
    # a relative --config is named as given, as check names it (helper-69)
    for command in (["serve", "--once"], ["serve"], ["check"]):
        out = cli(*command, "--config", "envdoctor.toml", cwd=tmp_path, timeout=60)
        assert out.returncode == 2 and "bad config: envdoctor.toml:3: serve.max_targets" in out.stderr, (command, out.stderr)


def test_healthz_tells_the_truth():
    health = httpd.Health(lambda: 10.0, lambda: ["gpu.health:node for 40 s"])
    assert httpd.healthz(empty(), health)[0] == 503
    fresh = Snapshot(b"x", b"", b"{}", completed_at=1.0, completed_monotonic=100.0, run_seconds=0.1)
    assert httpd.healthz(fresh, health, now=125.0)[0] == 200
    code, text = httpd.healthz(fresh, health, now=131.0)
    assert code == 503 and "gpu.health:node" in text and "three intervals" in text
    # runs that fail at once are not "slow" (helper-78: an announcement broke every run)
    failing = httpd.Health(lambda: 10.0, lambda: [], lambda: "RecursionError: maximum recursion depth exceeded")
    code, text = httpd.healthz(fresh, failing, now=131.0)
    assert code == 503 and "the runs fail: RecursionError" in text and "slow" not in text, text
    code, text = httpd.healthz(fresh, httpd.Health(lambda: 10.0, lambda: []), now=131.0)
    assert code == 503 and "the run is slow" in text, text
    # right after start the first run is not called slow (helper-116)
    code, text = httpd.healthz(empty(), httpd.Health(lambda: 10.0, lambda: []), now=131.0)
    assert code == 503 and "no run has completed yet; the first run is still going" in text and "slow" not in text, text


def test_daemon_rewrites_the_textfile_every_run(tmp_path):
    target = tmp_path / "envdoctor.prom"
    s = Serve("--interval", "1", "--textfile", str(target))
    try:
        def runs() -> float:
            try:
                text = target.read_text()
            except FileNotFoundError:
                return 0.0
            return next((float(l.split()[1]) for l in text.splitlines() if l.startswith("envdoctor_runs_total ")), 0.0)

        assert wait_until(lambda: runs() >= 2, timeout=60)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["envdoctor.prom"]  # no temporary files left behind
        assert get(s.url + "/metrics")[0] == 200  # and it still serves
    finally:
        assert s.stop() == 0


def test_once_that_cannot_write_the_textfile_says_so_and_exits_74(tmp_path):
    (tmp_path / "taken.prom").mkdir()  # a directory where the file should go: never replaced
    out = cli("serve", "--once", "--textfile", str(tmp_path / "taken.prom"), timeout=120)
    assert out.returncode == 74 and "textfile not written" in out.stderr and "Traceback" not in out.stderr
    assert (tmp_path / "taken.prom").is_dir()
    last = out.stderr.strip().splitlines()[-1]  # it ended on "one run complete" at level=info (helper-18)
    assert "level=error" in last and "the textfile was not written" in last, last


def test_once_makes_a_new_textfile_readable_and_keeps_an_existing_ones_mode(tmp_path):
    """A new textfile is 0644, for node_exporter's user; an existing one was reset to 0644
    too, a private 0600 file made world-readable (helper-32)."""
    new, private = tmp_path / "new.prom", tmp_path / "private.prom"
    private.write_text("")
    private.chmod(0o600)
    for path in (new, private):
        assert cli("serve", "--once", "--textfile", str(path), timeout=120).returncode == 0
        assert "envdoctor_build_info" in path.read_text()
    assert (new.stat().st_mode & 0o777, private.stat().st_mode & 0o777) == (0o644, 0o600)


@pytest.mark.parametrize("link", ["/dev/stdout", "/proc/self/fd/1"])
def test_once_with_a_textfile_linked_to_stdout_writes_the_metrics_on_stdout(tmp_path, link):
    """helper-112: the run wrote the textfile while plug-ins' prints were pointed at stderr
    (descriptor 1 was stderr's), so a link to /dev/stdout put the exposition on stderr, or
    was refused as a FIFO (exit 74) when stderr was a pipe and stdout a file."""
    path = tmp_path / "out.prom"
    path.symlink_to(link)
    with open(tmp_path / "stdout.txt", "wb") as stdout:
        proc = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--once", "--textfile", str(path)],
                              stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    written = (tmp_path / "stdout.txt").read_text()
    assert "# TYPE envdoctor_check_status gauge" in written and "envdoctor_build_info{" in written
    assert "envdoctor_check_status" not in proc.stderr and "one run complete" in proc.stderr


@pytest.mark.parametrize("header, gzip", [("gzip", True), ("gzip, deflate", True), ("deflate, gzip;q=0.5", True),
                                          ("gzip;q=0", False), ("*", True), ("*, gzip;q=0", False),
                                          ("identity", False), ("", False), ("gzip;q=abc", False)])
def test_gzip_only_where_the_client_accepts_it(header, gzip):
    from envdoctor.serve.httpd import accepts_gzip

    assert accepts_gzip(header) is gzip


def test_a_port_alone_listens_on_every_address_ipv6_and_ipv4():
    """':PORT' is every address, as node_exporter's: IPv4 only left [::1] unanswered."""
    import socket

    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("this host has no IPv6 loopback")
    s = Serve("--web.listen-address", ":0", "--interval", "60")
    try:
        assert 'address="[::]:' in s.wait_for("listening")
        assert get(f"http://127.0.0.1:{s.port}/")[0] == 200
        assert get(f"http://[::1]:{s.port}/")[0] == 200
    finally:
        assert s.stop() == 0


def test_once_without_a_textfile_prints_what_metrics_would_answer():
    """It did a run and printed nothing (helper-18)."""
    out = cli("serve", "--once", timeout=120)
    assert out.returncode == 0, out.stderr
    assert "# TYPE envdoctor_check_status gauge" in out.stdout
    assert 'envdoctor_check_status{check="shm.size",status="ok",target="node"}' in out.stdout


@pytest.mark.parametrize("stdout", ["/dev/full", "closed"])
def test_once_into_a_stdout_that_takes_nothing_is_74_and_one_line(stdout):
    import subprocess
    import sys

    kw = {"stdout": open("/dev/full", "wb")} if stdout == "/dev/full" else {"preexec_fn": lambda: os.close(1)}
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "serve", "--once"], stderr=subprocess.PIPE, text=True,
                          timeout=120, **kw)
    assert proc.returncode == 74 and "Traceback" not in proc.stderr, proc.stderr
    assert "metrics not written to standard output" in proc.stderr.strip().splitlines()[-1]
