"""The torch probe script: runs INSIDE the target interpreter, never in envdoctor's process.

envdoctor passes this file's source to `python -c`, so it must run on whatever
Python the target has: standard library plus torch only, no envdoctor imports,
nothing newer than Python 3.8 syntax. It prints one line,
`ENVDOCTOR-PROBE-RESULT <json>`, on its standard output; anything else torch or a
sitecustomize prints goes around it and is ignored (the parent reads the last
marked line).

Modes (argv[1]):

  facts       (default) what torch was built with and its process-wide defaults.
              Creates NO CUDA context: torch.cuda.is_available() calls
              cudaGetDeviceCount, which runs cuInit (driver initialisation, no
              context, no GPU memory); torch.cuda.device_count() asks NVML first.
              Device capabilities are NOT read here, because
              torch.cuda.get_device_capability() initialises torch's CUDA state
              (torch.cuda._lazy_init) and creates the primary context on the
              device (hundreds of MiB of GPU memory): envdoctor reads
              capabilities from NVML in its own process instead.

The pin_memory bandwidth measurement, the one probe that creates a context, does
not import torch: copy_probe.py makes the same driver calls through libcuda.
"""

import json
import os
import platform
import sys
import time
import warnings

MARKER = "ENVDOCTOR-PROBE-RESULT "
PROBE_VERSION = 1

_real_stdout = sys.stdout


def _emit(obj):
    _real_stdout.write("\n" + MARKER + json.dumps(obj, sort_keys=True, default=str) + "\n")
    _real_stdout.flush()


def _site_dirs():
    """Directories whose contents decide what `import torch` finds, present or not."""
    dirs = []
    try:
        import site

        dirs.extend(site.getsitepackages())
        if site.ENABLE_USER_SITE is not False:
            dirs.append(site.getusersitepackages())
    except Exception:  # some embedded or frozen interpreters lack parts of site
        pass
    return dirs


def _base_facts(mode):
    return {
        "probe_version": PROBE_VERSION,
        "mode": mode,
        "python": sys.executable,
        "python_version": platform.python_version(),
        "sys_path": [p for p in sys.path if p],
        "site_dirs": _site_dirs(),
    }


def _stamp_files(torch_dir):
    """Files whose change means a different torch: its version file and its RECORD."""
    files = [os.path.join(torch_dir, "__init__.py"), os.path.join(torch_dir, "version.py")]
    parent = os.path.dirname(torch_dir)
    try:
        for name in sorted(os.listdir(parent)):
            if name.startswith("torch-") and name.endswith(".dist-info"):
                files.append(os.path.join(parent, name, "RECORD"))
    except OSError:
        pass
    return [f for f in files if os.path.exists(f)]


def _onnx_default_opset(torch_dir, names=("ONNX_DEFAULT_OPSET", "onnx_default_opset")):
    """torch.onnx's default export opset (or, with names=("ONNX_MAX_OPSET",), the newest it
    can write), read from torch/onnx/_constants.py without importing torch.onnx (which
    pulls in much more than the one number)."""
    import ast

    path = os.path.join(torch_dir, "onnx", "_constants.py")
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Constant) and isinstance(value.value, int):
                found[node.targets[0].id] = value.value
    # ONNX_DEFAULT_OPSET is what torch.onnx.export uses when no opset_version is given
    # (torch 1.x .. 2.13 keep it in torch/onnx/_constants.py).
    for name in names:
        if name in found:
            return found[name]
    return None


def _try(errors, name, fn, default=None):
    """One fact; a failure is recorded by name instead of ending the probe."""
    try:
        return fn()
    except Exception as exc:  # a broken cuDNN or driver must not hide the other facts
        errors[name] = "%s: %s" % (type(exc).__name__, exc)
        return default


