"""cuDNN and determinism settings: benchmark, deterministic, and cuBLAS's workspace.

What it reads
  - torch.backends.cudnn.enabled / .benchmark / .deterministic,
    torch.are_deterministic_algorithms_enabled() and its warn_only flag: values a
    script sets at run time, so only a running torch knows them. From inside the
    script, `envdoctor.preflight()` reads the live values; an attached job
    (envdoctor.attach) publishes them for `check --pid` and serve. Otherwise
    `envdoctor check` reads torch from its files and never imports it (README,
    "How torch facts are gathered"): these facts are null, and only the
    environment's part is judged (a short probe in the interpreter runs only
    where no file says where its torch is, and then gives its defaults);
  - CUBLAS_WORKSPACE_CONFIG from the target's environment;
  - whether torch can use CUDA here (a CUDA build, from torch's version.py, and
    NVML's GPU count): on a CPU-only torch or a node without GPUs these settings
    change nothing.

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
         CUBLAS_WORKSPACE_CONFIG malformed (not ":SIZE:COUNT" pairs of integers;
         for a CPU-only torch, which has no cuBLAS, said in the skip instead);
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

from collections import namedtuple

from envdoctor.check import Check
from envdoctor.errors import ParseError, Unavailable
from envdoctor.model import Finding, Result, Status, skip, verdict

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping

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


class CudnnFacts(namedtuple("CudnnFacts", (
        "torch",  # Mapping[str, Any]
        "workspace_config",  # str | None: CUBLAS_WORKSPACE_CONFIG as set; None when unset
        "nvml_gpus",  # int | None = None: GPUs NVML sees; None when NVML is not here or was not asked
        "env_error",  # str | None = None
), defaults=(None, None))):
    __slots__ = ()


LIVE_KEYS = ("cudnn_enabled", "cudnn_benchmark", "cudnn_deterministic", "deterministic_algorithms",
             "deterministic_warn_only")


def gather(ctx) -> CudnnFacts:
    t = ctx.torch
    value, env_error = ctx.env_var(VAR)
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


def _workspace_fix(status: Status, message: str) -> Finding:
    """A finding whose fix is CUBLAS_WORKSPACE_CONFIG=:4096:8, as text and as an env change."""
    return Finding(status, message, f"export {VAR}=:4096:8", env={VAR: ":4096:8"})


def _rule_workspace_malformed(facts: CudnnFacts) -> list[Finding]:
    """CUBLAS_WORKSPACE_CONFIG set but not ':SIZE:COUNT' pairs: cuBLAS ignores it."""
    if facts.workspace_config is None:
        return []
    try:
        parse_cublas_workspace_config(facts.workspace_config)
    except ParseError as exc:
        return [_workspace_fix(Status.WARN, f"{exc}; cuBLAS cannot read it as a workspace setting")]
    return []


def _rule_cudnn_disabled(t: Mapping[str, Any]) -> list[Finding]:
    """cudnn.enabled=False on CUDA: convolutions and RNNs fall back to slow kernels."""
    if t.get("cudnn_enabled") is not False:
        return []
    return [Finding(Status.WARN, "torch.backends.cudnn.enabled is False: convolutions and RNNs run on slow native "
                    "kernels; expected True", "torch.backends.cudnn.enabled = True")]


def _rule_benchmark_and_deterministic(t: Mapping[str, Any]) -> list[Finding]:
    """benchmark picks algorithms by timing, which undoes deterministic."""
    if not (t.get("cudnn_benchmark") and t.get("cudnn_deterministic")):
        return []
    return [Finding(Status.WARN, "cudnn.benchmark=True with cudnn.deterministic=True: benchmark picks algorithms by "
                    "timing, so runs can still differ; expected benchmark=False for reproducible runs",
                    "torch.backends.cudnn.benchmark = False")]


def _rule_deterministic_without_workspace(t: Mapping[str, Any], cfg: str | None) -> list[Finding]:
    """Deterministic algorithms need CUBLAS_WORKSPACE_CONFIG=:4096:8 or :16:8, or the first matmul raises."""
    if not t.get("deterministic_algorithms") or (cfg is not None and cfg.strip() in DETERMINISTIC_CONFIGS):
        return []
    observed = f"{VAR}={cfg!r}" if cfg is not None else f"{VAR} is unset"
    if t.get("deterministic_warn_only"):
        return [_workspace_fix(Status.WARN, f"deterministic algorithms are on (warn_only) but {observed}: cuBLAS "
                               "results are not reproducible and torch warns at every matmul; expected ':4096:8' or ':16:8'")]
    return [_workspace_fix(Status.FAIL, f"torch.use_deterministic_algorithms(True) is on but {observed}: the first "
                           "cuBLAS matmul raises \"Deterministic behavior was enabled ... uses CuBLAS\"; expected "
                           "':4096:8' or ':16:8'")]


def _facts_out(facts: CudnnFacts) -> dict[str, Any]:
    t, cfg = facts.torch, facts.workspace_config
    out: dict[str, Any] = {
        "cudnn_enabled": t.get("cudnn_enabled"), "cudnn_benchmark": t.get("cudnn_benchmark"),
        "cudnn_deterministic": t.get("cudnn_deterministic"), "deterministic_algorithms": t.get("deterministic_algorithms"),
        "deterministic_warn_only": t.get("deterministic_warn_only"),
        VAR: cfg, "live_settings": bool(t.get("live")), "torch_version": t.get("torch_version"),
        "torch_cuda_version": t.get("torch_cuda_version"), "torch_cuda_available": t.get("cuda_available"),
        "probe_cached": t.get("probe_cached"),
    }
    if facts.env_error:
        out["env_unavailable"] = facts.env_error
    try:
        if cfg is not None:
            out["cublas_workspace"] = [{"size_kib": s, "count": c} for s, c in parse_cublas_workspace_config(cfg)]
    except ParseError:
        pass
    out["cublas_deterministic"] = cfg is not None and cfg.strip() in DETERMINISTIC_CONFIGS
    out["applies"] = bool(t.get("torch_cuda_version")) and (bool(t.get("cuda_available")) or bool(facts.nvml_gpus))
    return out


def _settings_line(t: Mapping[str, Any], cfg: str | None) -> str:
    benchmark = t.get("cudnn_benchmark")
    trade_off = ("benchmark=True (autotunes per input shape: fastest when shapes are fixed, slow and memory-hungry "
                 "when they vary)" if benchmark else
                 "benchmark=?" if benchmark is None else  # read from files: only the running job knows
                 "benchmark=False (default algorithms: steady when shapes vary; set True for fixed shapes to gain speed)")
    return (f"cudnn enabled={_flag(t.get('cudnn_enabled'))}, {trade_off}, deterministic={_flag(t.get('cudnn_deterministic'))}, "
            f"deterministic algorithms={_flag(t.get('deterministic_algorithms'))}, {VAR}={cfg if cfg is not None else 'unset'}")


def judge(facts: CudnnFacts, settings: Mapping[str, Any]) -> Result:
    t, cfg = dict(facts.torch), facts.workspace_config
    out = _facts_out(facts)
    findings = _rule_workspace_malformed(facts)
    if not out["applies"]:
        cpu_only = not t.get("torch_cuda_version")
        state = "is CPU-only" if cpu_only else "cannot use CUDA here (no GPU visible)"
        why = f"torch {t.get('torch_version')} {state}: cuDNN and cuBLAS settings have no effect"
        if cpu_only and findings:  # no cuBLAS at all: a malformed setting is said, not warned (helper-42)
            why += "; " + "; ".join(f.message for f in findings)
            findings = []
        return verdict(findings, out, "", note=why) if findings else skip(why, **out)
    findings += (_rule_cudnn_disabled(t) + _rule_benchmark_and_deterministic(t)
                 + _rule_deterministic_without_workspace(t, cfg))
    out["findings"] = [f.message for f in findings]
    source = ("live settings" if t.get("live") else
              "flags unknown from torch's files; envdoctor.preflight() in the script checks its live settings"
              if t.get("source") == "files" else
              "interpreter defaults; envdoctor.preflight() in the script checks its live settings")
    return verdict(findings, out, _settings_line(t, cfg), note=source)


CHECK = Check(
    id="torch.cudnn",
    title="cuDNN benchmark/deterministic flags and CUBLAS_WORKSPACE_CONFIG agree with each other",
    gather=gather,
    judge=judge,
    # No CUDA context (the probe reads flags only); in exec its fix_env sets the workspace variable.
    modes=("check", "serve", "exec", "inprocess"),
    intrusive=False,
    explain=__doc__ or "",
    needs=("torch",),
    timeout=90.0,
)
