"""Announcements: a job's `envdoctor.attach()` drops `<pid>.json` in a directory the
monitor on the same host reads, so serve examines it even before it has mapped libtorch
or touched a GPU. Shared by the writer (attach, in the job) and the reader (discovery),
so both agree on where and on what a valid announcement is.

An announcement is untrusted input: it names a pid and that pid's start time (field 22
of /proc/N/stat, clock ticks since boot, the same in every pid namespace of the host).
The reader takes the pid only when the process it sees under that number started at
that time: a job in a container with its own pid namespace announces a number that is
not its host pid, and a pid reused after the job ended is another process. And only
from the process's own user (or root): the directory is every user's to write
(mode 1777), and serve would otherwise publish any root process a user named
(helper-78). A name no live process has is passed over before its file is opened,
and at most MAX_ANNOUNCEMENTS are read a directory a run: files anyone can make must
not make every run slow.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Iterable, Mapping

ANNOUNCE_DIRS = ("/run/envdoctor/attached",)
MAX_BYTES = 4096
MAX_ANNOUNCEMENTS = 4096  # a directory's live announcements read a run: far more than a node's jobs


def announce_dirs(env: Mapping[str, str], defaults: Iterable[str] = ANNOUNCE_DIRS) -> list[str]:
    """$ENVDOCTOR_ANNOUNCE_DIR first, then the defaults, keeping those that exist."""
    dirs = [d for d in [env.get("ENVDOCTOR_ANNOUNCE_DIR", ""), *defaults] if d]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def start_ticks(procfs: Path | str, pid: int | str) -> int | None:
    """Field 22 of <procfs>/PID/stat (after the last ')' the comm may hold), or None.

    Opened non-blocking and read only when regular: serve calls this for every
    announcement on every run, and a FIFO in a --path.procfs tree would hang them all."""
    import stat

    try:
        fd = os.open(Path(procfs) / str(pid) / "stat", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, MAX_BYTES).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    rest = text[text.rfind(")") + 1:].split()
    return int(rest[19]) if len(rest) > 19 and ascii_digits(rest[19]) else None


def ascii_digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() also takes '²', which int() refuses."""
    return text.isascii() and text.isdigit()


def own_start_ticks() -> int | None:
    return start_ticks("/proc", "self")


def read(path: str) -> dict | None:
    """An announcement's content, or None: no symlink followed, at most 4 KiB, a JSON object."""
    found = read_owned(path)
    return found[0] if found else None


def read_owned(path: str) -> tuple[dict, int] | None:
    """(an announcement's content, the uid owning its file), or None: a regular file, no
    symlink followed, at most 4 KiB, a JSON object."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        data = os.read(fd, MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        return None
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # '[' * 1000 in 1 KB: every run failed with it (helper-78)
        return None
    return (doc, st.st_uid) if isinstance(doc, dict) else None


def _owner(procfs: Path | str, pid: str) -> int | None:
    try:
        return os.stat(f"{procfs}/{pid}").st_uid  # the process's effective uid
    except OSError:
        return None


def announced_pids(dirs: Iterable[str], procfs: Path | str = "/proc") -> list[int]:
    """The pids whose announcement matches the process running under that number now."""
    pids = []
    for directory in dirs:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        read_here = 0
        for name in names:
            stem, _, ext = name.partition(".")
            if ext != "json" or not ascii_digits(stem) or len(stem) > 10:
                continue
            running = start_ticks(procfs, stem)
            if running is None:  # no such process: its file is not even opened
                continue
            read_here += 1
            if read_here > MAX_ANNOUNCEMENTS:
                break
            found = read_owned(os.path.join(directory, name))
            if found is None:
                continue
            doc, uid = found
            ticks = doc.get("start_ticks")
            if (isinstance(ticks, int) and not isinstance(ticks, bool) and ticks == running
                    and uid in (0, _owner(procfs, stem))):
                pids.append(int(stem))
    return pids
