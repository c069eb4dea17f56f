"""shm.size: is the target's /dev/shm big enough for DataLoader workers and NCCL?

What it reads: statvfs of the target's /dev/shm (for --pid N that is
/proc/N/root/dev/shm, the process's own mount namespace, not envdoctor's; a
/dev/shm that is a link, as to /run/shm, is followed inside the process's root): its
size and free bytes, and from the target's mount table whether it is a tmpfs of
its own. When the DataLoader settings are given in config (num_workers,
batch_bytes, prefetch_factor), or the job is attached (envdoctor.attach publishes
its DataLoaders' workers, prefetch_factor and the bytes of the batches seen), it
also works out what the workers will hold there. For a running job short of free
space, the unlinked /dev/shm files its process tree holds open (its batches in
flight, unlinked as torch makes them) are counted as its own, not as space others
hold; a named file it has open (a dataset other jobs share too) is not.

Why it matters: DataLoader workers hand every batch to the training process
through shared memory files in /dev/shm; NCCL's intra-node transport uses it too.
Docker gives a container a 64 MiB /dev/shm unless it is run with --shm-size or
--ipc=host, and a tmpfs that runs out does not fail cleanly: writing into the
mapped file raises SIGBUS, and training dies with "Unexpected bus error
encountered in worker. This might be caused by insufficient shared memory (shm)",
or "No space left on device", often minutes into the first epoch. Jupyter kernels
that die when training starts are often the same thing.

What it judges (thresholds in [check."shm.size"]):
- fail: size below min_bytes (default 256 MiB; Docker's 64 MiB default is named);
  with DataLoader settings known, size below what the workers hold at once:
  (num_workers x prefetch_factor + 1 batch in use) x batch_bytes. Below min_bytes
  with a known loader that fits, under a CPU build of torch (no NCCL): a warning.
  No /dev/shm at all, a read-only one, or one where no file can be created (its
  inodes used up, or fewer left than the loader's batches in flight, each a file at
  least): nothing shared can be made there.
- warn: size below recommended_bytes (default 1 GiB, what NVIDIA's NGC containers
  are started with) when the DataLoader settings are unknown, or below the workers'
  need times headroom (default 1.5) when they are known; free space below the
  loader's need (or below min_bytes), less what the job itself holds, because other
  processes or crashed jobs' leftover segments hold it (a warn: on a node's row, or
  with torch's file_system sharing, a running job's own batches look the same);
  fewer than 1024 more files can be created (a batch of several tensors is several
  files, and the workers' queues take some: how many a job needs is its own).
- skip: /dev/shm cannot be examined (permission, process gone).

How to fix: give the container more (the row names the size: 1g, or the loader's need
with headroom): `docker run --shm-size=1g ...` or
`--ipc=host`; in Kubernetes mount an emptyDir with `medium: Memory` and a
`sizeLimit` at /dev/shm; on a host, `mount -o remount,size=1G /dev/shm`. The
workaround when none of those is possible is fewer DataLoader workers (fewer
batches in flight), at the cost of slower loading; num_workers=0 loads in the
training loop itself and uses no shared memory, at the cost of the GPU waiting.
Remove leftover /dev/shm/torch_* files of crashed jobs when free space is short.
"""

from __future__ import annotations

import errno
import math
import os
import posixpath
import stat
from collections import namedtuple

from envdoctor.cgroup import parse_mountinfo
from envdoctor.check import Check, Metric
from envdoctor.paths import read_text, shm_seen_by
from envdoctor.context import permission_hint
from envdoctor.errors import ParseError, Unavailable
from envdoctor.model import Finding, Result, Status, verdict
from envdoctor.units import docker_size, format_bytes, k8s_size

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping, Sequence

MIB = 1024**2
GIB = 1024**3
DOCKER_DEFAULT_BYTES = 64 * MIB


