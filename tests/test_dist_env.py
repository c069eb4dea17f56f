"""dist.env over env dicts: launch variables, master resolution (real: localhost and
an RFC 2606 .invalid name), a real port taken on 127.0.0.1, NCCL/Gloo variables
against fixture network namespaces; property tests for its two parsers."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envdoctor.checks import dist_master_port
from envdoctor.checks.dist_env import CHECK, DistFacts, judge, parse_ifname_spec, parse_net_dev
from envdoctor.context import Roots, Session, Target
from envdoctor.errors import ParseError
from envdoctor.model import Status
from envdoctor.runner import Plan, run_one

FIXTURES = Path(__file__).parent / "fixtures"
NETNS = Roots(procfs=FIXTURES / "netns_eth0_ib0" / "proc", sysfs=FIXTURES / "netns_eth0_ib0" / "sys")
SYSFS_ONLY = Roots(procfs=FIXTURES / "netns_sysfs_only" / "proc", sysfs=FIXTURES / "netns_sysfs_only" / "sys")
DEFAULTS = dict(CHECK.config)


def check(env, roots=NETNS, config=None, target=None):
    session = Session(env_override=env, roots=roots, target=target or Target())
    return run_one(Plan(CHECK, {**DEFAULTS, **(config or {})}, 10), session)


def torchrun_env(**over):
    env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    env.update(over)
    return {k: v for k, v in env.items() if v is not None}


# -- launch variables ---------------------------------------------------------------------------


def test_nothing_set_skips():
    r = check({"PATH": "/usr/bin", "HOME": "/root"})
    assert r.status is Status.SKIP and "not a DDP launch" in r.summary


def test_consistent_launch_is_ok_with_one_line():
    r = check(torchrun_env())
    assert r.status is Status.OK, r.summary
    assert r.summary == "rank 3 of 4 (local 3 of 4); master 127.0.0.1:29500 (127.0.0.1)"
    assert r.facts["world_size"] == 4 and r.facts["rank"] == 3 and r.facts["master_port"] == 29500
    assert r.facts["master_addresses"] == ["127.0.0.1"] and r.facts["master_is_local"] is True


@pytest.mark.parametrize("drop", ["WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"])
def test_a_missing_partner_fails(drop):
    r = check(torchrun_env(**{drop: None}))
    assert r.status is Status.FAIL and f"{drop} is missing" in r.summary
    assert "torchrun" in r.remediation


def test_a_partner_set_but_empty_is_missing_and_not_also_set():
    r = check(torchrun_env(MASTER_ADDR=""))
    assert r.status is Status.FAIL
    assert "MASTER_ADDR is missing (MASTER_ADDR set but empty) while" in r.summary
    assert "MASTER_ADDR" not in r.summary.split(" while ", 1)[1].split(":", 1)[0]  # not listed among the set ones


def test_local_world_size_needs_local_rank():
    r = check(torchrun_env(LOCAL_RANK=None))
    assert r.status is Status.FAIL and "LOCAL_RANK is missing" in r.summary
    # helper-84: the reason is LOCAL_RANK's own, not the four variables env:// needs (all set)
    assert "sets LOCAL_RANK too" in r.summary and "needs MASTER_ADDR" not in r.summary, r.summary


def test_local_rank_alone_is_a_partial_launch():
    r = check({"LOCAL_RANK": "0"})
    assert r.status is Status.FAIL and "WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT are missing" in r.summary


@pytest.mark.parametrize("var, value", [("RANK", "one"), ("WORLD_SIZE", "8.0"), ("LOCAL_RANK", "0x1"), ("MASTER_PORT", "29_500")])
def test_non_integers_fail(var, value):
    r = check(torchrun_env(**{var: value}))
    assert r.status is Status.FAIL and f"{var}={value!r} is not an integer" in r.summary


@pytest.mark.parametrize("over, words", [
    ({"RANK": "4"}, "RANK=4 but WORLD_SIZE=4: ranks run 0-3"),
    ({"LOCAL_RANK": "4"}, "LOCAL_RANK=4 but LOCAL_WORLD_SIZE=4: local ranks run 0-3"),
    ({"LOCAL_WORLD_SIZE": "16", "LOCAL_RANK": "3"}, "LOCAL_WORLD_SIZE=16 exceeds WORLD_SIZE=4"),
    ({"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE=0 is below 1"),
    ({"RANK": "-1"}, "RANK=-1 is below 0"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is outside 1-65535"),
    ({"MASTER_PORT": "0"}, "MASTER_PORT=0 is outside 1-65535"),
])
def test_inconsistent_values_fail(over, words):
    r = check(torchrun_env(**over))
    assert r.status is Status.FAIL and words in r.summary, r.summary


# -- master address and port (real resolver, real sockets) ---------------------------------------


@pytest.mark.real
def test_localhost_resolves():
    r = check(torchrun_env(MASTER_ADDR="localhost", RANK="1"))
    assert r.status is Status.OK, r.summary
    assert r.facts["master_addresses"] and r.facts["master_is_local"] is True


@pytest.mark.real
def test_a_name_that_cannot_resolve_fails_in_bounded_time():
    started = time.monotonic()
    r = check(torchrun_env(MASTER_ADDR="envdoctor-no-such-host.invalid"), config={"resolve_timeout_seconds": 3.0})
    assert time.monotonic() - started < 4
    # .invalid never resolves (RFC 2606); a resolver that cannot even be asked in time gives the timeout warning
    assert r.status in (Status.FAIL, Status.WARN), r.summary
    assert "does not resolve" in r.summary or "did not resolve within" in r.summary
    assert "MASTER_ADDR" in r.remediation


def test_a_resolver_that_hangs_is_bounded(monkeypatch):
    import envdoctor.checks.dist_env as dist_env

    def slow(*args, **kwargs):
        time.sleep(5)
        raise OSError("too late")

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    started = time.monotonic()
    r = check(torchrun_env(MASTER_ADDR="slow.example"), config={"resolve_timeout_seconds": 0.2})
    assert time.monotonic() - started < 1.5
    assert r.status is Status.WARN and "did not resolve within 0.2 s" in r.summary


def check_port(env, target=None):
    session = Session(env_override=env, roots=NETNS, target=target or Target())
    return run_one(Plan(dist_master_port.CHECK, dict(dist_master_port.CHECK.config), 10), session)


@pytest.mark.real
def test_port_taken_on_rank_0_fails_and_suggests_a_free_one():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = check_port(torchrun_env(RANK="0", LOCAL_RANK="0", MASTER_PORT=str(port)))
        assert r.status is Status.FAIL, r.summary  # init_process_group dies with EADDRINUSE
        assert f"MASTER_PORT={port} cannot be bound on this host's addresses (address already in use)" in r.summary
        suggested = int(r.remediation.split("=", 1)[1].split()[0])
        assert r.remediation.startswith("export MASTER_PORT=") and suggested != port
        assert suggested in dist_master_port.SUGGESTED_PORTS  # below the ephemeral range (helper-76)
        # dist.env itself never binds: it stays ok with the port taken
        assert check(torchrun_env(RANK="0", LOCAL_RANK="0", MASTER_PORT=str(port))).status is Status.OK
        # other ranks do not bind the port: the test does not apply to them
        r = check_port(torchrun_env(RANK="1", LOCAL_RANK="1", MASTER_PORT=str(port)))
        assert r.status is Status.SKIP and "only rank 0" in r.summary
        # nor to another process's environment (the running job itself holds it)
        r = check_port(torchrun_env(RANK="0", LOCAL_RANK="0", MASTER_PORT=str(port)), target=Target(pid=1))
        assert r.status is Status.SKIP and "not tried for --pid" in r.summary
    free = check_port(torchrun_env(RANK="0", LOCAL_RANK="0", MASTER_PORT=str(port)))
    assert free.status is Status.OK and "is free" in free.summary


@pytest.mark.real
def test_a_listener_on_another_of_the_hosts_addresses_takes_the_port_too():
    """helper-76: torch's store listens on every address, so a listener on 127.0.0.2 (or any
    other address of the host) makes init_process_group fail with EADDRINUSE; binding on
    MASTER_ADDR=127.0.0.1 alone said the port was free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.2", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = check_port(torchrun_env(RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
        assert r.status is Status.FAIL and "address already in use" in r.summary, r.summary


