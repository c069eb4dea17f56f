"""envdoctor.launch: which distributed launch an environment belongs to, torchrun's
variables or an srun step's, and exec's default bound under one."""

from __future__ import annotations

import pytest

from envdoctor import launch
from envdoctor.exec_preflight import DEFAULT_TIMEOUT, LAUNCH_TIMEOUT, ExecOptions, default_budget

TORCHRUN = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RUN_ID": "job 7", "TORCHELASTIC_RESTART_COUNT": "2"}
# What srun sets for task 3 of `srun -N2 --ntasks-per-node=2` (Slurm's srun(1), OUTPUT ENVIRONMENT VARIABLES)
SRUN = {"SLURM_JOB_ID": "4711", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
        "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NODELIST": "gpu[07-08]", "MASTER_PORT": "29500"}


def test_torchrun_variables_make_a_launch_through_its_agent_store():
    found = launch.of(TORCHRUN)
    assert found == launch.Launch(launcher="torchrun", rank=3, world_size=4, master_addr="10.0.0.1", master_port=29500,
                                  local_rank=1, local_world_size=2, group_rank=1, agent_store=True, run_id="job_7/2")
    assert launch.of({**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "False"}).launcher == "env"


def test_an_srun_step_is_mapped_to_the_torch_names():
    found = launch.of(SRUN)
    assert isinstance(found, launch.Launch), found
    assert (found.launcher, found.rank, found.world_size, found.local_rank, found.local_world_size, found.group_rank) == \
        ("slurm", 3, 4, 1, 2, 1)
    assert found.master == "gpu07:29500"  # the step's first node, unless MASTER_ADDR says otherwise
    assert found.run_id == "slurm-4711.0" and not found.agent_store
    assert launch.of({**SRUN, "MASTER_ADDR": "10.1.1.1"}).master == "10.1.1.1:29500"


def test_torch_names_win_over_srun_when_the_script_set_them():
    found = launch.of({**SRUN, **{k: v for k, v in TORCHRUN.items() if not k.startswith("TORCHELASTIC")}})
    assert found.launcher == "env" and found.rank == 3 and found.master == "10.0.0.1:29500"


@pytest.mark.parametrize("env, reason", [
    ({}, "not a distributed launch (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT not set)"),
    # a batch script has SLURM_PROCID=0 and SLURM_NTASKS but is one process, not a step's rank 0
    ({"SLURM_JOB_ID": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_NODELIST": "a[1-4]"},
     "not a distributed launch"),
    ({**SRUN, "MASTER_PORT": ""}, "an srun step, but MASTER_PORT is not set: export MASTER_PORT="),
    ({**SRUN, "MASTER_PORT": "99999"}, "an srun step, but MASTER_PORT is not usable"),
    ({k: v for k, v in SRUN.items() if k not in ("SLURM_STEP_NODELIST",)}, "and no node list names rank 0's host"),
    ({**SRUN, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, "a single srun task"),
    ({**SRUN, "SLURM_PROCID": "4"}, "without a usable SLURM_PROCID"),
    ({**TORCHRUN, "RANK": "9"}, "the launch variables are not usable"),
    ({**TORCHRUN, "WORLD_SIZE": "1", "RANK": "0"}, "WORLD_SIZE=1: a single rank"),
])
def test_what_is_not_a_usable_launch_says_why(env, reason):
    found = launch.of(env)
    assert isinstance(found, str) and reason in found, found


@pytest.mark.parametrize("text, hosts", [
    ("4(x2),2", [4, 4, 2]), ("1", [1]), ("2,1(x3)", [2, 1, 1, 1]), ("", []), ("two", []), ("1(x999999999)", []),
])
def test_tasks_per_node(text, hosts):
    assert launch.tasks_per_node(text) == hosts


@pytest.mark.parametrize("nodelist, first", [
    ("gpu[07-09,12],cpu1", "gpu07"), ("node1,node2", "node1"), ("rack[2-3]-n[01-04]", "rack2-n01"),
    ("single", "single"), ("", ""), ("a[5]", "a5"),
])
def test_first_host_of_a_slurm_host_list(nodelist, first):
    assert launch.first_host(nodelist) == first


def test_exec_waits_longer_by_default_only_for_a_rank_that_will_compare_itself():
    assert default_budget(ExecOptions(), {}) == DEFAULT_TIMEOUT
    assert default_budget(ExecOptions(), TORCHRUN) == LAUNCH_TIMEOUT
    assert default_budget(ExecOptions(), SRUN) == LAUNCH_TIMEOUT
    assert default_budget(ExecOptions(skip=["dist.consistency"]), TORCHRUN) == DEFAULT_TIMEOUT
    assert default_budget(ExecOptions(only=["shm.size"]), TORCHRUN) == DEFAULT_TIMEOUT
    assert default_budget(ExecOptions(only=["shm.size,dist.consistency"]), TORCHRUN) == LAUNCH_TIMEOUT
    assert default_budget(ExecOptions(timeout=3.0), TORCHRUN) == 3.0  # --timeout always wins


def test_a_number_too_long_for_int_is_not_a_number():
    huge = "9" * 5000  # int() refuses more than 4300 digits
    assert "not usable" in launch.of({**TORCHRUN, "RANK": huge})
    assert "without a usable SLURM_PROCID" in launch.of({**SRUN, "SLURM_PROCID": huge})


def test_a_torch_variable_exported_alone_overrides_only_itself_under_srun():
    found = launch.of({**SRUN, "WORLD_SIZE": "4", "LOCAL_RANK": "0"})
    assert found.launcher == "slurm" and found.rank == 3 and found.local_rank == 0 and found.world_size == 4


def test_dist_env_under_a_batch_script_and_a_broken_step_says_what_it_is():
    from envdoctor.checks import dist_env

    batch = {"SLURM_JOB_ID": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "MASTER_PORT": "29500"}
    assert dist_env.slurm_context(batch) == "batch"
    step = {**SRUN, "MASTER_PORT": "abc"}
    assert dist_env.slurm_context(step).startswith("step: an srun step, but MASTER_PORT is not usable")
    assert dist_env.slurm_context(SRUN) is None  # a usable step: mapped, judged like torchrun's
    assert dist_env.slurm_context(TORCHRUN) is None


def test_a_rank_with_unusable_launch_variables_still_gets_the_launch_bound():
    """--fix may repair MASTER_PORT=0 and the ranks then compare: they need the time to meet."""
    broken = {**TORCHRUN, "MASTER_PORT": "0"}
    assert isinstance(launch.of(broken), str) and launch.names_a_rank(broken)
    assert default_budget(ExecOptions(), broken) == LAUNCH_TIMEOUT
    assert not launch.names_a_rank({"WORLD_SIZE": "1", "RANK": "0"}) and not launch.names_a_rank({})
