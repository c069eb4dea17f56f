"""serve remembers each torch process's maps lines between runs (envdoctor.serve.torchmaps)
and reads maps again exactly when they may have changed: another process image under the
pid, a torch file replaced on disk, or the recheck time passed."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from envdoctor.context import Session, Target
from envdoctor.paths import Roots
from envdoctor.serve import discovery
from envdoctor.serve.scheduler import _torch_from_files
from envdoctor.serve.torchmaps import TorchMaps
from envdoctor.torchfacts import copied
from helpers import cli
from test_torchfiles import arch_lib, start_holder, stub_torch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines_naming(path: Path, deleted: bool = False, inode: int | None = None) -> str:
    """A maps line for `path`, with the inode it has now (as when it was just mapped)."""
    inode = path.stat().st_ino if inode is None else inode
    return f"7f0000000000-7f0000001000 r-xp 00000000 08:01 {inode} {path}" + (" (deleted)" if deleted else "")


def test_lines_are_read_once_per_process_image_and_again_after_the_recheck_time(tmp_path):
    clock = Clock()
    memo = TorchMaps(recheck_seconds=120, clock=clock)
    reads: list[int] = []

    def read(text: str):
        return lambda: reads.append(1) or text

    first = memo.lines(7, (b"100", b"140733"), read("a"))
    assert memo.lines(7, (b"100", b"140733"), read("b")) is first == "a" and len(reads) == 1
    # the same pid, another process (a reused pid: another start time; an exec: another stack)
    assert memo.lines(7, (b"999", b"140733"), read("c")) == "c"
    assert memo.lines(7, (b"999", b"555"), read("d")) == "d" and len(reads) == 3
    clock.now += 119
    assert memo.lines(7, (b"999", b"555"), read("e")) == "d"
    clock.now += 2
    assert memo.lines(7, (b"999", b"555"), read("f")) == "f" and len(reads) == 4


def test_nothing_is_remembered_without_torch_or_where_an_exec_would_not_move_the_stack():
    memo = TorchMaps()
    reads: list[int] = []
    assert memo.lines(8, (b"1", b"2"), lambda: reads.append(1)) is None
    assert memo.lines(8, (b"1", b"2"), lambda: reads.append(1)) is None
    # stat shows a stack start of 0 without ptrace access: an exec could not be told apart
    memo.lines(9, (b"1", b"0"), lambda: reads.append(1) or "x")
    memo.lines(9, (b"1", b"0"), lambda: reads.append(1) or "x")
    # no address-space randomisation (setarch -R, randomize_va_space=0): the stack stays put
    memo.lines(10, (b"1", b"2"), lambda: reads.append(1) or "x", exec_visible=lambda: False)
    memo.lines(10, (b"1", b"2"), lambda: reads.append(1) or "x", exec_visible=lambda: False)
    assert len(reads) == 6 and len(memo) == 0


def remembered(tmp_path: Path) -> tuple[Path, TorchMaps, str]:
    """A torch library on disk and a memo holding maps lines that map it."""
    lib = tmp_path / "torch" / "lib" / "libtorch_python.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"old")
    memo = TorchMaps()
    return lib, memo, memo.lines(5, (b"1", b"2"), lambda: lines_naming(lib))


def test_a_replaced_torch_file_makes_the_remembered_lines_untrusted(tmp_path):
    lib, memo, lines = remembered(tmp_path)
    assert memo.confirmed(5, lines, Path) and memo.confirmed(5, lines, Path)
    new = tmp_path / "new.so"
    new.write_bytes(b"new")
    os.replace(new, lib)  # what pip does
    assert not memo.confirmed(5, lines, Path)
    assert len(memo) == 0  # forgotten: the next run reads maps again
    again = memo.lines(5, (b"1", b"2"), lambda: lines_naming(lib, deleted=True, inode=1))
    assert "(deleted)" in again and memo.confirmed(5, again, Path)
    # lines the caller read itself are not judged
    assert memo.confirmed(5, "read elsewhere", Path)


def test_a_file_replaced_between_the_read_and_the_first_check_is_caught(tmp_path):
    """helper-30: the first check recorded the files as it found them, so a pip install
    landing between discovery's read and the torch facts became the reference, and was
    trusted for 120 s. The maps line's own inode is the reference now."""
    lib, memo, lines = remembered(tmp_path)
    new = tmp_path / "new.so"
    new.write_bytes(b"new")
    os.replace(new, lib)
    assert not memo.confirmed(5, lines, Path)


