"""Which processes a run examines: the node itself plus every workload process.

A workload process is found in one of four cheap ways, in this order of trust:
1. NVML lists it on a GPU (compute processes of every device);
2. it is a python process whose memory map holds libtorch (a read of
   /proc/N/maps, only for processes whose comm or exe names python);
3. it announced itself: `envdoctor.attach()` drops `<pid>.json` in an announce
   directory ($ENVDOCTOR_ANNOUNCE_DIR, /run/envdoctor/attached), taken only when the
   process under that pid started when the announcement says (envdoctor.announce);
4. a config selector matches it: `[serve] select_comm = ["train*"]` (shell-style
   patterns on /proc/N/comm) or `select_env = ["MY_JOB_ID"]` (the variable is set in
   its environment).
Kernel threads, zombies, envdoctor itself and its children are never targets.
At most `max_targets` are examined per run (lowest pid first among each source, the
node always); the rest are counted as overflow. A process that vanishes between
the scan and its checks becomes a result with the reason, never a crash.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
from pathlib import Path

from envdoctor.paths import MAX_READ_BYTES, Roots, read_head

from envdoctor.announce import ANNOUNCE_DIRS, announced_pids
from envdoctor.record import Record, Value
from envdoctor.serve.torchmaps import TorchMaps

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Sequence
MAPS_LIMIT = 64 << 20  # bytes of /proc/N/maps read at most (a torch process has ~1 MiB)
# The innermost container id on the path: a process may sit in a subgroup of its container's
# (`docker-<id>.scope/init` under systemd in a container, crun's `libpod-<id>.scope/container`),
# or in a container inside another (helper-96: the `$` anchor lost those, and nerdctl's prefix).
_CONTAINER = re.compile(r"(?:docker-|cri-containerd-|crio-|libpod-|nerdctl-|/docker/|/containerd/|/crio/|/)"
                        r"([0-9a-f]{64})(?:\.scope)?(?=/|\s*$)")
# A pod's uid: a dashed UUID (underscores under the systemd driver), or the 32-hex hash the
# kubelet gives a static or mirror pod (helper-96)
_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})(?![0-9a-f])")


class Selectors(Value):
    """What the config adds to the automatic discovery."""

    def __init__(
        self,
        comm: tuple[str, ...] = (),
        env: tuple[str, ...] = (),
    ) -> None:
        self.comm = comm
        self.env = env


class TargetInfo(Value):
    """A target of one run and the labels its info series carries."""

    _repr_hidden = ("torch_maps", "image")  # long: the maps lines naming torch

    def __init__(
        self,
        label: str,  # "node" or "pid:N"
        pid: int | None,
        source: str,  # node | nvml | torch | announced | selector
        comm: str = "",
        container_id: str = "",
        pod_uid: str = "",
        # the lines of its maps naming a torch folder, when discovery read them this run (source
        # "torch"): its torch facts come from them instead of a second read of the whole maps
        torch_maps: str = "",
        # which process image it is (start time and stack start, from stat), for what serve
        # keeps of it from run to run (envdoctor.serve.torchmaps); empty when unread
        image: tuple[bytes, bytes] = (b"", b""),
    ) -> None:
        self.label = label
        self.pid = pid
        self.source = source
        self.comm = comm
        self.container_id = container_id
        self.pod_uid = pod_uid
        self.torch_maps = torch_maps
        self.image = image


class Found(Record):
    def __init__(
        self,
        targets: list[TargetInfo] | None = None,
        overflow: int = 0,  # found but not examined (max_targets)
        notes: list[str] | None = None,  # sources that could not be read, for the log
        left_out: frozenset[str] = frozenset(),  # the labels of those `overflow` counts
        unreadable: int = 0,  # python processes whose maps this daemon may not read: not examined
        cgroups: dict[int, str] | None = None,  # each target's /proc/N/cgroup as read, for this run's checks
    ) -> None:
        self.targets = [] if targets is None else targets
        self.overflow = overflow
        self.notes = [] if notes is None else notes
        self.left_out = left_out
        self.unreadable = unreadable
        self.cgroups = {} if cgroups is None else cgroups


def _read(path: Path | str, limit: int = 4096) -> bytes | None:
    """At most `limit` bytes of a /proc file, or None (envdoctor.paths.read_head): a FIFO
    planted in a --path.procfs tree must not hang every run; a longer file is cut, not refused.
    The per-process reads of a scan name their file as a string: a Path join cost more than
    the read, once for each of the node's processes every run."""
    return read_head(path, limit)


