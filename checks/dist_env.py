"""dist.env: the distributed-launch variables agree with each other and with this host.

Reads the target's WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT (as torchrun, torch.distributed.launch, DeepSpeed and Slurm wrappers
set them), the NCCL variables that are most often wrong (NCCL_SOCKET_IFNAME,
NCCL_P2P_DISABLE, NCCL_IB_DISABLE, NCCL_DEBUG) and GLOO_SOCKET_IFNAME; resolves
MASTER_ADDR (in a thread, bounded by `resolve_timeout_seconds`); lists the
target's network interfaces (<procfs>/PID/net/dev, which is the target's own
network namespace, else <sysfs>/class/net). Whether MASTER_PORT is free is the
dist.master_port check's question: it binds the port, which serve and exec never do.

Why it matters: `init_process_group(init_method="env://")` needs MASTER_ADDR,
MASTER_PORT, RANK and WORLD_SIZE together; one missing, a rank at or beyond the
world size, or a master name that does not resolve, and every rank waits at the
rendezvous until the timeout (30 minutes by default) before failing. A
MASTER_PORT already taken on the master makes rank 0 die with "address already
in use". LOCAL_RANK picks the GPU (cuda:LOCAL_RANK), so it must stay below
LOCAL_WORLD_SIZE. NCCL_SOCKET_IFNAME naming no interface on the host stops NCCL
with "no socket interface found"; NCCL_P2P_DISABLE and NCCL_IB_DISABLE, often
left over from debugging, silently make collectives several times slower;
NCCL_DEBUG=INFO floods production logs.

Which variables go together (our rule): if any of the six launch variables is
set, WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT are all required (what the
env:// rendezvous reads); LOCAL_RANK is required when LOCAL_WORLD_SIZE is set;
LOCAL_RANK and LOCAL_WORLD_SIZE are otherwise optional (mpirun- or Slurm-style
launchers do not always set them).

Under an srun step without torch's names (the script maps them itself, later),
SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, the node's SLURM_STEP_TASKS_PER_NODE
entry and the step's first node stand in for RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE and MASTER_ADDR (envdoctor.launch); the summary says so.

NCCL_SOCKET_IFNAME grammar (as NCCL's socket code reads it): a comma-separated
list of interface-name prefixes (`eth` selects eth0, eth1, ...); a leading `^`
excludes the listed prefixes instead; a leading `=` (after any `^`) makes them
exact names (`=eth0`, `^=docker0`); a `:port` suffix on an entry is ignored for
interface selection; blanks are part of the names; at most 16 entries are read.

Statuses: `fail` for missing partners, non-integers, RANK >= WORLD_SIZE,
LOCAL_RANK >= LOCAL_WORLD_SIZE, LOCAL_WORLD_SIZE > WORLD_SIZE, a port outside
1-65535, a master address that does not resolve, NCCL_SOCKET_IFNAME or
GLOO_SOCKET_IFNAME selecting no interface of the target. `warn` for a master
address that did not resolve in time, a loopback master or loopback-only NCCL interface on a
multi-node job, NCCL_P2P_DISABLE / NCCL_IB_DISABLE set, NCCL_DEBUG=INFO/TRACE.
`skip` when none of these variables is set.

How to fix: launch with torchrun, which sets all of them consistently
(`torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=node1:29500
--rdzv-id=JOB train.py` on every node: without --rdzv-backend=c10d each node takes node rank 0);
otherwise export the missing ones; name a real interface (`export NCCL_SOCKET_IFNAME=eth0`, see `ip -br link`);
unset the NCCL_*_DISABLE switches and set `NCCL_DEBUG=WARN`.
"""

from __future__ import annotations

import ipaddress
import re
from collections import namedtuple
from types import MappingProxyType

from envdoctor import launch as launch_module
from envdoctor.check import Check
from envdoctor.errors import ParseError
from envdoctor.paths import read_text
from envdoctor.watchdog import RAISED, STUCK, TIMED_OUT, default_watchdog
from envdoctor.quoted import quoted_value
from envdoctor.model import Finding, Result, Status, skip, verdict

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping

LAUNCH_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
REQUIRED = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")
NCCL_VARS = ("NCCL_SOCKET_IFNAME", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_DEBUG", "GLOO_SOCKET_IFNAME")
_NCCL_MAX_IFS = 16
_INTEGER = re.compile(r"^\s*[+-]?[0-9]{1,30}\s*$")  # longer is no rank or port (and int() refuses > 4300 digits)


# -- parsers (untrusted text in, a value or ParseError out) -------------------------------------


def parse_net_dev(text: str) -> list[str]:
    """Interface names from /proc/<pid>/net/dev (two header lines, then `name: counters`)."""
    if not isinstance(text, str):
        raise ParseError(f"net/dev must be text, got {type(text).__name__}")
    lines = text.splitlines()
    if len(lines) < 2 or "|" not in lines[0]:
        raise ParseError("not a /proc/net/dev table (its first line has no '|')")
    names: list[str] = []
    for n, line in enumerate(lines[2:], start=3):
        if not line.strip():
            continue
        name, sep, _ = line.partition(":")
        name = name.strip()
        if not sep or not name or any(c.isspace() for c in name):
            raise ParseError(f"net/dev line {n} is not 'name: counters': {line[:60]!r}")
        names.append(name)
    return names


class IfnameSpec(namedtuple("IfnameSpec", (
        "raw",  # str
        "exclude",  # bool
        "exact",  # bool
        "names",  # tuple[str, ...]
        "dropped",  # tuple[str, ...] = (): entries beyond NCCL's 16
), defaults=((),))):
    """NCCL_SOCKET_IFNAME as NCCL reads it (see the module docstring)."""

    __slots__ = ()

    def selects(self, interface: str) -> bool:
        if not self.names:
            matched = True  # NCCL: an empty list matches everything
        elif self.exact:
            matched = interface in self.names
        else:
            matched = any(interface.startswith(prefix) for prefix in self.names)
        return matched != self.exclude


def parse_ifname_spec(text: str) -> IfnameSpec:
    if not isinstance(text, str):
        raise ParseError(f"NCCL_SOCKET_IFNAME must be text, got {type(text).__name__}")
    rest = text
    exclude = rest.startswith("^")
    if exclude:
        rest = rest[1:]
    exact = rest.startswith("=")
    if exact:
        rest = rest[1:]
    names = [item.split(":", 1)[0] for item in rest.split(",")]
    names = [n for n in names if n]
    return IfnameSpec(text, exclude, exact, tuple(names[:_NCCL_MAX_IFS]), tuple(names[_NCCL_MAX_IFS:]))


def _int(value: str | None) -> int | None:
    if value is None or not _INTEGER.match(value):
        return None
    return int(value)


def _truthy_nccl(value: str | None) -> bool:
    """NCCL reads its switches as integers; anything non-zero turns the switch on."""
    n = _int(value)
    return n is not None and n != 0


# -- gathering ----------------------------------------------------------------------------------


class DistFacts(namedtuple("DistFacts", (
        "env",  # dict[str, str]: only the launch and NCCL/Gloo variables
        "interfaces",  # tuple[str, ...] | None = None
        "interfaces_reason",  # str | None = None
        "master_addresses",  # tuple[str, ...] | None = None: what MASTER_ADDR resolved to
        "resolve_error",  # str | None = None
        "resolve_timed_out",  # bool = False
        "resolve_timeout",  # float = 2.0
        "master_is_local",  # bool | None = None
        "target_is_self",  # bool = True
        "extra",  # Mapping[str, Any] = MappingProxyType({}): read only: one empty default for all
), defaults=(None, None, None, None, False, 2.0, None, True, MappingProxyType({})))):
    __slots__ = ()


def _interfaces(ctx) -> tuple[tuple[str, ...] | None, str | None]:
    path = ctx.proc("net", "dev")
    try:
        return tuple(parse_net_dev(read_text(path))), None  # non-blocking: a FIFO here cannot hold the check
    except (OSError, ParseError) as exc:
        first = f"{path}: {exc}"
    sysnet = ctx.sys("class", "net")
    try:
        return tuple(sorted(p.name for p in sysnet.iterdir())), None
    except OSError as exc:
        return None, f"cannot list network interfaces ({first}; {sysnet}: {exc.strerror or exc})"


def resolve(host: str, port: int | None, timeout: float) -> tuple[tuple[str, ...] | None, str | None, bool]:
    """(addresses, why it failed, timed out): getaddrinfo on the watchdog, so a dead DNS
    server cannot hang the run (nor, in serve, pile up a thread per interval: a lookup
    still stuck is not started again)."""

    import socket  # here: a launch's MASTER_ADDR is the only name resolved (~3 ms to import)

    def lookup() -> tuple[str, ...]:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return tuple(dict.fromkeys(info[4][0] for info in infos))

    outcome = default_watchdog().call(("resolve", host, port), lookup, timeout)
    if outcome.kind in (TIMED_OUT, STUCK):
        return None, None, True
    if outcome.kind == RAISED:
        exc = outcome.error
        if isinstance(exc, (OSError, UnicodeError)):
            # EAI_AGAIN ("temporary failure in name resolution") says nothing about the name, only
            # that no server answered: the same news as a timeout, so the same status.
            temporary = isinstance(exc, socket.gaierror) and exc.errno == socket.EAI_AGAIN
            return None, getattr(exc, "strerror", None) or str(exc), temporary
        raise exc  # type: ignore[misc]
    return outcome.value, None, False


def _local_addresses() -> set[str]:
    addrs: set[str] = set()
    try:
        import socket

        import psutil

        for entries in psutil.net_if_addrs().values():
            for entry in entries:
                if entry.family in (socket.AF_INET, socket.AF_INET6):
                    addrs.add(entry.address.split("%", 1)[0])
    except Exception:  # psutil missing or broken: loopback is still known
        pass
    return addrs


def is_local(addresses: tuple[str, ...]) -> bool:
    """Does any of these addresses belong to this host (loopback included)?"""
    local = _local_addresses()
    return any(_loopback(a) or a.split("%", 1)[0] in local for a in addresses)


def master_port(env: Mapping[str, str]) -> int | None:
    """MASTER_PORT when it is a usable port number, else None."""
    port = _int(env.get("MASTER_PORT"))
    return port if port is not None and 1 <= port <= 65535 else None


def slurm_context(env: Mapping[str, str]) -> str | None:
    """Why the torch variables are legitimately incomplete here, or None:
    "batch": a Slurm batch script exporting MASTER_ADDR/MASTER_PORT for the srun steps to
    come (its tasks get their ranks there); "step: <reason>": an srun step whose SLURM_*
    variables cannot stand in for torch's (the reason names what is wrong)."""
    if all(env.get(n, "").strip() for n in ("WORLD_SIZE", "RANK")) or not env.get("SLURM_JOB_ID", "").strip():
        return None
    if not env.get("SLURM_STEP_ID", "").strip():
        return "batch"
    found = launch_module.of(env)
    return f"step: {found}" if isinstance(found, str) else None


def from_srun(env: Mapping[str, str]) -> dict[str, str]:
    """An srun step's SLURM_* variables in torch's names (envdoctor.launch), where RANK or
    WORLD_SIZE is absent: the script maps them itself, after this check has run."""
    found = launch_module.of(env)
    if isinstance(found, str) or found.launcher != "slurm":
        return {}
    mapped = {"WORLD_SIZE": str(found.world_size), "RANK": str(found.rank), "MASTER_ADDR": found.master_addr}
    if found.local_rank is not None:
        mapped["LOCAL_RANK"] = str(found.local_rank)
    if found.local_world_size is not None:
        mapped["LOCAL_WORLD_SIZE"] = str(found.local_world_size)
    return mapped


def gather(ctx) -> DistFacts:
    env = {k: v for k, v in ctx.env.items() if k in LAUNCH_VARS or k in NCCL_VARS}
    srun = {k: v for k, v in from_srun(ctx.env).items() if not ctx.env.get(k, "").strip()}  # torch's, where set, win
    env = {**srun, **env}
    if not env:
        return DistFacts(env)
    slurm = slurm_context(ctx.env) if any(k in ctx.env for k in LAUNCH_VARS) else None
    if slurm is not None:
        return DistFacts(env, extra={"slurm": slurm})
    timeout = float(ctx.settings["resolve_timeout_seconds"])
    facts: dict[str, Any] = {"resolve_timeout": timeout, "target_is_self": ctx.target.pid is None,
                             "extra": {"from_srun": sorted(srun)} if srun else {}}
    if "NCCL_SOCKET_IFNAME" in env or "GLOO_SOCKET_IFNAME" in env:
        facts["interfaces"], facts["interfaces_reason"] = _interfaces(ctx)
    addr = (env.get("MASTER_ADDR") or "").strip()
    if addr:
        addrs, err, timed_out = resolve(addr, master_port(env), timeout)
        facts.update(master_addresses=addrs, resolve_error=err, resolve_timed_out=timed_out)
        if addrs:
            facts["master_is_local"] = is_local(addrs)
    return DistFacts(env, **facts)


# -- judging ------------------------------------------------------------------------------------


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# --rdzv-backend=c10d: without it torchrun's static rendezvous makes every node node-rank 0,
# and a second node fails to host the store on the first one's address (helper-91)
TORCHRUN = ("torchrun --nnodes=N --nproc-per-node=GPUS --rdzv-backend=c10d --rdzv-endpoint=MASTER:29500 "
            "--rdzv-id=JOB train.py  # sets them all")


class Launch(namedtuple("Launch", (
        "env",  # Mapping[str, str]
        "values",  # Mapping[str, int | None]
))):
    """The launch variables as numbers (None: unset or not an integer)."""

    __slots__ = ()

    @property
    def world(self) -> int | None:
        return self.values.get("WORLD_SIZE")

    @property
    def local_world(self) -> int | None:
        return self.values.get("LOCAL_WORLD_SIZE")

    @property
    def multi_node(self) -> bool | None:
        world, local_world = self.world, self.local_world
        if world is None or local_world is None or local_world < 1:
            return None
        return world > local_world


def _launch(env: Mapping[str, str]) -> Launch:
    values = {k: _int(env[k]) for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT")
              if k in env and env[k].strip()}
    return Launch(env, values)


def _rule_missing(facts: DistFacts, launch: Launch) -> list[Finding]:
    """env:// needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE together."""
    present = [k for k in LAUNCH_VARS if k in facts.env]
    if not present:
        return []
    missing = [k for k in REQUIRED if not facts.env.get(k, "").strip()]
    if "LOCAL_WORLD_SIZE" in present and "LOCAL_RANK" not in present:
        missing.append("LOCAL_RANK")
    if not missing:
        return []
    empty = [k for k in missing if k in facts.env]  # set, but to nothing: missing, not also "set"
    present = [k for k in present if k not in empty]
    said = f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing"
    if empty:
        said += f" ({', '.join(empty)} set but empty)"
    if not present:
        return [Finding(Status.FAIL, f"{said}: init_process_group(init_method='env://') needs MASTER_ADDR, "
                        "MASTER_PORT, RANK and WORLD_SIZE together", TORCHRUN)]
    needs = []
    if any(k in REQUIRED for k in missing):
        needs.append("init_process_group(init_method='env://') needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE "
                     "together")
    if "LOCAL_RANK" in missing:  # helper-84: only it missing was told the four above were
        needs.append("a launch that sets LOCAL_WORLD_SIZE sets LOCAL_RANK too (torchrun does), and a script "
                     "picks its GPU by it")
    return [Finding(Status.FAIL, f"{said} while "
                    f"{', '.join(present)} {'is' if len(present) == 1 else 'are'} set: " + "; ".join(needs), TORCHRUN)]


def _rule_numbers(facts: DistFacts, launch: Launch) -> list[Finding]:
    """Every launch number an integer, at or above its floor; the port in range."""
    found = [Finding(Status.FAIL, f"{k}={quoted_value(facts.env[k])} is not an integer", TORCHRUN)
             for k, v in launch.values.items() if v is None]
    for k, low in (("WORLD_SIZE", 1), ("LOCAL_WORLD_SIZE", 1), ("RANK", 0), ("LOCAL_RANK", 0)):
        value = launch.values.get(k)
        if value is not None and value < low:
            found.append(Finding(Status.FAIL, f"{k}={value} is below {low}", TORCHRUN))
    port = launch.values.get("MASTER_PORT")
    alone = port == 0 and launch.values.get("WORLD_SIZE") == 1  # the store binds a free port; no one else must find it
    if port is not None and not 1 <= port <= 65535 and not alone:
        found.append(Finding(Status.FAIL, f"MASTER_PORT={port} is outside 1-65535", "export MASTER_PORT=29500",
                             env={"MASTER_PORT": "29500"}))
    return found


def _rule_ranks(facts: DistFacts, launch: Launch) -> list[Finding]:
    """Ranks below their sizes; a node no bigger than the world."""
    v, found = launch.values, []
    world, rank, local_rank, local_world = v.get("WORLD_SIZE"), v.get("RANK"), v.get("LOCAL_RANK"), v.get("LOCAL_WORLD_SIZE")
    if world is not None and rank is not None and world >= 1 and rank >= world:
        found.append(Finding(Status.FAIL, f"RANK={rank} but WORLD_SIZE={world}: ranks run 0-{world - 1}", TORCHRUN))
    if local_world is not None and local_rank is not None and local_world >= 1 and local_rank >= local_world:
        found.append(Finding(Status.FAIL, f"LOCAL_RANK={local_rank} but LOCAL_WORLD_SIZE={local_world}: local ranks "
                             f"run 0-{local_world - 1}", TORCHRUN))
    if local_world is not None and world is not None and local_world > world >= 1:
        found.append(Finding(Status.FAIL, f"LOCAL_WORLD_SIZE={local_world} exceeds WORLD_SIZE={world}", TORCHRUN))
    return found


def _rule_master_addr(facts: DistFacts, launch: Launch) -> list[Finding]:
    """MASTER_ADDR has no blanks around it, resolves in time, and is not loopback for a job
    that spans nodes."""
    raw = facts.env.get("MASTER_ADDR", "")
    addr = raw.strip()
    if not addr or not any(k in facts.env for k in LAUNCH_VARS):
        return []
    if raw != addr:  # helper-92: torch hands them to the resolver, which fails; every rank waits out its timeout
        return [Finding(Status.FAIL, f"MASTER_ADDR={quoted_value(raw)} has blanks around the address: torch resolves "
                        "them as part of the name, no rank reaches the rendezvous, and each waits out its timeout "
                        "(30 min by default)", f"export MASTER_ADDR={addr}", env={"MASTER_ADDR": addr})]
    if facts.resolve_timed_out:  # or EAI_AGAIN: no DNS server answered, the same news as a timeout
        why = (f"could not be resolved now ({facts.resolve_error}: the DNS server did not answer)" if facts.resolve_error
               else f"did not resolve within {facts.resolve_timeout:g} s (slow or unreachable DNS)")
        return [Finding(Status.WARN, f"MASTER_ADDR={quoted_value(addr)} {why}: ranks may time out at the rendezvous",
                        f"getent hosts {addr}  # or export MASTER_ADDR=<rank 0's IP address>")]
    if facts.master_addresses is None and facts.resolve_error is not None:
        return [Finding(Status.FAIL, f"MASTER_ADDR={quoted_value(addr)} does not resolve ({facts.resolve_error}): every rank will "
                        "fail to reach the rendezvous", "export MASTER_ADDR=<rank 0's hostname or IP address>")]
    if facts.master_addresses and launch.multi_node and all(_loopback(a) for a in facts.master_addresses):
        return [Finding(Status.WARN, f"MASTER_ADDR={quoted_value(addr)} is a loopback address but the job spans nodes "
                        f"(WORLD_SIZE={launch.world}, LOCAL_WORLD_SIZE={launch.local_world}): other nodes cannot reach it",
                        "export MASTER_ADDR=<rank 0's hostname or IP address>")]
    return []


def _rule_nccl_ifname(facts: DistFacts, launch: Launch) -> list[Finding]:
    """NCCL_SOCKET_IFNAME selects an interface the target has (not only lo across nodes)."""
    if "NCCL_SOCKET_IFNAME" not in facts.env:
        return []
    spec, interfaces, found = parse_ifname_spec(facts.env["NCCL_SOCKET_IFNAME"]), facts.interfaces, []
    if interfaces is not None:
        selected = [i for i in interfaces if spec.selects(i)]
        usable = [i for i in interfaces if i != "lo" and not i.startswith(("docker", "veth", "ifb"))]
        suggestion = f"export NCCL_SOCKET_IFNAME={usable[0] if usable else 'eth0'}"
        if not selected:
            blanks = " (blanks are part of the names)" if any(n != n.strip() for n in spec.names) else ""
            found.append(Finding(Status.FAIL, f"NCCL_SOCKET_IFNAME={quoted_value(spec.raw)} selects no interface of the target (it "
                                 f"has {', '.join(interfaces) or 'none'}){blanks}: NCCL stops with 'no socket interface "
                                 "found'", suggestion))
        elif launch.multi_node and all(i == "lo" for i in selected):
            found.append(Finding(Status.WARN, f"NCCL_SOCKET_IFNAME={quoted_value(spec.raw)} selects only the loopback interface "
                                 "but the job spans nodes", suggestion))
    if spec.dropped:
        found.append(Finding(Status.WARN, f"NCCL_SOCKET_IFNAME lists more than {_NCCL_MAX_IFS} entries: NCCL ignores "
                             f"{', '.join(spec.dropped)}", "list at most 16 interface prefixes"))
    return found


def _rule_gloo_ifname(facts: DistFacts, launch: Launch) -> list[Finding]:
    """GLOO_SOCKET_IFNAME takes exact names, each of which the target must have."""
    value = facts.env.get("GLOO_SOCKET_IFNAME")
    if value is None or facts.interfaces is None:
        return []
    wanted = [n.strip() for n in value.split(",") if n.strip()]
    absent = [n for n in wanted if n not in facts.interfaces]
    if wanted and not absent:
        return []
    return [Finding(Status.FAIL, f"GLOO_SOCKET_IFNAME={quoted_value(value)} names {', '.join(absent) or 'no interface'}, which the "
                    f"target does not have (it has {', '.join(facts.interfaces) or 'none'})",
                    "export GLOO_SOCKET_IFNAME=eth0  # exact names, see ip -br link")]


def _rule_nccl_switches(facts: DistFacts, launch: Launch) -> list[Finding]:
    """Debugging switches left on: P2P or InfiniBand off, NCCL_DEBUG=INFO."""
    env, found = facts.env, []
    if _truthy_nccl(env.get("NCCL_P2P_DISABLE")):
        found.append(Finding(Status.WARN, f"NCCL_P2P_DISABLE={env['NCCL_P2P_DISABLE']} turns off NVLink/PCIe "
                             "peer-to-peer between GPUs: collectives inside a node go through host memory, often "
                             "several times slower", "unset NCCL_P2P_DISABLE", env={"NCCL_P2P_DISABLE": None}))
    if _truthy_nccl(env.get("NCCL_IB_DISABLE")):
        found.append(Finding(Status.WARN, f"NCCL_IB_DISABLE={env['NCCL_IB_DISABLE']} turns off InfiniBand/RoCE: traffic "
                             "between nodes falls back to TCP sockets, far slower", "unset NCCL_IB_DISABLE",
                             env={"NCCL_IB_DISABLE": None}))
    if env.get("NCCL_DEBUG", "").strip().upper() in ("INFO", "TRACE"):
        found.append(Finding(Status.WARN, f"NCCL_DEBUG={env['NCCL_DEBUG']} logs every communicator setup and, with "
                             "subsystems on, every connection: log volume in production", "export NCCL_DEBUG=WARN",
                             env={"NCCL_DEBUG": "WARN"}))
    return found


RULES = (_rule_missing, _rule_numbers, _rule_ranks, _rule_master_addr, _rule_nccl_ifname, _rule_gloo_ifname,
         _rule_nccl_switches)


def _ok_summary(facts: DistFacts, launch: Launch, nccl: Mapping[str, str]) -> str:
    parts, v = [], launch.values
    if any(k in facts.env for k in LAUNCH_VARS):
        rank_part = f"rank {v.get('RANK')} of {v.get('WORLD_SIZE')}"
        if v.get("LOCAL_RANK") is not None:
            rank_part += f" (local {v['LOCAL_RANK']}" + (
                f" of {v['LOCAL_WORLD_SIZE']})" if v.get("LOCAL_WORLD_SIZE") is not None else ")")
        parts.append(rank_part)
        resolved = f" ({', '.join(facts.master_addresses)})" if facts.master_addresses else ""
        parts.append(f"master {facts.env.get('MASTER_ADDR')}:{facts.env.get('MASTER_PORT')}{resolved}")
    if nccl:
        parts.append(", ".join(f"{k}={v}" for k, v in nccl.items()))
    return "; ".join(parts)


def judge(facts: DistFacts, settings: Mapping[str, Any]) -> Result:
    nccl = {k: facts.env[k] for k in NCCL_VARS if k in facts.env}
    if not facts.env:
        return skip("no distributed launch variables are set (WORLD_SIZE, RANK, MASTER_ADDR, ...): not a DDP launch")
    slurm = facts.extra.get("slurm")
    if slurm == "batch":
        return skip("a Slurm batch script, not a rank: the variables set here are for the srun steps to come "
                    "(run `srun ... envdoctor check` to check each task in its step)")
    if slurm:
        return Result(Status.FAIL, slurm.removeprefix("step: "),
                      "export MASTER_PORT=<a free port> (and MASTER_ADDR=<rank 0's host>) in the batch script; "
                      "srun sets SLURM_PROCID, SLURM_STEP_NUM_TASKS and SLURM_LOCALID itself",
                      {"slurm_step": True, "reason": slurm.removeprefix("step: ")})
    launch = _launch(facts.env)
    findings = [finding for rule in RULES for finding in rule(facts, launch)]
    v = launch.values
    facts_out: dict[str, Any] = {
        "world_size": v.get("WORLD_SIZE"),
        "rank": v.get("RANK"),
        "local_rank": v.get("LOCAL_RANK"),
        "local_world_size": v.get("LOCAL_WORLD_SIZE"),
        "master_addr": facts.env.get("MASTER_ADDR"),
        "master_port": v.get("MASTER_PORT"),
        "master_addresses": list(facts.master_addresses) if facts.master_addresses else [],
        "master_is_local": facts.master_is_local,
        "interfaces": list(facts.interfaces) if facts.interfaces is not None else None,
        "nccl": nccl,
        "findings": [f.message for f in findings],
    }
    notes = [n for n in (facts.interfaces_reason,) if n]
    if facts.extra.get("from_srun"):
        facts_out["from_srun"] = facts.extra["from_srun"]
        notes.append(f"{', '.join(facts.extra['from_srun'])} from srun's SLURM_* variables")
    return verdict(findings, facts_out, _ok_summary(facts, launch, nccl), note="; ".join(notes))


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


CHECK = Check(
    id="dist.env",
    title="Distributed-launch variables (WORLD_SIZE, RANK, MASTER_*, NCCL_*) are complete, consistent and usable here",
    gather=gather,
    judge=judge,
    explain=__doc__,
    # Reads the environment, resolves MASTER_ADDR and lists interfaces: harmless anywhere.
    # Binding MASTER_PORT to see that it is free is intrusive: that is dist.master_port.
    modes=("check", "serve", "exec", "inprocess"),
    intrusive=False,
    config={"resolve_timeout_seconds": 2.0},
)