def test_a_removed_torch_file_is_a_change_too(tmp_path):
    lib, memo, lines = remembered(tmp_path)
    assert memo.confirmed(5, lines, Path)
    lib.unlink()
    assert not memo.confirmed(5, lines, Path)


def test_torch_facts_are_worked_out_once_per_reading_of_the_lines_and_handed_out_as_copies():
    memo = TorchMaps()
    lines = memo.lines(5, (b"1", b"2"), lambda: "".join(["torch ", "lines"]))
    calls: list[int] = []

    def work_out() -> dict:
        calls.append(1)
        return {"torch_version": "2.13.0", "warnings": []}

    def same(facts: dict) -> int:
        return 1  # the files the facts come from, unchanged

    first = memo.facts(5, lines, work_out, copied, same)
    first["warnings"].append("a caller's change")
    assert memo.facts(5, lines, work_out, copied, same) == {"torch_version": "2.13.0", "warnings": []}
    assert len(calls) == 1
    # lines the caller read itself this run (not the memo's): worked out every time, not kept
    assert memo.facts(5, "read elsewhere", work_out, copied, same)["torch_version"] == "2.13.0"
    assert memo.facts(5, "read elsewhere", work_out, copied, same) and len(calls) == 3

    # a failure is the caller's, and nothing is kept: the next run works them out again
    def broken() -> dict:
        calls.append(1)
        raise OSError("gone")

    other = memo.lines(6, (b"1", b"2"), lambda: "".join(["other ", "lines"]))
    with pytest.raises(OSError):
        memo.facts(6, other, broken, copied, same)
    assert memo.facts(6, other, work_out, copied, same) and len(calls) == 5
    # lines read again (another image, the recheck time, a replaced file): worked out afresh
    again = memo.lines(5, (b"7", b"2"), lambda: "".join(["torch ", "lines"]))
    assert again is not lines
    memo.facts(5, again, work_out, copied, same)
    assert len(calls) == 6
    # the files they come from that are not mapped changed (a pip install beside torch)
    stamp = [1]
    memo.facts(5, again, work_out, copied, lambda facts: stamp[0])
    assert len(calls) == 6
    stamp[0] = 2
    memo.facts(5, again, work_out, copied, lambda facts: stamp[0])
    memo.facts(5, again, work_out, copied, lambda facts: stamp[0])
    assert len(calls) == 7


def test_processes_that_are_gone_are_forgotten():
    memo = TorchMaps()
    for pid in (1, 2, 3):
        memo.lines(pid, (b"1", b"2"), lambda: "x")
    memo.keep_only({2})
    assert len(memo) == 1


