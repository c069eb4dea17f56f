"""Real distributed launches on this machine (CPU, gloo-era torch, 127.0.0.1, free ports
found at run time): `torchrun --nproc-per-node=N -m envdoctor check` and the same with
one rank made different by tests/dist_rank.py; and a launch without torchrun (the
variables set by hand, as a Slurm script does), where rank 0 hosts the store itself
and must give the port back.

Every launch is bounded by a subprocess timeout and a short wait_seconds."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from test_no_torch_import import GUARD

pytest.importorskip("torch.distributed", reason="needs torch (installed by scripts/test.sh)")

pytestmark = pytest.mark.real

TESTS = Path(__file__).resolve().parent
RANK_SCRIPT = TESTS / "dist_rank.py"
LOUD = ("warn", "fail", "error")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_env(tmp_path, **extra) -> dict:
    env = dict(os.environ)
    for name in list(env):
        if name.startswith(("DIST_TEST_", "TORCHELASTIC_", "NCCL_")) or name in (
                "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "ENVDOCTOR_CONFIG"):
            del env[name]
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the torch-probe cache: each test's own
    env["ENVDOCTOR_CHECK__DIST_CONSISTENCY__WAIT_SECONDS"] = "20"
    env.update(extra)
    return env


def torchrun(tmp_path, nproc: int, *command: str, env: dict, timeout: float = 90,
             rdzv: str = "static") -> subprocess.CompletedProcess:
    """torchrun on 127.0.0.1 and a port free now: the static rendezvous (--master-port, the
    default) or the c10d one (--rdzv-endpoint, what multi-node jobs use)."""
    port = free_port()
    logs = tmp_path / "logs"
    where = ([f"--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}"] if rdzv == "c10d"
             else ["--master-addr=127.0.0.1", f"--master-port={port}"])
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", *where,
         f"--log-dir={logs}", "--redirects=3", *command],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=tmp_path)


def logged_reports(tmp_path, nproc: int) -> dict[int, dict]:
    """Each rank's JSON report, from torchrun's per-rank stdout logs (--log-dir, --redirects=3)."""
    reports = {}
    for rank in range(nproc):
        found = list((tmp_path / "logs").glob(f"*/attempt_0/{rank}/stdout.log"))
        assert len(found) == 1, (rank, list((tmp_path / "logs").rglob("*")))
        reports[rank] = json.loads(found[0].read_text())
    return reports


def rank_outputs(out: Path, nproc: int) -> dict[int, tuple[str, dict | None]]:
    """Rank -> (exit code or "absent", its JSON report) as tests/dist_rank.py wrote them."""
    result = {}
    for rank in range(nproc):
        rc = (out / f"rank{rank}.rc").read_text() if (out / f"rank{rank}.rc").exists() else "no rc"
        report = out / f"rank{rank}.json"
        result[rank] = (rc, json.loads(report.read_text()) if report.exists() else None)
    return result


def rows(report: dict) -> dict[str, dict]:
    return {r["check"]: r for r in report["results"]}


NO_TORCH_CLI = GUARD + """
import json, runpy
sys.argv = ["envdoctor", "check", "-f", "json", "--only", "dist.consistency,dist.env"]
try:
    runpy.run_module("envdoctor", run_name="__main__", alter_sys=True)
finally:
    sys.stderr.write("\\n" + json.dumps({"attempts": ATTEMPTS, "torch_loaded": "torch" in sys.modules}) + "\\n")
"""


@pytest.fixture(scope="module")
def baseline_loud(tmp_path_factory) -> set[str]:
    """Checks that warn or fail on this machine outside any launch: what a torchrun launch
    may also show without it being torchrun's doing (on this machine: none)."""
    tmp = tmp_path_factory.mktemp("baseline")
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "check", "-f", "json"], capture_output=True, text=True,
                          env=launch_env(tmp), timeout=120, cwd=tmp)
    return {c for c, r in rows(json.loads(proc.stdout)).items() if r["status"] in LOUD}


