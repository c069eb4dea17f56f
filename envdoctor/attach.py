"""The live view: a training job publishes its own torch settings for envdoctor to read.

    import envdoctor; envdoctor.attach()

(or `envdoctor exec --attach -- python train.py`, which arranges the same through
the interpreter's start-up hook: `startup_hook()` below).

Some facts exist only inside the running job: the thread count after
`torch.set_num_threads(16)`, cudnn flags set in code, whether CUDA is initialised,
the caching allocator's figures, and the DataLoaders the script built. A daemon
thread writes them every `interval` seconds (default 5) as one small JSON document
(schema `envdoctor.attach/v1`, a few KiB) to

    /dev/shm/envdoctor-attach-<pid>-<pid namespace>.json   (else /tmp/..., when /dev/shm is unusable)

where <pid> is the process's pid in its own PID namespace and <pid namespace> that
namespace's inode (so two containers' pid 1 that share /dev/shm do not share a file). Why there: `envdoctor
check --pid N` and `serve` on the host read it through /proc/N/root, the job's own
mount namespace, so a job in a container needs no volume, port or socket; /dev/shm
is a tmpfs in every container (no disk write every few seconds, nothing left
behind when the container goes), and /tmp is the fallback every image has.

What the job pays: one short thread wake-up per interval; building and writing the
document takes about 0.03 ms of CPU (benchmarks/attach_cost.py measures it; the
document carries its own cost figures). torch.get_num_threads() answers per thread,
so the live thread count is kept by a thin wrapper on torch.set_num_threads (put in
once torch has finished importing) and read once through a fresh thread for a value
set before that. It never imports torch (it reads torch
only if the script already imported it) and never initialises CUDA (the allocator
figures are read only once torch.cuda.is_initialized()). DataLoaders are seen by
wrapping DataLoader.__init__ and __iter__ (and the iterator's __next__, which
measures the bytes of a few batches); the wrapping happens when the script imports
torch.utils.data, through a post-import hook, so attach() may come first. Forked
children (DataLoader workers) and spawned multiprocessing children do not publish;
the document is removed at exit.

Three modules: this one (attach(), the publisher thread, the start-up hook),
attach_snapshot (what the document holds, read inside the job) and attach_reader
(reading it from outside, and `live_facts(ctx)` for the checks).

The reading side (`read_document`) treats the document as untrusted input: it
walks /proc/N/root/dev/shm without following symlinks (O_NOFOLLOW at each step, so
a container cannot point the reader at a host file), requires a regular file owned
by the process's user, reads at most MAX_BYTES, and turns anything wrong (missing,
stale, malformed, someone else's) into a reason, never an exception.
"""

from __future__ import annotations

import atexit
import errno
import json
import math
import os
import stat
import sys
import threading
import time
from pathlib import Path

from envdoctor.attach_snapshot import (DEFAULT_INTERVAL, DIRECTORIES, MAX_BYTES, SCHEMA,  # noqa: F401 (re-exported)
                                       _install_dataloader_hook, document_name, pid_namespace, snapshot)

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping

_READER_NAMES = ("read_document", "validate", "live_document", "live_facts", "LiveFacts")


def _in_multiprocessing_child() -> bool:
    """Where attach() publishes nothing: a DataLoader worker, and a spawned child while it
    re-runs its parent's main module (a script's top-level attach() runs there again).
    A spawned child that calls attach() itself publishes: a DDP rank started by
    torch.multiprocessing.spawn is a job of its own (helper-41: every rank returned None,
    because any spawned child did)."""
    data = sys.modules.get("torch.utils.data")
    try:
        if data is not None and data.get_worker_info() is not None:
            return True
    except Exception:  # a torch too old or too odd to ask: judged by the rest
        pass
    mp = sys.modules.get("multiprocessing")
    try:
        if mp is None or mp.parent_process() is None:
            return False
    except Exception:
        return False
    frame = sys._getframe(1)
    while frame is not None:  # multiprocessing.spawn prepares the child by importing the parent's main
        code = frame.f_code
        if code.co_name in _MAIN_FIXUPS and code.co_filename.endswith(os.path.join("multiprocessing", "spawn.py")):
            return True
        frame = frame.f_back
    return False


_MAIN_FIXUPS = ("_fixup_main_from_path", "_fixup_main_from_name")


def _usable(directory: str) -> bool:
    return os.path.isdir(directory) and not os.path.islink(directory) and os.access(directory, os.W_OK | os.X_OK)