def test_port_test_is_declared_intrusive_and_runs_only_in_check():
    """Binding MASTER_PORT is intrusive: serve and exec never run it; dist.env runs everywhere."""
    assert dist_master_port.CHECK.intrusive and dist_master_port.CHECK.modes == ("check",)
    assert not dist_master_port.CHECK.runs_in("serve") and not dist_master_port.CHECK.runs_in("exec")
    assert not CHECK.intrusive and all(CHECK.runs_in(m) for m in ("check", "serve", "exec"))


def test_port_test_skips_another_host():
    r = check_port(torchrun_env(RANK="0", MASTER_ADDR="192.0.2.1"))  # TEST-NET-1: never this host
    assert r.status is Status.SKIP and "another host" in r.summary


def test_loopback_master_on_a_multi_node_job_warns():
    assert check(torchrun_env(MASTER_ADDR="127.0.0.1")).status is Status.OK  # one node: fine
    r = check(torchrun_env(MASTER_ADDR="127.0.0.1", WORLD_SIZE="8"))  # 8 ranks, 4 per node: two nodes
    assert r.status is Status.WARN and "loopback address but the job spans nodes" in r.summary
    r = judge(DistFacts(torchrun_env(WORLD_SIZE="16"), master_addresses=("::1",)), DEFAULTS)
    assert r.status is Status.WARN and "loopback" in r.summary


