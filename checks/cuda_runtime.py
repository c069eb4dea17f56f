"""CUDA runtime: does the torch build match the driver, the GPUs and cuDNN?

What it reads
  - from the torch probe (run in the target interpreter; torch is never imported
    in envdoctor's process): torch's version, the CUDA version it was built with
    (torch.version.cuda, None for a CPU-only build), the GPU architectures it
    carries kernels for (torch.cuda.get_arch_list(): sm_XY = compiled machine
    code, compute_XY = PTX), whether torch.cuda.is_available(), the cuDNN
    version (and the error torch raises when the cuDNN it finds does not match
    the one it was built with);
  - from NVML: the driver version, the highest CUDA version the driver supports,
    each GPU's name and compute capability (read here, not in the probe, because
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
         CUDA major is older than the build's (or older at all, before CUDA 11);
         a GPU torch has neither machine code nor usable PTX for; a GPU reachable
         only through PTX while the driver is older than the build; a cuDNN
         version mismatch.
  warn   driver older than the build within the same major (minor version
         compatibility: works, with limits); a GPU reachable only by JIT from
         PTX; torch.cuda.is_available() False although NVML sees GPUs; a CUDA
         build without cuDNN; CUDA_LAUNCH_BLOCKING=1.
  skip   no NVIDIA GPU visible here (NVML's reason is given) and nothing else
         found; a CPU-only torch on a CPU-only node is consistent, so there is
         nothing to match. The facts still carry the torch and CUDA versions.
  ok     the build matches the driver and every GPU.

How to fix
  Install the torch build for the driver you have (pip install torch==VERSION
  --index-url https://download.pytorch.org/whl/cuXYZ, XYZ no newer than the
  driver's CUDA version), or upgrade the driver; unset CUDA_LAUNCH_BLOCKING.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from envdoctor.check import Check, Metric
from envdoctor.errors import ParseError, Unavailable
from envdoctor.model import Result, Status, fail, join_fixes, ok, skip, warn

# CUDA variants of the official torch wheels (download.pytorch.org/whl/cuXYZ), newest last.
WHEEL_CUDA = ((11, 8), (12, 1), (12, 4), (12, 6), (12, 8), (12, 9), (13, 0))
# The oldest driver branch of each CUDA major (minor version compatibility's floor).
MIN_DRIVER_FOR_MAJOR = {11: "450.80.02", 12: "525.60.13", 13: "580"}
_ARCH = re.compile(r"^(sm|compute)_(\d{2,4})([af]?)$")


def _short(reason: str | None) -> str:
    """The first clause of NVML's reason, for a one-line summary (the facts keep it whole)."""
    text = reason or ""
    return text.split(": ", 1)[0] if len(text) > 80 else text


# -- parsers -------------------------------------------------------------------------


def parse_cuda_version(text: Any) -> tuple[int, int]:
    """'12.1' (torch.version.cuda) -> (12, 1); ParseError on anything else."""
    if not isinstance(text, str):
        raise ParseError(f"CUDA version must be text, got {type(text).__name__}")
    parts = text.strip().split(".")
    if len(parts) < 2 or not all(p.isascii() and p.isdigit() and len(p) <= 4 for p in parts[:2]):
        raise ParseError(f"{text!r} is not a CUDA version like '12.1'")
    return int(parts[0]), int(parts[1])


@dataclass(frozen=True)
class Arch:
    """One entry of torch.cuda.get_arch_list(): 'sm_86', 'sm_90a', 'compute_90'."""

    ptx: bool  # compute_XY: PTX, JIT-compiled by the driver
    major: int
    minor: int
    variant: str  # "" | "a" (arch-specific) | "f" (family-specific)

    @property
    def name(self) -> str:
        return f"{'compute' if self.ptx else 'sm'}_{self.major}{self.minor}{self.variant}"

    def runs_on(self, capability: tuple[int, int]) -> bool:
        major, minor = capability
        if self.variant == "a":
            return (major, minor) == (self.major, self.minor)
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


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    capability: tuple[int, int] | None


@dataclass(frozen=True)
class RuntimeFacts:
    torch: Mapping[str, Any]  # the probe's facts
    nvml_reason: str | None = None  # why NVML is not here; None when it is
    driver_version: str | None = None
    driver_cuda: tuple[int, int] | None = None
    gpus: tuple[Gpu, ...] = ()
    launch_blocking: str | None = None  # CUDA_LAUNCH_BLOCKING as set, None when unset
    env_error: str | None = None


