"""NVML behind one module: the only place envdoctor talks to the NVIDIA driver.

Why a facade rather than pynvml everywhere:

* Importing this module never needs a driver; `connect()` initialises NVML on
  first use, once per process, under a lock. No driver, no library, no
  permission: `connect()` raises `Unavailable` with a hint a person can act on,
  and the checks that need NVML are skipped with that reason.
* One helper maps every NVML error to a meaning: "not supported" is simply an
  absent field (None); a missing library or unloaded driver is `Unavailable`;
  "GPU is lost" marks that one device lost (it fell off the bus) while the other
  devices are still read; anything else is recorded as that field's error.
* Every NVML call is bounded in time. A GPU that fell off the bus can make NVML
  calls block for minutes, and a monitor must not hang with it. Each device is
  read in its own daemon thread and the caller waits only until a deadline; a
  device that has not answered by then is reported as timed out, with the call
  it was stuck in, and is not queried again while that call is still stuck, so
  threads never pile up (at most one stuck thread per device and per system
  call, for the life of the process).
* One snapshot (`Nvml.devices()`) reads each device once; the checks that share a
  run share the snapshot for `max_age` seconds.

Tests pass a fake library (tests/fake_pynvml.py) as `connect(lib=...)`: the
facade only calls the pynvml functions listed in that fake, and takes its error
classes from the library object, so the fake raises pynvml's real classes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import namedtuple

from envdoctor.errors import Unavailable
from envdoctor.record import Record
from envdoctor.watchdog import RAISED, STUCK, TIMED_OUT, Pending, default_watchdog

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable

DEFAULT_TIMEOUT = 5.0  # seconds one device (or one system call) may take to answer

# NVML ABI constants (stable numbers from nvml.h). Kept here rather than read from
# the library object so a fake library need not define them.
_TEMPERATURE_GPU = 0
_MEMORY_ERROR_UNCORRECTED = 1
_VOLATILE_ECC = 0
_AGGREGATE_ECC = 1
_FEATURE_ENABLED = 1
_MIG_ENABLE = 1
_MEMORY_V2 = 0x02000028  # nvmlMemory_v2: `used` excludes memory the driver reserves

COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}

# nvmlClocksEventReasons bits (formerly "throttle reasons"), as snake_case names.
THROTTLE_REASONS = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

NO_DRIVER_REASON = "no NVIDIA driver here (libnvidia-ml.so.1 not found)"
NO_DRIVER_HINT = (
    "on a GPU host install the NVIDIA driver; in a container run it with `docker run --gpus all` "
    "(NVIDIA Container Toolkit) or request nvidia.com/gpu in Kubernetes so the driver's libraries are mounted"
)
NVML_LIBRARY = "libnvidia-ml.so.1"  # the name pynvml loads on Linux


class GpuUse(namedtuple("GpuUse", (
    "index", "mig_mode", "memory_total_bytes", "memory_free_bytes",
    "processes",  # ((pid, used bytes or None), ...)
))):
    """Who uses one GPU's memory, and how much is left: what serve asks of every device
    once per process it examines. Immutable, so one is shared by every caller of a
    snapshot, where `devices()` copies every device's whole record for each caller."""

    __slots__ = ()


class NvmlHung(Unavailable):
    """NVML did not answer within the timeout: the driver or a GPU is hung."""


