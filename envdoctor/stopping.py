"""How the `envdoctor` command's processes stop: on SIGTERM, Ctrl-C, a hangup,
Ctrl-\\ or SIGUSR1/2, nothing they started is left running, and a standard output they were
started without says so.

Installed by the CLI (envdoctor.cli.main) and by exec's pre-flight child, which is
forked before the CLI is imported (envdoctor.exec_headstart) and so inherits neither.
Here, not in the CLI: the child must not import typer to have them.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import sys


def kill_probes() -> None:
    """Kill every torch probe still running, and its whole process group (if any was started)."""
    probe = sys.modules.get("envdoctor.probe")
    if probe is not None:
        probe.kill_running()


def children_of(pid: int, proc: str = "/proc") -> list[int]:
    """The live children of `pid`, from PROC/PID/task/*/children (empty when unreadable)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"{proc}/{pid}/task/{tid}/children") as f:
                found.extend(int(p) for p in f.read().split())
        except (OSError, ValueError):
            continue
    return found


# The children this process started with (None: not noted, envdoctor as a library). A
# shell that exec'd envdoctor hands over its background jobs (`sleep 300 & exec
# envdoctor ...`): they are the shell's, and a SIGTERM to envdoctor killed them too.
inherited_children: frozenset[int] | None = None


def note_inherited_children() -> None:
    """Called first thing by the `envdoctor` command (envdoctor.program)."""
    global inherited_children
    inherited_children = frozenset(children_of(os.getpid()))


def kill_everything_started() -> None:
    """On SIGTERM/SIGINT: the probes, then every descendant this process started, each
    with its group where it leads one. The command owns all of its own children (probes,
    the pre-flight's forked child), and a probe whose worker thread had not yet registered
    it when the signal came would otherwise run on in its own session after envdoctor
    exits (seen on a loaded CI machine). Children it started with, and theirs, are left."""
    kill_probes()
    try:
        from envdoctor.forked import descendants, kill_tree
    except (ImportError, AttributeError):  # the signal came while forked itself was importing: nothing started yet
        return
    ours = [pid for pid in children_of(os.getpid()) if pid not in (inherited_children or ())]
    kill_tree([pid for child in ours for pid in (child, *descendants(child))])  # exec's pre-flight child, its probe


def on_sigterm(signum, frame) -> None:
    """SIGTERM, SIGHUP (the terminal or ssh session went away), SIGUSR1 or SIGUSR2: exit
    128 + the signal, after what the process started. At the default action the process died at once, and
    a torch probe, in a session of its own, ran on under PID 1."""
    from envdoctor.errors import Terminated

    kill_everything_started()  # first: a probe runs in its own session and would not hear the signal
    raise Terminated(128 + signum)


def on_sigquit(signum, frame) -> None:
    """Ctrl-\\: what SIGTERM kills goes too, then the signal's own default action (a core
    dump where the limit allows one), as without envdoctor."""
    kill_everything_started()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def on_sigint(signum, frame) -> None:
    """Ctrl-C: what SIGTERM kills goes too, then Python's KeyboardInterrupt as usual.
    typer turns that into exit 130 inside the CLI, before main() could clean up."""
    from envdoctor.errors import Interrupted

    kill_everything_started()
    raise Interrupted


class ClosedStdout(io.TextIOBase):
    """Stands in for a standard output the process was started without (`>&-`). click
    writes nothing to None, so `checks`, `explain` and --version said nothing and exit 0;
    here a write is the error it is, and main() makes it exit 74 like `check`."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")

    def fileno(self) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


def install() -> None:
    """The handlers and the stand-in, in the main thread of an envdoctor command's process.

    A signal the invoker ignores (`nohup`, `trap '' INT`, a shell's background job) stays
    ignored: a handler installed over it took the ignore away from the job too, since
    execve resets a handled signal to its default, and a background job's Ctrl-C
    reached it."""
    if sys.stdout is None:
        sys.stdout = ClosedStdout()
    try:
        for sig, handler in ((signal.SIGTERM, on_sigterm), (signal.SIGINT, on_sigint),
                             (signal.SIGHUP, on_sigterm), (signal.SIGQUIT, on_sigquit),
                             # their default action ends the process too, and left a probe running
                             (signal.SIGUSR1, on_sigterm), (signal.SIGUSR2, on_sigterm)):
            if signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, handler)
    except (ValueError, OSError):  # not the main thread (embedded use): leave the handlers alone
        pass


# Failures to write the output: said in one line and ended with EXIT_IO, never a traceback.
OUTPUT_ERRNOS = (errno.EPIPE, errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG, errno.EBADF)
EXIT_IO = 74  # EX_IOERR: the report could not be written (a full disk, a closed stdout); not bad usage


def run_command(command, say_interrupted: bool = True) -> int:
    """Run one `envdoctor` command (a function returning its exit status) as the command
    line runs it: with these handlers; a Ctrl-C ends quietly with 130 and SIGTERM with 143,
    as shells expect, and neither leaves a probe (or anything it started) running; a report
    that cannot be written ends with EXIT_IO. Used by the CLI and by exec's fast start
    (envdoctor.program), which does not import the CLI."""
    try:
        install()  # inside: a Ctrl-C between installing SIGINT's handler and the next line is ours too
        try:
            return command()
        finally:
            if sys.stdout is not None:
                sys.stdout.flush()  # what `checks`, `explain`, --help wrote: a full disk or a gone reader shows here
    except KeyboardInterrupt:
        kill_everything_started()
        if say_interrupted:
            try:
                sys.stderr.write("envdoctor: interrupted\n")
            except (OSError, ValueError):
                pass
        return 130
    except OSError as exc:
        if exc.errno not in OUTPUT_ERRNOS:
            raise
        try:  # `check` says this itself; the other commands write through click, which lets it escape
            sys.stderr.write(f"envdoctor: cannot write the output: {exc.strerror or exc}\n")
        except (OSError, ValueError, AttributeError):  # AttributeError: started with stderr closed too
            pass
        return EXIT_IO
