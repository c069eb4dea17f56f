"""CUDA runtime: does the torch build match the driver, the GPUs and cuDNN?

What it reads
  - from torch's files (README, "How torch facts are gathered"; torch is never
    imported in envdoctor's process): torch's version, the CUDA version it was
    built with (torch.version.cuda, None for a CPU-only build), the GPU
    architectures it carries kernels for (torch.cuda.get_arch_list(): sm_XY =
    compiled machine code, compute_XY = PTX), the cuDNN version (and the error
    torch raises when the cuDNN it finds does not match the one it was built
    with). Whether torch.cuda.is_available() only a running torch knows: null
    from files, given by a probe (only where no file says where torch is) or by
    `envdoctor.preflight()` in the job;
  - from NVML: the driver version, the highest CUDA version the driver supports,
    each GPU's name and compute capability (read here, not from torch, because
    asking torch for a capability creates a CUDA context);
  - CUDA_LAUNCH_BLOCKING from the target's environment.

Why it matters (PITFALLS 8, 9)
  "CUDA error: no kernel image is available for execution on the device",
  "CUDNN_STATUS_EXECUTION_FAILED", "an illegal memory access was encountered" and
  "The NVIDIA driver on your system is too old" all come from a torch build that
  does not match the GPU, the driver or cuDNN. They show up minutes into a job,
  after the data is loaded. "module 'torch._C' has no attribute '_cuda_getDevice'"
  is a CPU-only torch on a GPU node. CUDA_LAUNCH_BLOCKING=1 is the debugging
  switch that makes every kernel launch synchronous; left on, it costs throughput
  on every step.

Rules applied
  - Driver vs build (NVIDIA, "CUDA Compatibility", section "Minor Version
    Compatibility", docs.nvidia.com/deploy/cuda-compatibility/): since CUDA 11 an
    application built with any toolkit of one major release runs on a driver
    that supports an older minor of the same major (CUDA 11.x needs >= R450,
    12.x >= R525, 13.x >= R580), with a limited feature set; notably PTX
    produced by the newer toolkit cannot be JIT-compiled by the older driver.
    A driver of an older major cannot run the build at all; before CUDA 11 the
    driver had to support the exact version.
  - Kernels vs GPU (CUDA C++ Programming Guide, "Binary Compatibility" and
    "Application Compatibility"): machine code for sm_XY runs on GPUs of
    compute capability X.z with z >= Y (same major only); arch-specific sm_XYa
    only on exactly X.Y; family-specific sm_XYf on the same major with z >= Y.
    PTX for compute_XY is JIT-compiled by the driver for any GPU of capability
    >= X.Y, at the cost of a long first start (kernels are compiled on first
    use and cached in ~/.nv/ComputeCache).

Statuses
  fail   a CPU-only (or ROCm) torch on a node with NVIDIA GPUs; a driver whose
         CUDA major is older than the build's (or older at all, before CUDA 11), or
         older within it and below the branch minor version compatibility starts at
         (450.80.02 for CUDA 11, 525.60.13 for 12, 580 for 13);
         a GPU torch has neither machine code nor usable PTX for; a GPU reachable
         only through PTX while the driver is older than the build; a cuDNN
         version mismatch; on any node, a torch that cannot be imported because a
         file of its install is missing (torch/__init__.py, _C*.so,
         lib/libtorch_python.so, lib/libtorch_cuda.so for a CUDA build); not for a
         process that has it loaded, nor read through --pid.
  warn   a library torch's libraries need (libcudnn.so.9 of an uninstalled
         nvidia-cudnn package) in none of the places the loader looks (their
         RUNPATH and RPATH, LD_LIBRARY_PATH, LD_PRELOAD, the ld.so cache, the system
         folders) nor in nvidia/*/lib on the interpreter's sys.path, where torch
         looks (a warn: a place envdoctor does not read may still provide it);
         driver older than the build within the same major (minor version
         compatibility: works, with limits); a driver of an older major with a
         CUDA forward compatibility libcuda (cuda-compat, NGC images) on
         LD_LIBRARY_PATH (works on data center GPUs); a GPU reachable only by JIT from
         PTX; torch.cuda.is_available() False although NVML sees GPUs (where it is
         known: preflight() in the job, or a probe); a CUDA
         build without cuDNN; CUDA_LAUNCH_BLOCKING=1 (not for a CPU-only torch, which
         launches no kernels); torch's files replaced on
         disk after the process loaded them (a pip install over a running job:
         its maps names them "(deleted)", or in pip's ~orch stash), GPU or not.
  skip   no NVIDIA GPU visible here (NVML's reason is given) and nothing else
         found; a CPU-only torch on a CPU-only node is consistent, so there is
         nothing to match. The facts still carry the torch and CUDA versions.
  ok     the build matches the driver and every GPU.

How to fix
  Install the torch build for the driver you have (pip install torch==VERSION
  --index-url https://download.pytorch.org/whl/cuXYZ, XYZ no newer than the
  driver's CUDA version; the version is pinned only where that release was
  published for cuXYZ; a GPU older than a CUDA 12.8+ build's arch list gets the
  same release's cu126 build), or upgrade the driver; unset CUDA_LAUNCH_BLOCKING;
  restart a job whose torch was replaced under it.
"""

