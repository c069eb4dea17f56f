"""envdoctor.preflight(): check a training script's LIVE settings from inside it.

`envdoctor check` sees a fresh interpreter's defaults; the script is what sets
cudnn.benchmark, use_deterministic_algorithms(), set_num_threads() and
CUDA_VISIBLE_DEVICES. Called near the top of a training script,

    import envdoctor
    envdoctor.preflight()                 # prints a compact report to stderr
    envdoctor.preflight(strict=True)      # ... and raises PreflightError on a `fail`

runs the registered checks in this process with torch facts read from the torch
this script already imported (imported here if it was not: the script asked),
instead of from a probe subprocess.

It never initialises CUDA itself: creating a context costs GPU memory, and
initialising CUDA before the script forks DataLoader workers breaks them
("Cannot re-initialize CUDA in forked subprocess"). So it reads only what is
safe before initialisation: torch.version.cuda, the compiled arch list,
torch.cuda.is_initialized(), and the GPU count from NVML (not
torch.cuda.is_available(), which runs cuInit). When the script has already
initialised CUDA, device counts and memory_reserved / memory_allocated come from
torch (they create nothing then). That state is reported in its own row,
`preflight.live`: CUDA already initialised means CUDA_VISIBLE_DEVICES changes
from here on are ignored, and reserved memory far above allocated memory is
allocator fragmentation.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any, Iterable, Mapping

from envdoctor.errors import ConfigError, Unavailable
from envdoctor.model import Result, Status

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


def _effective_cpus(session) -> float | None:
    from envdoctor.cgroup import effective_cpus

    return effective_cpus(session.roots, None).cpus


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
    facts["errors"] = errors
    facts["warnings"] = []
    return facts


# -- the preflight-only row -----------------------------------------------------------


def _visible_count(value: str) -> int | None:
    """How many devices CUDA_VISIBLE_DEVICES names, when that is plain to see; None otherwise."""
    tokens = [t.strip() for t in value.split(",")]
    if tokens == [""]:
        return 0
    if all(t.isdigit() or t.startswith(("GPU-", "MIG-")) for t in tokens) and len(set(tokens)) == len(tokens):
        return len(tokens)
    return None


def _thread_share(effective_cpus: float | None, env: Mapping[str, str]) -> int | None:
    """Threads one process may run: its effective CPUs split among the ranks on this node."""
    if not effective_cpus:
        return None
    try:
        ranks = max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(1, int(effective_cpus // ranks))


def judge_live(facts: Mapping[str, Any], env: Mapping[str, str], *, fragmentation_bytes: int = GIB,
               effective_cpus: float | None = None) -> Result:
    """What only an in-process look can tell: CUDA already initialised, allocator state,
    and the thread count the script actually set (torch.set_num_threads), which no
    environment variable shows."""
    from envdoctor.model import ok, warn
    from envdoctor.units import format_bytes

    out: dict[str, Any] = {"cuda_initialized": facts.get("cuda_initialized"), "num_threads": facts.get("num_threads"),
                           "device_count": facts.get("device_count"), "cuda_memory": facts.get("cuda_memory", {})}
    notes: list[str] = []
    findings: list[tuple[str, str]] = []
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        out["CUDA_VISIBLE_DEVICES"] = cvd
    if facts.get("cuda_initialized"):
        notes.append("CUDA is already initialised: changes to CUDA_VISIBLE_DEVICES from here on are ignored")
        listed = _visible_count(cvd) if cvd is not None else None
        count = facts.get("device_count")
        physical = facts.get("nvml_device_count")
        if listed is not None and isinstance(count, int) and listed != count and (physical is None or listed <= physical):
            findings.append((f"CUDA_VISIBLE_DEVICES={cvd!r} names {listed} device(s) but CUDA was initialised with "
                             f"{count}: it was set after CUDA started, so it has no effect; expected it set before "
                             "anything touches CUDA",
                             "set CUDA_VISIBLE_DEVICES in the shell or the launcher, before python starts"))
        for index, mem in sorted((facts.get("cuda_memory") or {}).items()):
            reserved, allocated = mem.get("reserved_bytes"), mem.get("allocated_bytes")
            if not isinstance(reserved, int) or not isinstance(allocated, int):
                continue
            notes.append(f"GPU {index}: {format_bytes(reserved)} reserved, {format_bytes(allocated)} allocated")
            if reserved - allocated >= fragmentation_bytes and allocated < reserved / 2:
                findings.append((f"GPU {index}: the caching allocator holds {format_bytes(reserved)} but tensors use only "
                                 f"{format_bytes(allocated)}: fragmentation or a cache growing between phases; expected "
                                 "reserved close to allocated",
                                 "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # or torch.cuda.empty_cache() between phases"))
    else:
        notes.append("CUDA not initialised yet: CUDA_VISIBLE_DEVICES may still be changed")
    threads = facts.get("num_threads")
    share = _thread_share(effective_cpus, env)
    out["effective_cpus"], out["thread_share"] = effective_cpus, share
    if isinstance(threads, int) and share is not None and threads > share:
        findings.append((f"torch runs {threads} intra-op threads but this process has {effective_cpus:g} effective CPUs"
                         + (f" shared by LOCAL_WORLD_SIZE={env['LOCAL_WORLD_SIZE']} ranks" if env.get("LOCAL_WORLD_SIZE") else "")
                         + f": oversubscribed, expected <= {share}",
                         f"torch.set_num_threads({share})  # and export OMP_NUM_THREADS={share} before launch"))
    else:
        notes.append(f"torch uses {threads} intra-op threads")
    if findings:
        return warn("; ".join(text for text, _ in findings), "; ".join(dict.fromkeys(fix for _, fix in findings)), **out)
    return ok("; ".join(notes), **out)


# -- running --------------------------------------------------------------------------


def _config(registry):
    """The lead's config (file + ENVDOCTOR_* environment) when it loads; defaults otherwise."""
    from envdoctor import config as config_module

    try:
        return config_module.load(registry.checks, known_ids={f.name for f in registry.failures}), None
    except ConfigError as exc:
        return config_module.Config(), f"config ignored: {exc}"


