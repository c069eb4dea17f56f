"""Write a file so that a reader sees the old content or the new, never half, and
so that nothing but the named file is ever changed.

Used by `check -o`, `exec --report`, the caches and serve's textfile. The rules:
- the temporary file is created exclusively (O_EXCL, a random name beside the
  target), so a link planted at a predictable name cannot redirect the write;
- a symlink as the target is followed, as a shell's `>` follows it: the file it
  points to is replaced, the link stays; except where the kernel's
  fs.protected_symlinks would not follow it (another user's link in a sticky,
  world-writable folder such as /tmp): replacing by rename never asks the kernel to
  follow the link, so the rule is ours to keep, whatever the sysctl says (helper-70:
  a root serve's --textfile overwrote what a planted link named);
- a descriptor (`-o /dev/stdout`, /dev/fd/N, /proc/self/fd/N), or any path the kernel
  resolves to a file or pipe one of our descriptors has open for writing, is written
  through that descriptor, as `>&1` would: renaming over the file left the shell's
  descriptor on a deleted file (`>> log`: the log's earlier lines were lost), and for
  a pipe realpath names no file (pipe:[N]). Only descriptors the command started with
  count; another process's is refused;
- a character device or a FIFO (`-o /dev/null`, a named pipe) is written directly,
  never replaced by a regular file; a FIFO with no reader is refused rather than
  waited on; a block device, a socket or a directory is refused;
- a regular file keeps its permission bits and, where we may, its owner (root
  writing a user's report must not lock the user out of it); a new one gets 0644
  less the umask;
- a file that is a mount point (a container's bind-mounted `-v out.json:/out.json`,
  a Kubernetes subPath, EBUSY) or another user's file in a sticky directory (EPERM)
  cannot be replaced: it is rewritten in place, the one case where a reader could see
  it half written; a file this user may not write is refused, as a shell's `>` would;
- every failure (no such directory, permission, a full disk) removes the
  temporary file and raises OutputError with one line naming the file and why.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys

from envdoctor.errors import OutputError


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def write_descriptor(fd: int, data: bytes) -> None:
    """All of `data` into an open descriptor (see _write_all); OSError as os.write's."""
    _write_all(fd, data)


def _write_all(fd: int, data: bytes) -> None:
    """All of `data`, also into a descriptor someone set non-blocking (a pipe whose reader
    is slow returns EAGAIN: half a report was written and the rest dropped, exit 0)."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            from envdoctor.fdwait import ready

            ready(fd, write=True)  # as a blocking write would wait
            continue
        view = view[written:]


def _write_special(path: str, mode: int, data: bytes) -> None:
    """A character device or FIFO: write into it as it is."""
    flags = os.O_WRONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    if stat.S_ISFIFO(mode):
        flags |= os.O_NONBLOCK  # no reader: fail at once (ENXIO) instead of blocking forever
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ENXIO and stat.S_ISFIFO(mode):
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


# a folder of descriptors, as realpath gives it (/dev/fd, /proc/self/fd, a link to one, and
# `..` after a link all end here), and a descriptor's number as the kernel spells it
_FD_FOLDER = re.compile(r"/proc/([0-9]+)(?:/task/[0-9]+)?/fd", re.ASCII)
_FD_NUMBER = re.compile(r"0|[1-9][0-9]*", re.ASCII)
_STD_NAMES = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}


def _candidates() -> list[int]:
    """Our descriptors a path may mean: those the command started with, or every open one
    when envdoctor is a library in someone else's process."""
    from envdoctor import program

    if program.inherited_descriptors is not None:
        return sorted(program.inherited_descriptors)
    try:
        return sorted(int(n) for n in os.listdir("/proc/self/fd"))
    except OSError:
        return [0, 1, 2]


def _flags(fd: int) -> int | None:
    import fcntl

    try:
        return fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        return None


def _named_descriptor(name: str) -> int | None:
    """The descriptor `name` names, following its own links (at most 40, as the kernel):
    /dev/stdout, or N in a folder realpath resolves to /proc/PID[/task/TID]/fd (/dev/fd,
    /proc/self/fd, a link to one, `..` after a link). OutputError for another process's."""
    path = name
    for _ in range(40):
        try:
            folder = os.path.realpath(os.path.dirname(path) or ".")  # links resolved before each `..`, as the kernel does
        except OSError:  # a relative name in a removed working directory
            return None
        last = os.path.basename(path)
        if f"{folder}/{last}" in _STD_NAMES:
            return _STD_NAMES[f"{folder}/{last}"]
        m = _FD_FOLDER.fullmatch(folder)
        if m is not None and _FD_NUMBER.fullmatch(last):
            owner = m.group(1)
            if int(owner) != os.getpid() and not os.path.isdir(f"/proc/self/task/{owner}"):
                raise OutputError(f"cannot write {name}: it is a descriptor of process {owner}, not of envdoctor; "
                                  "give the file's own path")
            return int(last)
        try:
            target = os.readlink(path)
        except OSError:
            return None
        path = target if target.startswith("/") else os.path.join(os.path.dirname(path), target)
    return None


