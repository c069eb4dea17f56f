"""The live view: a training job publishes its own torch settings for envdoctor to read.

    import envdoctor; envdoctor.attach()

(or `envdoctor exec --attach -- python train.py`, which arranges the same through
the interpreter's start-up hook: `startup_hook()` below).

Some facts exist only inside the running job: the thread count after
`torch.set_num_threads(16)`, cudnn flags set in code, whether CUDA is initialised,
the caching allocator's figures, and the DataLoaders the script built. A daemon
thread writes them every `interval` seconds (default 5) as one small JSON document
(schema `envdoctor.attach/v1`, a few KiB) to

    /dev/shm/envdoctor-attach-<pid>.json   (else /tmp/..., when /dev/shm is unusable)

where <pid> is the process's pid in its own PID namespace. Why there: `envdoctor
check --pid N` and `serve` on the host read it through /proc/N/root, the job's own
mount namespace, so a job in a container needs no volume, port or socket; /dev/shm
is a tmpfs in every container (no disk write every few seconds, nothing left
behind when the container goes), and /tmp is the fallback every image has.

What the job pays: one short thread wake-up per interval; building and writing the
document takes a fraction of a millisecond (benchmarks/attach_cost.py measures it;
the document carries its own cost figures). It never imports torch (it reads torch
only if the script already imported it) and never initialises CUDA (the allocator
figures are read only once torch.cuda.is_initialized()). DataLoaders are seen by
wrapping DataLoader.__init__ and __iter__ (and the iterator's __next__, which
measures the bytes of a few batches); the wrapping happens when the script imports
torch.utils.data, through a post-import hook, so attach() may come first. Forked
children (DataLoader workers) and spawned multiprocessing children do not publish;
the document is removed at exit.

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
import os
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

SCHEMA = "envdoctor.attach/v1"
MAX_BYTES = 64 * 1024
DEFAULT_INTERVAL = 5.0
DIRECTORIES = ("/dev/shm", "/tmp")
MAX_LOADERS = 32
LIVE_ENV = ("CUBLAS_WORKSPACE_CONFIG", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "LOCAL_WORLD_SIZE", "LOCAL_RANK")


def document_name(pid: int) -> str:
    return f"envdoctor-attach-{pid}.json"


# -- what the job publishes ---------------------------------------------------------------


def _call_in_fresh_thread(fn: Callable[[], Any]) -> Any:
    """torch.get_num_threads() answers for the calling thread's OpenMP state, set once per
    thread from the last set_num_threads; a long-lived publisher thread would keep
    reporting the count of its first call. A fresh thread reads the current one."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(fn()), name="envdoctor-attach-read", daemon=True)
    thread.start()
    thread.join(1.0)
    return box[0] if box else None


def _torch_facts(torch: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"version": str(getattr(torch, "__version__", ""))}

    def get(name: str, fn: Callable[[], Any]) -> None:
        try:
            out[name] = fn()
        except Exception:  # a half-imported torch, an old version: that figure is simply absent
            pass

    get("num_threads", lambda: _call_in_fresh_thread(lambda: int(torch.get_num_threads())))
    get("num_interop_threads", lambda: int(torch.get_num_interop_threads()))
    cudnn = getattr(getattr(torch, "backends", None), "cudnn", None)
    if cudnn is not None:
        get("cudnn_enabled", lambda: bool(cudnn.enabled))
        get("cudnn_benchmark", lambda: bool(cudnn.benchmark))
        get("cudnn_deterministic", lambda: bool(cudnn.deterministic))
    get("deterministic_algorithms", lambda: bool(torch.are_deterministic_algorithms_enabled()))
    get("deterministic_warn_only", lambda: bool(torch.is_deterministic_algorithms_warn_only_enabled()))
    get("cuda_compiled", lambda: getattr(torch.version, "cuda", None) is not None)
    return out


