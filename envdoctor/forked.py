"""Run a function in a forked child under a hard deadline; get its JSON answer back.

Why not the watchdog's threads, as everywhere else: `envdoctor exec` ends in
execve(), and execve must first end every other thread of the process. A thread
stuck in the kernel (an NVML ioctl to a GPU that fell off the bus, a statfs on a
dead mount) cannot be ended until its call returns, so a process that ran its
checks on threads could hang in execve itself, and the job would never start.
Here the checks run in a child; the process that will become the job never
starts a thread, waits for the child's answer only until the deadline, and then
kills the child and goes on without it.

The child writes JSON lines to a pipe (early messages, then its answer) and
leaves with os._exit (no atexit handlers, no flush of buffers copied from the
parent). Before leaving, it kills what it started itself (a probe subprocess
still running) and reaps it, so no stray process outlives the pre-flight and
none is reparented to the job. The child is armed to die with its parent
(PR_SET_PDEATHSIG), so `envdoctor exec` killed outright takes the pre-flight and what
it started (a cross-rank exchange holding MASTER_PORT) with it. A child that cannot be reaped within half a
second (a thread of it stuck in the kernel) is left behind: it becomes the
command's child, and a zombie of the command's once it finally exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time

from envdoctor import fdwait
from envdoctor.record import Record
from envdoctor.stopping import children_of  # here too: callers and tests take it from forked

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator

DONE, RAISED, TIMED_OUT = "done", "raised", "timed_out"
_REAP_SECONDS = 0.5


class ChildOutcome(Record):
    def __init__(
        self,
        kind: str,  # done | raised | timed_out
        value: Any = None,
        error: str = "",
        seconds: float = 0.0,
        messages: list[Any] | None = None,  # sent by the child before its answer
    ) -> None:
        self.kind = kind
        self.value = value
        self.error = error
        self.seconds = seconds
        self.messages = [] if messages is None else messages


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, children before their own children, all read
    before anything is killed: a killed child's children go to PID 1 at once, and the
    torch probe that exec's pre-flight child starts runs in a session of its own."""
    found: list[int] = []
    level = children_of(pid)
    while level:
        found.extend(level)
        level = [grandchild for child in level for grandchild in children_of(child) if grandchild not in found]
    return found


def kill_tree(pids: list[int]) -> None:
    """SIGKILL each pid and, where it leads a process group (the torch probe does), its group."""
    for pid in pids:
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _reap(pids: list[int], seconds: float) -> list[int]:
    """waitpid each pid for at most `seconds` in all; returns those that did not go."""
    left = list(pids)
    deadline = time.monotonic() + seconds
    while left:
        for pid in list(left):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                left.remove(pid)
        if not left or time.monotonic() >= deadline:
            break
        _until_exit(left[0], deadline)
    return left


