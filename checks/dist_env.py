"""dist.env: the distributed-launch variables agree with each other and with this host.

Reads the target's WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT (as torchrun, torch.distributed.launch, DeepSpeed and Slurm wrappers
set them), the NCCL variables that are most often wrong (NCCL_SOCKET_IFNAME,
NCCL_P2P_DISABLE, NCCL_IB_DISABLE, NCCL_DEBUG) and GLOO_SOCKET_IFNAME; resolves
MASTER_ADDR (in a thread, bounded by `resolve_timeout_seconds`); lists the
target's network interfaces (<procfs>/PID/net/dev, which is the target's own
network namespace, else <sysfs>/class/net); and on rank 0, when the master
address is this host, tries to bind MASTER_PORT.

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

NCCL_SOCKET_IFNAME grammar (as NCCL's socket code reads it): a comma-separated
list of interface-name prefixes (`eth` selects eth0, eth1, ...); a leading `^`
excludes the listed prefixes instead; a leading `=` (after any `^`) makes them
exact names (`=eth0`, `^=docker0`); a `:port` suffix on an entry is ignored for
interface selection; blanks are part of the names; at most 16 entries are read.

Statuses: `fail` for missing partners, non-integers, RANK >= WORLD_SIZE,
LOCAL_RANK >= LOCAL_WORLD_SIZE, LOCAL_WORLD_SIZE > WORLD_SIZE, a port outside
1-65535, a master address that does not resolve, NCCL_SOCKET_IFNAME or
GLOO_SOCKET_IFNAME selecting no interface of the target. `warn` when the port is
already taken on this host while this is rank 0, a master address that did not
resolve in time, a loopback master or loopback-only NCCL interface on a
multi-node job, NCCL_P2P_DISABLE / NCCL_IB_DISABLE set, NCCL_DEBUG=INFO/TRACE.
`skip` when none of these variables is set.

How to fix: launch with torchrun, which sets all of them consistently
(`torchrun --nnodes=2 --nproc-per-node=8 --rdzv-endpoint=node1:29500 train.py`);
otherwise export the missing ones; pick a free port (`export MASTER_PORT=29501`);
name a real interface (`export NCCL_SOCKET_IFNAME=eth0`, see `ip -br link`);
unset the NCCL_*_DISABLE switches and set `NCCL_DEBUG=WARN`.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from dataclasses import dataclass, field
from typing import Any

from envdoctor.check import Check
from envdoctor.errors import ParseError
from envdoctor.watchdog import RAISED, STUCK, TIMED_OUT, default_watchdog
from envdoctor.model import Result, Status, join_fixes, skip, worst

LAUNCH_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
REQUIRED = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")
NCCL_VARS = ("NCCL_SOCKET_IFNAME", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_DEBUG", "GLOO_SOCKET_IFNAME")
_NCCL_MAX_IFS = 16
_INTEGER = re.compile(r"^\s*[+-]?[0-9]+\s*$")


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


@dataclass(frozen=True)
class IfnameSpec:
    """NCCL_SOCKET_IFNAME as NCCL reads it (see the module docstring)."""

    raw: str
    exclude: bool
    exact: bool
    names: tuple[str, ...]
    dropped: tuple[str, ...] = ()  # entries beyond NCCL's 16

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


@dataclass(frozen=True)
class DistFacts:
    env: dict[str, str]  # only the launch and NCCL/Gloo variables
    interfaces: tuple[str, ...] | None = None
    interfaces_reason: str | None = None
    master_addresses: tuple[str, ...] | None = None  # what MASTER_ADDR resolved to
    resolve_error: str | None = None
    resolve_timed_out: bool = False
    resolve_timeout: float = 2.0
    master_is_local: bool | None = None
    port_checked: bool = False
    port_error: str | None = None  # why binding MASTER_PORT failed (None: it is free)
    port_not_checked: str | None = None
    free_port: int | None = None  # a port that was free, to suggest
    target_is_self: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def _interfaces(ctx) -> tuple[tuple[str, ...] | None, str | None]:
    path = ctx.proc("net", "dev")
    try:
        return tuple(parse_net_dev(path.read_text(errors="replace"))), None
    except (OSError, ParseError) as exc:
        first = f"{path}: {exc}"
    sysnet = ctx.sys("class", "net")
    try:
        return tuple(sorted(p.name for p in sysnet.iterdir())), None
    except OSError as exc:
        return None, f"cannot list network interfaces ({first}; {sysnet}: {exc.strerror or exc})"


def _resolve(host: str, port: int | None, timeout: float) -> tuple[tuple[str, ...] | None, str | None, bool]:
    """getaddrinfo on the watchdog, so a dead DNS server cannot hang the run (nor, in
    serve, pile up a thread per interval: a lookup still stuck is not started again)."""

    def lookup() -> tuple[str, ...]:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return tuple(dict.fromkeys(info[4][0] for info in infos))

    outcome = default_watchdog().call(("resolve", host, port), lookup, timeout)
    if outcome.kind in (TIMED_OUT, STUCK):
        return None, None, True
    if outcome.kind == RAISED:
        exc = outcome.error
        if isinstance(exc, (OSError, UnicodeError)):
            return None, getattr(exc, "strerror", None) or str(exc), False
        raise exc  # type: ignore[misc]
    return outcome.value, None, False


def _local_addresses() -> set[str]:
    addrs: set[str] = set()
    try:
        import psutil

        for entries in psutil.net_if_addrs().values():
            for entry in entries:
                if entry.family in (socket.AF_INET, socket.AF_INET6):
                    addrs.add(entry.address.split("%", 1)[0])
    except Exception:  # psutil missing or broken: loopback is still known
        pass
    return addrs


def _is_local(addresses: tuple[str, ...]) -> bool:
    local = _local_addresses()
    for a in addresses:
        try:
            if ipaddress.ip_address(a.split("%", 1)[0]).is_loopback:
                return True
        except ValueError:
            continue
        if a.split("%", 1)[0] in local:
            return True
    return False


def _try_bind(address: str, port: int) -> str | None:
    """None when `port` could be bound on `address`; otherwise why not."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is not "in use"
        sock.bind((address, port))
        return None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return "address already in use"
        if exc.errno in (errno.EACCES, errno.EPERM):
            return "permission denied (ports below 1024 need root)"
        return exc.strerror or str(exc)
    finally:
        sock.close()


