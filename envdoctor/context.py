"""What a check may read: the target, its environment, file-system roots, and
lazily gathered GPU (NVML) and torch (probe) facts.

Checks never write a literal "/proc" or "/dev/shm": they ask the context for
`ctx.proc("cgroup")` or `ctx.target_path("/dev/shm")`. That is how the same check
runs against this process, against another process through /proc/N, against a
host mounted at /host (`--path.rootfs=/host`), and against fixture trees in tests.

A Session holds what all checks of one run share (the target, its environment,
the NVML handle, the torch probe's facts), computed once and under a lock because
checks run concurrently. A Context is one check's view: the session plus that
check's own config.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from envdoctor.errors import Unavailable
from envdoctor.procfs import parse_environ


@dataclass(frozen=True)
class Roots:
    """Where the proc, sys and root file systems are mounted (node_exporter's --path.*)."""

    procfs: Path = Path("/proc")
    sysfs: Path = Path("/sys")
    rootfs: Path = Path("/")


@dataclass(frozen=True)
class Target:
    """What is examined: this process (pid None) or another one by pid."""

    pid: int | None = None

    @property
    def label(self) -> str:
        return "self" if self.pid is None else f"pid:{self.pid}"

    def __str__(self) -> str:
        return self.label


class _Once:
    """A value computed once, on first use, by whichever thread asks first.

    A failure is cached too: if NVML is missing, every check that asks hears
    the same reason without paying for the attempt again.
    """

    def __init__(self, factory: Callable[[], Any]):
        self._factory = factory
        self._lock = threading.Lock()
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def peek(self) -> Any:
        """The value if it was computed successfully, else None; never computes."""
        return self._value if self._done and self._error is None else None

    def get(self) -> Any:
        with self._lock:
            if not self._done:
                try:
                    self._value = self._factory()
                except BaseException as exc:  # cached and re-raised to every caller
                    self._error = exc
                self._done = True
        if self._error is not None:
            raise self._error
        return self._value


def _default_nvml() -> Any:
    from envdoctor import nvml

    return nvml.connect()


def _default_torch(session: "Session") -> Any:
    from envdoctor.probe import run_probe

    return run_probe(session.python)


def _onnx_available() -> bool:
    import importlib.util

    if importlib.util.find_spec("onnx") is None:
        raise Unavailable(f"the onnx package is not installed in {sys.executable} (pip install 'envdoctor[onnx]')")
    return True


@dataclass
class Session:
    """What every check of one run shares. Build one per run."""

    target: Target = field(default_factory=Target)
    roots: Roots = field(default_factory=Roots)
    python: str = sys.executable  # interpreter whose torch is probed (--python)
    onnx_files: tuple[Path, ...] = ()
    env_override: Mapping[str, str] | None = None  # tests and preflight() give the env directly
    nvml_factory: Callable[[], Any] = _default_nvml
    torch_factory: Callable[["Session"], Any] = _default_torch
    check_config: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._env = _Once(self._read_env)
        self._nvml = _Once(self.nvml_factory)
        self._torch = _Once(lambda: self.torch_factory(self))
        self._onnx = _Once(_onnx_available)

    # -- the target's environment -------------------------------------------------
    def _read_env(self) -> Mapping[str, str]:
        if self.env_override is not None:
            return dict(self.env_override)
        if self.target.pid is None:
            return dict(os.environ)
        path = self.proc_path("environ")
        try:
            return parse_environ(path.read_bytes())
        except OSError as exc:
            raise unavailable_from_oserror(exc, self.target, path) from None

    @property
    def env(self) -> Mapping[str, str]:
        return self._env.get()

    # -- paths under the roots ----------------------------------------------------
    def proc_path(self, *parts: str) -> Path:
        """A file of the target under procfs: /proc/self/... or /proc/N/..."""
        who = "self" if self.target.pid is None else str(self.target.pid)
        return self.roots.procfs.joinpath(who, *parts)

    def target_path(self, path: str) -> Path:
        """A path as the target sees it: another process's through /proc/N/root,
        our own through the configured rootfs."""
        relative = path.lstrip("/")
        if self.target.pid is None:
            return self.roots.rootfs / relative
        return self.proc_path("root", relative)

    # -- lazily gathered facts ----------------------------------------------------
    def computed(self, what: str) -> Any:
        """A need's value if some check already paid for it, else None (never computes)."""
        once = {"nvml": self._nvml, "torch": self._torch, "onnx": self._onnx}[what]
        return once.peek()

    def need(self, what: str) -> Any:
        """Meet a declared need or raise Unavailable saying why it cannot be met."""
        if what == "nvml":
            return self._nvml.get()
        if what == "torch":
            return self._torch.get()
        if what == "onnx":
            return self._onnx.get()
        raise ValueError(f"unknown need {what!r}")


@dataclass
class Context:
    """One check's view of the run: the session, plus the check's own config."""

    session: Session
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> Target:
        return self.session.target

    @property
    def roots(self) -> Roots:
        return self.session.roots

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
        """Torch facts from the probe (a dict); raises Unavailable without torch."""
        return self.session.need("torch")

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
        return (f"envdoctor is root but may not look into {target}: it lacks CAP_SYS_PTRACE (a container or "
                f"security profile dropped it); run it on the host, or add the capability (docker run --cap-add SYS_PTRACE)")
    return f"run envdoctor as the same user as {target}, or as root"


def unavailable_from_oserror(exc: OSError, target: Target, path: Path) -> Unavailable:
    """Turn a failed read of a target's /proc file into a skip reason a person understands."""
    if exc.errno in (errno.EACCES, errno.EPERM):
        return Unavailable(f"permission denied reading {path}", permission_hint(target))
    if exc.errno in (errno.ENOENT, errno.ESRCH) and target.pid is not None:
        return Unavailable(f"process {target.pid} exited during the run ({path} is gone)")
    return Unavailable(f"cannot read {path}: {exc.strerror or exc}")