class GpuInfo(Record):
    """One device as NVML reported it at one moment. None means "not available"
    (NVML said not supported, or the query failed: see `errors`)."""

    def __init__(
        self,
        index: int,
        name: str | None = None,
        uuid: str | None = None,
        pci_bus_id: str | None = None,
        compute_capability: tuple[int, int] | None = None,
        memory_total_bytes: int | None = None,
        memory_used_bytes: int | None = None,
        memory_free_bytes: int | None = None,
        temperature_c: int | None = None,
        power_watts: float | None = None,
        throttle_reasons: list[str] | None = None,
        throttle_reasons_mask: int | None = None,
        ecc_uncorrected: int | None = None,  # volatile: since the driver last loaded
        ecc_uncorrected_aggregate: int | None = None,  # lifetime of the board
        retired_pages_pending: bool | None = None,
        remapped_rows_pending: bool | None = None,
        remapped_rows_failure: bool | None = None,
        remapped_rows_uncorrectable: int | None = None,
        persistence_mode: bool | None = None,
        compute_mode: str | None = None,
        mig_mode: bool | None = None,  # current MIG mode; None when the GPU has no MIG
        mig_devices: list[str] | None = None,  # MIG-... UUIDs when in MIG mode
        processes: list[tuple[int, int | None]] | None = None,  # (pid, used bytes)
        lost: bool = False,  # NVML says the GPU is lost ("fallen off the bus")
        timed_out: bool = False,  # a query did not return within the timeout
        errors: dict[str, str] | None = None,  # field -> why it is missing
        unsupported: list[str] | None = None,  # fields NVML does not support here
    ) -> None:
        self.index = index
        self.name = name
        self.uuid = uuid
        self.pci_bus_id = pci_bus_id
        self.compute_capability = compute_capability
        self.memory_total_bytes = memory_total_bytes
        self.memory_used_bytes = memory_used_bytes
        self.memory_free_bytes = memory_free_bytes
        self.temperature_c = temperature_c
        self.power_watts = power_watts
        self.throttle_reasons = [] if throttle_reasons is None else throttle_reasons
        self.throttle_reasons_mask = throttle_reasons_mask
        self.ecc_uncorrected = ecc_uncorrected
        self.ecc_uncorrected_aggregate = ecc_uncorrected_aggregate
        self.retired_pages_pending = retired_pages_pending
        self.remapped_rows_pending = remapped_rows_pending
        self.remapped_rows_failure = remapped_rows_failure
        self.remapped_rows_uncorrectable = remapped_rows_uncorrectable
        self.persistence_mode = persistence_mode
        self.compute_mode = compute_mode
        self.mig_mode = mig_mode
        self.mig_devices = [] if mig_devices is None else mig_devices
        self.processes = [] if processes is None else processes
        self.lost = lost
        self.timed_out = timed_out
        self.errors = {} if errors is None else errors
        self.unsupported = [] if unsupported is None else unsupported

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (lists, not tuples; processes as objects)."""
        d = _deepcopy(dict(vars(self)))
        d["compute_capability"] = list(self.compute_capability) if self.compute_capability else None
        d["processes"] = [{"pid": pid, "used_memory_bytes": used} for pid, used in self.processes]
        return d


# -- bounded calls --------------------------------------------------------------------


class _TimedOut(Exception):
    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def _bounded(state: "_Library", key: str, fn: Callable[[], Any], timeout: float) -> Any:
    """fn() on the watchdog under (library, key); raise _TimedOut when it is or stays stuck."""
    outcome = default_watchdog().call((id(state.lib), key), fn, timeout)
    if outcome.kind in (TIMED_OUT, STUCK):
        raise _TimedOut(key)
    return outcome.unwrap()


# -- process-wide library state -------------------------------------------------------


class _Library:
    """What is shared by every connect() on one library object: whether it is
    initialised, and the identity of each GPU last read (for hung devices).
    Which calls are stuck is the watchdog's to know (keys (id(lib), what))."""

    def __init__(self, lib: Any):
        self.lib = lib
        self.lock = threading.Lock()
        self.initialised = False
        self.identity: dict[int, dict[str, Any]] = {}  # index -> name/uuid/pci last read, for hung devices

    def stuck_since(self, key: str) -> float | None:
        """When the call under `key` got stuck (time.time()), if it is still stuck."""
        stuck = default_watchdog().stuck()
        if (id(self.lib), key) not in stuck:
            return None
        return stuck[(id(self.lib), key)] or time.time()


_LIBRARIES: dict[int, _Library] = {}
_LIBRARIES_LOCK = threading.Lock()


def _library(lib: Any) -> _Library:
    with _LIBRARIES_LOCK:
        state = _LIBRARIES.get(id(lib))
        if state is None or state.lib is not lib:
            state = _Library(lib)
            _LIBRARIES[id(lib)] = state
        return state


def _error_class(lib: Any, name: str) -> type[BaseException]:
    """An NVML error class from the library; a class nothing raises when it lacks one."""
    cls = getattr(lib, name, None)
    if isinstance(cls, type) and issubclass(cls, BaseException):
        return cls
    return type(f"_Absent{name}", (Exception,), {})


