"""Discovery of targets over the real /proc: selectors, bounds, kernel threads, zombies, containers."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from envdoctor.paths import Roots
from envdoctor.serve import discovery
from envdoctor.serve.metrics import label_value


def test_container_and_pod_from_cgroup_lines():
    cid = "a" * 64
    docker_v1 = f"12:cpu,cpuacct:/docker/{cid}\n0::/\n"
    assert discovery.container_of(docker_v1) == (cid, "")
    uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    k8s_v2 = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n"
    assert discovery.container_of(k8s_v2) == (cid, uid)
    assert discovery.container_of("0::/user.slice/user-0.slice/session-1.scope\n") == ("", "")


@pytest.mark.parametrize("line, pod", [
    ("0::/system.slice/docker-{cid}.scope/init", ""),  # systemd inside the container
    ("0::/machine.slice/libpod-{cid}.scope/container", ""),  # crun's subgroup
    ("0::/system.slice/nerdctl-{cid}.scope", ""),
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0123456789abcdef0123456789abcdef.slice/"
     "cri-containerd-{cid}.scope", "0123456789abcdef0123456789abcdef"),  # a static pod's hash
    ("0::/docker/{outer}/docker/{cid}", ""),  # a container in a container: the inner one
])
def test_container_ids_of_other_real_layouts(line, pod):
    """Helper-96: each lost its container id or pod uid."""
    cid, outer = "b" * 64, "c" * 64
    assert discovery.container_of(line.format(cid=cid, outer=outer) + "\n") == (cid, pod)


def test_label_values_are_bounded_names():
    assert label_value('py"thon\n{x}') == "py_thon__x_"
    assert len(label_value("x" * 500)) == 64


def _sleepers(n: int, tag: str) -> list[subprocess.Popen]:
    return [subprocess.Popen(["sleep", "60"], env={**os.environ, tag: "1"}) for _ in range(n)]


def test_selectors_bounds_and_exclusions():
    tag = f"ENVDOCTOR_DISCOVERY_{os.getpid()}"
    procs = _sleepers(3, tag)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"], env={**os.environ, tag: "1"})
    try:
        time.sleep(0.5)  # the zombie has exited and is not reaped yet
        found = discovery.discover(Roots(), max_targets=100, selectors=discovery.Selectors(env=(tag,)),
                                   announce_dirs=[], exclude=[procs[0].pid])
        pids = {t.pid for t in found.targets if t.pid is not None}
        assert found.targets[0].label == "node"
        assert {procs[1].pid, procs[2].pid} <= pids and procs[0].pid not in pids
        assert zombie.pid not in pids and 2 not in pids  # a zombie; kthreadd
        assert {t.source for t in found.targets if t.pid in (procs[1].pid, procs[2].pid)} == {"selector"}
        assert next(t for t in found.targets if t.pid == procs[1].pid).comm == "sleep"

        bounded = discovery.discover(Roots(), max_targets=2, selectors=discovery.Selectors(env=(tag,)), announce_dirs=[])
        assert len(bounded.targets) == 2 and bounded.overflow >= 2
        assert len(bounded.left_out) == bounded.overflow and not bounded.left_out & {t.label for t in bounded.targets}
    finally:
        for p in procs:
            p.kill()
            p.wait()
        zombie.wait()


def test_announced_and_nvml_sources(tmp_path):
    import json

    from envdoctor.announce import start_ticks

    mine = start_ticks("/proc", os.getpid())
    (tmp_path / f"{os.getpid()}.json").write_text(json.dumps({"pid": os.getpid(), "start_ticks": mine}))
    (tmp_path / "notapid.json").write_text("{}")
    (tmp_path / "999999999.json").write_text(json.dumps({"start_ticks": mine}))  # no such process: not a target
    # pid 1 under a start time it does not have: a number from another pid namespace, or a reused pid
    (tmp_path / "1.json").write_text(json.dumps({"pid": 1, "start_ticks": mine}))
    (tmp_path / f"{os.getppid()}.json").symlink_to(tmp_path / f"{os.getpid()}.json")  # a symlink is not followed
    found = discovery.discover(Roots(), max_targets=10, announce_dirs=[str(tmp_path)], nvml_pids=lambda: [])
    sources = {t.pid: t.source for t in found.targets}
    assert sources[os.getpid()] == "announced"
    assert 999999999 not in sources and sources.get(1) != "announced" and sources.get(os.getppid()) != "announced"
    found = discovery.discover(Roots(), max_targets=10, announce_dirs=[], nvml_pids=lambda: [1])
    assert {t.pid: t.source for t in found.targets}[1] == "nvml"


def test_a_nested_announcement_costs_only_itself_not_the_run(tmp_path):
    """helper-78: '[' * 1000 in a 1 KB announcement raised RecursionError out of discovery,
    and every run failed while the file was there (the directory is every user's to write)."""
    import json

    from envdoctor.announce import start_ticks

    (tmp_path / f"{os.getpid()}.json").write_text("[" * 1000)
    (tmp_path / f"{os.getppid()}.json").write_text(json.dumps({"start_ticks": start_ticks("/proc", os.getppid())}))
    found = discovery.discover(Roots(), max_targets=10, announce_dirs=[str(tmp_path)], nvml_pids=lambda: [])
    assert {t.pid: t.source for t in found.targets}.get(os.getppid()) == "announced"


def test_an_announcement_is_taken_only_from_the_processs_own_user_or_root(tmp_path):
    """helper-78: user nobody announced a root process, and serve published it in /metrics and
    /report (readable by any local user). An announcement's file must be the process's own
    user's, or root's."""
    import json
    import subprocess
    import sys

    from envdoctor.announce import start_ticks

    tmp_path.chmod(0o1777)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        doc = json.dumps({"pid": sleeper.pid, "start_ticks": start_ticks("/proc", sleeper.pid)})
        path = tmp_path / f"{sleeper.pid}.json"
        path.write_text(doc)
        os.chown(path, 65534, 65534)  # nobody's file, naming root's process
        found = discovery.discover(Roots(), max_targets=10, announce_dirs=[str(tmp_path)], nvml_pids=lambda: [])
        assert sleeper.pid not in {t.pid for t in found.targets}
        os.chown(path, os.getuid(), os.getgid())  # the process's own user
        found = discovery.discover(Roots(), max_targets=10, announce_dirs=[str(tmp_path)], nvml_pids=lambda: [])
        assert {t.pid: t.source for t in found.targets}.get(sleeper.pid) == "announced"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_announcements_for_pids_no_process_has_are_not_opened(tmp_path, monkeypatch):
    """helper-78: 50,000 files naming pids beyond pid_max were each opened and parsed every
    run (1.9-2.4 s a run). A name no live process has is passed over unopened."""
    from envdoctor import announce

    for pid in range(4_000_000, 4_000_200):
        (tmp_path / f"{pid}.json").write_text('{"start_ticks": 5}')
    opened = []
    monkeypatch.setattr(announce, "read_owned", lambda path: opened.append(path))
    assert announce.announced_pids([str(tmp_path)]) == [] and opened == []


def test_the_default_announce_directory_is_read_under_the_rootfs(tmp_path, monkeypatch):
    """serve in a DaemonSet sees the host at --path.rootfs; its own /run is a tmpfs of its
    container. The default directory was read at serve's own /run: no announcement found."""
    import json

    from envdoctor.announce import start_ticks

    monkeypatch.delenv("ENVDOCTOR_ANNOUNCE_DIR", raising=False)
    host = tmp_path / "host"
    attached = host / "run" / "envdoctor" / "attached"
    attached.mkdir(parents=True)
    (attached / f"{os.getpid()}.json").write_text(json.dumps({"pid": os.getpid(),
                                                              "start_ticks": start_ticks("/proc", os.getpid())}))
    found = discovery.discover(Roots(rootfs=host), max_targets=10, nvml_pids=lambda: [])
    assert {t.pid: t.source for t in found.targets}.get(os.getpid()) == "announced"


def test_attach_announces_itself_to_the_monitor_and_withdraws_at_exit(tmp_path):
    """A real job: attach() writes <pid>.json with its start time into the announce
    directory; discovery takes that pid; the file is gone when the job exits."""
    import subprocess
    import sys

    code = "import envdoctor, sys; envdoctor.attach(); print('up', flush=True); sys.stdin.readline()"
    job = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "ENVDOCTOR_ANNOUNCE_DIR": str(tmp_path)})
    try:
        assert job.stdout.readline().strip() == "up"
        assert (tmp_path / f"{job.pid}.json").exists()
        found = discovery.discover(Roots(), max_targets=50, announce_dirs=[str(tmp_path)], nvml_pids=lambda: [])
        assert {t.pid: t.source for t in found.targets}.get(job.pid) == "announced"
    finally:
        job.communicate("\n", timeout=30)
    assert not (tmp_path / f"{job.pid}.json").exists()