from __future__ import annotations

import os
import re
import sys
from collections import namedtuple

from envdoctor.check import Check, Metric
from envdoctor.errors import ParseError, Unavailable, short_reason
from envdoctor.model import Finding, Result, Status, skip, verdict

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping

# CUDA variants of the official torch wheels (download.pytorch.org/whl/cuXYZ), newest last.
WHEEL_CUDA = ((11, 8), (12, 1), (12, 4), (12, 6), (12, 8), (12, 9), (13, 0))
# The variants each torch release was published for (pytorch.org/get-started/previous-versions):
# a fix pins the job's own release only where that pair exists (helper-97: "torch==2.8.0 ...
# whl/cu121" named a wheel that never was); for a release not listed, the fix says to pick one.
RELEASE_CUDA = {
    "2.0": ((11, 7), (11, 8)), "2.1": ((11, 8), (12, 1)), "2.2": ((11, 8), (12, 1)), "2.3": ((11, 8), (12, 1)),
    "2.4": ((11, 8), (12, 1), (12, 4)), "2.5": ((11, 8), (12, 1), (12, 4)), "2.6": ((11, 8), (12, 4), (12, 6)),
    "2.7": ((11, 8), (12, 6), (12, 8)), "2.8": ((12, 6), (12, 8), (12, 9)), "2.9": ((12, 6), (12, 8), (13, 0)),
}
# From torch 2.8 the CUDA 12.8+ builds dropped sm_50-sm_70 (Maxwell, Pascal, Volta); the 12.6
# builds keep them (PyTorch 2.8 release notes: "please utilize CUDA 12.6 instead").
KEEPS_OLD_GPUS = (12, 6)
# The oldest driver branch of each CUDA major (minor version compatibility's floor).
MIN_DRIVER_FOR_MAJOR = {11: "450.80.02", 12: "525.60.13", 13: "580"}
_ARCH = re.compile(r"^(sm|compute)_(\d{2,4})([af]?)$")


# -- parsers -------------------------------------------------------------------------


def parse_cuda_version(text: Any) -> tuple[int, int]:
    """'12.1' (torch.version.cuda) -> (12, 1); ParseError on anything else."""
    if not isinstance(text, str):
        raise ParseError(f"CUDA version must be text, got {type(text).__name__}")
    parts = text.strip().split(".")
    if len(parts) < 2 or not all(p.isascii() and p.isdigit() and len(p) <= 4 for p in parts[:2]):
        raise ParseError(f"{text!r} is not a CUDA version like '12.1'")
    return int(parts[0]), int(parts[1])