class ShmFacts(namedtuple("ShmFacts", (
        "path",  # str: what was examined, as opened
        "size_bytes",  # int | None: None: a tmpfs with no size limit (size=0)
        "free_bytes",  # int | None: None with size_bytes: statvfs reports 0 for an unlimited tmpfs
        "fstype",  # str | None = None: of the mount holding /dev/shm in the target's view; None when unknown
        "mount_point",  # str | None = None: "/dev/shm" when it is a mount of its own
        "live_loader",  # Mapping[str, Any] | None = None: the attached job's busiest DataLoader (envdoctor.attach)
        "own_bytes",  # int | None = None: unlinked files the --pid process tree holds open (envdoctor.shm_held); None: not read
        "own_complete",  # bool | None = None: False: the tree was larger than envdoctor reads, own_bytes may be short
        "torch_cuda",  # bool | None = None: whether the target's torch is a CUDA build (NCCL); None: not asked
        "read_only",  # bool | None = None: mounted read-only (statvfs ST_RDONLY): nothing can be created there
        "free_files",  # int | None = None: files that can still be created; None: no inode limit (or not read)
        "missing",  # str | None = None: why there is no usable /dev/shm at all (absent, not a directory)
), defaults=(None, None, None, None, None, None, None, None, None))):
    __slots__ = ()


def _shm_mount(ctx, seen: os.stat_result, inside: str = "/dev/shm") -> tuple[str | None, str | None]:
    """_mount_of(ctx, inside) (where /dev/shm leads in the target's root), looked up once a
    run for the processes that see the
    same /dev/shm directory from one mount namespace and one root (the ranks of a job in
    one container, and every process on the node that runs in the host's): a node's mount
    table can hold a thousand lines, one per mount of every pod, and each target's was
    read and parsed. The root is part of it: a chroot's table leaves out what lies outside
    it, so two chroots that share one /dev/shm directory can see it mounted differently
    (helper-107: one was given the other's "0 B" and failed)."""
    try:
        namespace = os.readlink(ctx.proc("ns", "mnt"))
        root = os.readlink(ctx.proc("root"))  # where its root is, in our view of the mounts
    except OSError:  # not ours to read: its own table, as before
        return _mount_of(ctx, inside)
    known = ctx.host.fact("shm_size.mounts", dict)  # this run's: {(namespace, root, directory): answer}
    key = (namespace, root, seen.st_dev, seen.st_ino)
    answer = known.get(key)
    if answer is None:
        answer = _mount_of(ctx, inside, None)
        if answer is not None:  # a table that could not be read (a process that exited) is not kept for the others
            known[key] = answer
    return answer or (None, None)


def _mount_of(ctx, path: str, unreadable: Any = (None, None)) -> Any:
    """(fstype, mount point) of the mount holding `path` in the target's mount table;
    `unreadable` when that table cannot be read."""
    try:
        mounts = parse_mountinfo(read_text(ctx.proc("mountinfo")))  # non-blocking: a FIFO here cannot hold the check
    except (OSError, ParseError):
        return unreadable
    target = posixpath.normpath(path)
    best = _walk_to(mounts, target) if len(mounts) <= MAX_WALKED_MOUNTS else None
    best = best or _deepest(mounts, target)
    return (best.fstype, best.mount_point) if best else (None, None)


MAX_WALKED_MOUNTS = 50_000  # a node's table holds a line per mount of every pod; past this, the deepest is taken


def _holds(mount_point: str, target: str) -> bool:
    mp = posixpath.normpath(mount_point)
    return target == mp or target.startswith(mp.rstrip("/") + "/")


def _depth(mount_point: str) -> int:
    mp = posixpath.normpath(mount_point)
    return 0 if mp == "/" else mp.count("/")