def _print(results: list[Result], file: IO[str] | None, note: str | None) -> None:
    if file is None:
        return
    from envdoctor.exporters.common import one_line  # a terminal gets no raw control character

    counts: dict[str, int] = {}
    for r in results:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    order = ("fail", "error", "warn", "ok", "skip")
    tally = ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s))
    lines = [f"envdoctor preflight: {len(results)} checks: {tally}"]
    if note:
        lines.append(f"  note: {one_line(note)}")
    rank = {Status.FAIL: 0, Status.ERROR: 1, Status.WARN: 2}
    for r in sorted((r for r in results if r.status in rank), key=lambda r: (rank[r.status], r.check)):
        lines.append(f"  {r.status.value.upper():5} {one_line(r.check)}: {one_line(r.summary)}")
        if r.remediation:
            lines.append(f"        fix: {one_line(r.remediation)}")
    try:
        file.write("\n".join(lines) + "\n")
        file.flush()
    except (OSError, ValueError):  # a closed stderr must not take the training script down
        pass


def preflight(*, only: Iterable[str] | None = None, skip: Iterable[str] | None = None, strict: bool = False,
              file: IO[str] | None = sys.stderr) -> list[Result]:
    """Run the checks against this process's live state; print a compact report to
    `file` (None: print nothing); return the results (redacted, as every output is).
    With strict=True raise PreflightError when any result is `fail` (an `error`,
    envdoctor itself breaking, never stops the script).

    `only`/`skip` take check ids, as `envdoctor check --only/--skip` do, plus
    "preflight.live" for the in-process row. An unknown id raises UsageError.
    """
    from envdoctor.errors import UsageError

    try:
        results, note = _run(only, skip)
    except UsageError:
        raise  # the script named a check that does not exist: its bug, said at once
    except Exception as exc:  # envdoctor breaking must never take the training script down
        from envdoctor.model import error

        row = error(f"preflight itself broke: {type(exc).__name__}: {exc}")
        row.check, row.target = "preflight", "self"
        from envdoctor import redact

        results, note = [redact.Scrubber(redact.secret_values([os.environ])).result(row)], None
    if file is not None:
        _print(results, file, note)
    if strict and any(r.status is Status.FAIL for r in results):
        raise PreflightError(results)
    return results


def _run(only: Iterable[str] | None, skip: Iterable[str] | None) -> tuple[list[Result], str | None]:
    from envdoctor import pipeline
    from envdoctor.context import Session, Target
    from envdoctor.registry import load

    only_ids = list(only or ())
    skip_ids = list(skip or ())
    want_live = (not only_ids or LIVE_CHECK_ID in only_ids) and LIVE_CHECK_ID not in skip_ids
    only_checks = [i for i in only_ids if i != LIVE_CHECK_ID]
    registry = load()
    config, note = _config(registry)
    session = Session(target=Target(), python=sys.executable, torch_factory=live_torch_facts)
    results: list[Result] = []
    if only_checks or not only_ids:
        selection = pipeline.Selection(only=only_checks, skip=[i for i in skip_ids if i != LIVE_CHECK_ID])
        results = list(pipeline.execute(registry, config, session, selection, with_sysfacts=False).results)
    if want_live:
        results.append(_live_row(session))
    return results, note


def _live_row(session) -> Result:
    from envdoctor import redact
    from envdoctor.model import error, skip

    try:
        facts = session.need("torch")
        result = judge_live(facts, session.env, effective_cpus=_effective_cpus(session))
    except Unavailable as exc:
        result = skip(str(exc))
    except Exception as exc:  # never a traceback into the training script
        result = error(f"the live torch look broke: {type(exc).__name__}: {exc}")
    result.check = LIVE_CHECK_ID
    result.target = session.target.label
    return redact.Scrubber(redact.secret_values([os.environ])).result(result)