@pytest.mark.real
def test_serve_reads_a_torch_process_maps_once_and_again_when_its_torch_is_replaced(tmp_path, monkeypatch):
    """A real process with (stub) libtorch mapped: the second run reuses the lines the first
    read; a `pip install` over it makes the torch facts read maps again and say so."""
    site = tmp_path / "site"
    pkg = stub_torch(site)
    lib = Path(shutil.copy(arch_lib(tmp_path), pkg / "lib" / "libtorch_python.so"))
    holder = start_holder(sys.executable, lib, site)
    memo = TorchMaps()

    def run() -> tuple[str, dict]:
        found = discovery.discover(Roots(), max_targets=1000, announce_dirs=[], nvml_pids=lambda: [],
                                   torch_maps_memo=memo)
        mine = next(t for t in found.targets if t.pid == holder.pid)
        assert mine.source == "torch"
        return mine.torch_maps, _torch_from_files(Session(target=Target(holder.pid)), mine.torch_maps, memo)

    import envdoctor.torchfacts as torchfacts

    worked_out: list[int] = []
    for_process = torchfacts.for_process

    def counted(*args, **kwargs):
        worked_out.append(1)
        return for_process(*args, **kwargs)

    monkeypatch.setattr(torchfacts, "for_process", counted)
    try:
        first_lines, first = run()
        second_lines, second = run()
        assert second_lines is first_lines  # not read again
        assert first["torch_files_replaced"] == second["torch_files_replaced"] == []
        assert second == first and len(worked_out) == 1  # nor the facts those lines gave
        replacement = tmp_path / "new.so"
        replacement.write_bytes(lib.read_bytes())
        os.replace(replacement, lib)
        stale_lines, facts = run()
        assert stale_lines is first_lines and "(deleted)" not in stale_lines  # the memo's, checked by the facts
        assert facts["torch_files_replaced"] == [str(lib)] and len(worked_out) == 2
        fresh_lines, again = run()
        assert fresh_lines is not first_lines and "(deleted)" in fresh_lines
        assert again["torch_files_replaced"] == [str(lib)]
        # and a user sees it: cuda.runtime says so (it was only in the facts' warnings)
        proc = cli("check", "--pid", str(holder.pid), "--only", "cuda.runtime", "-f", "json")
        [row] = json.loads(proc.stdout)["results"]
        assert row["status"] == "warn" and "replaced on disk" in row["summary"], row
        assert "libtorch_python.so" in row["summary"] and "restart the job" in row["remediation"]
    finally:
        holder.kill()
        holder.wait()
    run_after = discovery.discover(Roots(), max_targets=1000, announce_dirs=[], nvml_pids=lambda: [],
                                   torch_maps_memo=memo)
    assert holder.pid not in {t.pid for t in run_after.targets}