class Arch(namedtuple("Arch", (
        "ptx",  # bool: compute_XY: PTX, JIT-compiled by the driver
        "major",  # int
        "minor",  # int
        "variant",  # str: "" | "a" (arch-specific) | "f" (family-specific)
))):
    """One entry of torch.cuda.get_arch_list(): 'sm_86', 'sm_90a', 'compute_90'."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return f"{'compute' if self.ptx else 'sm'}_{self.major}{self.minor}{self.variant}"

    def runs_on(self, capability: tuple[int, int]) -> bool:
        major, minor = capability
        if self.variant == "a":
            return (major, minor) == (self.major, self.minor)
        if self.variant == "f":  # family-specific: within its major only, PTX too (helper-97)
            return major == self.major and minor >= self.minor
        if self.ptx:
            return (major, minor) >= (self.major, self.minor)
        return major == self.major and minor >= self.minor


def parse_arch(text: Any) -> Arch:
    """'sm_86' -> Arch(False, 8, 6, ''); the last digit is the minor ('sm_100' is 10.0)."""
    if not isinstance(text, str):
        raise ParseError(f"arch must be text, got {type(text).__name__}")
    m = _ARCH.match(text.strip())
    if not m:
        raise ParseError(f"{text!r} is not a CUDA arch like 'sm_86' or 'compute_90'")
    kind, digits, variant = m.groups()
    return Arch(kind == "compute", int(digits[:-1]), int(digits[-1]), variant)


def format_cudnn_version(version: Any) -> str | None:
    """torch.backends.cudnn.version(): 90100 -> '9.1.0' (cuDNN 9), 8902 -> '8.9.2' (cuDNN <= 8)."""
    if not isinstance(version, int) or isinstance(version, bool) or version <= 0:
        return None
    if version >= 10000:
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return f"{version // 1000}.{version % 1000 // 100}.{version % 100}"


# -- facts ---------------------------------------------------------------------------


class Gpu(namedtuple("Gpu", (
        "index",  # int
        "name",  # str
        "capability",  # tuple[int, int] | None
))):
    __slots__ = ()


class RuntimeFacts(namedtuple("RuntimeFacts", (
        "torch",  # Mapping[str, Any]: the probe's facts
        "nvml_reason",  # str | None = None: why NVML is not here; None when it is
        "driver_version",  # str | None = None
        "driver_cuda",  # tuple[int, int] | None = None
        "gpus",  # tuple[Gpu, ...] = ()
        "launch_blocking",  # str | None = None: CUDA_LAUNCH_BLOCKING as set, None when unset
        "env_error",  # str | None = None
        "skip_cudnn_check",  # str | None = None: PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK as set
        "libraries_missing",  # Mapping[str, str] = {}: library -> the torch library needing it, found nowhere
        "files_missing",  # tuple[str, ...] = (): files of torch's install every import opens, not there
        "forward_compat",  # tuple[str, str] | None = None: (file, driver version) of a CUDA forward
                           # compatibility libcuda on the target's LD_LIBRARY_PATH (cuda-compat, NGC images)
), defaults=(None, None, None, (), None, None, None, {}, (), None))):
    __slots__ = ()


def gather(ctx) -> RuntimeFacts:
    torch = ctx.torch
    launch_blocking, env_error = ctx.env_var("CUDA_LAUNCH_BLOCKING")
    skip_cudnn, _ = ctx.env_var(SKIP_CUDNN_CHECK)
    files_missing, missing = _import_problems(ctx, torch)
    try:
        nvml = ctx.nvml
        driver = nvml.driver_version()
        driver_cuda = nvml.cuda_driver_version()
        gpus = tuple(Gpu(int(g.index), str(g.name or f"GPU {g.index}"), tuple(g.compute_capability) if g.compute_capability else None)
                     for g in nvml.devices() if not getattr(g, "lost", False))
    except Unavailable as exc:
        return RuntimeFacts(torch, nvml_reason=str(exc), launch_blocking=launch_blocking, env_error=env_error,
                            skip_cudnn_check=skip_cudnn, libraries_missing=missing, files_missing=files_missing)
    return RuntimeFacts(torch, None, driver, tuple(driver_cuda) if driver_cuda else None, gpus, launch_blocking, env_error,
                        skip_cudnn, missing, files_missing, _forward_compat(ctx))


_COMPAT_LIBCUDA = re.compile(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)")


def _forward_compat(ctx) -> tuple[str, str] | None:
    """A forward compatibility libcuda (NVIDIA's cuda-compat package, /usr/local/cuda/compat/lib
    in NGC images) in a folder of the target's LD_LIBRARY_PATH that says so: the loader takes it
    before the host driver's, and a newer CUDA then runs on an older driver branch on data
    center GPUs (helper-97: a job that works was failed)."""
    value, _ = ctx.env_var("LD_LIBRARY_PATH")
    for folder in (value or "").split(":"):
        if "compat" not in folder or not folder.startswith("/"):
            continue
        try:
            names = os.listdir(ctx.target_path(folder))
        except (OSError, ValueError):
            continue
        for name in sorted(names):
            m = _COMPAT_LIBCUDA.fullmatch(name)
            if m:
                return f"{folder.rstrip('/')}/{name}", m.group(1)
    return None


def _import_problems(ctx, torch: Mapping[str, Any]) -> tuple[tuple[str, ...], dict[str, str]]:
    """(files of torch's install that every import opens and are not there; {library: the
    torch library needing it} for libraries found nowhere the loader or torch's own preload
    looks), read now, not cached: an ldconfig or an install beside torch changes them
    (helper-88). Only for this process's view (check, --python, exec): a --pid process is
    read through /proc/N/root, and one that runs torch found them."""
    torch_dir = torch.get("torch_dir")
    if ctx.target.pid is not None or torch.get("torch_imported") or not torch_dir or torch.get("source") != "files":
        return (), {}
    try:
        return _import_problems_read(ctx, torch, torch_dir)
    except (OSError, ValueError):  # a removed working folder, a path the system refuses: nothing said
        return (), {}


def _import_problems_read(ctx, torch: Mapping[str, Any], torch_dir: str) -> tuple[tuple[str, ...], dict[str, str]]:
    from envdoctor.torchfacts import libraries

    files = tuple(libraries.missing_files(torch_dir, torch.get("torch_cuda_version") is not None))
    env = dict(ctx.env)
    python = torch.get("python") or sys.executable
    sites = libraries.search_path(torch_dir, python, env, torch.get("python_version"))
    if os.path.abspath(python) == os.path.abspath(sys.executable):  # this interpreter: its sys.path is known
        sites = [p for p in sys.path if p] + sites
    unresolved = libraries.unresolved(torch_dir, sites, libraries.preloads(env))
    path = env.get("LD_LIBRARY_PATH")  # an empty or relative entry is the working folder's, as the loader reads it
    cwd = libraries.working_folder()
    dirs = [os.path.join(cwd, d) for d in path.split(":") if cwd or d.startswith("/")] if path else []
    return files, {name: by for name, by in unresolved.items() if not any(os.path.isfile(os.path.join(d, name))
                                                                           for d in dirs)}


# torch/backends/cudnn/__init__.py: with this set to "1", torch loads a cuDNN whose version
# does not match its build instead of raising (torch 2.13, read from the CUDA wheel)
SKIP_CUDNN_CHECK = "PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK"


# -- judging -------------------------------------------------------------------------


def _wheel_for(driver_cuda: tuple[int, int] | None,
               offered: tuple[tuple[int, int], ...] = WHEEL_CUDA) -> tuple[int, int] | None:
    """The newest of `offered` the driver runs with its full feature set, within the driver's
    own CUDA major; failing that, the oldest of that major (minor version compatibility runs
    it: helper-97, a 12.0 driver was sent to a CUDA 11 build); then the newest older one;
    None when the driver runs none of them."""
    if driver_cuda is None:
        return (12, 8) if (12, 8) in offered else offered[-1]
    same_major = [v for v in offered if v[0] == driver_cuda[0]]
    fitting = [v for v in same_major if v <= driver_cuda]
    older = [v for v in offered if v[0] < driver_cuda[0]]
    return max(fitting) if fitting else min(same_major) if same_major else max(older) if older else None


def _pip_fix(torch_version: str | None, driver_cuda: tuple[int, int] | None,
             variant: tuple[int, int] | None = None) -> str:
    """pip's line for a torch the driver runs: the job's own release where it was published
    for the variant chosen, else any release that was (the line says so)."""
    version = (torch_version or "").split("+", 1)[0]
    release = ".".join(version.split(".")[:2])
    offered = RELEASE_CUDA.get(release)
    chosen = variant or (offered and _wheel_for(driver_cuda, offered)) or _wheel_for(driver_cuda) or WHEEL_CUDA[0]
    tag = f"cu{chosen[0]}{chosen[1]}"
    url = f"https://download.pytorch.org/whl/{tag}"
    if version and offered is not None and chosen in offered:
        return f"pip install --force-reinstall torch=={version} --index-url {url}"
    if version:
        return (f"pip install --force-reinstall torch --index-url {url}  # a release published for {tag} "
                f"(pytorch.org/get-started/previous-versions); envdoctor knows no {tag} build of torch {version}")
    return f"pip install --force-reinstall torch --index-url {url}"


def _compat_covers(compat: tuple[str, str] | None, build: tuple[int, int]) -> bool:
    floor = MIN_DRIVER_FOR_MAJOR.get(build[0])
    return compat is not None and floor is not None and not _driver_below(compat[1], floor)


def _driver_below(driver: Any, floor: str) -> bool:
    """Whether driver version `driver` ('450.36.06') is older than `floor` ('450.80.02');
    False when it cannot be read."""
    try:
        have = tuple(int(x) for x in str(driver).split("."))
        want = tuple(int(x) for x in floor.split("."))
    except ValueError:
        return False
    return have < want


def _cap(c: tuple[int, int]) -> str:
    return f"{c[0]}.{c[1]}"


class Build(namedtuple("Build", (
        "version",  # str | None
        "cuda",  # tuple[int, int] | None: None: no CUDA (CPU-only or ROCm), or unreadable
        "cuda_text",  # str | None
        "hip_text",  # str | None
        "arches",  # tuple[Arch, ...]
        "unknown_arches",  # tuple[str, ...]
        "cudnn_text",  # str | None
        "label",  # str: "torch 2.4.0 (CUDA 12.1, cuDNN 9.1.0)"
))):
    """What torch was built with, read once from the probe's facts."""

    __slots__ = ()


