"""The parts of `envdoctor exec`: which variables --fix sets (from the real judges'
results), the forked, bounded pre-flight (real fork, real stray processes), and the
pre-flight itself with the fake NVML (the only fake allowed)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from envdoctor import envfix, exec_preflight, forked, nvml
from envdoctor.cgroup import CpuLimit, EffectiveCpus
from envdoctor.checks import cpu_threads, cuda_visible_devices, torch_cudnn
from envdoctor.config import Config
from envdoctor.context import HostSession
from envdoctor.registry import load as load_registry
from fake_pynvml import FakeDevice, FakeNvml

FIVE = envfix.THREAD_VARS


def _threads_result(variables, cpus=2.0, limited_by="cgroup quota", **config):
    quota = CpuLimit(cpus if limited_by == "cgroup quota" else None, "cgroup v1", "/sys/fs/cgroup/cpu/job/cpu.cfs_quota_us")
    facts = cpu_threads.ThreadFacts(variables, None, EffectiveCpus(cpus, 64, 64, quota, limited_by, ()))
    result = cpu_threads.judge(facts, {**cpu_threads.CHECK.config, **config})
    result.check = "cpu.threads"
    return result.to_dict()


# ----------------------------------------------------------------------------- envfix
def test_threads_are_set_to_the_cpus_of_the_quota():
    result = _threads_result({"OMP_NUM_THREADS": "16"})
    assert result["status"] == "warn"
    plan = envfix.plan([result], {"OMP_NUM_THREADS": "16"})
    assert [c.describe() for c in plan.changes][:2] == [
        "OMP_NUM_THREADS 16 -> 2 (2 CPUs of cgroup quota)",
        "MKL_NUM_THREADS unset -> 2 (2 CPUs of cgroup quota)",
    ]
    assert {c.name: c.new for c in plan.changes} == dict.fromkeys(FIVE, "2")


def test_threads_are_shared_between_local_ranks():
    result = _threads_result({}, cpus=8.0, processes_per_node=4)
    plan = envfix.plan([result], {})
    assert plan.changes[0].describe() == "OMP_NUM_THREADS unset -> 2 (8 CPUs of cgroup quota / 4 local ranks)"


def test_a_variable_already_right_is_not_touched_and_keep_is_honoured():
    result = _threads_result({"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "9"})
    env = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "9"}
    plan = envfix.plan([result], env, keep=["MKL_NUM_THREADS"])
    assert "OMP_NUM_THREADS" not in {c.name for c in plan.changes}
    assert plan.kept[0].name == "MKL_NUM_THREADS"
    fixed = envfix.apply(env, plan.changes)
    # a kept thread variable the job set holds the others as the job gave them (052c049):
    # the unset ones stay unset and follow OMP_NUM_THREADS, which is already right
    assert fixed["MKL_NUM_THREADS"] == "9" and "NUMEXPR_NUM_THREADS" not in fixed
    assert not {c.name for c in plan.changes} & set(FIVE)


def test_results_that_are_ok_or_unfixable_want_nothing():
    fitting = _threads_result(dict.fromkeys(FIVE, "1"))
    assert fitting["status"] == "ok" and envfix.wanted(fitting) == {}
    shm = {"check": "shm.size", "status": "fail", "summary": "/dev/shm is 64 MiB", "remediation": "docker run --shm-size=1g",
           "facts": {}}
    assert envfix.wanted(shm) == {}


def test_fix_env_given_by_a_check_wins_over_the_rule():
    result = _threads_result({"OMP_NUM_THREADS": "16"})
    result["fix_env"] = {"OMP_NUM_THREADS": "3"}
    plan = envfix.plan([result], {"OMP_NUM_THREADS": "16"})
    assert [(c.name, c.new) for c in plan.changes] == [("OMP_NUM_THREADS", "3")]
    assert plan.changes[0].reason == "2 CPUs of cgroup quota"


def test_mixed_gpus_get_pci_bus_order():
    gpus = (cuda_visible_devices.Gpu(0, "NVIDIA A100", "GPU-0", ()), cuda_visible_devices.Gpu(1, "NVIDIA T4", "GPU-1", ()))
    result = cuda_visible_devices.judge(cuda_visible_devices.VisibleFacts("1", None, None, None, gpus), {})
    result.check = "cuda.visible_devices"
    assert envfix.wanted(result.to_dict()) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    same = cuda_visible_devices.judge(cuda_visible_devices.VisibleFacts("1", "PCI_BUS_ID", None, None, gpus), {})
    same.check = "cuda.visible_devices"
    assert envfix.wanted(same.to_dict()) == {}


def test_deterministic_algorithms_get_a_deterministic_cublas_workspace():
    torch = {"torch_version": "2.4.0+cu121", "torch_cuda_version": "12.1", "cuda_available": True, "cudnn_enabled": True,
             "cudnn_benchmark": False, "cudnn_deterministic": True, "deterministic_algorithms": True,
             "deterministic_warn_only": False}
    result = torch_cudnn.judge(torch_cudnn.CudnnFacts(torch, None), {})
    result.check = "torch.cudnn"
    assert result.status.value == "fail"
    assert envfix.wanted(result.to_dict()) == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    good = torch_cudnn.judge(torch_cudnn.CudnnFacts(torch, ":16:8"), {})
    good.check = "torch.cudnn"
    assert envfix.wanted(good.to_dict()) == {}


# ----------------------------------------------------------------------------- forked
def test_forked_call_returns_the_value_or_the_exception():
    assert forked.call(lambda send: {"pid": os.getpid()}, 30).value["pid"] != os.getpid()

    def broken(send):
        send({"about to": "raise"})
        raise ValueError("on purpose")

    outcome = forked.call(broken, 30)
    assert outcome.kind == forked.RAISED and "ValueError: on purpose" in outcome.error
    assert outcome.messages == [{"about to": "raise"}]
    died = forked.call(lambda send: os._exit(3), 30)
    assert died.kind == forked.RAISED and "died without an answer" in died.error


def test_reaping_sleeps_until_the_child_exits_instead_of_polling(monkeypatch):
    """The answered child exits within a millisecond; a fixed 5 ms poll added those 5 ms to
    every job's start. Where the kernel has pidfds, reaping waits on one and never polls."""
    if not hasattr(os, "pidfd_open"):
        pytest.skip("this Python has no os.pidfd_open")
    child = subprocess.Popen(["sleep", "0.3"])
    naps = []
    monkeypatch.setattr(forked.time, "sleep", naps.append)
    assert forked._reap([child.pid], 10) == []
    assert naps == [] and not os.path.exists(f"/proc/{child.pid}")
    child.returncode = 0  # reaped above: Popen must not wait for it again


