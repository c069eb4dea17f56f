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
a range or a list split by other than commas (`0-3`, `0 1`: read as 0, the rest hidden;
the fix lists the GPUs meant), an index or UUID that matches no GPU (checked with NVML; a
bare `GPU-` or `MIG-` names none even without it), LOCAL_RANK at or beyond
the number of visible GPUs (not where the value hides every GPU on purpose, `''` or
`-1`; on a node without a driver it is a note: a CPU job never calls set_device). `warn`
for a value that hides every GPU on a node that has some (empty, `-1`, quoted or not, or a
list that starts with `-1`, which --fix leaves as it is: CUDA runs that job on the CPU),
an entry read leniently (`1gpu2` is read as 1), several MIG devices listed (a CUDA
process enumerates only the first: NVIDIA's MIG User Guide), indices on a node with different
GPU models without CUDA_DEVICE_ORDER=PCI_BUS_ID, and (without NVML) indices or
UUIDs that NVIDIA_VISIBLE_DEVICES shows this container does not have. `ok` when
unset (all GPUs visible) or consistent. Without NVML the syntax checks still run
and the summary says what could not be verified, and why.

A value a scheduler sets to say the job got no GPU (Slurm's `NoDevFiles`; `none`, `void`)
fails too, and its fix is to ask the scheduler for GPUs, not to unset it (on a shared node
that hands the job every GPU).

How to fix: write the list CUDA should see, once each, with no quotes or blanks,
before the program starts (`export CUDA_VISIBLE_DEVICES=0,1`; in Python, set
os.environ before `import torch`); inside a container use the container's own
numbering (0..N-1); on mixed nodes `export CUDA_DEVICE_ORDER=PCI_BUS_ID`.
"""

from __future__ import annotations

import re
from collections import namedtuple

from envdoctor import visible_devices as vd
from envdoctor.check import Check, Metric
from envdoctor.errors import Unavailable
from envdoctor.quoted import quoted_value
from envdoctor.model import Finding, Result, Status, verdict

_LOCAL_RANK = re.compile(r"^\s*[0-9]{1,30}\s*$")  # longer is no rank (and int() refuses > 4300 digits)


class Gpu(namedtuple("Gpu", (
        "index",  # int
        "name",  # str | None
        "uuid",  # str | None
        "mig_devices",  # tuple[str, ...] = ()
), defaults=((),))):
    __slots__ = ()


class VisibleFacts(namedtuple("VisibleFacts", (
        "cuda_visible_devices",  # str | None
        "cuda_device_order",  # str | None
        "nvidia_visible_devices",  # str | None
        "local_rank",  # str | None
        "gpus",  # tuple[Gpu, ...] | None: None when NVML is not here
        "nvml_reason",  # str | None = None: why not
), defaults=(None,))):
    __slots__ = ()


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


SHOWN_ENTRIES = 16


def _some(entries) -> str:
    """Entries joined for a summary, the first SHOWN_ENTRIES of them and how many more."""
    entries = [str(e) for e in entries]
    more = f", and {len(entries) - SHOWN_ENTRIES} more" if len(entries) > SHOWN_ENTRIES else ""
    return ", ".join(entries[:SHOWN_ENTRIES]) + more


def _export(entries) -> str:
    return "export CUDA_VISIBLE_DEVICES=" + ",".join(str(e) for e in entries)


def _clean_entries(p: vd.VisibleDevices, gpus: "tuple[Gpu, ...] | None" = None) -> list[str]:
    """What the user most likely meant: every readable entry, once, without quotes or blanks;
    where NVML lists the GPUs, only entries that name one of them (helper-52: '0,x,5' on four
    GPUs was fixed to '0,5', which fails again: GPU 5 does not exist)."""
    out: dict[str, None] = {}  # ordered and O(1) to test: linear however many entries
    mig = p.mode == vd.MIG_UUID
    known = None if gpus is None else [u for g in gpus for u in ((*g.mig_devices,) if mig else (g.uuid or "",)) if u]
    for token in p.tokens:
        text = token.strip(" \t\n\r\f\v\"'")
        if p.mode == vd.INDEX:
            several = _meant_several(text)
            if several:  # '0-3', '0 1': the GPUs meant, not the first that CUDA reads (helper-80)
                for number in several:
                    if gpus is None or number < len(gpus):
                        out.setdefault(str(number))
                continue
            match = re.match(r"[0-9]+", text)
            text = (match.group(0).lstrip("0") or "0") if match else ""  # '00' is 0, as CUDA reads it (helper-53)
            if len(text) > vd.MAX_INDEX_DIGITS:  # no GPU has it, NVML or not; CUDA stops there (helper-114)
                text = ""
            elif text and gpus is not None and int(text) >= len(gpus):
                text = ""
        elif not text.startswith("MIG-" if mig else "GPU-") or text in _BARE_PREFIXES:
            text = ""  # a list is of one kind, the first entry's: CUDA stops at a GPU- in a MIG- list; a bare prefix names none
        elif known is not None and sum(u.startswith(text) for u in known) != 1:
            text = ""
        if text:
            out.setdefault(text)
    return list(out)


_RANGE = re.compile(r"([0-9]{1,4})\s*-\s*([0-9]{1,4})")
_OTHER_SEPARATORS = re.compile(r"[0-9]{1,4}(?:[\s;|]+[0-9]{1,4})+")  # not ":" (1:3 may be a slice)
MAX_MEANT = 64  # GPUs one range may stand for: no node has more


def _meant_several(token: str) -> list[int] | None:
    """The GPUs an entry CUDA reads as its first number was meant to list: a range ('0-3',
    which CUDA does not take) or numbers split by something other than a comma ('0 1',
    '0;1'). None for anything else."""
    text = token.strip(" \t\n\r\f\v\"'")
    match = _RANGE.fullmatch(text)
    if match:
        first, last = int(match.group(1)), int(match.group(2))
        return list(range(first, last + 1)) if first < last and last - first < MAX_MEANT else None
    if _OTHER_SEPARATORS.fullmatch(text):
        return [int(n) for n in re.findall(r"[0-9]+", text)][:MAX_MEANT]
    return None


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


class View(namedtuple("View", (
        "parsed",  # vd.VisibleDevices | None: None: CUDA_VISIBLE_DEVICES unset
        "res",  # vd.Resolution | None: against NVML's GPUs
        "nvd_count",  # int | None: GPUs NVIDIA_VISIBLE_DEVICES gave the container, judged without NVML
        "nvd_res",  # vd.Resolution | None
        "physical",  # int | None
        "visible_list",  # list
        "visible_count",  # int | None
))):
    """What CUDA will make of the facts: the parse, its resolution against the GPUs
    (NVML's, or the container's per NVIDIA_VISIBLE_DEVICES), and what stays visible."""

    __slots__ = ()


# NVIDIA's MIG User Guide, "CUDA Device Enumeration": with CUDA 11/R450 and CUDA 12/R525 a
# single CUDA process can enumerate only a single MIG device; torch.cuda.device_count() is 1
# with two MIG UUIDs listed (pytorch/pytorch#92315), and 1 with none listed on MIG GPUs.
# helper-97: two were counted, and LOCAL_RANK=1 on the second one passed.
MIG_ONE_PER_PROCESS = True


def _view(facts: VisibleFacts) -> View:
    gpus, raw = facts.gpus, facts.cuda_visible_devices
    physical = len(gpus) if gpus is not None else None
    if raw is None:
        if gpus and all(g.mig_devices for g in gpus):  # one MIG device a process (MIG_ONE_PER_PROCESS)
            return View(None, None, None, None, physical, [0], 1)
        return View(None, None, None, None, physical, list(range(physical or 0)), physical)
    parsed = vd.parse(raw)
    if parsed.mode == vd.MIG_UUID and _gpu_uuids_written_as_mig(raw, gpus):
        parsed = vd.parse(_as_gpu_uuids(raw))  # what CUDA 13 ran (an H200, driver 580): _rule_mig_prefix_on_a_gpu
    visible_list, count = list(parsed.visible), len(parsed.visible)
    if parsed.duplicate is not None:
        return View(parsed, None, None, None, physical, visible_list, count)
    if gpus is not None:
        uuids, migs = [g.uuid or "" for g in gpus], [m for g in gpus for m in g.mig_devices]
        res = vd.resolve(parsed, len(gpus), uuids, migs)
        if not res.unverifiable:
            count = 0 if res.duplicate is not None else len(res.ordinals)
            visible_list = (list(res.ordinals) if parsed.mode == vd.INDEX
                            else [(uuids if parsed.mode == vd.GPU_UUID else migs)[o] for o in res.ordinals])
            if parsed.mode == vd.MIG_UUID and count > 1:  # CUDA enumerates the first only (MIG_ONE_PER_PROCESS)
                count, visible_list = 1, visible_list[:1]
            elif (parsed.mode == vd.INDEX and count > 1 and res.ordinals
                  and all(gpus[o].mig_devices for o in res.ordinals if o < len(gpus))):
                count, visible_list = 1, visible_list[:1]  # indices of GPUs in MIG mode: one MIG device too (helper-98)
        return View(parsed, res, None, None, physical, visible_list, count)
    if parsed.mode == vd.MIG_UUID and count > 1:  # no NVML to ask, and still the first only (helper-114)
        count, visible_list = 1, visible_list[:1]
    nvd_count, nvd_uuids = _nvd_view(facts.nvidia_visible_devices)
    nvd_res = None
    if nvd_count is not None and parsed.visible:
        if parsed.mode == vd.INDEX:
            nvd_res = vd.resolve(parsed, nvd_count)
        elif nvd_uuids and parsed.mode == vd.GPU_UUID:
            nvd_res = vd.resolve(parsed, len(nvd_uuids), nvd_uuids)
        if nvd_count == 0:
            count = 0
        elif nvd_res is not None and nvd_res.missing is not None:
            count = len(nvd_res.ordinals)
    return View(parsed, None, nvd_count if parsed.visible else None, nvd_res, physical, visible_list, count)


def visible_count(env, nvml) -> int | None:
    """The devices CUDA will count (torch.cuda.device_count()) in a process with this
    environment, on the GPUs `nvml` lists: what torchrun's `--nproc-per-node=gpu` starts.
    Raises Unavailable without NVML."""
    gpus = tuple(Gpu(g.index, g.name, g.uuid, tuple(g.mig_devices)) for g in nvml.devices())
    facts = VisibleFacts(env.get("CUDA_VISIBLE_DEVICES"), env.get("CUDA_DEVICE_ORDER"),
                         env.get("NVIDIA_VISIBLE_DEVICES"), env.get("LOCAL_RANK"), gpus)
    return _view(facts).visible_count


def _serving_entries(p: vd.VisibleDevices, facts: VisibleFacts) -> list[str]:
    """The clean entries, or, where they cannot serve LOCAL_RANK but the node's GPUs can,
    every GPU of the node: one fix for both findings (helper-53: '0,x' with LOCAL_RANK=3 on
    four GPUs printed `export ...=0,1,2,3; export ...=0`, whose last export wins and fails)."""
    clean = _clean_entries(p, facts.gpus)
    rank, gpus = _local_rank(facts), facts.gpus
    if rank is None or gpus is None or not len(clean) <= rank < len(gpus):
        return clean
    if p.mode == vd.INDEX:
        return [str(g.index) for g in gpus]
    if p.mode == vd.GPU_UUID and all(g.uuid for g in gpus):
        return [str(g.uuid) for g in gpus]
    return clean


# Values a scheduler or runtime sets to mean "this job got no GPU": Slurm's NoDevFiles (a job
# given no GPU on a node with GPU gres), and the NVIDIA container runtime's none and void
# (meant for NVIDIA_VISIBLE_DEVICES). Unsetting the variable, the fix for a typo, would give
# such a job every GPU of a shared node (helper-114).
_SET_FOR_NO_GPU = ("nodevfiles", "none", "void")
_NO_GPU_GIVEN_FIX = ("ask the scheduler for the GPUs the job needs (Slurm: --gpus=N or --gres=gpu:N; Kubernetes: "
                     "nvidia.com/gpu in the pod's limits); this value means it was given none, and unsetting it on a "
                     "shared node would hand the job every GPU")


def _clean_fix(p: vd.VisibleDevices, status: Status, message: str, facts: VisibleFacts) -> Finding:
    """A finding fixed by writing the readable entries once each, as a command and as env."""
    clean = _serving_entries(p, facts)
    if not clean and p.bad_token is not None and p.bad_token.strip(_QUIET).lower() in _SET_FOR_NO_GPU:
        return Finding(status, message, _NO_GPU_GIVEN_FIX)
    if not clean:
        return Finding(status, message, "unset CUDA_VISIBLE_DEVICES  # all GPUs; or list the ones the job should use")
    return Finding(status, message, _export(clean), env={"CUDA_VISIBLE_DEVICES": ",".join(clean)})


def _rule_listed_twice(facts: VisibleFacts, view: View) -> list[Finding]:
    """The same entry twice: CUDA exposes no GPU at all."""
    p = view.parsed
    if p is None or p.duplicate is None:
        return []
    return [_clean_fix(p, Status.FAIL, f"CUDA_VISIBLE_DEVICES={quoted_value(p.raw)} lists {p.duplicate} twice: "
                       "CUDA then exposes no GPU at all", facts)]


def _rule_bad_entry(facts: VisibleFacts, view: View) -> list[Finding]:
    """An entry CUDA cannot read ends the list: it hides itself and every entry after it.
    A leading -1 (or an empty value) is the usual way to say "no GPU": it warns where the
    node has GPUs to hide, quoted or not, and --fix does not turn it into a GPU list."""
    p = view.parsed
    if p is None or p.duplicate is not None or p.stop is None:
        return []
    bad, raw = p.bad_token, p.raw
    after = [t for t in p.ignored if not _names_no_gpu(t)]  # entries that would have named a GPU
    quoted = (" (the value holds quote characters: they are part of the value, kept by an env file, "
              "Dockerfile ENV or YAML)" if p.quoted else "")
    invalid = f"CUDA_VISIBLE_DEVICES={quoted_value(raw)}: entry {bad!r} is invalid ({p.stop_reason})"
    if _hides_all_on_purpose(view):
        if _no_gpu_here(facts):
            return []  # nothing to hide: said in the ok summary
        listed = f"; or export CUDA_VISIBLE_DEVICES={','.join(str(g.index) for g in facts.gpus)}" if facts.gpus else ""
        if after:  # '-1,0': CUDA runs the job on the CPU; --fix does not make it a GPU job
            return [Finding(Status.WARN, f"CUDA_VISIBLE_DEVICES={quoted_value(raw)} hides every GPU: CUDA stops at {bad!r} and "
                            f"ignores {_some(after)} after it, so the job runs on the CPU{quoted}",
                            "export CUDA_VISIBLE_DEVICES=-1  # no GPU, as now; or list only the GPUs the job should "
                            f"use{listed}")]
        fix = ("export CUDA_VISIBLE_DEVICES=-1  # as meant, without the quotes; or unset CUDA_VISIBLE_DEVICES for all GPUs"
               if p.quoted else f"unset CUDA_VISIBLE_DEVICES  # all GPUs{listed}")
        return [Finding(Status.WARN, f"CUDA_VISIBLE_DEVICES={quoted_value(raw)} hides every GPU: CUDA sees none and the job "
                        f"runs on the CPU{quoted}", fix)]
    if after:
        return [_clean_fix(p, Status.FAIL, f"{invalid}; CUDA stops reading there and ignores {_some(after)} "
                           f"after it{quoted}", facts)]
    if not p.visible:
        return [_clean_fix(p, Status.FAIL, f"{invalid}, so CUDA sees no GPU{quoted}", facts)]
    if not _names_no_gpu(bad):
        return [_clean_fix(p, Status.WARN, f"{invalid} and ignored{quoted}", facts)]
    return []


def _rule_lenient(facts: VisibleFacts, view: View) -> list[Finding]:
    """'1gpu2' is read as 1: probably not what was meant."""
    p = view.parsed
    if p is None or p.duplicate is not None:
        return []
    if not p.lenient:
        return []
    read = [f"{token!r} is read as {number}" for token, number in p.lenient[:3]]
    more = f", and {len(p.lenient) - 3} more" if len(p.lenient) > 3 else ""
    entry = "entry" if len(p.lenient) == 1 else "entries"
    if any(_meant_several(token) for token, _ in p.lenient):  # a range or a list: GPUs meant are hidden
        return [_clean_fix(p, Status.FAIL, f"CUDA_VISIBLE_DEVICES {entry} {', '.join(read)}{more}: CUDA takes "
                           "neither ranges nor lists split by anything but commas, and hides the other GPUs meant",
                           facts)]
    return [_clean_fix(p, Status.WARN, f"CUDA_VISIBLE_DEVICES {entry} {', '.join(read)}{more} (CUDA ignores what "
                       "follows the number)", facts)]  # one finding, one clean list: linear in the entries


def _rule_no_such_device(facts: VisibleFacts, view: View) -> list[Finding]:
    """An index or UUID NVML does not know ends the list; a UUID prefix matching several too."""
    p, res, physical = view.parsed, view.res, view.physical
    if p is None or res is None:
        return []
    lost = f"; CUDA stops there and also ignores {_some(res.hidden)}" if res.hidden else ""
    found = []
    if res.missing is not None:
        if p.mode == vd.INDEX:
            have = f"this node has {physical} GPU{'s' if physical != 1 else ''}" + (f" (0-{physical - 1})" if physical else "")
            what = f"GPU {res.missing} does not exist: {have}"
        else:
            what = f"{res.missing} matches no {'GPU' if p.mode == vd.GPU_UUID else 'MIG device'} on this node"
        fix = (_export(list(range(physical))) if p.mode == vd.INDEX and physical
               else "list existing GPUs (nvidia-smi -L shows their indices and UUIDs)")
        found.append(Finding(Status.FAIL, f"CUDA_VISIBLE_DEVICES={quoted_value(p.raw)}: {what}{lost}", fix))
    if res.ambiguous is not None:
        found.append(Finding(Status.FAIL, f"CUDA_VISIBLE_DEVICES={quoted_value(p.raw)}: {res.ambiguous} matches several devices, "
                             f"so CUDA treats it as invalid{lost}", "use longer UUID prefixes (nvidia-smi -L)"))
    return found


_BARE_PREFIXES = ("GPU-", "MIG-")  # a UUID prefix with nothing after it: names no device


def _rule_bare_prefix(facts: VisibleFacts, view: View) -> list[Finding]:
    """Without NVML to match against: an entry that is only `GPU-` or `MIG-` names no
    device. On an H200 (driver 580.159.04) CUDA_VISIBLE_DEVICES=GPU- gave "No CUDA GPUs are
    available"; with NVML, _rule_no_such_device says so (helper-114: it was ok here)."""
    p = view.parsed
    if p is None or view.res is not None or p.mode == vd.INDEX or p.duplicate is not None:
        return []
    bare = next((i for i, t in enumerate(p.visible) if t.strip(_QUIET) in _BARE_PREFIXES), None)
    if bare is None:
        return []
    after = p.visible[bare + 1:] + p.ignored
    lost = f"; CUDA stops there and also ignores {_some(after)}" if after else ""
    status = Status.FAIL if bare == 0 else Status.WARN
    return [_clean_fix(p, status, f"CUDA_VISIBLE_DEVICES={quoted_value(p.raw)}: entry {p.visible[bare]!r} is a bare "
                       f"prefix and names no device{lost}", facts)]


def _as_gpu_uuids(raw: str) -> str:
    return ",".join("GPU-" + t.strip()[4:] if t.strip().startswith("MIG-") else t for t in raw.split(","))


def _gpu_uuids_written_as_mig(raw: str, gpus: tuple[Gpu, ...] | None) -> bool:
    """MIG-<UUID> entries on a node with no MIG device, each naming one of its GPUs once GPU- is
    put for MIG-: an H200 on driver 580 (CUDA 13) ran a job given MIG-<its GPU UUID>."""
    if not gpus or any(g.mig_devices for g in gpus):
        return False
    entries = [t.strip() for t in _as_gpu_uuids(raw).split(",") if t.strip()]
    uuids = [g.uuid or "" for g in gpus]
    return bool(entries) and all(len(e) > 4 and sum(u.startswith(e) for u in uuids) == 1 for e in entries)


def _rule_mig_prefix_on_a_gpu(facts: VisibleFacts, view: View) -> list[Finding]:
    """GPU UUIDs written with a MIG- prefix: CUDA 13 drivers take them as the GPUs (seen on an
    H200); an older one may not, so a warn (it was a fail), and the view counts them."""
    raw = facts.cuda_visible_devices
    if raw is None or view.parsed is None or view.parsed.mode != vd.GPU_UUID or vd.parse(raw).mode != vd.MIG_UUID:
        return []
    fixed = _as_gpu_uuids(raw)
    return [Finding(Status.WARN, f"CUDA_VISIBLE_DEVICES={quoted_value(raw)}: no GPU here is in MIG mode, and these are "
                    "GPU UUIDs with a MIG- prefix: CUDA 13 drivers take them as the GPUs, older ones may not",
                    f"export CUDA_VISIBLE_DEVICES={fixed}")]


def _rule_same_gpu_twice(facts: VisibleFacts, view: View) -> list[Finding]:
    """Two different entries (UUID prefixes) naming one GPU: CUDA exposes none."""
    p, res = view.parsed, view.res
    if p is None or res is None or res.duplicate is None:
        return []
    uuids = [g.uuid or "" for g in facts.gpus or ()]
    named = uuids[res.duplicate] if p.mode == vd.GPU_UUID else res.duplicate
    return [Finding(Status.FAIL, f"CUDA_VISIBLE_DEVICES={quoted_value(p.raw)}: two entries name the same GPU ({named}), so CUDA "
                    "exposes no GPU at all", "list each GPU once (nvidia-smi -L)")]


def _rule_mig_devices_beyond_the_first(facts: VisibleFacts, view: View) -> list[Finding]:
    """A list of several MIG devices: a CUDA process enumerates only the first
    (MIG_ONE_PER_PROCESS); the rest are idle unless each process gets its own."""
    p, res = view.parsed, view.res
    if p is None or p.mode != vd.MIG_UUID or p.duplicate is not None or (res is not None and res.duplicate is not None):
        return []
    listed = len(res.ordinals) if res is not None else len(p.visible)  # without NVML: as written
    if listed < 2:
        return []
    return [Finding(Status.WARN, f"CUDA_VISIBLE_DEVICES={quoted_value(p.raw)} lists {listed} MIG devices, but a "
                    f"CUDA process enumerates only one: this one uses {view.visible_list[0]}, and the others stay idle",
                    "give each process one MIG device (torchrun's ranks: CUDA_VISIBLE_DEVICES set per rank, as the "
                    "NVIDIA device plugin does for a pod); MIG devices cannot be used together by one process")]


def _rule_device_order(facts: VisibleFacts, view: View) -> list[Finding]:
    """Indices on a node of mixed GPUs: CUDA's fastest-first order is not nvidia-smi's."""
    p, gpus = view.parsed, facts.gpus
    order = (facts.cuda_device_order or "").strip()
    names = {g.name for g in gpus or () if g.name}
    if p is None or view.res is None or p.mode != vd.INDEX or len(names) <= 1 or order == "PCI_BUS_ID":
        return []
    return [Finding(Status.WARN, f"this node has different GPUs ({', '.join(sorted(names))}) and CUDA_DEVICE_ORDER "
                    f"is {order or 'unset'}: CUDA numbers the fastest GPU first, nvidia-smi by PCI bus, so the indices "
                    "in CUDA_VISIBLE_DEVICES may name other cards", "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
                    env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})]


def _rule_container_gpus(facts: VisibleFacts, view: View) -> list[Finding]:
    """Without NVML: entries the container was not given (NVIDIA_VISIBLE_DEVICES)."""
    p, count, res, nvd = view.parsed, view.nvd_count, view.nvd_res, facts.nvidia_visible_devices
    if p is None or count is None:
        return []
    if count == 0:
        return [Finding(Status.WARN, f"NVIDIA_VISIBLE_DEVICES={nvd!r}: this container was given no GPU, so "
                        f"CUDA_VISIBLE_DEVICES={quoted_value(p.raw)} selects nothing",
                        "docker run --gpus all ...  # or NVIDIA_VISIBLE_DEVICES=all")]
    if res is None or res.missing is None:
        return []
    what = "hides every GPU" if not res.ordinals else f"hides {res.missing} and what follows"
    fix = _export(list(range(count))) if p.mode == vd.INDEX else "list the UUIDs the container was given"
    return [Finding(Status.WARN, f"NVIDIA_VISIBLE_DEVICES={nvd!r} gives this container {count} GPU"
                    f"{'s' if count != 1 else ''}, numbered 0-{count - 1} inside it; CUDA_VISIBLE_DEVICES={quoted_value(p.raw)} "
                    f"{what} (use the container's own numbering)", fix)]


def _local_rank(facts: VisibleFacts) -> int | None:
    if facts.local_rank is not None and _LOCAL_RANK.match(facts.local_rank):
        return int(facts.local_rank)
    return None


_QUIET = " \t\n\r\f\v\"'"  # blanks, and the quotes an env file or YAML keeps


def _names_no_gpu(token: str) -> bool:
    """An entry that asks for no GPU: empty, or -1 (blanks and kept quotes aside)."""
    return token.strip(_QUIET) in ("", "-1")


def _hides_all_on_purpose(view: View) -> bool:
    """CUDA_VISIBLE_DEVICES='' or '-1' (quoted or not, repeated or not), or a list that starts
    with -1: the usual way to run a job on the CPU. Not ',0,1', whose empty first entry is a
    typo that hides the GPUs after it."""
    p = view.parsed
    if p is None or p.visible or p.stop is None or p.duplicate is not None or not _names_no_gpu(p.bad_token):
        return False
    return p.bad_token.strip(_QUIET) == "-1" or all(_names_no_gpu(t) for t in p.ignored)


def _no_gpu_here(facts: VisibleFacts) -> bool:
    """NVML lists no GPU, or there is no NVIDIA driver at all: CUDA has nothing to give."""
    from envdoctor.nvml import NO_DRIVER_REASON

    return facts.gpus == () or (facts.gpus is None and facts.nvml_reason == NO_DRIVER_REASON)


def _rule_local_rank(facts: VisibleFacts, view: View) -> list[Finding]:
    """LOCAL_RANK beyond the GPUs CUDA shows: set_device(LOCAL_RANK) fails. Not where the
    list hides every GPU on purpose ('' or -1, said as its own warning) or the node has no
    GPU: a CPU job (gloo) never calls set_device (helper-49: a CPU-only torchrun with
    CUDA_VISIBLE_DEVICES='' failed here, and --strict refused to start it)."""
    rank, count, physical = _local_rank(facts), view.visible_count, view.physical
    if rank is None or count is None or rank < count:
        return []
    if _hides_all_on_purpose(view) or _no_gpu_here(facts):
        return []  # a CPU job; on a node without GPUs the judge's note says what a GPU node would do
    p = view.parsed
    seen = "no GPU" if count == 0 else f"only {count} GPU{'s' if count != 1 else ''} ({_span(count)})"
    # the list another finding fixes (an invalid entry, a duplicate, a range or a list split by
    # blanks: helper-83, '0-3' with LOCAL_RANK=3 printed two exports, the last one all 8 GPUs)
    fixed = p is not None and (p.stop is not None or p.duplicate is not None
                               or any(_meant_several(token) for token, _ in p.lenient))
    serving = _serving_entries(p, facts) if fixed else []
    if len(serving) > rank:
        # the bad entry's own fix (which --fix applies) gives this rank its GPU: the same fix, said
        # once (helper-51: two different exports; helper-53: the last one pasted won, and failed)
        return [Finding(Status.FAIL, f"LOCAL_RANK={rank} but CUDA sees {seen}: torch.cuda.set_device(LOCAL_RANK) "
                        "fails with 'invalid device ordinal'", _export(serving),
                        env={"CUDA_VISIBLE_DEVICES": ",".join(serving)})]
    if physical is not None and rank >= physical:  # no list can serve it: the node has too few GPUs
        return [Finding(Status.FAIL, f"LOCAL_RANK={rank} but CUDA sees {seen} and this node has {physical}: "
                        "torch.cuda.set_device(LOCAL_RANK) fails with 'invalid device ordinal'",
                        f"# launch at most one rank per GPU on this node: torchrun --nproc-per-node={physical}")]
    if facts.gpus and all(g.mig_devices for g in facts.gpus):  # a process enumerates one MIG device (helper-98)
        return [Finding(Status.FAIL, f"LOCAL_RANK={rank} but CUDA sees {seen}: the GPUs are in MIG mode, where a "
                        "process enumerates one MIG device; torch.cuda.set_device(LOCAL_RANK) fails with 'invalid "
                        "device ordinal'", "give each rank its own MIG device (CUDA_VISIBLE_DEVICES=<its MIG UUID>, "
                        "nvidia-smi -L) and use cuda:0 in every rank")]
    return [Finding(Status.FAIL, f"LOCAL_RANK={rank} but CUDA sees {seen}: torch.cuda.set_device(LOCAL_RANK) fails "
                    "with 'invalid device ordinal'",
                    (_export(range(physical)) + "  # every rank on a node sees the node's GPUs; or, when each "
                     "rank gets one GPU, use cuda:0 instead of cuda:LOCAL_RANK") if physical else
                    "unset CUDA_VISIBLE_DEVICES  # every rank on a node sees the node's GPUs; or, when each rank "
                    "gets one GPU, use cuda:0 instead of cuda:LOCAL_RANK")]


RULES = (_rule_listed_twice, _rule_bad_entry, _rule_lenient, _rule_no_such_device, _rule_bare_prefix,
         _rule_mig_prefix_on_a_gpu,
         _rule_same_gpu_twice, _rule_mig_devices_beyond_the_first, _rule_device_order, _rule_container_gpus,
         _rule_local_rank)


def _ok_summary(facts: VisibleFacts, view: View) -> str:
    raw, physical, count = facts.cuda_visible_devices, view.physical, view.visible_count
    if raw is None:
        if physical is None:
            return "CUDA_VISIBLE_DEVICES is unset: CUDA will use every GPU"
        if count == 1 and facts.gpus and all(g.mig_devices for g in facts.gpus):
            migs = sum(len(g.mig_devices) for g in facts.gpus)
            return (f"CUDA_VISIBLE_DEVICES is unset on {physical} GPU{'s' if physical != 1 else ''} in MIG mode: CUDA "
                    f"will use one MIG device, the first of {migs} (a process enumerates only one)")
        return f"CUDA_VISIBLE_DEVICES is unset: CUDA will use all {physical} GPU{'s' if physical != 1 else ''}"
    if count == 0 and _hides_all_on_purpose(view) and _no_gpu_here(facts):
        return f"CUDA_VISIBLE_DEVICES={quoted_value(raw)} hides every GPU, and this node has none: the job runs on the CPU"
    shown = _some(view.visible_list) or "none"
    if view.parsed is not None and view.parsed.mode == vd.MIG_UUID:  # a MIG device is no GPU (helper-98)
        return f"CUDA_VISIBLE_DEVICES={quoted_value(raw)}: CUDA will use {count} MIG device{'s' if count != 1 else ''} ({shown})"
    of = f" of {physical}" if physical is not None else ""
    total = physical if physical is not None else count
    return f"CUDA_VISIBLE_DEVICES={quoted_value(raw)}: CUDA will use {count}{of} GPU{'s' if total != 1 else ''} ({shown})"


def judge(facts: VisibleFacts, settings) -> Result:
    view = _view(facts)
    findings = [finding for rule in RULES for finding in rule(facts, view)]
    unverified = None
    if facts.gpus is None:
        what = "GPU count unknown" if facts.cuda_visible_devices is None else "indices and UUIDs not checked against the GPUs"
        unverified = f"{what}: {facts.nvml_reason or 'NVML is not available'}"
    rank = _local_rank(facts)
    if (rank is not None and view.visible_count is not None and rank >= view.visible_count and view.visible_count
            and _no_gpu_here(facts)):
        beyond = (f"LOCAL_RANK={rank} is beyond the {view.visible_count} GPU{'s' if view.visible_count != 1 else ''} "
                  f"CUDA_VISIBLE_DEVICES shows: not judged, since this node has no GPU (on a GPU node "
                  "torch.cuda.set_device(LOCAL_RANK) would fail)")
        unverified = f"{unverified}; {beyond}" if unverified else beyond
    facts_out = {
        "cuda_visible_devices": facts.cuda_visible_devices,
        "visible": view.visible_list,
        "ignored": list(view.parsed.ignored) if view.parsed is not None else [],
        "physical_count": view.physical,
        "visible_count": view.visible_count,
        "cuda_device_order": facts.cuda_device_order,
        "local_rank": _local_rank(facts),
        "findings": [f.message for f in findings],
        "unverified": unverified,
    }
    return verdict(findings, facts_out, _ok_summary(facts, view), note=unverified or "")


CHECK = Check(
    id="cuda.visible_devices",
    title="CUDA_VISIBLE_DEVICES selects the GPUs the job expects",
    gather=gather,
    judge=judge,
    modes=("check", "serve", "exec", "inprocess"),  # the environment and NVML: cheap, no CUDA context
    intrusive=False,
    explain=__doc__,
    metrics=(Metric("cuda_visible_gpus", "visible_count", "Number of GPUs CUDA will expose to the target after CUDA_VISIBLE_DEVICES (absent when it is unset and no NVML counts the GPUs)"),),
)
