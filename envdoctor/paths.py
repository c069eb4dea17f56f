"""Where the proc, sys and root file systems are, and a target's paths under them.

node_exporter's lesson: no reader writes a literal "/proc". Everything asks for
the procfs/sysfs/rootfs roots (`--path.procfs`, `--path.sysfs`, `--path.rootfs`),
which is how the same code runs in a container against the host (`/host/proc`),
against another process through `/proc/N/root`, and against fixture trees in tests.
This module is the bottom layer: parsers import it, it imports nothing of ours.
"""

from __future__ import annotations

import functools
from pathlib import Path

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any

from envdoctor.record import Value


class Roots(Value):
    """Where the proc, sys and root file systems are mounted (node_exporter's --path.*)."""

    def __init__(
        self,
        procfs: Path = Path("/proc"),
        sysfs: Path = Path("/sys"),
        rootfs: Path = Path("/"),
    ) -> None:
        self.procfs = procfs
        self.sysfs = sysfs
        self.rootfs = rootfs

    def proc(self, pid: int | None, *parts: str) -> Path:
        """A file of a process under procfs: /proc/self/... (pid None) or /proc/N/..."""
        return _proc_path(self.procfs, pid, parts)

    def resolved_in(self, pid: int | None, path: str, max_links: int = 40) -> str:
        """`path` (absolute) with its symlinks resolved as process `pid` resolves them: in
        its own root. Through /proc/N/root the kernel resolves an absolute link from our
        root instead, so a /dev/shm that links to /run/shm (as older Debian images have
        it) was looked for on the host, and said not to exist (helper-107). Our own paths
        (pid None) are the kernel's to resolve. A component that is no link (or cannot be
        read) is kept as it is; more than `max_links` links is ELOOP, as for the kernel."""
        if pid is None:
            return path
        import errno
        import os

        root = str(self.proc(pid, "root"))
        todo = [p for p in path.split("/") if p]
        done: list[str] = []
        while todo:
            part = todo.pop(0)
            if part == ".":
                continue
            if part == "..":
                if done:  # at the root, ".." is the root
                    done.pop()
                continue
            try:
                link = os.readlink(f"{root}/{'/'.join([*done, part])}")
            except OSError:  # not a link, absent or not ours to read: the kernel says which later
                done.append(part)
                continue
            max_links -= 1
            if max_links < 0:
                raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
            if link.startswith("/"):
                done = []
            todo[:0] = [p for p in link.split("/") if p]
        return "/" + "/".join(done)

    def file_view(self, pid: int) -> tuple[str, int, int, int] | None:
        """What decides which file a path names for process `pid`: its mount namespace, and
        the mount and directory that are its root (a chroot's too). Processes with the same
        view find the same file at the same path (serve stats a path once a run for all of
        them). The mount is told by its id, not by the root's device and inode: two bind
        mounts of one directory, each some jail's root with its own mounts below, have the
        same root inode and different files at one path (helper-111). None where any part
        cannot be read (another user's process, a fixture tree, a kernel before 3.15)."""
        import os

        try:
            namespace = os.readlink(self.proc(pid, "ns", "mnt"))
            fd = os.open(self.proc(pid, "root"), os.O_PATH | os.O_CLOEXEC)
        except (OSError, ValueError):
            return None
        try:
            root = os.fstat(fd)
            mount = _mount_id(self.proc(None, "fdinfo", str(fd)))
        except OSError:
            return None
        finally:
            os.close(fd)
        return None if mount is None else (namespace, mount, root.st_dev, root.st_ino)

    def printed_root(self, pid: int) -> str:
        """Where process `pid`'s root is, as the kernel prints its paths to us: "" for a root
        it shares with us or cannot be read, else that directory (a chroot jail: /jail).
        Paths the kernel prints of a process (its maps, exe, cwd) are the reader's where the
        reader can reach the file: a jailed process in our mount namespace maps
        /jail/usr/lib/..., which through /proc/N/root (the jail) names nothing (helper-111:
        a chrooted job's torch was called a broken install). `in_own_view` takes it off."""
        import os

        try:
            root = os.readlink(self.proc(pid, "root"))
        except (OSError, ValueError):
            return ""
        return "" if root == "/" or not root.startswith("/") else root.rstrip("/")

    @staticmethod
    def in_own_view(printed_root: str, path: str) -> str:
        """A path the kernel printed of a process whose `printed_root` that is, as the
        process itself names it (as seen_by wants it). One outside its root is left as is."""
        if printed_root and path.startswith(printed_root + "/"):
            return path[len(printed_root):]
        return path

    def seen_by(self, pid: int | None, path: str) -> Path:
        """`path` as process `pid` sees it: another process's through /proc/N/root
        (its own mount namespace, a container's too), our own under the rootfs."""
        relative = path.lstrip("/")
        if pid is None:
            return self.rootfs / relative
        return self.proc(pid, "root", relative)


