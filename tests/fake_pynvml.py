"""A fake of the part of pynvml that envdoctor.nvml calls, for tests without a GPU.

It has the same function names and signatures as pynvml, returns the same
shapes (objects with `.total/.free/.used` for memory, `.busId` for PCI info,
`.pid/.usedGpuMemory` for processes, tuples/lists where pynvml returns them),
and raises pynvml's REAL error classes (pynvml.NVMLError_GpuIsLost, ...), which
it also exposes as attributes so the facade finds them on the library object.

Build one and pass it to the facade:

    from fake_pynvml import FakeNvml, FakeDevice   # tests/ is on sys.path under pytest
    fake = FakeNvml(devices=[FakeDevice(), FakeDevice(ecc_uncorrected=3)],
                    driver="550.54.15", cuda=12040)
    nvml = envdoctor.nvml.connect(lib=fake, timeout=0.5)
    # in a check test: Session(nvml_factory=lambda: envdoctor.nvml.connect(lib=fake))

FakeNvml(...) options:
    devices           the GPUs, in NVML index order (FakeDevice each)
    driver, cuda      nvmlSystemGetDriverVersion() and nvmlSystemGetCudaDriverVersion[_v2]() (12040 = CUDA 12.4)
    init_error        an error class nvmlInit raises: pynvml.NVMLError_LibraryNotFound (no driver),
                      NVMLError_DriverNotLoaded, NVMLError_NoPermission, ...
    no_library=True   shorthand for init_error=pynvml.NVMLError_LibraryNotFound
    init_hangs=True   nvmlInit blocks until release()
    system_hangs={"nvmlSystemGetDriverVersion", ...}  those system calls block until release()
    old_driver=True   the newer functions (…_v2, TemperatureV, ClocksEventReasons, memory v2,
                      ComputeRunningProcesses v3) raise FunctionNotFound, as on an old driver

FakeDevice(...) options (all have healthy defaults: an idle H100):
    name, uuid, pci_bus_id, compute_capability, memory_total, memory_used (bytes),
    temperature (C), power_mw (milliwatts), throttle (nvmlClocksEventReasons bit mask),
    ecc_uncorrected (volatile count), ecc_uncorrected_aggregate (field "ecc" covers both),
    retired_pages_pending (bool), remapped_rows=(corrected, uncorrected, pending, failure),
    persistence (0/1), compute_mode (0 default, 3 exclusive process), mig (None: no MIG support,
    False/True: MIG mode), mig_uuids, processes=[(pid, used_bytes or None), ...],
    lost=True                 every call on it raises NVMLError_GpuIsLost
    lost_on="memory"          only from that field on (earlier fields answer)
    hang="memory"             that field's call blocks on an Event until fake.release() ("handle": all)
    unsupported={"ecc", ...}  those fields raise NVMLError_NotSupported
    errors={"power": pynvml.NVMLError_NoPermission}  those fields raise that class

Field names: handle, name, uuid, pci, compute_capability, memory, temperature, power,
throttle, ecc, retired_pages, remapped_rows, persistence, compute_mode, mig_mode,
mig_devices, processes.

`fake.calls` lists (function name, device index) in call order; call
`fake.release()` at the end of a test that hangs, so the blocked threads finish.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

GIB = 1024**3
_serial = itertools.count(1)

# the real classes, exposed as pynvml does
NVMLError = pynvml.NVMLError
NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
_ERROR_NAMES = [n for n in dir(pynvml) if n.startswith("NVMLError_")]


@dataclass
class FakeDevice:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str | None = None  # default: a unique GPU-... string
    pci_bus_id: str | None = None  # default: 00000000:<index+0x18>:00.0
    compute_capability: tuple[int, int] = (9, 0)
    memory_total: int = 80 * GIB
    memory_used: int = 0
    temperature: int = 34
    power_mw: int = 70_000
    throttle: int = 0x1  # gpu_idle
    ecc_uncorrected: int = 0
    ecc_uncorrected_aggregate: int = 0
    retired_pages_pending: bool = False
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    persistence: int = 1
    compute_mode: int = 0
    mig: bool | None = None
    mig_uuids: tuple[str, ...] = ()
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    lost: bool = False
    lost_on: str | None = None
    hang: str | None = None
    unsupported: set[str] = field(default_factory=set)
    errors: dict[str, type] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.uuid is None:
            n = next(_serial)
            self.uuid = f"GPU-{n:08x}-1111-2222-3333-{n:012x}"


class _Handle:
    def __init__(self, index: int, mig: int | None = None):
        self.index = index
        self.mig = mig

    def __repr__(self) -> str:
        return f"<fake nvml handle {self.index}{'' if self.mig is None else f'/mig{self.mig}'}>"


class FakeNvml:
    """A stand-in for the pynvml module (see the module docstring)."""

    def __init__(self, devices: list[FakeDevice] | None = None, driver: str = "550.54.15", cuda: int | None = 12040,
                 init_error: type | None = None, no_library: bool = False, init_hangs: bool = False,
                 old_driver: bool = False, system_hangs: set[str] | frozenset[str] = frozenset()):
        self.devices = list(devices) if devices is not None else [FakeDevice()]
        self.driver = driver
        self.cuda = cuda
        self.init_error = pynvml.NVMLError_LibraryNotFound if no_library else init_error
        self.init_hangs = init_hangs
        self.old_driver = old_driver
        self.system_hangs = set(system_hangs)
        self.calls: list[tuple[str, int | None]] = []
        self.initialised = False
        self._released = threading.Event()
        for name in _ERROR_NAMES:
            setattr(self, name, getattr(pynvml, name))
        self.NVMLError = pynvml.NVMLError
        self.NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError

    def release(self) -> None:
        """Let every blocked call return (end of a hang test)."""
        self._released.set()

    # -- helpers ------------------------------------------------------------------
    def _record(self, fn: str, index: int | None) -> None:
        self.calls.append((fn, index))
        if index is None and fn in self.system_hangs:
            self._released.wait()

    def _dev(self, handle: Any, fn: str, fieldname: str) -> FakeDevice:
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()
        index = handle.index
        self._record(fn, index)
        dev = self.devices[index]
        if dev.hang in (fieldname, "handle"):
            self._released.wait()
        if dev.lost or (dev.lost_on is not None and _FIELDS.index(fieldname) >= _FIELDS.index(dev.lost_on)):
            raise pynvml.NVMLError_GpuIsLost()
        if fieldname in dev.unsupported:
            raise pynvml.NVMLError_NotSupported()
        if fieldname in dev.errors:
            raise dev.errors[fieldname]()
        return dev

    def _new_function(self, fn: str) -> None:
        if self.old_driver:
            self._record(fn, None)
            raise pynvml.NVMLError_FunctionNotFound()

    # -- system -------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._record("nvmlInit", None)
        if self.init_hangs:
            self._released.wait()
        if self.init_error is not None:
            raise self.init_error()
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._record("nvmlSystemGetDriverVersion", None)
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._record("nvmlSystemGetCudaDriverVersion", None)
        if self.cuda is None:
            raise pynvml.NVMLError_NotSupported()
        return self.cuda

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._new_function("nvmlSystemGetCudaDriverVersion_v2")
        return self.nvmlSystemGetCudaDriverVersion()

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialised:
            raise pynvml.NVMLError_Uninitialized()
        self._record("nvmlDeviceGetCount", None)
        return len(self.devices)

    # -- devices ------------------------------------------------------------------
    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self.devices):
            raise pynvml.NVMLError_InvalidArgument()
        self._dev(_Handle(index), "nvmlDeviceGetHandleByIndex", "handle")
        return _Handle(index)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._dev(handle, "nvmlDeviceGetName", "name").name

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        dev = self._dev(handle, "nvmlDeviceGetUUID", "mig_devices" if handle.mig is not None else "uuid")
        if handle.mig is not None:
            return dev.mig_uuids[handle.mig]
        return dev.uuid

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        dev = self._dev(handle, "nvmlDeviceGetPciInfo", "pci")
        bus = dev.pci_bus_id or f"00000000:{0x18 + handle.index:02X}:00.0"
        return SimpleNamespace(busId=bus.encode(), busIdLegacy=bus[4:].encode(), domain=0, bus=0x18 + handle.index, device=0)

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:
        return tuple(self._dev(handle, "nvmlDeviceGetCudaComputeCapability", "compute_capability").compute_capability)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        if version:
            self._new_function("nvmlDeviceGetMemoryInfo_v2")
        dev = self._dev(handle, "nvmlDeviceGetMemoryInfo", "memory")
        reserved = 0 if version else 512 * 1024**2  # v1 counts the driver's reservation as used
        used = min(dev.memory_total, dev.memory_used + reserved)
        return SimpleNamespace(total=dev.memory_total, used=used, free=dev.memory_total - used)

    def nvmlDeviceGetTemperatureV(self, handle: _Handle, sensor: int) -> int:
        self._new_function("nvmlDeviceGetTemperatureV")
        return self._dev(handle, "nvmlDeviceGetTemperatureV", "temperature").temperature

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        return self._dev(handle, "nvmlDeviceGetTemperature", "temperature").temperature

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self._dev(handle, "nvmlDeviceGetPowerUsage", "power").power_mw

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        self._new_function("nvmlDeviceGetCurrentClocksEventReasons")
        return self._dev(handle, "nvmlDeviceGetCurrentClocksEventReasons", "throttle").throttle

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrentClocksThrottleReasons", "throttle").throttle

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, errorType: int, counterType: int) -> int:
        dev = self._dev(handle, "nvmlDeviceGetTotalEccErrors", "ecc")
        return dev.ecc_uncorrected if counterType == 0 else max(dev.ecc_uncorrected_aggregate, dev.ecc_uncorrected)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:
        return int(self._dev(handle, "nvmlDeviceGetRetiredPagesPendingStatus", "retired_pages").retired_pages_pending)

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        return tuple(self._dev(handle, "nvmlDeviceGetRemappedRows", "remapped_rows").remapped_rows)

    def nvmlDeviceGetPersistenceMode(self, handle: _Handle) -> int:
        return self._dev(handle, "nvmlDeviceGetPersistenceMode", "persistence").persistence

    def nvmlDeviceGetComputeMode(self, handle: _Handle) -> int:
        return self._dev(handle, "nvmlDeviceGetComputeMode", "compute_mode").compute_mode

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        dev = self._dev(handle, "nvmlDeviceGetMigMode", "mig_mode")
        if dev.mig is None:
            raise pynvml.NVMLError_NotSupported()
        return [int(dev.mig), int(dev.mig)]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._dev(handle, "nvmlDeviceGetMaxMigDeviceCount", "mig_devices")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        dev = self._dev(handle, "nvmlDeviceGetMigDeviceHandleByIndex", "mig_devices")
        if index >= len(dev.mig_uuids):
            raise pynvml.NVMLError_NotFound()
        return _Handle(handle.index, mig=index)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        if self.old_driver:
            self._record("nvmlDeviceGetComputeRunningProcesses", None)
            raise pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")
        return self.nvmlDeviceGetComputeRunningProcesses_v2(handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: _Handle) -> list[Any]:
        dev = self._dev(handle, "nvmlDeviceGetComputeRunningProcesses", "processes")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for pid, used in dev.processes]


_FIELDS = ["handle", "name", "uuid", "pci", "compute_capability", "memory", "temperature", "power", "throttle",
           "ecc", "retired_pages", "remapped_rows", "persistence", "compute_mode", "mig_mode", "mig_devices", "processes"]