def _walk_to(mounts: Sequence[Any], target: str) -> Any:
    """The mount `target` is on, found as the kernel's path walk finds it: from the
    process's root mount down, at each mount point on the way onto the mount on top
    there. A mount that a later one over a parent directory hides (the host's /dev/shm
    under a tmpfs mounted on /dev) is a child of the mount below, so the walk never
    reaches it; the deepest mount point alone took it.

    The walk starts at the table's top: the mount whose parent is not listed. A mount
    stacked on that one at "/" is never entered (a path walk starts at the process's
    root and does not cross a mount over it: helper-108). A chroot's table leaves out
    the mount above its root, so its tops share one parent that is not listed: they are
    walked as that parent's children. None when the table is neither (the caller then
    takes the deepest mount point), and when a hostile table's ids repeat into a cycle."""
    ids = {m.mount_id for m in mounts}
    tops = [m for m in mounts if m.parent_id not in ids]
    if not tops or len({m.parent_id for m in tops}) != 1:
        return None
    children: dict[int, list[Any]] = {}
    for m in mounts:
        if m.parent_id != m.mount_id:
            children.setdefault(m.parent_id, []).append(m)
    points = {id(m): posixpath.normpath(m.mount_point) for m in mounts}
    if len(tops) == 1 and points[id(tops[0])] == "/":
        current, stacked_ok = tops[0], False  # the process's root: what is stacked on it is not seen
    else:
        current, stacked_ok = None, True  # a chroot's: the tops are the unlisted parent's children
    seen: set[int] = set()
    while True:
        key = -1 if current is None else current.mount_id
        if key in seen:
            return None  # ids that repeat into a cycle: not a table to walk
        seen.add(key)
        below = tops if current is None else children.get(current.mount_id, ())
        point = None if current is None else points[id(current)]
        if stacked_ok and current is not None:
            above = [c for c in below if points[id(c)] == point]
            if above:  # stacked on the same point: the last mounted is on top
                current = above[-1]
                continue
        crossings = [c for c in below if points[id(c)] != point and _holds(points[id(c)], target)]
        if not crossings:
            return current
        shallowest = min(_depth(points[id(c)]) for c in crossings)  # the walk crosses that one first
        current = [c for c in crossings if _depth(points[id(c)]) == shallowest][-1]
        stacked_ok = True


def _deepest(mounts: Sequence[Any], target: str) -> Any:
    """The mount with the deepest mount point that holds `target`; of equals, the last."""
    best, best_depth = None, -1
    for mount in mounts:
        if _holds(mount.mount_point, target) and _depth(mount.mount_point) >= best_depth:
            best, best_depth = mount, _depth(mount.mount_point)
    return best


def gather(ctx) -> ShmFacts:
    who = "the target" if ctx.target.pid is None else f"process {ctx.target.pid}"
    inside = "/dev/shm"
    path = ctx.target_path(inside)
    try:
        inside = shm_seen_by(ctx.roots, ctx.target.pid, ctx.host.fact)  # a link to /run/shm is its /run/shm, not ours
        path = ctx.target_path(inside)
        seen = os.stat(path)
        mode = seen.st_mode
        if not stat.S_ISDIR(mode):
            return ShmFacts(str(path), None, None, missing=f"{path} is not a directory: {who} has no usable /dev/shm")
        st = os.statvfs(path)
    except PermissionError:
        raise Unavailable(f"permission denied examining {path}", permission_hint(ctx.target)) from None
    except FileNotFoundError:
        if ctx.target.pid is not None and not ctx.proc().exists():
            raise Unavailable(f"process {ctx.target.pid} exited during the run ({path} is gone)") from None
        # a finding, not a skip (helper-92): the check is sure the loader's workers and NCCL fail
        return ShmFacts(str(path), None, None, missing=f"{path} does not exist: {who} has no /dev/shm")
    except OSError as exc:
        if exc.errno == errno.ESRCH and ctx.target.pid is not None:
            raise Unavailable(f"process {ctx.target.pid} exited during the run ({path} is gone)") from None
        if exc.errno == errno.ELOOP:  # the job's own shm_open fails the same way (helper-108: it was a skip)
            return ShmFacts(str(path), None, None, missing=f"/dev/shm of {who} is a loop of symbolic links: "
                                                          f"{who} has no usable /dev/shm")
        raise Unavailable(f"cannot examine {path}: {exc.strerror or exc}") from None
    fstype, mount_point = _shm_mount(ctx, seen, inside)
    if mount_point is not None and mount_point == inside:
        mount_point = "/dev/shm"  # a mount of its own where /dev/shm leads (a link to /run/shm, its own tmpfs)
    size = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    if size == 0 and fstype == "tmpfs":
        size = free = None  # tmpfs size=0 means no limit but memory itself; statvfs then says 0 and 0
    from envdoctor.attach_reader import live_facts

    # Read-only as the target sees it: through /proc/N/root for a process, directly for this one;
    # not through --path.rootfs, whose mount of the host is read-only itself (the DaemonSet's
    # recursiveReadOnly made every node's row fail: helper-94)
    own_view = ctx.target.pid is not None or os.path.realpath(ctx.roots.rootfs) == "/"
    facts = ShmFacts(str(path), size, free, fstype, mount_point, live_facts(ctx).busiest_loader(),
                     read_only=bool(st.f_flag & os.ST_RDONLY) if own_view else None,
                     free_files=st.f_favail if st.f_files else None)  # tmpfs nr_inodes=0: no limit, 0 and 0
    if ctx.target.pid is not None and free is not None and free < _free_wanted(with_live_loader(facts, ctx.settings)):
        # a running job short of free space: how much of the used space is its own batches
        # in flight (a walk of its processes' descriptors, so only when it can matter)
        from envdoctor.shm_held import held_bytes

        held = held_bytes(ctx.roots.procfs, ctx.target.pid, seen.st_dev)
        if held is not None:
            facts = facts._replace(own_bytes=held.bytes, own_complete=held.complete)
    if size is not None and size < int(ctx.settings["min_bytes"]) and _need(with_live_loader(facts, ctx.settings))[0]:
        # below the floor with a loader that may fit: the floor's other reason is NCCL, which a
        # CPU build of torch does not have (helper-79: a CPU job was failed for it)
        try:
            facts = facts._replace(torch_cuda=bool(ctx.torch.get("cuda_compiled")))
        except Unavailable:
            pass
    return facts


