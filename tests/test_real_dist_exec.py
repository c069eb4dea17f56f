"""Real cross-rank pre-flights in the entrypoint and under srun's variables (CPU torch,
127.0.0.1, free ports found at run time).

- `torchrun --no-python envdoctor exec --strict -- python ...`: a consistent launch
  starts the job on every rank; one rank with another NCCL_* value starts it on none
  (exit 78), and rank 0's report names the rank and the variable;
- `exec --fix`: the rank that differs from the majority gets the majority's value, and
  its job sees it;
- an srun step, as srun sets its variables (SLURM_PROCID, SLURM_STEP_NUM_TASKS...; no
  Slurm daemon here, so the tasks are started as srun starts them, each with its own
  variables): `check` compares the ranks through rank 0's own store, and `exec --strict`
  refuses on every rank when one differs.

Every launch is bounded by a subprocess timeout and a short wait_seconds."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from test_real_torchrun import free_port, launch_env, rows, torchrun

pytest.importorskip("torch.distributed", reason="needs torch (installed by scripts/test.sh)")

pytestmark = pytest.mark.real

PY = sys.executable
JOB = "import os, pathlib; pathlib.Path(os.environ['OUT'], 'job' + os.environ.get('RANK', os.environ.get('SLURM_PROCID', '?'))).write_text(os.environ.get('NCCL_ALGO', 'unset'))"


def _exec_script(out: Path, *flags: str, differ: str = "") -> str:
    """The per-rank shell line torchrun runs: maybe change one variable on one local rank,
    then become `envdoctor exec FLAGS -- python JOB`."""
    return (f'{differ} export OUT={out}; exec {PY} -m envdoctor exec {" ".join(flags)} --report {out}/r$RANK.json '
            f'-- {PY} -c "{JOB}"')


def test_a_consistent_launch_starts_the_job_on_every_rank(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = torchrun(tmp_path, 2, "--no-python", "bash", "-c", _exec_script(out, "--strict"), env=launch_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert (out / f"job{rank}").read_text() == "unset"
        row = rows(json.loads((out / f"r{rank}.json").read_text()))["dist.consistency"]
        assert row["status"] == "ok" and row["summary"].startswith("2 ranks on 1 host agree: torch 2.13.0"), row
        assert "via torchrun's agent store" in row["summary"]


def test_one_rank_with_another_nccl_value_starts_the_job_on_no_rank(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    differ = 'if [ "$LOCAL_RANK" = 1 ]; then export NCCL_ALGO=Ring; fi;'
    proc = torchrun(tmp_path, 2, "--no-python", "bash", "-c", _exec_script(out, "--strict", differ=differ),
                    env=launch_env(tmp_path))
    assert proc.returncode != 0
    assert not list(out.glob("job*")), "a job started"
    assert "exitcode  : 78" in proc.stderr  # torchrun's summary of the first rank to stop: --strict refused
    row = rows(json.loads((out / "r0.json").read_text()))["dist.consistency"]
    assert row["status"] == "fail" and "NCCL_ALGO differs: unset on rank 0 on" in row["summary"], row
    assert "'Ring' on rank 1" in row["summary"]
    if (out / "r1.json").exists():  # unless torchrun stopped rank 1 first, it reports rank 0's verdict
        assert rows(json.loads((out / "r1.json").read_text()))["dist.consistency"]["summary"] == row["summary"]


def test_fix_gives_the_rank_that_differs_the_majoritys_value(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    differ = 'if [ "$LOCAL_RANK" = 2 ]; then export NCCL_ALGO=Ring; else export NCCL_ALGO=Tree; fi;'
    proc = torchrun(tmp_path, 3, "--no-python", "bash", "-c", _exec_script(out, "--fix", differ=differ),
                    env=launch_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(out / f"job{r}").read_text() for r in range(3)] == ["Tree", "Tree", "Tree"]
    logs = "".join(p.read_text() for p in (tmp_path / "logs").rglob("stderr.log"))  # torchrun --redirects=3
    assert "set NCCL_ALGO" in logs and "-> Tree" in logs, logs[-3000:]
    for rank in range(3):  # every rank says alike that the ranks agree after --fix
        row = rows(json.loads((out / f"r{rank}.json").read_text()))["dist.consistency"]
        assert row["status"] == "ok", row
        assert row["summary"].startswith("fixed by --fix on every rank (each takes the majority's value; here: "
                                         + ("NCCL_ALGO Ring -> Tree" if rank == 2 else "nothing")), row["summary"]
        assert "rank 0 had found: NCCL_ALGO differs: 'Tree' on ranks 0-1 on" in row["summary"]
    assert row["facts"]["exec_fixed"] == {"NCCL_ALGO": {"from": "Ring", "to": "Tree"}}


def _srun_env(tmp_path, rank: int, port: int, **extra) -> dict:
    """What srun gives task `rank` of `srun -N1 -n2` (srun(1), OUTPUT ENVIRONMENT VARIABLES),
    with MASTER_PORT exported by the batch script; no torch launch variables."""
    variables = dict(SLURM_JOB_ID="4711", SLURM_STEP_ID="0", SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank),
                     SLURM_NODEID="0", SLURM_STEP_NUM_TASKS="2", SLURM_NTASKS="2", SLURM_STEP_TASKS_PER_NODE="2",
                     SLURM_STEP_NODELIST="localhost", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OUT=str(tmp_path))
    return launch_env(tmp_path, **{**variables, **extra})


def _srun(tmp_path, argv_for_rank, env_for_rank) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen(argv_for_rank(r), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env_for_rank(r), cwd=tmp_path) for r in (0, 1)]
    done = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=90)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return done


def test_an_srun_step_compares_its_tasks_through_rank_0s_store(tmp_path):
    port = free_port()
    done = _srun(tmp_path, lambda r: [PY, "-m", "envdoctor", "check", "-f", "json", "--only", "dist.consistency"],
                 lambda r: _srun_env(tmp_path, r, port))
    for rank, proc in enumerate(done):
        assert proc.returncode == 0, (rank, proc.stderr[-2000:])
        row = rows(json.loads(proc.stdout))["dist.consistency"]
        assert row["status"] == "ok" and row["summary"].startswith("2 ranks on 1 host agree"), row
        assert "via rank 0's own store (an srun step) at 127.0.0.1:" in row["summary"]
        assert row["facts"]["hosts"] == {socket.gethostname(): [0, 1]}
    with socket.socket() as job:  # rank 0 gave MASTER_PORT back: the job's store can take it
        job.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        job.bind(("127.0.0.1", port))


def test_an_srun_step_with_one_task_different_starts_no_job_under_strict(tmp_path):
    port = free_port()
    done = _srun(tmp_path, lambda r: [PY, "-m", "envdoctor", "exec", "--strict", "--", PY, "-c", JOB],
                 lambda r: _srun_env(tmp_path, r, port, **({"NCCL_ALGO": "Ring"} if r == 1 else {})))
    assert [p.returncode for p in done] == [78, 78], [p.stderr[-1500:] for p in done]
    assert not list(tmp_path.glob("job*")), "a job started"
    for proc in done:
        assert "fail dist.consistency: NCCL_ALGO differs: unset on rank 0 on" in proc.stderr, proc.stderr[-2000:]
        assert "via rank 0's own store (an srun step)" in proc.stderr


def _by_hand(tmp_path, rank: int, port: int, **extra) -> dict:
    """Rank `rank` of 2 with torch's variables set by hand (a script's launch, no torchrun)."""
    return launch_env(tmp_path, WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OUT=str(tmp_path), **extra)


EXEC_JOB = [PY, "-m", "envdoctor", "exec", "--strict", "--fix"]


def test_keep_on_a_variable_the_ranks_disagree_on_refuses_on_every_rank(tmp_path):
    """--keep is on every rank's command line: the rank that already has the majority's value
    must not call the ranks agreed while the other keeps its own (it started alone before)."""
    port = free_port()
    done = _srun(tmp_path, lambda r: [*EXEC_JOB, "--keep", "NCCL_ALGO", "--", PY, "-c", JOB],
                 lambda r: _by_hand(tmp_path, r, port, NCCL_ALGO="Tree" if r == 0 else "Ring"))
    assert [p.returncode for p in done] == [78, 78], [p.stderr[-1500:] for p in done]
    assert not list(tmp_path.glob("job*")), "a job started"


def test_a_variable_unset_by_fix_is_judged_again_by_every_check_that_wanted_it(tmp_path):
    """NCCL_P2P_DISABLE=1 on rank 1: dist.consistency (credited with the change) and dist.env
    both want it unset; after --fix neither may still report it (rank 1 refused alone)."""
    port = free_port()
    done = _srun(tmp_path, lambda r: [*EXEC_JOB, "--fail-on", "warn", "--", PY, "-c", JOB + "; print(os.environ.get('NCCL_P2P_DISABLE'))"],
                 lambda r: _by_hand(tmp_path, r, port, **({"NCCL_P2P_DISABLE": "1"} if r == 1 else {})))
    assert [p.returncode for p in done] == [0, 0], [p.stderr[-2000:] for p in done]
    assert done[1].stdout.strip() == "None"  # unset for rank 1's job
    assert "NCCL_P2P_DISABLE=1" not in done[1].stderr.split("set NCCL_P2P_DISABLE")[-1]


def test_srun_tasks_that_disagree_on_the_task_count_fail(tmp_path):
    port = free_port()
    done = _srun(tmp_path, lambda r: [PY, "-m", "envdoctor", "check", "-f", "json", "--only", "dist.consistency"],
                 lambda r: _srun_env(tmp_path, r, port, **({"SLURM_STEP_NUM_TASKS": "3"} if r == 1 else {})))
    row = rows(json.loads(done[0].stdout))["dist.consistency"]
    assert row["status"] == "fail" and "SLURM_STEP_NUM_TASKS differs" in row["summary"], row


def test_a_bound_too_short_for_the_exchange_is_one_clear_error(tmp_path):
    env = _by_hand(tmp_path, 1, free_port())
    proc = subprocess.run([PY, "-m", "envdoctor", "exec", "--strict", "--timeout", "0.3", "--", "true"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 78, proc.stderr
    assert "Traceback" not in proc.stderr and "ZeroDivisionError" not in proc.stderr
    assert "left for the cross-rank exchange" in proc.stderr and "it needs at least 3 s" in proc.stderr, proc.stderr


def test_a_master_port_held_by_something_else_is_a_fail_that_says_so(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = _by_hand(tmp_path, 0, port, ENVDOCTOR_CHECK__DIST_CONSISTENCY__WAIT_SECONDS="3")
        proc = subprocess.run([PY, "-m", "envdoctor", "check", "-f", "json", "--only", "dist.consistency"],
                              capture_output=True, text=True, env=env, timeout=90)
    row = rows(json.loads(proc.stdout))["dist.consistency"]
    assert row["status"] == "fail", row
    assert "could not host the exchange store" in row["summary"] and "MASTER_PORT" in row["remediation"], row


def test_the_ranks_still_compare_after_fix_repairs_the_launch_variables(tmp_path):
    """MASTER_PORT=0 on every rank: dist.consistency cannot run until --fix gives the port
    dist.env suggests; then every rank compares (they used to start with two ranks on
    LOCAL_RANK 0, never compared)."""
    done = _srun(tmp_path, lambda r: [*EXEC_JOB, "--", PY, "-c", JOB],
                 lambda r: {**_by_hand(tmp_path, r, 0), "LOCAL_RANK": "0"})
    assert [p.returncode for p in done] == [78, 78], [p.stderr[-2000:] for p in done]
    assert not list(tmp_path.glob("job*")), "a job started"
    assert "all have LOCAL_RANK=0" in done[0].stderr, done[0].stderr[-2000:]


def test_exec_killed_mid_exchange_takes_the_exchange_and_its_port_with_it(tmp_path):
    """Rank 0 hosts the exchange store on MASTER_PORT and waits for rank 1, which never
    comes; exec is SIGKILLed meanwhile. The forked pre-flight and the exchange it started
    die with it: the port is free at once, not when the exchange's own wait ends (30 s)."""
    import signal
    import time

    port = free_port()
    env = _by_hand(tmp_path, 0, port, ENVDOCTOR_CHECK__DIST_CONSISTENCY__WAIT_SECONDS="30")
    proc = subprocess.Popen([PY, "-m", "envdoctor", "exec", "--", "true"], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until rank 0's store listens
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            raise AssertionError("rank 0 never hosted its store")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.monotonic()
        while time.monotonic() - killed < 10:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) != 0:
                    break
            time.sleep(0.1)
        freed_after = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert freed_after < 5, f"MASTER_PORT still held {freed_after:.1f} s after exec was killed"


def test_a_cpu_launch_that_hides_the_gpus_starts_under_strict(tmp_path):
    """Helper-49: CUDA_VISIBLE_DEVICES='' (the usual way to force a gloo job onto the CPU)
    made every rank's cuda.visible_devices fail ("LOCAL_RANK=0 but CUDA sees no GPU"), and
    --strict refused to start a job that runs fine: it never calls set_device."""
    out = tmp_path / "out"
    out.mkdir()
    env = {**launch_env(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    proc = torchrun(tmp_path, 2, "--no-python", "bash", "-c", _exec_script(out, "--strict"), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert (out / f"job{rank}").read_text() == "unset"
        row = rows(json.loads((out / f"r{rank}.json").read_text()))["cuda.visible_devices"]
        assert row["status"] != "fail", row
