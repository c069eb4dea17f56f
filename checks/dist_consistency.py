"""dist.consistency: every rank of a distributed launch agrees with every other before training.

Reads, on every rank: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
the host name, the variables that must match (`must_match`: the NCCL_* and
TORCH_NCCL_* set, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, PYTORCH_CUDA_ALLOC_CONF,
CUBLAS_WORKSPACE_CONFIG and the determinism switches), the torch, CUDA, cuDNN and
NCCL versions of the job's interpreter, the NVIDIA driver version (NVML), and the
GPU the rank will use: CUDA_VISIBLE_DEVICES resolved through NVML to the physical
devices, then the LOCAL_RANK-th of them (or the only one, when each rank sees
exactly one), named by its UUID. Every rank publishes these in a store every rank
can reach; rank 0 gathers them and judges them together; every rank reports rank
0's verdict, so every rank exits with the same code and a launcher stops the job
as a whole.

The store: torchrun's agent store where there is one (TORCHELASTIC_USE_AGENT_STORE
=True; MASTER_ADDR:MASTER_PORT, reached with torch.distributed.TCPStore as a
client, as init_process_group reaches it); otherwise rank 0 hosts a TCPStore on
MASTER_ADDR:MASTER_PORT for the duration of the check and closes it before the
job starts (rank 0 then proves the port free again). The store client runs in a
subprocess of the job's interpreter (`--python`); envdoctor's own process never
imports torch. Keys live under `envdoctor/dist.consistency/v1/`, which torch
never writes, and are deleted at the end.

Why it matters: each rank's own checks can pass while the ranks differ, and only
a comparison shows it. Another torch or NCCL build on one node, one rank with a
different NCCL_* variable (NCCL_P2P_DISABLE, NCCL_ALGO, NCCL_PROTO...), an older
driver, two local ranks on one GPU, a rank that never arrived: the job dies, or
hangs in its first all-reduce until the 30-minute collective timeout, or trains
with silently different numerics (TF32, cuBLAS workspace, allocator settings).

Statuses (every rank reports the same one): `fail` when a version or a must-match
variable differs between ranks (per node only for `may_differ_across_nodes`,
names like NCCL_SOCKET_IFNAME that legitimately name each node's own NICs), two
ranks use one GPU, two processes claim one RANK, a host's ranks do not fit its
LOCAL_WORLD_SIZE (duplicate LOCAL_RANKs, more or fewer ranks than it says), or a
rank did not arrive within `wait_seconds` (named: rank and expected host); a rank
that could not reach the store, or heard no verdict from rank 0, fails with the
reason. `error` when the exchange itself broke. `skip` when this is not a
distributed launch (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT not all set), a
single rank, a --pid target (each rank must run the check itself), or no torch in
the interpreter.

GPUs are compared for ranks whose torch is a CUDA or ROCm build (`compare_gpus =
"auto"`): a CPU build uses no GPU, so gloo ranks on a GPU host share nothing;
`"always"` compares every rank's resolved GPU, `"never"` none.
GPU resolution follows NVML's order (PCI bus order). CUDA's default order is
fastest-first, which is the same on nodes of one GPU model; on mixed nodes set
CUDA_DEVICE_ORDER=PCI_BUS_ID (cuda.visible_devices warns about it).

How to fix: run every node from one image or environment (same torch build,
same driver); export the same NCCL_* and determinism variables on every rank
(the fix names the value most ranks have); leave CUDA_VISIBLE_DEVICES unset under
torchrun (rank N uses cuda:LOCAL_RANK) or give each local rank its own GPU; start
the missing rank, or raise `wait_seconds` when nodes start slowly.

Run it under the launcher: `torchrun --nproc-per-node=8 ... -m envdoctor check`,
or before the job on every rank: `torchrun ... --no-python envdoctor exec --strict --
python train.py`. An srun step counts as a launch too (envdoctor.launch maps
SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID... to torch's names; the batch
script exports MASTER_PORT). It binds a port (rank 0, without an agent store), so
it never runs in `serve`; in `exec` the job has not started yet and the port is
given back, proved free, before it does. Its waits shrink to fit the time the
runner gives it (exec's bound), so it answers rather than being cut off.
"""

from __future__ import annotations

import fnmatch
import time
from collections import Counter

