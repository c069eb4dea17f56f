"""How much of its /dev/shm a running job holds: its DataLoader's batches in flight.

torch's workers hand each batch to the training process as a shared-memory file that
is unlinked as soon as it is made (the `file_descriptor` sharing strategy, Linux's
default): it counts in statvfs's used bytes but appears in no directory listing, only as
an open descriptor of the worker and of the training process
(`/proc/N/fd/M -> /dev/shm/torch_... (deleted)`). Without this, a healthy job's own
batches read as space "held by other processes", and shm.size warned it (helper-42).

Only unlinked files count: one that is gone from the directory is reachable only
through descriptors handed around inside the job, while a named file the tree has
open (a dataset another job shares) frees nothing for new batches (helper-48).

Only the target's process tree is read, and a descriptor is stat'ed only when its link
names an unlinked file under /dev/shm, a tmpfs: following every descriptor also reached
files on a hung NFS or FUSE mount, where stat() blocks, and let any process with many
descriptors make the walk slow (helper-48). Each file counts once (device and inode: a
batch is open in two processes) by the blocks it has. Bounded: MAX_TREE processes and
MAX_DESCRIPTORS descriptors in all; a walk cut short says so.
"""

from __future__ import annotations

import os
import stat
from collections import namedtuple
from pathlib import Path

MAX_TREE = 256  # a training process, its DataLoader workers, their helpers
MAX_DESCRIPTORS = 65536  # over the whole tree
SHM_PREFIX = "/dev/shm/"
UNLINKED = " (deleted)"


class Held(namedtuple("Held", (
        "bytes",  # int
        "complete",  # bool: False: the tree or its descriptors were more than the bounds
))):
    __slots__ = ()


def process_tree(proc: Path, pid: int) -> tuple[list[int], bool]:
    """`pid` and its live descendants, parents first; False when cut at MAX_TREE."""
    from envdoctor.stopping import children_of

    root = os.fspath(proc)
    tree, level, seen = [pid], [pid], {pid}
    while level:
        level = [child for parent in level for child in children_of(parent, root) if child not in seen]
        seen.update(level)
        if len(tree) + len(level) > MAX_TREE:
            tree.extend(level[:MAX_TREE - len(tree)])
            return tree, False
        tree.extend(level)
    return tree, True


def held_bytes(proc: Path, pid: int, shm_device: int) -> Held | None:
    """Bytes of unlinked files on device `shm_device` that `pid`'s tree holds open, or None
    when not even the process's own descriptors could be read (permission, gone)."""
    root = os.fspath(proc)
    tree, complete = process_tree(proc, pid)
    seen: set[int] = set()
    total, budget, readable = 0, MAX_DESCRIPTORS, False
    for member in tree:
        fd_dir = f"{root}/{member}/fd/"  # str, not Path: joining Paths was most of the walk's time
        try:
            entries = os.scandir(fd_dir)  # lazily: a process with 60,000 descriptors is read up to the budget
        except OSError:
            continue
        readable = True
        with entries:
            for entry in entries:
                if budget == 0:
                    return Held(total, False)
                budget -= 1
                try:
                    link = os.readlink(entry.path)  # the name only: no I/O on the file's own file system
                except OSError:
                    continue
                if not (link.startswith(SHM_PREFIX) and link.endswith(UNLINKED)):
                    continue
                try:
                    st = os.stat(entry.path)  # a tmpfs file: follows the link, deleted or not
                except (OSError, ValueError):
                    continue
                if st.st_dev == shm_device and stat.S_ISREG(st.st_mode) and st.st_ino not in seen:
                    seen.add(st.st_ino)
                    total += st.st_blocks * 512
    return Held(total, complete) if readable else None
