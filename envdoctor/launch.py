"""Which distributed launch a process belongs to, read from its environment.

torchrun (and torch.distributed.launch, and most wrappers) tell each rank who it
is with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT. Slurm's `srun` starts the ranks itself and says the same things in
its own words: SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, the tasks per
node as a run-length list ("4(x2),2") and the nodes as a host list
("gpu[01-04]"). A training script launched by srun usually maps these to the
torch names itself, after envdoctor has run; so envdoctor maps them too, the
same way, when the torch names are absent.

Only an srun *step* is a launch: a batch script also has SLURM_PROCID=0 and
SLURM_NTASKS, but it is one process, not rank 0 of many, so the step variables
(SLURM_STEP_ID, SLURM_STEP_NUM_TASKS) are required. MASTER_PORT has no Slurm
counterpart: the batch script must export it (and MASTER_ADDR, unless the first
node of the step is the right address).

    of(env) -> Launch, or a string saying why this is not a usable launch
"""

from __future__ import annotations

import re
from collections import namedtuple

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Mapping

_INT = re.compile(r"^\s*[+-]?[0-9]{1,30}\s*$")  # longer is no rank or port (and int() refuses > 4300 digits)
TORCH_NAMES = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")
HOW_TO_LAUNCH = "run it under the launcher: torchrun --nproc-per-node=N -m envdoctor check (or srun ... envdoctor check)"


class Launch(namedtuple("Launch", (
        "launcher",  # str: "torchrun" (its agent store is up), "env" (the torch variables), "slurm" (srun's)
        "rank",  # int
        "world_size",  # int
        "master_addr",  # str
        "master_port",  # int
        "local_rank",  # int | None = None
        "local_world_size",  # int | None = None
        "group_rank",  # int | None = None: the node's index in the launch
        "agent_store",  # bool = False: torchrun's agent hosts a store on MASTER_ADDR:MASTER_PORT
        "run_id",  # str = "own": the same on every rank of one launch; names the exchange's keys
), defaults=(None, None, None, False, "own"))):
    """One rank's place in a distributed launch."""

    __slots__ = ()

    @property
    def master(self) -> str:
        return f"{self.master_addr}:{self.master_port}"


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and _INT.match(value) else None


def _short(value: str | None) -> str:
    """A value for a message: quoted, and cut when a hostile one is long."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _safe_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_./-]", "_", text)


def of(env: Mapping[str, str]) -> Launch | str:
    """The launch this environment belongs to, or why there is none (a skip reason)."""
    if env.get("SLURM_STEP_ID", "").strip() and not all(env.get(n, "").strip() for n in ("WORLD_SIZE", "RANK")):
        return _slurm(env)
    missing = [n for n in TORCH_NAMES if not env.get(n, "").strip()]
    if missing:
        return f"not a distributed launch ({', '.join(missing)} not set); {HOW_TO_LAUNCH}"
    world, rank, port = _int(env["WORLD_SIZE"]), _int(env["RANK"]), _int(env["MASTER_PORT"])
    if world is None or rank is None or port is None or not 0 <= rank < world or not 1 <= port <= 65535:
        return "the launch variables are not usable (dist.env says why): nothing to compare"
    if world == 1:
        return "WORLD_SIZE=1: a single rank, nothing to compare"
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    run = f"{env.get('TORCHELASTIC_RUN_ID', 'none')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}" if agent else "own"
    return Launch(launcher="torchrun" if agent else "env", rank=rank, world_size=world,
                  master_addr=env["MASTER_ADDR"].strip(), master_port=port,
                  local_rank=_int(env.get("LOCAL_RANK")), local_world_size=_int(env.get("LOCAL_WORLD_SIZE")),
                  group_rank=_int(env.get("GROUP_RANK")), agent_store=agent, run_id=_safe_id(run))


def names_a_rank(env: Mapping[str, str]) -> bool:
    """Does this environment say it is one rank of several, usable or not (WORLD_SIZE above
    1 with a RANK, or an srun step of several tasks)?"""
    world = _int(env.get("WORLD_SIZE")) or _int(env.get("SLURM_STEP_NUM_TASKS") if env.get("SLURM_STEP_ID") else None)
    rank = env.get("RANK", "").strip() or (env.get("SLURM_PROCID", "").strip() if env.get("SLURM_STEP_ID") else "")
    return bool(world and world > 1 and rank)


def _torch_or(env: Mapping[str, str], name: str, slurm: str | None) -> str | None:
    """torch's variable where it is set (a script may export some itself), else Slurm's."""
    value = env.get(name, "")
    return value if value.strip() else slurm


def _slurm(env: Mapping[str, str]) -> Launch | str:
    """An srun step: its variables mapped to the torch ones (each torch one set wins)."""
    world = _int(_torch_or(env, "WORLD_SIZE", env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")))
    rank = _int(_torch_or(env, "RANK", env.get("SLURM_PROCID")))
    if world is None or rank is None or not 0 <= rank < world:
        return ("an srun step without a usable SLURM_PROCID and SLURM_STEP_NUM_TASKS "
                f"({_short(env.get('SLURM_PROCID'))} of {_short(env.get('SLURM_STEP_NUM_TASKS'))}): nothing to compare")
    if world == 1:
        return "a single srun task (SLURM_STEP_NUM_TASKS=1): nothing to compare"
    addr = env.get("MASTER_ADDR", "").strip() or first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "")
    port = _int(env.get("MASTER_PORT"))
    if not addr or port is None or not 1 <= port <= 65535:
        return ("an srun step, but MASTER_PORT " + ("is not usable" if env.get("MASTER_PORT", "").strip() else "is not set")
                + (" and no node list names rank 0's host" if not addr else "")
                + ": export MASTER_PORT=<a free port> (and MASTER_ADDR=<rank 0's host>) in the batch script, "
                "as init_process_group needs them too")
    node = _int(env.get("SLURM_NODEID"))
    per_node = tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "")
    local_world = per_node[node] if node is not None and 0 <= node < len(per_node) else None
    run = f"slurm-{env.get('SLURM_JOB_ID', 'none')}.{env.get('SLURM_STEP_ID', '0')}"
    local_world = _int(_torch_or(env, "LOCAL_WORLD_SIZE", None)) or local_world
    return Launch(launcher="slurm", rank=rank, world_size=world, master_addr=addr, master_port=port,
                  local_rank=_int(_torch_or(env, "LOCAL_RANK", env.get("SLURM_LOCALID"))),
                  local_world_size=local_world, group_rank=node, run_id=_safe_id(run))


def tasks_per_node(text: str) -> list[int]:
    """Slurm's run-length list: "4(x2),2" -> [4, 4, 2]; [] when it cannot be read."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*([0-9]+)(?:\(x([0-9]+)\))?\s*", part)
        if not m:
            return []
        count = int(m.group(2) or 1)
        if count > 100_000 or len(out) + count > 100_000:  # a hostile value must not cost memory
            return []
        out.extend([int(m.group(1))] * count)
    return out


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: "gpu[07-09,12],cpu1" -> "gpu07"; "" when empty.

    Each bracket stands for its first member, so "rack[2-3]-n[01-04]" -> "rack2-n01"."""
    depth = 0
    first = []
    for ch in nodelist.strip():
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            break
        first.append(ch)
    text = "".join(first)
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], text).strip()