def _writable_directory(after: str | None = None) -> str | None:
    """The first usable directory of DIRECTORIES (after `after`, when publishing there failed)."""
    candidates = DIRECTORIES[DIRECTORIES.index(after) + 1:] if after in DIRECTORIES else DIRECTORIES
    for directory in candidates:
        if _usable(directory):
            return directory
    return None


def _program_identity(exe_link: str, stat_file: str) -> list[int] | None:
    """[device, inode, stack start] of the program image a process runs: the file (stat
    through /proc/N/exe, which names the same file from every mount namespace) and where
    its stack began (field 28 of /proc/N/stat), which every exec moves, of the same
    interpreter too (helper-83: a job that re-exec'd its python kept its document). The
    stack start reads 0 to a reader without ptrace access, and stays put where address
    randomisation is off: then only the file tells. None where the file cannot be read."""
    try:
        st = os.stat(exe_link)
    except OSError:
        return None
    stack = 0
    try:
        with open(stat_file, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        stack = int(fields[25]) if len(fields) > 25 and fields[25].isdigit() else 0
    except (OSError, IndexError, ValueError):
        pass
    return [st.st_dev, st.st_ino, stack]


def _seconds(name: str, value: Any) -> float:
    """A finite number of seconds, or ValueError at the attach() call. An infinite interval
    (or a NaN or infinite first_delay) reached Event.wait() in the publisher thread: an
    OverflowError traceback in the job's stderr, and the document never written again."""
    try:
        # True is 1 to float(): attach(True), a flag meant as "on", published every second
        seconds = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError, OverflowError):  # 'abc', None, 10**400: float()'s own message named neither attach nor the argument
        seconds = math.nan
    if not math.isfinite(seconds) or seconds > 86400:
        raise ValueError(f"envdoctor.attach: {name} must be a finite number of seconds up to a day, not {value!r}")
    return seconds


def _named(name: str) -> tuple[int | None, int | None]:
    """(pid, pid namespace or None) of a document's file name, or (None, None) when it is no
    name attach() writes. ASCII digits of plausible size only: str.isdigit() takes '²',
    which int() refuses, and 20 digits overflowed os.kill (anyone may write /dev/shm)."""
    from envdoctor.announce import ascii_digits

    parts = name[len("envdoctor-attach-"):-len(".json")].split("-")
    if not 1 <= len(parts) <= 2 or not all(ascii_digits(p) for p in parts) or len(parts[0]) > 10 or len(parts[-1]) > 20:
        return None, None
    return int(parts[0]), (int(parts[1]) if len(parts) == 2 else None)


