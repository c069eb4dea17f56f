"""A directory only this user (and root) can change, for files that will run as code
or be trusted as our own cache.

`exec --attach` puts a sitecustomize.py where the job's Python will import it at
start, after envdoctor has exec'd away; the disk cache names modules to import and is
written through its path. If any other user can rename, replace or redirect that
directory, or anything on the way to it, they choose the code the job runs or the
file root overwrites. So the path is resolved here one component at a time, as the
kernel would: every directory met must be ours or root's and not writable by others
unless sticky (/tmp: there only an entry's owner may rename it); every symlink met
must be ours or root's, in such a directory. The answer is the real path (no symlink
left in it), resolved once: every directory in it is one nobody else can change, so
it stays what was checked. Missing directories are made the same way, one at a time,
mode 0700, and only inside a directory of ours or a sticky one of root's: never in
another user's home (`sudo` without -H keeps their HOME).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Callable

_MAX_LINKS = 40  # as the kernel's ELOOP limit


def _closed(st: os.stat_result) -> bool:
    """No one but the owner may add, rename or remove entries: not group- or world-
    writable, or sticky (others may add, but only rename or remove their own)."""
    return not st.st_mode & 0o022 or bool(st.st_mode & stat.S_ISVTX)


def _walk(path: Path, create: bool) -> str | None:
    """The real path of `path` if every directory and symlink on the way passes (see the
    module's docstring), making what is missing when `create`; else None."""
    me = os.geteuid()
    pending = list(Path(path if os.path.isabs(path) else os.path.join(os.getcwd(), path)).parts[1:])
    pending.reverse()
    current, links = "/", 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current)  # current is real: its parent is what `..` means
            continue
        candidate = os.path.join(current, part)
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            if not create or not _may_make_in(current, me):
                return None
            try:
                os.mkdir(candidate, 0o700)
                os.chmod(candidate, 0o700)  # whatever the umask: the XDG spec's mode
                st = os.lstat(candidate)
            except FileExistsError:  # made meanwhile by someone: judged as found, below
                st = os.lstat(candidate)
        if st.st_uid not in (me, 0):
            return None
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                return None
            target = os.readlink(candidate)
            if os.path.isabs(target):
                current = "/"
            pending.extend(reversed(Path(target).parts[1:] if os.path.isabs(target) else Path(target).parts))
            continue
        if not stat.S_ISDIR(st.st_mode) or not _closed(st):
            return None
        current = candidate
    return current


def _may_make_in(directory: str, me: int) -> bool:
    """A new directory may go in one of ours, or in a sticky one of root's (/tmp)."""
    st = os.lstat(directory)
    return st.st_uid == me or (st.st_uid == 0 and bool(st.st_mode & stat.S_ISVTX))


def only_ours(path: Path) -> str | None:
    """The real path of `path` if it is a directory of ours that no one else may write,
    reached only through directories and symlinks nobody else can change; else None."""
    try:
        real = _walk(path, create=False)
        if real is None:
            return None
        st = os.lstat(real)
    except (OSError, ValueError):
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    return real


def make_private(path: Path, make: Callable[[Path], None] | None = None) -> str | None:
    """Make `path` (and what is missing above it) where that is ours to do, then only_ours.
    `make`, if given, runs first on the real path (it may refuse, raising OSError)."""
    try:
        real = _walk(path, create=True)
        if real is None:
            return None
        if make is not None:
            make(Path(real))
    except (OSError, ValueError):
        return None
    return only_ours(Path(real))