def _cuda_facts(torch: Any) -> dict[str, Any]:
    cuda = getattr(torch, "cuda", None)
    try:
        initialized = bool(cuda.is_initialized()) if cuda is not None else False
    except Exception:
        initialized = False
    out: dict[str, Any] = {"initialized": initialized, "devices": {}}
    if not initialized:
        return out  # never initialise CUDA: it costs GPU memory and breaks forked workers
    try:
        count = int(cuda.device_count())
    except Exception:
        return out
    for i in range(min(count, 64)):
        try:
            stats = cuda.memory_stats(i)
            dev = {
                "allocated_bytes": int(stats.get("allocated_bytes.all.current", 0)),
                "reserved_bytes": int(stats.get("reserved_bytes.all.current", 0)),
                "inactive_split_bytes": int(stats.get("inactive_split_bytes.all.current", 0)),
                "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
                "num_ooms": int(stats.get("num_ooms", 0)),
            }
            dev["total_bytes"] = int(cuda.get_device_properties(i).total_memory)
        except Exception:
            continue
        out["devices"][str(i)] = dev
    return out


class _Loader:
    """What one DataLoader was built with, and the batches seen through it."""

    __slots__ = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size",
                 "batch_bytes_max", "batch_bytes_last", "batches", "__weakref__")

    def __init__(self, loader: Any):
        self.num_workers = _int_or_none(getattr(loader, "num_workers", None))
        self.pin_memory = bool(getattr(loader, "pin_memory", False))
        prefetch = getattr(loader, "prefetch_factor", None)
        self.prefetch_factor = _int_or_none(prefetch) if self.num_workers else None
        if self.num_workers and self.prefetch_factor is None:
            self.prefetch_factor = 2  # DataLoader's default with workers
        self.persistent_workers = bool(getattr(loader, "persistent_workers", False))
        self.batch_size = _int_or_none(getattr(loader, "batch_size", None))
        self.batch_bytes_max = None
        self.batch_bytes_last = None
        self.batches = 0

    def seen(self, batch: Any) -> None:
        self.batches += 1
        # the first 16 batches, then one in 64: a few microseconds, not per step
        if self.batches > 16 and self.batches % 64:
            return
        size = _nbytes(batch, 0)
        self.batch_bytes_last = size
        if self.batch_bytes_max is None or size > self.batch_bytes_max:
            self.batch_bytes_max = size

    def to_dict(self) -> dict[str, Any]:
        return {"num_workers": self.num_workers, "pin_memory": self.pin_memory,
                "prefetch_factor": self.prefetch_factor, "persistent_workers": self.persistent_workers,
                "batch_size": self.batch_size, "batch_bytes_max": self.batch_bytes_max,
                "batch_bytes_last": self.batch_bytes_last, "batches_seen": self.batches}


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _nbytes(obj: Any, depth: int) -> int:
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int) and hasattr(obj, "element_size"):
        return nbytes
    if depth >= 4:
        return 0
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(item, depth + 1) for item in obj[:256])
    if isinstance(obj, dict):
        return sum(_nbytes(item, depth + 1) for item in list(obj.values())[:256])
    return 0


_loaders: list[_Loader] = []
_loaders_lock = threading.Lock()
_TARGET_MODULE = "torch.utils.data.dataloader"


def _patch_dataloader(module: Any) -> None:
    """Wrap DataLoader.__init__/__iter__ and the iterator's __next__, once."""
    loader_cls = getattr(module, "DataLoader", None)
    iter_cls = getattr(module, "_BaseDataLoaderIter", None)
    if loader_cls is None or getattr(loader_cls, "_envdoctor_patched", False):
        return
    original_init, original_iter = loader_cls.__init__, loader_cls.__iter__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        try:
            record = _Loader(self)
            object.__setattr__(self, "_envdoctor_record", record)
            with _loaders_lock:
                _loaders.append(record)
                del _loaders[:-MAX_LOADERS]
        except Exception:
            pass

    def __iter__(self):
        it = original_iter(self)
        try:
            it._envdoctor_record = getattr(self, "_envdoctor_record", None)
        except Exception:
            pass
        return it

    loader_cls.__init__, loader_cls.__iter__ = __init__, __iter__
    loader_cls._envdoctor_patched = True
    if iter_cls is not None:
        original_next = iter_cls.__next__

        def __next__(self):
            batch = original_next(self)
            record = getattr(self, "_envdoctor_record", None)
            if record is not None:
                try:
                    record.seen(batch)
                except Exception:
                    pass
            return batch

        iter_cls.__next__ = __next__