def _gone(pid: int) -> bool:
    """No such process any more: killed and reaped (a zombie still has its /proc entry)."""
    return not os.path.exists(f"/proc/{pid}")


def test_a_child_past_its_deadline_is_killed_with_what_it_started(tmp_path):
    pid_file = tmp_path / "grandchild"

    def hang(send):
        stray = subprocess.Popen(["sleep", "120"], start_new_session=True)
        pid_file.write_text(str(stray.pid))
        send("started a stray")
        time.sleep(120)

    started = time.monotonic()
    outcome = forked.call(hang, 1.0)
    assert outcome.kind == forked.TIMED_OUT and outcome.messages == ["started a stray"]
    assert time.monotonic() - started < 30
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(grandchild) and time.monotonic() < deadline:  # killed; reaped by whoever inherited it
        time.sleep(0.05)
    assert _gone(grandchild), "what the pre-flight started outlived it"


def test_a_child_that_answers_kills_and_reaps_what_it_left_running(tmp_path):
    def leave_a_stray(send):
        stray = subprocess.Popen(["sleep", "120"], start_new_session=True)
        return stray.pid

    outcome = forked.call(leave_a_stray, 30)
    assert outcome.kind == forked.DONE
    assert _gone(outcome.value), "a process started by the pre-flight outlived it"


