"""A target's paths under the procfs root: kept from call to call, never mixed between roots."""

from __future__ import annotations

from pathlib import Path

from envdoctor.paths import Roots


def test_a_process_file_is_under_its_own_root_and_kept():
    host, container = Roots(), Roots(procfs=Path("/host/proc"))
    assert host.proc(None, "status") == Path("/proc/self/status")
    assert host.proc(42, "root", "usr/lib") == Path("/proc/42/root/usr/lib")
    assert container.proc(42, "root", "usr/lib") == Path("/host/proc/42/root/usr/lib")
    assert container.seen_by(42, "/etc/os-release") == Path("/host/proc/42/root/etc/os-release")
    assert Roots(procfs=Path("/host/proc")).proc(42, "environ") is container.proc(42, "environ")  # joined once


def test_a_file_is_read_whole_asking_64_kib_first_and_never_more_than_1_mib_at_once(tmp_path, monkeypatch):
    """os.read allocates what it asks for: a 1 MiB request for a 300-byte procfs file was
    an mmap, a page fault and a munmap in serve (which maps blocks over 128 KiB apart)."""
    import os

    from envdoctor import paths

    asked: list[int] = []
    real_read = os.read

    def read(fd: int, size: int) -> bytes:
        asked.append(size)
        return real_read(fd, size)

    monkeypatch.setattr(os, "read", read)
    small = tmp_path / "small"
    small.write_bytes(b"x" * 300)
    assert paths.read_bytes(small) == b"x" * 300
    assert asked == [1 << 16, 1 << 16]  # the file, then its end
    asked.clear()
    big = tmp_path / "big"
    big.write_bytes(bytes(range(256)) * 12_000)  # 3,072,000 bytes
    assert paths.read_bytes(big) == big.read_bytes()
    assert asked[:4] == [1 << 16, 1 << 16, 1 << 17, 1 << 18] and max(asked) == 1 << 20
    asked.clear()
    assert paths.read_head(big, 100_000) == big.read_bytes()[:100_000]
    assert asked == [1 << 16, 100_000 - (1 << 16)]
    assert paths.read_text("/proc/self/status").startswith("Name:")


def test_a_path_is_resolved_in_the_processes_own_root(tmp_path):
    """An absolute link inside another root leads within that root; through /proc/N/root
    the kernel would take it from ours (helper-107)."""
    from envdoctor.paths import Roots

    proc = tmp_path / "proc"
    root = tmp_path / "rootfs"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "root").symlink_to(root)
    (root / "dev" / "real").mkdir(parents=True)
    (root / "run").mkdir()
    (root / "dev" / "shm").symlink_to("/run/shm")
    (root / "run" / "shm").symlink_to("../dev/real")
    (root / "loop").symlink_to("/loop")
    roots = Roots(procfs=proc)
    assert roots.resolved_in(7, "/dev/shm") == "/dev/real"
    assert roots.resolved_in(7, "/dev/absent/x") == "/dev/absent/x"  # the kernel says what is missing
    assert roots.resolved_in(7, "/../../dev/./shm") == "/dev/real"  # ".." stops at its root
    assert roots.resolved_in(None, "/dev/shm") == "/dev/shm"  # our own: the kernel's to resolve
    try:
        roots.resolved_in(7, "/loop/x")
    except OSError as exc:
        assert exc.errno == __import__("errno").ELOOP
    else:
        raise AssertionError("a link to itself must end in ELOOP")
