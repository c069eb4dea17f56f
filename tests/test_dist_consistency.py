"""dist.consistency's judge over gathered facts, its GPU resolution against fake NVML
devices, what leaves a rank, when it skips; and dist.env under torchrun's agent store
(a real listener on a real port). The launches themselves are in test_real_torchrun.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from envdoctor import nvml as nvml_facade
from envdoctor import rendezvous
from envdoctor.errors import Unavailable
from envdoctor.checks import dist_consistency as dc
from envdoctor.checks import dist_env
from envdoctor.checks import dist_master_port
from envdoctor.context import Session, Target
from envdoctor.model import Status
from envdoctor.runner import Plan, run_one
from fake_pynvml import FakeDevice, FakeNvml

SETTINGS = dict(dc.CHECK.config)
BASE = {"world_size": 4, "store": "torchrun's agent store", "master": "10.0.0.1:29500", "waited_seconds": 5.0}


def rank_facts(rank: int, host: str = "node1", lws: int = 2, **over):
    facts = {"rank": rank, "world_size": 4, "local_rank": rank % lws, "local_world_size": lws, "host": host,
             "env": {"WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "NCCL_DEBUG": "WARN"},
             "torch_version": "2.13.0+cu128", "cuda_version": "12.8", "hip_version": None, "cudnn_version": 91002,
             "nccl_version": "2.27.5", "driver_version": "570.86.15", "gpu": {"uuid": f"GPU-{host}-{rank % lws}"}}
    facts.update(over)
    return facts


def four_ranks(per_rank=None):
    """Ranks 0-1 on node1, 2-3 on node2 (as torchrun numbers them); per_rank={3: {...}} overrides."""
    ranks = {r: rank_facts(r, "node1" if r < 2 else "node2") for r in range(4)}
    for r, over in (per_rank or {}).items():
        ranks[r].update(over)
    return ranks


def compare(ranks, claims=None, **settings):
    return dc.compare(ranks, claims or {r: 1 for r in ranks}, BASE, {**SETTINGS, **settings})


# -- the judgement ------------------------------------------------------------------------------


def test_agreeing_ranks_are_ok_and_say_what_was_compared():
    r = compare(four_ranks())
    assert r.status is Status.OK, r.summary
    assert r.summary.startswith("4 ranks on 2 hosts agree: torch 2.13.0+cu128, CUDA 12.8, cuDNN 91002, NCCL 2.27.5, "
                                "driver 570.86.15; 4 variables equal")
    assert "4 GPUs, one per rank" in r.summary
    assert r.facts["hosts"] == {"node1": [0, 1], "node2": [2, 3]}


def test_one_rank_with_another_nccl_value_fails_naming_rank_variable_and_values():
    ranks = four_ranks({3: {"env": {**rank_facts(3)["env"], "NCCL_P2P_DISABLE": "1"}}})
    r = compare(ranks)
    assert r.status is Status.FAIL
    assert "NCCL_P2P_DISABLE differs: unset on ranks 0-2 on node1, node2; '1' on rank 3 on node2" in r.summary
    assert r.remediation == "unset NCCL_P2P_DISABLE on every rank"


def test_a_differing_value_gets_the_majority_as_fix_and_fix_env():
    ranks = four_ranks({1: {"env": {**rank_facts(1)["env"], "NCCL_DEBUG": "INFO"}}})
    r = compare(ranks)
    assert r.status is Status.FAIL and "NCCL_DEBUG differs: 'WARN' on ranks 0, 2-3" in r.summary
    assert "'INFO' on rank 1 on node1" in r.summary
    assert r.remediation == "export NCCL_DEBUG=WARN on every rank" and r.fix_env == {"NCCL_DEBUG": "WARN"}


def test_a_tie_between_as_many_ranks_on_each_side_says_whose_value_the_fix_takes():
    """Helper-90: two ranks, one value each: --fix took rank 0's without saying it broke a tie."""
    ranks = four_ranks({r: {"env": {**rank_facts(r)["env"], "NCCL_DEBUG": "INFO"}} for r in (2, 3)})
    r = compare(ranks)
    assert r.remediation == ("export NCCL_DEBUG=WARN on every rank (no majority: the value of rank 0, the lowest "
                             "rank of the sides that tie)"), r.remediation
    assert r.fix_env == {"NCCL_DEBUG": "WARN"}
    # helper-95: an unset side has no value, and a version tie was silent
    ranks = four_ranks({r: {"env": {**rank_facts(r)["env"], "NCCL_ALGO": "Ring"}} for r in (2, 3)})
    assert compare(ranks).remediation.endswith("on every rank (no majority: as it is on rank 0, the lowest rank of the "
                                               "sides that tie)")
    ranks = four_ranks({r: {"torch_version": "2.12.0+cu126"} for r in (2, 3)})
    assert compare(ranks).remediation.endswith("(no majority: the value of rank 0, the lowest rank of the sides that tie)")