# ----------------------------------------------------------------------------- the pre-flight, with the fake NVML
def _plans(*ids):
    registry = load_registry(autoload_plugins=False)
    return exec_preflight.select(registry, Config(), exec_preflight.ExecOptions(only=ids))


def test_preflight_fixes_device_order_on_mixed_gpus_and_judges_again():
    fake = FakeNvml(devices=[FakeDevice(name="NVIDIA A100-SXM4-80GB", uuid="GPU-a", pci_bus_id="00000000:01:00.0"),
                             FakeDevice(name="Tesla T4", uuid="GPU-b", pci_bus_id="00000000:02:00.0")])
    env = {"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": "1"}

    def run(send):
        host = HostSession(nvml_factory=lambda: nvml.connect(lib=fake, timeout=2))
        return exec_preflight.preflight(_plans("cuda.visible_devices"), env, exec_preflight.ExecOptions(fix=True), 10.0, host=host)

    outcome = forked.call(run, 30)
    assert outcome.kind == forked.DONE, outcome.error
    (row,) = outcome.value["results"]
    assert row["status"] == "ok", row  # judged again with CUDA_DEVICE_ORDER=PCI_BUS_ID
    assert row["facts"]["exec_fixed"] == {"CUDA_DEVICE_ORDER": {"from": None, "to": "PCI_BUS_ID"}}
    assert outcome.value["changes"][0]["name"] == "CUDA_DEVICE_ORDER"


def test_preflight_ends_within_its_budget_when_a_gpu_hangs():
    fake = FakeNvml(devices=[FakeDevice(hang="memory")])

    def run(send):
        host = HostSession(nvml_factory=lambda: nvml.connect(lib=fake, timeout=30))
        return exec_preflight.preflight(_plans("gpu.health", "shm.size"), dict(os.environ), exec_preflight.ExecOptions(), 2.0,
                                    host=host)

    started = time.monotonic()
    outcome = forked.call(run, 2.0)
    assert time.monotonic() - started < 20
    assert outcome.kind == forked.DONE, outcome.error
    rows = {r["check"]: r for r in outcome.value["results"]}
    assert rows["gpu.health"]["status"] == "error" and "timed out" in rows["gpu.health"]["summary"]
    assert rows["shm.size"]["status"] in ("ok", "warn", "fail")


def _complain_then_answer(send):
    try:
        os.write(2, b"a library's warning\n")  # fails: stderr is closed, and must not be our pipe
    except OSError:
        pass
    return "answer"


def test_the_answer_survives_a_child_that_writes_to_closed_stdio():
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    for fd in saved:
        os.close(fd)  # as when envdoctor is started with >&- 2>&-: os.pipe() would hand out 1 and 2
    try:
        outcome = forked.call(_complain_then_answer, 30)
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
    assert outcome.kind == forked.DONE and outcome.value == "answer", outcome


# ----------------------------------------------------------------------------- a launcher as the command
def test_launcher_ranks_reads_torchruns_nproc_per_node():
    ranks = exec_preflight.launcher_ranks
    assert ranks(["torchrun", "--nproc-per-node", "4", "train.py"]) == 4
    assert ranks(["/opt/venv/bin/torchrun", "--nnodes=2", "--nproc_per_node=8", "train.py", "--lr", "1"]) == 8
    assert ranks(["python3", "-m", "torch.distributed.run", "--nproc-per-node=2", "train.py"]) == 2
    assert ranks(["torchrun", "--nnodes", "1", "--standalone", "--nproc-per-node", "2", "train.py"]) == 2
    assert ranks(["torchrun", "--standalone", "train.py", "--nproc-per-node", "4"]) is None
    assert ranks(["torchrun", "--nproc-per-node", "gpu", "train.py"]) is None  # as many as GPUs: not counted here
    assert ranks(["torchrun", "train.py", "--nproc-per-node", "4"]) is None  # the script's own argument
    assert ranks(["python", "train.py", "--nproc-per-node", "4"]) is None
    assert ranks(["torchrun"]) is None and ranks([]) is None


