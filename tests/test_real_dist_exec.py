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
    return launch_env(tmp_path, SLURM_JOB_ID="4711", SLURM_STEP_ID="0", SLURM_PROCID=str(rank),
                      SLURM_LOCALID=str(rank), SLURM_NODEID="0", SLURM_STEP_NUM_TASKS="2", SLURM_NTASKS="2",
                      SLURM_STEP_TASKS_PER_NODE="2", SLURM_STEP_NODELIST="localhost", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OUT=str(tmp_path), **extra)


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