def _init_failure(lib: Any, exc: BaseException) -> Unavailable:
    """Turn an nvmlInit failure into a skip reason with a hint."""
    e = lambda name: _error_class(lib, name)  # noqa: E731
    if isinstance(exc, e("NVMLError_LibraryNotFound")):
        return Unavailable(NO_DRIVER_REASON, NO_DRIVER_HINT)
    if isinstance(exc, e("NVMLError_DriverNotLoaded")):
        return Unavailable(
            "the NVIDIA kernel driver is not loaded (NVML library present, driver absent): "
            "check `nvidia-smi`, `lsmod | grep nvidia` and `dmesg | grep -i nvrm`"
        )
    if isinstance(exc, e("NVMLError_NoPermission")):
        return Unavailable(
            "permission denied opening the NVIDIA devices (/dev/nvidia*): run as a user allowed to use "
            "the GPUs, or give the container the devices (`docker run --gpus all`)"
        )
    if isinstance(exc, e("NVMLError_LibRmVersionMismatch")):
        return Unavailable(
            "the NVML library and the loaded kernel driver are different versions (driver upgraded "
            "without a reboot?): reboot the node or reload the nvidia kernel modules"
        )
    if isinstance(exc, e("NVMLError")):
        return Unavailable(f"NVML failed to initialise: {exc}")
    return Unavailable(f"NVML failed to initialise: {type(exc).__name__}: {exc}")


BROKEN_LIBRARY_HINT = (
    "reinstall the NVIDIA driver (its user-space libraries must match the kernel module), or fix the "
    "file the loader finds: ldconfig -p | grep libnvidia-ml"
)


def _deepcopy(value: Any) -> Any:
    """copy.deepcopy, imported when first needed: without a GPU nothing is ever copied,
    and the import was paid by every start."""
    from copy import deepcopy

    return deepcopy(value)


def _copy_info(info: GpuInfo) -> GpuInfo:
    """A copy a caller may change without changing the shared snapshot: a GpuInfo's only
    mutable parts are its lists and its dict, one level down, and they hold str, int and
    tuples (tests/test_nvml.py holds every field to that). copy.deepcopy took 18 us a
    device, asked by two checks for every torch process a serve run examines; this 2 us."""
    twin = GpuInfo.__new__(GpuInfo)
    vars(twin).update({k: v.copy() if type(v) in (list, dict) else v for k, v in vars(info).items()})
    return twin


def _driver_library_loads() -> bool:
    """Whether the driver's NVML library can be loaded, asked the way pynvml asks.

    On a machine without a driver this answers in about a millisecond, where
    importing pynvml only to hear LibraryNotFound costs ~20 ms of every start.
    A library that is there but does not load (a file too short to be one, the wrong
    architecture, a missing dependency) is not "no driver": it raises
    Unavailable with the loader's own reason. (A file cut off inside its code
    kills the process in the loader, SIGBUS, as it would kill any job that loads it.)

    Asked through _ctypes.dlopen, what ctypes.CDLL(NVML_LIBRARY) calls with the same
    mode and message: the ctypes package around it costs ~3 ms to import, and on a
    machine without a driver nothing else needs it.
    """
    try:
        from _ctypes import dlopen
    except ImportError:  # an interpreter whose ctypes is laid out otherwise
        from ctypes import CDLL

        def dlopen(name: str, mode: int) -> Any:
            return CDLL(name, mode)

    try:
        dlopen(NVML_LIBRARY, os.RTLD_LOCAL)  # ctypes' DEFAULT_MODE; RTLD_NOW is added below it, as for CDLL
    except OSError as exc:
        reason = str(exc)
        if _library_absent(reason):
            return False
        raise Unavailable(f"the NVIDIA driver's {NVML_LIBRARY} failed to load: {reason}", BROKEN_LIBRARY_HINT) from None
    return True


def _library_absent(reason: str) -> bool:
    """The loader's message for "no such library anywhere on its path" (as opposed to
    found but unloadable: "invalid ELF header", "file too short", "wrong ELF class",
    "undefined symbol", or a dependency that is missing, named in the message)."""
    return reason.startswith(f"{NVML_LIBRARY}: cannot open shared object file")


