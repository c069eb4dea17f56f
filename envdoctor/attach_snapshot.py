"""What an attached job publishes: its live torch settings, the CUDA caching allocator's
figures, and the DataLoaders it built (envdoctor.attach writes it; attach_reader reads it).

The document, schema `envdoctor.attach/v1`, is one JSON object of a few KiB:
`{"schema", "pid", "published_at", "interval_seconds", "python", "env", "torch",
"cuda": {"initialized", "devices"}, "dataloaders": [...], "cost"}`, and from attach's
publisher "path", "start_ticks" and "exe" (the program image's device, inode and stack start). Everything here
runs inside the job, so it reads torch only if the script already imported it, never
initialises CUDA, and keeps the DataLoader hooks to a few attribute reads per batch.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import weakref

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping

SCHEMA = "envdoctor.attach/v1"
MAX_BYTES = 64 * 1024  # the reader refuses anything larger; the writer never writes more
DEFAULT_INTERVAL = 5.0
DIRECTORIES = ("/dev/shm", "/tmp")  # where the document lives, in the job's own mount namespace
MAX_LOADERS = 32
LIVE_ENV = ("CUBLAS_WORKSPACE_CONFIG", "PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
            "LOCAL_WORLD_SIZE", "LOCAL_RANK")


def document_name(pid: int, namespace: int | None = None) -> str:
    """The document's file name: the pid as the job sees it (its own PID namespace) and,
    when known, that namespace's inode (`readlink /proc/N/ns/pid`, the same number from
    the host and from inside). Jobs in containers that share /dev/shm (`docker run
    --ipc=host`) are each pid 1 of their own namespace: the inode keeps their documents
    apart, however close together they started. Without it (no /proc), the older name
    of the pid alone, which the reader still reads (what envdoctor wrote before
    2026-11-23)."""
    if namespace is None:
        return f"envdoctor-attach-{pid}.json"
    return f"envdoctor-attach-{pid}-{namespace}.json"


def pid_namespace(link: str | os.PathLike) -> int | None:
    """The inode of a pid namespace from its /proc link (`pid:[4026531836]`), or None."""
    try:
        text = os.readlink(link)
    except (OSError, ValueError):
        return None
    digits = text[text.find("[") + 1:-1] if text.startswith("pid:[") and text.endswith("]") else ""
    return int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 20 else None


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


# The thread count as the script last set it: kept by our wrapper of torch.set_num_threads
# (installed by attach()), so a publication needs no thread of its own; read through a fresh
# thread when the wrapper has seen no call yet (the script set it before attaching), and again
# every REREAD_SECONDS in the background: a script that took `from torch import
# set_num_threads` before attaching calls the original, which the wrapper never sees
# (helper-79). `gen` counts the wrapper's calls: a read that a call overtook is stale, and is
# not kept (helper-79: attach() then set_num_threads(16) published 2 for good, 3 runs in 10).
_threads: dict[str, Any] = {"value": None, "gen": 0, "read_at": 0.0}
REREAD_SECONDS = 30.0


def _wrap_set_num_threads(torch: Any) -> None:
    """Only once torch has finished importing: torch's own import later attaches a docstring
    to the builtin set_num_threads and fails on anything else."""
    if getattr(getattr(torch, "__spec__", None), "_initializing", False):
        return
    original = getattr(torch, "set_num_threads", None)
    if original is None or getattr(original, "_envdoctor_wrapped", False):
        return

    def set_num_threads(n: int) -> None:
        original(n)
        try:
            _threads["value"] = int(n)
        except (TypeError, ValueError):
            _threads["value"] = None
        _threads["gen"] += 1

    set_num_threads._envdoctor_wrapped = True  # type: ignore[attr-defined]
    set_num_threads.__doc__ = getattr(original, "__doc__", None)
    set_num_threads.__name__ = "set_num_threads"
    torch.set_num_threads = set_num_threads


def _wrapped(torch: Any) -> bool:
    return bool(getattr(getattr(torch, "set_num_threads", None), "_envdoctor_wrapped", False))


def _read_threads(torch: Any) -> int | None:
    """torch.get_num_threads() as a fresh thread sees it (the count last set, however it was
    set), kept unless the wrapper saw a call while it was read."""
    gen = _threads["gen"]
    _threads["read_at"] = time.monotonic()
    value = _call_in_fresh_thread(lambda: int(torch.get_num_threads()))
    if value is not None and _threads["gen"] == gen and _wrapped(torch):
        _threads["value"] = value
    return value


def _live_num_threads(torch: Any) -> int | None:
    from envdoctor.attach import current  # the wrapper belongs to an attached process only

    if current() is not None and not _wrapped(torch):
        _wrap_set_num_threads(torch)
    value = _threads["value"]
    if value is None:
        read = _read_threads(torch)
        return _threads["value"] if _threads["value"] is not None else read
    if time.monotonic() - _threads["read_at"] >= REREAD_SECONDS:
        # in the background: a publication does not wait for a thread to be scheduled
        _threads["read_at"] = time.monotonic()
        try:
            threading.Thread(target=_read_threads, args=(torch,), name="envdoctor-attach-reread", daemon=True).start()
        except RuntimeError:  # no thread to spare: read again next time
            pass
    return value


def _torch_facts(torch: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"version": str(getattr(torch, "__version__", ""))}

    def get(name: str, fn: Callable[[], Any]) -> None:
        try:
            out[name] = fn()
        except Exception:  # a half-imported torch, an old version: that figure is simply absent
            pass

    get("num_threads", lambda: _live_num_threads(torch))
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
            if dev["reserved_bytes"] > 0:
                # the driver's free memory on a device this process already uses (its context
                # exists); never on another device, where the query would create a context
                dev["free_bytes"] = int(cuda.mem_get_info(i)[0])
        except Exception:
            continue
        out["devices"][str(i)] = dev
    return out


class _Loader:
    """What one DataLoader was built with, and the batches seen through it, while it lives:
    a loader that is gone, with every iterator made from it, starts no worker and holds no
    batch, and is left out of the document (helper-75: a one-off 8-worker loader deleted
    long ago was judged as the job's live one)."""

    __slots__ = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size",
                 "batch_bytes_max", "batch_bytes_last", "batches", "_loader", "_iterators", "__weakref__")

    def __init__(self, loader: Any):
        self._loader = weakref.ref(loader)
        self._iterators: weakref.WeakSet[Any] = weakref.WeakSet()
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

    def alive(self) -> bool:
        return self._loader() is not None or len(self._iterators) > 0

    # The record rides on its DataLoader (`_envdoctor_record`), which a job may pickle (torch.save,
    # a spawn-started process): its figures go along, its weak references cannot (helper-77:
    # "cannot pickle 'weakref.ReferenceType'" from every pickled loader). A copy is of no loader.
    _FIGURES = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size",
                "batch_bytes_max", "batch_bytes_last", "batches")

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._FIGURES}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name in self._FIGURES:
            setattr(self, name, state.get(name))
        self._loader = _no_loader
        self._iterators = weakref.WeakSet()

    def iterating(self, iterator: Any) -> None:
        self._iterators.add(iterator)

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


def _no_loader() -> None:
    """A copied record's loader: none (the copy is not in _loaders, and counts as gone)."""
    return None


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

    # functools.wraps: the signature stays DataLoader's own, which code that rebuilds a loader
    # from inspect.signature(DataLoader.__init__) reads (helper-75: it was (*args, **kwargs))
    @functools.wraps(original_init)
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

    @functools.wraps(original_iter)
    def __iter__(self):
        it = original_iter(self)
        try:
            record = getattr(self, "_envdoctor_record", None)
            it._envdoctor_record = record
            if record is not None:
                record.iterating(it)
        except Exception:
            pass
        return it

    loader_cls.__init__, loader_cls.__iter__ = __init__, __iter__
    loader_cls._envdoctor_patched = True
    if iter_cls is not None:
        original_next = iter_cls.__next__

        @functools.wraps(original_next)
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
    """Wrap the DataLoader and torch.set_num_threads now if torch is loaded, else when it is."""
    torch = sys.modules.get("torch")
    if torch is not None:
        _wrap_set_num_threads(torch)
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
        _loaders[:] = [record for record in _loaders if record.alive()]
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