def _build(t: Mapping[str, Any]) -> Build:
    cuda_text, hip_text = t.get("torch_cuda_version"), t.get("torch_hip_version")
    cuda = None
    try:
        cuda = parse_cuda_version(cuda_text) if cuda_text else None
    except ParseError:
        pass
    arches, unknown = [], []
    for entry in t.get("arch_list") or []:
        try:
            arches.append(parse_arch(entry))
        except ParseError:
            unknown.append(str(entry))
    cudnn_text = format_cudnn_version(t.get("cudnn_version"))
    label = f"torch {t.get('torch_version')}" + (
        f" (CUDA {cuda_text}" + (f", cuDNN {cudnn_text})" if cudnn_text else ")") if cuda_text else "")
    return Build(t.get("torch_version"), cuda, cuda_text, hip_text, tuple(arches), tuple(unknown), cudnn_text, label)


def _node(gpus: tuple[Gpu, ...]) -> str:
    n = len(gpus)
    return f"{n} NVIDIA GPU{'s' if n != 1 else ''} ({', '.join(sorted({g.name for g in gpus}))})"


def _driver_behind_minor(facts: RuntimeFacts, b: Build) -> bool:
    """The driver's CUDA is older than the build's, within the major: minor version compatibility."""
    drv, build = facts.driver_cuda, b.cuda
    return drv is not None and build is not None and not (drv[0] < build[0] or (drv < build and build[0] < 11)) and drv < build


