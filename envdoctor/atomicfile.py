"""Write a file so that a reader sees the old content or the new, never half, and
so that nothing but the named file is ever changed.

Used by `check -o`, `exec --report`, the caches and serve's textfile. The rules:
- the temporary file is created exclusively (O_EXCL, a random name beside the
  target), so a link planted at a predictable name cannot redirect the write;
- a symlink as the target is followed, as a shell's `>` follows it: the file it
  points to is replaced, the link stays;
- one of this process's open files named through /proc (`-o /dev/stdout`,
  /dev/stderr, /dev/fd/N, /proc/self/fd/N) is written through that descriptor, as
  `>&1` would: opening the magic link again made a second, truncating open of a
  file the shell had opened for appending (`>> log`: the log's earlier lines were
  replaced), and for a pipe it failed (its realpath, pipe:[N], is no file);
- a character device or a FIFO (`-o /dev/null`, a named pipe) is written directly,
  never replaced by a regular file; a FIFO with no reader is refused rather than
  waited on; a block device, a socket or a directory is refused;
- a regular file keeps its permission bits and, where we may, its owner (root
  writing a user's report must not lock the user out of it); a new one gets 0644
  less the umask;
- a file that is a mount point (a container's bind-mounted `-v out.json:/out.json`,
  a Kubernetes subPath) cannot be replaced (EBUSY): it is rewritten in place, the
  one case where a reader could see it half written;
- every failure (no such directory, permission, a full disk) removes the
  temporary file and raises OutputError with one line naming the file and why.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import tempfile

from envdoctor.errors import OutputError


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _write_special(path: str, mode: int, data: bytes) -> None:
    """A character device or FIFO: write into it as it is."""
    flags = os.O_WRONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    if stat.S_ISFIFO(mode):
        flags |= os.O_NONBLOCK  # no reader: fail at once (ENXIO) instead of blocking forever
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OutputError(f"cannot write {path}: it is a FIFO with no reader") from None
        raise OutputError(f"cannot write {path}: {_reason(exc)}") from None
    try:
        if stat.S_ISFIFO(mode):
            os.set_blocking(fd, True)
        _write_all(fd, data)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {_reason(exc)}") from None
    finally:
        os.close(fd)


_FD_LINK = re.compile(r"^/proc/(?P<pid>\d+)(?:/task/(?P<tid>\d+))?/fd/(?P<fd>\d+)$")
_MAX_LINKS = 40  # as the kernel: links followed in one lookup


class _OtherProcess(Exception):
    """The path reaches another process's descriptor."""


def _ours(pid: int) -> bool:
    return pid == os.getpid() or os.path.isdir(f"/proc/self/task/{pid}")  # a thread of ours


def _descriptor_at(path: str) -> int | None:
    m = _FD_LINK.match(path)
    if m is None:
        return None
    if not _ours(int(m.group("pid"))):
        raise _OtherProcess(m.group("pid"))
    return int(m.group("fd"))


def own_descriptor(name: str) -> int | None:
    """The descriptor of ours that `name` reaches through /proc's fd links (/dev/stdout,
    /dev/fd/N, /proc/self/fd/N, /proc/thread-self/fd/N, /proc/PID/task/TID/fd/N, or a
    symlink to any of them, a folder link included), else None. Resolved one component
    at a time, as the kernel does, stopping at the fd link itself (following it gives
    the file, and a rename over that file is what must not happen). OutputError for
    another process's descriptor."""
    try:
        pending = os.path.abspath(name).split("/")[1:]
    except OSError:  # a relative name in a removed working directory
        return None
    done = ""
    links = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            done = os.path.dirname(done)
            continue
        path = f"{done}/{part}"
        try:
            fd = _descriptor_at(path) if not pending else None
        except _OtherProcess as other:
            raise OutputError(f"cannot write {name}: it is a descriptor of process {other}, not of envdoctor; "
                              "give the file's own path") from None
        if fd is not None:
            return fd
        try:
            target = os.readlink(path)
        except OSError:  # not a link (or not there): a plain component
            done = path
            continue
        links += 1
        if links > _MAX_LINKS:
            return None
        if target.startswith("/"):
            done = ""
        pending = [p for p in target.split("/")] + pending
    return None