def _torch_facts(torch, out):
    errors = {}
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    out["torch_version"] = str(torch.__version__)
    out["torch_dir"] = torch_dir
    out["stamp_files"] = _stamp_files(torch_dir)
    version = getattr(torch, "version", None)
    out["torch_cuda_version"] = getattr(version, "cuda", None)
    out["torch_hip_version"] = getattr(version, "hip", None)
    out["git_version"] = getattr(version, "git_version", None)
    cuda = torch.cuda
    compiled = _try(errors, "cuda_compiled", lambda: bool(cuda._is_compiled()), out["torch_cuda_version"] is not None)
    out["cuda_compiled"] = compiled
    out["arch_list"] = _try(errors, "arch_list", lambda: list(cuda.get_arch_list()), [])
    # is_available() runs cudaGetDeviceCount -> cuInit: the driver is loaded and
    # checked (a driver too old for this build shows up here, as a warning), but
    # no context is created. A child process costs the job nothing.
    out["cuda_available"] = _try(errors, "cuda_available", lambda: bool(cuda.is_available()), False)
    out["device_count"] = _try(errors, "device_count", lambda: int(cuda.device_count()), 0)
    out["cuda_initialized"] = _try(errors, "cuda_initialized", lambda: bool(cuda.is_initialized()), False)
    cudnn = torch.backends.cudnn
    out["cudnn_available"] = _try(errors, "cudnn_available", lambda: bool(cudnn.is_available()), False)
    out["cudnn_version"] = None
    if out["cudnn_available"]:
        # Loads libcudnn and compares its version with the one torch was built
        # with; a mismatch raises, and that message is the finding.
        out["cudnn_version"] = _try(errors, "cudnn_version", cudnn.version)
    out["cudnn_enabled"] = _try(errors, "cudnn_enabled", lambda: bool(cudnn.enabled))
    out["cudnn_benchmark"] = _try(errors, "cudnn_benchmark", lambda: bool(cudnn.benchmark))
    out["cudnn_deterministic"] = _try(errors, "cudnn_deterministic", lambda: bool(cudnn.deterministic))
    out["deterministic_algorithms"] = _try(
        errors, "deterministic_algorithms", lambda: bool(torch.are_deterministic_algorithms_enabled()))
    out["deterministic_warn_only"] = _try(
        errors, "deterministic_warn_only", lambda: bool(torch.is_deterministic_algorithms_warn_only_enabled()))
    out["num_threads"] = _try(errors, "num_threads", lambda: int(torch.get_num_threads()))
    out["num_interop_threads"] = _try(errors, "num_interop_threads", lambda: int(torch.get_num_interop_threads()))
    out["onnx_default_opset"] = _onnx_default_opset(torch_dir)
    out["onnx_max_opset"] = _onnx_default_opset(torch_dir, ("ONNX_MAX_OPSET",))
    out["errors"] = errors


def _die_with_parent(argv):
    """Be killed when envdoctor dies, even by SIGKILL, when none of its code runs to kill
    this process group: a torch import hung on a dead NFS mount would stay for ever.
    argv[2] is {"parent": PID}; PR_SET_PDEATHSIG; a parent already gone ends it now."""
    try:
        parent = json.loads(argv[2]).get("parent") if len(argv) > 2 else None
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(ctypes.c_int(1), ctypes.c_ulong(9), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    except Exception:  # no ctypes in this interpreter, not Linux, odd arguments: the group kill still holds
        return
    if parent and os.getppid() != parent:
        os._exit(0)


def main(argv):
    _die_with_parent(argv)
    mode = argv[1] if len(argv) > 1 else "facts"
    out = _base_facts(mode)
    # Keep torch's chatter off the channel the result travels on.
    sys.stdout = sys.stderr
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            import torch
        except ModuleNotFoundError as exc:
            if exc.name == "torch":
                out["torch"] = False
                _emit(out)
                return 0
            out["torch"] = True
            out["import_error"] = "%s: %s" % (type(exc).__name__, exc)
            _emit(out)
            return 3
        except BaseException as exc:  # a broken install: ImportError, OSError from a .so, SystemExit...
            out["torch"] = True
            out["import_error"] = "%s: %s" % (type(exc).__name__, exc)
            _emit(out)
            return 3
        out["torch"] = True
        out["import_seconds"] = time.perf_counter() - started
        _torch_facts(torch, out)
        if mode != "facts":
            out["errors"]["mode"] = "unknown probe mode %r" % mode
    seen = []
    for w in caught:
        text = "%s: %s" % (w.category.__name__, w.message)
        if text not in seen:
            seen.append(text)
    out["warnings"] = seen[:20]
    out["probe_seconds"] = time.perf_counter() - started
    _emit(out)
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stderr.flush()
    _real_stdout.flush()
    # Skip the interpreter's teardown: unloading torch (its thread pools, CUDA
    # libraries, thousands of modules) takes ~0.4 s and the answer is already out.
    os._exit(code)
