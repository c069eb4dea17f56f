"""deploy/systemd: the unit passes `systemd-analyze verify` with nothing to say, scores
as well hardened offline, and grants exactly the two capabilities serve needs."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent.parent / "deploy/systemd/envdoctor.service"
INSTALLED_AT = "/usr/local/bin/envdoctor"


def _systemd_analyze():
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed (Debian package 'systemd'; scripts/test.sh installs it)")
    return tool


def _unit_here(tmp_path):
    """The unit as shipped, its binary path pointed at this checkout's envdoctor
    (verify insists the ExecStart binary exists); nothing else changes."""
    envdoctor = Path(sys.executable).with_name("envdoctor")
    if not envdoctor.exists():
        pytest.skip("envdoctor console script not installed beside this interpreter")
    text = UNIT.read_text()
    assert text.count(INSTALLED_AT) == 1
    unit = tmp_path / "envdoctor.service"
    unit.write_text(text.replace(INSTALLED_AT, str(envdoctor)))
    return unit


def _service():
    parser = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#",))
    parser.optionxform = str
    parser.read_string(UNIT.read_text())
    return parser["Service"]


def test_systemd_analyze_verify_is_clean(tmp_path):
    proc = subprocess.run([_systemd_analyze(), "verify", str(_unit_here(tmp_path))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stdout + proc.stderr


def test_offline_security_exposure_is_ok(tmp_path):
    proc = subprocess.run([_systemd_analyze(), "security", "--offline=yes", "--no-pager", str(_unit_here(tmp_path))],
                          capture_output=True, text=True, timeout=120)
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", proc.stdout)
    assert match, proc.stdout + proc.stderr
    assert float(match.group(1)) <= 3.0, match.group(0)


def test_unprivileged_with_exactly_the_two_capabilities():
    service = _service()
    two = {"CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"}
    assert set(service["AmbientCapabilities"].split()) == two
    assert set(service["CapabilityBoundingSet"].split()) == two
    assert service["DynamicUser"] == "yes" and service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert "ProtectProc" not in service and "PrivateDevices" not in service  # other users' jobs; /dev/nvidia*


@pytest.mark.real
def test_the_units_command_line_runs_the_real_serve_to_a_healthy_healthz():
    import shlex

    import fleet

    argv = shlex.split(_service()["ExecStart"])
    assert argv[:2] == [INSTALLED_AT, "serve"]
    code, body, log = fleet.serve_answers_healthz(argv[2:])
    assert body.startswith("ok"), log
    assert code == 0, log


def test_reload_sends_sighup_to_the_daemon_and_the_config_is_optional_in_etc():
    """helper-112: README says SIGHUP re-reads the config, but the unit had no ExecReload
    (`systemctl reload` failed), and no word of where its config lives (its working
    directory was /, where serve looked for /envdoctor.toml)."""
    service = _service()
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["WorkingDirectory"] == "-/etc/envdoctor"  # "-": a node without a config starts


@pytest.mark.real
def test_the_units_config_place_and_reload_work_for_the_real_serve(tmp_path):
    """The unit's command line, started where the unit starts it (its WorkingDirectory,
    here a stand-in for /etc/envdoctor), reads envdoctor.toml there; the unit's reload
    (kill -HUP $MAINPID, run as written) makes it read the file again."""
    import shlex

    from serve_support import Serve

    (tmp_path / "envdoctor.toml").write_text("[serve]\ninterval = 7\n")
    argv = shlex.split(_service()["ExecStart"])
    assert argv[:2] == [INSTALLED_AT, "serve"]
    args = [a for a in argv[2:] if not a.startswith("--web.listen-address")]
    s = Serve(*args, cwd=tmp_path)
    try:
        assert "interval=7.0" in s.wait_for("listening")
        (tmp_path / "envdoctor.toml").write_text("[serve]\ninterval = 9\n")
        reload = shlex.split(_service()["ExecReload"].replace("$MAINPID", str(s.proc.pid)))
        assert subprocess.run(reload, timeout=30).returncode == 0
        assert "interval=9.0" in s.wait_for("config reloaded", timeout=30)
    finally:
        assert s.stop() == 0