def _rule_import_fails(facts: RuntimeFacts, b: Build) -> list[Finding]:
    """`import torch` cannot load: files of its install are gone (a fail: nothing else
    provides them), or a library its own need is nowhere envdoctor can see the loader or
    torch's preload look (a warn: a place it does not read may provide it, `import` lines
    of a .pth file, an LD_AUDIT library; helper-88 found five it did not read, and a fail
    would have made exec --strict refuse a job that runs). helper-86: nvidia-cudnn
    uninstalled, torch/lib half deleted, and the versions read well: ok."""
    t = facts.torch
    missing_files = list(facts.files_missing or ())
    libraries = dict(facts.libraries_missing or {})
    fix = (_pip_fix(b.version, facts.driver_cuda) if b.cuda is not None else
           f"pip install --force-reinstall torch=={(b.version or '').split('+', 1)[0] or 'VERSION'} "
           "--index-url https://download.pytorch.org/whl/cpu")  # a CPU build stays one (helper-87)
    found = []
    if missing_files:
        found.append(Finding(Status.FAIL, f"{b.label} cannot be imported here: {', '.join(missing_files[:5])} missing "
                             f"from {t.get('torch_dir') or 'its folder'}; `import torch` fails",
                             fix + "  # reinstalls torch and the libraries it pins"))
    if libraries:
        names = sorted(libraries)
        found.append(Finding(Status.WARN, f"{b.label} may not import here: {', '.join(names[:5])}"
                             f"{' and more' if len(names) > 5 else ''} (needed by {libraries[names[0]]}) is in none of "
                             "the places the loader looks (RUNPATH and RPATH, LD_LIBRARY_PATH, LD_PRELOAD, the ld.so "
                             "cache, the system folders) nor in nvidia/*/lib on sys.path, where torch looks; "
                             "`import torch` would fail (\"cannot open shared object file\")",
                             fix + "  # reinstalls torch and the libraries it pins; first: python -c 'import torch'"))
    return found


def _rule_build_unreadable(facts: RuntimeFacts, b: Build) -> list[Finding]:
    if b.cuda_text and b.cuda is None:
        try:
            parse_cuda_version(b.cuda_text)
        except ParseError as exc:
            return [Finding(Status.WARN, f"torch reports an unreadable CUDA version: {exc}")]
    return []


def _rule_launch_blocking(facts: RuntimeFacts, b: Build) -> list[Finding]:
    """CUDA_LAUNCH_BLOCKING=1, a debugging switch, serialises every kernel launch. A CPU-only
    torch launches no kernels, so there it changes nothing (helper-42: a warning whose
    own summary said "CPU-only: nothing to match"); the facts still show it."""
    if (facts.launch_blocking or "").strip() != "1":
        return []
    if b.version and not b.cuda_text and not b.hip_text:
        return []
    return [Finding(Status.WARN, "CUDA_LAUNCH_BLOCKING=1 makes every kernel launch synchronous (a debugging setting); "
                    "expected unset", "unset CUDA_LAUNCH_BLOCKING", env={"CUDA_LAUNCH_BLOCKING": None})]


def _rule_torch_replaced(facts: RuntimeFacts, b: Build) -> list[Finding]:
    """A pip install over a running job: the process still runs the torch it loaded;
    the files there now (what these facts describe) may be another one."""
    replaced = facts.torch.get("torch_files_replaced") or []
    if not replaced:
        return []
    names = ", ".join(os.path.basename(str(f)) for f in replaced[:3]) + (f" and {len(replaced) - 3} more" if len(replaced) > 3 else "")
    return [Finding(Status.WARN, f"torch's files were replaced on disk after this process loaded them ({names}): it "
                    f"still runs the torch it started with, and these facts describe the files there now ({b.label}), "
                    "which may differ; expected the files it runs",
                    "restart the job to run what is installed (or reinstall the torch it was started with)")]