def test_a_broken_nvml_is_a_note_not_a_failure():
    def broken():
        raise RuntimeError("NVML Shared Library Not Found")

    found = discovery.discover(Roots(), max_targets=5, announce_dirs=[], nvml_pids=broken)
    assert found.targets[0].label == "node" and "NVML" in found.notes[0]


def test_an_empty_procfs_finds_only_the_node(tmp_path):
    found = discovery.discover(Roots(procfs=tmp_path), max_targets=5, announce_dirs=[])
    assert [t.label for t in found.targets] == ["node"]


def test_a_torch_process_keeps_its_torch_lines_and_they_give_the_whole_maps_facts():
    """Discovery reads every python process's maps to find torch; the lines naming a torch
    folder are kept for the run, so the torch facts do not read the whole maps again
    (a CUDA build maps 1,000-2,000 lines). They must give what the whole maps give."""
    import pytest

    pytest.importorskip("torch")
    from envdoctor import torchfacts

    proc = subprocess.Popen([sys.executable, "-c", "import torch, sys; print('up', flush=True); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        found = discovery.discover(Roots(), max_targets=1000, announce_dirs=[])
        mine = next(t for t in found.targets if t.pid == proc.pid)
        assert mine.source == "torch" and "libtorch" in mine.torch_maps
        assert len(mine.torch_maps) < len(open(f"/proc/{proc.pid}/maps").read()) / 2
        hinted = torchfacts.for_process(Roots(), proc.pid, {}, maps_hint=mine.torch_maps)
        assert hinted == torchfacts.for_process(Roots(), proc.pid, {})
        assert hinted["torch_imported"] is True and hinted["torch_files_replaced"] == []
        # a hint without torch's libraries is no answer: the whole maps is read
        assert torchfacts.for_process(Roots(), proc.pid, {}, maps_hint="garbage") == hinted
    finally:
        proc.kill()
        proc.wait()


OUT_OF_FILES = r'''
import json, os, resource, sys
from envdoctor.serve import Daemon, Options
daemon = Daemon(Options(once=True, config_file=None))
snap = daemon.scheduler.run_once()          # a run with descriptors to spare: processes are found
held = []
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))   # every descriptor this process may have
except OSError:
    pass
try:
    daemon.scheduler.run_once()
    outcome = "ran"
except Exception as exc:
    outcome = f"{type(exc).__name__}: {exc}"
code = daemon.run()                          # --once: the same, through the command's path
for fd in held:
    os.close(fd)
print(json.dumps({"before": len(snap.targets), "outcome": outcome, "code": code,
                  "after": len(daemon.scheduler.snapshot.targets)}))
'''


def test_a_run_out_of_descriptors_fails_and_says_so_instead_of_losing_every_process(tmp_path):
    """With every descriptor in use, /proc cannot be listed. That read as "no processes":
    every target logged as gone, and back a run later, with no error (helper-63). Now the
    run fails, says why and what to raise, and the last snapshot stands; --once exits 74."""
    keep = subprocess.Popen(["sleep", "60"])  # one process for certain, even on a quiet node
    try:
        out = subprocess.run([sys.executable, "-c", OUT_OF_FILES], capture_output=True, text=True, timeout=120,
                             cwd=tmp_path, env={**os.environ, "ENVDOCTOR_SERVE__SELECT_COMM": "sleep"})
    finally:
        keep.kill()
        keep.wait()
    assert out.returncode == 0, out.stderr
    result = __import__("json").loads(out.stdout)
    assert result["before"] >= 2
    assert result["outcome"].startswith("DiscoveryFailed: cannot list /proc: Too many open files"), result
    assert "LimitNOFILE=" in result["outcome"]
    assert result["code"] == 74 and result["after"] == result["before"]  # the last run's snapshot stands
    assert 'level=error msg="run failed"' in out.stderr and "Traceback" not in out.stderr
    assert "target gone" not in out.stderr


def test_a_selector_variable_past_the_first_mebibyte_of_the_environment_is_found(tmp_path):
    """helper-78: select_env read 1 MiB of /proc/N/environ while the checks read all of it; a
    job whose variable came after 1.3 MB of others was never examined."""
    import subprocess
    import sys

    tag = f"ENVDOCTOR_TAIL_{os.getpid()}"
    env = {f"PAD{i}": "p" * 120_000 for i in range(11)}
    env.update(PATH=os.environ.get("PATH", "/usr/bin:/bin"), **{tag: "1"})  # inserted last: it ends the block
    job = subprocess.Popen(["sleep", "120"], env=env)
    try:
        # Popen returns once the exec has begun; the new environment is readable a moment later
        import time

        deadline = time.monotonic() + 30
        while len(open(f"/proc/{job.pid}/environ", "rb").read()) <= 1 << 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(open(f"/proc/{job.pid}/environ", "rb").read()) > 1 << 20
        found = discovery.discover(Roots(), max_targets=50, selectors=discovery.Selectors(env=(tag,)), announce_dirs=[])
        assert {t.pid: t.source for t in found.targets}.get(job.pid) == "selector"
    finally:
        job.kill()
        job.wait()


def test_a_selector_variable_whose_name_is_not_utf8_selects_without_breaking_the_run():
    """helper-93: ENVDOCTOR_SERVE__SELECT_ENV=$'x\\xff' reached discovery as a surrogate-escaped
    str; encoding it raised, and every run of the daemon failed. Its bytes are the name."""
    import subprocess
    import time

    name = os.fsdecode(b"ENVDOCTOR_ODD_\xff_" + str(os.getpid()).encode())
    job = subprocess.Popen(["sleep", "120"], env={os.fsencode(name): b"1", b"PATH": os.environb.get(b"PATH", b"/usr/bin")})
    try:
        deadline = time.monotonic() + 30
        while os.fsencode(name) not in open(f"/proc/{job.pid}/environ", "rb").read() and time.monotonic() < deadline:
            time.sleep(0.01)
        found = discovery.discover(Roots(), max_targets=50, selectors=discovery.Selectors(env=(name,)), announce_dirs=[])
        assert {t.pid: t.source for t in found.targets}.get(job.pid) == "selector"
    finally:
        job.kill()
        job.wait()
