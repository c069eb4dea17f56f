"""What a check may read: the node's facts, the target's environment and paths,
and lazily gathered GPU (NVML) and torch facts.

Checks never write a literal "/proc" or "/dev/shm": they ask the context for
`ctx.proc("cgroup")` or `ctx.target_path("/dev/shm")` (see envdoctor.paths).

Two levels of sharing, because `serve` examines many processes per run:
- a HostSession holds what the node has once per run (the NVML snapshot, system
  facts, the onnx stack) and is shared by every target of that run;
- a Session holds one target's view (its environment, its paths under /proc/N,
  its torch), built per target and per run.
Both compute each fact once, on first use, under a lock (checks run concurrently).
A failure is remembered only for the run: the next run builds new sessions and
tries again. A Context is one check's view: the target session plus the check's
resolved settings.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from pathlib import Path

from envdoctor.errors import Unavailable
from envdoctor.paths import Roots, read_bytes
from envdoctor.procfs import parse_environ
from envdoctor.record import Record, Value
from envdoctor.watchdog import Watchdog, default_watchdog

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping

__all__ = ["Roots", "Target", "HostSession", "Session", "Context", "permission_hint", "unavailable_from_oserror"]


class Target(Value):
    """What is examined: this process (pid None), another one by pid, or the node."""

    def __init__(
        self,
        pid: int | None = None,
        kind: str = "process",  # "process" or "node"
    ) -> None:
        self.pid = pid
        self.kind = kind

    @classmethod
    def node(cls) -> "Target":
        return cls(None, "node")

    @property
    def label(self) -> str:
        if self.kind == "node":
            return "node"
        return "self" if self.pid is None else f"pid:{self.pid}"

    def __str__(self) -> str:
        return self.label


class _Once:
    """A value computed once, on first use, by whichever thread asks first.

    A failure is kept too (for this session's life, one run): if NVML is missing,
    every check that asks hears the same reason without paying for the attempt again.

    `get(*args)` passes its arguments to the factory: a session's own facts are made by
    its methods, and a _Once holding one bound method of its session made a cycle that
    only the cyclic collector frees. Over 64 processes those sessions, and what their
    checks had raised, piled up until a serve run's end: its high-water mark, which the
    daemon's memory stays at. The factory is let go of once it has answered.
    """

    def __init__(self, factory: Callable[..., Any]):
        self._factory = factory
        self._lock = threading.Lock()
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._where: Any = None  # the failure's own traceback, from the factory's raise down

    def let_go_of_where(self) -> None:
        """Drop a kept Unavailable's traceback: its row is a skip, which never says where.
        Its frames keep the frame that called the factory (f_back), and that one this
        _Once: a cycle per process with no torch, freed only by the cyclic collector."""
        if isinstance(self._error, Unavailable):
            self._where = None
            self._error.__traceback__ = None

    def peek(self) -> Any:
        """The value if it was computed successfully, else None; never computes."""
        return self._value if self._done and self._error is None else None

    def get(self, *args: Any) -> Any:
        with self._lock:
            if not self._done:
                try:
                    self._value = self._factory(*args)
                except BaseException as exc:  # kept and re-raised to every caller
                    # from the factory's frame down: this running frame holds this _Once, which
                    # holds the error, and kept in its traceback they were a cycle
                    self._error, self._where = exc, exc.__traceback__.tb_next if exc.__traceback__ else None
                    _forget_locals(self._where)
                self._done = True
                self._factory = None
        if self._error is not None:
            # Each `raise` of one exception object adds the raising frames to its traceback.
            # Re-raised as it was, the NVML failure grew by a few frames for every process
            # in a serve run (64 processes: hundreds), and its traceback kept every one of
            # those frames, and their sessions, alive until the run ended. Reset to the
            # failure's own traceback first: where it failed stays the innermost frame.
            raise self._error.with_traceback(self._where)
        return self._value


def _forget_locals(tb: Any) -> None:
    """Let the finished frames of a kept failure's traceback go of their local variables,
    as traceback.clear_frames does: where it was raised (file, line) stays, what the
    factory had read goes. Kept whole, a torch-less process's "no torch" held its maps
    text, and its session, until every target of a serve run was done."""
    while tb is not None:
        try:
            tb.tb_frame.clear()
        except RuntimeError:  # a frame still running (the caller's own): nothing to let go of yet
            pass
        tb = tb.tb_next


def _default_nvml() -> Any:
    from envdoctor import nvml

    return nvml.connect()


def _default_torch(session: "Session") -> Any:
    # files first (the target's own torch, never imported); the probe only when no file says
    from envdoctor.torchfacts import gather

    return gather(session)


def _onnx_available() -> bool:
    import importlib.util

    if importlib.util.find_spec("onnx") is None:
        raise Unavailable(f"the onnx package is not installed in {sys.executable} (onnx.opset imports onnx in "
                          "envdoctor's own interpreter, whatever --python names: pip install 'envdoctor[onnx]' there)")
    return True


class HostSession:
    """What the node has, gathered once per run and shared by every target of it."""

    def __init__(self, roots: Roots = Roots(), nvml_factory: Callable[[], Any] = _default_nvml,
                 watchdog: Watchdog | None = None):
        self.roots = roots
        self.watchdog = watchdog or default_watchdog()
        self._nvml = _Once(nvml_factory)
        self._onnx = _Once(_onnx_available)
        self._facts: dict[str, _Once] = {}
        self._facts_lock = threading.Lock()

    def let_go_of_where(self) -> None:
        """Drop the tracebacks of the node's failures that are skips (no NVIDIA driver): see
        _Once.let_go_of_where. serve calls it at a run's end: the first was raised in
        discovery, and its frames held that run's targets."""
        with self._facts_lock:
            kept = [self._nvml, self._onnx, *self._facts.values()]
        for once in kept:
            once.let_go_of_where()

    def fact(self, name: str, factory: Callable[[], Any]) -> Any:
        """A node fact computed once per run under `name` (system facts, the onnx stack...)."""
        with self._facts_lock:
            once = self._facts.get(name)
            if once is None:
                once = self._facts[name] = _Once(factory)
        return once.get()

    def computed(self, what: str) -> Any:
        once = {"nvml": self._nvml, "onnx": self._onnx}.get(what) or self._facts.get(what)
        return once.peek() if once is not None else None

    def need(self, what: str) -> Any:
        if what == "nvml":
            return self._nvml.get()
        if what == "onnx":
            return self._onnx.get()
        raise ValueError(f"unknown host need {what!r}")


class Session(Record):
    """One target's view for one run. Pass `host` to share node facts between targets;
    without it the session makes its own HostSession from `roots` and `nvml_factory`."""

    def __init__(
        self,
        target: Target | None = None,
        roots: Roots | None = None,
        python: str = sys.executable,  # interpreter whose torch is probed (--python)
        onnx_files: tuple[Path, ...] = (),
        env_override: Mapping[str, str] | None = None,  # tests and preflight() give the env directly
        nvml_factory: Callable[[], Any] = _default_nvml,
        torch_factory: Callable[["Session"], Any] = _default_torch,
        host: HostSession | None = None,
        python_explicit: bool = False,  # --python given: probe that interpreter even for a --pid target
        probe_timeout: float | None = None,  # the torch probe's limit; None: its own default (60 s, ENVDOCTOR_PROBE_TIMEOUT)
    ) -> None:
        self.target = Target() if target is None else target
        self.roots = Roots() if roots is None else roots
        self.python = python
        self.onnx_files = onnx_files
        self.env_override = env_override
        self.nvml_factory = nvml_factory
        self.torch_factory = torch_factory
        self.host = host
        self.python_explicit = python_explicit
        self.probe_timeout = probe_timeout
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.host is None:
            self.host = HostSession(roots=self.roots, nvml_factory=self.nvml_factory)
        else:
            self.roots = self.host.roots
        self._env = _Once(Session._read_env)  # made with the session as their argument (_Once says why)
        self._torch = _Once(Session._torch_facts)

    @property
    def watchdog(self) -> Watchdog:
        assert self.host is not None
        return self.host.watchdog

    def forget(self) -> None:
        """Let go of what was read for this target (its environment, its torch facts); a need
        asked after this is met again. serve calls it once a target's checks have all
        returned, so a run does not hold every target's at once until its last one is done."""
        for once in (self._env, self._torch):
            once.let_go_of_where()
        self._env = _Once(Session._read_env)
        self._torch = _Once(Session._torch_facts)

    def _torch_facts(self) -> Any:
        return self.torch_factory(self)

    # -- the target's environment -------------------------------------------------
    def _read_env(self) -> Mapping[str, str]:
        if self.env_override is not None:
            return dict(self.env_override)
        if self.target.pid is None:
            return dict(os.environ)
        path = self.proc_path("environ")
        try:
            return parse_environ(read_bytes(path))
        except OSError as exc:
            raise unavailable_from_oserror(exc, self.target, path) from None

    @property
    def env(self) -> Mapping[str, str]:
        return self._env.get(self)

    def env_if_read(self) -> Mapping[str, str] | None:
        """The environment if a check already read it, else None: never reads (never blocks)."""
        return self._env.peek()

    # -- paths under the roots ----------------------------------------------------
    def proc_path(self, *parts: str) -> Path:
        """A file of the target under procfs: /proc/self/... or /proc/N/..."""
        return self.roots.proc(self.target.pid, *parts)

    def target_path(self, path: str) -> Path:
        """A path as the target sees it: another process's through /proc/N/root,
        our own through the configured rootfs."""
        return self.roots.seen_by(self.target.pid, path)

    # -- lazily gathered facts ----------------------------------------------------
    def computed(self, what: str) -> Any:
        """A need's value if some check already paid for it, else None (never computes)."""
        if what == "torch":
            return self._torch.peek()
        assert self.host is not None
        return self.host.computed(what)

    def need(self, what: str) -> Any:
        """Meet a declared need or raise Unavailable saying why it cannot be met."""
        if what == "torch":
            return self._torch.get(self)
        if what in ("nvml", "onnx"):
            assert self.host is not None
            return self.host.need(what)
        raise ValueError(f"unknown need {what!r}")


class Context(Record):
    """One check's view of the run: the target session, plus the check's resolved settings."""

    def __init__(
        self,
        session: Session,
        config: Mapping[str, Any] | None = None,
        deadline: float | None = None,  # time.monotonic() when the runner stops waiting for this check
    ) -> None:
        self.session = session
        self.config = {} if config is None else config
        self.deadline = deadline

    @property
    def settings(self) -> Mapping[str, Any]:
        """This check's resolved settings (its declared defaults < file < environment)."""
        return self.config

    @property
    def target(self) -> Target:
        return self.session.target

    @property
    def roots(self) -> Roots:
        return self.session.roots

    @property
    def host(self) -> HostSession:
        assert self.session.host is not None
        return self.session.host

    @property
    def watchdog(self) -> Watchdog:
        return self.session.watchdog

    @property
    def env(self) -> Mapping[str, str]:
        """The target's environment; raises Unavailable when it cannot be read."""
        return self.session.env

    @property
    def python(self) -> str:
        return self.session.python

    @property
    def onnx_files(self) -> tuple[Path, ...]:
        return self.session.onnx_files

    @property
    def nvml(self) -> Any:
        """The NVML facade (envdoctor.nvml); raises Unavailable without a driver."""
        return self.session.need("nvml")

    @property
    def torch(self) -> Any:
        """Torch facts (a dict); raises Unavailable without torch."""
        return self.session.need("torch")

    def env_var(self, name: str) -> tuple[str | None, str | None]:
        """(value or None when unset, why the environment could not be read or None):
        for a check that reads one variable beside its real subject and goes on without it."""
        try:
            return self.env.get(name), None
        except Unavailable as exc:
            return None, str(exc)

    def nvml_or_none(self) -> Any:
        """NVML when it is here, None when it is not: for checks that only use it to go further."""
        try:
            return self.nvml
        except Unavailable:
            return None

    def proc(self, *parts: str) -> Path:
        return self.session.proc_path(*parts)

    def target_path(self, path: str) -> Path:
        return self.session.target_path(path)

    def sys(self, *parts: str) -> Path:
        return self.roots.sysfs.joinpath(*parts)


def permission_hint(target: Target) -> str:
    """What would let envdoctor look into another process, given who we already are."""
    if os.geteuid() == 0:
        if _holds_capability(CAP_SYS_PTRACE):  # not the cause: the hint named it anyway (helper-120)
            return (f"envdoctor is root and holds CAP_SYS_PTRACE, yet the kernel refused it access to {target}: the process "
                    "belongs to a user namespace above ours, or a security module (AppArmor, SELinux, Yama's "
                    "ptrace_scope=3) forbids it; run envdoctor on the host, outside that profile")
        return (f"envdoctor is root but may not look into {target}: it lacks CAP_SYS_PTRACE (a container or "
                f"security profile dropped it); run it on the host, or add the capability (docker run --cap-add SYS_PTRACE)")
    return f"run envdoctor as the same user as {target}, or as root"


CAP_SYS_PTRACE = 19  # linux/capability.h


def _holds_capability(bit: int) -> bool:
    """Whether this process's effective capabilities (/proc/self/status CapEff) hold `bit`;
    False when they cannot be read."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _procfs_of(path: Path, pid: int) -> Path:
    """The procfs root a /proc/N/... path lies under (the --path.procfs in use)."""
    for parent in path.parents:
        if parent.name == str(pid):
            return parent.parent
    return Path("/proc")


def unavailable_from_oserror(exc: OSError, target: Target, path: Path) -> Unavailable:
    """Turn a failed read of a target's /proc file into a skip reason a person understands."""
    if exc.errno in (errno.EACCES, errno.EPERM):
        return Unavailable(f"permission denied reading {path}", permission_hint(target))
    if exc.errno in (errno.ENOENT, errno.ESRCH) and target.pid is not None:
        from envdoctor.procfs import explain_kind, process_kind

        kind = process_kind(_procfs_of(path, target.pid), target.pid)
        if kind is not None:  # it is still there, but as a zombie or a kernel thread
            return Unavailable(explain_kind(target.pid, *kind))
        return Unavailable(f"process {target.pid} exited during the run ({path} is gone)")
    return Unavailable(f"cannot read {path}: {exc.strerror or exc}")