def _pid_name(name: str) -> int | None:
    """The pid a /proc entry or an announce file's stem names, or None. ASCII digits only:
    str.isdigit() also accepts '²' and other Unicode digits that int() refuses, and one such
    name (any job can drop files in the announce directory) would fail every run."""
    return int(name) if name.isascii() and name.isdigit() else None


def _is_python(procfs: Path, pid: int, comm: str) -> bool:
    if comm.startswith("python") or comm.startswith("pt_"):
        return True
    try:
        exe = os.readlink(f"{procfs}/{pid}/exe")
    except OSError:
        return False
    return "python" in os.path.basename(exe)


def _torch_maps(procfs: Path, pid: int) -> str | None:
    """The lines of the process's maps that name a torch folder when it has libtorch
    mapped, else None."""
    data = _read(f"{procfs}/{pid}/maps", MAPS_LIMIT)
    if not data or b"libtorch" not in data:
        return None
    lines, start = [], 0
    while (at := data.find(b"/torch/", start)) != -1:
        end = data.find(b"\n", at)
        end = len(data) if end == -1 else end
        lines.append(data[data.rfind(b"\n", 0, at) + 1:end])
        start = end
    return b"\n".join(lines).decode("utf-8", "surrogateescape")


def _maps_denied(procfs: Path, pid: int) -> bool:
    """Whether the process's maps are closed to this daemon (another user's process, and no
    CAP_SYS_PTRACE): whether it runs torch cannot be seen (helper-89: such jobs vanished
    from the metrics without a word)."""
    try:
        os.close(os.open(f"{procfs}/{pid}/maps", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def _is_workload(procfs: Path, pid: int) -> tuple[bool, str, tuple[bytes, bytes]]:
    """(a user process that is not a zombie, its comm, which process image it is: its start
    time and stack start, fields 22 and 28 of stat). Kernel threads have PF_KTHREAD set."""
    status = _read(f"{procfs}/{pid}/stat", 1024)
    if not status:
        return False, "", (b"", b"")
    close = status.rfind(b")")
    comm = status[status.find(b"(") + 1:close].decode("utf-8", "replace")
    fields = status[close + 2:].split()
    identity = (fields[19], fields[25]) if len(fields) > 25 else (b"", b"")
    if not fields or fields[0] in (b"Z", b"X"):
        return False, comm, identity
    try:
        flags = int(fields[6])
    except (IndexError, ValueError):
        flags = 0
    if flags & 0x00200000:  # PF_KTHREAD
        return False, comm, identity
    return True, comm, identity


ADDR_NO_RANDOMIZE = 0x0040000  # personality(2) flag: setarch -R


def _randomized(procfs: Path, pid: int, node_randomizes: bool) -> bool:
    """Whether an exec would move the process's stack (envdoctor.serve.torchmaps trusts
    remembered maps lines only then): randomisation on for the node and the process."""
    if not node_randomizes:
        return False
    text = _read(f"{procfs}/{pid}/personality", 64)
    try:
        return text is not None and not int(text.strip() or b"x", 16) & ADDR_NO_RANDOMIZE
    except ValueError:
        return False


def exec_visible(procfs: Path, pid: int) -> bool:
    """Whether an exec of process `pid` would move its stack (what serve keeps of a process
    image holds only then): randomisation on for the node and for the process."""
    return _randomized(procfs, pid, _node_randomizes(procfs))


def _node_randomizes(procfs: Path) -> bool:
    """kernel.randomize_va_space: 0 (or unreadable) means no exec moves a stack."""
    return (_read(f"{procfs}/sys/kernel/randomize_va_space", 16) or b"").strip() not in (b"0", b"")


def _torch_lines(procfs: Path, pid: int, identity: tuple[bytes, bytes], memo: TorchMaps | None,
                 node_randomizes: bool = True) -> str | None:
    if memo is None or not identity[0]:
        return _torch_maps(procfs, pid)
    return memo.lines(pid, identity, lambda: _torch_maps(procfs, pid),
                      exec_visible=lambda: _randomized(procfs, pid, node_randomizes))


def container_of(cgroup_text: str) -> tuple[str, str]:
    """(container id, pod uid) from /proc/N/cgroup, "" when the process is in none."""
    container, pod = "", ""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        if not pod:
            m = _POD.search(path)
            if m:
                pod = m.group(1).replace("_", "-")
        if not container:
            ids = _CONTAINER.findall(path)
            if ids:
                container = ids[-1]
    return container, pod


def _env_has(procfs: Path, pid: int, names: Sequence[str]) -> bool:
    """Whether the process's environment sets one of `names`, read as far as the checks read
    it (helper-78: a variable past the first MiB of a 1.3 MB environment was not found)."""
    data = _read(f"{procfs}/{pid}/environ", MAX_READ_BYTES)
    if not data:
        return False
    keys = {item.split(b"=", 1)[0] for item in data.split(b"\0") if item}
    # a name that is not UTF-8 came from the environment as os.environ reads it (surrogateescape):
    # its bytes are the name (helper-93: encode() raised, and every run of the daemon failed)
    return any(n.encode("utf-8", "surrogateescape") in keys for n in names)


OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)
CGROUP_LIMIT = 65536  # /proc/N/cgroup is a line per hierarchy: ~13 with cgroup v1


class DiscoveryFailed(Exception):
    """The process list could not be read this run for want of descriptors or memory."""


def discover(roots: Roots, *, max_targets: int, selectors: Selectors = Selectors(),
             nvml_pids: Callable[[], list[int]] | None = None, exclude: Iterable[int] = (),
             announce_dirs: Sequence[str] | None = None, torch_maps_memo: TorchMaps | None = None,
             reading: Callable[[int | str], None] | None = None,
             announcements: Callable[[list[str], Path], list[int]] = announced_pids) -> Found:
    """The node plus every workload process, bounded by max_targets (the node counts as one).
    `torch_maps_memo` (a daemon's) keeps torch processes' maps lines between runs.
    `reading` is told each step's name, then each pid before its files are read: a read
    of /proc/N/maps or environ waits for the process's memory-map lock, and a process in
    uninterruptible sleep can hold it for good (the way `ps` hangs on such a node); a
    caller that bounds discovery with a deadline learns where it hung
    (serve.bounded_discovery). `announcements` reads the announce directories (serve
    bounds it on its own: a directory on a dead mount costs that source, not the run)."""
    procfs = roots.procfs
    reading = reading or _nobody
    found = Found(targets=[TargetInfo("node", None, "node")])
    skip = set(exclude)
    chosen: dict[int, str] = {}  # pid -> source, first source wins

    if nvml_pids is not None:
        reading("asking NVML for its processes")
        try:
            for pid in nvml_pids():
                chosen.setdefault(pid, "nvml")
        except Exception as exc:  # NVML missing or hung is a note, not a failed discovery
            found.notes.append(f"nvml: {exc}")
    # The default directory is the host's (jobs on it, and containers that mount it, write
    # there): under --path.rootfs when serve runs in a container of its own. A directory
    # named by $ENVDOCTOR_ANNOUNCE_DIR is taken as serve itself sees it.
    dirs = list(announce_dirs) if announce_dirs is not None else [
        *filter(None, [os.environ.get("ENVDOCTOR_ANNOUNCE_DIR")]), *(str(roots.seen_by(None, d)) for d in ANNOUNCE_DIRS)]
    reading(f"reading the announce directories {', '.join(dirs)}")
    try:
        for pid in announcements(dirs, procfs):
            chosen.setdefault(pid, "announced")
    except Exception as exc:  # untrusted files: what they break costs their own source, not the run
        found.notes.append(f"announcements: {type(exc).__name__}: {exc}")

    reading(f"listing {procfs}")
    try:
        entries = [pid for pid in map(_pid_name, os.listdir(procfs)) if pid is not None]
    except OSError as exc:
        if exc.errno in OUT_OF_DESCRIPTORS:
            # Not "no processes": every target would be reported gone and come back a run
            # later (helper-63). The run fails instead, says why, and the last one stands.
            raise DiscoveryFailed(f"cannot list {procfs}: {exc.strerror or exc} "
                                  "(raise the daemon's open-file limit: LimitNOFILE= in its unit)") from None
        found.notes.append(f"cannot list {procfs}: {exc.strerror or exc}")
        entries = []
    comms: dict[int, str] = {}
    identities: dict[int, tuple[bytes, bytes]] = {}
    # kernel.randomize_va_space 0: no exec moves a stack, so no maps lines are remembered
    node_randomizes = _node_randomizes(procfs)
    torch_maps: dict[int, str] = {}
    for pid in sorted(entries):
        if pid in skip:
            continue
        reading(pid)
        workload, comm, identity = _is_workload(procfs, pid)
        if not workload:
            chosen.pop(pid, None)  # a zombie or kernel thread, whoever listed it
            continue
        comms[pid] = comm
        identities[pid] = identity
        if pid in chosen:
            continue
        if selectors.comm and any(fnmatch.fnmatchcase(comm, p) for p in selectors.comm):
            chosen[pid] = "selector"
        elif _is_python(procfs, pid, comm) and (lines := _torch_lines(procfs, pid, identity, torch_maps_memo, node_randomizes)) is not None:
            chosen[pid] = "torch"
            torch_maps[pid] = lines
        elif selectors.env and _env_has(procfs, pid, selectors.env):
            chosen[pid] = "selector"
        elif _is_python(procfs, pid, comm) and _maps_denied(procfs, pid):
            found.unreadable += 1  # another user's, without CAP_SYS_PTRACE: said, not silently left out

    order = {"nvml": 0, "announced": 1, "selector": 2, "torch": 3}
    # only pids alive in this procfs (NVML may list pids of another pid namespace)
    ranked = sorted((pid for pid in chosen if pid not in skip and pid in comms),
                    key=lambda p: (order[chosen[p]], p))
    room = max(0, max_targets - 1)
    found.overflow = max(0, len(ranked) - room)
    found.left_out = frozenset(f"pid:{pid}" for pid in ranked[room:])
    for pid in ranked[:room]:
        reading(pid)
        data = _read(f"{procfs}/{pid}/cgroup", CGROUP_LIMIT)
        cgroup = (data or b"").decode("utf-8", "replace")
        if data and len(data) < CGROUP_LIMIT:  # whole: the CPU quota lookup reads no second copy
            found.cgroups[pid] = cgroup
        container, pod = container_of(cgroup)
        comm = comms.get(pid) or (_read(f"{procfs}/{pid}/comm", 256) or b"").decode("utf-8", "replace").strip()
        lines = torch_maps.get(pid)
        if lines is None and torch_maps_memo is not None and _is_python(procfs, pid, comm):
            # found by NVML, an announcement or a selector: its torch facts need these lines too
            lines = _torch_lines(procfs, pid, identities[pid], torch_maps_memo, node_randomizes)
        found.targets.append(TargetInfo(f"pid:{pid}", pid, chosen[pid], comm, container, pod, lines or "",
                                        identities[pid]))
    if torch_maps_memo is not None:
        torch_maps_memo.keep_only({t.pid for t in found.targets if t.pid is not None})
    return found


def _nobody(what: int | str) -> None:
    """discover()'s `reading` when nobody asked."""


def own_family(procfs: Path, me: int | None = None) -> set[int]:
    """envdoctor's own pid and its children (probe subprocesses): never targets."""
    me = os.getpid() if me is None else me
    family = {me}
    try:
        threads = os.listdir(procfs / str(me) / "task")  # a child belongs to the thread that started it
    except OSError:
        threads = [str(me)]
    for tid in threads:
        data = _read(procfs / str(me) / "task" / tid / "children", 65536) or b""
        family.update(int(x) for x in data.split() if x.isdigit())
    return family


def nvml_pids_of(nvml: Any) -> list[int]:
    """Every compute process NVML lists on any GPU."""
    return sorted({pid for dev in nvml.gpu_use() for pid, _used in dev.processes})
