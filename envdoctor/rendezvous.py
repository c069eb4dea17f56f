"""The cross-rank exchange, envdoctor's side: run probe/store_exchange.py in the
target interpreter and converse with it, within one deadline.

Every rank of a distributed launch publishes its facts in a store all ranks can
reach; rank 0 gathers them, envdoctor judges them (here, in its own process,
through the `decide` callback), and rank 0 publishes the verdict so every rank
reports the same result and exits with the same code. The store is torchrun's
agent store where there is one (TORCHELASTIC_USE_AGENT_STORE=True), otherwise
one rank 0 hosts on MASTER_ADDR:MASTER_PORT for the duration of the exchange;
see store_exchange.py for the keys and why.

envdoctor's process never imports torch: the store client lives in the
subprocess, which is killed (its whole process group) at the deadline, so a rank
that never comes, a store that never answers or a torch that hangs on import
costs the deadline, never a hang.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import namedtuple
from pathlib import Path

from envdoctor import fdwait
from envdoctor.errors import EnvdoctorError, Unavailable
from envdoctor.probe import resolve_python
from envdoctor.record import Record

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable

MARKER = "ENVDOCTOR-STORE "
NAMESPACE = "envdoctor/dist.consistency/v1/"
_SCRIPT = Path(__file__).with_name("probe") / "store_exchange.py"
_TAIL = 1500


class ExchangeError(EnvdoctorError):
    """The exchange could not be completed: the store could not be hosted, torch
    broke, or the subprocess died or ran past its deadline."""


class StoreUnreachable(ExchangeError):
    """This rank could not reach the store (rank 0's, or the launcher's) in time."""


_hosted: set[int] = set()
_hosted_lock = threading.Lock()


def ports_hosted() -> frozenset[int]:
    """Ports this process's own exchange is hosting a store on right now (dist.env
    must not mistake that for a port the job cannot have)."""
    with _hosted_lock:
        return frozenset(_hosted)


class Request(namedtuple("Request", (
        "rank",  # int
        "world_size",  # int
        "master_addr",  # str
        "master_port",  # int
        "agent_store",  # bool: torchrun's agent hosts the store; else rank 0 hosts one
        "run_id",  # str: the same on every rank of one launch (TORCHELASTIC_RUN_ID/RESTART_COUNT)
        "facts",  # dict[str, Any]
        "wait_seconds",  # float = 60.0: how long rank 0 waits for every rank to publish
        "ack_seconds",  # float = 10.0: how long rank 0 waits for the others to read the verdict
        "import_seconds",  # float = 60.0: `import torch` in the subprocess
        "slack_seconds",  # float = 10.0: for rank 0 to judge, and for process start and exit
), defaults=(60.0, 10.0, 60.0, 10.0))):
    """What one rank brings to the exchange."""

    __slots__ = ()

    @property
    def namespace(self) -> str:
        return f"{NAMESPACE}{self.run_id}/"

    @property
    def connect_seconds(self) -> float:
        # A client of rank 0's own store may start before rank 0 does: wait as long as rank 0 waits.
        return self.wait_seconds if not self.agent_store else min(self.wait_seconds, 30.0)

    @property
    def verdict_seconds(self) -> float:
        # Rank 0 may arrive up to wait_seconds after us, then wait up to wait_seconds itself.
        return 2 * self.wait_seconds + self.slack_seconds

    @property
    def deadline_seconds(self) -> float:
        """The most the whole exchange may take on this rank, import included."""
        return self.import_seconds + self.connect_seconds + self.verdict_seconds + self.ack_seconds + self.slack_seconds

    def fitted(self, seconds: float) -> "Request":
        """This request with every wait shrunk in proportion so the whole exchange ends
        within `seconds` (exec's budget, a short --timeout): an answer inside the limit,
        not a check killed by the runner mid-exchange while other ranks still wait on it.
        Every rank of one launch runs with the same limit, so their waits still agree."""
        fitted = self
        for _ in range(4):  # the agent store's connect wait is capped, not proportional: shrink again
            if seconds >= fitted.deadline_seconds or fitted.deadline_seconds <= 0:
                break
            scale = max(0.0, seconds) / fitted.deadline_seconds
            fitted = fitted._replace(wait_seconds=fitted.wait_seconds * scale, ack_seconds=fitted.ack_seconds * scale,
                             import_seconds=fitted.import_seconds * scale, slack_seconds=fitted.slack_seconds * scale)
        return fitted

    def to_json(self) -> str:
        return json.dumps({
            "rank": self.rank, "world_size": self.world_size, "master_addr": self.master_addr,
            "master_port": self.master_port, "agent_store": self.agent_store, "namespace": self.namespace,
            "wait_seconds": self.wait_seconds, "ack_seconds": self.ack_seconds,
            "connect_seconds": self.connect_seconds, "verdict_seconds": self.verdict_seconds,
            "facts": self.facts,
        }, sort_keys=True, default=str)


class Outcome(Record):
    """What the exchange gave this rank.

    Rank 0: `ranks` (rank -> facts, as published, torch versions included),
    `claims` (rank -> how many processes published under that RANK) and the
    verdict it decided. Another rank: `verdict` as rank 0 published it, or
    `verdict is None` with `waited_seconds` when none came in time.
    """

    def __init__(
        self,
        role: str,  # "judge" (rank 0) or "follower"
        own: dict[str, Any] | None = None,  # this rank's facts as published
        ranks: dict[int, dict[str, Any]] | None = None,
        claims: dict[int, int] | None = None,
        verdict: dict[str, Any] | None = None,
        waited_seconds: float | None = None,
        hosted: bool = False,
        acked: int | None = None,
        expected_acks: int | None = None,
        events: list[str] | None = None,
    ) -> None:
        self.role = role
        self.own = {} if own is None else own
        self.ranks = {} if ranks is None else ranks
        self.claims = {} if claims is None else claims
        self.verdict = verdict
        self.waited_seconds = waited_seconds
        self.hosted = hosted
        self.acked = acked
        self.expected_acks = expected_acks
        self.events = [] if events is None else events


class _Lines:
    """Marked event lines from a pipe, each read within a deadline (select, no thread)."""

    def __init__(self, stream):
        self._fd = stream.fileno()
        self._buffer = b""
        self.other = bytearray()  # what the script printed besides events (kept for error messages)
        self.closed = False

    def next_event(self, deadline: float) -> dict[str, Any] | None:
        """The next event, or None at end of stream; raises TimeoutError at the deadline."""
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                text = line.decode("utf-8", "replace")
                if text.startswith(MARKER):
                    try:
                        event = json.loads(text[len(MARKER):])
                    except ValueError:
                        continue
                    if isinstance(event, dict):
                        return event
                elif text:
                    self.other += line[-_TAIL:] + b"\n"
            if self.closed:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            if not fdwait.ready(self._fd, timeout=remaining):
                raise TimeoutError
            chunk = os.read(self._fd, 65536)
            if not chunk:
                self.closed = True
                self._buffer += b"\n"
            self._buffer += chunk


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip()
    return ("..." + text[-_TAIL:]) if len(text) > _TAIL else text


def exchange(python: str, request: Request, decide: Callable[[Outcome], dict[str, Any]]) -> Outcome:
    """Take part in the exchange as `request.rank`; on rank 0, `decide(outcome)` turns the
    gathered facts into the verdict (a JSON-able dict) every rank then reports.

    Raises Unavailable when the interpreter has no torch, ExchangeError when the
    exchange could not be completed; returns within request.deadline_seconds.
    """
    python = resolve_python(python)
    source = _SCRIPT.read_text(encoding="utf-8")
    hosting = request.rank == 0 and not request.agent_store
    if hosting:
        with _hosted_lock:
            _hosted.add(request.master_port)
    try:
        return _exchange(python, source, request, decide)
    finally:
        if hosting:
            with _hosted_lock:
                _hosted.discard(request.master_port)


def _exchange(python: str, source: str, request: Request, decide: Callable[[Outcome], dict[str, Any]]) -> Outcome:
    import subprocess  # here, as tempfile: only a distributed launch exchanges, and both cost every start
    import tempfile

    # stderr goes to a file, not a pipe: torch or a sitecustomize that prints a lot must
    # not block the script on a full pipe nobody reads while we wait on its events.
    with tempfile.TemporaryFile() as errors:
        try:
            proc = subprocess.Popen([python, "-c", source], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=errors, cwd=os.path.abspath(os.sep), start_new_session=True)
        except OSError as exc:
            raise Unavailable(f"cannot start {python}: {exc.strerror or exc}") from None
        proc.errors = errors  # type: ignore[attr-defined]  # read by _said for error messages
        return _run(proc, request, decide)


def _run(proc: subprocess.Popen, request: Request, decide: Callable[[Outcome], dict[str, Any]]) -> Outcome:
    import subprocess

    deadline = time.monotonic() + request.deadline_seconds
    lines = _Lines(proc.stdout)
    outcome = Outcome(role="judge" if request.rank == 0 else "follower")
    try:
        assert proc.stdin is not None
        proc.stdin.write((request.to_json() + "\n").encode("utf-8"))
        proc.stdin.flush()
        _converse(proc, lines, request, outcome, decide, deadline)
    except TimeoutError:
        raise ExchangeError(f"the exchange did not finish within {request.deadline_seconds:g} s "
                            f"(last step: {outcome.events[-1] if outcome.events else 'starting'}); killed") from None
    except (BrokenPipeError, OSError) as exc:
        try:  # a pipe broken because the script already died: say how it ended, as _converse does
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        what = (f"the exchange subprocess exited with status {proc.returncode} before it was done"
                if proc.returncode is not None else f"lost the exchange subprocess: {exc.strerror or exc}")
        raise ExchangeError(what + _said(proc, lines)) from None
    finally:
        if proc.poll() is None:
            try:
                proc.wait(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            _kill_group(proc)
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:  # a dead script's stdin: what was left unread cannot be flushed
                pass
    return outcome


def _said(proc: subprocess.Popen, lines: _Lines) -> str:
    """The tail of what the script printed besides its events, for an error message."""
    err = b""
    try:
        errors = proc.errors  # type: ignore[attr-defined]
        errors.seek(max(0, errors.seek(0, os.SEEK_END) - 4 * _TAIL))
        err = errors.read()
    except (AttributeError, OSError, ValueError):
        pass
    said = _tail(bytes(lines.other) + err)
    return f"; it printed: {said}" if said else ""


def _converse(proc, lines: _Lines, request: Request, outcome: Outcome, decide, deadline: float) -> None:
    while True:
        event = lines.next_event(deadline)
        if event is None:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            raise ExchangeError(f"the exchange subprocess exited with status {proc.returncode} before it was done"
                                + _said(proc, lines))
        kind = event.get("event")
        outcome.events.append(str(kind))
        if kind == "no_torch":
            raise Unavailable(f"no torch in {proc.args[0]}: the exchange between ranks uses "
                              "torch.distributed.TCPStore (pass --python PATH to use the job's interpreter); "
                              "ranks that have it wait for this one, then report it missing")
        if kind == "connect_failed" and not event.get("hosting"):
            raise StoreUnreachable(f"could not reach the store at {request.master_addr}:{request.master_port} within "
                                   f"{request.connect_seconds:g} s: {event.get('error')}")
        if kind in ("import_error", "connect_failed", "store_error"):
            where = {"import_error": "torch fails to import",
                     "connect_failed": (f"could not host the store on port {request.master_port}" if event.get("hosting")
                                        else f"could not reach the store at {request.master_addr}:{request.master_port}"),
                     "store_error": "the store failed mid-exchange"}[kind]
            raise ExchangeError(f"{where}: {event.get('error')}")
        if kind == "connected":
            outcome.hosted = bool(event.get("hosting"))
        elif kind == "published":
            outcome.own = dict(event.get("facts") or {})
        elif kind == "gathered":
            outcome.ranks = {int(r): f for r, f in (event.get("ranks") or {}).items()}
            outcome.claims = {int(r): int(n) for r, n in (event.get("claims") or {}).items()}
            outcome.waited_seconds = event.get("waited_seconds")
            verdict = decide(outcome)
            outcome.verdict = verdict
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(verdict, sort_keys=True, default=str) + "\n").encode("utf-8"))
            proc.stdin.flush()
        elif kind == "verdict":
            outcome.verdict = event.get("verdict") if isinstance(event.get("verdict"), dict) else None
            outcome.waited_seconds = event.get("waited_seconds")
        elif kind == "no_verdict":
            outcome.verdict = None
            outcome.waited_seconds = event.get("waited_seconds")
        elif kind == "released":
            outcome.acked = event.get("acked")
            outcome.expected_acks = event.get("expected_acks")
            return
