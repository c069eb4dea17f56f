"""envdoctor.preflight(): check a training script's LIVE settings from inside it.

`envdoctor check` sees a fresh interpreter's defaults; the script is what sets
cudnn.benchmark, use_deterministic_algorithms(), set_num_threads() and
CUDA_VISIBLE_DEVICES. Called near the top of a training script,

    import envdoctor
    envdoctor.preflight()                 # prints a compact report to stderr
    envdoctor.preflight(strict=True)      # ... and raises PreflightError on a `fail`

runs the registered checks that declare the `inprocess` mode in this process
(the intrusive ones, torch.pin_memory's measurement and onnx.opset's onnxruntime,
stay out of the script) with torch facts read from the torch this script already imported (imported here if it was not: the script asked),
instead of from a probe subprocess.

It never initialises CUDA itself: creating a context costs GPU memory, and
initialising CUDA before the script forks DataLoader workers breaks them
("Cannot re-initialize CUDA in forked subprocess"). So it reads only what is
safe before initialisation: torch.version.cuda, the compiled arch list,
torch.cuda.is_initialized(), and the GPU count from NVML (not
torch.cuda.is_available(), which runs cuInit). When the script has already
initialised CUDA, device counts and memory_reserved / memory_allocated come from
torch (they create nothing then). That state is judged by an ordinary check,
`preflight.live` (checks/preflight_live.py, mode `inprocess` only), and printed
by the `compact` exporter: the runner, redaction and printing are the same as
everywhere else.
"""

from __future__ import annotations

import os
import sys

from envdoctor.errors import ConfigError, Unavailable
from envdoctor.model import Result, Status

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import IO, Any, Iterable, Mapping

LIVE_CHECK_ID = "preflight.live"
GIB = 1024**3


class PreflightError(Exception):
    """preflight(strict=True) found a `fail`; `.results` holds every result."""

    def __init__(self, results: list[Result]):
        self.results = results
        failed = [r for r in results if r.status is Status.FAIL]
        lines = "; ".join(f"{r.check}: {r.summary}" for r in failed)
        super().__init__(f"envdoctor preflight: {len(failed)} check(s) failed: {lines}")


# -- live torch facts -----------------------------------------------------------------


def _import_torch() -> Any:
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch
    try:
        import torch  # noqa: F811  (the script asked for a preflight of its torch)
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            raise Unavailable(f"no torch in {sys.executable}") from None
        raise
    return torch


def _get(errors: dict[str, str], name: str, fn, default=None):
    try:
        return fn()
    except Exception as exc:  # one unreadable setting must not hide the others
        errors[name] = f"{type(exc).__name__}: {exc}"
        return default


def _nvml_count(session) -> int | None:
    try:
        return int(session.need("nvml").device_count())
    except Unavailable:
        return None


def live_torch_facts(session, torch: Any = None) -> dict[str, Any]:
    """The same keys as the torch probe's facts, read from this process's torch.

    Touches only calls that cannot initialise CUDA; see the module docstring.
    """
    from envdoctor.probe import torch_probe  # standard library only; shares the probe's helpers

    torch = _import_torch() if torch is None else torch
    errors: dict[str, str] = {}
    version = getattr(torch, "version", None)
    cuda = torch.cuda
    torch_dir = os.path.dirname(os.path.abspath(getattr(torch, "__file__", "") or "."))
    facts: dict[str, Any] = {
        "live": True,
        "probe_cached": False,
        "python": sys.executable,
        "torch": True,
        "torch_version": str(getattr(torch, "__version__", "")),
        "torch_dir": torch_dir,
        "torch_cuda_version": getattr(version, "cuda", None),
        "torch_hip_version": getattr(version, "hip", None),
        "git_version": getattr(version, "git_version", None),
    }
    compiled = facts["torch_cuda_version"] is not None
    facts["cuda_compiled"] = compiled
    facts["arch_list"] = _get(errors, "arch_list", lambda: list(cuda.get_arch_list()), []) if compiled else []
    initialized = bool(_get(errors, "cuda_initialized", cuda.is_initialized, False))
    facts["cuda_initialized"] = initialized
    nvml_count = _nvml_count(session)
    facts["nvml_device_count"] = nvml_count
    if initialized:
        # Safe now: the script already paid for initialisation; these read torch's state.
        facts["device_count"] = _get(errors, "device_count", lambda: int(cuda.device_count()), 0)
        facts["cuda_available"] = facts["device_count"] > 0
        facts["cuda_available_source"] = "torch (CUDA already initialised)"
        memory = {}
        for i in range(facts["device_count"] or 0):
            reserved = _get(errors, f"memory_reserved[{i}]", lambda i=i: int(cuda.memory_reserved(i)))
            allocated = _get(errors, f"memory_allocated[{i}]", lambda i=i: int(cuda.memory_allocated(i)))
            memory[str(i)] = {"reserved_bytes": reserved, "allocated_bytes": allocated}
        facts["cuda_memory"] = memory
    else:
        # Not torch.cuda.is_available(): it runs cuInit in this process.
        facts["device_count"] = nvml_count or 0
        facts["cuda_available"] = bool(compiled and nvml_count)
        facts["cuda_available_source"] = "NVML (CUDA not initialised; not initialising it)"
    backends = torch.backends
    cudnn = backends.cudnn
    facts["cudnn_available"] = bool(_get(errors, "cudnn_available", cudnn.is_available, False)) if compiled else False
    # cudnn.version() loads libcudnn and reads its version: host-side only, no context.
    facts["cudnn_version"] = _get(errors, "cudnn_version", cudnn.version) if facts["cudnn_available"] else None
    facts["cudnn_enabled"] = _get(errors, "cudnn_enabled", lambda: bool(cudnn.enabled))
    facts["cudnn_benchmark"] = _get(errors, "cudnn_benchmark", lambda: bool(cudnn.benchmark))
    facts["cudnn_deterministic"] = _get(errors, "cudnn_deterministic", lambda: bool(cudnn.deterministic))
    facts["deterministic_algorithms"] = _get(errors, "deterministic_algorithms",
                                             lambda: bool(torch.are_deterministic_algorithms_enabled()))
    facts["deterministic_warn_only"] = _get(errors, "deterministic_warn_only",
                                            lambda: bool(torch.is_deterministic_algorithms_warn_only_enabled()))
    facts["num_threads"] = _get(errors, "num_threads", lambda: int(torch.get_num_threads()))
    facts["num_interop_threads"] = _get(errors, "num_interop_threads", lambda: int(torch.get_num_interop_threads()))
    onnx_constants = sys.modules.get("torch.onnx._constants")
    opset = getattr(onnx_constants, "ONNX_DEFAULT_OPSET", None) if onnx_constants else None
    facts["onnx_default_opset"] = opset if isinstance(opset, int) else torch_probe._onnx_default_opset(torch_dir)
    newest = getattr(onnx_constants, "ONNX_MAX_OPSET", None) if onnx_constants else None
    facts["onnx_max_opset"] = newest if isinstance(newest, int) else torch_probe._onnx_default_opset(torch_dir, ("ONNX_MAX_OPSET",))
    facts["errors"] = errors
    facts["warnings"] = []
    return facts