@pytest.mark.parametrize("key,value,text", [
    ("torch_version", "2.12.0+cu126", "torch differs: 2.13.0+cu128 on ranks 0-2"),
    ("nccl_version", "2.21.5", "NCCL differs: 2.27.5 on ranks 0-2"),
    ("driver_version", "535.104.05", "NVIDIA driver differs: 570.86.15 on ranks 0-2"),
    ("cudnn_version", None, "cuDNN differs: 91002 on ranks 0-2 on node1, node2; none on rank 3"),
])
def test_a_version_that_differs_fails(key, value, text):
    r = compare(four_ranks({3: {key: value}}))
    assert r.status is Status.FAIL and text in r.summary, r.summary


def test_a_per_node_interface_name_may_differ_between_nodes_but_not_within_one():
    ranks = four_ranks()
    for rank, name in ((0, "eth0"), (1, "eth0"), (2, "ens5"), (3, "ens5")):
        ranks[rank]["env"] = {**ranks[rank]["env"], "NCCL_SOCKET_IFNAME": name}
    assert compare(ranks).status is Status.OK
    ranks[3]["env"]["NCCL_SOCKET_IFNAME"] = "eth0"
    r = compare(ranks)
    assert r.status is Status.FAIL and "NCCL_SOCKET_IFNAME differs: 'ens5' on rank 2 on node2; 'eth0' on rank 3" in r.summary
    # and with the list emptied, it must match everywhere
    assert "NCCL_SOCKET_IFNAME differs" in compare(four_ranks({2: {"env": {**ranks[2]["env"]}}}),
                                                   may_differ_across_nodes=[]).summary


def test_two_local_ranks_on_one_gpu_fail():
    ranks = four_ranks({1: {"gpu": {"uuid": "GPU-node1-0"}, "env": {**rank_facts(1)["env"], "CUDA_VISIBLE_DEVICES": "0"}}})
    r = compare(ranks)
    assert r.status is Status.FAIL
    assert "ranks 0-1 on node1 use one GPU, GPU-node1-0" in r.summary
    assert "rank 1 with LOCAL_RANK=1 and CUDA_VISIBLE_DEVICES '0'" in r.summary
    assert "cuda:LOCAL_RANK" in r.remediation


def test_gpus_are_compared_for_gpu_builds_of_torch_only_unless_told():
    cpu = {"cuda_version": None, "torch_version": "2.13.0+cpu"}
    ranks = four_ranks({r: {**cpu, "gpu": {"uuid": "GPU-node1-0"}} for r in range(2)})
    ranks = {r: ranks[r] for r in (0, 1)}
    base = {**BASE, "world_size": 2}
    r = dc.compare(ranks, {}, base, SETTINGS)  # gloo ranks of a CPU torch on a GPU host share nothing
    assert r.status is Status.OK, r.summary
    assert "GPUs not compared (torch 2.13.0+cpu on ranks 0-1 is a CPU build, which uses no GPU)" in r.summary
    r = dc.compare(ranks, {}, base, {**SETTINGS, "compare_gpus": "always"})
    assert r.status is Status.FAIL and "ranks 0-1 on node1 use one GPU, GPU-node1-0" in r.summary
    r = dc.compare(four_ranks({1: {"gpu": {"uuid": "GPU-node1-0"}}}), {}, BASE, {**SETTINGS, "compare_gpus": "never"})
    assert r.status is Status.OK and "GPUs not compared (compare_gpus = never)" in r.summary
    r = dc.compare(four_ranks(), {}, BASE, {**SETTINGS, "compare_gpus": "sometimes"})
    assert r.status is Status.ERROR and "compare_gpus = 'sometimes': expected auto, always or never" in r.summary
    # helper-114: `always` with no GPU resolved said "GPUs not compared ()"; the ranks' own reason now
    no_nvml = {"uuid": None, "reason": "no NVML: libnvidia-ml.so.1 not found"}
    r = dc.compare({r: {**f, "gpu": no_nvml} for r, f in ranks.items()}, {}, base, {**SETTINGS, "compare_gpus": "always"})
    assert r.status is Status.OK and "GPUs not compared (no NVML: libnvidia-ml.so.1 not found)" in r.summary, r.summary


