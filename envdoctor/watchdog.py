"""One primitive for every call that can hang: a bounded call by key.

NVML calls hang when a GPU falls off the bus, statfs hangs on a dead NFS mount,
a name lookup hangs on a broken resolver, a plug-in's check can loop forever.
Python cannot kill a thread, so a call that never returns keeps its thread for
the life of the process. A daemon that re-runs its checks every interval over
many processes must therefore never start the same stuck call again, or it
grows a thread per interval until it dies.

`Watchdog.call(key, fn, timeout)` runs `fn` on a bounded pool of worker threads
and says what happened, as an `Outcome`:

- done: it returned in time (`value`);
- raised: it raised in time, BaseException included (`error`): a plug-in that
  calls sys.exit() is reported as having raised SystemExit, not as a timeout;
- timed_out: it had not returned by the deadline; its key is now *stuck*;
- stuck: the same key is still running from an earlier call, since `since`;
  it is not started again, and no thread is spent on it.

A stuck call whose function finally returns frees its key (and its worker goes
back to the pool). Workers lost to stuck calls are replaced, so the pool keeps
its capacity; their number is bounded by the number of distinct stuck keys, and
beyond `max_stuck` new calls are refused rather than given a thread.

`Watchdog.start_chain(calls)` starts calls that are meant to run one after
another (the checks of one target): one worker runs each as soon as the one
before has returned, without handing back to the caller in between. Each keeps
its own key, outcome and deadline. A caller that finds one slow sends the rest
of the chain to another worker (`Pending.detach_rest()`), so nothing waits
behind a call that may never return. Why: serve runs ~450 checks a run, and
waking the caller and a worker for every one of them cost a quarter of the
run's CPU (measured over 64 processes: 75 ms a run, 58 ms with no hand-over).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import weakref

from envdoctor.record import Record

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable, Hashable, Sequence

DONE, RAISED, TIMED_OUT, STUCK = "done", "raised", "timed_out", "stuck"
_SIGNAL_SLICE = 0.1  # seconds the main thread waits at a time, so its signal handlers run


class Outcome(Record):
    """What became of one bounded call."""

    def __init__(
        self,
        kind: str,
        value: Any = None,
        error: BaseException | None = None,
        since: float | None = None,  # time.time() when the call started, for timed_out and stuck
        where: str = "",  # file:line in function() where a timed-out or stuck call is waiting
        seconds: float = 0.0,  # how long this call took or waited
    ) -> None:
        self.kind = kind
        self.value = value
        self.error = error
        self.since = since
        self.where = where
        self.seconds = seconds

    @property
    def ok(self) -> bool:
        return self.kind == DONE

    def unwrap(self) -> Any:
        """The value, or raise: the function's own exception, or CallTimedOut."""
        if self.kind == DONE:
            return self.value
        if self.kind == RAISED and self.error is not None:
            raise self.error
        raise CallTimedOut(self)

    def describe(self) -> str:
        """One line for a report: what happened, without the value."""
        if self.kind == DONE:
            return "finished"
        if self.kind == RAISED:
            return describe_exception(self.error)
        stamp = time.strftime("%H:%M:%S", time.localtime(self.since)) if self.since else "?"
        at = f", stuck at {self.where}" if self.where else ""
        if self.kind == TIMED_OUT:
            return f"timed out after {self.seconds:.3g} s{at}"
        return f"still stuck since {stamp} from an earlier run{at}; not started again"


class CallTimedOut(Exception):
    """Outcome.unwrap() of a call that timed out or is still stuck."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.describe())
        self.outcome = outcome


def describe_exception(exc: BaseException | None) -> str:
    """`SystemExit(3) at plugin.py:12`: the exception's kind, its text and where it came from."""
    if exc is None:
        return "raised nothing"
    kind = type(exc).__name__
    try:
        text = str(exc)
    except BaseException:  # noqa: B036 - a plug-in's exception whose __str__ itself raises
        text = "<its message could not be read>"
    what = f"{kind}: {text}" if text else kind
    if isinstance(exc, (SystemExit, KeyboardInterrupt, GeneratorExit)):
        what = f"raised {kind}({text})" if text else f"raised {kind}"
    where = where_raised(exc)
    return what + (f" (at {where})" if where else "")


