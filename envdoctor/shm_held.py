"""Who holds which files open on a /dev/shm: a running DataLoader's own batches in
flight, and whose files a growing /dev/shm fills with.

torch's workers hand each batch to the training process as a shared-memory file that
is unlinked as soon as it is made (the `file_descriptor` sharing strategy, Linux's
default): it counts in statvfs's used bytes but appears in no directory listing, only as
an open descriptor of the worker and of the training process
(`/proc/N/fd/M -> /dev/shm/torch_... (deleted)`). Without this, a healthy job's own
batches read as space "held by other processes", and shm.size warned it (helper-42).

One walk of every process's descriptors per run, shared by every target and every
/dev/shm (a host fact): in serve, a walk per target cost 30 % more CPU under /dev/shm
pressure, DataLoader workers walked once as targets and again in their parent's tree
(helper-46). Each file counts once (device and inode: a batch is open in two processes)
by the blocks it has, and only files on the given /dev/shm's device. Bounded: at most
MAX_PROCESSES processes and MAX_DESCRIPTORS descriptors each.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_PROCESSES = 4096  # of a node, read once per run
MAX_DESCRIPTORS = 65536  # of one process
MAX_TREE = 256  # a training process, its DataLoader workers, their helpers


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
    """`pid` and its live descendants, parents first, at most MAX_TREE."""
    tree, level = [pid], [pid]
    while level and len(tree) < MAX_TREE:
        level = [child for parent in level for child in _children(proc, parent) if child not in tree]
        tree.extend(level[:MAX_TREE - len(tree)])
    return tree


class Holders:
    """Every regular file some process holds open, by device and inode: its bytes and who
    holds it, and whose descriptors could be read at all. One table serves every /dev/shm
    on the node (each container has its own device)."""

    def __init__(self, files: dict[tuple[int, int], tuple[int, frozenset[int]]], readable: frozenset[int]):
        self.files = files  # (device, inode) -> (bytes, pids holding it)
        self.readable = readable

    def split(self, tree: list[int], shm_device: int) -> tuple[int | None, int | None]:
        """(bytes the tree holds on `shm_device`, bytes there only processes outside it hold);
        (None, None) when the tree's own process could not be read (permission, gone)."""
        if not tree or tree[0] not in self.readable:
            return None, None
        members, own, others = set(tree), 0, 0
        for (device, _), (size, pids) in self.files.items():
            if device != shm_device:
                continue
            if pids & members:
                own += size
            else:
                others += size
        return own, others


def holders(proc: Path) -> Holders:
    """Who holds which regular file open, over every process of the node."""
    found: dict[tuple[int, int], tuple[int, set[int]]] = {}
    readable: set[int] = set()
    try:
        pids = [int(name) for name in os.listdir(proc) if name.isascii() and name.isdigit()]
    except OSError:
        pids = []
    root = os.fspath(proc)
    for pid in pids[:MAX_PROCESSES]:
        fd_dir = f"{root}/{pid}/fd/"  # str, not Path: joining Paths was 3/4 of the walk's time
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        readable.add(pid)
        for fd in fds[:MAX_DESCRIPTORS]:
            try:
                st = os.stat(fd_dir + fd)  # follows the link to the open file, deleted or not
            except (OSError, ValueError):
                continue
            if stat.S_ISREG(st.st_mode):
                found.setdefault((st.st_dev, st.st_ino), (st.st_blocks * 512, set()))[1].add(pid)
    return Holders({key: (size, frozenset(who)) for key, (size, who) in found.items()}, frozenset(readable))


def of_target(ctx, shm_device: int) -> tuple[int | None, int | None]:
    """(what the --pid target's process tree holds open on its /dev/shm, what only other
    processes hold open there), from the run's one walk of the node."""
    procfs = ctx.roots.procfs
    table = ctx.host.fact("shm.holders", lambda: holders(procfs))
    return table.split(process_tree(procfs, ctx.target.pid), shm_device)
