"""Host-to-device copy bandwidth, pinned against pageable, through the CUDA driver.

Run by envdoctor as `PYTHON -I -S -c SOURCE PARAMS_JSON` in a process of its own
(its own process group, under a timeout), with CUDA_VISIBLE_DEVICES naming the one
idle GPU to measure. It prints one line, MARKER followed by a JSON object, and
nothing else on stdout.

Why the driver and not torch: what the torch.pin_memory check wants to know is
what the hardware gives a copy from page-locked memory against one from ordinary
memory, and what page-locking costs the CPU. torch answers that with the same
driver calls (cudaHostAlloc, cudaMemcpyAsync), but importing torch first costs
1.5-3 s on a GPU node, which made this one measurement most of `envdoctor check`'s
time there. libcuda.so.1 is the driver's own library (the NVIDIA container
toolkit mounts it with the `compute` capability); ctypes is the standard library.
Nothing else is imported.

What it mirrors, step by step (tests/test_gpu_real.py compares the figures with
torch's own on a real GPU):
  context    cuInit, the primary context (what the CUDA runtime uses), the first
             device allocation: the time a job's first CUDA call pays;
  pageable   a synchronous copy from ordinary touched memory (tensor.copy_ from a
             pageable tensor, non_blocking=False);
  pin cost   cuMemHostAlloc plus a copy into it (tensor.pin_memory(), what a
             DataLoader's pin thread does for every batch), CPU and wall time;
  pinned     asynchronous copies from the page-locked buffer on the default
             stream, then one synchronize (non_blocking=True).
Each copy is made once to warm up, then `repeats` times under the clock.

Outcomes in the JSON: the figures; or "unavailable" (no driver library here: the
check skips with it); or errors["measure"] (a CUDA call failed: out of memory, no
such device, a GPU that fell off the bus: the check reports an error with it).
Written for any Python 3 envdoctor runs on; the standard library only.
"""

import ctypes
import json
import os
import sys
import time

MARKER = "ENVDOCTOR-PROBE-RESULT "
GIB = 1024 ** 3
LIBRARY = "libcuda.so.1"

_c_int_p = ctypes.POINTER(ctypes.c_int)
_SIGNATURES = {
    "cuInit": (ctypes.c_uint,),
    "cuDriverGetVersion": (_c_int_p,),
    "cuDeviceGet": (_c_int_p, ctypes.c_int),
    "cuDeviceGetName": (ctypes.c_char_p, ctypes.c_int, ctypes.c_int),
    "cuDevicePrimaryCtxRetain": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_int),
    "cuCtxSetCurrent": (ctypes.c_void_p,),
    "cuCtxSynchronize": (),
    "cuMemAlloc_v2": (ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t),
    "cuMemHostAlloc": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint),
    "cuMemcpyHtoD_v2": (ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t),
    "cuMemcpyHtoDAsync_v2": (ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p),
    "cuGetErrorName": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
}


class CudaError(Exception):
    """A driver call returned something other than CUDA_SUCCESS."""


class Driver:
    """The few libcuda calls the measurement makes, each checked."""

    def __init__(self, lib):
        self._lib = lib
        self._fns = {}
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)  # AttributeError: a library without the call
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
            self._fns[name] = fn

    def _name_of(self, code):
        text = ctypes.c_char_p()
        if self._fns["cuGetErrorName"](code, ctypes.byref(text)) == 0 and text.value:
            return text.value.decode("ascii", "replace")
        return "CUresult %d" % code

    def __call__(self, name, *args):
        code = self._fns[name](*args)
        if code != 0:
            raise CudaError("%s failed: %s (%d)" % (name, self._name_of(code), code))


def _load():
    """The driver, or the reason there is none."""
    try:
        return Driver(ctypes.CDLL(LIBRARY)), None
    except OSError as exc:
        return None, "cannot load %s, the NVIDIA driver's CUDA library: %s" % (LIBRARY, exc)
    except AttributeError as exc:
        return None, "%s lacks a call the measurement needs: %s" % (LIBRARY, exc)


