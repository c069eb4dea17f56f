"""Reading an attached job's document from outside, as untrusted input, and the live
facts the checks judge (`live_facts(ctx)`).

The document sits in the job's own mount namespace (/dev/shm, else /tmp), reached
through /proc/N/root. A job, or anyone who can write its /dev/shm, controls what is
there, so: every path step is opened with O_NOFOLLOW (a container cannot point the
reader at a host file with a symlink), the file must be regular and owned by the
process's effective uid, at most MAX_BYTES are read, the JSON must have the schema,
name the process's own pid and be fresh (three intervals), and its parts must have
their types. Anything else is a reason, never an exception.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import sys
import time

from envdoctor.attach_snapshot import DIRECTORIES, MAX_BYTES, MAX_LOADERS, SCHEMA, document_name, pid_namespace, snapshot

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping


def _status(roots: Any, pid: int, shared: Any = None) -> tuple[int | None, int | None]:
    """(the pid in the process's own namespace: the last NSpid field, its effective uid).
    `shared`: serve's memo for the run, where the memory sample has read the file already."""
    from envdoctor.paths import proc_status

    text = proc_status(roots, pid, shared)
    nspid, uid = pid, None
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()[1:]
            if fields and fields[-1].isdigit():
                nspid = int(fields[-1])
        elif line.startswith("Uid:"):
            fields = line.split()[1:]
            if len(fields) >= 2 and fields[1].isdigit():
                uid = int(fields[1])
    return nspid, uid


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _open_directory(root_fd: int, directory: str) -> int:
    """Open root/directory without following a symlink at any step."""
    fds = []
    try:
        current = root_fd
        for part in [p for p in directory.split("/") if p]:
            current = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
            fds.append(current)
        return os.dup(current) if current == root_fd else fds.pop()
    finally:
        for fd in fds:
            os.close(fd)


def _finite(value: Any) -> bool:
    """A real number: NaN compares false with everything, so a NaN date was never stale."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validate(doc: Any, nspid: int | None, now: float | None = None) -> str | None:
    """Why a parsed document cannot be used, or None when it can."""
    if not isinstance(doc, dict):
        return "the document is not a JSON object"
    if doc.get("schema") != SCHEMA:
        return f"unknown schema {str(doc.get('schema'))[:40]!r}, expected {SCHEMA}"
    named = doc.get("pid")
    if nspid is not None and (isinstance(named, bool) or named != nspid):  # true == 1: a container's PID 1
        return f"the document names pid {str(named)[:20]}, not {nspid}"
    published, interval = doc.get("published_at"), doc.get("interval_seconds")
    if not _finite(published) or not _finite(interval) or not 0 < interval <= 86400:  # the writer's own bounds
        return "the document has no valid published_at / interval_seconds"
    age = (time.time() if now is None else now) - published
    bound = max(3 * interval, 15.0)
    if age > bound:
        return f"the document is stale ({age:.0f} s old; the job stopped publishing)"
    if age < -bound:  # one clock for every container on the node: a date ahead of it never goes stale
        return f"the document is dated {-age:.0f} s in the future; it is not a live publication"
    for key, kind in (("torch", (dict, type(None))), ("cuda", dict), ("dataloaders", list), ("env", dict)):
        if key in doc and not isinstance(doc[key], kind):
            return f"the document's {key!r} has the wrong type"
    return None


def _as_environ_spells(obj: dict[str, Any]) -> dict[str, Any]:
    """The document's strings as /proc/N/environ's reader spells them. The writer is the
    job's Python, whose os.environ keeps bytes that are not UTF-8 as lone surrogates
    ('\\udcff'); procfs.parse_environ makes them U+FFFD. Redaction knows a secret by the
    environ's spelling, so a non-UTF-8 token a job held in a variable it publishes was
    shown from the live view (helper-120), and a value read both ways looked changed."""
    def spelled(value: Any) -> Any:
        if isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return value.encode("utf-8", "surrogateescape" if _escapes_only(value) else "surrogatepass").decode("utf-8", "replace")
        elif isinstance(value, list):
            return [spelled(v) for v in value]
        return value

    return {spelled(k): spelled(v) for k, v in obj.items()}


def _escapes_only(value: str) -> bool:
    """Its surrogates are all surrogateescape's (U+DC80-U+DCFF: one undecodable byte each)."""
    return all(not 0xD800 <= ord(c) <= 0xDFFF or 0xDC80 <= ord(c) <= 0xDCFF for c in value)


def read_document(roots: Any, pid: int, shared: Any = None) -> tuple[dict[str, Any] | None, str]:
    """The document process `pid` published, or None and why not (never raises).
    `shared`: serve's memo for the run (paths.proc_status).

    /dev/shm first, then /tmp, as the writer chooses: it skips a /dev/shm that is a
    symlink or not a directory, and moves to /tmp when /dev/shm is full, so what is
    wrong in the first place is remembered and said only when the second holds no
    usable document either."""
    try:
        nspid, uid = _status(roots, pid, shared)
    except OSError as exc:
        return None, f"cannot read {roots.proc(pid, 'status')}: {exc.strerror or exc}"
    try:
        root_fd = os.open(roots.proc(pid, "root"), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        return None, f"cannot open {roots.proc(pid, 'root')}: {exc.strerror or exc}"
    try:
        namespace = pid_namespace(roots.proc(pid, "ns", "pid"))
        # this envdoctor's name first, then the pid alone (an older writer's, or no /proc there)
        names = [document_name(nspid, namespace), document_name(nspid)] if namespace is not None else [document_name(nspid)]
        reasons = []
        for directory in DIRECTORIES:
            try:  # once per directory: serve asks this of every process every run
                dir_fd = _open_directory(root_fd, directory)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    reasons.append(_unopenable(directory, names[0], pid, exc))
                continue
            try:
                for name in names:
                    doc, reason = _read_one(dir_fd, directory, name, pid, uid)
                    if doc is not None:
                        reason = validate(doc, nspid) or _same_process(doc, roots, pid)
                        if reason is None:
                            return doc, f"{directory}/{name}"
                    if reason:
                        reasons.append(reason)
            finally:
                os.close(dir_fd)
        if reasons:
            return None, reasons[0]
        return None, (f"process {pid} is not attached (no {names[0]} in its /dev/shm or /tmp): add "
                      "`import envdoctor; envdoctor.attach()` to the script, or start it with envdoctor exec --attach")
    except Exception as exc:  # untrusted input must never crash the reader
        return None, f"cannot read the attached document of process {pid}: {type(exc).__name__}: {exc}"
    finally:
        os.close(root_fd)


def _unopenable(directory: str, name: str, pid: int, exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return f"{directory}/{name} in process {pid} is (or lies under) a symlink or a non-directory: not followed"
    return f"cannot open {directory}/{name} of process {pid}: {exc.strerror or exc}"


def _read_one(dir_fd: int, directory: str, name: str, pid: int, uid: int | None) -> tuple[Any, str]:
    """The parsed JSON of one candidate in the opened `directory`, or (None, why not);
    (None, "") when there is none."""
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None, ""
        return None, _unopenable(directory, name, pid, exc)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"{directory}/{name} of process {pid} is not a regular file"
        if uid is not None and st.st_uid != uid:
            return None, f"{directory}/{name} is owned by uid {st.st_uid}, not by the process's uid {uid}"
        if st.st_size > MAX_BYTES:
            return None, f"{directory}/{name} is {st.st_size} bytes, over the {MAX_BYTES}-byte cap"
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        return None, f"{directory}/{name} is over the {MAX_BYTES}-byte cap"
    try:
        return json.loads(data.decode("utf-8"), object_hook=_as_environ_spells), ""
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"{directory}/{name} is not valid JSON: {str(exc)[:80]}"
    except RecursionError:
        return None, f"{directory}/{name} is nested too deeply to be a document"


def _same_process(doc: Mapping[str, Any], roots: Any, pid: int) -> str | None:
    """Why the document is another process's, or None. The file name tells pid namespaces
    apart; the writer's start time (clock ticks since boot) also tells a pid reused
    within one, and what an older envdoctor wrote under the pid alone when two
    namespaces' pid 1 shared /dev/shm. Compared only when the target shares our time
    namespace: inside another (`unshare --time`) the kernel shifts the ticks it shows.
    A document without a start time (an older envdoctor) is taken on its pid alone. The
    program image's identity ("exe": device, inode and stack start) tells an exec after
    publishing: the pid and the start time stay, the program and its settings do not."""
    exe = doc.get("exe")
    if isinstance(exe, list) and len(exe) in (2, 3) and all(type(n) is int for n in exe):
        from envdoctor.attach import _program_identity

        now = _program_identity(roots.proc(pid, "exe"), roots.proc(pid, "stat"))
        # helper-79: a job that exec'd sleep was judged by its python for 15 s; helper-83: one that
        # re-exec'd its own python too (the same file, its stack elsewhere)
        moved = len(exe) == 3 and now is not None and 0 not in (exe[2], now[2]) and exe[2] != now[2]
        if now is not None and (now[:2] != exe[:2] or moved):
            return ("the process runs another program image than the one that wrote the document (it exec'd "
                    "since): the document is of the program before")
    ticks = doc.get("start_ticks")
    if not isinstance(ticks, int) or isinstance(ticks, bool):
        return None
    if _link(roots.proc(pid, "ns", "time")) != _link(roots.proc(None, "ns", "time")):
        return None
    from envdoctor.announce import start_ticks

    own = start_ticks(roots.procfs, pid)
    if own is None or own == ticks:
        return None
    return ("the document was written by another process with the same pid (a reused pid, or another "
            "pid namespace sharing this /dev/shm), not by this one")


def _link(path: Any) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def live_document(roots: Any, pid: int | None) -> dict[str, Any] | None:
    """The live document of `pid` (None: this process, when it attached itself), or None."""
    if pid is None:
        from envdoctor.attach import current

        publisher = current()
        return publisher.snapshot() if publisher is not None else None
    doc, _ = read_document(roots, pid)
    return doc


# -- what the checks use -------------------------------------------------------------------


# Plausible ranges for the numbers a document may carry; anything outside is dropped
# (None), so a hostile document cannot make a check compute with 10**100 workers.
_RANGES = {"num_threads": 1 << 16, "num_interop_threads": 1 << 16, "num_workers": 4096, "prefetch_factor": 1 << 16,
           "batch_size": 1 << 40, "batch_bytes_max": 1 << 50, "batch_bytes_last": 1 << 50, "batches_seen": 1 << 62}


def _bounded(name: str, value: Any) -> Any:
    if name not in _RANGES:
        return value
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _RANGES[name]
    return value if ok else None


class LiveFacts:
    """The live view of a check's target: the document and where it came from, or why
    there is none. Every accessor returns well-typed, bounded values or None."""

    def __init__(self, doc: Mapping[str, Any] | None, source: str):
        self.doc, self.source = doc, source

    @property
    def refused(self) -> str | None:
        """Why a published document was not used (malformed, stale, someone else's...), or
        None: there is a live view, or none was published."""
        if self.doc is not None or "not attached" in self.source or self.source == "the node has no live view":
            return None
        return self.source

    @property
    def torch(self) -> Mapping[str, Any] | None:
        t = (self.doc or {}).get("torch")
        if not isinstance(t, dict):
            return None
        return {k: _bounded(k, v) for k, v in t.items() if isinstance(k, str)}

    @property
    def num_threads(self) -> int | None:
        value = (self.torch or {}).get("num_threads")
        return value if isinstance(value, int) and value > 0 else None

    @property
    def env(self) -> Mapping[str, str]:
        env = (self.doc or {}).get("env")
        return {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(env, dict) else {}

    @property
    def dataloaders(self) -> list[Mapping[str, Any]]:
        loaders = (self.doc or {}).get("dataloaders")
        if not isinstance(loaders, list):
            return []
        return [{k: _bounded(k, v) for k, v in d.items() if isinstance(k, str)}
                for d in loaders[:MAX_LOADERS] if isinstance(d, dict)]

    def busiest_loader(self) -> Mapping[str, Any] | None:
        """The DataLoader with the most workers (ties: the largest batches)."""
        def key(d: Mapping[str, Any]) -> tuple[int, int]:
            workers, size = d.get("num_workers"), d.get("batch_bytes_max")
            return (workers if isinstance(workers, int) else 0, size if isinstance(size, int) else 0)

        loaders = self.dataloaders
        return max(loaders, key=key) if loaders else None


def live_facts(ctx: Any) -> LiveFacts:
    """The target's live view, read once per run and shared by the checks (never raises).

    For another process: its published document. For this process: the document
    attach() would publish now (preflight() and an attached script share this code).
    """
    def read() -> LiveFacts:
        pid = ctx.target.pid
        if getattr(ctx.target, "kind", "process") == "node":
            return LiveFacts(None, "the node has no live view")
        if pid is None:
            # This process: live when it attached itself, or when the run is preflight()
            # inside the script (its session reads torch live); never for the envdoctor
            # command itself, whose own torch (if any) says nothing about a job.
            from envdoctor.attach import current

            publisher = current()
            if publisher is not None:
                return LiveFacts(publisher.snapshot(), "this process (attached)")
            inprocess = sys.modules.get("envdoctor.inprocess")
            live_torch = getattr(inprocess, "live_torch_facts", None)
            if live_torch is not None and getattr(ctx.session, "torch_factory", None) is live_torch:
                return LiveFacts(snapshot(), "this process (preflight)")
            return LiveFacts(None, "this process is not attached")
        return LiveFacts(*read_document(ctx.roots, pid, ctx.host.fact))

    return _shared(ctx.host, ctx.target.label, read)


def process_live_facts(host: Any, roots: Any, label: str, pid: int) -> LiveFacts:
    """Another process's live view through the run's node memo (`host`), under the key
    live_facts() uses: serve's memory sample and the checks of one run read it once."""
    return _shared(host, label, lambda: LiveFacts(*read_document(roots, pid, host.fact)))


def _shared(host: Any, label: str, read: Any) -> LiveFacts:
    try:
        return host.fact(f"attach.live:{label}", read)
    except Exception as exc:
        return LiveFacts(None, f"{type(exc).__name__}: {exc}")