def with_live_loader(facts: ShmFacts, settings: Mapping[str, Any]) -> Mapping[str, Any]:
    """The settings, with the DataLoader the attached job really runs standing in for
    num_workers / batch_bytes / prefetch_factor when the config leaves them unset."""
    if int(settings.get("num_workers", 0) or 0) > 0 and int(settings.get("batch_bytes", 0) or 0) > 0:
        return settings
    loader = facts.live_loader or {}
    workers, batch, prefetch = loader.get("num_workers"), loader.get("batch_bytes_max"), loader.get("prefetch_factor")
    if not (isinstance(workers, int) and workers > 0 and isinstance(batch, int) and batch > 0):
        return settings
    merged = dict(settings, num_workers=workers, batch_bytes=batch, loader_source="live")
    if isinstance(prefetch, int) and prefetch > 0:
        merged["prefetch_factor"] = prefetch
    return merged


def _loader(settings: Mapping[str, Any]) -> tuple[int, int, int]:
    """(num_workers, batch_bytes, prefetch_factor) as configured; 0 means unknown."""
    workers = max(0, int(settings["num_workers"] or 0))
    batch = max(0, int(settings["batch_bytes"] or 0))
    return workers, batch, max(1, int(settings["prefetch_factor"] or 2))


def _need(settings: Mapping[str, Any]) -> tuple[int | None, str]:
    """Bytes the DataLoader workers hold at once in /dev/shm, and how that was worked out."""
    workers, batch, prefetch = _loader(settings)
    if workers <= 0 or batch <= 0:
        return None, ""
    batches = workers * prefetch + 1
    source = "the running job's (live) " if settings.get("loader_source") == "live" else ""
    return batches * batch, (f"{source}{workers} DataLoader workers x prefetch_factor {prefetch} + 1 batch in use "
                             f"= {batches} batches of {format_bytes(batch)}")


def _headroom(settings: Mapping[str, Any]) -> float:
    return max(1.0, float(settings["headroom"]))


def _subject(facts: ShmFacts) -> str:
    return "/dev/shm" if facts.path.endswith("/dev/shm") else facts.path


def _docker(size: int) -> str:
    return " (Docker's default)" if size == DOCKER_DEFAULT_BYTES else ""


def _suggested(settings: Mapping[str, Any]) -> int:
    need, _ = _need(settings)
    return max(int(settings["recommended_bytes"]), math.ceil(need * _headroom(settings)) if need else 0,
               int(settings["min_bytes"]))