from envdoctor import launch, log, visible_devices as vd
from envdoctor.check import Check
from envdoctor.errors import Unavailable
from envdoctor.model import Finding, Result, Status, host_name, skip, verdict
from envdoctor.redact import is_allowed, looks_secret

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping

    from envdoctor import rendezvous


MIN_EXCHANGE_SECONDS = 3.0  # start the subprocess, import torch's store (warm), meet, read the verdict

MUST_MATCH = [
    "NCCL_*", "TORCH_NCCL_*", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_STEP_ID",  # an srun step's WORLD_SIZE and identity
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "TORCH_DISTRIBUTED_DEBUG", "PYTHONHASHSEED",
]
MAY_DIFFER_ACROSS_NODES = ["NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_TOPO_FILE"]
SHOWN_TOO = ("CUDA_VISIBLE_DEVICES",)  # exchanged for the GPU message, never compared

VERSIONS = (
    ("torch_version", "torch"),
    ("cuda_version", "torch's CUDA build"),
    ("hip_version", "torch's ROCm build"),
    ("cudnn_version", "cuDNN"),
    ("nccl_version", "NCCL"),
    ("driver_version", "NVIDIA driver"),
)
UNIFORM_FIX = {
    "torch_version": "install one torch build on every node (one image or lock file): pip install 'torch=={value}'",
    "cuda_version": "install one torch build on every node, the CUDA {value} wheel on each: pip install 'torch==<the version "
                    "the other ranks have>' --index-url https://download.pytorch.org/whl/{wheel_tag}",
    "hip_version": "install one torch build on every node (same ROCm wheel)",
    "cudnn_version": "use one image on every node: the cuDNN torch loads (nvidia-cudnn-cu* wheel or system libcudnn) must be the same",
    "nccl_version": "use one image on every node: the NCCL torch loads (nvidia-nccl-cu* wheel or NCCL_ROOT) must be the same",
    "driver_version": "install NVIDIA driver {value} on every node (or drain the nodes that differ)",
}


# -- gathering ----------------------------------------------------------------------------------


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _digested(name: str) -> bool:
    """Does this variable leave its rank as a digest (a secret-looking name)?"""
    return looks_secret(name) or not (is_allowed(name) or name == "PYTHONHASHSEED")


def shared_env(env: Mapping[str, str], patterns: Iterable[str]) -> dict[str, str]:
    """The variables that leave this rank: the must-match set and CUDA_VISIBLE_DEVICES.
    Secret-looking names travel as a digest (still comparable, never shown)."""
    patterns = list(patterns)
    out: dict[str, str] = {}
    for name, value in env.items():
        if not (_matches(name, patterns) or name in SHOWN_TOO):
            continue
        if _digested(name):
            import hashlib  # here, not at import: it maps libcrypto, a cost every start paid

            value = "sha256:" + hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()[:12]
        out[name] = value
    return out


def _no_verdict(rank: int, facts: Mapping[str, Any]) -> Result:
    """A rank other than 0 that heard nothing: say every way that happens, a late rank too."""
    waited = facts.get("waited_seconds")
    return Result(Status.FAIL, f"rank {rank} heard no verdict from rank 0 (on {facts.get('master')}) "
                  f"within {waited if waited is not None else '?'} s: rank 0 did not start the check, died, "
                  "or had given up waiting for this rank and started its job (a rank that arrives after rank 0 "
                  "gave up misses the exchange: after wait_seconds, or under envdoctor exec after its --timeout, "
                  "whichever ends first)",
                  "start rank 0 (check its log and node), and every rank within that time of it; when nodes start "
                  "slowly, raise [check.\"dist.consistency\"] wait_seconds, and under envdoctor exec give every "
                  "rank a --timeout above the slowest start (helper-121: wait_seconds alone left exec's bound at ~17 s)",
                  {"rank": rank, "store": facts.get("store")})


