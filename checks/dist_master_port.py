"""dist.master_port: on rank 0, is MASTER_PORT free on the master (this host)?

What it reads: the target's RANK, MASTER_ADDR and MASTER_PORT; resolves
MASTER_ADDR (bounded, as dist.env does); when this is rank 0, the master address
is this host and the target is envdoctor's own environment, it binds MASTER_PORT
on that address for an instant and lets it go.

Why it matters: rank 0 starts the rendezvous store on MASTER_PORT; a port already
taken (a previous job's leftover process, another service) makes it die with
"address already in use" while every other rank waits at the rendezvous until it
times out (30 minutes by default).

Why it is a check of its own: binding a port is intrusive (DESIGN: creates a
CUDA context, loads onnxruntime, binds a port), so it runs in `envdoctor check`
only, never in serve (which must not touch a running job's port) or exec (which
runs right before the launcher binds it). dist.env judges everything else about
the launch variables, everywhere.

Statuses: `fail` when the port cannot be bound on rank 0 (the reason named, a
free port suggested): the launch will break; `warn` when the launcher promised its
own store there (TORCHELASTIC_USE_AGENT_STORE=True) and nothing listens; `ok` when it could; `skip`, with the reason, when the test
does not apply: no MASTER_PORT or not a port number, not rank 0, the master is
another host or does not resolve, or the target is another process (`--pid`:
the running job itself holds the port).

How to fix: pick a free port (`export MASTER_PORT=29501`, the check names one
that is free now), or end the process that holds it (`ss -ltnp 'sport = :29500'`).
"""

from __future__ import annotations

import errno
from collections import namedtuple

from envdoctor.check import Check
from envdoctor.errors import Unavailable
from envdoctor.model import Finding, Result, Status, verdict

from envdoctor.checks.dist_env import is_local, master_port, resolve

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping


class PortFacts(namedtuple("PortFacts", (
        "address",  # str: the local address the port was bound on
        "port",  # int
        "error",  # str | None: why binding failed; None: it is free
        "free_port",  # int | None = None: a port that was free, to suggest
        "agent_store",  # bool | None = None: under torchrun's agent store: does it listen? None: no agent store
), defaults=(None, None))):
    __slots__ = ()


def _try_bind(port: int) -> str | None:
    """None when `port` could be bound as torch's rendezvous store binds it; otherwise why not.

    The store (c10d's TCPServer) listens on every address, IPv6 and IPv4 at once where
    the host has IPv6, with SO_REUSEADDR: so is the port bound here. Bound on
    MASTER_ADDR alone, a listener on another of the host's addresses went unseen and
    the check said free where init_process_group then failed with EADDRINUSE (helper-76)."""
    import socket  # in the three that use it: only rank 0 of a launch gets here (~3 ms to import)

    for family, wildcard in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host: IPv4's wildcard
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is not "in use"
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4's addresses too
            sock.bind((wildcard, port))
            return None
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "address already in use"
            if exc.errno in (errno.EACCES, errno.EPERM):
                return "permission denied (ports below 1024 need root)"
            if family == socket.AF_INET6 and exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                continue  # IPv6 switched off: IPv4's wildcard
            return exc.strerror or str(exc)
        finally:
            sock.close()
    return "no address family to bind"


# torch's default MASTER_PORT and the ports after it: below Linux's ephemeral range (32768 on),
# so an outgoing connection does not take the suggested port before the launch (helper-76)
SUGGESTED_PORTS = range(29500, 30000)


def _free_port() -> int | None:
    return next((port for port in SUGGESTED_PORTS if _try_bind(port) is None), None)


def _local_master(env: Mapping[str, str], timeout: float) -> tuple[str, int]:
    """(local address, port) to test, or Unavailable saying why the test does not apply."""
    port, addr = master_port(env), (env.get("MASTER_ADDR") or "").strip()
    if port is None or not addr:
        raise Unavailable("no usable MASTER_ADDR and MASTER_PORT: no rendezvous port to test")
    if (env.get("RANK") or "").strip() != "0":
        raise Unavailable(f"RANK={env.get('RANK')!r}: only rank 0 binds MASTER_PORT")
    addrs, err, timed_out = resolve(addr, port, timeout)
    if not addrs:
        why = f"did not resolve within {timeout:g} s" if timed_out else f"does not resolve ({err})"
        raise Unavailable(f"MASTER_ADDR={addr!r} {why} (see dist.env): port not tested")
    if not is_local(addrs):
        raise Unavailable(f"MASTER_ADDR={addr!r} is another host: its port can only be tested there")
    return next((a for a in addrs if is_local((a,))), addrs[0]).split("%", 1)[0], port


