"""cuda.visible_devices: which GPUs CUDA will really give the job.

Reads the target's CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, NVIDIA_VISIBLE_DEVICES
and LOCAL_RANK, and, when the NVIDIA driver is here, the node's GPUs from NVML
(count, names, UUIDs, MIG devices).

Why it matters: CUDA reads CUDA_VISIBLE_DEVICES once, when it initialises, and
silently makes the best of whatever it finds. The first entry it cannot read
(`0,1,,2`, `"0,1"` with the quotes kept by an env file, `0,GPU-...`) ends the
list and hides every GPU after it; a GPU listed twice hides all of them; an index
the node does not have ends the list too. Masking renumbers the GPUs: with
`2,3` the job sees cuda:0 and cuda:1, so a rank with LOCAL_RANK=2 fails with
"invalid device ordinal". CUDA numbers GPUs fastest first, nvidia-smi by PCI
bus, so on a node with mixed GPUs index 0 is not the same card in both unless
CUDA_DEVICE_ORDER=PCI_BUS_ID. And the variable must be set before anything
initialises CUDA (before `import torch` touches the GPU); set later it is ignored.

Statuses: `fail` for a duplicate, an invalid entry that hides the ones after it,
an index or UUID that matches no GPU (checked with NVML), LOCAL_RANK at or beyond
the number of visible GPUs. `warn` for a value that hides every GPU (empty, `-1`),
an entry read leniently (`1gpu2` is read as 1), indices on a node with different
GPU models without CUDA_DEVICE_ORDER=PCI_BUS_ID, and (without NVML) indices or
UUIDs that NVIDIA_VISIBLE_DEVICES shows this container does not have. `ok` when
unset (all GPUs visible) or consistent. Without NVML the syntax checks still run
and the summary says what could not be verified, and why.

How to fix: write the list CUDA should see, once each, with no quotes or blanks,
before the program starts (`export CUDA_VISIBLE_DEVICES=0,1`; in Python, set
os.environ before `import torch`); inside a container use the container's own
numbering (0..N-1); on mixed nodes `export CUDA_DEVICE_ORDER=PCI_BUS_ID`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from envdoctor import visible_devices as vd
from envdoctor.check import Check, Metric
from envdoctor.errors import Unavailable
from envdoctor.model import Result, Status, join_fixes, worst

_LOCAL_RANK = re.compile(r"^\s*[0-9]{1,30}\s*$")  # longer is no rank (and int() refuses > 4300 digits)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str | None
    uuid: str | None
    mig_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class VisibleFacts:
    cuda_visible_devices: str | None
    cuda_device_order: str | None
    nvidia_visible_devices: str | None
    local_rank: str | None
    gpus: tuple[Gpu, ...] | None  # None when NVML is not here
    nvml_reason: str | None = None  # why not


def gather(ctx) -> VisibleFacts:
    env = ctx.env
    gpus: tuple[Gpu, ...] | None = None
    reason = None
    try:
        nvml = ctx.nvml
        gpus = tuple(Gpu(g.index, g.name, g.uuid, tuple(g.mig_devices)) for g in nvml.devices())
    except Unavailable as exc:
        reason = str(exc)
    return VisibleFacts(
        cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        cuda_device_order=env.get("CUDA_DEVICE_ORDER"),
        nvidia_visible_devices=env.get("NVIDIA_VISIBLE_DEVICES"),
        local_rank=env.get("LOCAL_RANK"),
        gpus=gpus,
        nvml_reason=reason,
    )


def _export(entries) -> str:
    return "export CUDA_VISIBLE_DEVICES=" + ",".join(str(e) for e in entries)


def _clean_entries(p: vd.VisibleDevices) -> list[str]:
    """What the user most likely meant: every readable entry, once, without quotes or blanks."""
    out: dict[str, None] = {}  # ordered and O(1) to test: linear however many entries
    for token in p.tokens:
        text = token.strip(" \t\n\r\f\v\"'")
        if p.mode == vd.INDEX:
            match = re.match(r"[0-9]+", text)
            text = match.group(0) if match else ""
        elif not text.startswith(("GPU-", "MIG-")):
            text = ""
        if text:
            out.setdefault(text)
    return list(out)


def _span(n: int) -> str:
    return "cuda:0" if n == 1 else f"cuda:0-cuda:{n - 1}"


def _nvd_view(nvd: str | None) -> tuple[int | None, list[str]]:
    """What NVIDIA_VISIBLE_DEVICES says this container was given: (count, UUIDs)."""
    if nvd is None:
        return None, []
    text = nvd.strip()
    if text.lower() in ("", "all"):
        return None, []
    if text.lower() in ("none", "void"):
        return 0, []
    items = [t.strip() for t in text.split(",") if t.strip()]
    return len(items), [t for t in items if t.startswith(("GPU-", "MIG-"))]


def judge(facts: VisibleFacts, config) -> Result:
    findings: list[tuple[Status, str, str]] = []  # (status, message, fix)
    raw = facts.cuda_visible_devices
    gpus = facts.gpus
    physical = len(gpus) if gpus is not None else None
    parsed: vd.VisibleDevices | None = None
    visible_count: int | None = physical
    visible_list: list = list(range(physical)) if physical is not None else []
    ignored: list[str] = []

    if raw is not None:
        parsed = vd.parse(raw)
        visible_list = list(parsed.visible)
        ignored = list(parsed.ignored)
        visible_count = len(parsed.visible)
        clean = _clean_entries(parsed)
        fix_clean = _export(clean) if clean else "unset CUDA_VISIBLE_DEVICES  # or list the GPUs: export CUDA_VISIBLE_DEVICES=0,1"
        quoted = (" (the value holds quote characters: they are part of the value, kept by an env file, "
                  "Dockerfile ENV or YAML)" if parsed.quoted else "")
        if parsed.duplicate is not None:
            findings.append((Status.FAIL, f"CUDA_VISIBLE_DEVICES={raw!r} lists {parsed.duplicate} twice: "
                             "CUDA then exposes no GPU at all", fix_clean))
        elif parsed.stop is not None:
            bad = parsed.bad_token
            after = [t for t in parsed.ignored if t.strip(" \t\n\r\f\v")]
            intentional = bad.strip(" \t\n\r\f\v") in ("", "-1")
            if not parsed.visible and intentional and not after:
                findings.append((Status.WARN, f"CUDA_VISIBLE_DEVICES={raw!r} hides every GPU: CUDA sees none and "
                                 "the job runs on the CPU", "unset CUDA_VISIBLE_DEVICES  # all GPUs; or export "
                                 "CUDA_VISIBLE_DEVICES=0,1"))
            elif after:
                findings.append((Status.FAIL, f"CUDA_VISIBLE_DEVICES={raw!r}: entry {bad!r} is invalid "
                                 f"({parsed.stop_reason}); CUDA stops reading there and ignores {', '.join(after)} "
                                 f"after it{quoted}", fix_clean))
            elif not parsed.visible:
                findings.append((Status.FAIL, f"CUDA_VISIBLE_DEVICES={raw!r}: entry {bad!r} is invalid "
                                 f"({parsed.stop_reason}), so CUDA sees no GPU{quoted}", fix_clean))
            elif not intentional:
                findings.append((Status.WARN, f"CUDA_VISIBLE_DEVICES={raw!r}: entry {bad!r} is invalid "
                                 f"({parsed.stop_reason}) and ignored{quoted}", fix_clean))
        for token, number in parsed.lenient:
            findings.append((Status.WARN, f"CUDA_VISIBLE_DEVICES entry {token!r} is read as {number} (CUDA ignores "
                             "what follows the number)", fix_clean))

        if gpus is not None and parsed.duplicate is None:
            uuids = [g.uuid or "" for g in gpus]
            migs = [m for g in gpus for m in g.mig_devices]
            res = vd.resolve(parsed, len(gpus), uuids, migs)
            if res.unverifiable:
                visible_count = len(parsed.visible)
            else:
                visible_count = len(res.ordinals)
                if parsed.mode == vd.INDEX:
                    visible_list = list(res.ordinals)
                else:
                    visible_list = [(uuids if parsed.mode == vd.GPU_UUID else migs)[o] for o in res.ordinals]
            lost = f"; CUDA stops there and also ignores {', '.join(map(str, res.hidden))}" if res.hidden else ""
            if res.missing is not None:
                if parsed.mode == vd.INDEX:
                    have = f"this node has {physical} GPU{'s' if physical != 1 else ''}" + (f" (0-{physical - 1})" if physical else "")
                    what = f"GPU {res.missing} does not exist: {have}"
                else:
                    what = f"{res.missing} matches no {'GPU' if parsed.mode == vd.GPU_UUID else 'MIG device'} on this node"
                fix = _export(list(range(physical))) if parsed.mode == vd.INDEX and physical else (
                    "list existing GPUs (nvidia-smi -L shows their indices and UUIDs)")
                findings.append((Status.FAIL, f"CUDA_VISIBLE_DEVICES={raw!r}: {what}{lost}", fix))
            if res.ambiguous is not None:
                findings.append((Status.FAIL, f"CUDA_VISIBLE_DEVICES={raw!r}: {res.ambiguous} matches several "
                                 f"devices, so CUDA treats it as invalid{lost}", "use longer UUID prefixes (nvidia-smi -L)"))
            if res.duplicate is not None:
                visible_count = 0
                findings.append((Status.FAIL, f"CUDA_VISIBLE_DEVICES={raw!r}: two entries name the same GPU "
                                 f"({uuids[res.duplicate] if parsed.mode == vd.GPU_UUID else res.duplicate}), so CUDA "
                                 "exposes no GPU at all", "list each GPU once (nvidia-smi -L)"))
            names = {g.name for g in gpus if g.name}
            order = (facts.cuda_device_order or "").strip()
            if parsed.mode == vd.INDEX and len(names) > 1 and order != "PCI_BUS_ID":
                findings.append((Status.WARN, f"this node has different GPUs ({', '.join(sorted(names))}) and "
                                 f"CUDA_DEVICE_ORDER is {order or 'unset'}: CUDA numbers the fastest GPU first, "
                                 "nvidia-smi by PCI bus, so the indices in CUDA_VISIBLE_DEVICES may name other cards",
                                 "export CUDA_DEVICE_ORDER=PCI_BUS_ID"))
        elif gpus is None and parsed.duplicate is None and parsed.visible:
            count, nvd_uuids = _nvd_view(facts.nvidia_visible_devices)
            nvd = facts.nvidia_visible_devices
            if count is not None:
                if parsed.mode == vd.INDEX:
                    res = vd.resolve(parsed, count)
                elif nvd_uuids and parsed.mode == vd.GPU_UUID:
                    res = vd.resolve(parsed, len(nvd_uuids), nvd_uuids)
                else:
                    res = None
                if count == 0:
                    findings.append((Status.WARN, f"NVIDIA_VISIBLE_DEVICES={nvd!r}: this container was given no GPU, "
                                     f"so CUDA_VISIBLE_DEVICES={raw!r} selects nothing",
                                     "docker run --gpus all ...  # or NVIDIA_VISIBLE_DEVICES=all"))
                    visible_count = 0
                elif res is not None and res.missing is not None:
                    visible_count = len(res.ordinals)
                    what = "hides every GPU" if not res.ordinals else f"hides {res.missing} and what follows"
                    fix = _export(list(range(count))) if parsed.mode == vd.INDEX else "list the UUIDs the container was given"
                    findings.append((Status.WARN, f"NVIDIA_VISIBLE_DEVICES={nvd!r} gives this container {count} GPU"
                                     f"{'s' if count != 1 else ''}, numbered 0-{count - 1} inside it; "
                                     f"CUDA_VISIBLE_DEVICES={raw!r} {what} (use the container's own numbering)", fix))

    local_rank = None
    if facts.local_rank is not None and _LOCAL_RANK.match(facts.local_rank):
        local_rank = int(facts.local_rank)
        if visible_count is not None and local_rank >= visible_count:
            seen = "no GPU" if visible_count == 0 else f"only {visible_count} GPU{'s' if visible_count != 1 else ''} ({_span(visible_count)})"
            findings.append((Status.FAIL, f"LOCAL_RANK={local_rank} but CUDA sees {seen}: torch.cuda.set_device(LOCAL_RANK) "
                             "fails with 'invalid device ordinal'",
                             (_export(range(physical)) if physical else "export CUDA_VISIBLE_DEVICES=0,1,2,3")
                             + "  # every rank on a node sees the node's GPUs; or, when each rank gets one GPU, "
                             "use cuda:0 instead of cuda:LOCAL_RANK"))

    unverified = None
    if gpus is None:
        what = "GPU count unknown" if raw is None else "indices and UUIDs not checked against the GPUs"
        unverified = f"{what}: {facts.nvml_reason or 'NVML is not available'}"

    facts_out = {
        "cuda_visible_devices": raw,
        "visible": visible_list,
        "ignored": ignored,
        "physical_count": physical,
        "visible_count": visible_count,
        "cuda_device_order": facts.cuda_device_order,
        "local_rank": local_rank,
        "findings": [m for _, m, _ in findings],
        "unverified": unverified,
    }
    note = f" ({unverified})" if unverified else ""
    if not findings:
        if raw is None:
            if physical is None:
                summary = "CUDA_VISIBLE_DEVICES is unset: CUDA will use every GPU"
            else:
                summary = f"CUDA_VISIBLE_DEVICES is unset: CUDA will use all {physical} GPU{'s' if physical != 1 else ''}"
        else:
            shown = ", ".join(str(v) for v in visible_list) or "none"
            of = f" of {physical}" if physical is not None else ""
            summary = f"CUDA_VISIBLE_DEVICES={raw!r}: CUDA will use {visible_count}{of} GPU{'s' if visible_count != 1 else ''} ({shown})"
        return Result(Status.OK, summary + note, "", facts_out)
    status = worst([s for s, _, _ in findings])
    fix = join_fixes(findings)
    return Result(status, "; ".join(m for _, m, _ in findings) + note, fix, facts_out)


CHECK = Check(
    id="cuda.visible_devices",
    title="CUDA_VISIBLE_DEVICES selects the GPUs the job expects",
    run=lambda ctx: judge(gather(ctx), ctx.config),
    explain=__doc__,
    metrics=(Metric("cuda_visible_gpus", "visible_count", "Number of GPUs CUDA will expose to the target after CUDA_VISIBLE_DEVICES"),),
)