def resolve_gpu(cvd: str | None, local_rank: int | None, gpus: list[tuple[str, list[str]]]) -> dict[str, Any]:
    """The GPU a rank will use: {"uuid": ...} or {"uuid": None, "reason": ...}.

    `gpus` is NVML's list of (GPU UUID, MIG device UUIDs). The visible devices are
    CUDA_VISIBLE_DEVICES resolved as CUDA does (envdoctor.visible_devices); the rank
    uses the LOCAL_RANK-th (torch.cuda.set_device(LOCAL_RANK), what torchrun scripts
    do), or the only one when each rank sees exactly one (per-rank binding, cuda:0).
    """
    if not gpus:
        return {"uuid": None, "reason": "no GPU on this node"}
    uuids = [u for u, _ in gpus]
    if cvd is None:
        visible = uuids
    else:
        parsed = vd.parse(cvd)
        res = vd.resolve(parsed, len(gpus), uuids, [m for _, migs in gpus for m in migs])
        pool = [m for _, migs in gpus for m in migs] if parsed.mode == vd.MIG_UUID else uuids
        visible = [pool[o] for o in res.ordinals if o < len(pool)]
    if not visible:
        return {"uuid": None, "reason": f"CUDA_VISIBLE_DEVICES={cvd!r} leaves no GPU"}
    if local_rank is None:
        return {"uuid": None, "reason": "LOCAL_RANK is not set: the script picks its GPU"}
    if local_rank < len(visible):
        return {"uuid": visible[local_rank], "visible": len(visible)}
    if len(visible) == 1:
        return {"uuid": visible[0], "visible": 1}
    return {"uuid": None, "reason": f"LOCAL_RANK={local_rank} but {len(visible)} GPUs are visible"}


def _nvml_facts(ctx, env: Mapping[str, str], local_rank: int | None) -> dict[str, Any]:
    try:
        nvml = ctx.nvml
        driver = nvml.driver_version() or None
        devices = nvml.devices()
    except Unavailable as exc:
        return {"driver_version": None, "gpu": {"uuid": None, "reason": f"no NVML: {exc}"}}
    # A GPU NVML could not name is still one device, but only on this host: qualify it.
    gpus = [(g.uuid or f"{host_name()}/GPU {g.index} (no UUID)", list(g.mig_devices)) for g in devices]
    return {"driver_version": driver, "gpu": resolve_gpu(env.get("CUDA_VISIBLE_DEVICES"), local_rank, gpus)}


def launch_of(env: Mapping[str, str]) -> dict[str, Any] | str:
    """The launch this process belongs to (envdoctor.launch: torchrun's variables, or an
    srun step's), as the exchange's request fields; or why there is none (a skip reason)."""
    found = launch.of(env)
    if isinstance(found, str):
        return found
    return {"rank": found.rank, "world_size": found.world_size, "master_addr": found.master_addr,
            "master_port": found.master_port, "agent_store": found.agent_store, "run_id": found.run_id}


def gather(ctx) -> dict[str, Any]:
    env = ctx.env
    found = launch.of(env)
    if isinstance(found, str):
        return {"skip": found}
    if ctx.target.pid is not None:
        return {"skip": "compares ranks only when each rank runs it itself (torchrun ... -m envdoctor check), not for --pid"}
    settings = ctx.config
    own = {
        "rank": found.rank, "world_size": found.world_size, "local_rank": found.local_rank,
        "local_world_size": found.local_world_size, "group_rank": found.group_rank,
        "host": host_name(), "env": shared_env(env, settings.get("must_match", MUST_MATCH)),
    }
    own.update(_nvml_facts(ctx, env, found.local_rank))
    waits = {k: float(settings.get(k, d)) for k, d in (("wait_seconds", 60.0), ("ack_seconds", 10.0))}
    bad = [f"{k} = {v!r}" for k, v in waits.items() if not 0 < v <= 86400]  # NaN fails this too
    if bad:
        return {"bad_setting": f"[check.\"dist.consistency\"] {', '.join(bad)}: must be a number of seconds "
                               "above 0 and at most 86400"}
    from envdoctor import probe, rendezvous  # here: only a rank of a launch gets this far (~1.5 ms to import)

    request = rendezvous.Request(facts=own, import_seconds=probe.default_timeout(), **waits, **launch_of(env))
    if ctx.deadline is not None:  # exec's budget, or a --timeout shorter than the exchange would take
        left = 0.9 * (ctx.deadline - time.monotonic()) - 0.2
        if left < MIN_EXCHANGE_SECONDS:
            return {"too_short": round(max(0.0, left), 2), "rank": found.rank, "master": found.master}
        request = request.fitted(left)
    store = {"torchrun": "torchrun's agent store", "slurm": "rank 0's own store (an srun step)"}.get(found.launcher,
                                                                                                    "rank 0's own store")
    base = {"rank": found.rank, "world_size": found.world_size, "store": store,
            "master": found.master, "wait_seconds": round(request.wait_seconds, 3)}
    try:
        outcome = rendezvous.exchange(ctx.python, request, lambda o: _decide(o, base, settings))
    except rendezvous.StoreUnreachable as exc:
        return {**base, "role": "unreachable", "reason": str(exc)}
    except rendezvous.ExchangeError as exc:  # a broken torch, a port taken, a subprocess that died: a reason
        return {**base, "role": "broken", "reason": str(exc)}
    facts: dict[str, Any] = {**base, "role": outcome.role, "own": outcome.own or own}
    if outcome.role == "judge":
        facts.update(ranks=outcome.ranks, claims=outcome.claims, waited_seconds=outcome.waited_seconds,
                     acked=outcome.acked, expected_acks=outcome.expected_acks)
        if outcome.hosted:
            facts["port_after"] = _port_after(found.master_port)
    else:
        facts.update(verdict=outcome.verdict, waited_seconds=outcome.waited_seconds)
    return facts