def test_a_missing_rank_is_named_with_its_expected_host():
    ranks = four_ranks()
    del ranks[3]
    r = compare(ranks)
    assert r.status is Status.FAIL
    assert "1 of 4 ranks did not arrive within 5 s: rank 3 (expected on node2)" in r.summary
    assert "10.0.0.1:29500" in r.summary and "wait_seconds" in r.remediation
    ranks = four_ranks()
    del ranks[2], ranks[3]
    r = compare(ranks)
    assert "rank 2 (expected on node 1, from which no rank arrived), rank 3 (expected on node 1" in r.summary
    # a host short of ranks is not also blamed while ranks are missing: the missing ones explain it
    assert "LOCAL_WORLD_SIZE" not in r.summary


def test_layout_duplicates_sizes_and_counts():
    r = compare(four_ranks({1: {"local_rank": 0}}))
    assert r.status is Status.FAIL and "node1: ranks 0-1 all have LOCAL_RANK=0" in r.summary
    r = compare(four_ranks({3: {"local_world_size": 4}}))
    assert "node2: LOCAL_WORLD_SIZE differs: 2 on rank 2; 4 on rank 3" in r.summary
    r = compare(four_ranks({2: {"host": "node1", "local_rank": 0}, 3: {"host": "node1", "local_rank": 1}}))
    assert "node1 runs 4 ranks (ranks 0-3) but LOCAL_WORLD_SIZE=2 (or two nodes share one host name)" in r.summary


def test_one_rank_claimed_twice_fails():
    r = compare(four_ranks(), claims={0: 1, 1: 2, 2: 1, 3: 1})
    assert r.status is Status.FAIL and "RANK=1 by 2 processes" in r.summary


def test_many_differences_are_all_reported_with_every_fix():
    ranks = four_ranks({2: {"torch_version": "2.12.0"}, 3: {"env": {**rank_facts(3)["env"], "NCCL_ALGO": "Ring"}}})
    r = compare(ranks)
    assert "torch differs" in r.summary and "NCCL_ALGO differs" in r.summary
    assert "pip install 'torch==2.13.0+cu128'" in r.remediation and "unset NCCL_ALGO" in r.remediation


def test_a_follower_reports_rank_0s_verdict_and_its_absence():
    verdict = {"status": "fail", "summary": "NCCL_ALGO differs: ...", "remediation": "unset NCCL_ALGO on every rank",
               "fix_env": {}, "facts": {"world_size": 2}}
    r = dc.judge({"role": "follower", "rank": 1, "verdict": verdict, "master": "h:1"}, SETTINGS)
    assert (r.status, r.summary, r.remediation) == (Status.FAIL, verdict["summary"], verdict["remediation"])
    assert r.facts["verdict_from"] == 0
    r = dc.judge({"role": "follower", "rank": 1, "verdict": None, "waited_seconds": 12.5, "master": "h:1"}, SETTINGS)
    assert r.status is Status.FAIL and "rank 1 heard no verdict from rank 0 (on h:1) within 12.5 s" in r.summary
    # under exec, --timeout is the bound a late rank misses, not wait_seconds alone (helper-121)
    assert "under envdoctor exec after its --timeout" in r.summary and "give every rank a --timeout" in r.remediation
    r = dc.judge({"role": "unreachable", "rank": 2, "reason": "could not reach the store at h:1 within 3 s: timeout",
                  "master": "h:1"}, SETTINGS)
    assert r.status is Status.FAIL and r.summary.startswith("rank 2 could not reach the store at h:1")


def test_rank_0_reports_a_port_still_taken_after_its_store_closed():
    facts = {**BASE, "role": "judge", "rank": 0, "ranks": four_ranks(), "claims": {}, "port_after": "address already in use"}
    r = dc.judge(facts, SETTINGS)
    assert r.status is Status.FAIL and "still taken after rank 0 closed its exchange store" in r.summary


