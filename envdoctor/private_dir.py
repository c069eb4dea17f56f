"""A directory only this user (and root) can change, for files that will run as code.

`exec --attach` puts a sitecustomize.py where the job's Python will import it at
start, after envdoctor has exec'd away. If any other user can rename, replace or
redirect that directory, or any directory above it, between our write and the job's
start, they choose the code the job runs (as root, for a root job). So a directory
counts only if it is a real directory (not a symlink) that we own and no one else
may write, and every directory above it, both as the path is written and as it
resolves, is ours or root's and not writable by others unless sticky (/tmp: there
only an entry's owner may rename it). A symlink on the way counts only if we or
root made it, in a directory that passes the same test.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable


def _closed(st: os.stat_result) -> bool:
    """No one but the owner may add, rename or remove entries: not group- or world-
    writable, or sticky (others may add, but only rename or remove their own)."""
    return not st.st_mode & 0o022 or bool(st.st_mode & stat.S_ISVTX)


def _ancestors_trusted(path: Path, me: int) -> bool:
    given, real = Path(os.path.abspath(path)), Path(os.path.realpath(path))
    for parent in {*given.parents, *real.parents}:
        st = os.lstat(parent)
        if st.st_uid not in (me, 0):
            return False
        if not stat.S_ISLNK(st.st_mode) and not _closed(st):
            return False
    return True


def only_ours(path: Path) -> str | None:
    """`path`, resolved, if only we (and root) can change what is in it; else None."""
    me = os.geteuid()
    try:
        st = os.lstat(path)  # not followed: a symlink here is someone's pointer, not our directory
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != me or st.st_mode & 0o022:
            return None
        if not _ancestors_trusted(path, me):
            return None
    except (OSError, ValueError):
        return None
    return os.path.realpath(path)


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *Path(os.path.abspath(path)).parents):
        if os.path.lexists(candidate):
            return candidate
    return Path("/")


def may_create_in(path: Path) -> bool:
    """Whether creating `path` (and what is missing above it) leaves our directories
    only in places of ours or shared ones (sticky, like /tmp): never root-owned
    directories in another user's home (`sudo` without -H keeps their HOME), where that
    user could no longer use their own cache."""
    me = os.geteuid()
    existing = _nearest_existing(path)
    if existing == Path(os.path.abspath(path)):
        return True
    try:
        st = os.stat(existing)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and (st.st_uid == me or bool(st.st_mode & stat.S_ISVTX))


def make_private(path: Path, make: Callable[[Path], None]) -> str | None:
    """Create `path` with `make` where that is ours to do, and return it resolved if only
    we can change it (only_ours); None otherwise, having written nothing into it."""
    try:
        if not may_create_in(path):
            return None
        make(path)
    except (OSError, ValueError):
        return None
    return only_ours(path)