def _free_port(address: str) -> int | None:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((address, 0))
            return sock.getsockname()[1]
    except OSError:
        return None


def gather(ctx) -> DistFacts:
    env = {k: v for k, v in ctx.env.items() if k in LAUNCH_VARS or k in NCCL_VARS}
    if not env:
        return DistFacts(env)
    config = ctx.config
    timeout = float(config.get("resolve_timeout_seconds", 2.0))
    facts: dict[str, Any] = {"resolve_timeout": timeout, "target_is_self": ctx.target.pid is None}
    if "NCCL_SOCKET_IFNAME" in env or "GLOO_SOCKET_IFNAME" in env:
        facts["interfaces"], facts["interfaces_reason"] = _interfaces(ctx)

    addr = (env.get("MASTER_ADDR") or "").strip()
    port = _int(env.get("MASTER_PORT"))
    port = port if port is not None and 1 <= port <= 65535 else None
    if addr:
        addrs, err, timed_out = _resolve(addr, port, timeout)
        facts.update(master_addresses=addrs, resolve_error=err, resolve_timed_out=timed_out)
        if addrs:
            facts["master_is_local"] = _is_local(addrs)
            rank = _int(env.get("RANK"))
            if port is None or rank != 0:
                pass
            elif not facts["target_is_self"]:
                facts["port_not_checked"] = "not tried for --pid: the running job itself holds the port"
            elif not config.get("check_port", True):
                facts["port_not_checked"] = "port test turned off (check_port = false)"
            elif facts["master_is_local"]:
                local = next((a for a in addrs if _is_local((a,))), addrs[0]).split("%", 1)[0]
                facts["port_checked"] = True
                facts["port_error"] = _try_bind(local, port)
                if facts["port_error"]:
                    facts["free_port"] = _free_port(local)
    return DistFacts(env, **facts)


