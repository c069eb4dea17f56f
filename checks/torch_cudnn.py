"""cuDNN and determinism settings: benchmark, deterministic, and cuBLAS's workspace.

What it reads
  - torch.backends.cudnn.enabled / .benchmark / .deterministic,
    torch.are_deterministic_algorithms_enabled() and its warn_only flag. From
    `envdoctor check` these come from the torch probe, so they are the
    interpreter's defaults (a script sets them at run time); from inside the
    script, `envdoctor.preflight()` reads the live values the script has set;
  - CUBLAS_WORKSPACE_CONFIG from the target's environment;
  - whether torch can use CUDA here (probe, and NVML's GPU count): on a
    CPU-only torch or a node without GPUs these settings change nothing.

Why it matters (PITFALLS 6)
  cudnn.benchmark=True times every candidate convolution algorithm for each new
  input shape and keeps the fastest: a win when shapes are fixed, a loss when
  they vary (each new shape pays for the search again, and the search can take
  GBs of GPU memory). cudnn.deterministic=True restricts cuDNN to deterministic
  algorithms, but with benchmark also on, the algorithm picked still depends on
  timing noise, so two runs can differ: reproducibility needs benchmark=False.
  torch.use_deterministic_algorithms(True) makes cuBLAS operations raise
  "RuntimeError: Deterministic behavior was enabled ... but this operation is not
  deterministic because it uses CuBLAS and you have CUDA >= 10.2" unless
  CUBLAS_WORKSPACE_CONFIG is exactly ":4096:8" or ":16:8" (torch compares the
  string) - in the middle of a run, at the first matmul.

Statuses
  fail   deterministic algorithms are required (without warn_only) on CUDA and
         CUBLAS_WORKSPACE_CONFIG is not ":4096:8" or ":16:8".
  warn   benchmark and deterministic both on; cudnn.enabled=False on CUDA;
         CUBLAS_WORKSPACE_CONFIG malformed (not ":SIZE:COUNT" pairs of integers);
         deterministic algorithms in warn_only mode without the workspace config.
  skip   torch cannot use CUDA here (CPU-only build, or no GPU): the settings do
         nothing; the facts still list them.
  ok     otherwise; the summary states the benchmark trade-off in force.

How to fix
  export CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8, less memory, slower);
  torch.backends.cudnn.benchmark = False where inputs vary in shape or runs must
  be reproducible; torch.backends.cudnn.enabled = True.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from envdoctor.check import Check
from envdoctor.errors import ParseError, Unavailable
from envdoctor.model import Result, Status, fail, ok, skip, warn

VAR = "CUBLAS_WORKSPACE_CONFIG"
DETERMINISTIC_CONFIGS = (":4096:8", ":16:8")  # the two strings torch accepts (aten Context::checkCuBLASConfigDeterministic)
_MAX_DIGITS = 12


def parse_cublas_workspace_config(text: Any) -> tuple[tuple[int, int], ...]:
    """':4096:8' -> ((4096, 8),); ':4096:2:16:8' -> ((4096, 2), (16, 8)).

    cuBLAS reads the variable as one or more ':SIZE:COUNT' pairs (SIZE in KiB,
    COUNT buffers). Anything else is a ParseError.
    """
    if not isinstance(text, str):
        raise ParseError(f"{VAR} must be text, got {type(text).__name__}")
    value = text.strip()
    if not value:
        raise ParseError(f"{VAR} is set but empty; expected ':SIZE:COUNT' such as ':4096:8'")
    if not value.startswith(":"):
        raise ParseError(f"{VAR}={value!r} must start with ':' (':SIZE:COUNT', such as ':4096:8')")
    parts = value[1:].split(":")
    if len(parts) % 2:
        raise ParseError(f"{VAR}={value!r} has an odd number of fields; expected ':SIZE:COUNT' pairs")
    pairs = []
    for i in range(0, len(parts), 2):
        size, count = parts[i], parts[i + 1]
        for field in (size, count):
            if not field.isascii() or not field.isdigit() or len(field) > _MAX_DIGITS:
                raise ParseError(f"{VAR}={value!r}: {field!r} is not a positive integer")
        if int(size) == 0 or int(count) == 0:
            raise ParseError(f"{VAR}={value!r}: sizes and counts must be positive")
        pairs.append((int(size), int(count)))
    return tuple(pairs)


@dataclass(frozen=True)
class CudnnFacts:
    torch: Mapping[str, Any]
    workspace_config: str | None  # CUBLAS_WORKSPACE_CONFIG as set; None when unset
    nvml_gpus: int | None = None  # GPUs NVML sees; None when NVML is not here or was not asked
    env_error: str | None = None


LIVE_KEYS = ("cudnn_enabled", "cudnn_benchmark", "cudnn_deterministic", "deterministic_algorithms",
             "deterministic_warn_only")


def gather(ctx) -> CudnnFacts:
    t = ctx.torch
    value, env_error = None, None
    try:
        value = ctx.env.get(VAR)
    except Unavailable as exc:
        env_error = str(exc)
    from envdoctor.attach_reader import live_facts

    live = live_facts(ctx)
    if live.torch is not None:
        # the attached job's own flags and environment, as it runs now (envdoctor.attach)
        t = {**t, **{k: live.torch[k] for k in LIVE_KEYS if isinstance(live.torch.get(k), bool)}, "live": True}
        value, env_error = live.env.get(VAR), None
    gpus = None
    if t.get("torch_cuda_version") and not t.get("cuda_available"):
        # torch says no CUDA; NVML tells "no GPU here" apart from "GPU here, torch can't see it".
        nvml = ctx.nvml_or_none()
        if nvml is not None:
            try:
                gpus = int(nvml.device_count())
            except Unavailable:
                gpus = None
    return CudnnFacts(t, value, gpus, env_error)


def _flag(value: Any) -> str:
    return "?" if value is None else ("True" if value else "False")


def judge(facts: CudnnFacts, config: Mapping[str, Any]) -> Result:
    t = dict(facts.torch)
    enabled, benchmark = t.get("cudnn_enabled"), t.get("cudnn_benchmark")
    deterministic = t.get("cudnn_deterministic")
    det_algos, warn_only = t.get("deterministic_algorithms"), t.get("deterministic_warn_only")
    live = bool(t.get("live"))
    cfg = facts.workspace_config
    out: dict[str, Any] = {
        "cudnn_enabled": enabled, "cudnn_benchmark": benchmark, "cudnn_deterministic": deterministic,
        "deterministic_algorithms": det_algos, "deterministic_warn_only": warn_only,
        VAR: cfg, "live_settings": live, "torch_version": t.get("torch_version"),
        "torch_cuda_version": t.get("torch_cuda_version"), "torch_cuda_available": t.get("cuda_available"),
        "probe_cached": t.get("probe_cached"),
    }
    if facts.env_error:
        out["env_unavailable"] = facts.env_error
    findings: list[tuple[Status, str, str]] = []

    parsed = None
    if cfg is not None:
        try:
            parsed = parse_cublas_workspace_config(cfg)
            out["cublas_workspace"] = [{"size_kib": s, "count": c} for s, c in parsed]
        except ParseError as exc:
            findings.append((Status.WARN, f"{exc}; cuBLAS cannot read it as a workspace setting", f"export {VAR}=:4096:8"))
    cublas_deterministic = cfg is not None and cfg.strip() in DETERMINISTIC_CONFIGS
    out["cublas_deterministic"] = cublas_deterministic

    on_cuda = bool(t.get("torch_cuda_version")) and (bool(t.get("cuda_available")) or bool(facts.nvml_gpus))
    out["applies"] = on_cuda
    if not on_cuda:
        if not t.get("torch_cuda_version"):
            why = f"torch {t.get('torch_version')} is CPU-only: cuDNN and cuBLAS settings have no effect"
        else:
            why = f"torch {t.get('torch_version')} cannot use CUDA here (no GPU visible): cuDNN and cuBLAS settings have no effect"
        if not findings:
            return skip(why, **out)
        status, text, fix = findings[0]
        return warn(f"{text}; {why}", fix, **out)

    if enabled is False:
        findings.append((Status.WARN,
                         "torch.backends.cudnn.enabled is False: convolutions and RNNs run on slow native kernels; expected True",
                         "torch.backends.cudnn.enabled = True"))
    if benchmark and deterministic:
        findings.append((Status.WARN,
                         "cudnn.benchmark=True with cudnn.deterministic=True: benchmark picks algorithms by timing, "
                         "so runs can still differ; expected benchmark=False for reproducible runs",
                         "torch.backends.cudnn.benchmark = False"))
    if det_algos and not cublas_deterministic:
        observed = f"{VAR}={cfg!r}" if cfg is not None else f"{VAR} is unset"
        if warn_only:
            findings.append((Status.WARN,
                             f"deterministic algorithms are on (warn_only) but {observed}: cuBLAS results are not "
                             "reproducible and torch warns at every matmul; expected ':4096:8' or ':16:8'",
                             f"export {VAR}=:4096:8"))
        else:
            findings.append((Status.FAIL,
                             f"torch.use_deterministic_algorithms(True) is on but {observed}: the first cuBLAS matmul "
                             "raises \"Deterministic behavior was enabled ... uses CuBLAS\"; expected ':4096:8' or ':16:8'",
                             f"export {VAR}=:4096:8"))

    trade_off = ("benchmark=True (autotunes per input shape: fastest when shapes are fixed, slow and memory-hungry "
                 "when they vary)" if benchmark else
                 "benchmark=False (default algorithms: steady when shapes vary; set True for fixed shapes to gain speed)")
    settings = (f"cudnn enabled={_flag(enabled)}, {trade_off}, deterministic={_flag(deterministic)}, "
                f"deterministic algorithms={_flag(det_algos)}, {VAR}={cfg if cfg is not None else 'unset'}")
    source = "live settings" if live else "interpreter defaults; envdoctor.preflight() in the script checks its live settings"
    out["findings"] = [text for _, text, _ in findings]
    if not findings:
        return ok(f"{settings} ({source})", **out)
    findings.sort(key=lambda f: -f[0].severity)
    status = findings[0][0]
    summary = "; ".join(text for _, text, _ in findings) + f" ({source})"
    return (fail if status is Status.FAIL else warn)(summary, findings[0][2], **out)


CHECK = Check(
    id="torch.cudnn",
    title="cuDNN benchmark/deterministic flags and CUBLAS_WORKSPACE_CONFIG agree with each other",
    run=lambda ctx: judge(gather(ctx), ctx.config),
    explain=__doc__ or "",
    needs=("torch",),
    timeout=90.0,
)