def test_launcher_ranks_reads_nproc_per_node_as_torchrun_does(monkeypatch):
    """helper-71, each checked against torch 2.13's run.py and argparse_util.py: the last of
    repeated flags wins; an abbreviation argparse accepts; PET_NPROC_PER_NODE when no flag
    is given; `cpu` (and `auto` where no GPU can be counted) is the affinity mask's CPUs,
    torch._utils.cpu_count(); the interpreter's options before `-m`."""
    ranks = exec_preflight.launcher_ranks
    cpus = len(os.sched_getaffinity(0))
    assert ranks(["torchrun", "--nproc-per-node=4", "--nproc-per-node=1", "t.py"], {}) == 1
    assert ranks(["torchrun", "--nproc-per=3", "t.py"], {}) == 3
    assert ranks(["torchrun", "--nproc_per=3", "--stand", "t.py"], {}) == 3
    assert ranks(["torchrun", "--stand", "--nproc-per-node", "2", "t.py"], {}) == 2
    assert ranks(["torchrun", "t.py"], {"PET_NPROC_PER_NODE": "4"}) == 4
    assert ranks(["torchrun", "--nproc-per-node=2", "t.py"], {"PET_NPROC_PER_NODE": "4"}) == 2  # the flag first
    assert ranks(["torchrun", "--nproc-per-node=cpu", "t.py"], {}) == cpus
    assert ranks(["torchrun", "t.py"], {"PET_NPROC_PER_NODE": "cpu"}) == cpus
    assert ranks(["python", "-u", "-X", "dev", "-m", "torch.distributed.run", "--nproc-per-node=2", "t.py"], {}) == 2
    assert ranks(["python", "-c", "pass", "-m", "torch.distributed.run", "--nproc-per-node=2"], {}) is None
    assert ranks(["torchrun", "--nproc-per-node=0", "t.py"], {}) is None
    # helper-82: torchrun reads it with int(): a sign, digit groups, blanks around
    assert ranks(["torchrun", "--nproc-per-node", "+4", "t.py"], {}) == 4
    assert ranks(["torchrun", "--nproc-per-node=4_0", "t.py"], {}) == 40
    assert ranks(["torchrun", "--nproc-per-node=-2", "t.py"], {}) is None
    # helper-77: `--` ends torchrun's options; a short option's value in the same word; python's
    # options written together or with values before -m
    assert ranks(["torchrun", "--nproc-per-node=1", "--", "t.py", "--nproc-per-node", "5"], {}) == 1
    assert ranks(["torchrun", "-r3", "--nproc-per-node", "3", "t.py"], {}) == 3
    assert ranks(["torchrun", "-mr3", "--nproc-per-node", "3", "t.py"], {}) == 3
    for python in (["python", "-mtorch.distributed.run"], ["python", "-um", "torch.distributed.run"],
                   ["python", "--check-hash-based-pycs", "always", "-m", "torch.distributed.run"],
                   ["python", "-Wd", "-m", "torch.distributed.run"]):
        assert ranks([*python, "--nproc-per-node=2", "t.py"], {}) == 2, python
    assert ranks(["python", "t.py", "-m", "torch.distributed.run", "--nproc-per-node=2"], {}) is None
    assert exec_preflight.launcher_workers(["python3", "-m", "torch.distributed.run", "--nproc-per-node=2"], {})[1] == (
        "torchrun's --nproc-per-node")
    monkeypatch.setattr(exec_preflight, "_accelerator_possible", lambda env: False)
    assert ranks(["torchrun", "--nproc-per-node=auto", "t.py"], {}) == cpus
    monkeypatch.setattr(exec_preflight, "_accelerator_possible", lambda env: True)
    assert ranks(["torchrun", "--nproc-per-node=auto", "t.py"], {}) is None  # as many as GPUs
    assert exec_preflight.launcher_workers(["torchrun", "--nproc-per-node=cpu", "t.py"], {})[1] == (
        f"torchrun's --nproc-per-node=cpu ({cpus} CPUs of the affinity mask)")


