"""Readers for the /proc files that describe another process.

These take text or bytes, not paths, so they can be property-tested on any input;
the context does the reading, under the configured procfs root.
"""

from __future__ import annotations

from envdoctor.errors import ParseError


class Environ(dict):
    """A process's environment as its programs read it (the first entry of a name), with
    `shadowed`: the later entries of a name given twice, which no lookup returns but a
    shell started from it takes (bash keeps the last). Their values are secrets too
    (redact.secret_values): HF_TOKEN given twice showed the second one (helper-120)."""

    __slots__ = ("shadowed",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.shadowed: tuple[tuple[str, str], ...] = ()


def parse_environ(data: bytes) -> Environ:
    """Parse /proc/N/environ (NUL-separated NAME=value) into a dict.

    Entries without '=' do occur (a program may scribble over its own environ
    block) and are dropped; bytes that are not UTF-8 are kept as U+FFFD so a
    value can never make the reader fail. Of a name given twice the first entry
    wins: glibc's getenv (so libgomp, MKL, the CUDA runtime) and Python's
    os.environ both take the first, and judging the last passed a job running
    64 threads as one running 1 (helper-43).
    """
    if not isinstance(data, (bytes, bytearray)):
        raise ParseError(f"environ must be bytes, got {type(data).__name__}")
    # Decoded once, not per entry (serve reads every process's environ every run): the same
    # text, as NUL and '=' are ASCII and never part of a UTF-8 sequence, and the decoder ends
    # a broken sequence at the first byte that cannot continue it.
    env = Environ()
    shadowed = []
    for entry in bytes(data).decode("utf-8", "replace").split("\0"):
        name, sep, value = entry.partition("=")
        if sep and name:
            if name not in env:
                env[name] = value
            else:
                shadowed.append((name, value))
    if shadowed:
        env.shadowed = tuple(shadowed)
    return env


PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread


def parse_stat(text: str) -> tuple[str, str, int]:
    """(comm, state, flags) from /proc/N/stat. The command name is in parentheses and
    may itself hold spaces and parentheses, so the fields after it are found from the
    last ')'."""
    if not isinstance(text, str):
        raise ParseError(f"stat must be text, got {type(text).__name__}")
    open_paren, close_paren = text.find("("), text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        raise ParseError("not a /proc/N/stat line: no (comm)")
    rest = text[close_paren + 1:].split()
    if len(rest) < 7 or not rest[6].isdigit() or len(rest[6]) > 20:
        raise ParseError("not a /proc/N/stat line: too few fields")
    return text[open_paren + 1:close_paren], rest[0], int(rest[6])


def process_kind(procfs, pid: int) -> tuple[str, str] | None:
    """("zombie" | "kernel thread", comm) when process `pid` exists but has no user-space
    view to examine (no environment, no root, no memory); None for an ordinary
    process, or when /proc/N/stat cannot be read (then the caller's reason stands).
    Reads one small file and never blocks on anything but procfs itself."""
    import os

    path = os.path.join(os.fspath(procfs), str(pid), "stat")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO planted in a fixture tree cannot hold us
        try:
            import stat as stat_module

            if not stat_module.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
        comm, state, flags = parse_stat(data.decode("utf-8", "replace"))
    except (OSError, ParseError):
        return None
    if state in ("Z", "X"):
        return "zombie", comm
    if flags & PF_KTHREAD:
        return "kernel thread", comm
    return None


def explain_kind(pid: int, kind: str, comm: str) -> str:
    """Why a zombie or a kernel thread cannot be examined, in one line."""
    if kind == "zombie":
        return (f"process {pid} ({comm}) is a zombie: it has exited and its parent has not reaped it, so it has "
                "no environment, root or memory left to examine")
    return (f"process {pid} ({comm}) is a kernel thread: it has no user-space environment, root or CUDA to "
            "examine; pass the pid of the training process")