def where_raised(exc: BaseException) -> str:
    """file:line of the innermost frame of a traceback, so an error row points at the bug."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return ""
    return f"{os.path.basename(last.tb_frame.f_code.co_filename)}:{last.tb_lineno}"


class _Done:
    """threading.Event's set, is_set and wait for one call: a lock held until the call is
    done. A serve run makes one per call of its chain at once (~520 over 64 processes),
    and an Event (a Condition, its lock, a deque, two bound methods) took ~1.4 KiB: 0.7
    MiB of a run's high-water mark, which the daemon's memory then stays at. A call is
    set done once, by whoever holds it (the worker that ran it, or that found it
    cancelled, or the pool that could start no worker)."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """As Event.wait: True once set; False when `timeout` seconds passed first (a
        timeout of 0 or less only looks)."""
        if self._set:
            return True
        if timeout is None:
            got = self._lock.acquire()
        else:
            got = self._lock.acquire(timeout > 0, timeout if timeout > 0 else -1)
        if got:
            self._lock.release()  # for the next waiter: a set lock stays free
        return got or self._set


class _Job:
    __slots__ = ("key", "fn", "done", "value", "error", "thread", "started", "cancelled", "abandoned", "t0", "t1", "next", "runnable")

    def __init__(self, key: Hashable, fn: Callable[[], Any]):
        self.key = key
        self.fn = fn
        self.done = _Done()
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.started: float | None = None  # time.time() when a worker took it
        self.cancelled = False  # timed out before any worker took it: never run it
        self.abandoned = False  # timed out while running: its key is stuck
        self.t0 = time.monotonic()  # queued (for a chained call: when the one before it returned)
        self.t1: float | None = None  # finished
        self.next: _Job | None = None  # the call chained after this one, until a worker or detach_rest() takes it
        self.runnable: float | None = self.t0  # None while it waits in a chain behind the call before it


class Pending:
    """A call that was started; `wait(deadline)` turns it into an Outcome."""

    def __init__(self, watchdog: "Watchdog", job: _Job | None, outcome: Outcome | None = None):
        self._watchdog = watchdog
        self._job = job
        self._outcome = outcome

    def finished_within(self, seconds: float) -> bool:
        """Whether the call ends within `seconds`; unlike wait(), says nothing final (a call
        still running is not settled as timed out), so a caller can start the next one."""
        if self._outcome is not None or self._job is None:
            return True
        return self._job.done.wait(seconds)

    def is_done(self) -> bool:
        """Whether it has returned (or was answered without running), without waiting."""
        return self._outcome is not None or self._job is None or self._job.done.is_set()

    def runnable_since(self) -> float | None:
        """time.monotonic() since when it has been running or queued for a worker; None
        while it waits in a chain for the call before it."""
        return None if self._job is None else self._job.runnable

    def detach_rest(self) -> None:
        """This call is slow: the calls chained after it go to another worker now
        instead of waiting for it (start_chain)."""
        if self._job is not None:
            self._watchdog._detach(self._job)

    def wait(self, deadline: float) -> Outcome:
        """Wait until `deadline` (time.monotonic()) at the latest."""
        if self._outcome is not None:
            return self._outcome
        job = self._job
        assert job is not None
        if threading.current_thread() is threading.main_thread():
            # In slices: a signal the kernel delivers to a worker thread (one that was
            # starting a subprocess, with the main thread's signals blocked around its
            # fork) sets Python's flag but does not wake the main thread's lock wait, so
            # its handler (SIGTERM, Ctrl-C) would wait for the check's whole timeout.
            # Seen: `envdoctor check` ignoring SIGINT for 90 s under load.
            while not job.done.wait(min(_SIGNAL_SLICE, max(0.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    break
        else:
            job.done.wait(max(0.0, deadline - time.monotonic()))
        self._outcome = self._watchdog._settle(job, time.monotonic() - job.t0)  # since it could start
        return self._outcome


class Watchdog:
    """A bounded pool of worker threads that remembers which keys are stuck."""

    def __init__(self, max_workers: int = 16, max_stuck: int = 64, name: str = "envdoctor"):
        self.max_workers = max(1, max_workers)
        self.max_stuck = max(1, max_stuck)
        self.name = name
        self._lock = threading.Lock()
        self._queue: "queue.SimpleQueue[_Job]" = queue.SimpleQueue()
        self._workers = 0  # alive worker threads, stuck ones included
        self._idle = 0
        self._stuck: dict[Hashable, _Job] = {}
        self._serial = 0
        self.timeouts_total = 0  # calls that ever timed out (a counter for the monitor)
        self.refused_total = 0  # calls refused because too many keys were stuck
        _INSTANCES.add(self)

    def _forget_threads(self) -> None:
        """In a forked child: only the thread that forked exists there. The counts of
        idle and stuck workers copied from the parent describe threads the child does
        not have (a call queued there would wait for a worker that never comes), and
        the lock may have been copied held. Start from an empty pool."""
        self._lock = threading.Lock()
        self._queue = queue.SimpleQueue()
        self._workers = 0
        self._idle = 0
        self._stuck = {}

    # -- public --------------------------------------------------------------------
    def call(self, key: Hashable, fn: Callable[[], Any], timeout: float) -> Outcome:
        return self.start(key, fn).wait(time.monotonic() + timeout)

    def start(self, key: Hashable, fn: Callable[[], Any]) -> Pending:
        """Start `fn` under `key` unless that key is still stuck; wait on the result later."""
        return self.start_chain([(key, fn)])[0]

    def start_chain(self, calls: "Sequence[tuple[Hashable, Callable[[], Any]]]") -> list[Pending]:
        """Start calls that run one after another on one worker, each as soon as the one
        before it has returned; one Pending each, in order. A key still stuck (or one
        refused) is answered at once and left out of the chain."""
        pendings: list[Pending] = []
        with self._lock:
            head = last = None
            for key, fn in calls:
                refused = self._refusal(key)
                if refused is not None:
                    pendings.append(Pending(self, None, refused))
                    continue
                job = _Job(key, fn)
                if last is None:
                    head = job
                else:
                    job.runnable = None
                    last.next = job
                last = job
                pendings.append(Pending(self, job))
            if head is not None:
                self._queue.put(head)
                self._grow()
        return pendings

    def _refusal(self, key: Hashable) -> Outcome | None:
        """Under the lock: the outcome of a call under `key` that must not start (its key is
        still stuck, or too many are), or None."""
        stuck = self._stuck.get(key)
        if stuck is not None:
            return Outcome(STUCK, since=stuck.started, where=_waiting_at(stuck.thread))
        if len(self._stuck) >= self.max_stuck:
            self.refused_total += 1
            error = RuntimeError(f"{len(self._stuck)} earlier calls are still stuck; not starting another")
            return Outcome(RAISED, error=error)
        return None

    def _detach(self, job: _Job) -> None:
        """The calls chained after `job`, not yet taken by its worker, queued on their own."""
        with self._lock:
            rest, job.next = job.next, None
            if rest is not None:
                rest.t0 = rest.runnable = time.monotonic()
                self._queue.put(rest)
                self._grow()

    def stuck(self) -> dict[Hashable, float | None]:
        """Keys whose call is still running past its deadline, with when it started."""
        with self._lock:
            return {key: job.started for key, job in self._stuck.items()}

    def threads(self) -> int:
        with self._lock:
            return self._workers

    # -- internals -----------------------------------------------------------------
    def _spawn(self) -> None:
        self._serial += 1
        thread = threading.Thread(target=self._work, name=f"{self.name}-worker-{self._serial}", daemon=True)
        self._workers += 1
        try:
            thread.start()
        except RuntimeError as exc:  # can't start new thread (`ulimit -u`, no memory): a traceback before
            self._workers -= 1
            if self._workers == 0:
                self._fail_queued(exc)

    def _fail_queued(self, exc: RuntimeError) -> None:
        """Under the lock, with no worker alive: the queued calls would wait for one until
        their deadlines. Each is answered now, as raising that no thread could be started."""
        while True:
            try:
                job: _Job | None = self._queue.get_nowait()
            except queue.Empty:
                return
            while job is not None:
                job.error = RuntimeError(f"no thread could be started to run it: {exc}")
                job.t1 = time.monotonic()
                job.done.set()
                job.next, job = None, job.next  # the old one's link cut, then on along the chain

    def _grow(self) -> None:
        """Under the lock: one more worker when queued calls outnumber the idle workers
        and fewer than max_workers are alive and not stuck."""
        if self._queue.qsize() > self._idle and self._workers - len(self._stuck) < self.max_workers:
            self._spawn()

    def _work(self) -> None:
        # _idle counts the workers waiting in get(): each counts itself in and out, so
        # the count cannot drift however many callers queue calls at once.
        idle_limit = 30.0
        while True:
            with self._lock:
                self._idle += 1
            try:
                job = self._queue.get(timeout=idle_limit)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    if self._queue.empty():  # start() queues under this lock: nothing can be missed
                        self._workers -= 1
                        return
                continue
            with self._lock:
                self._idle -= 1
            while job is not None:
                self._run(job)
                with self._lock:
                    if job.abandoned and self._stuck.get(job.key) is job:
                        del self._stuck[job.key]  # it came back after all: the key may run again
                    job.next, job = None, job.next  # the chain's next call, now ours
                    if job is not None:
                        job.t0 = job.runnable = time.monotonic()
            # Let go of it before waiting for the next: an idle worker's frame kept its last
            # call (the function's closure, its value, its exception with the traceback's
            # frames), and through them a whole serve run: the session, every result, and
            # the run's own frame. 16 idle workers pinned up to 16 old runs.
            del job

    def _run(self, job: _Job) -> None:
        with self._lock:
            if job.cancelled:
                job.done.set()
                return
            job.thread = threading.current_thread()
            job.started = time.time()
        try:
            job.value = job.fn()
        except BaseException as exc:  # noqa: B036 - SystemExit and KeyboardInterrupt from a check are results too
            job.error = exc
        finally:
            job.t1 = time.monotonic()
            job.done.set()
            # The error's traceback holds this frame, and this frame the job: a cycle that
            # only the cyclic collector frees, and with it the call's frames and what they
            # held (a serve target's session). As concurrent.futures does, let go of it here.
            job = None  # type: ignore[assignment]

    def _settle(self, job: _Job, waited: float) -> Outcome:
        with self._lock:
            if job.done.is_set() and not job.abandoned:
                if job.cancelled:
                    return Outcome(TIMED_OUT, seconds=waited, where="waiting for a free worker")
                took = (job.t1 - job.t0) if job.t1 is not None else waited
                if job.error is not None:
                    return Outcome(RAISED, error=job.error, seconds=took)
                return Outcome(DONE, value=job.value, seconds=took)
            self.timeouts_total += 1
            if job.thread is None:  # never started: all workers were busy
                job.cancelled = True
                return Outcome(TIMED_OUT, seconds=waited, where="waiting for a free worker")
            job.abandoned = True
            self._stuck[job.key] = job
            # A worker is lost to this call; make sure the pool keeps its capacity.
            self._grow()
            return Outcome(TIMED_OUT, since=job.started, where=_waiting_at(job.thread), seconds=waited)


def _waiting_at(thread: threading.Thread | None) -> str:
    """file:line in function() where a thread is right now (where a stuck call waits)."""
    if thread is None or thread.ident is None:
        return ""
    frame = sys._current_frames().get(thread.ident)
    if frame is None:
        return ""
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}()"


_DEFAULT: Watchdog | None = None
_DEFAULT_LOCK = threading.Lock()
_INSTANCES: "weakref.WeakSet[Watchdog]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _DEFAULT_LOCK
    _DEFAULT_LOCK = threading.Lock()
    for watchdog in list(_INSTANCES):
        watchdog._forget_threads()


os.register_at_fork(after_in_child=_after_fork_in_child)


def default_watchdog() -> Watchdog:
    """The process-wide watchdog: one pool and one stuck map for every bounded call."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Watchdog()
        return _DEFAULT
