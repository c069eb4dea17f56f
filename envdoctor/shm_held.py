"""How much of its /dev/shm a process and its descendants hold open: a running
DataLoader's own batches in flight.

torch's workers hand each batch to the training process as a shared-memory file that
is unlinked as soon as it is made (the `file_descriptor` sharing strategy, Linux's
default): it counts in statvfs's used bytes but appears in no directory listing, only as
an open descriptor of the worker and of the training process
(`/proc/N/fd/M -> /dev/shm/torch_... (deleted)`). Without this, a healthy job's own
batches read as space "held by other processes", and shm.size warned it (helper-42).

Each file is counted once (device and inode: a batch is open in two processes) by the
blocks it has, and only files on the given /dev/shm's device. Bounded: a tree of
thousands of processes or descriptors is read up to the limits, never all of it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_PROCESSES = 256  # a training process, its DataLoader workers, their helpers
MAX_DESCRIPTORS = 65536  # over the whole tree
MAX_NODE_PROCESSES = 4096  # holders(): every process of a node, read once per run


def _children(proc: Path, pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(proc / str(pid) / "task")
    except OSError:
        return found
    for tid in tasks:
        try:
            found.extend(int(p) for p in (proc / str(pid) / "task" / tid / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return found


def process_tree(proc: Path, pid: int) -> list[int]:
    """`pid` and its live descendants, parents first, at most MAX_PROCESSES."""
    tree, level = [pid], [pid]
    while level and len(tree) < MAX_PROCESSES:
        level = [child for parent in level for child in _children(proc, parent) if child not in tree]
        tree.extend(level[:MAX_PROCESSES - len(tree)])
    return tree


def held_bytes(proc: Path, pid: int, shm_device: int) -> int | None:
    """Bytes of regular files on device `shm_device` that `pid`'s tree holds open, or None
    when not even the process's own descriptors could be read (permission, gone)."""
    seen: set[int] = set()
    total, budget, readable = 0, MAX_DESCRIPTORS, False
    for member in process_tree(proc, pid):
        fd_dir = proc / str(member) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        readable = True
        for fd in fds[:budget]:
            try:
                st = os.stat(fd_dir / fd)  # follows the link to the open file, deleted or not
            except (OSError, ValueError):
                continue
            if st.st_dev == shm_device and stat.S_ISREG(st.st_mode) and st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_blocks * 512
        budget -= min(budget, len(fds))
        if budget == 0:
            break
    return total if readable else None


class Holders:
    """Every regular file on one /dev/shm device that some process holds open: its bytes
    and who holds it. Read once per run for the whole node (a host fact), only when a
    /dev/shm's use is rising, to say whose files the growth is in."""

    def __init__(self, files: dict[int, tuple[int, frozenset[int]]]):
        self.files = files  # inode -> (bytes, pids holding it)

    def split(self, tree: list[int]) -> tuple[int, int]:
        """(bytes the tree holds, bytes only processes outside it hold)."""
        members, own, others = set(tree), 0, 0
        for size, pids in self.files.values():
            if pids & members:
                own += size
            else:
                others += size
        return own, others


def holders(proc: Path, shm_device: int) -> Holders:
    """Who holds what open on the /dev/shm of device `shm_device`, over every process
    (at most MAX_NODE_PROCESSES, and MAX_DESCRIPTORS per process); unreadable ones are skipped."""
    found: dict[int, tuple[int, set[int]]] = {}
    try:
        pids = [int(name) for name in os.listdir(proc) if name.isascii() and name.isdigit()]
    except OSError:
        pids = []
    for pid in pids[:MAX_NODE_PROCESSES]:
        fd_dir = proc / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds[:MAX_DESCRIPTORS]:
            try:
                st = os.stat(fd_dir / fd)
            except (OSError, ValueError):
                continue
            if st.st_dev == shm_device and stat.S_ISREG(st.st_mode):
                found.setdefault(st.st_ino, (st.st_blocks * 512, set()))[1].add(pid)
    return Holders({ino: (size, frozenset(who)) for ino, (size, who) in found.items()})