@pytest.mark.real
def test_a_pip_install_beside_a_running_jobs_torch_is_seen_at_the_next_run(tmp_path):
    """The kept facts are checked against the files they come from that the process does
    not map: a cuDNN wheel upgraded next to torch, a venv made of its prefix (helper-62:
    both were seen up to 120 s late)."""
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    pkg = stub_torch(site)
    lib = Path(shutil.copy(arch_lib(tmp_path), pkg / "lib" / "libtorch_python.so"))

    def cudnn(version: str) -> None:
        for old in site.glob("nvidia_cudnn_cu12-*.dist-info"):
            shutil.rmtree(old)
        info = site / f"nvidia_cudnn_cu12-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia-cudnn-cu12\nVersion: {version}\n")

    cudnn("9.1.0.70")
    holder = start_holder(sys.executable, lib, site)
    memo = TorchMaps()

    def run() -> dict:
        found = discovery.discover(Roots(), max_targets=1000, announce_dirs=[], nvml_pids=lambda: [],
                                   torch_maps_memo=memo)
        mine = next(t for t in found.targets if t.pid == holder.pid)
        return _torch_from_files(Session(target=Target(holder.pid)), mine.torch_maps, memo)

    try:
        first = run()
        assert first["cudnn_version"] == 90100 and first["venv"] is None
        assert run()["cudnn_version"] == 90100
        cudnn("9.8.0.87")
        assert run()["cudnn_version"] == 90800
        (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
        assert run()["venv"] == str(tmp_path / "venv")
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.real
@pytest.mark.skipif(shutil.which("setarch") is None, reason="needs util-linux's setarch")
def test_a_process_without_address_randomisation_has_its_maps_read_every_run(tmp_path):
    """Under setarch -R an exec leaves the stack where it was: a job that re-executes
    itself without torch kept its old torch facts (helper-30). Its maps is not remembered."""
    site = tmp_path / "site"
    pkg = stub_torch(site)
    lib = Path(shutil.copy(arch_lib(tmp_path), pkg / "lib" / "libtorch_python.so"))
    holder = start_holder(sys.executable, lib, site, prefix=["setarch", "-R"])
    memo = TorchMaps()
    try:
        seen = []
        for _ in range(2):
            found = discovery.discover(Roots(), max_targets=1000, announce_dirs=[], nvml_pids=lambda: [],
                                       torch_maps_memo=memo)
            seen.append(next(t for t in found.targets if t.pid == holder.pid).torch_maps)
        assert seen[0] == seen[1] and seen[0] is not seen[1]  # read twice
        assert holder.pid not in memo._entries
    finally:
        holder.kill()
        holder.wait()


def _no_torch(searched: tuple[str, ...], calls: list[int]):
    from envdoctor.torchfacts import NoTorch

    def work_out():
        calls.append(1)
        raise NoTorch("no torch in pid:7", searched)
    return work_out


def test_no_torch_is_remembered_per_process_image_while_the_directories_searched_are_unchanged(tmp_path):
    """A process with no torch was searched for one (its maps, PATH, its interpreter's site
    directories) every run: a quarter of a run's CPU over 64 such processes. The answer is
    kept for its process image, while the directories searched are as they were, and
    until the recheck time; a torch found ends it."""
    from envdoctor.torchfacts import NoTorch, searched_key

    site = tmp_path / "site"
    site.mkdir()
    clock = Clock()
    memo = TorchMaps(recheck_seconds=120, clock=clock)
    calls: list[int] = []
    image = (b"100", b"140733")

    def ask(identity=image, work_out=None, visible=True):
        try:
            return memo.absent(7, identity, work_out or _no_torch((str(site),), calls),
                               lambda searched: searched_key(searched, Path), lambda: visible)
        except NoTorch as exc:
            return exc

    first = ask()
    assert isinstance(first, NoTorch) and str(first) == "no torch in pid:7" and len(calls) == 1
    again = ask()
    assert isinstance(again, NoTorch) and str(again) == str(first) and again.searched == (str(site),)
    assert len(calls) == 1  # not searched again
    assert isinstance(ask((b"999", b"140733")), NoTorch) and len(calls) == 2  # a reused pid
    assert isinstance(ask((b"999", b"555")), NoTorch) and len(calls) == 3  # an exec
    ask((b"999", b"555"))
    assert len(calls) == 3
    (site / "torch").mkdir()  # a torch folder without its version.py is no torch to import
    ask((b"999", b"555"))
    assert len(calls) == 3
    (site / "torch" / "version.py").write_text("__version__ = '2.13.0'\n")  # now it is (helper-106)
    ask((b"999", b"555"))
    assert len(calls) == 4
    ask((b"999", b"555"))
    clock.now += 119
    ask((b"999", b"555"))
    assert len(calls) == 4
    clock.now += 2
    ask((b"999", b"555"))
    assert len(calls) == 5
    # an exec into a python that finds torch: its facts are the answer, and no "no torch" is kept
    assert ask((b"999", b"777"), work_out=lambda: {"torch_version": "2.13.0"}) == {"torch_version": "2.13.0"}
    ask((b"999", b"777"))
    assert len(calls) == 6


def test_no_torch_is_not_kept_where_an_exec_would_not_be_seen_or_for_a_process_gone(tmp_path):
    from envdoctor.torchfacts import NoTorch

    memo = TorchMaps()
    calls: list[int] = []
    for identity, visible in (((b"100", b"140733"), False), ((b"100", b"0"), True), ((b"", b""), True)):
        for _ in range(2):
            with pytest.raises(NoTorch):
                memo.absent(7, identity, _no_torch((), calls), lambda searched: (), lambda: visible)
    assert len(calls) == 6
    with pytest.raises(NoTorch):
        memo.absent(8, (b"1", b"2"), _no_torch((), calls), lambda searched: (), lambda: True)
    memo.keep_only({9})
    with pytest.raises(NoTorch):
        memo.absent(8, (b"1", b"2"), _no_torch((), calls), lambda searched: (), lambda: True)
    assert len(calls) == 8


@pytest.mark.real
def test_serve_searches_a_process_without_torch_once_and_sees_a_torch_installed_where_it_would_import_one(
        tmp_path, monkeypatch):
    """A real process (a `sleep` whose PYTHONPATH names a directory): the first run searches
    it for torch, the next ones say the same without searching, and a torch put in that
    directory is seen at the next run."""
    import subprocess

    import envdoctor.torchfacts as torchfacts
    from envdoctor.errors import Unavailable

    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)  # a folder without version.py: no torch yet (helper-106)
    sleeper = subprocess.Popen(["sleep", "300"], env={**os.environ, "PYTHONPATH": str(site)})
    memo = TorchMaps()
    searched: list[int] = []
    for_process = torchfacts.for_process
    monkeypatch.setattr(torchfacts, "for_process", lambda *a, **k: searched.append(1) or for_process(*a, **k))

    def run():
        image = discovery._is_workload(Path("/proc"), sleeper.pid)[2]
        try:
            return _torch_from_files(Session(target=Target(sleeper.pid)), "", memo, image)
        except Unavailable as exc:
            return exc

    # Popen returns once the exec has closed its error pipe, which the kernel does before it
    # sets up the new stack: read in between, stat's stack start is 0, and rightly nothing is
    # kept for that image (the full suite's load caught the first run there once)
    deadline = time.monotonic() + 10
    while discovery._is_workload(Path("/proc"), sleeper.pid)[2][1] in (b"", b"0") and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        first, second = run(), run()
        assert isinstance(first, torchfacts.NoTorch) and f"no torch in pid:{sleeper.pid}" in str(first)
        assert str(site) in first.searched
        assert isinstance(second, torchfacts.NoTorch) and str(second) == str(first) and len(searched) == 1
        stub_torch(site)
        facts = run()
        assert isinstance(facts, dict) and facts["torch_version"] == "2.99.0+cu128", facts
        assert facts["torch_dir"] == str(site / "torch") and facts["torch_imported"] is False
        assert len(searched) == 2
    finally:
        sleeper.kill()
        sleeper.wait()