def _open_device(cu, index, out):
    started = time.perf_counter()
    cu("cuInit", 0)
    version = ctypes.c_int()
    cu("cuDriverGetVersion", ctypes.byref(version))
    out["driver_cuda_version"] = "%d.%d" % (version.value // 1000, version.value % 1000 // 10)
    device = ctypes.c_int()
    cu("cuDeviceGet", ctypes.byref(device), index)
    name = ctypes.create_string_buffer(256)
    cu("cuDeviceGetName", name, len(name), device.value)
    out["device"] = {"index": index, "name": name.value.decode("utf-8", "replace")}
    context = ctypes.c_void_p()
    cu("cuDevicePrimaryCtxRetain", ctypes.byref(context), device.value)
    cu("cuCtxSetCurrent", context)
    return started


def _measure(cu, params, out):
    size = int(params.get("size_bytes", 128 * 1024 * 1024))
    repeats = max(1, int(params.get("repeats", 5)))
    started = _open_device(cu, int(params.get("device", 0)), out)
    target = ctypes.c_uint64()
    cu("cuMemAlloc_v2", ctypes.byref(target), size)
    out["context_seconds"] = time.perf_counter() - started
    pageable = (ctypes.c_char * size)()
    ctypes.memset(pageable, 1, size)  # touch every page so the first copy does not pay for page faults
    pageable_at = ctypes.addressof(pageable)

    def copy_rate(source, asynchronous):
        def copy():
            if asynchronous:
                cu("cuMemcpyHtoDAsync_v2", target, source, size, None)
            else:
                cu("cuMemcpyHtoD_v2", target, source, size)

        copy()  # warm-up
        cu("cuCtxSynchronize")
        begin = time.perf_counter()
        for _ in range(repeats):
            copy()
        cu("cuCtxSynchronize")
        return size * repeats / (time.perf_counter() - begin)

    out["pageable_bytes_per_second"] = copy_rate(pageable_at, False)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    pinned = ctypes.c_void_p()
    cu("cuMemHostAlloc", ctypes.byref(pinned), size, 0)  # page-lock a buffer and copy into it
    ctypes.memmove(pinned, pageable_at, size)
    pin_cpu, pin_wall = time.process_time() - cpu0, time.perf_counter() - wall0
    out["pin_cpu_seconds_per_gib"] = pin_cpu * GIB / size
    out["pin_wall_seconds_per_gib"] = pin_wall * GIB / size
    out["pinned_bytes_per_second"] = copy_rate(pinned.value, True)
    out["size_bytes"] = size
    out["repeats"] = repeats


def die_with_parent(parent):
    """Be killed when envdoctor dies, even by SIGKILL (the OOM killer, `timeout -s KILL`,
    a kubelet), when nothing of envdoctor's runs to kill this process group: a hung
    driver call would otherwise hold a CUDA context and pinned memory on the GPU a job
    is about to use, for ever. PR_SET_PDEATHSIG; a parent already gone ends it now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(ctypes.c_int(1), ctypes.c_ulong(9), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    except (OSError, AttributeError):  # not Linux: the process group kill at envdoctor's exit still holds
        return
    if parent and os.getppid() != parent:
        os._exit(0)


def main(argv):
    params = json.loads(argv[1]) if len(argv) > 1 else {}
    die_with_parent(params.get("parent"))
    out = {"mode": "pin_memory", "method": "cuda-driver", "errors": {}}
    started = time.perf_counter()
    cu, reason = _load()
    if cu is None:
        out["unavailable"] = reason
    else:
        try:
            _measure(cu, params, out)
        except CudaError as exc:
            out["errors"]["measure"] = str(exc)
        except MemoryError:
            out["errors"]["measure"] = "MemoryError: no host memory for %s bytes" % params.get("size_bytes")
        except (OverflowError, ValueError, TypeError) as exc:  # bad params
            out["errors"]["measure"] = "%s: %s" % (type(exc).__name__, exc)
    out["probe_seconds"] = time.perf_counter() - started
    sys.stdout.write(MARKER + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    # Skip the interpreter's and the driver's exit handlers (tearing down a context
    # that holds pinned memory): the answer is out, and the kernel frees all of it.
    os._exit(code)