def _mount_id(fdinfo: Path) -> int | None:
    """The `mnt_id:` of an open descriptor's /proc/self/fdinfo/FD: the mount it lies on."""
    for line in read_text(fdinfo, 4096).splitlines():
        if line.startswith("mnt_id:"):
            value = line[len("mnt_id:"):].strip()
            return int(value) if value.isdigit() else None
    return None


@functools.lru_cache(maxsize=4096)
def _proc_path(procfs: Path, pid: int | None, parts: tuple[str, ...]) -> Path:
    """Roots.proc's answer, kept: a Path join parses every part (~10 µs in Python 3.11),
    and serve asks for the same few files of every process dozens of times a run.
    Paths are immutable, so one may be shared; a reused pid names the same path."""
    return procfs.joinpath("self" if pid is None else str(pid), *parts)


# What a kernel file (/proc/N/environ, cgroup files, mountinfo) can hold; a file larger
# than this under a fixture root or a hostile --path.* root is refused, not read.
MAX_READ_BYTES = 8 * 1024 * 1024


def _chunk_size(total: int) -> int:
    """How much the next read asks for, having read `total` bytes: 64 KiB first, since a
    kernel file is smaller than that, then the size read so far, up to 1 MiB. os.read
    allocates what it asks for before the kernel answers, and a 1 MiB buffer is one
    mmap, page fault and munmap of its own (serve.malloc maps blocks over 128 KiB apart),
    ~400 times a serve run over 64 processes for files of a few hundred bytes."""
    return min(max(total, 1 << 16), 1 << 20)


def read_bytes(path: Path | str, limit: int = MAX_READ_BYTES) -> bytes:
    """Read a small kernel or config file without ever blocking or filling memory.

    Opened non-blocking and checked to be a regular file first: a FIFO planted
    where /proc/N/environ should be raises at once instead of hanging the run
    (procfs files are regular files that report size 0, so the size is not
    trusted; at most `limit` bytes are read). Raises OSError with a reason.
    """
    import errno
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            what = "a FIFO" if stat.S_ISFIFO(kind) else "a directory" if stat.S_ISDIR(kind) else "not a regular file"
            raise OSError(errno.EINVAL, f"{what}, not a readable file", str(path))
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(_chunk_size(total), limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_head(path: Path | str, limit: int) -> bytes | None:
    """The first `limit` bytes of a regular file, or None: read_bytes for a file whose
    head is enough (a longer one is cut, not refused) and whose absence is an answer.
    Opened non-blocking and checked with fstat first: a FIFO planted where a target's
    version.py or /proc/N/stat should be answers None at once instead of hanging the run."""
    import os
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, total = [], 0
        while total < limit:
            chunk = os.read(fd, min(_chunk_size(total), limit - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_text(path: Path | str, limit: int = MAX_READ_BYTES) -> str:
    """read_bytes() decoded as UTF-8, undecodable bytes replaced (a value never breaks a reader)."""
    return read_bytes(path, limit).decode("utf-8", "replace")


def shm_seen_by(roots: Roots, pid: int | None, shared: Any = None) -> str:
    """Where the process's /dev/shm leads in its own root (Roots.resolved_in). `shared`
    (serve's memo for one run) makes it once a run: the memory sample and shm.size both
    ask, one after the other."""
    def resolve() -> str:
        return roots.resolved_in(pid, "/dev/shm")

    return resolve() if shared is None else shared(f"paths.shm:{pid}", resolve)


STATUS_LIMIT = 1 << 20  # /proc/N/status is a few KiB; what a hostile --path.procfs holds is cut off here


def proc_status(roots: Roots, pid: int | None, shared: Any = None) -> str:
    """/proc/N/status as text. `shared(key, read)` (serve's memo for one run) makes it one
    read a run: the memory sample reads it for the process's memory, and the live-view
    lookup right after it for the pid in the process's namespace and its uid (two opens
    and reads of a procfs file per process per run, where one does)."""
    def read() -> str:
        return read_text(roots.proc(pid, "status"), STATUS_LIMIT)

    return read() if shared is None else shared(f"proc.status:{pid}", read)