def test_nproc_per_node_gpu_counts_the_gpus_cuda_will_see():
    """`--nproc-per-node=gpu` (and `auto` on a GPU node) starts torch.cuda.device_count()
    workers: counted from NVML's GPUs as CUDA_VISIBLE_DEVICES leaves them, so the thread
    budget is shared between them. Before, it was not counted, and the budget was the whole
    node's for each of 8 ranks."""
    from fake_pynvml import FakeDevice, FakeNvml

    fake = FakeNvml(devices=[FakeDevice() for _ in range(4)], driver="550.54.15", cuda=12040)
    uuid = fake.devices[2].uuid

    def workers(argv, env):
        return exec_preflight.launcher_workers(argv, env, gpus=lambda: exec_preflight.visible_gpus(env, fake))

    assert workers(["torchrun", "--nproc-per-node=gpu", "t.py"], {}) == (
        4, "torchrun's --nproc-per-node=gpu (4 GPUs CUDA sees here)")
    assert workers(["torchrun", "--nproc-per-node", "gpu", "t.py"], {"CUDA_VISIBLE_DEVICES": "2,3,1"})[0] == 3
    assert workers(["torchrun", "t.py"], {"PET_NPROC_PER_NODE": "gpu", "CUDA_VISIBLE_DEVICES": "0,9"})[0] == 1
    assert workers(["torchrun", "--nproc-per-node=gpu", "t.py"], {"CUDA_VISIBLE_DEVICES": uuid[:12]}) == (
        1, "torchrun's --nproc-per-node=gpu (1 GPU CUDA sees here)")
    for hidden in ("", "-1", "0,0"):  # torchrun refuses `gpu` with no GPU: nothing to share
        assert workers(["torchrun", "--nproc-per-node=gpu", "t.py"], {"CUDA_VISIBLE_DEVICES": hidden}) is None, hidden
    assert exec_preflight.launcher_workers(["torchrun", "--nproc-per-node=gpu", "t.py"], {}, gpus=lambda: None) is None
    assert exec_preflight.visible_gpus({}, FakeNvml(no_library=True)) is None  # no driver: not counted


def test_nproc_per_node_auto_on_a_gpu_node_counts_its_gpus(monkeypatch):
    monkeypatch.setattr(exec_preflight, "_accelerator_possible", lambda env: True)
    assert exec_preflight.launcher_workers(["torchrun", "--nproc-per-node=auto", "t.py"], {}, gpus=lambda: 2) == (
        2, "torchrun's --nproc-per-node=auto (2 GPUs CUDA sees here)")