def _interval_of(path: str) -> float:
    """The interval_seconds a document declares (bounded as the writer bounds it), else 0."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            data = os.read(fd, MAX_BYTES)
        finally:
            os.close(fd)
        value = json.loads(data).get("interval_seconds")
    except (OSError, ValueError, AttributeError, RecursionError):
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
        return 0.0
    return float(value)


class Publisher:
    """The daemon thread that writes the document every `interval` seconds."""

    def __init__(self, interval: float = DEFAULT_INTERVAL, directory: str | None = None, first_delay: float = 0.0):
        from envdoctor.announce import own_start_ticks

        self.interval = max(0.5, _seconds("interval", interval))
        first_delay = max(0.0, _seconds("first_delay", first_delay))
        self.pid = os.getpid()
        self.start_ticks = own_start_ticks()
        self.exe = _program_identity("/proc/self/exe", "/proc/self/stat")
        self.namespace = pid_namespace("/proc/self/ns/pid")
        # absolute: a relative directory and a later os.chdir() left documents behind
        self.directory = os.path.abspath(directory) if directory else _writable_directory()
        self._chosen = directory is None  # ours to move to /tmp when /dev/shm fills up
        self.path = os.path.join(self.directory, document_name(self.pid, self.namespace)) if self.directory else None
        self.publications = 0
        self.last_seconds = 0.0
        self.max_seconds = 0.0
        self.cpu_seconds = 0.0
        self.error: str | None = None if self.path else "no writable /dev/shm or /tmp"
        self._stop = threading.Event()
        self._publishing = threading.Lock()
        self._first_delay = first_delay
        self._thread = threading.Thread(target=self._run, name="envdoctor-attach", daemon=True)

    def start(self) -> "Publisher":
        if self.path:
            for housekeeping in (self._sweep, self._announce):
                try:
                    housekeeping()
                except Exception as exc:  # never take the job down for what others left behind
                    self.error = f"{housekeeping.__name__}: {type(exc).__name__}: {exc}"
            self._thread.start()
            atexit.register(self.close)
        return self

    def _announce(self) -> None:
        """Tell a monitor on this host that this pid is a job worth examining: `<pid>.json`
        in each announce directory that exists and is writable ($ENVDOCTOR_ANNOUNCE_DIR,
        /run/envdoctor/attached). It carries the process's start time, so a monitor in
        another pid namespace (a job in a container that has the directory mounted) can
        tell that the number is not a pid it sees, and a reused pid is not taken."""
        import json

        from envdoctor.announce import ANNOUNCE_DIRS, announce_dirs, own_start_ticks

        body = json.dumps({"pid": self.pid, "start_ticks": own_start_ticks(), "document": self.path})
        self._announced: list[str] = []
        for directory in announce_dirs(os.environ, ANNOUNCE_DIRS):
            path = os.path.abspath(os.path.join(directory, f"{self.pid}.json"))  # removed at exit, whatever the cwd
            try:
                # O_NONBLOCK: the directory is world-writable (1777), and a FIFO someone left
                # under our pid's name blocked this open, and the job with it, for good
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            except OSError:  # not ours to write (read-only, another user's, a FIFO): the monitor finds us otherwise
                continue
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    continue  # a device or a FIFO with a reader: nothing to announce into
                os.ftruncate(fd, 0)
                os.write(fd, body.encode())
                self._announced.append(path)
            except OSError:
                continue
            finally:
                os.close(fd)

    def _sweep(self, stale_after: float = 600.0) -> None:
        """Remove documents that killed jobs left behind (SIGKILL runs no atexit), ours by
        owner and not rewritten for ten minutes: in our pid namespace (or under the older
        pid-only name) when their pid is gone; from another namespace (a container sharing
        /dev/shm), whose pids we cannot see, once older than three of their own intervals
        too, when no reader takes them any more. A live job rewrites its document every
        interval, so neither takes one from a running job."""
        directory = self.directory
        try:
            names = [n for n in os.listdir(directory) if n.startswith("envdoctor-attach-") and n.endswith(".json")]
        except OSError:
            return
        now = time.time()
        own = os.path.basename(self.path or "")
        for name in names[:1000]:
            pid, namespace = _named(name)
            if pid is None or name == own:
                continue
            path = os.path.join(directory, name)
            try:
                st = os.lstat(path)
                age = now - st.st_mtime
                if st.st_uid != os.geteuid() or age < stale_after:
                    continue
                if namespace is not None and namespace != self.namespace:
                    gone = age > 3 * _interval_of(path)
                else:
                    os.kill(pid, 0)
                    gone = False
            except ProcessLookupError:
                gone = True
            except (OSError, OverflowError):
                continue
            if gone:
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def cost(self) -> dict[str, Any]:
        return {"publications": self.publications, "last_seconds": round(self.last_seconds, 6),
                "max_seconds": round(self.max_seconds, 6), "cpu_seconds_total": round(self.cpu_seconds, 6)}

    def snapshot(self) -> dict[str, Any]:
        doc = snapshot(self.interval, self.cost())
        doc["path"] = self.path
        doc["start_ticks"] = self.start_ticks  # whose document it is, when pid 1 of two namespaces share /dev/shm
        if self.exe is not None:
            doc["exe"] = self.exe  # which program wrote it: an exec keeps the pid and the start time
        return doc

    def publish(self) -> None:
        """Build and write the document once: a temporary file in the same directory,
        created exclusively (never through a symlink someone planted), written whole,
        renamed over the name (a reader sees the old document or the new one, never
        half). When /dev/shm is full, the document moves to /tmp, where the reader
        looks next."""
        if self.path is None or os.getpid() != self.pid:
            return
        with self._publishing:  # the thread's and a caller's publish() must not both move the document
            t0, c0 = time.perf_counter(), time.thread_time()
            self.publications += 1  # this one included: the document counts itself
            data = self._encoded()
            if data is None:
                self.error = f"not published: the document is over the {MAX_BYTES}-byte cap even without its env"
            else:
                path, failure = self.path, self._write(data)
                if failure is not None and failure.errno in (errno.ENOSPC, errno.EDQUOT) and self._move_on():
                    path, failure = self.path, self._write(data)
                if failure is not None:
                    self.error = f"cannot publish to {path}: {failure.strerror or failure}"
            self._account(t0, c0)

    def _account(self, t0: float, c0: float) -> None:
        self.last_seconds = time.perf_counter() - t0
        self.max_seconds = max(self.max_seconds, self.last_seconds)
        self.cpu_seconds += time.thread_time() - c0

    def _encoded(self) -> bytes | None:
        """The document as bytes within MAX_BYTES, or None. Only the job's variables can make
        it large (a CUDA_VISIBLE_DEVICES of thousands of UUIDs): they are left out, and the
        document says so, rather than cut mid-string into JSON no reader accepts."""
        doc = self.snapshot()
        data = json.dumps(doc, separators=(",", ":"), default=str).encode()
        if len(data) > MAX_BYTES:
            doc["env"] = {}
            doc["omitted"] = f"env: the document was {len(data)} bytes with it, over the {MAX_BYTES}-byte cap"
            data = json.dumps(doc, separators=(",", ":"), default=str).encode()
        return data if len(data) <= MAX_BYTES else None

    def _write(self, data: bytes) -> OSError | None:
        """Write `data` as the document; the error, or None once it is in place."""
        assert self.path is not None
        tmp = f"{self.path}.{os.urandom(4).hex()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            # 0600, as /proc/N/environ is 0400: the document holds variables of the job's
            # environment, and in a shared /dev/shm 0644 showed them to every user (helper-120).
            # Its readers are the job's user, root, and serve (CAP_DAC_READ_SEARCH)
            fd = os.open(tmp, flags, 0o600)
            try:
                view = memoryview(data)
                while view:  # a nearly full tmpfs takes part of it: the rest raises ENOSPC, never a half renamed in
                    written = os.write(fd, view)
                    if written <= 0:
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    view = view[written:]
            finally:
                os.close(fd)
            os.rename(tmp, self.path)
            return None
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return exc

    def _move_on(self) -> bool:
        """Publishing in the chosen directory failed for want of space (a full /dev/shm):
        use the next usable one from now on. False when there is none, or the directory
        was the caller's choice."""
        following = _writable_directory(after=self.directory) if self._chosen else None
        if following is None:
            return False
        old, self.directory = self.path, following
        self.path = os.path.join(following, document_name(self.pid, self.namespace))
        try:
            if old:
                os.unlink(old)  # an old copy there would be found first, and go stale
        except OSError:
            pass
        return True

    def _run(self) -> None:
        if self._first_delay and self._stop.wait(self._first_delay):
            return
        while not self._stop.is_set():
            if os.getpid() != self.pid or _in_multiprocessing_child():
                self._remove()
                return
            try:
                self.publish()
            except Exception as exc:  # never take the job down
                self.error = f"{type(exc).__name__}: {exc}"
            self._stop.wait(self.interval)

    def _remove(self) -> None:
        if self.path and os.getpid() == self.pid:
            for path in [self.path, *getattr(self, "_announced", [])]:
                try:
                    os.unlink(path)
                except OSError:
                    pass

    @property
    def closed(self) -> bool:
        """close() was called: attach() then starts a new publisher."""
        return self._stop.is_set()

    def close(self) -> None:
        """Stop publishing and remove the document (at exit; only in the process that published).
        Not when a newer publisher of this process already writes the same file: an attach()
        right after close() (from another thread) lost its document to this removal."""
        if os.getpid() != self.pid:
            return
        self._stop.set()
        atexit.unregister(self.close)  # attach/close cycles piled up one exit handler each
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2.0)
        with _publisher_lock:
            newer = _publisher
            if newer is None or newer is self or newer.closed or newer.path != self.path:
                self._remove()