def test_rank_0_notes_ranks_that_never_confirmed_the_verdict():
    """A rank killed after publishing: rank 0 said ok and nothing in its facts showed it."""
    facts = {**BASE, "role": "judge", "rank": 0, "ranks": four_ranks(), "claims": {}, "acked": 2, "expected_acks": 3}
    r = dc.judge(facts, SETTINGS)
    assert any("1 of 3 other ranks did not confirm reading the verdict" in n for n in r.facts.get("notes", []))
    # in the summary too, which rank 0's log line shows: "ok, 2 ranks agree" alone hid it (helper-121)
    assert r.status is Status.OK and r.summary.endswith("; 1 of 3 other ranks did not confirm reading the verdict within "
                                                        "ack_seconds: they may have died or been killed after publishing their facts")
    r = dc.judge({**facts, "acked": 3}, SETTINGS)
    assert not any("did not confirm" in n for n in r.facts.get("notes", [])) and "did not confirm" not in r.summary


def test_ranks_text():
    assert dc.ranks_text([3]) == "rank 3"
    assert dc.ranks_text([0, 1, 2, 5, 7, 8]) == "ranks 0-2, 5, 7-8"


# -- what a rank brings -------------------------------------------------------------------------


def gpus(n=4, mig=()):
    return [(f"GPU-aaaa-{i}", list(mig) if i == 0 else []) for i in range(n)]


@pytest.mark.parametrize("cvd,local_rank,expected", [
    (None, 1, "GPU-aaaa-1"),           # torchrun default: cuda:LOCAL_RANK of every GPU
    ("2,3", 1, "GPU-aaaa-3"),          # masked: LOCAL_RANK indexes the visible list
    ("3", 1, "GPU-aaaa-3"),            # one GPU per rank: the job can only use cuda:0
    ("GPU-aaaa-2", 0, "GPU-aaaa-2"),   # by UUID
    ("0,7", 0, "GPU-aaaa-0"),          # 7 is beyond the 4 GPUs and ends the list; rank 0 still has GPU 0
])
def test_resolve_gpu(cvd, local_rank, expected):
    assert dc.resolve_gpu(cvd, local_rank, gpus())["uuid"] == expected


@pytest.mark.parametrize("cvd,local_rank,gs,reason", [
    ("-1", 0, gpus(), "leaves no GPU"),
    ("0,1", 2, gpus(), "LOCAL_RANK=2 but 2 GPUs are visible"),
    (None, None, gpus(), "LOCAL_RANK is not set"),
    (None, 0, [], "no GPU on this node"),
])
def test_resolve_gpu_unresolved(cvd, local_rank, gs, reason):
    out = dc.resolve_gpu(cvd, local_rank, gs)
    assert out["uuid"] is None and reason in out["reason"]


def test_gathered_gpu_comes_from_nvml_by_uuid():
    fake = FakeNvml(devices=[FakeDevice(uuid="GPU-11111111"), FakeDevice(uuid="GPU-22222222")], driver="570.86.15")
    session = Session(env_override={}, nvml_factory=lambda: nvml_facade.connect(lib=fake, timeout=2))
    from envdoctor.context import Context

    ctx = Context(session, SETTINGS)
    out = dc._nvml_facts(ctx, {"CUDA_VISIBLE_DEVICES": "1,0"}, 1)
    assert out == {"driver_version": "570.86.15", "gpu": {"uuid": "GPU-11111111", "visible": 2}}
    no_driver = Session(env_override={}, nvml_factory=lambda: nvml_facade.connect(lib=FakeNvml(no_library=True)))
    out = dc._nvml_facts(Context(no_driver, SETTINGS), {}, 0)
    assert out["driver_version"] is None and out["gpu"]["uuid"] is None and "no NVML" in out["gpu"]["reason"]


def test_only_the_must_match_set_leaves_a_rank_and_secrets_only_as_digests():
    env = {"NCCL_DEBUG": "WARN", "HF_TOKEN": "hf_abcdefgh", "NCCL_IB_SECRET_KEY": "s3cr3t-value", "PATH": "/bin",
           "CUDA_VISIBLE_DEVICES": "0", "PYTHONHASHSEED": "0", "WORLD_SIZE": "2", "MY_APP_SETTING": "x"}
    out = dc.shared_env(env, SETTINGS["must_match"])
    assert set(out) == {"NCCL_DEBUG", "NCCL_IB_SECRET_KEY", "CUDA_VISIBLE_DEVICES", "PYTHONHASHSEED", "WORLD_SIZE"}
    assert out["NCCL_IB_SECRET_KEY"].startswith("sha256:") and "s3cr3t" not in str(out)