def _write_descriptor(name: str, fd: int, data: bytes) -> None:
    """Write through our descriptor `fd`, where its file already is: appended after what
    the shell's `>>` left, in order after what we printed to it ourselves."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and stream.fileno() == fd:
                stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    # A descriptor the process did not start with is one of ours (a dup of stderr, a
    # pipe, /dev/null), whatever its number: `-o /dev/fd/3` without `3>file` put the
    # report there. Python found a closed standard stream closed at start (`>&-`).
    from envdoctor import program

    inherited = program.inherited_descriptors
    started_closed = fd <= 2 and (sys.__stdin__, sys.__stdout__, sys.__stderr__)[fd] is None
    try:
        if started_closed or (inherited is not None and fd not in inherited):
            raise OSError(errno.EBADF, "closed")
        os.fstat(fd)
    except OSError:
        raise OutputError(f"cannot write {name}: file descriptor {fd} is not open") from None
    try:
        _write_all(fd, data)
    except OSError as exc:
        raise OutputError(f"cannot write {name}: {_reason(exc)}") from None


def _rewrite_in_place(real: str, data: bytes) -> None:
    """A regular file that cannot be replaced (a mount point): truncated and written."""
    fd = os.open(real, os.O_WRONLY | os.O_TRUNC | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process's umask, read without changing it: os.umask() can only be read by
    setting it, and a file another thread creates in between gets the wrong mode."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)  # no /proc (or a kernel before 4.7): the racy way
    os.umask(umask)
    return umask


def write_atomic(path: str | os.PathLike, data: str | bytes, *, mode: int | None = None,
                 umask: int | None = None) -> None:
    """Replace `path` with `data` atomically (see the module docstring for the rules).
    `umask`: the one a new file's mode honours, when the caller read it earlier (before a
    plug-in check could change the process's)."""
    name = os.fspath(path)
    if not name:
        raise OutputError("no file name given (an empty path)")
    payload = data.encode("utf-8", errors="surrogateescape") if isinstance(data, str) else bytes(data)
    descriptor = own_descriptor(name)
    if descriptor is not None:
        _write_descriptor(name, descriptor, payload)
        return
    try:
        real = os.path.realpath(name)  # follows a symlink; a dangling one names the file to create
    except OSError:  # a relative name, and the working directory was removed (getcwd fails)
        raise OutputError(f"cannot write {name}: the working directory was removed; give an absolute path") from None
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"cannot write {name}: {_reason(exc)}") from None
    if st is not None:
        kind = st.st_mode
        if stat.S_ISDIR(kind):
            raise OutputError(f"cannot write {name}: it is a directory")
        if stat.S_ISCHR(kind) or stat.S_ISFIFO(kind):
            _write_special(real, kind, payload)
            return
        if not stat.S_ISREG(kind):
            what = "a block device" if stat.S_ISBLK(kind) else "a socket" if stat.S_ISSOCK(kind) else "not a regular file"
            raise OutputError(f"cannot write {name}: it is {what}; refusing to replace it")
    directory = os.path.dirname(real) or "."
    if not os.path.isdir(directory):
        raise OutputError(f"cannot write {name}: directory {directory} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(real)}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise OutputError(f"cannot write {name}: {_reason(exc)}") from None
    try:
        try:
            _write_all(fd, payload)
            os.fsync(fd)
            if st is not None and (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                try:  # before the mode: a chown clears the set-id bits
                    os.fchown(fd, st.st_uid, st.st_gid)
                except OSError:  # not root: the file becomes ours, as any rewrite by us would
                    pass
            if mode is not None:
                os.fchmod(fd, mode)
            elif st is not None:
                os.fchmod(fd, stat.S_IMODE(st.st_mode))
            else:
                os.fchmod(fd, 0o644 & ~(current_umask() if umask is None else umask))
        finally:
            os.close(fd)
        try:
            os.replace(tmp, real)
        except OSError as exc:
            if exc.errno != errno.EBUSY or st is None:
                raise
            _rewrite_in_place(real, payload)  # a mount point: it cannot be replaced
            os.unlink(tmp)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OutputError(f"cannot write {name}: {_reason(exc)}") from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
