"""The system-facts section of a report: what `python -m torch.utils.collect_env`
gives, plus what it misses inside containers (CPU quota, /dev/shm size).

Every item is gathered on its own: one that fails records why under `errors` and
the others still come. Nothing here imports torch; torch's version appears only
when the torch probe already ran for the checks (then it costs nothing).
"""

from __future__ import annotations

import os
import re
import sys
import time

from envdoctor.context import Session
from envdoctor.errors import Unavailable
from envdoctor.paths import read_text, shm_seen_by
from envdoctor.watchdog import DONE, RAISED

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable


def _os_name(session: Session) -> str | None:
    path = session.roots.rootfs / "etc/os-release"
    try:
        text = read_text(path)
    except OSError:
        return None
    match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.M)
    return match.group(1) if match else None


def _kernel(session: Session) -> str:
    try:
        return read_text(session.roots.procfs / "sys/kernel/osrelease").strip()
    except OSError:
        import platform  # only here: its import costs ~2 ms of every start

        return platform.release()


def _cpu_model(session: Session) -> str | None:
    try:
        text = read_text(session.roots.procfs / "cpuinfo")
    except OSError:
        return None
    match = re.search(r"^(model name|Model|cpu model)\s*:\s*(.+)$", text, re.M)
    return match.group(2).strip() if match else None


def _memory(session: Session) -> dict[str, int]:
    text = read_text(session.roots.procfs / "meminfo")
    values = {}
    for name, key in (("MemTotal", "memory_total_bytes"), ("MemAvailable", "memory_available_bytes")):
        match = re.search(rf"^{name}:\s+(\d+)\s*kB", text, re.M)
        if match:
            values[key] = int(match.group(1)) * 1024
    return values


def _affinity(session: Session) -> int:
    from envdoctor.affinity import affinity

    return len(affinity(session.roots.procfs, session.target.pid))


def _cpu_quota(session: Session) -> dict[str, Any]:
    from envdoctor import cgroup

    limit = cgroup.cpu_limit(session.roots, session.target.pid)
    return {"cpu_quota": limit.quota_cpus, "cpu_quota_source": limit.source}


def _shm(session: Session) -> dict[str, int]:
    # where the target's /dev/shm leads in its own root, as shm.size reads it: a container's
    # link to /run/shm is its /run/shm, not the one the link names from ours (helper-120)
    stat = os.statvfs(session.target_path(shm_seen_by(session.roots, session.target.pid, session.host.fact)))
    return {"shm_size_bytes": stat.f_blocks * stat.f_frsize, "shm_free_bytes": stat.f_bavail * stat.f_frsize}


def _gpus(session: Session) -> dict[str, Any]:
    nvml = session.need("nvml")
    gpus = [
        {"index": d.index, "name": d.name, "uuid": d.uuid, "pci_bus_id": d.pci_bus_id,
         "compute_capability": ".".join(map(str, d.compute_capability)) if d.compute_capability else None,
         "memory_total_bytes": d.memory_total_bytes}
        for d in nvml.devices()
    ]
    cuda = nvml.cuda_driver_version()
    return {"gpus": gpus, "driver_version": nvml.driver_version(),
            "driver_cuda_version": f"{cuda[0]}.{cuda[1]}" if cuda else None}


def _torch(session: Session) -> dict[str, Any]:
    facts = session.computed("torch")
    if not facts:
        return {}
    out = {key: facts.get(key) for key in ("torch_version", "torch_cuda_version", "cudnn_version") if key in facts}
    if facts.get("source") == "files":  # read from the target's own torch: say which, and whose interpreter
        out["torch_dir"] = facts.get("torch_dir")
        if facts.get("python"):
            out["python_executable"] = facts["python"]
        if facts.get("python_version") and (session.target.pid is not None or _another_python(session)):
            out["python_version"] = facts["python_version"]  # the X.Y its site-packages names
    return out


def _another_python(session: Session) -> bool:
    """--python names an interpreter that is not envdoctor's own."""
    if not session.python_explicit or not session.python:
        return False
    try:
        return not os.path.samefile(session.python, sys.executable)
    except OSError:
        return True


def _target_interpreter(session: Session) -> tuple[str | None, str | None]:
    """(executable, version) of a --pid target: its /proc/N/exe and, unknown until its torch
    facts say, no version. envdoctor's own were shown for another process (helper-54: the
    header said `Interpreter <envdoctor's venv>` for a /usr/bin/python3 target)."""
    pid, roots = session.target.pid, session.roots
    try:  # as the process names it: a chroot jail's path taken off (Roots.printed_root), as its torch facts do
        exe = roots.in_own_view(roots.printed_root(pid), os.readlink(roots.proc(pid, "exe")))
    except OSError:
        return None, None
    named = re.fullmatch(r"python(\d+\.\d+)", os.path.basename(exe))  # /usr/bin/python3.11 says its X.Y
    return exe, named.group(1) if named else None


_ITEMS: tuple[tuple[str, Callable[[Session], Any]], ...] = (
    ("os", _os_name), ("kernel", _kernel), ("cpu_model", _cpu_model), ("cpu_affinity", _affinity),
    ("cpu_quota", _cpu_quota), ("memory", _memory), ("shm", _shm), ("gpus", _gpus),
)


class Gathering:
    """System facts being gathered on the watchdog, item by item, beside the checks."""

    def __init__(self, session: Session):
        self.session = session
        label = session.target.label
        self.calls = [(name, session.watchdog.start(("sysfacts", name, label), lambda fn=fn: fn(session)))
                      for name, fn in _ITEMS]

    def finish(self, deadline: float) -> dict[str, Any]:
        """Every item that answered by `deadline` (time.monotonic()); the others are named
        under `unavailable` with the reason. One stuck read costs its own item, not all."""
        session = self.session
        facts: dict[str, Any] = {
            "os": None, "kernel": None, "python_version": sys.version.split()[0],  # platform.python_version(), without importing platform
            "python_executable": session.python, "envdoctor_python": sys.executable,
            "cpu_model": None, "cpu_logical": os.cpu_count(),
        }
        if session.target.pid is not None and not session.python_explicit:
            facts["python_executable"], facts["python_version"] = _target_interpreter(session)
        elif _another_python(session):  # --python: its version, not envdoctor's (helper-86), once its files say
            named = (re.fullmatch(r"python(\d+\.\d+)", os.path.basename(str(session.python)))
                     or re.fullmatch(r"python(\d+\.\d+)", os.path.basename(os.path.realpath(str(session.python)))))
            facts["python_version"] = named.group(1) if named else None
        errors: dict[str, str] = {}
        for name, call in self.calls:
            outcome = call.wait(deadline)
            if outcome.kind == DONE:
                value = outcome.value
                if isinstance(value, dict):
                    facts.update(value)
                else:
                    facts[name] = value
            elif outcome.kind == RAISED and isinstance(outcome.error, Unavailable):
                errors[name] = str(outcome.error)
            elif outcome.kind == RAISED:
                errors[name] = f"{type(outcome.error).__name__}: {outcome.error}"
            else:
                errors[name] = outcome.describe()
        facts.update(_torch(session))
        facts["unavailable"] = errors
        return facts


SERVE_TIMEOUT = 5.0  # serve's bound: a hung item must not hold a run up for the checks' whole timeout


def gather(session: Session, timeout: float = 10.0) -> dict[str, Any]:
    """All system facts, each item bounded; at most `timeout` seconds in all."""
    return Gathering(session).finish(time.monotonic() + timeout)