AGENT_STORE_VAR = "TORCHELASTIC_USE_AGENT_STORE"


def _listening(address: str, port: int, timeout: float = 1.0) -> bool | None:
    """True when something accepts connections on address:port, False when refused,
    None when it cannot be told (filtered, timed out)."""
    import socket

    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except ConnectionRefusedError:
        return False
    except OSError:
        return None


def gather(ctx) -> PortFacts:
    """Bind the port, unless someone is expected to hold it.

    Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True, what torch's env://
    rendezvous reads) the launcher's agent already hosts the TCPStore on
    MASTER_PORT and every rank connects to it as a client: a listener there is the
    expected state, and binding would wrongly say "in use"; so only check that
    something listens. While envdoctor's own dist.consistency exchange hosts its
    store on the port, the port is busy because of us: not tested.
    """
    from envdoctor import rendezvous

    if ctx.target.pid is not None:
        raise Unavailable("not tried for --pid: the running job itself holds the port")
    address, port = _local_master(ctx.env, float(ctx.settings["resolve_timeout_seconds"]))
    if ctx.env.get(AGENT_STORE_VAR) == "True":
        return PortFacts(address, port, None, agent_store=_listening(address, port) is not False)
    if port in rendezvous.ports_hosted():
        # said as what is known: the exchange is trying to host there (whether it could bind the
        # port, or something else holds it, is dist.consistency's row, which also proves it free after)
        raise Unavailable("not tested here: envdoctor's own dist.consistency exchange hosts its store on MASTER_PORT "
                          "in this run; its row says whether the port is free for the job")
    error = _try_bind(port)
    return PortFacts(address, port, error, _free_port() if error else None)


def _rule_agent_store_missing(facts: PortFacts) -> list[Finding]:
    """torchrun's agent store is expected on the port, and nothing listens there."""
    if facts.agent_store is not False:
        return []
    return [Finding(Status.WARN, f"{AGENT_STORE_VAR}=True but nothing listens on {facts.address}:{facts.port}: "
                    "init_process_group connects to the launcher's store there and will time out",
                    f"launch with torchrun, which hosts that store; or unset {AGENT_STORE_VAR} so rank 0 hosts it",
                    env={AGENT_STORE_VAR: None})]


def _rule_port_taken(facts: PortFacts) -> list[Finding]:
    """Rank 0 cannot bind MASTER_PORT: the rendezvous store will not start."""
    if facts.error is None:
        return []
    other = facts.free_port or (facts.port + 1 if facts.port < 65535 else 29500)
    # fail, not warn (helper-42): init_process_group dies with EADDRINUSE, a launch that will break
    return [Finding(Status.FAIL, f"MASTER_PORT={facts.port} cannot be bound on this host's addresses ({facts.error}), "
                    f"where rank 0 (MASTER_ADDR {facts.address}) hosts the rendezvous store: it will fail to start",
                    f"export MASTER_PORT={other}  # a port that is free now")]


def judge(facts: PortFacts, settings: Mapping[str, Any]) -> Result:
    out = {"master_port": facts.port, "address": facts.address, "port_error": facts.error, "free_port": facts.free_port}
    out["agent_store"] = facts.agent_store
    ok_summary = (f"MASTER_PORT={facts.port} on {facts.address} is held by the launcher's store ({AGENT_STORE_VAR}=True), "
                  "as expected" if facts.agent_store else f"MASTER_PORT={facts.port} on {facts.address} is free (rank 0)")
    return verdict(_rule_port_taken(facts) + _rule_agent_store_missing(facts), out, ok_summary)


CHECK = Check(
    id="dist.master_port",
    title="On rank 0, MASTER_PORT is free on the master, so the rendezvous store can start",
    gather=gather,
    judge=judge,
    explain=__doc__ or "",
    modes=("check",),
    intrusive=True,  # binds a port
    config={"resolve_timeout_seconds": 2.0},
)
