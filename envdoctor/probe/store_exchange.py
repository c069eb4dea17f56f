"""The cross-rank exchange: runs INSIDE the target interpreter, never in envdoctor's process.

envdoctor passes this file's source to `python -c` (like torch_probe.py), so it
must run on whatever Python the job has: standard library plus torch only, no
envdoctor imports, nothing newer than Python 3.8 syntax. It talks to its parent
in lines: the parent writes one JSON request on standard input (and, on rank 0,
later one JSON verdict); the script prints `ENVDOCTOR-STORE <json>` event lines
on standard output. Anything torch prints goes to standard error.

Why a subprocess: the exchange needs torch.distributed.TCPStore (the store every
torch launcher speaks), and envdoctor's own process never imports torch.

The store: under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) the agent already
hosts a TCPStore at MASTER_ADDR:MASTER_PORT for the whole job, and every rank
connects to it as a client, as init_process_group itself does. Otherwise rank 0
hosts a TCPStore on MASTER_PORT for the duration of the exchange and closes it
before the script exits, so the port is free again when the job starts.

Keys live under the request's namespace (`envdoctor/dist.consistency/v1/...`,
which no torch component writes) and a generation each rank counts for itself
(`gen/<rank>`, the only keys left behind: a few integers in a store that dies
with the launcher), so a second run in the same job never reads the first one's
facts. Under that: `claim/<rank>` (a counter: two processes with one RANK),
`duplicates` (how many such second claims came), `facts/<rank>`, `verdict`, `done`.
Rank 0 deletes them all at the end.

Two processes given one RANK count two generations of it, so each publishes under a
generation of its own, and the rank nobody took is simply missing. The later one finds
the earlier generation's claim still in the store (rank 0 deletes it when a run ends, so
a rank's next run finds none) and adds itself to that claim: the earlier generation's
rank 0 then names the RANK given twice, at once, instead of waiting out the missing one.

Bounded everywhere: every store call has a timeout, and the script dies with its
parent (PR_SET_PDEATHSIG), so a rank that never comes costs the wait, not a hang.
"""

import json
import os
import sys
import time
from datetime import timedelta

MARKER = "ENVDOCTOR-STORE "
POLL = 0.1  # seconds between polls of a counter or a key: a few RPCs per rank, even with 1000 ranks
WAIT_SLICE = 1.0  # rank 0 waits for the ranks' facts in slices this long, looking for a RANK claimed twice between
DUPLICATE_GRACE = 2.0  # once one is, how much longer it waits for the rest: the launch is wrong anyway
_real_stdout = sys.stdout


def emit(**obj):
    _real_stdout.write("\n" + MARKER + json.dumps(obj, sort_keys=True, default=str) + "\n")
    _real_stdout.flush()


def _die_with_parent():
    """If envdoctor is killed, this script must not keep a port or a store connection.
    (The signal follows the thread that started us: envdoctor's exchange thread waits
    for this script to the end, so it cannot fire early.)"""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:  # not Linux, or no libc symbol: the parent's own kill still bounds us
        pass


def _why(exc):
    return "%s: %s" % (type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else "")


def torch_facts(torch):
    """The versions every rank must agree on, as this interpreter's torch sees them.
    None means "not built with it" (a CPU build has no CUDA, cuDNN or NCCL)."""
    out = {"torch_version": str(torch.__version__), "cuda_version": getattr(torch.version, "cuda", None),
           "hip_version": getattr(torch.version, "hip", None), "cudnn_version": None, "nccl_version": None}
    try:
        if torch.backends.cudnn.is_available():  # loads libcudnn; creates no CUDA context
            out["cudnn_version"] = torch.backends.cudnn.version()
    except Exception as exc:
        out["cudnn_error"] = _why(exc)
    try:
        if getattr(torch.version, "cuda", None) or getattr(torch.version, "hip", None):
            version = torch.cuda.nccl.version()  # the NCCL torch was built with; no context
            out["nccl_version"] = ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)
    except Exception as exc:
        out["nccl_error"] = _why(exc)
    return out


def _delete(store, keys):
    for key in keys:
        try:
            store.delete_key(key)
        except Exception:
            pass


def _exists(store, key):
    try:
        return bool(store.check([key]))
    except Exception:  # the store went away: rank 0 closed it, so nothing is there
        return False


def judge_side(store, request, base, stdin):
    """Rank 0: wait for every rank's facts, hand them to the parent, publish its verdict,
    wait (bounded) until the others have read it, then delete every key."""
    world = request["world_size"]
    wait = float(request["wait_seconds"])
    keys = [base + "facts/%d" % r for r in range(world)]
    started = time.monotonic()
    _wait_for_facts(store, keys, base + "duplicates", started + wait)
    ranks = {}
    claims = {}
    for r, key in enumerate(keys):
        if _exists(store, key):
            try:
                ranks[str(r)] = json.loads(store.get(key).decode("utf-8"))
            except Exception as exc:
                ranks[str(r)] = {"unreadable": _why(exc)}
            claims[str(r)] = store.add(base + "claim/%d" % r, 0)
    emit(event="gathered", ranks=ranks, claims=claims, waited_seconds=round(time.monotonic() - started, 3))
    line = stdin.readline()
    verdict = line.strip() or json.dumps({"status": "error", "summary": "rank 0's envdoctor gave no verdict"})
    store.set(base + "verdict", verdict)
    others = len(ranks) - (1 if "0" in ranks else 0)
    deadline = time.monotonic() + float(request["ack_seconds"])
    acked = 0
    while time.monotonic() < deadline:
        acked = store.add(base + "done", 0)
        if acked >= others:
            break
        time.sleep(POLL)
    _delete(store, keys + [base + "claim/%d" % r for r in range(world)] +
            [base + "done", base + "verdict", base + "duplicates"])
    return {"acked": acked, "expected_acks": others}