def _remember(memo: TorchMaps, pid: int, libs: list[Path]) -> str:
    return memo.lines(pid, (b"1", str(pid).encode()), lambda: "\n".join(lines_naming(lib) for lib in libs))


def test_processes_with_one_view_share_a_runs_stat_of_each_torch_file(tmp_path, monkeypatch):
    """A CUDA build maps ~30 torch files: each was stat'ed for every process of a job every
    run. Processes that see the same files (the same view) share one stat of each a run;
    another view, and each new run, stats again, so a replaced file is still caught."""
    import envdoctor.serve.torchmaps as torchmaps

    libs = []
    for name in ("libtorch_python.so", "libtorch_cpu.so", "libc10.so", "libtorch.so"):
        lib = tmp_path / "torch" / "lib" / name
        lib.parent.mkdir(parents=True, exist_ok=True)
        lib.write_bytes(name.encode())
        libs.append(lib)
    stats: list[str] = []
    inode = torchmaps._inode
    monkeypatch.setattr(torchmaps, "_inode", lambda path: stats.append(str(path)) or inode(path))
    memo = TorchMaps()
    views = {5: "job-a", 6: "job-a", 7: "job-a", 8: "job-b", 9: None}  # 9: a view that could not be read
    lines = {pid: _remember(memo, pid, libs) for pid in views}

    def one_run() -> list[bool]:
        memo.new_run()
        stats.clear()
        return [memo.confirmed(pid, lines[pid], Path, lambda pid=pid: views[pid]) for pid in views]

    assert one_run() == [True] * 5
    assert sorted(stats) == sorted(str(lib) for lib in libs * 3)  # job-a once, job-b once, 9 on its own
    assert one_run() == [True] * 5 and len(stats) == 12  # a new run looks again
    new = tmp_path / "new.so"
    new.write_bytes(b"new")
    os.replace(new, libs[2])  # pip installs over the running jobs
    assert one_run() == [False] * 5  # every process's lines are forgotten, whatever its view


def test_a_view_is_asked_for_only_where_more_than_two_files_are_mapped(tmp_path):
    lib = tmp_path / "torch" / "lib" / "libtorch_python.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"x")
    memo = TorchMaps()
    lines = _remember(memo, 5, [lib])
    asked: list[int] = []
    assert memo.confirmed(5, lines, Path, lambda: asked.append(1) or "job-a")
    assert asked == [] and memo.stats == 1


