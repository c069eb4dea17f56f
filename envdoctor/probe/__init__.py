"""The torch probe: runs in the target interpreter, never in envdoctor's own process.

envdoctor's own process never imports torch (DESIGN principles 1 and 5): torch
costs seconds to import, and `envdoctor serve` must not load CUDA libraries into a
monitor. Torch facts come from `torch_probe.py`, run as `PYTHON -c SOURCE` in the
interpreter the job uses (`--python`, default the one envdoctor runs in), under a
timeout, in its own process group so a hung probe and anything it started can be
killed.

    run_probe(python)             -> dict of facts (cached per interpreter and torch
                                     installation; see cache.py)
    run_copy_measurement(params)  -> dict, never cached: the pin_memory bandwidth
                                     measurement (copy_probe.py), the one probe that
                                     creates a CUDA context; it calls the driver
                                     (libcuda) from envdoctor's own interpreter in a
                                     process of its own, and imports no torch

Outcomes: the facts; `Unavailable` (the runner makes it a skip) when the
interpreter does not exist or has no torch; `ProbeError` (the runner makes it an
error) when torch is there but broken, or the probe hangs, crashes or prints no
result; its message carries the tail of what the probe printed.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
from collections import namedtuple
from pathlib import Path

from envdoctor.errors import EnvdoctorError, Unavailable
from envdoctor.config import PROBE_TIMEOUT_VAR
from envdoctor.probe import cache

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any

DEFAULT_TIMEOUT = 60.0  # cold `import torch` here takes ~1.5-2.6 s; a loaded NFS home can take far longer
TIMEOUT_VAR = PROBE_TIMEOUT_VAR  # validated with the rest of the environment (config.load)
MARKER = "ENVDOCTOR-PROBE-RESULT "
_SCRIPT = Path(__file__).with_name("torch_probe.py")
_COPY_SCRIPT = Path(__file__).with_name("copy_probe.py")
_STDERR_TAIL = 1500
_SCRUB_WINDOW = 64 * 1024  # how much of the end of a probe's output is scrubbed for the tail
_SCRUB_MARGIN = 16 * 1024  # kept text stays at least this far from a secret the window cut through
_SCRUB_MOST = 256 * 1024  # the most of an output ever scrubbed (~0.5 s with 100 secret variables)
EXIT_GRACE = 0.5  # after the probe exits, how long a child it left holding its pipes is waited on
_STDOUT_LIMIT = 16 * 1024 * 1024  # what is kept of the probe's stdout (its answer is one line)
_STDERR_LIMIT = 256 * 1024  # what is kept of the end of its stderr
_LIVE: dict[int, subprocess.Popen] = {}  # probe process groups still running, by pid
_LIVE_LOCK = threading.Lock()
_STOPPING = False  # set by kill_running(): a probe registered after it kills itself


def kill_running() -> None:
    """Kill the whole process group of every probe still running.

    Called at exit (atexit), on SIGTERM/SIGINT (the CLI), and so after a run whose
    check timed out while its probe was still working: a probe never outlives
    envdoctor, and neither does anything it started in its group.

    A signal can land between a probe's start and its registration (the worker
    thread that started it has not run again yet). The flag closes that gap: a
    registration made after this call sees it and kills its own probe. The lock is
    taken with a limit because the signal handler may run on a thread that holds it.
    """
    global _STOPPING
    _STOPPING = True
    locked = _LIVE_LOCK.acquire(timeout=1.0)
    try:
        procs = list(_LIVE.values())
    finally:
        if locked:
            _LIVE_LOCK.release()
    for proc in procs:
        _kill_group(proc)


atexit.register(kill_running)


def _after_fork_in_child() -> None:
    """A forked child (exec's pre-flight) owns none of its parent's probes, and the
    lock may have been copied held by a thread the child does not have."""
    global _LIVE_LOCK, _STOPPING
    _LIVE_LOCK = threading.Lock()
    _LIVE.clear()
    _STOPPING = False


os.register_at_fork(after_in_child=_after_fork_in_child)


class ProbeError(EnvdoctorError):
    """The probe ran but gave no usable answer: torch broken, a hang, a crash."""


def probe_source() -> str:
    return _SCRIPT.read_text(encoding="utf-8")


def _source_hash(source: str) -> str:
    import hashlib  # here, not at import: it maps libcrypto, a cost every start paid

    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def default_timeout() -> float:
    raw = os.environ.get(TIMEOUT_VAR, "").strip()
    if raw:
        try:
            value = float(raw)
            if value > 0:
                return value
        except ValueError:
            pass
    return DEFAULT_TIMEOUT


def resolve_python(python: str) -> str:
    """An absolute path to the interpreter, or Unavailable saying why there is none.

    Not resolved through symlinks: a venv's bin/python is a link to the base
    interpreter, and it is the link that selects the venv's site-packages.
    """
    if not python:
        raise Unavailable("no Python interpreter to probe for torch (sys.executable is empty; pass --python PATH)")
    if os.sep not in python:
        import shutil  # here: most runs name the interpreter by its path

        found = shutil.which(python)
        if found is None:
            raise Unavailable(f"no torch: the interpreter {python!r} is not on PATH")
        python = found
    path = os.path.abspath(python)
    if not os.path.exists(path):
        raise Unavailable(f"no torch: the interpreter {path} does not exist")
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise Unavailable(f"no torch: {path} is not an executable interpreter")
    return path


def _tail(text: str, env: dict[str, str] | None = None, *, cut_start: bool = False,
          cut_end: bool = False) -> str:
    """The end of what the probe printed, redacted first (a cut must not leave a
    secret's last characters) and redacted as free text (short secrets too), on one line.

    A long output is scrubbed only at its end: scrubbing a 16 MiB answer held the
    interpreter lock for 3-29 s (more secrets, longer; ~1.8 s a MiB with 100), past
    every timeout. A secret or credential that a cut goes through cannot be recognised
    from its remains, so nothing within `margin` characters of a cut is shown (the
    longest spelling of any secret, and never under _SCRUB_MARGIN: a credential's
    value, cut from its `token=`), counted in the text as printed:
      - cut at the start (here, or a stderr too long to keep all of, `cut_start`):
        what is shown starts at a line break at least `margin` past the cut, and not
        inside any whole secret (those are all in what is scrubbed, and masked);
      - cut at the end (`cut_end`: stdout past its limit): what is shown ends at a
        line break at least `margin` before the cut, and not inside any whole secret.
    When no safe cut exists, the tail is withheld, saying why."""
    from envdoctor import redact

    envs = [os.environ, env or {}]
    scrubber = redact.free_text_scrubber(envs)
    margin = max(_SCRUB_MARGIN, redact.longest_spelling(envs))
    window = max(_SCRUB_WINDOW, 3 * margin + _STDERR_TAIL)
    if cut_end:
        if len(text) > window + margin:
            text, cut_start = text[-(window + margin):], True
        end = _safe_end(text, margin, scrubber.spans(text))
        text = text[:end] if end is not None else ""
    if len(text) > window:
        text, cut_start = text[-window:], True
    if cut_start:
        if window > _SCRUB_MOST:
            return "(its output is withheld: a secret value is too long to cut this output safely)"
        start = _safe_start(text, margin, scrubber.spans(text))
        if start is None:
            return "(its output is withheld: where it was cut, no line break was far enough from the cut)"
        text = text[start:]
    if (cut_start or cut_end) and not text.strip():
        return "(its output is withheld: where it was cut, no line break was near enough to cut at safely)"
    shown = _one_line(scrubber.text(text))
    if len(shown) > _STDERR_TAIL:
        shown = "..." + shown[-_STDERR_TAIL:]
    return shown


def _safe_start(text: str, margin: int, secrets: list[tuple[int, int]]) -> int | None:
    """The first position just after a line break at least `margin` into `text` that
    lies inside no secret found there (`secrets`: sorted, merged ranges); None when
    there is none. One pass over both."""
    at, index = margin, 0
    while True:
        newline = text.find("\n", at)
        if newline < 0:
            return None
        while index < len(secrets) and secrets[index][1] <= newline:
            index += 1
        if index < len(secrets) and secrets[index][0] <= newline:
            at = secrets[index][1]  # inside this one: look past its end
            continue
        return newline + 1


def _safe_end(text: str, margin: int, secrets: list[tuple[int, int]]) -> int | None:
    """The end of the last line that ends at least `margin` before the end of `text`
    (just past its line break) and inside no secret found there; None when there is none."""
    import bisect

    starts = [start for start, _ in secrets]
    limit = len(text) - margin
    while limit >= 0:
        newline = text.rfind("\n", 0, limit + 1)
        if newline < 0:
            return None
        index = bisect.bisect_right(starts, newline) - 1
        if index >= 0 and secrets[index][1] > newline:
            limit = secrets[index][0] - 1  # inside this one: look before its start
            continue
        return newline + 1
    return None


def _one_line(text: str) -> str:
    """Lines joined with " / ", blank ones dropped: a reason fits one table cell."""
    return " / ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Output(namedtuple("_Output", (
        "out",  # bytes
        "err",  # bytes
        "timed_out",  # bool
        "out_trimmed",  # bool: stdout went on past _STDOUT_LIMIT: its end is not its real end
        "err_trimmed",  # bool: stderr's start was dropped: its start is not its real start
))):
    __slots__ = ()


def _communicate(proc: subprocess.Popen, timeout: float) -> _Output:
    """Read the probe's stdout and stderr until both close or the probe has exited and
    EXIT_GRACE has passed (a child it started may hold the pipes open for ever), or
    until `timeout`. Memory is bounded: the first _STDOUT_LIMIT bytes of stdout, the
    last _STDERR_LIMIT of stderr; the flags say where either was cut."""
    import selectors  # noqa: F401 - here, as subprocess: a warm run starts no probe
    import subprocess  # here: a warm run starts no probe, and the import is ~2 ms of every start

    out, err = bytearray(), bytearray()
    out_trimmed = err_trimmed = False
    selector = selectors.DefaultSelector()
    for pipe in (proc.stdout, proc.stderr):
        os.set_blocking(pipe.fileno(), False)
        selector.register(pipe, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    exited_at = None
    closed = False
    try:
        while selector.get_map():
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            limit = deadline if exited_at is None else min(deadline, exited_at + EXIT_GRACE)
            if now >= limit:
                break
            for key, _ in selector.select(min(limit - now, 0.1)):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    selector.unregister(key.fileobj)
                elif key.fileobj is proc.stdout:
                    room = _STDOUT_LIMIT - len(out)
                    out_trimmed = out_trimmed or len(chunk) > room
                    if room > 0:
                        out += chunk[:room]
                else:
                    err += chunk
                    if len(err) > 2 * _STDERR_LIMIT:
                        del err[: len(err) - _STDERR_LIMIT]
                        err_trimmed = True
        closed = not selector.get_map()
    finally:
        selector.close()
    if exited_at is None and closed:  # both pipes closed: the probe is exiting, or closed them and went on
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    return _Output(bytes(out), bytes(err), proc.poll() is None, out_trimmed, err_trimmed)


RAISE_HINT = f"raise the limit with --timeout or {TIMEOUT_VAR}=SECONDS"


def _execute(python: str, args: list[str], timeout: float, source: str,
             env: dict[str, str] | None = None, *, flags: tuple[str, ...] = (),
             what: str = "", raise_hint: str = "") -> dict[str, Any]:
    """Run the probe script and return its JSON, or raise ProbeError with what it printed.

    The probe inherits envdoctor's environment (PYTHONPATH, LD_LIBRARY_PATH,
    CUDA_VISIBLE_DEVICES... decide what it finds); `env` overrides single names.
    `flags` go to the interpreter before -c; `what` names the probe in errors, and
    `raise_hint` says how its limit is raised.
    """
    what = what or f"the torch probe in {python}"
    raise_hint = raise_hint or RAISE_HINT
    import subprocess  # see _communicate

    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    if env and any("\0" in k or "\0" in v or "=" in k for k, v in env.items()):
        raise ProbeError(f"{what} was not started: a variable set for it holds a NUL byte or a bad name")
    try:
        proc = subprocess.Popen(
            [python, *flags, "-c", source, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # "-c" puts the current directory first on sys.path; a neutral one keeps
            # a ./torch folder in whatever directory envdoctor was started from out.
            cwd=os.path.abspath(os.sep),
            env=full_env,
            start_new_session=True,
        )
    except OSError as exc:
        raise Unavailable(f"no torch: cannot start {python}: {exc.strerror or exc}") from None
    with _LIVE_LOCK:
        _LIVE[proc.pid] = proc
        if _STOPPING:  # kill_running() ran while this probe was starting
            _kill_group(proc)
    try:
        out, err, timed_out, out_trimmed, err_trimmed = _communicate(proc, timeout)
    finally:
        _kill_group(proc)  # whatever it left behind in its group dies with it
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:  # unkillable (D state): leave it, do not wait
            pass
        for pipe in (proc.stdout, proc.stderr):
            try:
                pipe.close()
            except (OSError, AttributeError):
                pass
        with _LIVE_LOCK:
            _LIVE.pop(proc.pid, None)
    if timed_out:
        said = _tail(err.decode("utf-8", "surrogateescape"), env, cut_start=err_trimmed)
        raise ProbeError(
            f"{what} did not finish within {timeout:g} s (killed)"
            + (f"; it printed: {said}" if said else "; it printed nothing")
            + f"; {raise_hint}"
        )
    text = out.decode("utf-8", "replace")
    result = None
    for line in reversed(text.splitlines()):
        if line.startswith(MARKER):
            try:
                result = json.loads(line[len(MARKER):])
            except ValueError:
                result = None
            break
    if not isinstance(result, dict):
        if err:
            said = _tail(err.decode("utf-8", "surrogateescape"), env, cut_start=err_trimmed)
        else:
            said = _tail(out.decode("utf-8", "surrogateescape"), env, cut_end=out_trimmed)
        if proc.returncode is not None and proc.returncode < 0:
            try:
                how = f"was killed by {signal.Signals(-proc.returncode).name}"
            except ValueError:
                how = f"was killed by signal {-proc.returncode}"
        else:
            how = f"exited with status {proc.returncode}"
        if said:
            raise ProbeError(f"{what} {how} without a result; it printed: {said}")
        # a quiet success is not Python running the probe at all (helper-91: --python /bin/true)
        raise ProbeError(f"{what} {how} without a result and printed nothing"
                         + (": is it a Python interpreter?" if proc.returncode == 0 else ""))
    result["_stderr_tail"] = _tail(err.decode("utf-8", "surrogateescape"), env, cut_start=err_trimmed)
    return result


def _judge_outcome(python: str, facts: dict[str, Any]) -> dict[str, Any]:
    if facts.get("torch") is False:
        raise Unavailable(f"no torch in {python} (pass --python PATH to probe the interpreter your job uses)")
    if facts.get("import_error"):
        raise ProbeError(f"torch is installed in {python} but fails to import: {facts['import_error']}")
    return facts


def run_probe(python: str, *, timeout: float | None = None, use_cache: bool | None = None,
              cache_directory: Path | None = None) -> dict[str, Any]:
    """Torch facts of `python`'s torch, from the cache when still valid.

    The returned dict is a fresh copy; `probe_cached` says where it came from.
    """
    python = resolve_python(python)
    timeout = default_timeout() if timeout is None else timeout
    use_cache = cache.enabled() if use_cache is None else use_cache
    source = probe_source()
    source_hash = _source_hash(source)
    if use_cache:
        cached = cache.load(python, source_hash, directory=cache_directory)
        if cached is not None:
            facts = dict(cached)
            facts["probe_cached"] = True
            return _judge_outcome(python, facts)
    before = cache.static_fingerprint(python, source_hash)
    started = time.perf_counter()
    facts = _execute(python, ["facts", json.dumps({"parent": os.getpid()})], timeout, source)
    facts["probe_wall_seconds"] = round(time.perf_counter() - started, 3)
    facts.pop("_stderr_tail", None)
    # Negative answers ("no torch here") are cached too: the fingerprint notices
    # torch arriving in any directory on the path. Broken imports are not.
    if use_cache and not facts.get("import_error"):
        cache.store(python, facts, before, directory=cache_directory)
    facts = dict(facts)
    facts["probe_cached"] = False
    return _judge_outcome(python, facts)


def run_copy_measurement(params: dict[str, Any], *, timeout: float | None = None,
                         env: dict[str, str] | None = None, raise_hint: str = "") -> dict[str, Any]:
    """The pin_memory bandwidth measurement (copy_probe.py); never cached.

    It needs the driver's libcuda, not torch, so it runs in envdoctor's own
    interpreter (`-I -S`: no site, no user variables; it imports only ctypes) as a
    process of its own. `env` overrides environment variables for it only (the
    pin_memory check pins it to one idle GPU with CUDA_VISIBLE_DEVICES=<uuid>).
    Unavailable when there is no driver library; a dict with errors["measure"]
    when a CUDA call failed; ProbeError when it hung or crashed.
    """
    python = resolve_python(sys.executable)
    timeout = default_timeout() if timeout is None else timeout
    params = dict(params, parent=os.getpid())  # the probe dies with this process (PR_SET_PDEATHSIG)
    facts = _execute(python, [json.dumps(params)], timeout, _COPY_SCRIPT.read_text(encoding="utf-8"), env,
                     flags=("-I", "-S"), what="the pin_memory copy measurement", raise_hint=raise_hint)
    facts.pop("_stderr_tail", None)
    if facts.get("unavailable"):
        raise Unavailable(str(facts["unavailable"]))
    return facts


__all__ = ["run_probe", "run_copy_measurement", "ProbeError", "DEFAULT_TIMEOUT", "resolve_python"]