def _until_exit(pid: int, deadline: float) -> None:
    """Sleep until `pid` exits or the deadline passes: on a pidfd (Linux 5.3+), else 5 ms.
    A child that has just sent its answer exits within a millisecond, and a fixed 5 ms
    sleep added those 5 ms to the start of every job."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here, or the pid is already reaped
        time.sleep(0.005)
        return
    try:
        fdwait.ready(fd, timeout=max(0.0, deadline - time.monotonic()))
    finally:
        os.close(fd)


_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37


_PRCTL_ADDRESS: int | None = None


def _prctl(option: int, value: Any) -> int:
    """prctl(2) through _ctypes, the C half of ctypes: the call ctypes.CDLL(None).prctl(
    option, value, 0, 0, 0) makes (an int passed as a C int, a byref() as its pointer),
    without importing the ctypes package around it: ~3 ms, paid by exec's pre-flight
    child before its first check (die_with_parent) and by `check` (contained). An
    interpreter whose _ctypes lacks these goes through ctypes."""
    global _PRCTL_ADDRESS
    try:
        from _ctypes import call_function, dlopen, dlsym
    except ImportError:
        pass
    else:
        if _PRCTL_ADDRESS is None:
            _PRCTL_ADDRESS = dlsym(dlopen(None, os.RTLD_LOCAL), "prctl")  # the C library's, as CDLL(None) finds it
        return call_function(_PRCTL_ADDRESS, (option, value, 0, 0, 0))
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def adopt_orphans(adopt: bool = True) -> bool:
    """Be (or stop being) the child subreaper of what this process starts (prctl
    PR_SET_CHILD_SUBREAPER, Linux 3.4+): a grandchild orphaned by a double fork
    (`setsid daemon &` in a plug-in's shell command) is then re-parented to us, not to
    PID 1, so descendants() still finds it and kill_tree() can end it. False where it
    could not be set (not Linux, no libc symbol)."""
    try:
        return _prctl(_PR_SET_CHILD_SUBREAPER, int(adopt)) == 0
    except Exception:  # noqa: BLE001 - AttributeError, OSError: nothing to adopt with
        return False


def adopts_orphans() -> bool:
    """Whether this process is a child subreaper already (a bit kept across execve).
    The answer comes back through a pointer: a C int built from _ctypes' own base
    (ctypes.c_int is this class), so `check`'s containment does not import ctypes."""
    try:
        try:
            from _ctypes import _SimpleCData, byref

            class CInt(_SimpleCData):
                _type_ = "i"
        except ImportError:  # an interpreter whose ctypes is laid out otherwise
            from ctypes import byref, c_int as CInt

        flag = CInt(0)
        return _prctl(_PR_GET_CHILD_SUBREAPER, byref(flag)) == 0 and bool(flag.value)
    except Exception:  # noqa: BLE001
        return False


@contextlib.contextmanager
def contained(orphans: bool = True) -> Iterator[None]:
    """Nothing started inside the block outlives it: orphans are adopted while it runs,
    and every child that was not there before it is killed when it ends, with all below it.
    `orphans=False` (serve's daemon, which runs for weeks and reaps no one else's
    children): no adopting, only the children it started are killed at the end.

    A check that times out is left running on its thread, and so is the tool it waits
    on (a hung `nvidia-smi`); a plug-in may start a daemon. Both outlived `envdoctor
    check` as orphans of PID 1. Children that were there before (an embedding caller's,
    or a shell's background job when the shell exec'd envdoctor) are left alone, and so is
    all they start; the killed ones are reaped by whoever waits on them, or by the
    process's own exit (a double-forked orphan stays a zombie until then). The price of
    leaving a shell's jobs alone: with children at the start, a check's double-forked
    daemon is not adopted and goes on (README, "hangs")."""
    me = os.getpid()
    before = set(children_of(me))
    inherited = adopts_orphans()  # kept across the execve that started us
    # A process that already has children (a shell that exec'd us kept its background
    # jobs) adopts nothing: an orphan could be one of theirs, and theirs are not ours to end.
    adopt = orphans and not before and not inherited
    if adopt:
        adopt_orphans(True)
    try:
        yield
    finally:
        # With those children and a subreaper bit we were given, a new child may be one
        # of their orphans, indistinguishable from ours: then nothing is killed.
        if not (before and inherited):
            started = [pid for pid in children_of(me) if pid not in before]
            kill_tree([pid for child in started for pid in (child, *descendants(child))])
        if adopt:
            adopt_orphans(False)


def die_with_parent(parent: int) -> None:
    """In the child: be SIGKILLed when the parent dies (PR_SET_PDEATHSIG). If `envdoctor
    exec` is killed mid-pre-flight, the child and what it started (the cross-rank exchange
    holding MASTER_PORT, a torch probe) go too, instead of running to their own deadlines
    as orphans. A parent already gone before the signal was armed: leave at once."""
    try:
        _prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux, or no libc symbol: the parent's own kill still bounds us
        pass
    if os.getppid() != parent:
        os._exit(2)


def _write_line(fd: int, payload: dict[str, Any]) -> None:
    data = memoryview((json.dumps(payload, default=str) + "\n").encode("utf-8", "surrogateescape"))
    while data:  # a view: slicing bytes copied the rest at every write, quadratic in a 100 MB answer
        data = data[os.write(fd, data):]


def answer_and_exit(fn: Callable[[Callable[[Any], None]], Any], fd: int, quiet: bool) -> None:
    """In the child: run fn, write its messages and its answer as JSON lines, clean up, _exit."""
    code = 0
    adopt_orphans()  # a double-forked daemon comes back to us, and goes in the sweep below
    if quiet:  # what fn prints must not mix into the parent's report or its one-line error
        try:
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
        except OSError:
            pass
    else:  # the answer goes through the pipe; a plug-in's print is not the job's output (helper-85)
        try:
            os.fstat(2)
            os.dup2(2, 1)
        except OSError:  # stderr closed: to /dev/null, never left on the job's stdout (helper-87)
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                if devnull != 1:
                    os.close(devnull)
            except OSError:
                pass
    try:
        try:
            payload = {"value": fn(lambda message: _write_line(fd, {"message": message}))}
        except BaseException as exc:  # noqa: B036 - anything the pre-flight raises is an answer
            from envdoctor.watchdog import describe_exception

            payload = {"error": describe_exception(exc)}
            code = 1
        _write_line(fd, payload)
    except BaseException:  # noqa: B036 - a closed pipe: the parent gave up on us
        code = 2
    finally:
        try:
            strays = descendants(os.getpid())  # grandchildren too: `sh -c 'sleep & sleep'` held the job's stdout
            kill_tree(strays)
            _reap([pid for pid in strays if pid in children_of(os.getpid())], _REAP_SECONDS)
        finally:
            os._exit(code)


def _read_lines(r: int, deadline: float, what: str) -> tuple[list[Any], dict[str, Any] | None, str]:
    """(messages, the final payload or None, why there is none) read from the child by `deadline`."""
    buffer = bytearray()  # appended in place, and searched only where new bytes came in: a
    messages: list[Any] = []  # 40 MB answer took 7 s when each read re-copied and re-searched it all
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return messages, None, "timed out"
        if not fdwait.ready(r, timeout=left):
            return messages, None, "timed out"
        chunk = os.read(r, 1 << 20)
        if not chunk:
            return messages, None, f"{what} died without an answer"
        searched = len(buffer)
        buffer += chunk
        while (end := buffer.find(b"\n", searched)) >= 0:
            line = bytes(buffer[:end])
            del buffer[:end + 1]
            searched = 0
            try:
                payload = json.loads(line.decode("utf-8", "surrogateescape"))
            except ValueError as exc:
                return messages, None, f"unreadable answer from {what}: {exc}"
            if "message" in payload:
                messages.append(payload["message"])
            else:
                return messages, payload, ""


def call(fn: Callable[[Callable[[Any], None]], Any], timeout: float, what: str = "the pre-flight process",
         quiet: bool = False) -> ChildOutcome:
    """Run `fn(send)` in a forked child. `send(obj)` passes an early message to the
    parent (what it is about to do, in case it never finishes); the return value is
    the answer. Both must be JSON-serialisable.

    Returns within `timeout` seconds (plus at most half a second to reap a killed
    child): done with the value, raised with a one-line description, or timed_out
    (the child and whatever it started were killed). `messages` holds what the
    child sent either way."""
    started = time.monotonic()
    try:
        r, w = pipe()
    except OSError as exc:  # out of descriptors: an answer, as a child that broke is
        return ChildOutcome(RAISED, error=f"cannot start {what}: {exc.strerror or exc}")
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:  # out of processes (`ulimit -u`) or memory: the same
        os.close(r)
        os.close(w)
        return ChildOutcome(RAISED, error=f"cannot start {what}: {exc.strerror or exc}")
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        os.close(r)
        die_with_parent(parent)
        answer_and_exit(fn, w, quiet)
    os.close(w)
    return collect(pid, r, started, started + timeout, what)


def pipe() -> tuple[int, int]:
    """(read end, write end), both at descriptor 3 or above and not inheritable (PEP 446):
    the command that execve starts never sees them."""
    ends = list(os.pipe())
    try:
        for i, fd in enumerate(ends):
            ends[i] = _above_stdio(fd)
    except OSError:  # out of descriptors for the move: neither end may stay taken
        for fd in ends:
            try:
                os.close(fd)
            except OSError:
                pass
        raise
    return ends[0], ends[1]


def collect(pid: int, r: int, started: float, deadline: float, what: str = "the pre-flight process") -> ChildOutcome:
    """The outcome of child `pid`, which answers on `r` (closed here): read until `deadline`;
    a child with no answer by then is killed with all it started, and reaped."""
    try:
        messages, payload, why = _read_lines(r, deadline, what)
    finally:
        os.close(r)
    seconds = time.monotonic() - started
    if payload is None:
        strays = descendants(pid)
        kill_tree([pid, *strays])
        _reap([pid], _REAP_SECONDS)
        if os.getpid() == 1:  # orphans of the killed child come to PID 1: reap the ones that went
            _reap_any(_REAP_SECONDS)
        if why == "timed out":
            return ChildOutcome(TIMED_OUT, seconds=seconds, messages=messages)
        return ChildOutcome(RAISED, error=why, seconds=seconds, messages=messages)
    _reap([pid], _REAP_SECONDS)
    if "error" in payload:
        return ChildOutcome(RAISED, error=str(payload["error"]), seconds=seconds, messages=messages)
    return ChildOutcome(DONE, value=payload.get("value"), seconds=seconds, messages=messages)


def _above_stdio(fd: int) -> int:
    """The same pipe end at descriptor 3 or above. Started with stderr closed, os.pipe()
    would hand out descriptor 2, and whatever the child then printed as an error would
    land in the answer."""
    if fd > 2:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved


def _reap_any(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.005)
