"""`envdoctor exec`'s pre-flight child, forked before the CLI is imported.

Why: the pre-flight runs in a forked child (envdoctor.forked), and most of what that
child did before its first check was importing: the engine, the registry and the
built-in checks, about 55 ms here. Meanwhile the parent had spent about as long
importing the CLI (typer) to parse the options, and the two came one after the other
at every container start. Forked first, the child imports while the parent parses;
then it waits for the parsed options on a pipe and runs the pre-flight exactly as a
child forked at that moment would have (forked.answer_and_exit, the same bound, the
same kill at the deadline).

Nothing the child does before the options come is seen outside it: it imports
envdoctor's own modules only. Plug-in checks are imported after, by the pre-flight,
under its bound, in the environment the command will get. A parent that never sends
(`--help`, a usage error, a command not found) leaves, which closes the pipe: the child
leaves without a word; it is also armed to die with its parent.
"""

from __future__ import annotations

import json
import os
import signal
import time

from envdoctor import fdwait, forked

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping, Sequence

_HELP = frozenset(("-h", "--help"))


class HeadStart:
    """The waiting child: its pid, the end its answer comes on, the end its work goes to."""

    def __init__(self, pid: int, answers: int, work: int, environ: dict[str, str]):
        self.pid, self.answers, self.work, self.environ = pid, answers, work, environ

    def run(self, options: Any, env: Mapping[str, str], argv: Sequence[str], started: float,
            timeout: float) -> forked.ChildOutcome:
        """What forked.call(in_child(...), timeout) returns, from the child that was waiting."""
        deadline = started + timeout
        work = {"options": dict(vars(options)), "argv": list(argv), "started": started,
                # the environment it forked with, unless the parent's differs (an entry it drops)
                "env": None if dict(env) == self.environ else dict(env)}
        data = json.dumps(work).encode("utf-8", "surrogateescape")
        sent = _send(self.work, data, deadline)
        os.close(self.work)
        if not sent:  # stuck before reading (its imports hung): what collect() does at the deadline
            return forked.collect(self.pid, self.answers, started, time.monotonic(), "the pre-flight process")
        return forked.collect(self.pid, self.answers, started, deadline, "the pre-flight process")


_waiting: HeadStart | None = None
# In the child: the entry points _import_ahead listed, for the pre-flight's own registry load.
_listed: list | None = None


def wanted(argv: Sequence[str]) -> bool:
    """`envdoctor exec ... -- CMD`, not asking for help: a run that will need the child."""
    if len(argv) < 3 or argv[1] != "exec" or "--" not in argv[2:]:
        return False
    options = argv[2:argv.index("--", 2)]
    return not _HELP.intersection(options)


def begin() -> None:
    """Fork the pre-flight child now, if it can be (else exec forks it later, as it did)."""
    global _waiting
    fds: list[int] = []
    try:
        fds.extend(forked.pipe())
        fds.extend(forked.pipe())
    except OSError:  # out of descriptors: give back what was taken, for the command's own needs
        _close(fds)
        return
    answers_r, answers_w, work_r, work_w = fds
    environ = dict(os.environ)
    parent = os.getpid()
    # Until the child has its own handlers, a Ctrl-C or SIGTERM waits (the CLI's handlers
    # are not installed yet, and Python's default raised KeyboardInterrupt in the child)
    stopping = {signal.SIGINT, signal.SIGTERM}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        _close(fds)
        return
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        try:
            for sig in stopping:  # nothing started yet: leave without a word (an ignored one stays ignored)
                if signal.getsignal(sig) != signal.SIG_IGN:
                    signal.signal(sig, _leave)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            os.close(answers_r)
            os.close(work_w)
            forked.die_with_parent(parent)
            _wait_then_run(work_r, answers_w, environ)
        finally:  # whatever escapes (a signal between two handlers) must not run the parent's code here
            os._exit(1)
    os.close(answers_w)
    os.close(work_r)
    _waiting = HeadStart(pid, answers_r, work_w, environ)  # before a waiting Ctrl-C can land: abandon() finds it
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def abandon() -> None:
    """The child, if it was never handed work (the CLI ended first, in a process that goes
    on: a runpy caller), is ended and reaped; in one that exits, its pipe and
    PR_SET_PDEATHSIG would end it anyway."""
    waiting = take()
    if waiting is None:
        return
    _close([waiting.work, waiting.answers])
    try:
        os.kill(waiting.pid, signal.SIGKILL)  # it has only imported: nothing of it to keep
        os.waitpid(waiting.pid, 0)
    except OSError:
        pass


def _close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _leave(signum: int, frame: Any) -> None:  # pragma: no cover - in the child
    os._exit(128 + signum)


def take() -> HeadStart | None:
    """The waiting child, handed out once (None when none was forked)."""
    global _waiting
    waiting, _waiting = _waiting, None
    return waiting


def _wait_then_run(work: int, answers: int, environ: dict[str, str]) -> None:  # pragma: no cover - in the child
    try:
        _import_ahead()
        data = _read_all(work)
        os.close(work)  # one descriptor more for the checks (a tight `ulimit -n`)
        if not data:  # the parent left without sending: nothing to do, nothing to say
            os._exit(0)
        job = json.loads(data.decode("utf-8", "surrogateescape"))
    except BaseException:  # noqa: B036 - Ctrl-C, a closed pipe: the parent handles its own end
        os._exit(0)

    from envdoctor import stopping

    stopping.install()  # what the CLI's process has: SIGTERM and Ctrl-C end what the pre-flight started

    def preflight(send: Any) -> Any:  # in answer_and_exit: what breaks here is an answer too
        from envdoctor.exec_preflight import ExecOptions, in_child

        options = ExecOptions(**{k: tuple(v) if isinstance(v, list) else v for k, v in job["options"].items()})
        env = environ if job["env"] is None else job["env"]
        return in_child(options, env, job["argv"], job["started"], send, listed=_listed)

    forked.answer_and_exit(preflight, answers, False)


def _import_ahead() -> None:  # pragma: no cover - in the child
    """What the pre-flight imports before its first check, except plug-ins: a failure here
    is left for the pre-flight to meet and report."""
    global _listed
    try:
        from envdoctor import config, exec_preflight, pipeline, registry  # noqa: F401

        listed = registry.entry_points_of(registry.GROUP)
        registry.load(autoload_plugins=False, listed=listed, for_mode="exec")
        _listed = listed  # the pre-flight's own load reads the same list (the plug-ins from it too)
    except Exception:  # noqa: BLE001 - met again, and reported, by the pre-flight itself
        pass


def _read_all(fd: int) -> bytes:  # pragma: no cover - in the child
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _send(fd: int, data: bytes, deadline: float) -> bool:
    """Write all of `data` by `deadline`. A command line or an environment can be larger
    than a pipe holds, and a child stuck in its imports never reads: the write must not
    hold the job past the pre-flight's bound."""
    os.set_blocking(fd, False)
    view = memoryview(data)
    while view:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            if fdwait.ready(fd, write=True, timeout=left):
                view = view[os.write(fd, view):]
        except BlockingIOError:
            continue
        except OSError:  # the child is gone: collect() says how
            return True
    return True