def _rule_size_below_min(facts: ShmFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """Below the floor: workers die with a bus error whatever the loader does."""
    size, min_bytes = facts.size_bytes, int(settings["min_bytes"])
    if size is None or size >= min_bytes:
        return []
    need, how = _need(settings)
    if need is not None and size >= need:
        # the loader is known and its batches fit: the floor stands for NCCL and for loaders
        # other than the one configured, not for this one (helper-51: 4 workers of 0.5 MiB in
        # 128 MiB were told that workers die, and to lower num_workers)
        headroom = _headroom(settings)
        short = (f", but not with x{headroom:g} headroom = {format_bytes(math.ceil(need * headroom))}"
                 if size < need * headroom else "")
        why = (f"NCCL fails there, as does a DataLoader with more in flight; {how} need "
               f"{format_bytes(need)}, which fits{short}")
        if facts.torch_cuda is False:  # no NCCL in a CPU build: only a larger loader would fail
            return [Finding(Status.WARN, f"{_subject(facts)} is {format_bytes(size)}{_docker(size)}, expected >= "
                            f"{format_bytes(min_bytes)}: a DataLoader with more in flight fails there; {how} need "
                            f"{format_bytes(need)}, which fits{short} (this torch is a CPU build: no NCCL)",
                            _remediation(facts, settings))]
    else:
        why = "DataLoader workers die with a bus error ('insufficient shared memory') and NCCL fails"
    return [Finding(Status.FAIL, f"{_subject(facts)} is {format_bytes(size)}{_docker(size)}, expected >= "
                    f"{format_bytes(min_bytes)}: {why}", _remediation(facts, settings))]


def _rule_size_below_need(facts: ShmFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """With the loader known: less than its batches in flight fails, less than that with headroom warns."""
    size, (need, how), headroom = facts.size_bytes, _need(settings), _headroom(settings)
    if size is None or need is None or size >= need * headroom:
        return []
    if need <= size < int(settings["min_bytes"]):
        return []  # below the floor, whose row already says the loader's need and headroom
    if size < need:
        # below the floor too, that row already says the size: this one adds only the loader's need
        said = "" if size < int(settings["min_bytes"]) else f"{_subject(facts)} is {format_bytes(size)}; "
        return [Finding(Status.FAIL, f"{said}{how} need {format_bytes(need)}", _remediation(facts, settings))]
    return [Finding(Status.WARN, f"{_subject(facts)} is {format_bytes(size)}; {how} need {format_bytes(need)}, "
                    f"expected x{headroom:g} headroom = {format_bytes(math.ceil(need * headroom))}",
                    _remediation(facts, settings))]


def _rule_size_below_recommended(facts: ShmFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """With the loader unknown: above the floor but below what NGC containers get warns."""
    size, recommended = facts.size_bytes, int(settings["recommended_bytes"])
    if size is None or _need(settings)[0] is not None or size < int(settings["min_bytes"]) or size >= recommended:
        return []
    return [Finding(Status.WARN, f"{_subject(facts)} is {format_bytes(size)}{_docker(size)}, expected >= "
                    f"{format_bytes(recommended)} for DataLoader workers (set num_workers and batch_bytes to "
                    "judge your loader)", _remediation(facts, settings))]


def _free_wanted(settings: Mapping[str, Any]) -> int:
    """The free space a job wants: its loader's batches in flight, else the floor."""
    need, _ = _need(settings)
    return need if need is not None else int(settings["min_bytes"])


def _rule_free_short(facts: ShmFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """Big enough, but other processes or crashed jobs' leftover segments hold the space.
    A running job's own batches in flight already sit in what it needs, so they count
    as room for it, not against it."""
    size, free = facts.size_bytes, facts.free_bytes
    short = _free_wanted(settings)
    own = min(facts.own_bytes or 0, short)
    if free is None or free + own >= short or (size is not None and size < short):
        return []
    others = max(0, (_used(facts) or 0) - (facts.own_bytes or 0))
    held = f" ({format_bytes(others)} held by other processes or leftover segments)" if others else ""
    mine = f", besides the {format_bytes(facts.own_bytes)} this job holds" if facts.own_bytes else ""
    if facts.own_complete is False:
        mine += " (its process tree is larger than envdoctor reads: some of its own may be counted as others')"
    # a size that leaves room beside what others hold: the recommended size alone may be the size
    # it has already (helper-80: 1 GiB with 900 MiB held was told to remount at 1G)
    # A warn, not a fail, even with the loader known: what holds the space may be a running job's
    # own batches, which a node's row and torch's file_system sharing cannot tell apart from
    # leftovers (helper-94: a fail, briefly, for a job that finished fine)
    return [Finding(Status.WARN, f"{_subject(facts)} has only {format_bytes(free)} free{held}{mine}, expected >= "
                    f"{format_bytes(short - own)} free",
                    _remediation(facts, settings, leftovers=True, at_least=others + short))]


FEW_FILES = 1024  # files still creatable below which a DataLoader's batches in flight may not find one


def _rule_unusable(facts: ShmFacts, settings: Mapping[str, Any]) -> list[Finding]:
    """No /dev/shm, a read-only one, or one where no file can be created: nothing shared
    can be made there, whatever its size (helper-92: each was ok or a skip, and the
    DataLoader died with ENOENT, EROFS or ENOSPC)."""
    if facts.missing:
        size = docker_size(_suggested(settings))
        return [Finding(Status.FAIL, f"{facts.missing}: POSIX shared memory (DataLoader workers, NCCL) cannot work "
                        "there (FileNotFoundError on the first batch)",
                        f"docker run --shm-size={size} ... (Docker and Kubernetes give every container one); "
                        f"host: mkdir -p /dev/shm && mount -t tmpfs -o size={size} tmpfs /dev/shm")]
    found = []
    if facts.read_only:
        found.append(Finding(Status.FAIL, f"{_subject(facts)} is mounted read-only: DataLoader workers and NCCL "
                             "cannot create their segments there ('Read-only file system')",
                             "mount -o remount,rw /dev/shm; in a container, do not mount /dev/shm read-only "
                             "(Docker's --read-only leaves it writable)"))
    if facts.free_files is not None and facts.free_files < FEW_FILES:
        room = "no more files" if facts.free_files == 0 else f"only {facts.free_files} more files"
        workers, batch, prefetch = _loader(settings)
        # Each batch in flight takes a file at least; how many more (one per tensor, the workers'
        # semaphores) depends on the job: a job of several tensors a batch died with 19 free
        # where one of one tensor ran (helper-94). So fail only below one file a batch.
        in_flight = workers * prefetch + 1 if workers > 0 and batch > 0 else 1
        found.append(Finding(Status.FAIL if facts.free_files < in_flight else Status.WARN,
                             f"{_subject(facts)} can hold {room} (its inodes are used up, by leftover segments or a "
                             "small nr_inodes), whatever its free bytes: each batch in flight takes a file or more"
                             + (f" ({in_flight} batches at once here)" if in_flight > 1 else "")
                             + ", and a worker that cannot make one fails with 'No space left on device'",
                             "remove leftover /dev/shm/torch_* files of crashed jobs (`ls -la /dev/shm`), or mount it "
                             "without an nr_inodes limit: mount -o remount,nr_inodes=0 /dev/shm"))
    return found


RULES = (_rule_unusable, _rule_size_below_min, _rule_size_below_need, _rule_size_below_recommended, _rule_free_short)


def _used(facts: ShmFacts) -> int | None:
    size, free = facts.size_bytes, facts.free_bytes
    return None if size is None or free is None else max(0, size - free)


def _ok_summary(facts: ShmFacts, settings: Mapping[str, Any]) -> str:
    subject, size = _subject(facts), facts.size_bytes
    if facts.missing:  # never ok: _rule_unusable fails it
        return facts.missing
    if size is None:
        return f"{subject} is a tmpfs without a size limit (size=0: bounded only by memory)"
    need, how = _need(settings)
    against = (f"{how} need {format_bytes(need)}" if need is not None
               else f">= {format_bytes(int(settings['recommended_bytes']))} recommended")
    # devtmpfs and ramfs hold their files in memory, as tmpfs does (helper-107: a /dev/shm on /dev was "backed by disk")
    note = "" if facts.fstype in (None, "tmpfs", "devtmpfs", "ramfs") else f"; it is {facts.fstype}, not tmpfs, so it is backed by disk"
    return f"{subject} is {format_bytes(size)}, {format_bytes(facts.free_bytes or 0)} free ({against}){note}"


def judge(facts: ShmFacts, settings: Mapping[str, Any]) -> Result:
    settings = with_live_loader(facts, settings)
    findings = [finding for rule in RULES for finding in rule(facts, settings)]
    result_facts: dict[str, Any] = {
        "path": facts.path,
        "size_bytes": facts.size_bytes,
        "free_bytes": facts.free_bytes,
        "used_bytes": _used(facts),
        "own_bytes": facts.own_bytes,
        "own_complete": facts.own_complete,
        "fstype": facts.fstype,
        "own_mount": facts.mount_point == "/dev/shm" if facts.mount_point is not None else None,
        "read_only": facts.read_only,
        "free_files": facts.free_files,
        "min_bytes": int(settings["min_bytes"]),
        "recommended_bytes": int(settings["recommended_bytes"]),
        "need_bytes": _need(settings)[0],
        "suggested_bytes": _suggested(settings),
        "findings": [f"{f.status.value}: {f.message}" for f in findings],
    }
    return verdict(findings, result_facts, _ok_summary(facts, settings))


def _remediation(facts: ShmFacts, settings: Mapping[str, Any], leftovers: bool = False, at_least: int = 0) -> str:
    suggested, size = max(_suggested(settings), at_least), facts.size_bytes
    gib = -(-suggested // GIB)
    fixes = [
        f"docker run --shm-size={docker_size(suggested)} ... (or --ipc=host)",
        f"Kubernetes: volumes: [{{name: dshm, emptyDir: {{medium: Memory, sizeLimit: {k8s_size(suggested)}}}}}] "
        "with volumeMounts: [{name: dshm, mountPath: /dev/shm}]",
        f"host: mount -o remount,size={gib}G /dev/shm",
    ]
    if leftovers:  # first: what holds the space may be garbage, and a larger mount only hides it
        fixes.insert(0, "remove leftover /dev/shm/torch_* files of crashed jobs (`ls -la /dev/shm`; `fuser` shows "
                        "who holds one), or give it more room")
    workers, batch, prefetch = _loader(settings)
    # With the loader known, the workers that fit are named, below the floor too (helper-49: a
    # 192 MiB /dev/shm ran 2 and 3 workers of 32 MiB batches, and was told only "lower num_workers").
    fit = (max(0, math.floor((size / _headroom(settings) / batch - 1) / prefetch))
           if workers > 0 and batch > 0 and size else None)
    if fit is not None and fit < workers:  # naming the job's own num_workers, or more, fixed nothing (helper-42)
        fixes.append(f"or lower DataLoader num_workers to {fit} (fewer batches in flight, slower loading"
                     + ("; 0 loads in the training loop and the GPU waits" if fit == 0 else "") + ")")
    elif fit is None:  # the loader unknown: the workaround in general
        fixes.append("or lower DataLoader num_workers (slower loading; num_workers=0 uses no shared memory but the GPU waits)")
    # a known loader that fits gets no num_workers advice: fewer workers fix nothing for it
    return "; ".join(fixes)


CHECK = Check(
    id="shm.size",
    title="/dev/shm is big enough for DataLoader workers and NCCL (Docker's 64 MiB default is not)",
    gather=gather,
    judge=judge,
    modes=("check", "serve", "exec", "inprocess"),  # one statvfs: cheap, harmless
    intrusive=False,
    explain=__doc__ or "",
    config={
        "min_bytes": 256 * MIB,  # fail below
        "recommended_bytes": GIB,  # warn below, when the DataLoader settings are unknown
        "num_workers": 0,  # DataLoader num_workers; 0: unknown or not used
        "batch_bytes": 0,  # bytes of one collated batch; 0: unknown
        "prefetch_factor": 2,  # DataLoader's default
        "headroom": 1.5,  # warn when size < need x headroom
    },
    metrics=(
        Metric("shm_size_bytes", "size_bytes", "Size of the target's /dev/shm"),
        Metric("shm_free_bytes", "free_bytes", "Free bytes in the target's /dev/shm"),
    ),
)