def gather(ctx) -> RuntimeFacts:
    torch = ctx.torch
    launch_blocking, env_error = None, None
    try:
        launch_blocking = ctx.env.get("CUDA_LAUNCH_BLOCKING")
    except Unavailable as exc:
        env_error = str(exc)
    try:
        nvml = ctx.nvml
        driver = nvml.driver_version()
        driver_cuda = nvml.cuda_driver_version()
        gpus = tuple(Gpu(int(g.index), str(g.name or f"GPU {g.index}"), tuple(g.compute_capability) if g.compute_capability else None)
                     for g in nvml.devices() if not getattr(g, "lost", False))
    except Unavailable as exc:
        return RuntimeFacts(torch, nvml_reason=str(exc), launch_blocking=launch_blocking, env_error=env_error)
    return RuntimeFacts(torch, None, driver, tuple(driver_cuda) if driver_cuda else None, gpus, launch_blocking, env_error)


# -- judging -------------------------------------------------------------------------


@dataclass
class _Findings:
    items: list[tuple[Status, str, str]] = field(default_factory=list)

    def add(self, status: Status, text: str, fix: str = "") -> None:
        self.items.append((status, text, fix))

    @property
    def status(self) -> Status:
        return max((s for s, _, _ in self.items), key=lambda s: s.severity, default=Status.OK)

    def loudest(self) -> list[tuple[Status, str, str]]:
        return sorted(self.items, key=lambda item: -item[0].severity)


def _wheel_for(driver_cuda: tuple[int, int] | None) -> str:
    """The newest official wheel variant the driver runs with its full feature set;
    failing that, the oldest of the driver's major (minor version compatibility)."""
    if driver_cuda is None:
        return "cu128"
    fitting = [v for v in WHEEL_CUDA if v <= driver_cuda]
    same_major = [v for v in WHEEL_CUDA if v[0] == driver_cuda[0]]
    chosen = max(fitting) if fitting else (min(same_major) if same_major else WHEEL_CUDA[0])
    return f"cu{chosen[0]}{chosen[1]}"


def _pip_fix(torch_version: str | None, driver_cuda: tuple[int, int] | None) -> str:
    version = (torch_version or "").split("+", 1)[0]
    pin = f"torch=={version}" if version else "torch"
    return f"pip install --force-reinstall {pin} --index-url https://download.pytorch.org/whl/{_wheel_for(driver_cuda)}"


def _cap(c: tuple[int, int]) -> str:
    return f"{c[0]}.{c[1]}"