_publisher: Publisher | None = None
_publisher_lock = threading.Lock()


def _forget_in_child() -> None:
    global _publisher
    _publisher = None  # the thread did not survive the fork; the child does not publish


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def attach(interval: float = DEFAULT_INTERVAL, *, directory: str | None = None, first_delay: float = 0.0) -> Publisher | None:
    """Publish this process's live settings every `interval` seconds until it exits.

    Returns the Publisher (call .close() to stop early), or None where nothing is
    published: in a DataLoader worker or another multiprocessing child, or with
    ENVDOCTOR_ATTACH=0. Calling it again returns the same publisher.
    """
    global _publisher
    # a bad one is the caller's mistake on every call, not only the first
    if _seconds("interval", interval) <= 0:  # 0 became 0.5 without a word: a typo, or "as often as possible"?
        raise ValueError(f"envdoctor.attach: interval must be more than 0 seconds (below 0.5, 0.5 is used), not {interval!r}")
    _seconds("first_delay", first_delay)
    if os.environ.get("ENVDOCTOR_ATTACH", "").strip().lower() in ("0", "false", "no", "off"):
        return None
    if _in_multiprocessing_child():
        return None
    with _publisher_lock:
        if _publisher is not None and _publisher.pid == os.getpid() and not _publisher.closed:
            return _publisher
        _install_dataloader_hook()
        _publisher = Publisher(interval, directory, first_delay).start()
        return _publisher