def _wait_for_facts(store, keys, duplicates_key, deadline):
    """Until every key is there or the deadline, in slices; a RANK claimed twice (see the
    module's docstring) brings the deadline to DUPLICATE_GRACE from when it is seen."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        began = time.monotonic()
        try:
            store.wait(keys, timedelta(seconds=min(left, WAIT_SLICE)))
            return
        except Exception:  # this slice's timeout (or a store gone: the reads after say which)
            pass
        try:
            if store.add(duplicates_key, 0) > 0:
                deadline = min(deadline, time.monotonic() + DUPLICATE_GRACE)
        except Exception:
            pass
        if time.monotonic() - began < POLL:  # a wait that failed at once: no busy loop
            time.sleep(POLL)


def _join_earlier_claims(store, ns, rank, gen):
    """Add this process to the claim of each earlier generation of its RANK still running:
    a second process with this RANK (a second run of a rank finds the first one's claim
    deleted). The first generation that is over ends the search: those before it are too."""
    for earlier in range(gen - 1, 0, -1):
        prior = ns + "%d/" % earlier
        if not _exists(store, prior + "claim/%d" % rank):
            return
        store.add(prior + "claim/%d" % rank, 1)
        store.add(prior + "duplicates", 1)


def follower_side(store, request, base):
    """Rank k > 0: wait for rank 0's verdict, acknowledge it, and stay until rank 0 has
    cleaned up, so a failing verdict cannot end this rank (and under torchrun the whole
    job) before rank 0 has said what is wrong."""
    rank = request["rank"]
    vkey = base + "verdict"
    wait = float(request["verdict_seconds"])
    started = time.monotonic()
    try:
        store.wait([vkey], timedelta(seconds=wait))
        verdict = json.loads(store.get(vkey).decode("utf-8"))
    except Exception as exc:
        _delete(store, [base + "facts/%d" % rank, base + "claim/%d" % rank])
        emit(event="no_verdict", waited_seconds=round(time.monotonic() - started, 3), error=_why(exc))
        return None
    store.add(base + "done", 1)
    emit(event="verdict", verdict=verdict, waited_seconds=round(time.monotonic() - started, 3))
    deadline = time.monotonic() + float(request["ack_seconds"]) + 2
    while time.monotonic() < deadline and _exists(store, vkey):
        time.sleep(POLL)
    if isinstance(verdict, dict) and verdict.get("status") != "ok":
        # Under torchrun the first rank to exit non-zero makes the agent kill the others;
        # rank 0 prints its full report a few milliseconds after its cleanup: let it win.
        time.sleep(float(request.get("linger_seconds", 2.0)))
    return {}


def _bounded_store(TCPStore, address, port, hosting, seconds):
    """TCPStore(...), or TimeoutError after `seconds` (and a little). Its own timeout does not
    cover the handshake: against a socket that listens but never answers (something else
    on MASTER_PORT, a hung agent) the constructor waited until envdoctor killed the
    exchange at its deadline, minutes later. The thread that is still stuck dies with
    this process (os._exit at the end)."""
    import threading

    box = {}

    def connect():
        try:
            box["store"] = TCPStore(address, port, None, hosting, timedelta(seconds=seconds), wait_for_workers=False)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=connect, name="envdoctor-store-connect", daemon=True)
    thread.start()
    thread.join(seconds + 2.0)
    if thread.is_alive():
        raise TimeoutError("%s:%s accepted the connection but did not answer as a TCPStore within %g s "
                           "(is something else listening there?)" % (address, port, seconds))
    if "error" in box:
        raise box["error"]
    return box["store"]


def main():
    sys.stdout = sys.stderr  # keep torch's chatter off the channel the events travel on
    _die_with_parent()
    stdin = sys.stdin
    request = json.loads(stdin.readline())
    started = time.monotonic()
    try:
        import torch
        from torch.distributed import TCPStore
    except ModuleNotFoundError as exc:
        emit(event="no_torch" if exc.name == "torch" else "import_error", error=_why(exc))
        return 3
    except BaseException as exc:  # a broken install: ImportError, OSError from a .so, SystemExit...
        emit(event="import_error", error=_why(exc))
        return 3
    facts = dict(request["facts"])
    facts.update(torch_facts(torch))
    emit(event="imported", seconds=round(time.monotonic() - started, 3))

    rank = request["rank"]
    hosting = rank == 0 and not request["agent_store"]
    address, port = request["master_addr"], int(request["master_port"])
    connect_seconds = float(request["connect_seconds"])
    try:
        store = _bounded_store(TCPStore, address, port, hosting, connect_seconds)
    except Exception as exc:
        emit(event="connect_failed", hosting=hosting, error=_why(exc))
        return 4
    emit(event="connected", hosting=hosting)
    try:
        ns = request["namespace"]
        gen = store.add(ns + "gen/%d" % rank, 1)
        base = ns + "%d/" % gen
        store.add(base + "claim/%d" % rank, 1)
        store.set(base + "facts/%d" % rank, json.dumps(facts, sort_keys=True, default=str))
        emit(event="published", generation=gen, facts=facts)
        if gen > 1:
            _join_earlier_claims(store, ns, rank, gen)
        if rank == 0:
            outcome = judge_side(store, request, base, stdin)
        else:
            outcome = follower_side(store, request, base)
    except Exception as exc:
        emit(event="store_error", error=_why(exc))
        return 5
    finally:
        del store  # closes the connection; on rank 0 without an agent store, the server and its port
    emit(event="released", hosting=hosting, **(outcome or {}))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    _real_stdout.flush()
    os._exit(code)  # skip torch's slow teardown: the answer is already out