def judge(facts: RuntimeFacts, config: Mapping[str, Any]) -> Result:
    t = dict(facts.torch)
    found = _Findings()
    torch_version = t.get("torch_version")
    cuda_text, hip_text = t.get("torch_cuda_version"), t.get("torch_hip_version")
    build: tuple[int, int] | None = None
    if cuda_text:
        try:
            build = parse_cuda_version(cuda_text)
        except ParseError as exc:
            found.add(Status.WARN, f"torch reports an unreadable CUDA version: {exc}")
    arches, unknown_arches = [], []
    for entry in t.get("arch_list") or []:
        try:
            arches.append(parse_arch(entry))
        except ParseError:
            unknown_arches.append(str(entry))
    cudnn_text = format_cudnn_version(t.get("cudnn_version"))
    torch_label = f"torch {torch_version}" + (f" (CUDA {cuda_text}" + (f", cuDNN {cudnn_text})" if cudnn_text else ")") if cuda_text else "")
    gpus = facts.gpus
    facts_out: dict[str, Any] = {
        "python": t.get("python"),
        "torch_version": torch_version,
        "torch_cuda_version": cuda_text,
        "torch_hip_version": hip_text,
        "cudnn_version": t.get("cudnn_version"),
        "cudnn_version_text": cudnn_text,
        "arch_list": [a.name for a in arches] + unknown_arches,
        "torch_cuda_available": t.get("cuda_available"),
        "driver_version": facts.driver_version,
        "driver_cuda_version": _cap(facts.driver_cuda) if facts.driver_cuda else None,
        "gpu_count": len(gpus),
        "probe_cached": t.get("probe_cached"),
    }
    if facts.nvml_reason:
        facts_out["nvml_unavailable"] = facts.nvml_reason
    if facts.launch_blocking is not None:
        facts_out["CUDA_LAUNCH_BLOCKING"] = facts.launch_blocking

    # CUDA_LAUNCH_BLOCKING: a debugging switch; CUDA reads 1 as on.
    if (facts.launch_blocking or "").strip() == "1":
        found.add(Status.WARN, "CUDA_LAUNCH_BLOCKING=1 makes every kernel launch synchronous (a debugging setting); expected unset",
                  "unset CUDA_LAUNCH_BLOCKING")

    if not gpus:
        where = f"NVML: {_short(facts.nvml_reason)}" if facts.nvml_reason else "NVML sees 0 GPUs"
        if build is not None:
            base = (f"no NVIDIA GPU visible ({where}); {torch_label} is a CUDA build: if this node has GPUs, "
                    f"the container was started without them (docker run --gpus all)")
        elif hip_text:
            base = f"no NVIDIA GPU visible ({where}); {torch_label} is a ROCm build: nothing to match"
        else:
            base = f"no NVIDIA GPU visible ({where}); {torch_label} is CPU-only: nothing to match"
        facts_out["findings"] = [text for _, text, _ in found.items]
        if not found.items:
            return skip(base, **facts_out)
        return _result(found, base, facts_out, context=base)

    n = len(gpus)
    names = sorted({g.name for g in gpus})
    node = f"{n} NVIDIA GPU{'s' if n != 1 else ''} ({', '.join(names)})"

    # A torch with no CUDA at all on a GPU node (PITFALLS 9).
    if build is None:
        kind = f"a ROCm build (HIP {hip_text})" if hip_text else "a CPU-only build"
        found.add(Status.FAIL,
                  f"{torch_label} is {kind} on a node with {node}: the job cannot use them "
                  "(\"torch._C has no attribute _cuda_getDevice\" / \"Torch not compiled with CUDA enabled\"); "
                  "expected a CUDA build", _pip_fix(torch_version, facts.driver_cuda))
        facts_out["findings"] = [text for _, text, _ in found.items]
        return _result(found, "", facts_out)

    # Driver vs build.
    driver_too_old_minor = False
    drv = facts.driver_cuda
    if drv is None:
        found.add(Status.OK, "the driver did not report its CUDA version; driver/build match not checked")
    elif drv[0] < build[0] or (drv < build and build[0] < 11):
        floor = MIN_DRIVER_FOR_MAJOR.get(build[0])
        found.add(Status.FAIL,
                  f"driver {facts.driver_version} supports CUDA up to {_cap(drv)} but {torch_label} was built for "
                  f"CUDA {_cap(build)}: torch cannot use the GPUs (\"The NVIDIA driver on your system is too old\"); "
                  f"expected a driver for CUDA >= {_cap(build) if build[0] < 11 else f'{build[0]}.0'}"
                  + (f" (R{floor.split('.')[0]} or newer)" if floor else ""),
                  _pip_fix(torch_version, drv) + "  # or upgrade the NVIDIA driver")
    elif drv < build:
        driver_too_old_minor = True
        found.add(Status.WARN,
                  f"driver {facts.driver_version} supports CUDA {_cap(drv)}, older than {torch_label}'s CUDA "
                  f"{_cap(build)}: it runs through CUDA minor version compatibility, but PTX JIT and features newer "
                  f"than {_cap(drv)} are unavailable; expected a driver for CUDA >= {_cap(build)}",
                  _pip_fix(torch_version, drv) + "  # or upgrade the NVIDIA driver")

    # Kernels vs each GPU.
    supported: dict[str, int] = {}
    per_gpu: list[dict[str, Any]] = []
    if not arches:
        found.add(Status.OK, "torch reported no arch list; kernel coverage not checked")
    for g in gpus:
        row: dict[str, Any] = {"index": g.index, "name": g.name, "capability": _cap(g.capability) if g.capability else None}
        per_gpu.append(row)
        if g.capability is None or not arches:
            row["kernels"] = "unknown"
            continue
        sass = [a for a in arches if not a.ptx and a.runs_on(g.capability)]
        ptx = [a for a in arches if a.ptx and a.runs_on(g.capability)]
        sm = f"sm_{g.capability[0]}{g.capability[1]}"
        if sass:
            row["kernels"] = "sass"
            supported[str(g.index)] = 1
        elif ptx and not driver_too_old_minor:
            row["kernels"] = "ptx"
            supported[str(g.index)] = 1
            found.add(Status.WARN,
                      f"GPU {g.index} ({g.name}, {sm}) has no compiled kernels in {torch_label} (built for "
                      f"{', '.join(a.name for a in arches)}); it runs only by JIT-compiling {ptx[-1].name} PTX, "
                      "which makes the first start take minutes; expected a build with " + sm,
                      _pip_fix(torch_version, drv) + f"  # a build whose arch list has {sm}")
        elif ptx:
            row["kernels"] = "ptx-unusable"
            supported[str(g.index)] = 0
            found.add(Status.FAIL,
                      f"GPU {g.index} ({g.name}, {sm}) is reachable only through {ptx[-1].name} PTX, and driver "
                      f"{facts.driver_version} (CUDA {_cap(drv) if drv else '?'}) is older than the toolkit that made it "
                      "(minor version compatibility does not JIT newer PTX): \"no kernel image is available\"; "
                      "expected a driver for CUDA >= " + _cap(build),
                      "upgrade the NVIDIA driver, or " + _pip_fix(torch_version, drv))
        else:
            row["kernels"] = "none"
            supported[str(g.index)] = 0
            older = all((a.major, a.minor) > g.capability for a in arches)
            found.add(Status.FAIL,
                      f"GPU {g.index} ({g.name}, {sm}) is not supported by {torch_label}: it carries kernels for "
                      f"{', '.join(a.name for a in arches)} only (\"no kernel image is available for execution on the device\"); "
                      f"expected {sm} in torch.cuda.get_arch_list()",
                      (f"this GPU is older than the build supports: install an older torch release built for {sm}"
                       if older else _pip_fix(None, drv) + f"  # a newer torch whose arch list has {sm}"))
    facts_out["gpus"] = per_gpu
    facts_out["arch_supported"] = supported

    # torch's own view of the driver.
    if t.get("cuda_available") is False:
        said = "; ".join(w for w in (t.get("warnings") or []) if "CUDA" in w or "driver" in w)[:400]
        found.add(Status.WARN,
                  f"torch.cuda.is_available() is False in {t.get('python')} although NVML sees {node}"
                  + (f": {said}" if said else "") + "; expected True",
                  "nvidia-smi  # then check CUDA_VISIBLE_DEVICES and that the driver's libcuda is visible to the job")

    # cuDNN.
    errors = t.get("errors") or {}
    if errors.get("cudnn_version"):
        found.add(Status.FAIL, f"cuDNN does not load for {torch_label}: {errors['cudnn_version'][:300]}",
                  "remove other cuDNN copies from LD_LIBRARY_PATH, or " + _pip_fix(torch_version, drv))
    elif t.get("cudnn_available") is False:  # None: read from files and no cuDNN file found, not known absent
        found.add(Status.WARN, f"{torch_label} has no cuDNN: convolutions and RNNs fall back to slow native kernels; expected cuDNN",
                  _pip_fix(torch_version, drv))

    facts_out["findings"] = [text for _, text, _ in found.items]
    base = (f"{torch_label} matches driver {facts.driver_version}"
            + (f" (CUDA {_cap(drv)})" if drv else "")
            + f" and {node}"
            + (f" [{', '.join(sorted({row['capability'] for row in per_gpu if row['capability']}))}]" if per_gpu else ""))
    return _result(found, base, facts_out)


def _result(found: _Findings, ok_summary: str, facts: dict[str, Any], context: str = "") -> Result:
    status = found.status
    if status is Status.OK:
        return ok(ok_summary, **facts)
    loud = [item for item in found.loudest() if item[0].severity > 0]
    summary = "; ".join([text for _, text, _ in loud] + ([context] if context else []))
    fix = join_fixes(loud)
    return (fail if status is Status.FAIL else warn)(summary, fix, **facts)


CHECK = Check(
    id="cuda.runtime",
    title="torch's CUDA build matches the driver, the GPUs' architectures and cuDNN",
    run=lambda ctx: judge(gather(ctx), ctx.config),
    explain=__doc__ or "",
    needs=("torch",),
    timeout=90.0,
    metrics=(
        Metric("cuda_arch_supported", "arch_supported",
               "1 when torch carries kernels (machine code or usable PTX) for the GPU's compute capability, else 0",
               label="gpu"),
    ),
)