def current() -> Publisher | None:
    """This process's publisher, if attach() ran here."""
    publisher = _publisher
    return publisher if publisher is not None and publisher.pid == os.getpid() and not publisher.closed else None


# -- the start-up hook for `envdoctor exec --attach` ---------------------------------------

_HOOK = '''\
# Written by envdoctor (envdoctor exec --attach): publish this job's live settings.
# It first runs the sitecustomize it shadows, if there is one, then envdoctor.attach().
import os as _os, sys as _sys
def _envdoctor_hook():
    here = _os.path.dirname(_os.path.abspath(__file__))
    saved = list(_sys.path)
    mine = _sys.modules.pop("sitecustomize", None)
    try:
        _sys.path[:] = [p for p in saved if _os.path.abspath(p or _os.curdir) != here]
        try:
            import sitecustomize  # the one this file shadows
        except ImportError as exc:
            if exc.name != "sitecustomize":
                _sys.stderr.write("envdoctor: the original sitecustomize failed: %r\\n" % (exc,))
        except Exception as exc:
            _sys.stderr.write("envdoctor: the original sitecustomize failed: %r\\n" % (exc,))
    finally:
        _sys.path[:] = saved
        if "sitecustomize" not in _sys.modules and mine is not None:
            _sys.modules["sitecustomize"] = mine
    _sys.path.insert(0, {package_parent!r})
    try:
        import envdoctor.attach
        envdoctor.attach.attach({interval!r}, first_delay={first_delay!r})
    except Exception as exc:
        _sys.stderr.write("envdoctor: attach failed: %r\\n" % (exc,))
    finally:
        try:
            _sys.path.remove({package_parent!r})
        except ValueError:
            pass
_envdoctor_hook()
del _envdoctor_hook
'''


def startup_hook(directory: str | os.PathLike, env: Mapping[str, str], interval: float = DEFAULT_INTERVAL) -> dict[str, str]:
    """Write a sitecustomize.py into `directory` that attaches the interpreter at start,
    and return the environment changes that make Python run it (PYTHONPATH with the
    directory first). The hook runs any sitecustomize it shadows first, imports
    envdoctor from where this copy lives (only for that import: the path entry is
    removed again), and attaches after one second (so a spawned multiprocessing
    child, which imports multiprocessing after start-up, is recognised and stays quiet).

    `envdoctor exec --attach` calls it with a private directory (tempfile.mkdtemp())
    and merges the result into the command's environment before exec.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    package_parent = str(Path(__file__).resolve().parent.parent)
    text = _HOOK.format(package_parent=package_parent, interval=float(interval), first_delay=1.0)
    hook = directory / "sitecustomize.py"
    if not _holds(hook, text):  # every start after the first finds it written: no write, so a full disk costs nothing
        from envdoctor.atomicfile import write_atomic

        if os.path.islink(hook):  # replaced, never written through: write_atomic follows a link (helper-45)
            os.unlink(hook)
        write_atomic(str(hook), text)  # two starts at once never read half a hook
    existing = env.get("PYTHONPATH", "")
    return {"PYTHONPATH": str(directory) + (os.pathsep + existing if existing else "")}


def _holds(path: Path, text: str) -> bool:
    """Whether `path` is a regular file holding exactly `text` (never opens a FIFO or device)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        want = text.encode("utf-8")
        return os.read(fd, len(want) + 1) == want
    except OSError:
        return False
    finally:
        os.close(fd)


def __getattr__(name: str) -> Any:
    # the reading side lives in envdoctor.attach_reader; these names stay reachable here
    if name in _READER_NAMES:
        from envdoctor import attach_reader

        return getattr(attach_reader, name)
    raise AttributeError(f"module 'envdoctor.attach' has no attribute {name!r}")


# `import envdoctor; envdoctor.attach()` must work whether or not this module has been
# imported: once it is, the import system binds the name `attach` in the package to
# this module, shadowing the package's lazy attribute. So the module is callable too,
# and calling it is calling attach().
import types as _types  # noqa: E402


class _CallableModule(_types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Publisher | None:
        return attach(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