def test_the_jobs_interpreter_is_the_one_whose_torch_is_judged(tmp_path):
    """`exec -- python train.py`: the torch facts are those of the python the command runs
    (found on the PATH the command gets), read from its files without importing it: a
    second venv with a stub torch 2.99.0+cu128 (whose import would fail) is reported."""
    import json
    import sys

    from test_torchfiles import make_venv, stub_torch

    python = make_venv(tmp_path)
    stub_torch(next((tmp_path / "venv" / "lib").glob("python3*/site-packages")))
    env = {"PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}"}
    assert exec_preflight.job_python(["python", "train.py"], env) == str(python)
    assert exec_preflight.job_python(["true"], env) is None
    assert exec_preflight.job_python(["python9.9-missing"], env) is None

    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--only", "torch.cudnn", "--report", str(report),
                           "--", "python", "-c", "pass"], env={**os.environ, **env, "ENVDOCTOR_NO_CACHE": "1",
                                                               "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(report.read_text())["results"]
    assert "torch 2.99.0+cu128" in row["summary"], row


def test_a_check_cut_short_by_execs_bound_names_execs_timeout_not_its_own():
    from envdoctor.check import Check
    from envdoctor.model import ok
    from envdoctor.runner import Plan

    check = Check(id="t.slow", title="t", run=lambda ctx: ok("x"))
    cut, kept = exec_preflight._clamped([Plan(check, {}, 15.0), Plan(check, {}, 1.0)], 2.06706)
    assert cut.timeout == 2.06706 and "exec's --timeout" in cut.raise_with
    assert kept.timeout == 1.0 and kept.raise_with == ""  # its own setting is what binds it


def test_a_launcher_script_is_judged_by_the_python_its_first_line_runs(tmp_path):
    """Helper-38: `exec -- torchrun ...` (accelerate, deepspeed: scripts pip wrote for the
    job's venv) judged envdoctor's own torch, not the job's."""
    import json
    import sys

    from test_torchfiles import make_venv, stub_torch

    python = make_venv(tmp_path)
    stub_torch(next((tmp_path / "venv" / "lib").glob("python3*/site-packages")))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {"torchrun": f"#!{python}\nimport sys\n",
               "accelerate": "#!/usr/bin/env -S python -u\n",
               "deepspeed": f"#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\n",
               "runner.sh": "#!/bin/sh\nexec python \"$@\"\n"}
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{python.parent}{os.pathsep}{os.environ['PATH']}"}
    for name in ("torchrun", "accelerate", "deepspeed"):
        assert exec_preflight.job_python([name, "--nproc-per-node=2", "train.py"], env) == str(python), name
    assert exec_preflight.job_python(["runner.sh"], env) is None  # a shell script: its python is unknown
    assert exec_preflight.job_python(["true"], env) is None  # a binary

    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--only", "torch.cudnn", "--report", str(report),
                           "--", "torchrun", "train.py"],
                          env={**os.environ, **env, "ENVDOCTOR_NO_CACHE": "1", "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"},
                          capture_output=True, text=True, timeout=120)
    assert "torch 2.99.0+cu128" in json.loads(report.read_text())["results"][0]["summary"], proc.stderr


def test_exec_reads_the_configs_python_as_check_does(tmp_path):
    """Helper-38: ENVDOCTOR_PYTHON (or `python` in the file) was ignored by exec, where
    `check` judged that interpreter's torch and refused one that does not exist."""
    import json
    import sys

    from test_torchfiles import make_venv, stub_torch

    python = make_venv(tmp_path)
    stub_torch(next((tmp_path / "venv" / "lib").glob("python3*/site-packages")))
    base = {**os.environ, "ENVDOCTOR_NO_CACHE": "1", "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
    base.pop("ENVDOCTOR_CONFIG", None)
    marker = tmp_path / "ran"
    missing = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--", "touch", str(marker)],
                             env={**base, "ENVDOCTOR_PYTHON": "/nonexistent/python"}, capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)
    assert missing.returncode == 2 and not marker.exists(), missing.stderr
    assert "bad config: environment: ENVDOCTOR_PYTHON: '/nonexistent/python': no such executable" in missing.stderr

    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--only", "torch.cudnn", "--report", str(report),
                           "--", "true"], env={**base, "ENVDOCTOR_PYTHON": str(python)}, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "torch 2.99.0+cu128" in json.loads(report.read_text())["results"][0]["summary"], proc.stderr


def test_ranks_from_the_launcher_are_said_to_come_from_it(tmp_path):
    """Helper-38: `exec -- torchrun --nproc-per-node=2 ...` said "2 processes per node
    (config processes_per_node)" with no config anywhere."""
    import json
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "torchrun").chmod(0o755)
    report = tmp_path / "r.json"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "64"}
    env.pop("ENVDOCTOR_CONFIG", None)
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--only", "cpu.threads", "--report", str(report),
                           "--", "torchrun", "--nproc-per-node=2", "train.py"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(report.read_text())["results"]
    assert "2 processes per node (torchrun's --nproc-per-node)" in row["summary"], row["summary"]