# -- NCCL / Gloo --------------------------------------------------------------------------------


@pytest.mark.parametrize("value, status", [
    ("eth0", Status.OK), ("eth", Status.OK), ("ib", Status.OK), ("=eth0", Status.OK), ("^docker,lo", Status.OK),
    ("^=docker0", Status.OK), ("eth0:29500", Status.OK),
    ("ens", Status.FAIL), ("=eth", Status.FAIL), (" eth0", Status.FAIL), ("^e,i,d,l", Status.FAIL), ("^", Status.FAIL),
])
def test_nccl_socket_ifname_against_the_targets_interfaces(value, status):
    r = check({"NCCL_SOCKET_IFNAME": value})
    assert r.status is status, r.summary
    if status is Status.FAIL:
        assert "selects no interface" in r.summary and "lo, eth0, ib0, docker0" in r.summary
        assert r.remediation == "export NCCL_SOCKET_IFNAME=eth0"
    assert r.facts["interfaces"] == ["lo", "eth0", "ib0", "docker0"]


def test_interfaces_fall_back_to_sysfs():
    r = check({"NCCL_SOCKET_IFNAME": "eth"}, roots=SYSFS_ONLY)
    assert r.status is Status.FAIL and "enp65s0, lo" in r.summary
    assert r.remediation == "export NCCL_SOCKET_IFNAME=enp65s0"


def test_no_interface_list_says_why():
    empty = Roots(procfs=FIXTURES / "does-not-exist", sysfs=FIXTURES / "does-not-exist")
    r = check({"NCCL_SOCKET_IFNAME": "eth0"}, roots=empty)
    assert r.status is Status.OK and "cannot list network interfaces" in r.summary


def test_loopback_only_on_multi_node_warns():
    assert check({**torchrun_env(), "NCCL_SOCKET_IFNAME": "lo"}).status is Status.OK
    r = check({**torchrun_env(WORLD_SIZE="8", MASTER_ADDR="localhost"), "NCCL_SOCKET_IFNAME": "lo"})
    assert r.status is Status.WARN and "only the loopback" in r.summary


def test_gloo_socket_ifname_needs_exact_names():
    assert check({"GLOO_SOCKET_IFNAME": "eth0"}).status is Status.OK
    r = check({"GLOO_SOCKET_IFNAME": "eth"})
    assert r.status is Status.FAIL and "names eth, which the target does not have" in r.summary


@pytest.mark.parametrize("env, words", [
    ({"NCCL_P2P_DISABLE": "1"}, "peer-to-peer"),
    ({"NCCL_IB_DISABLE": "1"}, "InfiniBand"),
    ({"NCCL_DEBUG": "INFO"}, "log volume"),
    ({"NCCL_DEBUG": "trace"}, "log volume"),
])
def test_costly_nccl_settings_warn(env, words):
    r = check(env)
    assert r.status is Status.WARN and words in r.summary
    assert r.remediation.startswith(("unset NCCL_", "export NCCL_DEBUG=WARN"))


@pytest.mark.parametrize("env", [{"NCCL_P2P_DISABLE": "0"}, {"NCCL_IB_DISABLE": "no"}, {"NCCL_DEBUG": "WARN"}])
def test_harmless_nccl_settings_are_ok(env):
    r = check(env)
    assert r.status is Status.OK and r.facts["nccl"] == env