def own_descriptor(name: str) -> int | None:
    """The descriptor of ours that `name` means, or None for a file to replace.

    Named as a descriptor (/dev/stdout, /dev/fd/N, /proc/self/fd/N, or a link to one), it
    is that number, open or not (the write then says so). Otherwise, when the kernel
    resolves the path to the very pipe or file one of our descriptors holds open for
    writing, that descriptor is meant: standard output or error (`-o log >> log`), or a
    descriptor opened for appending. Renaming over that file would leave the shell's
    descriptor on a deleted file and lose what it held. A file held open otherwise (a
    lock idiom's `9<>file`) is replaced as any file is: written at that descriptor's
    offset it kept the old content's tail."""
    named = _named_descriptor(name)
    if named is not None:
        return named
    try:
        target = os.stat(name)
    except OSError:
        return None  # nothing there yet, or a path the writer below will explain
    regular = stat.S_ISREG(target.st_mode)
    for fd in _candidates():
        try:
            held = os.fstat(fd)
        except OSError:
            continue
        if (held.st_dev, held.st_ino) != (target.st_dev, target.st_ino):
            continue
        flags = _flags(fd)
        if flags is None or flags & os.O_ACCMODE == os.O_RDONLY:
            continue
        if not regular or fd in (1, 2) or flags & os.O_APPEND:
            return fd
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


def _refuse_planted_link(name: str) -> None:
    """OutputError when `name` is a symlink that fs.protected_symlinks would not let us follow:
    in a sticky, world-writable folder, owned neither by us nor by the folder's owner."""
    try:
        link = os.lstat(name)
        if not stat.S_ISLNK(link.st_mode):
            return
        folder = os.path.dirname(name) or "."
        parent = os.stat(folder)
    except OSError:
        return  # nothing there (a new file), or the folder's own error comes later, named
    shared = parent.st_mode & stat.S_ISVTX and parent.st_mode & stat.S_IWOTH
    if shared and link.st_uid not in (os.geteuid(), parent.st_uid):
        raise OutputError(f"cannot write {name}: it is a symlink that another user (uid {link.st_uid}) made in "
                          f"{folder}, a folder every user may write to; not followed (the kernel's "
                          "fs.protected_symlinks rule): remove it, or write elsewhere")


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
    _refuse_planted_link(name)
    try:
        seen = os.stat(name)  # as the kernel resolves it: too many links, a file used as a folder...
    except FileNotFoundError:
        seen = None
    except OSError as exc:
        raise OutputError(f"cannot write {name}: {_reason(exc)}") from None
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
    if seen is not None and (st is None or (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino)):
        # realpath reads links as text; through /proc's magic links (another process's
        # descriptor, a pipe) it names something else than the kernel opens
        raise OutputError(f"cannot write {name}: it leads through /proc's links to another process's open file; "
                          "give the file's own path")
    if st is not None and stat.S_ISREG(st.st_mode) and not os.access(real, os.W_OK):
        # a rename would replace a file we may not write (a shell's > refuses it too)
        why = "Permission denied (the file is not writable by this user)"
        try:
            os.close(os.open(real, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY))
        except OSError as exc:
            if exc.errno != errno.EACCES:
                why = _reason(exc)  # a read-only file system says so
        raise OutputError(f"cannot write {name}: {why}")
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
        import tempfile  # here, not at the top: it pulls in shutil and random, ~3 ms of every start that writes nothing

        # the name's start only: a 242-character name plus the temporary's 14 was too long
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(real)[:64]}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and st is not None and stat.S_ISREG(st.st_mode):
            # no temporary beside it (a writable file bind-mounted into a read-only folder, a
            # file we may write in a folder we may not): written in place, as > would
            try:
                _rewrite_in_place(real, payload)
                return
            except OSError as again:
                raise OutputError(f"cannot write {name}: {_reason(again)}") from None
        if exc.errno == errno.ENOENT and st is not None:  # the file and its folder are there: the folder takes no new files (/proc, /sys)
            raise OutputError(f"cannot write {name}: no new file can be made in {directory} "
                              "(a file system such as /proc or /sys)") from None
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
            # a mount point (EBUSY), or another user's file in a sticky directory (EPERM):
            # it cannot be replaced, but we may write it, as a shell's > would
            if exc.errno not in (errno.EBUSY, errno.EPERM, errno.EACCES) or st is None:
                raise
            _rewrite_in_place(real, payload)
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
