"""Memory samples of one process, and a bounded history of them per target.

What one sample holds, for a target process (`pid`, or this process):
- `rss`: its resident set (VmRSS of <procfs>/N/status);
- `cgroup`: its memory cgroup's working set: usage less the inactive file cache
  (v1 memory.usage_in_bytes - total_inactive_file, v2 memory.current -
  inactive_file), which is what the OOM killer and the kubelet go by: a job that
  reads its data set fills the page cache up to the limit, and that cache is
  reclaimed, not fatal. Only where the cgroup path sets a limit: an unlimited
  cgroup may be a whole slice (other processes' growth is not the target's);
- `shm`: bytes used in its /dev/shm (its own mount, through /proc/N/root). Every process
  in a mount namespace shares that mount, so MemoryHistory.sample (serve) keeps one series
  per mount and shows it on one process of those on it (see MemoryHistory);
- `gpuN`: its memory on NVIDIA GPU N, from NVML's per-process accounting. NVML
  cannot say inside a container that has its own PID namespace (it reports host
  pids) or on MIG: that is "not available" and the series is simply absent,
  never a 0 that would look like a steady job;
- `cudaN_reserved` / `cudaN_allocated`: the caching allocator's figures, when the
  job is attached (envdoctor.attach publishes them, only once CUDA is up), with
  the counters `cudaN_alloc_retries` and `cudaN_inactive_split`;
and, for each, the limit it runs into and the headroom left before it: the
tightest of the cgroup's limit (every level of its path: the kernel enforces each)
and the host's available memory for `rss` and `cgroup`; the mount's size for
`shm`; the device's free memory for the GPU series.

`Sampler(roots, pid, nvml=...)` resolves the cgroup files once (the same path
resolution as the CPU quota, envdoctor.cgroup) and reads them on each `sample()`;
nothing it reads can block for long (procfs, cgroupfs, statvfs of a tmpfs; NVML
through its own bounded facade). `MemoryHistory` keeps the last `maxlen` samples
per target, so the daemon's memory does not grow with uptime, and drops a target
whose process exited or whose pid was reused.
"""

from __future__ import annotations

import math
import os
import threading
from array import array
import time
from collections import namedtuple
from pathlib import Path
from types import MappingProxyType

from envdoctor.paths import Roots, proc_status, read_text, shm_seen_by

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Mapping, Sequence

    Shared = Callable[[str, Callable[[], Any]], Any]

UNLIMITED = 1 << 60  # v1 writes 9223372036854771712 (PAGE_COUNTER_MAX) for "no limit"


class Limit(namedtuple("Limit", (
        "limit",  # int | None
        "headroom",  # int
        "name",  # str: "cgroup memory limit", "host memory", "GPU 0", "/dev/shm"
        "throttles",  # bool = False: past it the job is slowed (cgroup v2 memory.high), not killed
        "then",  # Limit | None = None: for a throttling bound, the limit beyond it that kills
), defaults=(False, None))):
    """What a memory runs into: `limit` bytes in all (None when unbounded), `headroom` bytes left."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        out = {"limit_bytes": self.limit, "headroom_bytes": self.headroom, "limit_name": self.name}
        if self.throttles:
            out["throttles"] = True
        if self.then is not None:
            out["then"] = self.then.to_dict()
        return out


class Sample(namedtuple("Sample", (
        "t",  # float: time.monotonic() seconds
        "values",  # Mapping[str, float]: memory name -> bytes in use
        "limits",  # Mapping[str, Limit] = MappingProxyType({}): read only: one empty default for all
        "counters",  # Mapping[str, float] = MappingProxyType({}): allocator retries, inactive split...
        "notes",  # tuple[str, ...] = (): what could not be read, and why
), defaults=(MappingProxyType({}), MappingProxyType({}), ()))):
    __slots__ = ()


class ProcessGone(Exception):
    """The target exited (or its pid now names another process)."""


# -- small readers --------------------------------------------------------------------


def _number(text: str) -> int | None:
    """A decimal count from a kernel file, or None. ASCII only: str.isdigit() also takes
    '²', which int() refuses (a garbage file must cost its value, not the sample)."""
    return int(text) if text.isascii() and text.isdigit() else None


# The largest byte count or counter taken from an attached document: 2^60 bytes is an
# exabyte. A bigger number is not a measurement (10**400 raised OverflowError in the trend
# fit, which converts each point to float), and a bool is not a number at all.
_MAX_FIGURE = 1 << 60
# Device indices taken from the document: a node has at most a few dozen GPUs. Without a
# bound, a 64 KiB document naming 2,000 devices kept 4,000 series x 720 points per process
# in the daemon's history (hundreds of MiB); "01" and "1" are one device, not two.
MAX_DEVICES = 64


def _figure(value: Any) -> int | float | None:
    """A byte count or counter from the untrusted document, or None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value if 0 <= value <= _MAX_FIGURE else None