def test_all_findings_listed_worst_first_fix():
    r = check({**torchrun_env(RANK="9"), "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "nope"})
    assert r.status is Status.FAIL and len(r.facts["findings"]) == 3
    assert "torchrun" in r.remediation


# -- parsers --------------------------------------------------------------------------------------


def test_ifname_grammar():
    spec = parse_ifname_spec("^=docker0,lo:1234")
    assert spec.exclude and spec.exact and spec.names == ("docker0", "lo")
    assert spec.selects("eth0") and not spec.selects("docker0") and spec.selects("docker1")
    spec = parse_ifname_spec("eth,ib")
    assert spec.selects("eth12") and spec.selects("ib0") and not spec.selects("lo")
    assert parse_ifname_spec("").selects("anything")
    many = parse_ifname_spec(",".join(f"x{i}" for i in range(20)))
    assert len(many.names) == 16 and many.dropped == ("x16", "x17", "x18", "x19")


def test_net_dev_parser():
    text = (FIXTURES / "netns_eth0_ib0" / "proc" / "self" / "net" / "dev").read_text()
    assert parse_net_dev(text) == ["lo", "eth0", "ib0", "docker0"]
    with pytest.raises(ParseError):
        parse_net_dev("garbage")
    with pytest.raises(ParseError):
        parse_net_dev("Inter-|\n face |\nno colon here\n")


@given(st.text(max_size=200))
@settings(max_examples=300, deadline=None)
def test_net_dev_parser_any_text(text):
    try:
        names = parse_net_dev(text)
    except ParseError:
        return
    assert all(n and not any(c.isspace() for c in n) and ":" not in n for n in names)


@given(st.text(max_size=60), st.lists(st.text(min_size=1, max_size=10), max_size=5))
@settings(max_examples=300, deadline=None)
def test_ifname_parser_any_text(text, interfaces):
    spec = parse_ifname_spec(text)
    assert len(spec.names) <= 16 and all(n and ":" not in n for n in spec.names)
    for interface in interfaces:
        assert isinstance(spec.selects(interface), bool)
    assert parse_ifname_spec("^" + text.lstrip("^")).exclude


@given(st.one_of(st.none(), st.integers(), st.binary()))
def test_parsers_reject_non_text(value):
    with pytest.raises(ParseError):
        parse_net_dev(value)
    with pytest.raises(ParseError):
        parse_ifname_spec(value)


def test_every_finding_brings_its_own_fix():
    """Two problems, two fixes: a user who fixed only the first would meet the second next run."""
    r = check(torchrun_env(MASTER_ADDR="no-such-host.invalid", NCCL_SOCKET_IFNAME="ib9"),
              config={"resolve_timeout_seconds": 5.0})
    assert r.status is Status.FAIL
    assert "does not resolve" in r.summary and "NCCL_SOCKET_IFNAME" in r.summary
    assert "MASTER_ADDR" in r.remediation and "NCCL_SOCKET_IFNAME" in r.remediation


# -- what torch itself does with a MASTER_ADDR or MASTER_PORT (helper-92) ------------------------

_INIT = ("import datetime, torch.distributed as d\n"
         "d.init_process_group('gloo', timeout=datetime.timedelta(seconds=4))\n"
         "print('joined', d.get_world_size())\n")


def _torch_init(env: dict[str, str]):
    import os
    import subprocess
    import sys

    pytest.importorskip("torch.distributed", reason="needs torch (scripts/test.sh installs torch==2.13.0)")
    clean = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    return subprocess.run([sys.executable, "-c", _INIT], env={**clean, **env}, capture_output=True, text=True, timeout=120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("addr", ["127.0.0.1 ", " localhost"])
def test_a_master_addr_with_blanks_fails_as_torch_fails(addr):
    """Helper-92: the check stripped the blanks and said ok; torch resolves them as part of
    the name and the rendezvous times out. The fix strips them, and exec --fix can apply it."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": addr, "MASTER_PORT": str(_free_port())}
    r = check(env)
    assert r.status is Status.FAIL and "has blanks around the address" in r.summary, r.summary
    assert r.fix_env == {"MASTER_ADDR": addr.strip()}
    truth = _torch_init(env)
    assert truth.returncode != 0 and "joined" not in truth.stdout, truth.stdout
    fixed = _torch_init({**env, "MASTER_ADDR": addr.strip()})
    assert fixed.returncode == 0 and "joined 1" in fixed.stdout, fixed.stderr[-500:]


def test_master_port_0_is_fine_for_a_world_of_one_and_fails_beyond():
    """Helper-92: a world of one binds a free port for its store, and gloo's init works;
    with more ranks, nobody can find that port."""
    alone = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"}
    r = check(alone)
    assert r.status is Status.OK, r.summary
    truth = _torch_init(alone)
    assert truth.returncode == 0 and "joined 1" in truth.stdout, truth.stderr[-500:]
    r = check({**alone, "WORLD_SIZE": "2"})
    assert r.status is Status.FAIL and "MASTER_PORT=0 is outside 1-65535" in r.summary, r.summary
