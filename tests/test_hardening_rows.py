"""Issue 8, family 5: misleading rows. Every row must say what really happened: a
plug-in that raises SystemExit is not a timeout, a broken probe does not make onnx.opset
an error, a huge CUDA_VISIBLE_DEVICES is judged (not timed out), a kernel thread or a
zombie is named as such, a corrupt NVML library is not "not found", GPUs whose NVML
reports nothing are not "healthy", a model without its external data is not "fine",
and a resolver that cannot answer now (EAI_AGAIN) is a warn like a resolver timeout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envdoctor import nvml
from envdoctor.check import Check
from envdoctor.context import Session, Target
from envdoctor.model import Status
from envdoctor.runner import Plan, run_one
from fake_pynvml import FakeDevice, FakeNvml
from helpers import cli

QUIET = {"ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}


# -- a check that raises what a check should never raise ------------------------------------------

class _Custom(BaseException):
    pass


RAISED = [SystemExit(3), SystemExit("bye"), KeyboardInterrupt(), GeneratorExit(), _Custom("odd"), RuntimeError("boom"),
          RecursionError("deep"), MemoryError(), StopIteration()]


@settings(max_examples=30, deadline=None)
@given(exc=st.sampled_from(RAISED), timeout=st.floats(0.5, 5))
def test_a_check_raising_any_base_exception_is_reported_as_that_exception(exc, timeout):
    def run(ctx):
        raise exc

    check = Check(id="plugin.raises", title="raises", run=run)
    row = run_one(Plan(check, {}, timeout), Session(env_override={}))
    assert row.status is Status.ERROR
    assert type(exc).__name__ in row.summary, row.summary
    assert "timed out" not in row.summary


def test_cli_plugin_raising_system_exit_or_keyboard_interrupt(tmp_path):
    """Over the CLI, as an installed plug-in: the run goes on, the row names the exception."""
    site = tmp_path / "site"
    (site / "exitplug-1.0.dist-info").mkdir(parents=True)
    (site / "exitplug.py").write_text(
        "from envdoctor.check import Check\n"
        "def _exit(ctx):\n    raise SystemExit(7)\n"
        "def _interrupt(ctx):\n    raise KeyboardInterrupt()\n"
        "EXIT = Check(id='exitplug.exit', title='exits', run=_exit)\n"
        "INTERRUPT = Check(id='exitplug.interrupt', title='interrupts', run=_interrupt)\n")
    (site / "exitplug-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: exitplug\nVersion: 1.0\n")
    (site / "exitplug-1.0.dist-info" / "entry_points.txt").write_text(
        "[envdoctor.checks]\nexitplug.exit = exitplug:EXIT\nexitplug.interrupt = exitplug:INTERRUPT\n")
    proc = cli("check", "--only", "exitplug.exit,exitplug.interrupt,shm.size", "-f", "json",
               env={"PYTHONPATH": str(site)})
    assert proc.returncode == 1, proc.stderr
    rows = {r["check"]: r for r in json.loads(proc.stdout)["results"]}
    assert "SystemExit" in rows["exitplug.exit"]["summary"] and "timed out" not in rows["exitplug.exit"]["summary"]
    assert "KeyboardInterrupt" in rows["exitplug.interrupt"]["summary"]
    assert rows["shm.size"]["status"] in ("ok", "warn", "fail")  # the others still ran


# -- a probe that fails costs only the torch part ------------------------------------------------

@pytest.mark.parametrize("script", ["exit 1", "echo 'ENVDOCTOR-PROBE-RESULT {not json' ; exit 0", "kill -SEGV $$",
                                    "sleep 60"])
def test_onnx_opset_still_judges_files_when_the_probe_fails(tmp_path, script):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Resize", ["x", "scales"], ["y"], mode="nearest")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)]), str(tmp_path / "old.onnx"))
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    proc = cli("check", "--only", "onnx.opset", "--onnx", str(tmp_path / "old.onnx"), "--python", str(fake),
               "--timeout", "8", "-f", "json", env={**QUIET, "ENVDOCTOR_NO_CACHE": "1"})
    row = json.loads(proc.stdout)["results"][0]
    assert row["status"] != "error", row["summary"]
    assert row["facts"]["torch_default_export_opset"] is None
    assert "torch" in row["facts"]["torch_default_export_opset_reason"]
    # the model itself was still judged
    assert [m["opsets"] for m in row["facts"]["models"]] == [{"ai.onnx": 10}], row["facts"]
    assert row["status"] in ("warn", "fail") and "Resize" in row["summary"]  # the model's own problem, found all the same


# -- CUDA_VISIBLE_DEVICES of any length is judged, not timed out ----------------------------------

@pytest.mark.parametrize("shape", ["distinct", "duplicate_last", "bad_last", "lenient", "uuids", "huge_index", "blank"])
def test_a_20000_entry_cuda_visible_devices_is_judged_within_the_timeout(shape):
    n = 20000
    value = {
        "distinct": ",".join(map(str, range(n))),
        "duplicate_last": ",".join(map(str, range(n))) + ",0",
        "bad_last": ",".join(map(str, range(n))) + ",x",
        "lenient": ",".join(f"{i}g" for i in range(n)),
        "uuids": ",".join(f"GPU-{i:x}" for i in range(12000)),  # 12,000: an execve argument is at most 128 KiB
        "huge_index": "9" * 5000 + "," + ",".join(map(str, range(n))),
        "blank": " ," * n,
    }[shape]
    proc = cli("check", "--only", "cuda.visible_devices", "--timeout", "10", "-f", "json",
               env={**QUIET, "CUDA_VISIBLE_DEVICES": value, "LOCAL_RANK": "9" * 5000})
    assert proc.returncode in (0, 1), proc.stderr
    row = json.loads(proc.stdout)["results"][0]
    assert row["status"] != "error", row["summary"][:300]


# -- a kernel thread or a zombie as --pid -------------------------------------------------------

def _kernel_thread() -> int | None:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[6]) & 0x00200000:
                return int(entry)
    return None


def test_kernel_thread_pid_is_named_as_such():
    pid = _kernel_thread()
    if pid is None:
        pytest.skip("no kernel thread visible in this PID namespace")
    proc = cli("check", "--pid", str(pid), env=QUIET)
    assert proc.returncode == 2 and "kernel thread" in proc.stderr and "exited" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1


def test_zombie_pid_is_named_as_such():
    parent = subprocess.Popen([sys.executable, "-c",
                               "import os, sys, time\npid = os.fork()\nif pid == 0:\n    os._exit(0)\n"
                               "print(pid, flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        zombie = int(parent.stdout.readline())
        for _ in range(100):  # until the child has exited (state Z)
            if Path(f"/proc/{zombie}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.02)
        proc = cli("check", "--pid", str(zombie), env=QUIET)
        assert proc.returncode == 2 and "zombie" in proc.stderr, proc.stderr
    finally:
        parent.kill()
        parent.wait()


def test_process_that_turns_zombie_mid_run_is_explained(tmp_path):
    """The same reason when the target dies between the start and a check's read (fixture procfs)."""
    from envdoctor.context import unavailable_from_oserror
    import errno

    procfs = tmp_path / "proc"
    (procfs / "77").mkdir(parents=True)
    (procfs / "77" / "stat").write_text("77 (train (gpu) job) Z 1 77 77 0 -1 4194380 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0\n")
    reason = unavailable_from_oserror(OSError(errno.ESRCH, "No such process"), Target(77), procfs / "77" / "environ")
    assert "zombie" in str(reason) and "train (gpu) job" in str(reason)
    (procfs / "77" / "stat").unlink()
    reason = unavailable_from_oserror(OSError(errno.ESRCH, "No such process"), Target(77), procfs / "77" / "environ")
    assert "exited" in str(reason)