def _kib_field(text: str, name: str) -> int | None:
    for line in text.splitlines():
        if line.startswith(name + ":"):
            parts = line.split()
            value = _number(parts[1]) if len(parts) >= 2 else None
            if value is not None:
                return value * 1024
    return None


def _int_file(path: Path) -> int | None:
    try:
        text = read_text(path, 4096).strip()
    except OSError:
        return None
    if text == "max":
        return UNLIMITED
    return _number(text)


def _stat_field(path: Path, name: str) -> int | None:
    try:
        for line in read_text(path, 1 << 20).splitlines():
            key, _, value = line.partition(" ")
            if key == name and _number(value.strip()) is not None:
                return _number(value.strip())
    except OSError:
        return None
    return None


def start_time(roots: Roots, pid: int | None) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/N/stat):
    with the pid, what tells one process from a later one that reuses its pid."""
    try:
        text = read_text(roots.proc(pid, "stat"), 1 << 16)
    except OSError:
        return None
    rest = text[text.rfind(")") + 1:].split()
    return _number(rest[19]) if len(rest) > 19 else None


def host_available(roots: Roots) -> tuple[int | None, int | None]:
    """(MemTotal, MemAvailable) of <procfs>/meminfo, in bytes."""
    try:
        text = read_text(Path(roots.procfs) / "meminfo", 1 << 20)
    except OSError:
        return None, None
    return _kib_field(text, "MemTotal"), _kib_field(text, "MemAvailable")


# -- the cgroup's memory --------------------------------------------------------------


class _CgroupFiles(namedtuple("_CgroupFiles", (
        "version",  # str
        "levels",  # tuple[Path, ...]: the target's cgroup first, then each parent up to the mount's top
))):
    __slots__ = ()


def _cgroup_files(roots: Roots, pid: int | None) -> tuple[_CgroupFiles | None, list[str]]:
    from envdoctor.cgroup import cgroup_dirs

    found, notes = cgroup_dirs(roots, pid, "memory")
    # v1's memory controller where it is mounted (hybrid hosts keep memory on v1);
    # else v2, when its level has memory.current (the controller is enabled there).
    ordered = sorted(found, key=lambda f: f[0] != "cgroup v1")
    for version, base, rel in ordered:
        levels = tuple(base.joinpath(*rel[:depth]) for depth in range(len(rel), -1, -1))
        usage = "memory.usage_in_bytes" if version == "cgroup v1" else "memory.current"
        if (levels[0] / usage).exists():
            return _CgroupFiles(version, levels), notes
        if version == "cgroup v2":
            # a level whose parent does not enable memory in cgroup.subtree_control has no memory
            # files, but the parent's memory.max still holds it (helper-96: the limit was dropped)
            for i, level in enumerate(levels[1:], start=1):
                if (level / usage).exists():
                    notes.append(f"memory is accounted from {level} up: the target's own cgroup has no memory "
                                 "controller (its usage there is its siblings' too)")
                    return _CgroupFiles(version, levels[i:]), notes
    if not found:
        notes.append("no memory cgroup found for the target")
    return None, notes


# cgroup v2's throttling bound: above it the kernel reclaims the group's memory and throttles
# its allocations, so a job that keeps growing slows to a crawl there (Kubernetes' MemoryQoS
# sets it below the limit; systemd's MemoryHigh=), and memory.max, if set, still kills it
# later. It comes first, so it is the bound named, with the kill limit beyond it (`then`).
HIGH_NAME = "memory.high"


def _read_cgroup(files: _CgroupFiles) -> tuple[int | None, Limit | None]:
    """(working set at the target's level, the tightest limit over the path)."""
    v1 = files.version == "cgroup v1"
    usage_name, limit_name = ("memory.usage_in_bytes", "memory.limit_in_bytes") if v1 else ("memory.current", "memory.max")
    inactive_name = "total_inactive_file" if v1 else "inactive_file"
    working = None
    best: Limit | None = None
    kill: Limit | None = None  # the tightest limit that kills (memory.max), for a throttling bound's `then`
    for depth, level in enumerate(files.levels):
        usage = _int_file(level / usage_name)
        if usage is None:
            continue
        inactive = _stat_field(level / "memory.stat", inactive_name) or 0
        level_working = max(0, usage - inactive)
        if depth == 0:
            working = level_working
        for name, throttles in ((limit_name, False), *(() if v1 else ((HIGH_NAME, True),))):
            limit = _int_file(level / name)
            if limit is None or limit >= UNLIMITED:
                continue
            headroom = limit - level_working
            found = Limit(limit, headroom, f"{files.version} {'memory.high' if throttles else 'memory limit'} {level / name}",
                          throttles)
            if best is None or headroom < best.headroom:
                best = found
            if not throttles and (kill is None or headroom < kill.headroom):
                kill = found
    if best is not None and best.throttles and kill is not None:
        best = best._replace(then=kill)
    return working, best


def _with_host(limit: Limit | None, host: Limit | None) -> Limit | None:
    """A throttling bound's `then` (the limit that kills) is the tighter of the cgroup's and
    the host's memory: with memory.max far up or unset, the host runs out first (helper-101)."""
    if limit is None or not limit.throttles or host is None:
        return limit
    then = limit.then
    return limit._replace(then=host if then is None or host.headroom < then.headroom else then)


# -- one target -----------------------------------------------------------------------




def _unshared(key: str, read: Callable[[], Any]) -> Any:
    return read()


class Sampler:
    """Samples one process. `live` returns the attached job's document (or None)."""

    def __init__(self, roots: Roots = Roots(), pid: int | None = None, nvml: Any = None,
                 live: Callable[[], Mapping[str, Any] | None] | None = None):
        self.roots, self.pid, self.nvml, self.live = roots, pid, nvml, live
        self.started = start_time(roots, pid)
        self._cgroup: _CgroupFiles | None = None
        self._cgroup_notes: list[str] = []
        self._cgroup_resolved = False
        self.shm_mount: int | None = None  # st_dev of the /dev/shm it sees, once sampled

    def _host_pid(self) -> int:
        return os.getpid() if self.pid is None else self.pid

    def sample(self, shared: Shared | None = None) -> Sample:
        """One sample now. Raises ProcessGone when the process exited or its pid was reused.

        `shared(key, read)`, when given, is a memo for this moment (serve: one run's node
        facts): what every process reads alike (the host's meminfo) or what the processes of
        one container do (their cgroup's memory files, three levels of three files) is
        then read once a run, not once per process; the process's own status once a run,
        for this sample and the live-view lookup (paths.proc_status)."""
        share = shared if shared is not None else _unshared
        t = time.monotonic()
        notes: list[str] = []
        values: dict[str, float] = {}
        limits: dict[str, Limit] = {}
        counters: dict[str, float] = {}
        try:
            status = proc_status(self.roots, self.pid, shared)  # the live-view lookup reads the same
        except (FileNotFoundError, ProcessLookupError):
            raise ProcessGone(f"process {self.pid} exited") from None
        except OSError as exc:
            raise ProcessGone(f"cannot read {self.roots.proc(self.pid, 'status')}: {exc.strerror or exc}") from None
        if self.pid is not None and start_time(self.roots, self.pid) != self.started:
            raise ProcessGone(f"pid {self.pid} now names another process")

        total, available = share("memsample.meminfo", lambda: host_available(self.roots))
        host = Limit(total, available, "host memory") if available is not None else None
        rss = _kib_field(status, "VmRSS")
        if rss is not None:
            values["rss"] = rss

        if not self._cgroup_resolved:
            self._cgroup, self._cgroup_notes = _cgroup_files(self.roots, self.pid)
            self._cgroup_resolved = True
        notes.extend(self._cgroup_notes)
        cg_limit = None
        if self._cgroup is not None:
            files = self._cgroup
            working, cg_limit = share(f"memsample.cgroup:{files.levels[0]}", lambda: _read_cgroup(files))
            # The cgroup's own series only where a limit makes it the constraint: without
            # one, the cgroup may be a whole slice or the root (other processes' growth,
            # not the target's), and rss against host memory says what matters.
            if working is not None and cg_limit is not None:
                values["cgroup"] = working
        tightest = _with_host(min((lim for lim in (cg_limit, host) if lim is not None), key=lambda lim: lim.headroom,
                                  default=None), host)
        if "rss" in values and tightest is not None:
            limits["rss"] = tightest
        if "cgroup" in values and tightest is not None:
            limits["cgroup"] = tightest

        self._shm(values, limits, notes, shared)
        self._gpu(values, limits, notes)
        self._attached(values, limits, counters, notes)
        return Sample(t, values, limits, counters, tuple(notes))

    def _shm(self, values: dict, limits: dict, notes: list[str], shared: Shared | None = None) -> None:
        self.shm_mount = None  # until this sample reads one
        try:
            path = self.roots.seen_by(self.pid, shm_seen_by(self.roots, self.pid, shared))
            st = os.statvfs(path)
            mount = os.stat(path).st_dev
        except OSError as exc:
            notes.append(f"/dev/shm: {exc.strerror or exc}")
            return
        size = st.f_blocks * st.f_frsize
        if size == 0:
            return  # an unlimited tmpfs: statvfs says 0; nothing to run into but memory
        self.shm_mount = mount  # MemoryHistory keeps one series per mount (serve), not one per process
        values["shm"] = (st.f_blocks - st.f_bfree) * st.f_frsize
        limits["shm"] = Limit(size, st.f_bavail * st.f_frsize, "/dev/shm")

    def _gpu(self, values: dict, limits: dict, notes: list[str]) -> None:
        if self.nvml is None:
            return
        try:
            devices = self.nvml.gpu_use()
        except Exception as exc:  # Unavailable, a hung driver: the GPU series are just absent
            notes.append(f"NVML: {exc}")
            return
        pid = self._host_pid()
        for gpu in devices:
            if gpu.mig_mode:
                notes.append(f"GPU {gpu.index}: MIG mode, per-process memory not available")
                continue
            for proc_pid, used in gpu.processes:
                if proc_pid != pid:
                    continue
                if used is None:
                    notes.append(f"GPU {gpu.index}: per-process memory not available (container or driver)")
                    continue
                name = f"gpu{gpu.index}"
                values[name] = used
                if gpu.memory_free_bytes is not None:
                    limits[name] = Limit(gpu.memory_total_bytes, gpu.memory_free_bytes, f"GPU {gpu.index} memory")

    def _attached(self, values: dict, limits: dict, counters: dict, notes: list[str]) -> None:
        if self.live is None:
            return
        try:
            doc = self.live()
        except Exception as exc:  # an untrusted document: a note, never a crash
            notes.append(f"attached document: {exc}")
            return
        cuda = (doc if isinstance(doc, dict) else {}).get("cuda") or {}
        devices = cuda.get("devices") if isinstance(cuda, dict) else None
        if not isinstance(devices, dict):  # a list or a string there (a hostile job) is no device at all
            return
        for index, dev in devices.items():
            number = _number(str(index))
            if not isinstance(dev, dict) or number is None or number >= MAX_DEVICES:
                continue
            self._device(str(number), dev, values, limits, counters)

    @staticmethod
    def _device(index: str, dev: Mapping[str, Any], values: dict, limits: dict, counters: dict) -> None:
        """One device's allocator figures; each must be a plausible byte count (_figure)."""
        reserved, allocated = _figure(dev.get("reserved_bytes")), _figure(dev.get("allocated_bytes"))
        total, free = _figure(dev.get("total_bytes")), _figure(dev.get("free_bytes"))
        for kind, value in (("reserved", reserved), ("allocated", allocated)):
            if not isinstance(value, int):
                continue
            name = f"cuda{index}_{kind}"
            values[name] = value
            if isinstance(total, int) and total > 0 and isinstance(reserved, int):
                # the allocator grows into the device's free memory (the driver's figure, which
                # counts other processes too), else into what it has not reserved yet
                headroom = free if isinstance(free, int) else total - reserved
                if kind == "allocated":
                    headroom += max(0, reserved - value)  # cached blocks are reused first
                limits[name] = Limit(total, headroom, f"GPU {index} memory")
        for key in ("num_alloc_retries", "inactive_split_bytes"):
            value = _figure(dev.get(key))
            if value is not None:
                counters[f"cuda{index}_{key}"] = value


# -- many targets over time -----------------------------------------------------------


class _Track:
    """One target's samples, stored compactly: serve keeps maxlen of them for every
    process it watches. As a deque of (names, array) per point, 64 processes x 720
    points held ~9 MiB (a tuple and an array object per point), a third of serve's
    RSS budget; as tuples of two dicts it was ~27 MiB. Here consecutive samples with
    the same memory names share one segment, a flat array('d') of rows [t, *values]:
    8 bytes a number. series() slices the columns out in C."""

    __slots__ = ("sampler", "maxlen", "segments", "rows", "latest")

    def __init__(self, sampler: "Sampler | None", maxlen: int):
        self.sampler = sampler
        self.maxlen = max(1, maxlen)
        self.segments: list[tuple[tuple[str, ...], array]] = []  # (names, rows of 1 + len(names))
        self.rows = 0
        self.latest: Sample | None = None

    def append(self, sample: Sample) -> None:
        names = (*sample.values, *sample.counters)
        if not self.segments or self.segments[-1][0] != names:
            self.segments.append((names, array("d")))
        self.segments[-1][1].extend([sample.t, *sample.values.values(), *sample.counters.values()])
        self.rows += 1
        while self.rows > self.maxlen:  # the oldest row goes (a memmove of a few KiB)
            names, rows = self.segments[0]
            del rows[:len(names) + 1]
            if not rows:
                self.segments.pop(0)
            self.rows -= 1
        self.latest = sample

    def last_time(self) -> float:
        if not self.segments:
            return 0.0
        names, rows = self.segments[-1]
        return rows[-(len(names) + 1)]

    def series(self) -> dict[str, tuple[array, array]]:
        out: dict[str, tuple[array, array]] = {}
        for names, rows in self.segments:
            stride = len(names) + 1
            ts = rows[0::stride]
            for column, name in enumerate(names, 1):
                ys = rows[column::stride]
                if name in out:
                    before_t, before_y = out[name]
                    out[name] = (before_t + ts, before_y + ys)
                else:
                    out[name] = (ts, ys)
        return out


class MemoryHistory:
    """The last `maxlen` samples per target, for at most `max_targets` targets.

    serve calls `sample(targets)` every interval (one Sampler per target, kept while
    the process lives), `prune(alive)` after discovery, and the check reads
    `series(label)` and `latest(label)`. Memory stays bounded: maxlen x targets rows of
    numbers; a target whose process exited is dropped on its next sample.

    Wiring in serve (one history for the daemon's life):

        history = MemoryHistory(maxlen=720)              # 1 h at a 5 s interval
        # every interval, on the watchdog, after discovering the targets:
        history.sample([(t.label, t.pid) for t in targets], roots, nvml=<the NVML facade or None>,
                       live=lambda pid: attach_reader.live_document(roots, pid))
        history.prune(t.label for t in targets)
        # before running the checks of that run:
        host.fact(memory_cache_growth.HISTORY_FACT, lambda: history)
    """

    def __init__(self, maxlen: int = 720, max_targets: int = 512):
        self.maxlen, self.max_targets = maxlen, max_targets
        self._tracks: dict[str, _Track] = {}
        self._lock = threading.Lock()
        # /dev/shm usage is the mount's: one series per mount (st_dev), shown on one process of
        # those on it, its "owner", who keeps it while it lives; then the next one sampled there
        # takes it over, series and all. Per process, one writer's growth warned every process on
        # the mount and paged once for each (helper-42, -44, -50); shown on the first sampled in
        # each run, it hopped between processes and left a frozen copy behind (helper-52).
        self._shm_tracks: dict[int, _Track] = {}
        self._shm_owner: dict[int, str] = {}
        self._mount_of: dict[str, int] = {}

    def add(self, label: str, sample: Sample, sampler: Sampler | None = None) -> None:
        with self._lock:
            track = self._tracks.get(label)
            if track is None:
                if len(self._tracks) >= self.max_targets:
                    oldest = min(self._tracks, key=lambda k: self._tracks[k].last_time())
                    self._drop(oldest)
                track = self._tracks[label] = _Track(sampler, self.maxlen)
            track.append(sample)

    def sample(self, targets: Iterable[tuple[str, int | None]], roots: Roots = Roots(), nvml: Any = None,
               live: Callable[[int | None], Mapping[str, Any] | None] | None = None,
               shared: Shared | None = None) -> dict[str, str]:
        """Sample each (label, pid) once; returns {label: why it was dropped} for targets that
        are gone. `shared`: see Sampler.sample."""
        gone: dict[str, str] = {}
        for label, pid in targets:
            with self._lock:
                track = self._tracks.get(label)
            sampler = track.sampler if track is not None and track.sampler is not None else None
            reader = (lambda pid=pid: live(pid)) if live else None
            if sampler is None:
                sampler = Sampler(roots, pid, nvml, reader)
            else:  # kept for the process's life, it samples through this run's NVML and reader
                sampler.nvml, sampler.live = nvml, reader
            try:
                sample = sampler.sample(shared)
            except ProcessGone as exc:
                self.forget(label)
                gone[label] = str(exc)
                continue
            finally:
                # ...and holds neither between runs: serve's reader closes over the run's node
                # facts, which a kept sampler would keep alive after the run (gc.freeze: for good)
                sampler.nvml = sampler.live = None
            self.add(label, self._take_shm(label, sample, sampler.shm_mount), sampler)
        return gone

    def _take_shm(self, label: str, sample: Sample, mount: int | None) -> Sample:
        """The sample without its shm figure, which goes to its mount's series when this target
        owns the mount (the first sampled there while no owner lives)."""
        with self._lock:
            if self._mount_of.get(label) != mount:
                self._leave_mount(label)  # it moved (or lost its /dev/shm): the next one there takes over
            if "shm" not in sample.values or mount is None:
                return sample
            self._mount_of[label] = mount
            owner = self._shm_owner.get(mount)
            if owner is None or (owner not in self._tracks and owner != label):
                owner = self._shm_owner[mount] = label
            if owner == label:
                track = self._shm_tracks.get(mount)
                if track is None:
                    track = self._shm_tracks[mount] = _Track(None, self.maxlen)
                track.append(Sample(sample.t, {"shm": sample.values["shm"]},
                                    {"shm": sample.limits["shm"]} if "shm" in sample.limits else {}))
        return sample._replace(values={k: v for k, v in sample.values.items() if k != "shm"},
                               limits={k: v for k, v in sample.limits.items() if k != "shm"})

    def _owned_shm(self, label: str) -> "_Track | None":
        """The mount series this target shows, when it owns its mount (call under the lock)."""
        mount = self._mount_of.get(label)
        if mount is None or self._shm_owner.get(mount) != label:
            return None
        return self._shm_tracks.get(mount)

    def _leave_mount(self, label: str) -> None:
        """The target is no longer on the mount it was (it exited, moved to another mount
        namespace, or its /dev/shm can no longer be read; helper-53): its ownership ends, so
        the next process sampled there takes the series over; a mount no target is on any
        more takes its series with it. Call under the lock."""
        mount = self._mount_of.pop(label, None)
        if mount is None:
            return
        if self._shm_owner.get(mount) == label:
            del self._shm_owner[mount]
        if mount not in self._mount_of.values():
            self._shm_tracks.pop(mount, None)

    def _drop(self, label: str) -> None:
        """Forget a target and what it owned (call under the lock)."""
        self._tracks.pop(label, None)
        self._leave_mount(label)

    def forget(self, label: str) -> None:
        with self._lock:
            self._drop(label)

    def prune(self, alive: Iterable[str]) -> None:
        keep = set(alive)
        with self._lock:
            for label in [k for k in (*self._tracks, *self._mount_of) if k not in keep]:
                self._drop(label)

    def labels(self) -> list[str]:
        with self._lock:
            return list(self._tracks)

    def latest(self, label: str) -> Sample | None:
        with self._lock:
            track = self._tracks.get(label)
            latest = track.latest if track else None
            shm = self._owned_shm(label)
            if latest is None or shm is None or shm.latest is None:
                return latest
            return latest._replace(values={**latest.values, **shm.latest.values},
                                   limits={**latest.limits, **shm.latest.limits})

    def series(self, label: str) -> dict[str, tuple[Sequence[float], Sequence[float]]]:
        """{memory name: (times, values)} over the kept window; counters under their own names.
        Each is an array('d'), a copy: later samples do not change it."""
        with self._lock:
            track = self._tracks.get(label)
            out = track.series() if track else {}
            shm = self._owned_shm(label)
            if shm is not None and track is not None:
                out.update(shm.series())
            return out


def sample_window(sampler: Sampler, window: float, interval: float, history: MemoryHistory, label: str,
                  progress: Callable[[float, float], None] | None = None) -> str | None:
    """Sample for `window` seconds every `interval` into `history`; returns why it stopped early, if it did."""
    start = time.monotonic()
    end = start + window
    while True:
        try:
            history.add(label, sampler.sample(), sampler)
        except ProcessGone as exc:
            return str(exc)
        now = time.monotonic()
        if progress is not None:
            try:
                progress(min(window, now - start), window)
            except Exception:
                progress = None  # a broken progress bar must not stop the sampling
        if now >= end:
            return None
        time.sleep(max(0.0, min(interval, end - now)))