@pytest.mark.parametrize("env,reason", [
    ({}, "not a distributed launch (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT not set)"),
    ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_ADDR, MASTER_PORT not set"),
    ({"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "a single rank"),
    ({"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "dist.env says why"),
])
def test_skips_outside_a_usable_launch(env, reason):
    r = run_one(Plan(dc.CHECK, SETTINGS, 10), Session(env_override=env))
    assert r.status is Status.SKIP and reason in r.summary


def test_skips_for_another_process():
    env = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    r = run_one(Plan(dc.CHECK, SETTINGS, 10), Session(env_override=env, target=Target(pid=1)))
    assert r.status is Status.SKIP and "not for --pid" in r.summary


def test_declared_intrusive_never_in_serve_but_in_exec_before_the_job():
    """Rank 0 may bind MASTER_PORT: never in serve (the job holds it). In exec the job has
    not started, and the port is given back (proved free) before exec becomes it."""
    assert dc.CHECK.intrusive and dc.CHECK.runs_in("check")
    assert not dc.CHECK.runs_in("serve") and not dc.CHECK.runs_in("inprocess")
    assert dc.CHECK.released_before_job and dc.CHECK.runs_in("exec")


def test_an_intrusive_check_that_keeps_what_it_takes_never_runs_in_exec():
    from envdoctor.check import Check
    from envdoctor.model import ok as ok_result

    binder = Check(id="plugin.binds", title="t", run=lambda ctx: ok_result("x"), intrusive=True)
    assert binder.runs_in("check") and not binder.runs_in("exec") and not binder.runs_in("serve")


def test_torchrun_namespaces_by_run_and_restart():
    env = {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "29500",
           "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "job 7", "TORCHELASTIC_RESTART_COUNT": "2"}
    launch = dc.launch_of(env)
    assert launch["agent_store"] is True and launch["run_id"] == "job_7/2"
    assert dc.launch_of({**env, "TORCHELASTIC_USE_AGENT_STORE": "False"})["agent_store"] is False


# -- dist.env: torchrun's agent store is the expected listener ---------------------------------


def dist_env_check(env):
    """dist.master_port: the check that tests the port (dist.env judges the variables only)."""
    return run_one(Plan(dist_master_port.CHECK, dict(dist_master_port.CHECK.config), 10), Session(env_override=env))


def rank0_env(port, **over):
    return {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), **over}


def test_master_port_takes_the_agent_store_on_master_port_as_expected():
    with socket.socket() as store:
        store.bind(("127.0.0.1", 0))
        store.listen()
        port = store.getsockname()[1]
        r = dist_env_check(rank0_env(port, TORCHELASTIC_USE_AGENT_STORE="True"))
        assert r.status is Status.OK, r.summary
        assert "held by the launcher's store (TORCHELASTIC_USE_AGENT_STORE=True), as expected" in r.summary
        # without the launcher's word, a listener there is still a port the job cannot bind
        r = dist_env_check(rank0_env(port))
        assert r.status is Status.FAIL and "cannot be bound" in r.summary


def test_master_port_warns_when_the_agent_store_it_was_promised_is_not_there():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        r = dist_env_check(rank0_env(port, TORCHELASTIC_USE_AGENT_STORE="True"))
    assert r.status is Status.WARN
    assert f"TORCHELASTIC_USE_AGENT_STORE=True but nothing listens on 127.0.0.1:{port}" in r.summary


# -- the exchange subprocess: bounded, and its failures said in one line ------------------------


def request(**over):
    fields = dict(rank=1, world_size=2, master_addr="127.0.0.1", master_port=1, agent_store=True, run_id="t",
                  facts={}, wait_seconds=0.5, ack_seconds=0.5, import_seconds=1.0, slack_seconds=0.2)
    fields.update(over)
    return rendezvous.Request(**fields)


def processes_with(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes().decode("utf-8", "replace"):
                found.append(entry.name)
        except OSError:
            continue
    return found


def test_an_interpreter_that_hangs_costs_the_deadline_and_is_killed(tmp_path):
    marker = f"61.{os.getpid()}"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec sleep {marker}\n")
    python.chmod(0o755)
    with pytest.raises(rendezvous.ExchangeError, match=r"did not finish within 3\.4 s \(last step: starting\); killed"):
        rendezvous.exchange(str(python), request(), lambda o: {})
    assert processes_with(f"sleep {marker}") == []  # its whole process group is gone


def test_a_listener_that_never_answers_costs_the_connect_wait_not_the_deadline():
    """Something else listens on MASTER_PORT and never answers (accept() is never called:
    the kernel completes the handshake, nothing replies). TCPStore's own timeout did not
    cover its handshake: the exchange waited until its deadline (270 s with the defaults)
    and was killed, blaming nothing. It gives up after the connect wait now, and says why."""
    pytest.importorskip("torch")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        req = request(master_port=port, wait_seconds=3.0, import_seconds=120.0)
        with pytest.raises(rendezvous.StoreUnreachable, match="did not answer as a TCPStore within 3 s"):
            rendezvous.exchange(sys.executable, req, lambda o: {})


def test_an_interpreter_without_torch_is_unavailable():
    if not Path("/usr/bin/python3").exists() or subprocess.run(["/usr/bin/python3", "-c", "import torch"],
                                                              capture_output=True).returncode == 0:
        pytest.skip("needs a system python3 without torch")
    with pytest.raises(Unavailable, match="no torch in /usr/bin/python3: the exchange between ranks uses"):
        rendezvous.exchange("/usr/bin/python3", request(), lambda o: {})


def test_a_torch_that_fails_to_import_is_an_error_with_its_reason(tmp_path, monkeypatch):
    broken = tmp_path / "site" / "torch"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise OSError('libtorch_cpu.so: cannot open shared object file')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    with pytest.raises(rendezvous.ExchangeError, match="torch fails to import: OSError: libtorch_cpu.so: cannot open"):
        rendezvous.exchange(sys.executable, request(import_seconds=30), lambda o: {})


def test_a_script_that_dies_says_what_it_printed(tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'Fatal Python error: boom-marker' >&2\nexit 1\n")
    python.chmod(0o755)
    with pytest.raises(rendezvous.ExchangeError, match="exited with status 1 before it was done; it printed: "
                                                       "Fatal Python error: boom-marker"):
        rendezvous.exchange(str(python), request(), lambda o: {})


def test_a_chatty_interpreter_cannot_block_the_exchange_and_an_absent_store_is_unreachable(tmp_path):
    """1 MB on stderr before the script even starts (a pipe would fill at 64 KiB and block it);
    the exchange still goes on, to a store nobody hosts, which it reports as unreachable."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nhead -c 1000000 /dev/zero | tr '\\0' x >&2\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: nothing answers there
        with pytest.raises(rendezvous.StoreUnreachable, match=f"could not reach the store at 127.0.0.1:{port} within 0.5 s"):
            rendezvous.exchange(str(python), request(master_port=port, import_seconds=60), lambda o: {})


def test_a_request_shrinks_its_waits_to_fit_the_time_it_is_given():
    from envdoctor import rendezvous

    base = rendezvous.Request(rank=1, world_size=2, master_addr="h", master_port=29500, agent_store=False,
                              run_id="own", facts={}, wait_seconds=60, ack_seconds=10, import_seconds=60)
    assert base.fitted(1000) is base
    for seconds in (84.0, 10.0, 1.0):
        fitted = base.fitted(seconds)
        assert fitted.deadline_seconds <= seconds + 1e-9
        assert fitted.wait_seconds / fitted.import_seconds == pytest.approx(1.0)  # in proportion
    agent = rendezvous.Request(rank=1, world_size=2, master_addr="h", master_port=29500, agent_store=True,
                               run_id="r", facts={}, wait_seconds=60, ack_seconds=10, import_seconds=60)
    assert agent.fitted(40.0).deadline_seconds <= 40.0 + 1e-9  # the capped connect wait shrinks too


def test_a_cuda_build_difference_names_the_majoritys_wheel_index():
    ranks = {0: {"cuda_version": "12.8"}, 1: {"cuda_version": "12.8"}, 2: {"cuda_version": "13.0"}}
    (finding,) = dc.rule_versions(ranks, {0: "a", 1: "a", 2: "b"})
    assert "the CUDA 12.8 wheel on each" in finding.fix
    assert finding.fix.endswith("https://download.pytorch.org/whl/cu128")
