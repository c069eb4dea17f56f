"""Torch facts of a target, read from its files: torch is never imported, nothing is run.

Why: `import torch` costs seconds (3 s cold here), and a monitor must neither
load CUDA libraries nor touch the job it watches. What checks need is mostly
written down in files: torch/version.py (version, CUDA, HIP, git commit), the
dist-info METADATA of torch and of the nvidia-* wheels (cuDNN, NCCL, cuBLAS...),
cudnn_version.h, the arch string compiled into libtorch_python.so, the ONNX
default opset in torch/onnx/_constants.py. For `pid:N` these are the files the
process actually mapped (/proc/N/maps), read through /proc/N/root, so a process
in a container is seen as it sees itself.

What only a running torch knows (torch.cuda.is_available(), the cuDNN flags'
values, thread counts) is None here, with the reason under "unknown"; the
in-process view (`envdoctor.preflight()`) has the live values. When no file
says where an interpreter's torch is (an unusual layout, a .pth-only install),
`gather` falls back to the probe subprocess, which answers for that interpreter.

    gather(session)                      -> facts for the session's target
    read_installation(torch_dir, host)   -> facts of one torch folder
"""

from __future__ import annotations

import copy
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path

from envdoctor import diskcache
from envdoctor.errors import EnvdoctorError, Unavailable
from envdoctor.torchfacts import locate, metadata

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping

__all__ = ["gather", "read_installation", "TorchFilesError", "RUNTIME_ONLY"]

# Facts the probe reports that no file holds: only a running torch knows them.
RUNTIME_ONLY = {
    "cuda_available": "torch.cuda.is_available() asks the driver at run time",
    "device_count": "asks the driver at run time",
    "cuda_initialized": "a property of a running process",
    "cudnn_enabled": "a live setting of the process (envdoctor.preflight() reads it in the job)",
    "cudnn_benchmark": "a live setting of the process (envdoctor.preflight() reads it in the job)",
    "cudnn_deterministic": "a live setting of the process (envdoctor.preflight() reads it in the job)",
    "deterministic_algorithms": "a live setting of the process (envdoctor.preflight() reads it in the job)",
    "deterministic_warn_only": "a live setting of the process (envdoctor.preflight() reads it in the job)",
    "num_threads": "decided by torch at import from the environment and the CPUs",
    "num_interop_threads": "decided by torch at import from the environment and the CPUs",
}


class NoTorch(Unavailable):
    """No libtorch is mapped in the process and no torch is where its interpreter would
    import one from. `searched`: those site directories, as the process sees them
    (serve asks again when one of them changes: `searched_key`)."""

    def __init__(self, reason: str, searched: tuple[str, ...] = ()):
        super().__init__(reason)
        self.searched = searched


def searched_key(searched: tuple[str, ...], host: Callable[[str], Path]) -> tuple[Any, ...]:
    """What a NoTorch answer depends on besides the process image: the file find_torch looks
    for in each site directory it searched, torch/version.py (a `pip install torch` there
    writes it; stamping the directory missed a torch folder that was there before its
    version.py, helper-106)."""
    return tuple(_stamp(host(f"{site}/torch/version.py")) for site in searched)


class TorchFilesError(EnvdoctorError):
    """A torch folder is there but its files do not say what torch it is (broken install)."""


CUDNN_PACKAGE = re.compile(r"nvidia-cudnn-cu\d+$")


def _cudnn(site: Path, torch_dir: Path, packages: dict[str, str]) -> tuple[int | None, str | None, bool | None]:
    """cuDNN version (torch's integer form), where it was read, and whether a library is there."""
    libs = [site / "nvidia" / "cudnn" / "lib", torch_dir / "lib"]
    present = None
    for folder in libs:
        try:
            if any(p.name.startswith("libcudnn.so") for p in folder.iterdir()):
                present = True
                break
        except OSError:
            continue
    header = site / "nvidia" / "cudnn" / "include" / "cudnn_version.h"
    number = metadata.cudnn_from_header(header)
    if number is not None:
        return number, str(header), present
    for name, version in packages.items():
        if CUDNN_PACKAGE.match(name):  # nvidia-cudnn-cu13, not nvidia-cudnn-frontend (helper-86: read as cuDNN 2.6)
            return metadata.cudnn_from_version(version), f"{name} {version}", present
    return None, None, present