def _holder_mapping(libs: list[Path], prefix: list[str] | None = None) -> "subprocess.Popen[str]":
    """A python process that maps each of `libs` (as a loaded library is mapped), then waits."""
    import subprocess

    code = ("import mmap, sys, time\nkeep = []\n"
            f"for p in {[str(lib) for lib in libs]!r}:\n"
            "    f = open(p, 'rb'); keep.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))\n"
            "print('ready', flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([*(prefix or []), sys.executable, "-S", "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"holder did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc


def test_serve_stats_a_jobs_torch_files_once_a_run_and_a_private_namespaces_apart(tmp_path, monkeypatch):
    """Real processes: three in this mount namespace share one stat of each torch file a run;
    one in a private mount namespace (a container) has its own view, stat'ed apart."""
    import shutil

    import envdoctor.serve.torchmaps as torchmaps

    site = tmp_path / "site"
    pkg = stub_torch(site)
    libs = [Path(shutil.copy(arch_lib(tmp_path), pkg / "lib" / name))
            for name in ("libtorch_python.so", "libtorch_cpu.so", "libc10.so")]
    private = os.geteuid() == 0 and shutil.which("unshare") is not None
    holders = [_holder_mapping(libs) for _ in range(3)]
    if private:
        holders.append(_holder_mapping(libs, prefix=["unshare", "-m", "--propagation", "private"]))
    stats: list[str] = []
    inode = torchmaps._inode
    monkeypatch.setattr(torchmaps, "_inode", lambda path: stats.append(str(path)) or inode(path))
    memo = TorchMaps()
    roots = Roots()
    try:
        views = {roots.file_view(h.pid) for h in holders}
        assert len(views) == (2 if private else 1) and None not in views
        for _ in range(2):
            memo.new_run()
            stats.clear()
            found = discovery.discover(roots, max_targets=1000, announce_dirs=[], nvml_pids=lambda: [],
                                       torch_maps_memo=memo)
            mine = {t.pid: t for t in found.targets if t.pid in {h.pid for h in holders}}
            assert len(mine) == len(holders) and all(t.source == "torch" for t in mine.values())
            for pid, target in mine.items():
                facts = _torch_from_files(Session(target=Target(pid)), target.torch_maps, memo)
                assert facts["torch_files_replaced"] == []
            assert len(stats) == len(libs) * len(views), stats  # was len(libs) * len(holders)
    finally:
        for h in holders:
            h.kill()
            h.wait()


def test_jails_whose_roots_are_bind_mounts_of_one_directory_have_views_of_their_own(tmp_path):
    """helper-111: two chroot jails in one mount namespace, each root a bind mount of /, have
    the same root inode. With its own mount at the torch path in each, one path named two
    files, and the stat shared with one jail confirmed the other's replaced file for 120 s.
    The root's mount id tells them apart; processes of one jail still share."""
    import shutil
    import signal
    import subprocess

    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("chroot") is None:
        pytest.skip("needs root, unshare(1) and chroot(8) for jails in a private mount namespace")
    script = (f"for j in a b; do mkdir -p {tmp_path}/$j && mount --rbind / {tmp_path}/$j || exit 9; done\n"
              f"for j in a a b; do chroot {tmp_path}/$j sleep 60 & echo $!; done\nwait\n")
    jails = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        pids = [int(jails.stdout.readline()) for _ in range(3)]
        deadline = time.monotonic() + 10  # until each has chroot'ed and exec'd sleep
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}/comm").read_text().strip() != "sleep" for pid in pids):
            time.sleep(0.05)
        roots = Roots()
        same_root = {(s.st_dev, s.st_ino) for s in (os.stat(f"/proc/{pid}/root") for pid in pids)}
        assert len(same_root) == 1  # the case is real only while their roots are one inode
        a1, a2, b = (roots.file_view(pid) for pid in pids)
        assert a1 is not None and a1 == a2 != b, (a1, a2, b)
        assert a1[0] == b[0]  # one mount namespace
    finally:
        os.killpg(jails.pid, signal.SIGKILL)
        jails.wait()