class _PostImportHook:
    """A meta-path finder that patches the DataLoader right after torch imports it, so
    attach() may run before `import torch` and still see every DataLoader."""

    def __init__(self) -> None:
        self._busy = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _TARGET_MODULE or self._busy:
            return None
        self._busy = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy = False
        loader = spec.loader
        original_exec = getattr(loader, "exec_module", None)
        if original_exec is None:
            return None

        def exec_module(module: Any) -> None:
            original_exec(module)
            try:
                _patch_dataloader(module)
            except Exception:
                pass

        try:
            loader.exec_module = exec_module
        except Exception:
            return None
        return spec


def _install_dataloader_hook() -> None:
    module = sys.modules.get(_TARGET_MODULE)
    if module is not None:
        _patch_dataloader(module)
        return
    if not any(isinstance(f, _PostImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportHook())


def snapshot(interval: float = DEFAULT_INTERVAL, cost: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The document as of now. Reads torch only if it is already imported; never imports it."""
    torch = sys.modules.get("torch")
    torch_ready = torch is not None and hasattr(torch, "get_num_threads") and hasattr(torch, "cuda")
    with _loaders_lock:
        loaders = [record.to_dict() for record in _loaders]
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "pid": os.getpid(),
        "published_at": time.time(),
        "interval_seconds": interval,
        "python": sys.executable,
        "env": {name: os.environ[name] for name in LIVE_ENV if name in os.environ},
        "torch": _torch_facts(torch) if torch_ready else None,
        "cuda": _cuda_facts(torch) if torch_ready else {"initialized": False, "devices": {}},
        "dataloaders": loaders,
    }
    if cost is not None:
        doc["cost"] = dict(cost)
    return doc


def _in_multiprocessing_child() -> bool:
    if "--multiprocessing-fork" in sys.argv:
        return True
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return False
    try:
        return mp.parent_process() is not None
    except Exception:
        return False


def _writable_directory() -> str | None:
    for directory in DIRECTORIES:
        if os.path.isdir(directory) and not os.path.islink(directory) and os.access(directory, os.W_OK | os.X_OK):
            return directory
    return None


class Publisher:
    """The daemon thread that writes the document every `interval` seconds."""

    def __init__(self, interval: float = DEFAULT_INTERVAL, directory: str | None = None, first_delay: float = 0.0):
        self.interval = max(0.5, float(interval))
        self.pid = os.getpid()
        self.directory = directory or _writable_directory()
        self.path = os.path.join(self.directory, document_name(self.pid)) if self.directory else None
        self.publications = 0
        self.last_seconds = 0.0
        self.max_seconds = 0.0
        self.cpu_seconds = 0.0
        self.error: str | None = None if self.path else "no writable /dev/shm or /tmp"
        self._stop = threading.Event()
        self._first_delay = first_delay
        self._thread = threading.Thread(target=self._run, name="envdoctor-attach", daemon=True)

    def start(self) -> "Publisher":
        if self.path:
            self._thread.start()
            atexit.register(self.close)
        return self

    def cost(self) -> dict[str, Any]:
        return {"publications": self.publications, "last_seconds": round(self.last_seconds, 6),
                "max_seconds": round(self.max_seconds, 6), "cpu_seconds_total": round(self.cpu_seconds, 6)}

    def snapshot(self) -> dict[str, Any]:
        doc = snapshot(self.interval, self.cost())
        doc["path"] = self.path
        return doc

    def publish(self) -> None:
        """Build and write the document once: a temporary file in the same directory,
        created exclusively (never through a symlink someone planted), renamed over
        the name (a reader sees the old document or the new one, never half)."""
        if self.path is None or os.getpid() != self.pid:
            return
        t0, c0 = time.perf_counter(), time.thread_time()
        self.publications += 1  # this one included: the document counts itself
        data = json.dumps(self.snapshot(), separators=(",", ":"), default=str).encode()
        tmp = f"{self.path}.{os.urandom(4).hex()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(tmp, flags, 0o644)
            try:
                os.write(fd, data[:MAX_BYTES])
            finally:
                os.close(fd)
            os.rename(tmp, self.path)
        except OSError as exc:
            self.error = f"cannot publish to {self.path}: {exc.strerror or exc}"
            try:
                os.unlink(tmp)
            except OSError:
                pass
        self.last_seconds = time.perf_counter() - t0
        self.max_seconds = max(self.max_seconds, self.last_seconds)
        self.cpu_seconds += time.thread_time() - c0

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
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def close(self) -> None:
        """Stop publishing and remove the document (at exit; only in the process that published)."""
        if os.getpid() != self.pid:
            return
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2.0)
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
    if os.environ.get("ENVDOCTOR_ATTACH", "").strip() in ("0", "false", "no", "off"):
        return None
    if _in_multiprocessing_child():
        return None
    with _publisher_lock:
        if _publisher is not None and _publisher.pid == os.getpid():
            return _publisher
        _install_dataloader_hook()
        _publisher = Publisher(interval, directory, first_delay).start()
        return _publisher


def current() -> Publisher | None:
    """This process's publisher, if attach() ran here."""
    publisher = _publisher
    return publisher if publisher is not None and publisher.pid == os.getpid() else None


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
    (directory / "sitecustomize.py").write_text(text)
    existing = env.get("PYTHONPATH", "")
    return {"PYTHONPATH": str(directory) + (os.pathsep + existing if existing else "")}


# -- reading another process's document (untrusted) ----------------------------------------


def _status(roots: Any, pid: int) -> tuple[int | None, int | None]:
    """(the pid in the process's own namespace: the last NSpid field, its effective uid)."""
    from envdoctor.paths import read_text

    text = read_text(roots.proc(pid, "status"), 1 << 20)
    nspid, uid = pid, None
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()[1:]
            if fields and fields[-1].isdigit():
                nspid = int(fields[-1])
        elif line.startswith("Uid:"):
            fields = line.split()[1:]
            if len(fields) >= 2 and fields[1].isdigit():
                uid = int(fields[1])
    return nspid, uid


def _open_under(root_fd: int, directory: str, name: str) -> int:
    """Open root/directory/name without following a symlink at any step."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    fds = []
    try:
        current = root_fd
        for part in [p for p in directory.split("/") if p]:
            current = os.open(part, os.O_RDONLY | os.O_DIRECTORY | nofollow | os.O_CLOEXEC, dir_fd=current)
            fds.append(current)
        return os.open(name, os.O_RDONLY | nofollow | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=current)
    finally:
        for fd in fds:
            os.close(fd)


def validate(doc: Any, nspid: int | None, now: float | None = None) -> str | None:
    """Why a parsed document cannot be used, or None when it can."""
    if not isinstance(doc, dict):
        return "the document is not a JSON object"
    if doc.get("schema") != SCHEMA:
        return f"unknown schema {str(doc.get('schema'))[:40]!r}, expected {SCHEMA}"
    if nspid is not None and doc.get("pid") != nspid:
        return f"the document names pid {str(doc.get('pid'))[:20]}, not {nspid}"
    published, interval = doc.get("published_at"), doc.get("interval_seconds")
    if not isinstance(published, (int, float)) or not isinstance(interval, (int, float)) or interval <= 0:
        return "the document has no valid published_at / interval_seconds"
    age = (time.time() if now is None else now) - published
    if age > max(3 * interval, 15.0):
        return f"the document is stale ({age:.0f} s old; the job stopped publishing)"
    for key, kind in (("torch", (dict, type(None))), ("cuda", dict), ("dataloaders", list), ("env", dict)):
        if key in doc and not isinstance(doc[key], kind):
            return f"the document's {key!r} has the wrong type"
    return None


def read_document(roots: Any, pid: int) -> tuple[dict[str, Any] | None, str]:
    """The document process `pid` published, or None and why not (never raises)."""
    try:
        nspid, uid = _status(roots, pid)
    except OSError as exc:
        return None, f"cannot read {roots.proc(pid, 'status')}: {exc.strerror or exc}"
    try:
        root_fd = os.open(roots.proc(pid, "root"), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        return None, f"cannot open {roots.proc(pid, 'root')}: {exc.strerror or exc}"
    try:
        name = document_name(nspid)
        for directory in DIRECTORIES:
            try:
                fd = _open_under(root_fd, directory, name)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    continue
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    return None, f"{directory}/{name} in process {pid} is (or lies under) a symlink: not followed"
                return None, f"cannot open {directory}/{name} of process {pid}: {exc.strerror or exc}"
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    return None, f"{directory}/{name} of process {pid} is not a regular file"
                if uid is not None and st.st_uid != uid:
                    return None, f"{directory}/{name} is owned by uid {st.st_uid}, not by the process's uid {uid}"
                if st.st_size > MAX_BYTES:
                    return None, f"{directory}/{name} is {st.st_size} bytes, over the {MAX_BYTES}-byte cap"
                data = os.read(fd, MAX_BYTES + 1)
            finally:
                os.close(fd)
            if len(data) > MAX_BYTES:
                return None, f"{directory}/{name} is over the {MAX_BYTES}-byte cap"
            try:
                doc = json.loads(data.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                return None, f"{directory}/{name} is not valid JSON: {str(exc)[:80]}"
            reason = validate(doc, nspid)
            if reason:
                return None, reason
            return doc, f"{directory}/{name}"
        return None, (f"process {pid} is not attached (no {name} in its /dev/shm or /tmp): add "
                      "`import envdoctor; envdoctor.attach()` to the script, or start it with envdoctor exec --attach")
    except Exception as exc:  # untrusted input must never crash the reader
        return None, f"cannot read the attached document of process {pid}: {type(exc).__name__}: {exc}"
    finally:
        os.close(root_fd)


def live_document(roots: Any, pid: int | None) -> dict[str, Any] | None:
    """The live document of `pid` (None: this process, when it attached itself), or None."""
    if pid is None:
        publisher = current()
        return publisher.snapshot() if publisher is not None else None
    doc, _ = read_document(roots, pid)
    return doc


# -- what the checks use -------------------------------------------------------------------


class LiveFacts:
    """The live view of a check's target: the document and where it came from, or why there is none."""

    def __init__(self, doc: Mapping[str, Any] | None, source: str):
        self.doc, self.source = doc, source

    @property
    def torch(self) -> Mapping[str, Any] | None:
        t = (self.doc or {}).get("torch")
        return t if isinstance(t, dict) else None

    @property
    def num_threads(self) -> int | None:
        value = (self.torch or {}).get("num_threads")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    @property
    def env(self) -> Mapping[str, str]:
        env = (self.doc or {}).get("env")
        return {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(env, dict) else {}

    @property
    def dataloaders(self) -> list[Mapping[str, Any]]:
        loaders = (self.doc or {}).get("dataloaders")
        return [d for d in loaders if isinstance(d, dict)][:MAX_LOADERS] if isinstance(loaders, list) else []

    def busiest_loader(self) -> Mapping[str, Any] | None:
        """The DataLoader with the most workers (ties: the largest batches)."""
        def key(d: Mapping[str, Any]) -> tuple[int, int]:
            workers, size = d.get("num_workers"), d.get("batch_bytes_max")
            return (workers if isinstance(workers, int) else 0, size if isinstance(size, int) else 0)

        loaders = self.dataloaders
        return max(loaders, key=key) if loaders else None


def live_facts(ctx: Any) -> LiveFacts:
    """The target's live view, read once per run and shared by the checks (never raises).

    For another process: its published document. For this process: the document
    attach() would publish now (preflight() and an attached script share this code).
    """
    def read() -> LiveFacts:
        pid = ctx.target.pid
        if getattr(ctx.target, "kind", "process") == "node":
            return LiveFacts(None, "the node has no live view")
        if pid is None:
            # This process: live when it attached itself, or when the run is preflight()
            # inside the script (its session reads torch live); never for the envdoctor
            # command itself, whose own torch (if any) says nothing about a job.
            publisher = current()
            if publisher is not None:
                return LiveFacts(publisher.snapshot(), "this process (attached)")
            inprocess = sys.modules.get("envdoctor.inprocess")
            live_torch = getattr(inprocess, "live_torch_facts", None)
            if live_torch is not None and getattr(ctx.session, "torch_factory", None) is live_torch:
                return LiveFacts(snapshot(), "this process (preflight)")
            return LiveFacts(None, "this process is not attached")
        doc, source = read_document(ctx.roots, pid)
        return LiveFacts(doc, source)

    try:
        return ctx.host.fact(f"attach.live:{ctx.target.label}", read)
    except Exception as exc:
        return LiveFacts(None, f"{type(exc).__name__}: {exc}")


# `import envdoctor; envdoctor.attach()` must work whether or not this module has been
# imported: once it is, the import system binds the name `attach` in the package to
# this module, shadowing the package's lazy attribute. So the module is callable too,
# and calling it is calling attach().
import types as _types  # noqa: E402


class _CallableModule(_types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Publisher | None:
        return attach(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