def connect(lib: Any = None, timeout: float = DEFAULT_TIMEOUT) -> "Nvml":
    """Initialise NVML (once per process and library) and return the facade.

    Raises Unavailable, with a hint, when NVML cannot be used here. When
    nvmlInit itself hangs, a facade is still returned, with `hung` set: every
    query on it raises NvmlHung (an Unavailable), and gpu.health reports the hang.
    """
    if lib is None:
        if sys.platform.startswith("linux") and not _driver_library_loads():
            raise Unavailable(NO_DRIVER_REASON, NO_DRIVER_HINT)
        try:
            import pynvml as lib  # the nvidia-ml-py package; needs no driver to import
        except ImportError as exc:
            raise Unavailable(f"the nvidia-ml-py package is not installed ({exc}): pip install nvidia-ml-py") from None
    state = _library(lib)
    nvml = Nvml(lib, state, timeout)
    with state.lock:
        if state.initialised:
            return nvml
        since = state.stuck_since("init")
        if since is not None:
            nvml.hung = f"nvmlInit has not returned for {time.time() - since:.0f} s: the NVIDIA driver is hung"
            return nvml
        try:
            _bounded(state, "init", lib.nvmlInit, timeout)
        except _TimedOut:
            nvml.hung = f"nvmlInit did not return within {timeout:g} s: the NVIDIA driver is hung"
            return nvml
        except Exception as exc:
            raise _init_failure(lib, exc) from None
        state.initialised = True
    return nvml


# -- the facade -----------------------------------------------------------------------


class _Abandoned(Exception):
    """The caller gave up waiting on this device: stop querying it."""


class _DeviceLost(Exception):
    """NVML said the GPU is lost: stop querying it."""


class _Record:
    """A device being read by its worker thread; the caller may snapshot it at any time."""

    def __init__(self, index: int):
        self.info = GpuInfo(index=index)
        self.lock = threading.Lock()
        self.current: str | None = None  # the field being queried now
        self.abandoned = False
        self.fatal: Unavailable | None = None  # the whole library went away mid-read

    def set(self, **values: Any) -> None:
        with self.lock:
            if self.abandoned:
                raise _Abandoned()
            for key, value in values.items():
                setattr(self.info, key, value)

    def note_error(self, name: str, reason: str) -> None:
        with self.lock:
            if not self.abandoned:
                self.info.errors[name] = reason

    def note_unsupported(self, name: str) -> None:
        with self.lock:
            if not self.abandoned:
                self.info.unsupported.append(name)

    def snapshot(self) -> GpuInfo:
        with self.lock:
            return _deepcopy(self.info)