# -- running --------------------------------------------------------------------------


def judge_live(facts: Mapping[str, Any], env: Mapping[str, str], *, fragmentation_bytes: int = GIB,
               effective_cpus: float | None = None) -> Result:
    """The preflight.live check's judge on plain values (its rules live in checks/preflight_live.py)."""
    from envdoctor.checks.preflight_live import LiveFacts, judge

    return judge(LiveFacts(facts, env, effective_cpus), {"fragmentation_bytes": fragmentation_bytes})


def _config(registry):
    """The lead's config (file + ENVDOCTOR_* environment) when it loads; defaults otherwise."""
    from envdoctor import config as config_module

    try:
        return config_module.load(registry.checks, known_ids=registry.unloaded_ids, left_out=registry.left_out), None
    except ConfigError as exc:
        return config_module.Config(), f"config ignored: {exc}"


def _print(report, file: IO[str], note: str | None) -> None:
    from envdoctor.export import ExportOptions, render

    text = render("compact", report, ExportOptions(title="envdoctor preflight", notes=(note,) if note else ()))
    try:
        file.write(text)
        file.flush()
    except (OSError, ValueError):  # a closed stderr must not take the training script down
        pass


def preflight(*, only: Iterable[str] | None = None, skip: Iterable[str] | None = None, strict: bool = False,
              file: IO[str] | None = sys.stderr) -> list[Result]:
    """Run the checks that may run in-process against this process's live state; print
    a compact report to `file` (None: print nothing); return the results (redacted, as
    every output is). With strict=True raise PreflightError when any result is `fail`
    (an `error`, envdoctor itself breaking, never stops the script).

    `only`/`skip` take check ids, as `envdoctor check --only/--skip` do; the in-process
    row is the ordinary check "preflight.live". An unknown id raises UsageError.
    """
    from envdoctor.errors import UsageError

    try:
        report, note = _run(only, skip)
    except UsageError:
        raise  # the script named a check that does not exist: its bug, said at once
    except Exception as exc:  # envdoctor breaking must never take the training script down
        report, note = _broken_report(exc), None
    results = list(report.results)
    if file is not None:
        _print(report, file, note)
    if strict and any(r.status is Status.FAIL for r in results):
        raise PreflightError(results)
    return results


def _ids(given: Iterable[str] | str | None) -> list[str]:
    """Check ids from a list, or one id as a string: only="cpu.threads" was taken letter
    by letter (unknown check id 'c')."""
    if given is None:
        return []
    return [given] if isinstance(given, str) else list(given)


def _run(only: Iterable[str] | None, skip: Iterable[str] | None):
    from envdoctor import pipeline
    from envdoctor.context import Session, Target
    from envdoctor.registry import load

    registry = load()
    config, note = _config(registry)
    session = Session(target=Target(), python=sys.executable, torch_factory=live_torch_facts)
    selection = pipeline.Selection(only=_ids(only), skip=_ids(skip))
    report = pipeline.execute(registry, config, session, selection, with_sysfacts=False, mode="inprocess")
    return report, note


def _broken_report(exc: Exception):
    """One error row saying envdoctor itself broke, redacted like every output."""
    from envdoctor import __version__, redact
    from envdoctor.model import Report, error

    row = error(f"preflight itself broke: {type(exc).__name__}: {exc}")
    row.check, row.target = "preflight", "self"
    row = redact.Scrubber(redact.secret_values([os.environ])).result(row)
    return Report(host="", version=__version__, started_at="", target="self", results=[row])