def _rule_not_a_cuda_build(facts: RuntimeFacts, b: Build) -> list[Finding]:
    """A CPU-only or ROCm torch on a node with NVIDIA GPUs (PITFALLS 9)."""
    if b.cuda is not None:
        return []
    kind = f"a ROCm build (HIP {b.hip_text})" if b.hip_text else "a CPU-only build"
    return [Finding(Status.FAIL, f"{b.label} is {kind} on a node with {_node(facts.gpus)}: the job cannot use them "
                    "(\"torch._C has no attribute _cuda_getDevice\" / \"Torch not compiled with CUDA enabled\"); "
                    "expected a CUDA build", _pip_fix(b.version, facts.driver_cuda))]


def _rule_driver_vs_build(facts: RuntimeFacts, b: Build) -> list[Finding]:
    """The driver's CUDA against the build's: too old a major fails, too old a minor warns."""
    drv, build = facts.driver_cuda, b.cuda
    assert build is not None
    if drv is None:
        return [Finding(Status.OK, "the driver did not report its CUDA version; driver/build match not checked")]
    fix = _pip_fix(b.version, drv) + "  # or upgrade the NVIDIA driver"
    if drv[0] < build[0] and _compat_covers(facts.forward_compat, build):
        file, version = facts.forward_compat
        return [Finding(Status.WARN, f"driver {facts.driver_version} supports CUDA up to {_cap(drv)}, older than "
                        f"{b.label}'s CUDA {_cap(build)}, but a CUDA forward compatibility library ({file}, driver "
                        f"{version}) is on LD_LIBRARY_PATH: it runs on data center GPUs (and some RTX ones), not on "
                        "GeForce, and only over a host driver branch NVIDIA supports with it", fix)]
    if drv[0] < build[0] or (drv < build and build[0] < 11):
        floor = MIN_DRIVER_FOR_MAJOR.get(build[0])
        return [Finding(Status.FAIL, f"driver {facts.driver_version} supports CUDA up to {_cap(drv)} but {b.label} was "
                        f"built for CUDA {_cap(build)}: torch cannot use the GPUs (\"The NVIDIA driver on your system is "
                        f"too old\"); expected a driver for CUDA >= {_cap(build) if build[0] < 11 else f'{build[0]}.0'}"
                        + (f" (R{floor.split('.')[0]} or newer)" if floor else ""), fix)]
    floor = MIN_DRIVER_FOR_MAJOR.get(build[0])
    if drv < build and floor and _driver_below(facts.driver_version, floor):
        # minor version compatibility starts at this branch (helper-97: CUDA 11.0's own 450.36.06
        # was told it runs through it); no wheel of that major runs below it either (helper-98:
        # the fix named cu117, which needs the same floor)
        return [Finding(Status.FAIL, f"driver {facts.driver_version} supports CUDA {_cap(drv)}, older than {b.label}'s "
                        f"CUDA {_cap(build)}, and is below R{floor}, where CUDA {build[0]}'s minor version compatibility "
                        "starts: torch cannot use the GPUs; expected a driver >= " + floor,
                        f"upgrade the NVIDIA driver to {floor} or newer (no CUDA {build[0]} build of torch runs below it)")]
    if drv < build:
        return [Finding(Status.WARN, f"driver {facts.driver_version} supports CUDA {_cap(drv)}, older than {b.label}'s "
                        f"CUDA {_cap(build)}: it runs through CUDA minor version compatibility, but PTX JIT and features "
                        f"newer than {_cap(drv)} are unavailable; expected a driver for CUDA >= {_cap(build)}", fix)]
    return []


def _kernels(g: Gpu, facts: RuntimeFacts, b: Build) -> str:
    """How torch reaches the GPU: 'sass' (compiled), 'ptx' (JIT), 'ptx-unusable', 'none' or 'unknown'."""
    if g.capability is None or not b.arches:
        return "unknown"
    if any(not a.ptx and a.runs_on(g.capability) for a in b.arches):
        return "sass"
    if any(a.ptx and a.runs_on(g.capability) for a in b.arches):
        return "ptx-unusable" if _driver_behind_minor(facts, b) else "ptx"
    return "none"