JAILED_READER = r"""
import json, os, subprocess, sys
from envdoctor.context import Session, Target
from envdoctor.paths import Roots
from envdoctor.serve import discovery
from envdoctor.serve.scheduler import _torch_from_files
from envdoctor.serve.torchmaps import TorchMaps
pid, lib = int(sys.argv[1]), sys.argv[2]
memo, roots, runs, lines = TorchMaps(), Roots(), [], [None]
def run():
    memo.new_run()
    found = discovery.discover(roots, max_targets=1000, announce_dirs=[], nvml_pids=lambda: [], torch_maps_memo=memo)
    target = next(t for t in found.targets if t.pid == pid)
    facts = _torch_from_files(Session(target=Target(pid)), target.torch_maps, memo)
    runs.append({"version": facts["torch_version"], "replaced": facts["torch_files_replaced"],
                 "kept": target.torch_maps is lines[0]})  # the lines of the run before: maps not read again
    lines[0] = target.torch_maps
check = subprocess.run([sys.executable, "-m", "envdoctor", "check", "--pid", str(pid), "--only", "cuda.runtime",
                        "-f", "json"], capture_output=True, text=True, timeout=120)
run(); run()
new = lib + ".new"  # pip installs over the jailed job
with open(lib, "rb") as old, open(new, "wb") as out:
    out.write(old.read())
os.replace(new, lib)
run(); run()
from envdoctor.sysfacts import _target_interpreter  # the header's interpreter where no torch facts name it
print(json.dumps({"runs": runs, "check": json.loads(check.stdout)["results"][0],
                  "python": _target_interpreter(Session(target=Target(pid)))[0], "jail": roots.printed_root(pid)}))
"""


def test_a_job_chrooted_in_our_mount_namespace_has_its_torch_read_where_it_is(tmp_path):
    """helper-111: the kernel prints a jailed process's maps with the jail in front
    (/jail/usr/lib/...), which through /proc/N/root (the jail) names nothing: `check --pid`
    called its torch a broken install ("no readable version.py") and serve read its maps
    every run. Taken off, its torch is read, remembered, and a replaced file is caught."""
    import shutil
    import signal
    import subprocess

    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("chroot") is None:
        pytest.skip("needs root, unshare(1) and chroot(8) for a jail in a private mount namespace")
    pkg = stub_torch(tmp_path / "site")
    libs = [Path(shutil.copy(arch_lib(tmp_path), pkg / "lib" / name))
            for name in ("libtorch_python.so", "libtorch_cpu.so", "libc10.so")]
    ready = tmp_path / "ready"
    holder = ("import mmap, sys, time\nkeep = []\n"
              f"for p in {[str(lib) for lib in libs]!r}:\n"
              "    f = open(p, 'rb'); keep.append(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))\n"
              f"open({str(ready)!r}, 'w').close()\ntime.sleep(60)\n")
    jail = tmp_path / "jail"
    jail.mkdir()
    script = (f'mount --rbind / {jail} || exit 9\nchroot {jail} {sys.executable} -S -c "$0" & H=$!\n'
              f'for i in $(seq 200); do [ -e {ready} ] && break; sleep 0.05; done\n'
              f'cd {Path(__file__).parent.parent} && {sys.executable} -c "$1" $H {libs[1]}\nkill $H\n')
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, holder, JAILED_READER],
                         capture_output=True, text=True, timeout=180, start_new_session=True)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    seen = json.loads(out.stdout)
    assert seen["jail"] == str(jail)  # the case is real only while the kernel prints the jail in front
    first, second, replaced, after = seen["runs"]
    assert first["version"] == second["version"] == "2.99.0+cu128"
    assert first["replaced"] == second["replaced"] == [] and second["kept"]  # its maps remembered
    assert replaced["replaced"] == after["replaced"] == [str(libs[1])]  # named as the job names it
    row = seen["check"]
    assert row["status"] != "error" and "2.99.0+cu128" in row["summary"], row
    assert seen["python"] == os.path.realpath(sys.executable)  # its interpreter as it names it, no jail in front