@pytest.mark.parametrize("nproc,rdzv", [(2, "static"), (4, "static"), (2, "c10d")])
def test_a_consistent_torchrun_launch_passes_with_no_warn_or_fail_on_any_rank(tmp_path, nproc, rdzv, baseline_loud):
    # More ranks than CPUs is a real oversubscription that cpu.threads rightly warns about
    # (4 ranks on this 2-CPU machine): the one check left out, and only then.
    skip = ["--skip", "cpu.threads"] if nproc > len(os.sched_getaffinity(0)) else []
    proc = torchrun(tmp_path, nproc, "-m", "envdoctor", "check", "-f", "json", *skip, env=launch_env(tmp_path),
                    rdzv=rdzv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = logged_reports(tmp_path, nproc)
    for rank, report in reports.items():
        by_check = rows(report)
        loud = {c: r["summary"] for c, r in by_check.items() if r["status"] in LOUD}
        assert set(loud) <= baseline_loud, (rank, loud)
        assert by_check["dist.env"]["status"] == "ok", by_check["dist.env"]
        consistency = by_check["dist.consistency"]
        assert consistency["status"] == "ok", consistency
        assert consistency["summary"].startswith(f"{nproc} ranks on 1 host agree: torch 2.13.0")
        assert "via torchrun's agent store at " in consistency["summary"]
        assert consistency["facts"]["ranks_present"] == nproc
    # rank 0's dist.master_port judged torchrun's store on MASTER_PORT the expected listener, not a port in use
    assert "held by the launcher's store" in rows(reports[0])["dist.master_port"]["summary"]


def test_one_rank_with_another_nccl_value_fails_on_every_rank_naming_rank_and_variable(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = launch_env(tmp_path, DIST_TEST_SET="1:NCCL_ALGO=Ring")
    proc = torchrun(tmp_path, 2, str(RANK_SCRIPT), str(out), "--only", "dist.consistency", env=env)
    assert proc.returncode != 0
    # rank 0 said it at once, before any rank could exit and make torchrun stop the others
    logs = "".join(p.read_text() for p in (tmp_path / "logs").rglob("stderr.log"))
    assert "dist.consistency: NCCL_ALGO differs: unset on rank 0 on" in logs
    for rank, (rc, report) in rank_outputs(out, 2).items():
        if report is None:  # torchrun stopped this rank after rank 0 exited 1: only rank 1 may be cut short,
            # killed outright (no rc) or ended by envdoctor's SIGTERM handler (143, its probes' group killed first)
            assert rank == 1 and rc in ("no rc", "143"), (rank, rc)
            continue
        row = rows(report)["dist.consistency"]
        assert rc == "1" and row["status"] == "fail", (rank, rc, row)
        assert "NCCL_ALGO differs: unset on rank 0 on" in row["summary"] and "'Ring' on rank 1" in row["summary"]
        assert row["remediation"] == ("unset NCCL_ALGO on every rank (no majority: as it is on rank 0, the lowest rank "
                                      "of the sides that tie)")  # two ranks, one each way
    assert rank_outputs(out, 2)[0][1] is not None  # rank 0's combined report was written


def test_a_rank_that_never_starts_the_check_is_reported_missing_within_the_timeout(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = launch_env(tmp_path, DIST_TEST_ABSENT="1", ENVDOCTOR_CHECK__DIST_CONSISTENCY__WAIT_SECONDS="4")
    proc = torchrun(tmp_path, 2, str(RANK_SCRIPT), str(out), "--only", "dist.consistency", env=env)
    assert proc.returncode != 0
    outputs = rank_outputs(out, 2)
    assert outputs[1][0] == "absent"
    rc, report = outputs[0]
    row = rows(report)["dist.consistency"]
    assert rc == "1" and row["status"] == "fail"
    assert f"1 of 2 ranks did not arrive within" in row["summary"]
    assert f"rank 1 (expected on {socket.gethostname()})" in row["summary"]
    assert row["facts"]["ranks_present"] == 1
    assert row["remediation"].endswith("in one rank's shell by hand, where no other rank comes, --skip dist.consistency")


def torch_cuda_version() -> str | None:
    """The CUDA version this interpreter's torch was built for; None for a CPU build. The
    local wheel is the CPU build; on a Python it has no wheel for, PyPI's torch is the CUDA one."""
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.version.cuda)"],
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    return None if probe.stdout.strip() == "None" else probe.stdout.strip()


def test_two_local_ranks_on_one_gpu_are_caught(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    # two fake GPUs; rank 1 is pinned to GPU 0, which is rank 0's cuda:LOCAL_RANK.
    # A CPU build of torch uses no GPU: by default ("auto") the GPUs are then not
    # compared and the launch passes; a CUDA build's are, as compare_gpus = "always" does.
    env = launch_env(tmp_path, DIST_TEST_FAKE_GPUS="2", DIST_TEST_SET="1:CUDA_VISIBLE_DEVICES=0")
    proc = torchrun(tmp_path, 2, str(RANK_SCRIPT), str(out), "--only", "dist.consistency", env=env)
    cpu_build = torch_cuda_version() is None
    assert proc.returncode == 0 or not cpu_build, proc.stderr[-3000:]
    rc, report = rank_outputs(out, 2)[0]
    row = rows(report)["dist.consistency"]
    if cpu_build:
        assert row["status"] == "ok" and "is a CPU build, which uses no GPU" in row["summary"], row
        # both ranks did resolve a GPU through (fake) NVML: the same one
        assert set(row["facts"]["gpus"].values()) == {"GPU-fa4e0000-0000-0000-0000-000000000000"}
    else:
        assert proc.returncode != 0 and rc == "1" and row["status"] == "fail", row
        assert "use one GPU, GPU-fa4e0000-0000-0000-0000-000000000000" in row["summary"], row

    out = tmp_path / "out-always"
    out.mkdir()
    env["ENVDOCTOR_CHECK__DIST_CONSISTENCY__COMPARE_GPUS"] = "always"
    proc = torchrun(tmp_path / "out-always", 2, str(RANK_SCRIPT), str(out), "--only", "dist.consistency", env=env)
    assert proc.returncode != 0
    rc, report = rank_outputs(out, 2)[0]
    row = rows(report)["dist.consistency"]
    assert rc == "1" and row["status"] == "fail", row
    assert "ranks 0-1 on" in row["summary"] and "use one GPU, GPU-fa4e0000-0000-0000-0000-000000000000" in row["summary"]
    assert "rank 1 with LOCAL_RANK=1 and CUDA_VISIBLE_DEVICES '0'" in row["summary"]
    assert row["facts"]["versions"]["driver_version"] == "550.54.15"  # the fake's driver, read on every rank


def test_without_a_launcher_store_rank_0_hosts_one_and_releases_the_port(tmp_path):
    """WORLD_SIZE/RANK/MASTER_* set by hand (as a Slurm script does): no agent store, so rank 0
    hosts the exchange on MASTER_PORT; right after, the job must be able to take that port."""
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = launch_env(tmp_path, WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-c", NO_TORCH_CLI], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=90))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    # the port is free for the job at once: a server binds it as TCPStore does (SO_REUSEADDR) and listens
    with socket.socket() as job:
        job.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        job.bind(("127.0.0.1", port))
        job.listen()
    for rank, (p, (stdout, stderr)) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, (rank, stderr[-2000:], stdout[-2000:])
        # the exchange used torch in its subprocess; envdoctor's own process never imported it
        assert json.loads(stderr.strip().splitlines()[-1]) == {"attempts": [], "torch_loaded": False}, stderr[-2000:]
        by_check = rows(json.loads(stdout))
        assert by_check["dist.consistency"]["status"] == "ok", by_check["dist.consistency"]
        assert "via rank 0's own store" in by_check["dist.consistency"]["summary"]
        assert by_check["dist.env"]["status"] == "ok", by_check["dist.env"]


KEYS_LEFT = """
import json, os, sys
from datetime import timedelta
from torch.distributed import TCPStore
store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False, timedelta(seconds=10))
base = "envdoctor/dist.consistency/v1/none/0/"
keys = [base + f"{gen}/{name}" for gen in (1, 2)
        for name in ("facts/0", "facts/1", "claim/0", "claim/1", "verdict", "done")]
print(json.dumps({"left": [k for k in keys if store.check([k])],
                  "generations": [store.add(base + "gen/0", 0), store.add(base + "gen/1", 0)]}))
"""


def test_the_exchange_leaves_no_key_in_torchruns_store(tmp_path):
    """Every rank runs the check twice (the second run must not meet the first one's keys);
    then rank 0 looks into the agent store the job would use next."""
    probe = tmp_path / "keys_left.py"
    probe.write_text(KEYS_LEFT)
    check = f'{sys.executable} -m envdoctor check -f json --only dist.consistency > /dev/null || exit 9; '
    script = check + check + f'if [ "$RANK" = 0 ]; then {sys.executable} {probe}; fi'
    
    proc = torchrun(tmp_path, 2, "--no-python", "bash", "-c", script, env=launch_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = list((tmp_path / "logs").glob("*/attempt_0/0/stdout.log"))
    # only the two per-rank run counters stay, each at 2
    assert json.loads(found[0].read_text().strip().splitlines()[-1]) == {"left": [], "generations": [2, 2]}


def test_a_rank_whose_rank_0_never_comes_fails_within_the_timeout(tmp_path):
    """No launcher store and no rank 0: rank 1 cannot reach rank 0's store and says so."""
    env = launch_env(tmp_path, WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                     ENVDOCTOR_CHECK__DIST_CONSISTENCY__WAIT_SECONDS="3")
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "check", "-f", "json", "--only", "dist.consistency"],
                          capture_output=True, text=True, env=env, timeout=90, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]
    row = rows(json.loads(proc.stdout))["dist.consistency"]
    assert row["status"] == "fail" and row["summary"].startswith("rank 1 could not reach the store at 127.0.0.1:")
    assert "rank 0 did not start the check" in row["summary"]


def test_two_nodes_each_with_its_own_host_name(tmp_path):
    """Two torchrun agents (--nnodes=2, static rendezvous on 127.0.0.1), each in its own UTS
    namespace with its own host name, as two nodes are. Node B names its own NIC in
    NCCL_SOCKET_IFNAME (allowed to differ between nodes) and its LOCAL_RANK 1 never starts
    the check: rank 0 names rank 3 and node B's host, and nothing else."""
    if os.geteuid() != 0 or subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs root and unshare --uts (util-linux) to give each node its own host name")
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()
    names = [f"ednode{os.getpid()}a", f"ednode{os.getpid()}b"]
    agents = []
    for node, name in enumerate(names):
        extra = {"ENVDOCTOR_CHECK__DIST_CONSISTENCY__WAIT_SECONDS": "10"}  # node B's ranks may start later
        if node == 1:
            extra.update(NCCL_SOCKET_IFNAME="lo", DIST_TEST_ABSENT="1")
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
                   "--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={port}",
                   str(RANK_SCRIPT), str(out), "--only", "dist.consistency"]
        agents.append(subprocess.Popen(["unshare", "--uts", "sh", "-c", f'hostname "$0" && exec "$@"', name, *command],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       env=launch_env(tmp_path, **extra), cwd=tmp_path))
    try:
        logs = [a.communicate(timeout=90)[0] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
    outputs = rank_outputs(out, 4)
    assert outputs[3][0] == "absent", (outputs, logs[1][-2000:])
    rc, report = outputs[0]
    assert report is not None, logs[0][-3000:]
    row = rows(report)["dist.consistency"]
    assert rc == "1" and row["status"] == "fail", row
    assert row["facts"]["hosts"] == {names[0]: [0, 1], names[1]: [2]}
    assert row["facts"]["findings"] == [row["facts"]["findings"][0]]  # the missing rank, and only that
    assert f"1 of 4 ranks did not arrive within" in row["summary"]
    assert f"rank 3 (expected on {names[1]})" in row["summary"]


def test_the_torchrun_line_dist_env_tells_users_to_run_launches_two_nodes(tmp_path):
    """Helper-91: the fix dist.env prints (and the README's multi-node lines) had no
    --rdzv-backend, so torchrun's static rendezvous made both nodes node rank 0 and the
    second failed to host the store. The line as printed, run as two 'nodes' on this host,
    gives each its own node rank and the ranks 0 and 1."""
    import shlex

    from envdoctor.checks.dist_env import TORCHRUN

    script = tmp_path / "train.py"
    script.write_text("import os\nprint(os.environ['GROUP_RANK'], os.environ['RANK'], os.environ['WORLD_SIZE'])\n")
    line = (TORCHRUN.split("#")[0].replace("--nnodes=N", "--nnodes=2").replace("GPUS", "1")
            .replace("MASTER:29500", f"127.0.0.1:{free_port()}").replace("JOB", "envdoctor-test")
            .replace("train.py", str(script)))
    argv = [sys.executable, "-m", "torch.distributed.run", *shlex.split(line)[1:]]
    env = launch_env(tmp_path)
    nodes = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
             for _ in range(2)]
    try:
        seen = [node.communicate(timeout=120) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
    assert [n.returncode for n in nodes] == [0, 0], [err[-800:] for _, err in seen]
    ranks = sorted(out.split() for out, _ in seen)
    assert ranks == [["0", "0", "2"], ["1", "1", "2"]], ranks


def test_a_rank_given_to_two_processes_is_named_at_once_not_waited_out_as_missing(tmp_path):
    """helper-114: local rank 1 launched with RANK=0 as well. Each process counts a generation
    of its RANK, so the two published apart and the claim counter never passed 1: rank 0 waited
    the whole wait_seconds and said only that rank 1 did not arrive (start every rank, raise
    wait_seconds). Now the second claim joins the first one's run, whose rank 0 names it."""
    out = tmp_path / "out"
    out.mkdir()
    env = launch_env(tmp_path, DIST_TEST_SET="1:RANK=0", ENVDOCTOR_CHECK__DIST_CONSISTENCY__WAIT_SECONDS="60")
    proc = torchrun(tmp_path, 2, str(RANK_SCRIPT), str(out), "--only", "dist.consistency", env=env)
    assert proc.returncode != 0
    reports = [report for rc, report in rank_outputs(out, 2).values() if report is not None]
    assert reports, proc.stderr[-3000:]
    row = rows(reports[0])["dist.consistency"]
    assert row["status"] == "fail", row
    assert "RANK=0 by 2 processes" in row["summary"], row["summary"]
    assert "a RANK was given to two processes" in row["summary"], row["summary"]
    assert "wait_seconds" not in row["remediation"], row["remediation"]
    waited = re.search(r"did not arrive within ([0-9.]+) s", row["summary"])
    assert waited and float(waited.group(1)) < 30, row["summary"]  # not the 60 s wait for a rank nobody took