# -- a corrupt NVML library ---------------------------------------------------------------------

@pytest.mark.parametrize("content", [b"", b"\x7fELF" + b"\x00" * 60, b"not a library at all\n", None])
def test_a_corrupt_libnvidia_ml_is_failed_to_load_not_not_found(tmp_path, content):
    # LD_LIBRARY_PATH is searched before the loader's cache: ours is found first, driver or not
    lib = tmp_path / "libnvidia-ml.so.1"
    if content is None:
        lib.symlink_to(tmp_path / "missing-target.so")  # a dangling link: that is "not found"
    else:
        lib.write_bytes(content)
    proc = cli("check", "--only", "gpu.health", "-f", "json", env={**QUIET, "LD_LIBRARY_PATH": str(tmp_path)})
    row = json.loads(proc.stdout)["results"][0]
    assert row["status"] == "skip"
    if content is None:
        assert "not found" in row["summary"]
    else:
        assert "failed to load" in row["summary"] and "not found" not in row["summary"], row["summary"]
        assert row["summary"].split("failed to load: ", 1)[1].strip()  # with the loader's own reason


# -- NVML that reports nothing is not "healthy" ----------------------------------------------------

HEALTH_FIELDS = ["ecc", "retired_pages", "remapped_rows", "throttle", "memory", "temperature", "power"]
CLAIMS = {"ecc": "no uncorrectable ECC errors", "retired_pages": "no pending page retirement",
          "remapped_rows": "no pending row remap", "throttle": "no throttling", "memory": "used by others"}


@settings(max_examples=60, deadline=None)
@given(per_gpu=st.lists(st.sets(st.sampled_from(HEALTH_FIELDS)), min_size=1, max_size=3),
       how=st.sampled_from(["unsupported", "error"]))