def _rule_kernels(facts: RuntimeFacts, b: Build) -> list[Finding]:
    """Each GPU's compute capability against the arch list compiled into torch."""
    drv, found = facts.driver_cuda, []
    if not b.arches:
        found.append(Finding(Status.OK, "torch reported no arch list; kernel coverage not checked"))
    built_for = ", ".join(a.name for a in b.arches)
    for g in facts.gpus:
        kernels = _kernels(g, facts, b)
        if kernels in ("sass", "unknown"):
            continue
        assert g.capability is not None
        sm, head = f"sm_{g.capability[0]}{g.capability[1]}", f"GPU {g.index} ({g.name}, sm_{g.capability[0]}{g.capability[1]})"
        ptx = [a for a in b.arches if a.ptx and a.runs_on(g.capability)]
        if kernels == "ptx":
            found.append(Finding(Status.WARN, f"{head} has no compiled kernels in {b.label} (built for {built_for}); it "
                                 f"runs only by JIT-compiling {ptx[-1].name} PTX, which makes the first start take "
                                 f"minutes; expected a build with {sm}",
                                 _pip_fix(b.version, drv) + f"  # a build whose arch list has {sm}"))
        elif kernels == "ptx-unusable":
            found.append(Finding(Status.FAIL, f"{head} is reachable only through {ptx[-1].name} PTX, and driver "
                                 f"{facts.driver_version} (CUDA {_cap(drv) if drv else '?'}) is older than the toolkit "
                                 "that made it (minor version compatibility does not JIT newer PTX): \"no kernel image is "
                                 f"available\"; expected a driver for CUDA >= {_cap(b.cuda or (0, 0))}",
                                 "upgrade the NVIDIA driver, or " + _pip_fix(b.version, drv)))
        else:
            older = all((a.major, a.minor) > g.capability for a in b.arches)
            found.append(Finding(Status.FAIL, f"{head} is not supported by {b.label}: it carries kernels for {built_for} "
                                 "only (\"no kernel image is available for execution on the device\"); expected "
                                 f"{sm} in torch.cuda.get_arch_list()",
                                 (_old_gpu_fix(b, sm, facts) if older
                                  else _pip_fix(None, drv) + f"  # a newer torch whose arch list has {sm}")))
    return found


def _old_gpu_fix(b: Build, sm: str, facts: RuntimeFacts) -> str:
    """A GPU older than every arch of the build: from torch 2.8 the CUDA 12.8+ builds left out
    sm_50-sm_70, and the same release's CUDA 12.6 build still has them (helper-97), where the
    driver runs CUDA 12.6 (helper-98: it was offered to a CUDA 11.8 driver)."""
    drv, floor = facts.driver_cuda, MIN_DRIVER_FOR_MAJOR[KEEPS_OLD_GPUS[0]]
    runs_it = drv is None or (drv >= KEEPS_OLD_GPUS or (drv[0] == KEEPS_OLD_GPUS[0]
                                                          and not _driver_below(facts.driver_version, floor)))
    if b.cuda is not None and b.cuda >= (12, 8) and runs_it:
        return _pip_fix(b.version, None, KEEPS_OLD_GPUS) + f"  # the CUDA 12.6 builds still carry {sm}"
    return f"this GPU is older than the build supports: install an older torch release built for {sm}"


def _rule_torch_sees_no_cuda(facts: RuntimeFacts, b: Build) -> list[Finding]:
    """NVML sees GPUs but torch.cuda.is_available() says no: driver libraries or masking."""
    t = facts.torch
    if t.get("cuda_available") is not False:
        return []
    said = "; ".join(w for w in (t.get("warnings") or []) if "CUDA" in w or "driver" in w)[:400]
    return [Finding(Status.WARN, f"torch.cuda.is_available() is False in {t.get('python')} although NVML sees "
                    f"{_node(facts.gpus)}" + (f": {said}" if said else "") + "; expected True",
                    "nvidia-smi  # then check CUDA_VISIBLE_DEVICES and that the driver's libcuda is visible to the job")]


def _rule_cudnn(facts: RuntimeFacts, b: Build) -> list[Finding]:
    """cuDNN that does not load, or a build without it."""
    t, drv = facts.torch, facts.driver_cuda
    errors = t.get("errors") or {}
    if errors.get("cudnn_version") and facts.skip_cudnn_check == "1":  # helper-86: torch loads it anyway
        return [Finding(Status.WARN, f"{b.label} loads a cuDNN it was not built for, because {SKIP_CUDNN_CHECK}=1 "
                        f"skips torch's check ({errors['cudnn_version'][:300]}): it may fail or compute wrongly",
                        f"unset {SKIP_CUDNN_CHECK}; remove other cuDNN copies from LD_LIBRARY_PATH, or "
                        + _pip_fix(b.version, drv))]
    if errors.get("cudnn_version"):
        return [Finding(Status.FAIL, f"cuDNN does not load for {b.label}: {errors['cudnn_version'][:300]}",
                        "remove other cuDNN copies from LD_LIBRARY_PATH, or " + _pip_fix(b.version, drv))]
    if t.get("cudnn_available") is False:  # None: read from files and no cuDNN file found, not known absent
        return [Finding(Status.WARN, f"{b.label} has no cuDNN: convolutions and RNNs fall back to slow native kernels; "
                        "expected cuDNN", _pip_fix(b.version, drv))]
    return []