class Nvml:
    """The NVML facade one run uses. Build it with connect()."""

    def __init__(self, lib: Any, state: _Library, timeout: float = DEFAULT_TIMEOUT):
        self._lib = lib
        self._state = state
        self.timeout = timeout
        self.hung: str | None = None  # set when nvmlInit hung: nothing can be queried
        self._snapshot: tuple[float, list[GpuInfo]] | None = None
        self._use: tuple[GpuUse, ...] | None = None  # gpu_use() of the current snapshot
        self._answers: dict[str, Any] = {}  # the driver's versions, asked once (a failure is not kept)
        self._snapshot_lock = threading.Lock()
        e = lambda name: _error_class(lib, name)  # noqa: E731
        self._NVMLError = e("NVMLError")
        self._NotSupported = e("NVMLError_NotSupported")
        self._FunctionNotFound = e("NVMLError_FunctionNotFound")
        self._Mismatch = e("NVMLLibraryMismatchError")
        self._VersionMismatch = e("NVMLError_ArgumentVersionMismatch")
        self._GpuIsLost = e("NVMLError_GpuIsLost")
        self._NotFound = e("NVMLError_NotFound")
        self._NoPermission = e("NVMLError_NoPermission")
        self._Gone = (e("NVMLError_LibraryNotFound"), e("NVMLError_DriverNotLoaded"), e("NVMLError_Uninitialized"))

    # -- system-level queries ---------------------------------------------------------
    def _system(self, key: str, *fns: Callable[..., Any], unsupported_ok: bool = False) -> Any:
        """One bounded system-level call; every failure becomes Unavailable.

        With several functions, a later one is tried when the driver lacks the
        earlier (newer) one. With unsupported_ok, "not supported" returns None.
        """
        if self.hung:
            raise NvmlHung(self.hung)
        since = self._state.stuck_since(key)
        if since is not None:
            raise NvmlHung(f"NVML {key} has not returned for {time.time() - since:.0f} s: the NVIDIA driver is hung")
        for i, fn in enumerate(fns):
            try:
                return _bounded(self._state, key, fn, self.timeout)
            except _TimedOut:
                raise NvmlHung(f"NVML {key} did not return within {self.timeout:g} s: the NVIDIA driver is hung") from None
            except (self._FunctionNotFound, self._Mismatch, AttributeError) as exc:
                if i + 1 < len(fns):
                    continue
                if unsupported_ok:
                    return None
                raise Unavailable(f"NVML {key} is not available with this driver: {exc}") from None
            except self._NotSupported as exc:
                if unsupported_ok:
                    return None
                raise Unavailable(f"NVML {key} is not supported here: {exc}") from None
            except self._Gone as exc:
                raise Unavailable(f"NVML went away during the run ({exc})", NO_DRIVER_HINT) from None
            except self._NVMLError as exc:
                raise Unavailable(f"NVML {key} failed: {exc}") from None
        raise AssertionError("unreachable")

    def driver_version(self) -> str:
        """The kernel driver's version, e.g. "550.54.15". Asked once per facade (a serve run
        asks for every torch process): the driver cannot change while NVML holds it open."""
        if "driver_version" not in self._answers:
            value = self._system("driver_version", lambda: self._lib.nvmlSystemGetDriverVersion())
            self._answers["driver_version"] = _text(value) or ""
        return self._answers["driver_version"]

    def cuda_driver_version(self) -> tuple[int, int] | None:
        """The newest CUDA version the driver supports, e.g. (12, 4); None when NVML cannot say.
        Asked once per facade, as driver_version."""
        if "cuda_driver_version" not in self._answers:
            lib = self._lib
            raw = self._system("cuda_driver_version", lambda: lib.nvmlSystemGetCudaDriverVersion_v2(),
                               lambda: lib.nvmlSystemGetCudaDriverVersion(), unsupported_ok=True)
            ok = isinstance(raw, int) and raw > 0
            self._answers["cuda_driver_version"] = (raw // 1000, (raw % 1000) // 10) if ok else None
        return self._answers["cuda_driver_version"]

    def device_count(self) -> int:
        return int(self._system("device_count", lambda: self._lib.nvmlDeviceGetCount()))

    # -- per-device snapshot ----------------------------------------------------------
    def devices(self, max_age: float = 1.0) -> list[GpuInfo]:
        """One snapshot per device, each read once, all read in parallel, within the timeout.

        A snapshot younger than `max_age` seconds is shared (several checks of one
        run ask); pass 0 for a fresh read. A device that did not answer in time
        comes back with `timed_out` set and what was read before it stuck.
        """
        with self._snapshot_lock:
            return [_copy_info(info) for info in self._current(max_age)]

    def gpu_use(self, max_age: float = 1.0) -> tuple[GpuUse, ...]:
        """Each device's processes and free memory, from the same snapshot as `devices()`,
        shared as it is: serve asks once per process it examines, and copying 8 GPUs'
        records for each of 64 processes cost ~10 ms a run (148 against ~1 us a call)."""
        with self._snapshot_lock:
            infos = self._current(max_age)
            if self._use is None:
                self._use = tuple(GpuUse(g.index, g.mig_mode, g.memory_total_bytes, g.memory_free_bytes,
                                         tuple((pid, used) for pid, used in g.processes)) for g in infos)
            return self._use

    def _current(self, max_age: float) -> list[GpuInfo]:
        """The snapshot, read again when older than `max_age` seconds; under _snapshot_lock."""
        if self._snapshot is None or time.monotonic() - self._snapshot[0] > max_age:
            infos = self._read_devices()
            self._snapshot, self._use = (time.monotonic(), infos), None
        return self._snapshot[1]

    def _read_devices(self) -> list[GpuInfo]:
        count = self.device_count()
        records: list[_Record] = []
        calls: list[Pending | None] = []
        watchdog = default_watchdog()
        for index in range(count):
            record = _Record(index)
            records.append(record)
            since = self._state.stuck_since(f"device{index}")
            if since is not None:
                for key, value in self._state.identity.get(index, {}).items():
                    setattr(record.info, key, value)
                record.info.timed_out = True
                record.info.errors["device"] = (
                    f"not queried: an earlier NVML call on this GPU has not returned for {time.time() - since:.1f} s"
                )
                calls.append(None)
                continue
            calls.append(watchdog.start((id(self._lib), f"device{index}"), lambda record=record: self._read_one(record)))
        deadline = time.monotonic() + self.timeout
        out: list[GpuInfo] = []
        for record, call in zip(records, calls):
            if call is not None:
                outcome = call.wait(deadline)
                if outcome.kind in (TIMED_OUT, STUCK):
                    with record.lock:
                        record.abandoned = True
                        stuck_in = record.current or "device"
                        record.info.timed_out = True
                        record.info.errors[stuck_in] = f"timed out: no answer within {self.timeout:g} s"
                elif outcome.kind == RAISED and record.fatal is None and not isinstance(outcome.error, _Abandoned):
                    record.fatal = outcome.error
            if record.fatal is not None:
                raise record.fatal
            info = record.snapshot()
            if info.lost and info.uuid is None:  # lost before it could be named: use what we last saw
                for key, value in self._state.identity.get(info.index, {}).items():
                    setattr(info, key, value)
            if info.uuid is not None and not info.lost:
                self._state.identity[info.index] = {"name": info.name, "uuid": info.uuid, "pci_bus_id": info.pci_bus_id}
            out.append(info)
        return out

    def _query(self, record: _Record, name: str, fn: Callable[..., Any], *args: Any, quiet: tuple = ()) -> Any:
        """One NVML call for one device field, with each error mapped to its meaning."""
        with record.lock:
            if record.abandoned:
                raise _Abandoned()
            record.current = name
        try:
            return fn(*args)
        except quiet:
            return None
        except self._NotSupported:
            record.note_unsupported(name)
            return None
        except (self._FunctionNotFound, self._Mismatch):
            record.note_unsupported(name)  # this driver is too old to have the call
            return None
        except self._GpuIsLost:
            with record.lock:
                if not record.abandoned:
                    record.info.lost = True
                    record.info.errors[name] = "GPU is lost"
            raise _DeviceLost() from None
        except self._Gone as exc:
            record.fatal = Unavailable(f"NVML went away during the run ({exc})", NO_DRIVER_HINT)
            raise _DeviceLost() from None
        except self._NoPermission as exc:
            record.note_error(name, f"no permission: {exc}")
            return None
        except self._NVMLError as exc:
            record.note_error(name, str(exc))
            return None
        except Exception as exc:  # a bug in the binding or a ctypes surprise: keep the others going
            record.note_error(name, f"{type(exc).__name__}: {exc}")
            return None

    def _read_one(self, record: _Record) -> None:
        try:
            self._read_fields(record)
        except (_Abandoned, _DeviceLost):
            pass
        finally:
            with record.lock:
                record.current = None

    def _fallback(self, new: str, old: str) -> Callable[..., Any]:
        """Call the newer NVML function, or the older one on drivers that lack it."""
        lib = self._lib

        def call(*args: Any) -> Any:
            fn = getattr(lib, new, None)
            if fn is not None:
                try:
                    return fn(*args)
                except (self._FunctionNotFound, self._Mismatch):
                    pass
            return getattr(lib, old)(*args)

        return call

    def _read_fields(self, record: _Record) -> None:
        lib = self._lib
        q = lambda name, fn, *args, **kw: self._query(record, name, fn, *args, **kw)  # noqa: E731
        handle = q("handle", lib.nvmlDeviceGetHandleByIndex, record.info.index)
        if handle is None:
            return

        name = q("name", lib.nvmlDeviceGetName, handle)
        uuid = q("uuid", lib.nvmlDeviceGetUUID, handle)
        record.set(name=_text(name), uuid=_text(uuid))

        pci = q("pci", lib.nvmlDeviceGetPciInfo, handle)
        if pci is not None:
            record.set(pci_bus_id=_text(getattr(pci, "busId", None)))
        cc = q("compute_capability", lib.nvmlDeviceGetCudaComputeCapability, handle)
        if cc is not None:
            record.set(compute_capability=(int(cc[0]), int(cc[1])))

        memory = q("memory", self._memory_info, handle)
        if memory is not None:
            record.set(memory_total_bytes=int(memory.total), memory_used_bytes=int(memory.used), memory_free_bytes=int(memory.free))

        temperature = q("temperature", self._fallback("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"), handle, _TEMPERATURE_GPU)
        if temperature is not None:
            record.set(temperature_c=int(temperature))
        milliwatts = q("power", lib.nvmlDeviceGetPowerUsage, handle)
        if milliwatts is not None:
            record.set(power_watts=int(milliwatts) / 1000.0)
        mask = q("throttle", self._fallback("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), handle)
        if mask is not None:
            mask = int(mask)
            record.set(throttle_reasons_mask=mask, throttle_reasons=[n for bit, n in THROTTLE_REASONS.items() if mask & bit])

        ecc = q("ecc", lib.nvmlDeviceGetTotalEccErrors, handle, _MEMORY_ERROR_UNCORRECTED, _VOLATILE_ECC)
        if ecc is not None:
            record.set(ecc_uncorrected=int(ecc))
        ecc_total = q("ecc_aggregate", lib.nvmlDeviceGetTotalEccErrors, handle, _MEMORY_ERROR_UNCORRECTED, _AGGREGATE_ECC)
        if ecc_total is not None:
            record.set(ecc_uncorrected_aggregate=int(ecc_total))
        pending = q("retired_pages", lib.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        if pending is not None:
            record.set(retired_pages_pending=int(pending) == _FEATURE_ENABLED)
        rows = q("remapped_rows", lib.nvmlDeviceGetRemappedRows, handle)
        if rows is not None:
            _corrected, uncorrected, row_pending, row_failure = rows
            record.set(remapped_rows_uncorrectable=int(uncorrected), remapped_rows_pending=bool(row_pending),
                       remapped_rows_failure=bool(row_failure))

        persistence = q("persistence", lib.nvmlDeviceGetPersistenceMode, handle)
        if persistence is not None:
            record.set(persistence_mode=int(persistence) == _FEATURE_ENABLED)
        mode = q("compute_mode", lib.nvmlDeviceGetComputeMode, handle)
        if mode is not None:
            record.set(compute_mode=COMPUTE_MODES.get(int(mode), f"unknown({int(mode)})"))

        mig = q("mig_mode", lib.nvmlDeviceGetMigMode, handle)
        if mig is not None:
            enabled = int(mig[0]) == _MIG_ENABLE
            record.set(mig_mode=enabled)
            if enabled:
                record.set(mig_devices=self._mig_uuids(record, handle))

        procs = q("processes", self._processes, handle)
        if procs is not None:
            record.set(processes=procs)

    def _memory_info(self, handle: Any) -> Any:
        try:
            return self._lib.nvmlDeviceGetMemoryInfo(handle, _MEMORY_V2)
        except (self._FunctionNotFound, self._VersionMismatch, self._Mismatch, TypeError):
            return self._lib.nvmlDeviceGetMemoryInfo(handle)  # older driver: `used` includes reserved memory

    def _processes(self, handle: Any) -> list[tuple[int, int | None]]:
        lib = self._lib
        try:
            procs = lib.nvmlDeviceGetComputeRunningProcesses(handle)
        except (self._Mismatch, self._FunctionNotFound):
            procs = lib.nvmlDeviceGetComputeRunningProcesses_v2(handle)
        out = []
        for p in procs or []:
            used = getattr(p, "usedGpuMemory", None)
            out.append((int(p.pid), None if used is None else int(used)))
        return out

    def _mig_uuids(self, record: _Record, handle: Any) -> list[str]:
        lib = self._lib
        count = self._query(record, "mig_devices", lib.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        uuids = []
        for i in range(int(count)):
            mig = self._query(record, "mig_devices", lib.nvmlDeviceGetMigDeviceHandleByIndex, handle, i, quiet=(self._NotFound,))
            if mig is None:
                continue  # an empty MIG slot
            uuid = _text(self._query(record, "mig_devices", lib.nvmlDeviceGetUUID, mig))
            if uuid:
                uuids.append(uuid)
        return uuids


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").rstrip("\0")
    return str(value)