def _cudnn_mismatch(installed: int | None, required: str | None) -> str | None:
    """torch's own rule (torch/backends/cudnn/__init__.py): the same major, and for
    cuDNN >= 7 a runtime minor at least the compiled one; else it raises on first use.
    The version torch's wheel pins is the one it was built with."""
    m = re.match(r"(\d+)\.(\d+)", required or "")
    if installed is None or m is None:
        return None
    have = (installed // 10000, installed // 100 % 100) if installed >= 10000 else (installed // 1000, installed // 100 % 10)
    want = (int(m.group(1)), int(m.group(2)))
    if have[0] != want[0] or have[1] < want[1]:
        return (f"RuntimeError: cuDNN version incompatibility: torch was built for cuDNN {required} "
                f"but the installed cuDNN is {have[0]}.{have[1]}")
    return None


def read_installation(torch_dir: str, host: Callable[[str], Path] = Path) -> dict[str, Any]:
    """Facts of the torch folder `torch_dir` (a path as the target sees it; `host`
    turns such a path into one this process can open)."""
    started = time.perf_counter()
    td = host(torch_dir)
    v = metadata.version_py(td)
    if v is None:
        raise TorchFilesError(f"torch at {torch_dir} has no readable version.py: a broken or partial install "
                              "(pip install --force-reinstall torch)")
    site_path = os.path.dirname(torch_dir)
    site = host(site_path)
    own = metadata.dist_info_of(site, "torch", str(v["__version__"]))
    torch_meta = metadata.read_metadata(own) if own is not None else None
    packages = metadata.cuda_packages(site)
    cuda, hip = v.get("cuda"), v.get("hip")
    out: dict[str, Any] = {
        "source": "files",
        "torch": True,
        "torch_version": str(v["__version__"]),
        "torch_dir": torch_dir,
        "torch_cuda_version": cuda,
        "torch_hip_version": hip,
        "git_version": v.get("git_version"),
        "torch_dist_version": torch_meta["version"] if torch_meta else None,
        "cuda_packages": packages,
        "cuda_compiled": cuda is not None,
        "errors": {},
        "warnings": [],
        "probe_cached": None,
    }
    py = re.search(r"/python(\d+\.\d+)/", torch_dir)
    out["python_version"] = py.group(1) if py else None
    unknown = {key: why for key, why in RUNTIME_ONLY.items()}
    out.update({key: None for key in RUNTIME_ONLY})
    if cuda is not None:
        out.update(_arch_facts(td, torch_dir, unknown))
        out.update(_cudnn_facts(site, td, packages, torch_meta, out["errors"], unknown))
    else:
        # a CPU-only (or ROCm) build: no CUDA kernels, no cuDNN (torch.backends.cudnn.is_available() is False)
        out.update(arch_list=[], arch_source=None, cudnn_version=None, cudnn_source=None, cudnn_required=None,
                   cudnn_available=False)
    out["onnx_default_opset"] = metadata.onnx_default_opset(td)
    out["onnx_max_opset"] = metadata.onnx_max_opset(td)
    out["unknown"] = unknown
    out["read_seconds"] = round(time.perf_counter() - started, 4)
    return out


def _arch_facts(td: Path, torch_dir: str, unknown: dict[str, str]) -> dict[str, Any]:
    """torch.cuda.get_arch_list() as compiled in: libtorch_python.so's string, else the -gencode flags."""
    from envdoctor.torchfacts import elf  # here: a warm start takes these facts from the disk cache

    for name, reader in (("libtorch_python.so", elf.arch_string), ("libtorch_cuda.so", elf.gencode_arches)):
        arch = reader(td / "lib" / name)
        if arch:
            return {"arch_list": arch, "arch_source": f"{torch_dir}/lib/{name}"}
    unknown["arch_list"] = f"no arch string found in {torch_dir}/lib/libtorch_python.so or libtorch_cuda.so"
    return {"arch_list": [], "arch_source": None}


def _cudnn_facts(site: Path, td: Path, packages: dict[str, str], torch_meta: dict[str, Any] | None,
                 errors: dict[str, str], unknown: dict[str, str]) -> dict[str, Any]:
    version, source, present = _cudnn(site, td, packages)
    required = metadata.pinned(torch_meta["requires"], "nvidia-cudnn-cu") if torch_meta else None
    mismatch = _cudnn_mismatch(version, required)
    if mismatch:
        errors["cudnn_version"] = mismatch
    if version is None:
        unknown["cudnn_version"] = "no nvidia-cudnn package or cudnn_version.h next to torch"
    # a library file, not a header or a package record, says it is there (helper-86: the header
    # alone, its library deleted, read as available); none beside torch may still be the system's
    return {"cudnn_version": version, "cudnn_source": source, "cudnn_required": required,
            "cudnn_available": True if present else None}


_MEMO: "OrderedDict[tuple[Any, ...], dict[str, Any]]" = OrderedDict()
_MEMO_LOCK = threading.Lock()
_MEMO_SIZE = 64
FILES_SCHEMA = "envdoctor.torch-files-cache/v2"  # v2: cudnn_available only from a library file


def _stamp(path: Path) -> tuple[int, int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, st.st_ctime_ns  # ctime: an edit `touch -r` hid


_VENV_TORCH = re.compile(r"^(.*)/lib/python[^/]+/site-packages/torch$")  # a venv's torch: group 1 is the venv


def installation_key(torch_dir: str, host: Callable[[str], Path] = Path) -> tuple[Any, ...]:
    """What read_installation_cached keys an installation by: the path, and the stamps of
    version.py, the two libraries the arch list comes from and the site directory."""
    td, site = host(torch_dir), host(os.path.dirname(torch_dir))
    return (torch_dir, _stamp(td / "version.py"), _stamp(td / "lib" / "libtorch_python.so"),
            _stamp(td / "lib" / "libtorch_cuda.so"), _stamp(site))


def process_files_key(facts: Mapping[str, Any], host: Callable[[str], Path]) -> tuple[Any, ...]:
    """What for_process's facts depend on besides the process and the torch files it maps
    (serve compares those by inode every run): the site directory (a pip install or
    uninstall next to torch, such as a cuDNN upgrade, changes it), version.py, and
    whether its venv is still one. serve keeps a process's facts while this is unchanged
    (helper-62: without it, a cuDNN upgrade beside a running job was seen up to 120 s late)."""
    torch_dir = str(facts.get("torch_dir") or "")
    if not torch_dir:
        return (None, None, None)
    venv = _VENV_TORCH.match(torch_dir)
    return (_stamp(host(os.path.dirname(torch_dir))), _stamp(host(torch_dir) / "version.py"),
            _stamp(host(f"{venv.group(1)}/pyvenv.cfg")) if venv else None)


def read_installation_cached(torch_dir: str, host: Callable[[str], Path] = Path) -> dict[str, Any]:
    """read_installation(), remembered while torch's files are unchanged: in this process,
    and on disk (envdoctor.diskcache) for the next one.

    `serve` reads every training process's torch at every interval; most share one
    installation (or one image layer). The key is the path as the target sees it
    (the facts name it) and the identity and mtime of version.py, the two
    libraries the arch list comes from and the site directory (a pip install or
    uninstall next to torch changes it), so a reinstall is read afresh. On disk:
    parsing version.py and the package metadata took 4-8 ms of every warm `check`
    and of every container start's `exec` (its slowest check's, so the run's).
    """
    key = installation_key(torch_dir, host)
    with _MEMO_LOCK:
        hit = _MEMO.get(key)
        if hit is not None:
            _MEMO.move_to_end(key)
    if hit is None:
        hit = _read_through_disk(torch_dir, host, key)
        with _MEMO_LOCK:
            _MEMO[key] = hit
            while len(_MEMO) > _MEMO_SIZE:
                _MEMO.popitem(last=False)
    return copied(hit)


def _read_through_disk(torch_dir: str, host: Callable[[str], Path], key: tuple[Any, ...]) -> dict[str, Any]:
    if not diskcache.enabled() or key[1] is None:  # no version.py: read_installation says why
        return read_installation(torch_dir, host)
    path = diskcache.entry_file("torch-files", repr(key))  # one file per installation: none evicts another
    fingerprint = _every_source(torch_dir, host, key)
    facts = diskcache.read(path, FILES_SCHEMA, fingerprint)
    if facts is not None and not isinstance(facts.get("torch_version"), str):
        facts = None  # an entry that is not what read_installation writes: read the files (helper-58)
    if facts is None:
        facts = read_installation(torch_dir, host)
        diskcache.write(path, FILES_SCHEMA, fingerprint, facts)
    return facts


def _every_source(torch_dir: str, host: Callable[[str], Path], key: tuple[Any, ...]) -> list[Any]:
    """`key` and the stamps of every other file the facts come from, for an entry that
    outlives this process: an edit in place of cudnn_version.h, of a wheel's METADATA or
    of onnx/_constants.py does not change the site directory (helper-58). In-process the
    cheaper `key` serves, as it always did (serve asks for every target of every run)."""
    td, site = host(torch_dir), host(os.path.dirname(torch_dir))
    cudnn = site / "nvidia" / "cudnn"
    files = [td / "onnx" / "_constants.py", cudnn / "include" / "cudnn_version.h", cudnn / "lib", td / "lib",
             *metadata.metadata_files(site)]
    return [*key, *([str(f), _stamp(f)] for f in files)]


_SCALARS = (str, int, float, bool, type(None))


def copied(value: Any) -> Any:
    """A copy of the facts a caller may change: their dicts and lists, by their own type
    (copy.deepcopy's generic walk was two thirds of a cached read, which serve pays for
    every torch process every run); anything else by deepcopy."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        return {k: copied(v) for k, v in value.items()}
    if kind is list:
        return [copied(v) for v in value]
    return copy.deepcopy(value)


def _read_bounded(path: Path, limit: int) -> str:
    """A /proc file's text; non-blocking, regular files only (envdoctor.paths.read_bytes)."""
    from envdoctor.paths import read_bytes

    return read_bytes(path, limit).decode("utf-8", "surrogateescape")


def for_process(roots: Any, pid: int, env: dict[str, str] | None = None, maps_hint: str = "") -> dict[str, Any]:
    """Facts of the torch process `pid` has loaded, or would load, read through /proc/N/root.

    `maps_hint`: lines of its maps already read (serve's discovery keeps those naming a
    torch folder). When they show torch's libraries, maps is not read again; they hold
    every line under that folder, so replaced files are seen as in the whole maps."""
    from envdoctor.context import Target, unavailable_from_oserror

    jail = roots.printed_root(pid)  # the kernel prints a jailed process's paths with its jail in front
    mapped = _in_own_view(jail, locate.mapped(maps_hint))  # parsed once: the files and which were replaced
    maps = roots.proc(pid, "maps")
    if not locate.torch_dirs_from_maps(mapped):
        try:
            maps_text = _read_bounded(maps, locate.MAX_MAPS)
        except OSError as exc:
            raise unavailable_from_oserror(exc, Target(pid), maps) from None
        mapped = _in_own_view(jail, locate.mapped(maps_text))
    files = list(mapped)

    root = roots.proc(pid, "root")

    def host(path: str) -> Path:
        # roots.seen_by's paths are kept for the files read every run; these (PATH and site
        # directories searched) are asked once per process image, and kept they filled that
        # cache: 1,666 paths with 64 `sleep` processes, ~0.9 MiB of serve's memory
        return root / path.lstrip("/")

    try:
        exe: str | None = roots.in_own_view(jail, os.readlink(roots.proc(pid, "exe")).removesuffix(" (deleted)"))
    except OSError:
        exe = None
    dirs = locate.torch_dirs_from_maps(files)
    imported = bool(dirs)
    torch_dir = dirs[0] if dirs else None
    if torch_dir is None:
        searched = _process_site_dirs(roots, pid, files, exe, env or {}, host, jail)
        torch_dir = locate.find_torch(searched, host)
        if torch_dir is None:
            raise NoTorch(f"no torch in pid:{pid}: no libtorch is mapped in {maps} and none is in its "
                          f"interpreter's site directories" + (f" ({exe})" if exe else ""), tuple(searched))
    facts = read_installation_cached(torch_dir, host)
    facts["python"] = exe
    facts["torch_imported"] = imported
    replaced = [f for f, deleted in mapped.items() if deleted and f.startswith(torch_dir + "/")]
    facts["torch_files_replaced"] = replaced
    if replaced:
        facts["warnings"].append(f"pid:{pid} runs a torch whose files were replaced on disk since it loaded them "
                                 f"({os.path.basename(replaced[0])}): these facts describe the files there now, "
                                 "not the torch the process runs; restart the job to run what is installed")
    # /proc/N/exe is the base interpreter even in a venv; name the venv torch came from
    m = _VENV_TORCH.match(torch_dir)
    facts["venv"] = m.group(1) if m and host(f"{m.group(1)}/pyvenv.cfg").is_file() else None
    return facts


def _in_own_view(jail: str, mapped: dict[str, bool]) -> dict[str, bool]:
    """maps' files as a process in `jail` (Roots.printed_root) names them."""
    if not jail:
        return mapped
    from envdoctor.paths import Roots

    return {Roots.in_own_view(jail, path): deleted for path, deleted in mapped.items()}


def _process_site_dirs(roots: Any, pid: int, files: list[str], exe: str | None, env: dict[str, str],
                       host: Callable[[str], Path], jail: str = "") -> list[str]:
    """Where `import torch` in process `pid` would look: PYTHONPATH, the site directories
    of what it has mapped, its venv (VIRTUAL_ENV, argv[0]) and its interpreter's prefix."""
    dirs = [p for p in env.get("PYTHONPATH", "").split(":") if p.startswith("/")]
    dirs += locate.site_dirs_from_maps(files)
    pythons = []
    if env.get("VIRTUAL_ENV", "").startswith("/"):
        pythons.append(env["VIRTUAL_ENV"].rstrip("/") + "/bin/python")
    try:
        head = metadata.read_head(roots.proc(pid, "cmdline"), 4096) or b""  # argv[0] is at the start
        argv0 = head.decode("utf-8", "surrogateescape").split("\0", 1)[0]
        if "/" in argv0:
            cwd = roots.in_own_view(jail, os.readlink(roots.proc(pid, "cwd"))) if not argv0.startswith("/") else "/"
            pythons.append(os.path.normpath(os.path.join(cwd, argv0)))
        elif argv0 and exe:
            pythons += _found_on_path(argv0, env.get("PATH", ""), exe, host)
    except OSError:
        pass
    if exe:
        pythons.append(exe)

    def resolve(path: str) -> str:
        return path  # links inside another mount namespace are not followed; exe is already resolved

    for python in dict.fromkeys(pythons):
        dirs += locate.interpreter_site_dirs(python, host, resolve)
    return list(dict.fromkeys(dirs))


def _found_on_path(name: str, path: str, exe: str, host: Callable[[str], Path]) -> list[str]:
    """The `name` (`python`, as typed in a shell) that the process's PATH leads to, when it
    is the interpreter the process runs: a venv's bin/python on PATH, not activated, names
    no venv anywhere else (argv[0] is bare, VIRTUAL_ENV unset, /proc/N/exe the base)."""
    try:
        runs = os.path.realpath(host(exe))
    except (OSError, ValueError):
        return []
    for directory in path.split(":")[:64]:
        if not directory.startswith("/"):
            continue  # relative to a cwd we would be guessing at
        candidate = os.path.join(directory, name)
        try:
            here = host(candidate)
            if here.is_file() and os.access(here, os.X_OK):  # what execvp would have taken
                return [candidate] if os.path.realpath(here) == runs else []
        except (OSError, ValueError):
            continue
    return []


def for_interpreter(python: str, env: dict[str, str], rootfs: Path = Path("/")) -> dict[str, Any] | None:
    """Facts of the torch `python` would import, or None when no file says where it is."""
    if python != sys.executable:
        from envdoctor.probe import resolve_python  # says why an interpreter cannot be used

        python = resolve_python(python)

    def host(path: str) -> Path:
        return rootfs / path.lstrip("/")

    if python == sys.executable and str(rootfs) == "/":
        # our own interpreter: its search path is known exactly, minus the working
        # directory (the probe, too, runs from / so a ./torch folder is not taken)
        try:
            cwd = os.getcwd()
        except OSError:  # removed under us: no path entry can be it (torch checks broke here)
            cwd = None
        dirs = [p for p in sys.path if p and p != cwd]
    else:
        dirs = [p for p in env.get("PYTHONPATH", "").split(":") if p.startswith("/")]
        home = env.get("HOME")
        user = [f"{home}/.local"] if home and not host(os.path.dirname(os.path.dirname(python)) + "/pyvenv.cfg").exists() else []
        for base in user:
            dirs += [d for d in locate._lib_python_dirs(base, host) if d.endswith("site-packages")]
        dirs += locate.interpreter_site_dirs(python, host, os.path.realpath)
    torch_dir = locate.find_torch(dirs, host)
    if torch_dir is None:
        return None
    facts = read_installation_cached(torch_dir, host)
    facts["python"] = python
    return facts


def gather(session: Any) -> dict[str, Any]:
    """The session target's torch facts: files first; the probe only when files are silent."""
    pid = session.target.pid
    try:
        env = dict(session.env)
    except Unavailable:  # an unreadable environment costs the hints it holds (VIRTUAL_ENV, PYTHONPATH), not the facts
        env = {}
    if pid is not None and not session.python_explicit:
        return for_process(session.roots, pid, env)
    facts = for_interpreter(session.python, env, session.roots.rootfs)
    if facts is not None:
        return facts
    from envdoctor.probe import run_probe

    facts = run_probe(session.python, timeout=getattr(session, "probe_timeout", None))
    facts.setdefault("source", "probe")
    return facts