def test_a_probe_cut_short_in_exec_names_execs_timeout_not_the_probes_variable(tmp_path):
    """Helper-39: the row said 'raise the limit with --timeout or ENVDOCTOR_PROBE_TIMEOUT=SECONDS',
    and exec does not read that variable: the rewrite looked for other words."""
    import json
    import sys

    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "python3").write_text("#!/bin/sh\nexec sleep 60\n")
    (hang / "python3").chmod(0o755)
    report = tmp_path / "r.json"
    env = {**os.environ, "ENVDOCTOR_PYTHON": str(hang / "python3"), "ENVDOCTOR_NO_CACHE": "1",
           "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("ENVDOCTOR_CONFIG", None)
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "exec", "--timeout", "3", "--report", str(report), "--", "true"],
                          env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summaries = " ".join(r["summary"] for r in json.loads(report.read_text())["results"])
    assert "exec's --timeout bounds it" in summaries, summaries
    assert "ENVDOCTOR_PROBE_TIMEOUT" not in summaries + proc.stderr


def test_set_environ_sets_only_what_differs(monkeypatch):
    """glibc's putenv scans the whole environment, so setting every variable again made the
    pre-flight quadratic in the environment's size (helper-117: 28,000 variables took 4.8 s
    of the 5 s bound). Only a changed or new variable is set; a missing one is unset."""
    import os

    from envdoctor import exec_preflight

    monkeypatch.setenv("ENVDOCTOR_T_KEEP", "same")
    monkeypatch.setenv("ENVDOCTOR_T_CHANGE", "old")
    monkeypatch.setenv("ENVDOCTOR_T_GONE", "x")
    saved = dict(os.environ)
    wanted = {k: v for k, v in saved.items() if k != "ENVDOCTOR_T_GONE"}
    wanted.update(ENVDOCTOR_T_CHANGE="new", ENVDOCTOR_T_NEW="1")
    real_putenv, real_unsetenv = os.putenv, os.unsetenv
    put, unset = [], []
    name = os.fsdecode  # os.environ hands them over encoded
    monkeypatch.setattr(os, "putenv", lambda k, v: (put.append(name(k)), real_putenv(k, v)))
    monkeypatch.setattr(os, "unsetenv", lambda k: (unset.append(name(k)), real_unsetenv(k)))
    try:
        exec_preflight.set_environ(wanted)
        assert dict(os.environ) == wanted
        assert sorted(put) == ["ENVDOCTOR_T_CHANGE", "ENVDOCTOR_T_NEW"] and unset == ["ENVDOCTOR_T_GONE"]
    finally:
        monkeypatch.undo()
        os.environ.pop("ENVDOCTOR_T_NEW", None)


def test_an_environment_too_big_to_exec_says_its_size():
    """helper-117: near the kernel's limit, what --fix or --attach adds can tip execve over
    (E2BIG), and the line said only 'Argument list too long'. It now gives the size and
    the limits. One string over 128 KiB is refused whatever the stack limit."""
    import signal

    from envdoctor import become

    saved = {s: signal.getsignal(s) for s in (signal.SIGPIPE, signal.SIGXFSZ)}  # become() resets them for the job
    try:
        with pytest.raises(become.CannotRun) as refused:
            become.become("/bin/true", ["true"], {"BIG": "x" * 200_000})
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    assert refused.value.code == 126
    # "BIG=" + 200,000 + "\0"
    assert "Argument list too long (BIG is 200,005 bytes; the kernel takes no one string over 131,072)" in str(refused.value)
    many = {f"V{i:03d}": "x" * 100_000 for i in range(os.sysconf("SC_ARG_MAX") // 100_000 + 2)}
    try:
        with pytest.raises(become.CannotRun) as refused:
            become.become("/bin/true", ["true"], many)
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    assert f"with their pointers; the kernel takes {os.sysconf('SC_ARG_MAX'):,})" in str(refused.value), refused.value
