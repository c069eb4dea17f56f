"""Find the command as a shell would, then become it with execve.

`envdoctor exec` ends here: the command replaces envdoctor in the same process,
so its PID, its signals, its exit status and its place in the process tree are
its own, and no wrapper stays behind. What a shell would refuse is refused the
same way, with its exit code: 127 for a command that is not there, 126 for one
that is there but cannot be executed.

Python ignores SIGPIPE and SIGXFSZ for itself, and an ignored signal stays
ignored across execve; both go back to their defaults first, as subprocess does
for its children, so `envdoctor exec -- yes | head` behaves as `yes | head`.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import sys

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Mapping, NoReturn, Sequence

EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127


class CannotRun(Exception):
    """The command cannot be run: exit with `code` (126/127) after saying `line`."""

    def __init__(self, code: int, line: str):
        super().__init__(line)
        self.code = code
        self.line = line


def resolve_command(name: str, path_var: str | None) -> str:
    """The file execve will run for `name`, searched as a shell does on `path_var`
    (the PATH the command gets); CannotRun(127) when there is none, CannotRun(126)
    when the only match cannot be executed."""
    if not name:
        raise CannotRun(EXIT_NOT_FOUND, "no command: the command name is empty")
    if "/" in name:
        candidates = [name]
    else:
        dirs = (path_var if path_var is not None else os.defpath).split(os.pathsep)
        candidates = [os.path.join(d or ".", name) for d in dirs]
    refused = None
    for candidate in candidates:
        try:
            st = os.stat(candidate)
        except OSError as exc:
            if "/" in name and exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                # a symlink loop, a name too long, a directory we may not search: as a shell says
                raise CannotRun(EXIT_CANNOT_EXECUTE, f"{name}: {exc.strerror or exc}") from None
            continue
        if stat.S_ISDIR(st.st_mode):
            if "/" in name:
                raise CannotRun(EXIT_CANNOT_EXECUTE, f"{name}: is a directory")
            continue
        if stat.S_ISREG(st.st_mode) and os.access(candidate, os.X_OK):
            return candidate
        refused = refused or candidate
    if refused is not None:
        raise CannotRun(EXIT_CANNOT_EXECUTE, f"{refused}: permission denied (not an executable file)")
    if "/" in name:
        raise CannotRun(EXIT_NOT_FOUND, f"{name}: no such file")
    raise CannotRun(EXIT_NOT_FOUND, f"{name}: command not found (PATH={path_var if path_var is not None else os.defpath})")


def become(path: str, argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """execve the command. Returns never: CannotRun (126/127) when execve fails."""
    for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ"):
        signum = getattr(signal, name, None)
        if signum is not None:
            signal.signal(signum, signal.SIG_DFL)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # execve discards Python's buffers
        except (OSError, ValueError, AttributeError):
            pass  # closed, or None: Python started with that descriptor closed
    try:
        os.execve(path, list(argv), dict(env))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise CannotRun(EXIT_NOT_FOUND, f"cannot run {path}: no such file, or its #! interpreter does not exist") from None
        why = _format_error(path) if exc.errno == errno.ENOEXEC else (exc.strerror or str(exc))
        if exc.errno == errno.E2BIG:  # helper-117: near the limit, what --fix or --attach added tipped it over
            why += _too_big(argv, env)
        raise CannotRun(EXIT_CANNOT_EXECUTE, f"cannot run {path}: {why}") from None
    raise AssertionError("unreachable: execve returned")  # pragma: no cover


MAX_ARG_STRLEN = 32 * 4096  # linux/binfmts.h: no one argument or NAME=value longer


def _too_big(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """What made execve's E2BIG: the longest string when it is over the kernel's per-string
    limit, else the total against ARG_MAX (the kernel's, from the stack limit)."""
    strings = [(f"argument {i}", len(os.fsencode(a)) + 1) for i, a in enumerate(argv)]
    strings += [(k, len(os.fsencode(k)) + len(os.fsencode(v)) + 2) for k, v in env.items()]
    name, longest = max(strings, key=lambda s: s[1], default=("", 0))
    if longest > MAX_ARG_STRLEN:
        return f" ({name} is {longest:,} bytes; the kernel takes no one string over {MAX_ARG_STRLEN:,})"
    total = sum(size + 8 for _, size in strings)  # each with its pointer
    try:
        limit = f"{os.sysconf('SC_ARG_MAX'):,}"
    except (OSError, ValueError):
        limit = "a quarter of the stack limit"
    return (f" (its arguments and environment, with what envdoctor set in it, are {total:,} bytes with their "
            f"pointers; the kernel takes {limit})")


def _format_error(path: str) -> str:
    """Why the kernel could not run `path` (ENOEXEC), from its first bytes: a file with a #!
    line got "no #! line" (helper-71), where its line was too long or its interpreter a script."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        head = b""
    if not head.startswith(b"#!"):
        return "exec format error (not a binary and no #! line)"
    line = head[2:].split(b"\n", 1)[0]
    if b"\n" not in head[:BINPRM_BUF_SIZE] and len(head) >= BINPRM_BUF_SIZE:
        return f"exec format error: its #! line is longer than the {BINPRM_BUF_SIZE} bytes the kernel reads"
    interpreter = line.strip().split(maxsplit=1)[0].decode("utf-8", "replace") if line.strip() else ""
    if not interpreter:
        return "exec format error: its #! line names no interpreter"
    return f"exec format error: its #! interpreter {interpreter} is not a binary the kernel can run (a script itself?)"


BINPRM_BUF_SIZE = 256  # the bytes of a file's start the kernel reads for its #! line (Linux 5.1 on; 128 before)