def test_gpu_health_claims_only_what_nvml_reported(per_gpu, how):
    import pynvml

    devices = []
    for i, missing in enumerate(per_gpu):
        kw = {"unsupported": set(missing)} if how == "unsupported" else {"errors": {f: pynvml.NVMLError_Unknown for f in missing}}
        devices.append(FakeDevice(uuid=f"GPU-{i:08d}", pci_bus_id=f"00000000:0{i}:00.0", **kw))
    fake = FakeNvml(devices=devices)
    from envdoctor.checks.gpu_health import CHECK

    try:
        row = run_one(Plan(CHECK, dict(CHECK.config), 10), Session(env_override={}, nvml_factory=lambda: nvml.connect(lib=fake, timeout=2)))
    finally:
        fake.release()
    blind = all({"ecc", "retired_pages", "remapped_rows", "throttle", "memory"} <= m for m in per_gpu)
    if blind:
        assert row.status is Status.SKIP and "not verified" in row.summary and "healthy" not in row.summary, row.summary
        return
    if row.status is Status.OK:
        for field, claim in CLAIMS.items():
            if claim in row.summary:
                assert any(field not in m for m in per_gpu), (claim, per_gpu, row.summary)
        if any(m & set(CLAIMS) for m in per_gpu):
            assert "not verified" in row.summary, row.summary


# -- an ONNX model whose external data is missing ---------------------------------------------------

@pytest.mark.parametrize("fault", ["missing", "short", "directory", "fifo", "none"])
def test_onnx_model_with_broken_external_data_is_not_fine(tmp_path, fault):
    onnx = pytest.importorskip("onnx")
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((32, 32), dtype=np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 32])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 32])], [weight])
    model = tmp_path / "model.onnx"
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8  # opset 17's; onnx's newest can be past what the installed onnxruntime loads (Python 3.10's)
    onnx.save_model(proto, str(model), save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    data = tmp_path / "weights.bin"
    if fault == "missing":
        data.unlink()
    elif fault == "short":
        data.write_bytes(data.read_bytes()[:100])
    elif fault == "directory":
        data.unlink()
        data.mkdir()
    elif fault == "fifo":
        data.unlink()
        os.mkfifo(data)
    proc = cli("check", "--only", "onnx.opset", "--onnx", str(model), "-f", "json", "--timeout", "20", env=QUIET)
    row = json.loads(proc.stdout)["results"][0]
    if fault == "none":
        assert row["status"] == "ok", row["summary"]
    else:
        assert row["status"] == "fail" and "weights.bin" in row["summary"], row["summary"]


# -- EAI_AGAIN is a warn like a timeout ------------------------------------------------------------

def test_resolver_that_cannot_answer_is_a_warn_not_a_fail(tmp_path):
    """Real EAI_AGAIN: a mount namespace whose resolv.conf names a port where nothing listens."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private /etc/resolv.conf")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions attempts:1 timeout:1\n")
    env = {**os.environ, **QUIET, "MASTER_ADDR": "rank0.envdoctor-test.invalid", "MASTER_PORT": "29500",
           "WORLD_SIZE": "2", "RANK": "1"}
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            f"mount --bind {resolv} /etc/resolv.conf && {sys.executable} -c "
                            "\"import socket\ntry: socket.getaddrinfo('rank0.envdoctor-test.invalid', 1)\n"
                            "except socket.gaierror as e: print(e.errno == socket.EAI_AGAIN)\""],
                           capture_output=True, text=True, timeout=60)
    if probe.stdout.strip() != "True":
        pytest.skip(f"this resolver does not answer EAI_AGAIN here ({probe.stdout!r} {probe.stderr[-200:]!r})")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind {resolv} /etc/resolv.conf && "
                           f"{sys.executable} -m envdoctor check --only dist.env -f json"],
                          capture_output=True, text=True, env=env, timeout=120)
    row = json.loads(proc.stdout)["results"][0]
    assert row["status"] == "warn", row["summary"]
    assert "could not be resolved now" in row["summary"]


def test_the_permission_hint_names_ptrace_only_when_it_is_missing(monkeypatch):
    """helper-120: root that holds CAP_SYS_PTRACE and is still refused (a process in a user
    namespace above ours, an LSM) was told it lacks CAP_SYS_PTRACE."""
    from envdoctor import context
    from envdoctor.context import Target

    monkeypatch.setattr(context.os, "geteuid", lambda: 0)
    monkeypatch.setattr(context, "_holds_capability", lambda bit: bit == context.CAP_SYS_PTRACE)
    held = context.permission_hint(Target(1))
    assert "holds CAP_SYS_PTRACE, yet the kernel refused it access to pid:1" in held and "lacks" not in held
    monkeypatch.setattr(context, "_holds_capability", lambda bit: False)
    assert "it lacks CAP_SYS_PTRACE" in context.permission_hint(Target(1))
    monkeypatch.undo()
    own = int(open("/proc/self/status").read().split("CapEff:")[1].split()[0], 16)
    assert context._holds_capability(context.CAP_SYS_PTRACE) == bool(own >> 19 & 1)