# -- judging ------------------------------------------------------------------------------------


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def judge(facts: DistFacts, config) -> Result:
    env = facts.env
    launch = {k: env[k] for k in LAUNCH_VARS if k in env}
    nccl = {k: env[k] for k in NCCL_VARS if k in env}
    if not launch and not nccl:
        return skip("no distributed launch variables are set (WORLD_SIZE, RANK, MASTER_ADDR, ...): not a DDP launch")

    findings: list[tuple[Status, str, str]] = []
    torchrun = "torchrun --nnodes=N --nproc-per-node=GPUS --rdzv-endpoint=MASTER:29500 train.py  # sets them all"
    values: dict[str, int | None] = {}
    multi_node: bool | None = None
    if launch:
        missing = [k for k in REQUIRED if not env.get(k, "").strip()]
        if "LOCAL_WORLD_SIZE" in launch and "LOCAL_RANK" not in launch:
            missing.append("LOCAL_RANK")
        if missing:
            present = ", ".join(launch)
            findings.append((Status.FAIL, f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing while "
                             f"{present} {'is' if len(launch) == 1 else 'are'} set: init_process_group(init_method='env://') "
                             "needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE together", torchrun))
        for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
            if k in env and env[k].strip():
                values[k] = _int(env[k])
                if values[k] is None:
                    findings.append((Status.FAIL, f"{k}={env[k]!r} is not an integer", torchrun))
        world, rank = values.get("WORLD_SIZE"), values.get("RANK")
        local_rank, local_world = values.get("LOCAL_RANK"), values.get("LOCAL_WORLD_SIZE")
        for k, low in (("WORLD_SIZE", 1), ("LOCAL_WORLD_SIZE", 1), ("RANK", 0), ("LOCAL_RANK", 0)):
            if values.get(k) is not None and values[k] < low:
                findings.append((Status.FAIL, f"{k}={values[k]} is below {low}", torchrun))
        if world is not None and rank is not None and world >= 1 and rank >= world:
            findings.append((Status.FAIL, f"RANK={rank} but WORLD_SIZE={world}: ranks run 0-{world - 1}", torchrun))
        if local_world is not None and local_rank is not None and local_world >= 1 and local_rank >= local_world:
            findings.append((Status.FAIL, f"LOCAL_RANK={local_rank} but LOCAL_WORLD_SIZE={local_world}: local ranks run "
                             f"0-{local_world - 1}", torchrun))
        if local_world is not None and world is not None and local_world > world >= 1:
            findings.append((Status.FAIL, f"LOCAL_WORLD_SIZE={local_world} exceeds WORLD_SIZE={world}", torchrun))
        if world is not None and local_world is not None and local_world >= 1:
            multi_node = world > local_world

        port = values.get("MASTER_PORT")
        if port is not None and not 1 <= port <= 65535:
            findings.append((Status.FAIL, f"MASTER_PORT={port} is outside 1-65535", "export MASTER_PORT=29500"))
        addr = env.get("MASTER_ADDR", "").strip()
        if addr:
            if facts.resolve_timed_out:
                findings.append((Status.WARN, f"MASTER_ADDR={addr!r} did not resolve within {facts.resolve_timeout:g} s "
                                 "(slow or unreachable DNS): ranks may time out at the rendezvous",
                                 f"getent hosts {addr}  # or export MASTER_ADDR=<rank 0's IP address>"))
            elif facts.master_addresses is None and facts.resolve_error is not None:
                findings.append((Status.FAIL, f"MASTER_ADDR={addr!r} does not resolve ({facts.resolve_error}): every "
                                 "rank will fail to reach the rendezvous", "export MASTER_ADDR=<rank 0's hostname or IP address>"))
            elif facts.master_addresses and multi_node:
                loopback = all(_loopback(a) for a in facts.master_addresses)
                if loopback:
                    findings.append((Status.WARN, f"MASTER_ADDR={addr!r} is a loopback address but the job spans nodes "
                                     f"(WORLD_SIZE={world}, LOCAL_WORLD_SIZE={local_world}): other nodes cannot reach it",
                                     "export MASTER_ADDR=<rank 0's hostname or IP address>"))
            if facts.port_checked and facts.port_error:
                other = facts.free_port or (port + 1 if port and port < 65535 else 29500)
                findings.append((Status.WARN, f"MASTER_PORT={port} on {addr} cannot be bound ({facts.port_error}) and "
                                 "this is rank 0: the rendezvous store will fail to start",
                                 f"export MASTER_PORT={other}  # a port that is free now"))

    # NCCL and Gloo
    if "NCCL_SOCKET_IFNAME" in nccl:
        spec = parse_ifname_spec(nccl["NCCL_SOCKET_IFNAME"])
        if facts.interfaces is not None:
            selected = [i for i in facts.interfaces if spec.selects(i)]
            usable = [i for i in facts.interfaces if i != "lo" and not i.startswith(("docker", "veth", "ifb"))]
            suggestion = f"export NCCL_SOCKET_IFNAME={usable[0] if usable else 'eth0'}"
            if not selected:
                blanks = " (blanks are part of the names)" if any(n != n.strip() for n in spec.names) else ""
                findings.append((Status.FAIL, f"NCCL_SOCKET_IFNAME={spec.raw!r} selects no interface of the target "
                                 f"(it has {', '.join(facts.interfaces) or 'none'}){blanks}: NCCL stops with "
                                 "'no socket interface found'", suggestion))
            elif multi_node and all(i == "lo" for i in selected):
                findings.append((Status.WARN, f"NCCL_SOCKET_IFNAME={spec.raw!r} selects only the loopback interface "
                                 "but the job spans nodes", suggestion))
        if spec.dropped:
            findings.append((Status.WARN, f"NCCL_SOCKET_IFNAME lists more than {_NCCL_MAX_IFS} entries: NCCL ignores "
                             f"{', '.join(spec.dropped)}", "list at most 16 interface prefixes"))
    if "GLOO_SOCKET_IFNAME" in nccl and facts.interfaces is not None:
        wanted = [n.strip() for n in nccl["GLOO_SOCKET_IFNAME"].split(",") if n.strip()]
        absent = [n for n in wanted if n not in facts.interfaces]
        if absent or not wanted:
            findings.append((Status.FAIL, f"GLOO_SOCKET_IFNAME={nccl['GLOO_SOCKET_IFNAME']!r} names "
                             f"{', '.join(absent) or 'no interface'}, which the target does not have (it has "
                             f"{', '.join(facts.interfaces) or 'none'})", "export GLOO_SOCKET_IFNAME=eth0  # exact names, see ip -br link"))
    if _truthy_nccl(nccl.get("NCCL_P2P_DISABLE")):
        findings.append((Status.WARN, f"NCCL_P2P_DISABLE={nccl['NCCL_P2P_DISABLE']} turns off NVLink/PCIe peer-to-peer "
                         "between GPUs: collectives inside a node go through host memory, often several times slower",
                         "unset NCCL_P2P_DISABLE"))
    if _truthy_nccl(nccl.get("NCCL_IB_DISABLE")):
        findings.append((Status.WARN, f"NCCL_IB_DISABLE={nccl['NCCL_IB_DISABLE']} turns off InfiniBand/RoCE: traffic "
                         "between nodes falls back to TCP sockets, far slower", "unset NCCL_IB_DISABLE"))
    debug = nccl.get("NCCL_DEBUG", "").strip().upper()
    if debug in ("INFO", "TRACE"):
        findings.append((Status.WARN, f"NCCL_DEBUG={nccl['NCCL_DEBUG']} logs every communicator setup and, with "
                         "subsystems on, every connection: log volume in production", "export NCCL_DEBUG=WARN"))

    facts_out: dict[str, Any] = {
        "world_size": values.get("WORLD_SIZE"),
        "rank": values.get("RANK"),
        "local_rank": values.get("LOCAL_RANK"),
        "local_world_size": values.get("LOCAL_WORLD_SIZE"),
        "master_addr": env.get("MASTER_ADDR"),
        "master_port": values.get("MASTER_PORT"),
        "master_addresses": list(facts.master_addresses) if facts.master_addresses else [],
        "master_is_local": facts.master_is_local,
        "port_checked": facts.port_checked,
        "port_error": facts.port_error,
        "interfaces": list(facts.interfaces) if facts.interfaces is not None else None,
        "nccl": nccl,
        "findings": [m for _, m, _ in findings],
    }
    notes = [n for n in (facts.port_not_checked, facts.interfaces_reason) if n]
    if not findings:
        parts = []
        if launch:
            rank_part = f"rank {values.get('RANK')} of {values.get('WORLD_SIZE')}"
            if values.get("LOCAL_RANK") is not None:
                rank_part += f" (local {values['LOCAL_RANK']}" + (
                    f" of {values['LOCAL_WORLD_SIZE']})" if values.get("LOCAL_WORLD_SIZE") is not None else ")")
            parts.append(rank_part)
            resolved = f" ({', '.join(facts.master_addresses)})" if facts.master_addresses else ""
            port_state = ", port free" if facts.port_checked else ""
            parts.append(f"master {env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}{resolved}{port_state}")
        if nccl:
            parts.append(", ".join(f"{k}={v}" for k, v in nccl.items()))
        summary = "; ".join(parts) + (f" ({'; '.join(notes)})" if notes else "")
        return Result(Status.OK, summary, "", facts_out)
    status = worst([s for s, _, _ in findings])
    fix = join_fixes(findings)
    summary = "; ".join(m for _, m, _ in findings) + (f" ({'; '.join(notes)})" if notes else "")
    return Result(status, summary, fix, facts_out)


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


CHECK = Check(
    id="dist.env",
    title="Distributed-launch variables (WORLD_SIZE, RANK, MASTER_*, NCCL_*) are complete, consistent and usable here",
    run=lambda ctx: judge(gather(ctx), ctx.config),
    explain=__doc__,
    config={"resolve_timeout_seconds": 2.0, "check_port": True},
)