def _decide(outcome: rendezvous.Outcome, base: dict[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """Rank 0, mid-exchange: judge the gathered facts into the verdict every rank will report.
    A failing verdict is also logged at once: under torchrun the first rank to exit 1
    makes the agent stop the others, so rank 0's printed report could come too late."""
    try:
        result = compare(outcome.ranks, outcome.claims, {**base, "waited_seconds": outcome.waited_seconds}, settings)
    except Exception as exc:  # a bug here must still give every rank an answer, not a 2-minute wait
        result = Result(Status.ERROR, f"rank 0 could not judge the ranks' facts: {type(exc).__name__}: {exc}")
    if result.status in (Status.WARN, Status.FAIL, Status.ERROR):
        log.event("error" if result.status != Status.WARN else "warn", f"dist.consistency: {result.summary}",
                  check="dist.consistency", rank=0, fix=result.remediation)
    return {"status": result.status.value, "summary": result.summary, "remediation": result.remediation,
            "fix_env": dict(result.fix_env), "facts": result.facts}


def _port_after(port: int) -> str | None:
    """After rank 0's own store closed: None when MASTER_PORT can be bound again (what the job needs)."""
    import socket  # here: only rank 0 of a launch gets this far

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", port))
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        sock.close()


# -- judging ------------------------------------------------------------------------------------


def ranks_text(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> "ranks 0-2, 5"; [3] -> "rank 3"."""
    rs = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(parts)


def _groups(values: Mapping[int, Any]) -> list[tuple[Any, list[int]]]:
    """Value -> the ranks holding it, most common first (ties: the one rank 0 holds first)."""
    by: dict[str, tuple[Any, list[int]]] = {}
    for rank in sorted(values):
        key = repr(values[rank])
        by.setdefault(key, (values[rank], []))[1].append(rank)
    return sorted(by.values(), key=lambda g: (-len(g[1]), g[1][0]))


def _shown(value: Any) -> str:
    return "unset" if value is None else repr(value) if isinstance(value, str) else str(value)


def _version(value: Any) -> str:
    return "none" if value is None else str(value)


def _where(ranks: list[int], hosts: Mapping[int, str]) -> str:
    names = sorted({hosts[r] for r in ranks if r in hosts})
    on = f" on {', '.join(names[:3])}{' and more' if len(names) > 3 else ''}" if names else ""
    return ranks_text(ranks) + on


def _differs(what: str, values: Mapping[int, Any], hosts: Mapping[int, str], show=_shown) -> str:
    groups = _groups(values)
    return f"{what} differs: " + "; ".join(f"{show(v)} on {_where(rs, hosts)}" for v, rs in groups)


def rule_missing(present: Iterable[int], world: int, hosts: Mapping[int, str], lws: int | None,
                 waited: Any, master: str, claimed_twice: bool = False) -> list[Finding]:
    missing = [r for r in range(world) if r not in set(present)]
    if not missing:
        return []

    def expected(rank: int) -> str:
        if lws:  # torchrun numbers ranks node by node: rank // LOCAL_WORLD_SIZE is the node
            node = rank // lws
            peers = Counter(h for r, h in hosts.items() if r // lws == node)
            if peers:
                return f"expected on {peers.most_common(1)[0][0]}"
            return f"expected on node {node}, from which no rank arrived"
        return "host unknown"

    shown = ", ".join(f"rank {r} ({expected(r)})" for r in missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    waited_text = f" within {waited:g} s" if isinstance(waited, (int, float)) else ""
    if claimed_twice:  # the RANK the missing process should have had was given to another one (helper-114)
        return [Finding(Status.FAIL, f"{len(missing)} of {world} ranks did not arrive{waited_text}: {shown}; a "
                        "RANK was given to two processes (below), so the rank nobody took is missing",
                        "give every process its own RANK; the missing ranks come with it")]
    return [Finding(Status.FAIL, f"{len(missing)} of {world} ranks did not arrive{waited_text}: {shown}; they did not "
                    f"start the check, died, or cannot reach the store at {master}",
                    "start every rank (check the missing ranks' logs and nodes); when nodes start slowly, raise "
                    "[check.\"dist.consistency\"] wait_seconds (under envdoctor exec, its --timeout: the wait "
                    "is shrunk to fit it); in one rank's shell by hand, where no other rank comes, "
                    "--skip dist.consistency")]


def rule_claims(claims: Mapping[int, int]) -> list[Finding]:
    dup = {r: n for r, n in claims.items() if n > 1}
    if not dup:
        return []
    text = "; ".join(f"RANK={r} by {n} processes" for r, n in sorted(dup.items()))
    return [Finding(Status.FAIL, f"one RANK claimed by several processes ({text}): the rendezvous will hang or mix them up",
                    "give every process its own RANK (torchrun sets RANK = node_rank * nproc_per_node + LOCAL_RANK)")]


def _wheel_tag(cuda: Any) -> str:
    """PyTorch's wheel index for a CUDA version: "12.8" -> "cu128"; "cpu" for none."""
    if cuda is None:
        return "cpu"
    digits = "".join(str(cuda).split(".")[:2])
    return f"cu{digits}" if digits.isdigit() else "cpu"


def rule_versions(ranks: Mapping[int, dict], hosts: Mapping[int, str]) -> list[Finding]:
    findings = []
    for key, what in VERSIONS:
        values = {r: f.get(key) for r, f in ranks.items()}
        if len({repr(v) for v in values.values()}) > 1:
            groups = _groups(values)
            majority = groups[0][0]
            findings.append(Finding(Status.FAIL, _differs(what, values, hosts, _version),
                                    UNIFORM_FIX[key].format(value=majority if majority is not None else "...",
                                                            wheel_tag=_wheel_tag(majority)) + _tie(groups)))
    return findings


def _tie(groups: list[tuple[Any, list[int]]]) -> str:
    """What a fix that breaks a tie says of itself (helper-90: it took rank 0's side without
    a word; helper-95: versions too, and an unset variable has no value to speak of)."""
    if len(groups) < 2 or len(groups[0][1]) != len(groups[1][1]):
        return ""
    rank = groups[0][1][0]
    what = "as it is on" if groups[0][0] is None else "the value of"
    return f" (no majority: {what} rank {rank}, the lowest rank of the sides that tie)"


def rule_env(ranks: Mapping[int, dict], hosts: Mapping[int, str], per_node: Iterable[str]) -> list[Finding]:
    per_node = list(per_node)
    names = sorted({n for f in ranks.values() for n in (f.get("env") or {}) if n not in SHOWN_TOO})
    findings = []
    for name in names:
        values = {r: (f.get("env") or {}).get(name) for r, f in ranks.items()}
        scopes = [values]
        if _matches(name, per_node):  # may name each node's own NICs: compare within each host only
            scopes = [{r: v for r, v in values.items() if hosts.get(r) == h} for h in sorted(set(hosts.values()))]
        for scope in scopes:
            if len({repr(v) for v in scope.values()}) <= 1:
                continue
            groups = _groups(scope)
            majority = groups[0][0]
            tie = _tie(groups)
            # The value as data, for exec --fix; never a secret's digest (it is not the value).
            env = {} if _digested(name) else {name: majority}
            if majority is None:
                findings.append(Finding(Status.FAIL, _differs(name, scope, hosts), f"unset {name} on every rank{tie}",
                                        env=env))
            else:
                findings.append(Finding(Status.FAIL, _differs(name, scope, hosts),
                                        f"export {name}={majority} on every rank{tie}", env=env))
    return findings


def rule_gpus(ranks: Mapping[int, dict], hosts: Mapping[int, str]) -> list[Finding]:
    by_uuid: dict[str, list[int]] = {}
    for r, f in sorted(ranks.items()):
        uuid = (f.get("gpu") or {}).get("uuid")
        if uuid:
            by_uuid.setdefault(uuid, []).append(r)
    findings = []
    for uuid, rs in by_uuid.items():
        if len(rs) < 2:
            continue
        how = ", ".join(f"rank {r} with LOCAL_RANK={ranks[r].get('local_rank')} and CUDA_VISIBLE_DEVICES "
                        f"{_shown((ranks[r].get('env') or {}).get('CUDA_VISIBLE_DEVICES'))}" for r in rs[:4])
        findings.append(Finding(Status.FAIL, f"{_where(rs, hosts)} use one GPU, {uuid} ({how}): they share its memory "
                                "and the first collective fails or runs out of memory",
                                "give each local rank its own GPU: under torchrun leave CUDA_VISIBLE_DEVICES unset and "
                                "use cuda:LOCAL_RANK, or set CUDA_VISIBLE_DEVICES=$LOCAL_RANK per rank and use cuda:0"))
    return findings


def gpu_ranks(ranks: Mapping[int, dict], mode: str) -> tuple[dict[int, dict], str | list[Finding]]:
    """The ranks whose GPU is compared, and why the others are not (a note, or a bad setting).

    `auto`: the ranks whose torch is a CUDA or ROCm build; a CPU build never touches a
    GPU, so two CPU ranks resolving to one GPU of the node (gloo on a GPU host) share
    nothing. `always`: every rank with a resolved GPU (the job's GPU use is known
    otherwise). `never`: none.
    """
    if mode == "never":
        return {}, "compare_gpus = never"
    if mode == "always":
        return dict(ranks), ""
    if mode != "auto":
        return dict(ranks), [Finding(Status.ERROR, f"compare_gpus = {mode!r}: expected auto, always or never",
                                     "[check.\"dist.consistency\"] compare_gpus = \"auto\"")]
    built = {r: f for r, f in ranks.items() if f.get("cuda_version") or f.get("hip_version")}
    cpu = [r for r in ranks if r not in built]
    if not cpu:
        return built, ""
    return built, f"torch {_version(ranks[cpu[0]].get('torch_version'))} on {ranks_text(cpu)} is a CPU build, which uses no GPU"


def rule_layout(ranks: Mapping[int, dict], complete: bool) -> list[Finding]:
    """Per host: LOCAL_RANKs distinct, LOCAL_WORLD_SIZE agreed, and as many ranks as it says."""
    fix = "launch the same --nproc-per-node on every node with torchrun, which sets LOCAL_RANK and LOCAL_WORLD_SIZE"
    by_host: dict[str, dict[int, dict]] = {}
    for r, f in ranks.items():
        by_host.setdefault(str(f.get("host")), {})[r] = f
    findings = []
    for host, members in sorted(by_host.items()):
        local = {r: f.get("local_rank") for r, f in members.items() if f.get("local_rank") is not None}
        for value, rs in _groups(local):
            if len(rs) > 1:
                findings.append(Finding(Status.FAIL, f"{host}: {ranks_text(rs)} all have LOCAL_RANK={value}", fix))
        sizes = {r: f.get("local_world_size") for r, f in members.items() if f.get("local_world_size") is not None}
        if len({*sizes.values()}) > 1:
            findings.append(Finding(Status.FAIL, f"{host}: " + _differs("LOCAL_WORLD_SIZE", sizes, {}), fix))
        elif sizes:
            lws = next(iter(sizes.values()))
            n = len(members)
            if n > lws:
                findings.append(Finding(Status.FAIL, f"{host} runs {n} ranks ({ranks_text(members)}) but LOCAL_WORLD_SIZE="
                                        f"{lws} (or two nodes share one host name)", fix))
            elif n < lws and complete:
                findings.append(Finding(Status.FAIL, f"{host} runs {n} ranks ({ranks_text(members)}) but LOCAL_WORLD_SIZE="
                                        f"{lws}: the others are on other hosts", fix))
    return findings


def compare(ranks: Mapping[int, dict], claims: Mapping[int, int], base: Mapping[str, Any],
            settings: Mapping[str, Any]) -> Result:
    """Rank 0's judgement of every rank's facts (pure)."""
    world = int(base["world_size"])
    readable = {r: f for r, f in ranks.items() if "unreadable" not in f}
    hosts = {r: str(f.get("host")) for r, f in readable.items()}
    lws = Counter(f.get("local_world_size") for f in readable.values() if f.get("local_world_size")).most_common(1)
    findings: list[Finding] = []
    claimed_twice = rule_claims(claims)
    findings += rule_missing(ranks, world, hosts, lws[0][0] if lws else None, base.get("waited_seconds"), base["master"],
                             claimed_twice=bool(claimed_twice))
    findings += [Finding(Status.ERROR, f"rank {r}'s facts could not be read: {f['unreadable']}") for r, f in
                 sorted(ranks.items()) if "unreadable" in f]
    findings += claimed_twice
    findings += rule_versions(readable, hosts)
    findings += rule_env(readable, hosts, settings.get("may_differ_across_nodes", MAY_DIFFER_ACROSS_NODES))
    on_gpu, why_not = gpu_ranks(readable, settings.get("compare_gpus", "auto"))
    findings += why_not if isinstance(why_not, list) else []
    findings += rule_gpus(on_gpu, hosts)
    findings += rule_layout(readable, complete=len(ranks) == world)

    first = readable.get(0) or next(iter(readable.values()), {})
    gpus = sorted({(f.get("gpu") or {}).get("uuid") for f in on_gpu.values()} - {None})
    facts = {
        "world_size": world, "ranks_present": len(ranks), "store": base.get("store"), "master": base.get("master"),
        "hosts": {h: sorted(r for r, x in hosts.items() if x == h) for h in sorted(set(hosts.values()))},
        "versions": {k: first.get(k) for k, _ in VERSIONS},
        "compared_variables": sorted({n for f in readable.values() for n in (f.get("env") or {}) if n not in SHOWN_TOO}),
        "gpus": {str(r): (f.get("gpu") or {}).get("uuid") for r, f in sorted(readable.items())},
        "findings": [f.message for f in findings],
        # Every problem is a variable with the majority's value as its fix: when every rank
        # applies it (exec --fix on every rank), the ranks agree without judging again.
        "fixable_by_env": bool(findings) and all(f.env for f in findings),
    }
    n_hosts = len(facts["hosts"])
    names = facts["compared_variables"]
    v = {k: _version(first.get(k)) for k, _ in VERSIONS}
    ok = (f"{world} ranks on {n_hosts} host{'s' if n_hosts != 1 else ''} agree: torch {v['torch_version']}, "
          f"CUDA {v['cuda_version']}, cuDNN {v['cudnn_version']}, NCCL {v['nccl_version']}, driver {v['driver_version']}; "
          f"{len(names)} variable{'s' if len(names) != 1 else ''} equal ({', '.join(names[:6])}{', ...' if len(names) > 6 else ''}); "
          + (f"{len(gpus)} GPUs, one per rank" if gpus else "GPUs not compared (" + (
              # compare_gpus = always, or only CUDA builds: the reason is the ranks' own (helper-114: "()")
              why_not if isinstance(why_not, str) and why_not else str((first.get("gpu") or {}).get("reason") or "none resolved"))
             + ")"))
    return verdict(findings, facts, ok, note=f"via {base.get('store')} at {base.get('master')}")


def judge(facts: Mapping[str, Any], settings: Mapping[str, Any]) -> Result:
    if "skip" in facts:
        return skip(facts["skip"])
    if "bad_setting" in facts:
        return Result(Status.ERROR, facts["bad_setting"], "[check.\"dist.consistency\"] wait_seconds = 60", dict(facts))
    if "too_short" in facts:
        return Result(Status.ERROR, f"only {facts['too_short']:g} s left for the cross-rank exchange (rank "
                      f"{facts['rank']}, {facts['master']}); it needs at least {MIN_EXCHANGE_SECONDS:g} s to start "
                      "torch's store client and meet the other ranks",
                      "give it time: envdoctor exec --timeout 120 (the default under a launch), or "
                      "[check.\"dist.consistency\"] timeout = 300 for check", dict(facts))
    role = facts.get("role")
    rank = facts.get("rank")
    if role == "broken":
        reason = str(facts.get("reason", ""))
        if "in use" in reason.lower() or "EADDRINUSE" in reason:
            return Result(Status.FAIL, f"rank {rank} could not host the exchange store at {facts.get('master')}: "
                          f"{reason}; the job's own store could not bind it either",
                          "export MASTER_PORT=<a free port> on every rank  # something else holds this one",
                          {"rank": rank, "store": facts.get("store"), "master": facts.get("master")})
        return Result(Status.ERROR, f"rank {rank}: the cross-rank exchange could not be completed: {reason}", "",
                      {"rank": rank, "store": facts.get("store"), "master": facts.get("master")})
    if role == "unreachable":
        return Result(Status.FAIL, f"rank {rank} {facts['reason']}: rank 0 did not start the check, or "
                      f"{facts['master']} is not reachable from this host",
                      "start rank 0; check that MASTER_ADDR resolves to rank 0's host and MASTER_PORT is open between nodes",
                      {"rank": rank, "store": facts.get("store"), "master": facts.get("master")})
    if role == "judge":
        result = compare(facts["ranks"], facts.get("claims", {}), facts, settings)
        acked, expected = facts.get("acked"), facts.get("expected_acks")
        if isinstance(acked, int) and isinstance(expected, int) and acked < expected:
            # a note, not a finding: every other rank already reports the verdict as sent, and
            # all ranks must exit alike; a rank that died after publishing is the launcher's to see
            unconfirmed = (f"{expected - acked} of {expected} other ranks did not confirm reading the verdict within "
                           "ack_seconds: they may have died or been killed after publishing their facts")
            result.facts = {**result.facts, "notes": [*(result.facts.get("notes") or []), unconfirmed]}
            # said in the summary too, which the log line and every format show: in the notes alone,
            # rank 0 logged "ok, 2 ranks agree" while rank 1 was refusing its job (helper-121)
            result.summary = f"{result.summary}; {unconfirmed}"
        if facts.get("port_after"):
            extra = Finding(Status.FAIL, f"MASTER_PORT {facts['master']} is still taken after rank 0 closed its exchange "
                            f"store ({facts['port_after']}): the job cannot host its store there",
                            "export MASTER_PORT=<a free port>  # something else holds this one")
            result = verdict([Finding(result.status, result.summary, result.remediation, result.fix_env), extra],
                             result.facts, result.summary)
        return result
    v = facts.get("verdict")
    if not isinstance(v, dict):
        return _no_verdict(rank, facts)
    try:
        status = Status(v.get("status"))
    except ValueError:
        status = Status.ERROR
    out = dict(v.get("facts") or {})
    out["verdict_from"] = 0
    return Result(status, str(v.get("summary", "")), str(v.get("remediation", "")), out,
                  fix_env={str(k): (None if x is None else str(x)) for k, x in (v.get("fix_env") or {}).items()})


CHECK = Check(
    id="dist.consistency",
    title="Every rank of a distributed launch agrees: versions, NCCL_* and determinism variables, one GPU each, all present",
    gather=gather,
    judge=judge,
    explain=__doc__,
    modes=("check", "exec"),
    intrusive=True,  # rank 0 binds MASTER_PORT when there is no launcher store: never in serve
    released_before_job=True,  # ...and closes it, proving the port free, before exec becomes the job
    timeout=300.0,  # the exchange bounds itself within this: import + 2 x wait_seconds + acks (rendezvous.Request)
    config={
        "wait_seconds": 60.0,
        "ack_seconds": 10.0,
        "must_match": list(MUST_MATCH),
        "may_differ_across_nodes": list(MAY_DIFFER_ACROSS_NODES),
        "compare_gpus": "auto",  # auto: ranks whose torch is a CUDA/ROCm build; always; never
    },
)
