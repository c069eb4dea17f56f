"""Where the proc, sys and root file systems are, and a target's paths under them.

node_exporter's lesson: no reader writes a literal "/proc". Everything asks for
the procfs/sysfs/rootfs roots (`--path.procfs`, `--path.sysfs`, `--path.rootfs`),
which is how the same code runs in a container against the host (`/host/proc`),
against another process through `/proc/N/root`, and against fixture trees in tests.
This module is the bottom layer: parsers import it, it imports nothing of ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Roots:
    """Where the proc, sys and root file systems are mounted (node_exporter's --path.*)."""

    procfs: Path = Path("/proc")
    sysfs: Path = Path("/sys")
    rootfs: Path = Path("/")

    def proc(self, pid: int | None, *parts: str) -> Path:
        """A file of a process under procfs: /proc/self/... (pid None) or /proc/N/..."""
        return self.procfs.joinpath("self" if pid is None else str(pid), *parts)

    def seen_by(self, pid: int | None, path: str) -> Path:
        """`path` as process `pid` sees it: another process's through /proc/N/root
        (its own mount namespace, a container's too), our own under the rootfs."""
        relative = path.lstrip("/")
        if pid is None:
            return self.rootfs / relative
        return self.proc(pid, "root", relative)