# The rules for a CUDA build on a node with GPUs, in the order their messages read best.
CUDA_RULES = (_rule_driver_vs_build, _rule_kernels, _rule_torch_sees_no_cuda, _rule_cudnn)


def _facts_out(facts: RuntimeFacts, b: Build) -> dict[str, Any]:
    t = facts.torch
    out: dict[str, Any] = {
        "python": t.get("python"),
        "torch_version": b.version,
        "torch_cuda_version": b.cuda_text,
        "torch_hip_version": b.hip_text,
        "cudnn_version": t.get("cudnn_version"),
        "cudnn_version_text": b.cudnn_text,
        "arch_list": [a.name for a in b.arches] + list(b.unknown_arches),
        "torch_cuda_available": t.get("cuda_available"),
        "driver_version": facts.driver_version,
        "driver_cuda_version": _cap(facts.driver_cuda) if facts.driver_cuda else None,
        "gpu_count": len(facts.gpus),
        "probe_cached": t.get("probe_cached"),
    }
    if facts.nvml_reason:
        out["nvml_unavailable"] = facts.nvml_reason
    if facts.launch_blocking is not None:
        out["CUDA_LAUNCH_BLOCKING"] = facts.launch_blocking
    if facts.files_missing or facts.libraries_missing:  # what the import-failure finding names (helper-87)
        out["torch_dir"] = t.get("torch_dir")
        out["missing_files"] = list(facts.files_missing)
        out["libraries_missing"] = dict(facts.libraries_missing or {})
    return out


def _no_gpu(facts: RuntimeFacts, b: Build) -> str:
    where = f"NVML: {short_reason(facts.nvml_reason)}" if facts.nvml_reason else "NVML sees 0 GPUs"
    if b.cuda is not None:
        return (f"no NVIDIA GPU visible ({where}); {b.label} is a CUDA build: if this node has GPUs, "
                f"the container was started without them (docker run --gpus all)")
    build = "a ROCm build" if b.hip_text else "CPU-only"
    return f"no NVIDIA GPU visible ({where}); {b.label} is {build}: nothing to match"


def judge(facts: RuntimeFacts, settings: Mapping[str, Any]) -> Result:
    b = _build(facts.torch)
    out = _facts_out(facts, b)
    findings = (_rule_import_fails(facts, b) + _rule_build_unreadable(facts, b) + _rule_launch_blocking(facts, b)
                + _rule_torch_replaced(facts, b))
    if not facts.gpus:
        out["findings"] = [f.message for f in findings]
        base = _no_gpu(facts, b)
        return verdict(findings, out, "", note=base) if findings else skip(base, **out)
    findings += _rule_not_a_cuda_build(facts, b)
    if b.cuda is not None:
        findings += [finding for rule in CUDA_RULES for finding in rule(facts, b)]
        rows = [{"index": g.index, "name": g.name, "capability": _cap(g.capability) if g.capability else None,
                 "kernels": _kernels(g, facts, b)} for g in facts.gpus]
        out["gpus"] = rows
        out["arch_supported"] = {str(r["index"]): int(r["kernels"] in ("sass", "ptx"))
                                 for r in rows if r["kernels"] != "unknown"}
    out["findings"] = [f.message for f in findings]
    caps = sorted({r["capability"] for r in out.get("gpus", []) if r["capability"]})
    drv = facts.driver_cuda
    ok_summary = (f"{b.label} matches driver {facts.driver_version} (CUDA {_cap(drv)})" if drv else
                  f"{b.label} with driver {facts.driver_version} (its CUDA version not reported: match not checked)")
    ok_summary = (ok_summary
                  + f" and {_node(facts.gpus)}" + (f" [{', '.join(caps)}]" if out.get("gpus") else ""))
    return verdict(findings, out, ok_summary)


CHECK = Check(
    id="cuda.runtime",
    title="torch's CUDA build matches the driver, the GPUs' architectures and cuDNN",
    gather=gather,
    judge=judge,
    modes=("check", "serve", "exec", "inprocess"),  # torch facts and NVML: no CUDA context
    intrusive=False,
    explain=__doc__ or "",
    needs=("torch",),
    timeout=90.0,
    metrics=(
        Metric("cuda_arch_supported", "arch_supported",
               "1 when torch carries kernels (machine code or usable PTX) for the GPU's compute capability, else 0",
               label="gpu"),
    ),
)
