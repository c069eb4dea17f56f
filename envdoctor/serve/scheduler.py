"""One run over every target, and the loop that repeats it every interval.

A run: a fresh HostSession (node facts once), discovery, then each target's
checks (those whose declared modes include "serve" and that are not intrusive)
through the engine's runner on the shared watchdog, one target at a time unless
one is slow (see `_examine_all`). The results are redacted per target, rendered
once into a Snapshot and swapped in whole. The loop sleeps interval ± 10 %
jitter (so a fleet of nodes does not read NVML in lock-step), wakes at once to
stop, and re-reads the config when asked (SIGHUP).

Serve never imports torch: a target's torch facts come from its files
(envdoctor.torchfacts: the libtorch it has mapped, read through /proc/N/root; a
process without torch skips the torch checks with the reason); the probe
subprocess is never started by the daemon. Each run also takes one memory sample
of every process into a bounded history that memory.cache_growth judges.
"""

from __future__ import annotations

import functools
import gc
import gzip
import os
import random
import socket
import threading
import time
from datetime import datetime, timezone
from types import MappingProxyType

from envdoctor import __version__, log, pipeline, redact, runner
from envdoctor.cgroup import proc_cgroup_key
from envdoctor.config import Config
from envdoctor.context import HostSession, Roots, Session, Target
from envdoctor.errors import Unavailable, UsageError
from envdoctor.paths import read_text
from envdoctor.memsample import MemoryHistory
from envdoctor.model import Report, Result
from envdoctor.record import Record
from envdoctor.registry import Registry
from envdoctor.serve import discovery, malloc, metrics, report_json
from envdoctor.serve.bounded_discovery import BLAME_SHARE, BoundedAnnouncements, BoundedDiscovery
from envdoctor.serve.exposition_cache import ExpositionCache
from envdoctor.serve.onecpu import OneCpu
from envdoctor.serve.secrets_memo import SecretsMemo
from envdoctor.serve.settings import Settings
from envdoctor.serve.snapshot import Snapshot, empty
from envdoctor.serve.torchmaps import TorchMaps
from envdoctor.watchdog import Watchdog

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, Callable, Mapping

# Node-wide checks: run once on the node target, not repeated per process. (onnx.opset
# would be one too, but it declares itself for `check` only: it loads onnxruntime.)
NODE_ONLY = ("gpu.health",)
# torch names its DataLoader worker processes so. A worker shares its parent's environment,
# cgroup, /dev/shm and torch, so every other check repeated the parent's verdict on it: one
# job with 8 workers looked like 9 broken jobs, each paging (helper-54; helper-42). Its
# memory is its own (copy-on-read growth in workers), so that check, and only it, runs there.
DATALOADER_WORKER_COMM = "pt_data_worker"
WORKER_CHECKS = ("memory.cache_growth",)


COMM_LENGTH = 15  # the kernel keeps a process's name to TASK_COMM_LEN - 1 bytes


def _shown_comm(comm: str, secrets: list[str], scrub: redact.Scrubber) -> str:
    """A process's name as target_info and the log show it: a process names itself (prctl,
    `exec -a`), after a secret too (helper-70), and /proc/N/comm is any user's to read. So
    it is redacted with its environment, and a name the kernel cut to COMM_LENGTH that
    begins a longer secret is masked as that secret (helper-73: the first 15 characters of
    a token showed). The kernel cuts at 15 bytes, not characters: a cut through a character
    of a non-ASCII secret is read as U+FFFD, and the 13 or 14 characters before it showed
    (helper-82); so what is left of the bytes is compared, once it is as long as a cut can leave."""
    kept = _utf8(comm.rstrip("\ufffd"))
    if len(kept) >= COMM_LENGTH - 3 and any(len(raw) > len(kept) and raw.startswith(kept)
                                            for raw in map(_utf8, secrets)):
        return redact.MASK
    return scrub.text(comm)


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")  # the bytes a surrogate escape stands for
    except UnicodeEncodeError:  # a lone surrogate no byte makes
        return text.encode("utf-8", "surrogatepass")


def _dataloader_workers(targets: list[discovery.TargetInfo], roots: Any) -> set[int]:
    """The targets that are DataLoader workers of another target: named so by torch AND the
    child of a target examined this run. The name alone is not trusted: any process can take
    it (prctl) and would have hidden from every check but one (helper-55)."""
    pids = {t.pid for t in targets if t.pid is not None}
    workers = set()
    for t in targets:
        if t.pid is None or t.comm != DATALOADER_WORKER_COMM:
            continue
        try:
            stat = read_text(roots.proc(t.pid, "stat"), 4096)
            parent = int(stat[stat.rindex(")") + 1:].split()[1])  # field 4, after the (comm)
        except (OSError, ValueError, IndexError):
            continue
        if parent in pids:
            workers.add(t.pid)
    return workers
# A process's memory sample is the first call of its part of a run's chain, under this key
# with its label: one that hangs (a /proc file that blocks) is named by /healthz and not
# started again while it is stuck, as a check is.
MEMORY_SAMPLE_KEY = "memory.sample"
JITTER = 0.1
# Stuck-call keys whose second part is a name of envdoctor's own (sysfacts' items: "os",
# "gpus"), shown by /healthz; any other part may be what a check read from a process.
OWN_NAMES = ("sysfacts", "discovery.announcements")
# /report's `system`: the node's facts as `check` reports them (OS, kernel, CPU, memory, GPUs
# and driver), gathered again this often; they change with a reboot or a driver update.
SYSTEM_FACTS_SECONDS = 300.0


class _Examination(Record):
    """One target's part of a run: its session, its rows so far, what its redaction masks."""

    def __init__(self, session: Session, prepared: pipeline.Prepared, own_env: Mapping[str, str],
                 before: Callable[[], None] | None = None,  # its memory sample, for a process
                 sample_timeout: float = 0.0, secrets_memo: SecretsMemo | None = None) -> None:
        self.session = session
        self.prepared = prepared
        self.own_env = own_env
        self.secrets_memo = secrets_memo
        self.before = before
        self.sample_timeout = sample_timeout
        self._secrets: list[str] | None = None  # taken by let_go, or by secrets() if that comes first
        self._lock = threading.Lock()  # let_go (a worker) and secrets() (the caller) take them in turn

    def batch(self) -> runner.Batch:
        """Its part of the run's chain. Made when asked, not kept: the batch holds let_go,
        and kept here the two would be a cycle, freed only by the cyclic collector."""
        return runner.Batch(self.prepared.plans, self.session, before=self.before, before_key=MEMORY_SAMPLE_KEY,
                            before_timeout=self.sample_timeout, after=self.let_go)

    def let_go(self) -> None:
        """On the chain's worker, once every check of the target has returned: what
        redaction needs is taken from the session, which then lets go of what it read.
        Until a run's last target was done every target's session was held, a higher
        high-water mark for malloc."""
        with self._lock:
            if self._secrets is None:
                self._secrets = self._from_session()
                self.session.forget()

    def secrets(self) -> list[str]:
        """What redaction masks in the target's rows: let_go's, or read now (a check of it
        had not returned when its rows were made; the session is then kept as it is)."""
        with self._lock:
            if self._secrets is None:
                self._secrets = self._from_session()
            return self._secrets

    def _from_session(self) -> list[str]:
        """Ours and, if a check read it, the target's: only so can its environment have
        leaked into a result."""
        envs: list[Mapping[str, str]] = [self.own_env]
        env = self.session.env_if_read()
        if env is not None:
            envs.append(env)
        if self.secrets_memo is not None:
            return self.secrets_memo.secret_values(envs)
        return redact.secret_values(envs)


def _is_target_label(value: Any) -> bool:
    """`node` or `pid:N`: a label serve gave, safe to show."""
    return value == "node" or (isinstance(value, str) and value.startswith("pid:") and value[4:].isdigit())


class _Rings(threading.Event):
    """An Event that also rings a doorbell when set, so one wait hears any of several."""

    def __init__(self, doorbell: threading.Event):
        super().__init__()
        self._doorbell = doorbell

    def set(self) -> None:
        super().set()
        self._doorbell.set()


def _torch_from_files(session: Session, maps_hint: str = "", memo: TorchMaps | None = None,
                      image: tuple[bytes, bytes] = (b"", b"")) -> Any:
    """A pid target's torch facts from its files (the libtorch it has mapped, read through
    /proc/N/root); never an import, never a probe. `maps_hint`: its torch lines of maps,
    as discovery read them this run or remembered them (`memo`, which confirms here that
    they still hold, else maps is read again, and keeps the facts they gave). Without
    them, `memo` keeps a "no torch" answer for the process image `image`."""
    from envdoctor.torchfacts import copied, for_process, process_files_key, searched_key

    pid = session.target.pid
    assert pid is not None
    roots = session.roots
    jail: list[str] = []  # Roots.printed_root, read once, when a mapped file is first stat'ed

    def mapped_file(path: str) -> Path:
        """A file as maps prints it, as the process sees it (a chroot jail's in front taken off)."""
        if not jail:
            jail.append(roots.printed_root(pid))
        return roots.seen_by(pid, roots.in_own_view(jail[0], path))

    if maps_hint and memo is not None and not memo.confirmed(pid, maps_hint, mapped_file,
                                                             lambda: roots.file_view(pid)):
        maps_hint = ""

    def work_out() -> Any:
        try:
            env = dict(session.env)
        except Unavailable:  # its VIRTUAL_ENV/PYTHONPATH hints are lost, not the facts
            env = {}
        return for_process(session.roots, pid, env, maps_hint=maps_hint)

    if maps_hint and memo is not None:  # confirmed: the facts those lines gave still hold
        return memo.facts(pid, maps_hint, work_out, copied,
                          lambda facts: process_files_key(facts, lambda path: session.roots.seen_by(pid, path)))
    if not maps_hint and memo is not None and image[0]:
        return memo.absent(pid, image, work_out,
                           lambda searched: searched_key(searched, lambda path: session.roots.seen_by(pid, path)),
                           lambda: discovery.exec_visible(session.roots.procfs, pid))
    return work_out()


def _no_torch(session: Session) -> Any:
    raise Unavailable("the node itself has no torch; torch is judged per process")


class Stats(Record):
    def __init__(
        self,
        runs_total: int = 0,
        targets_overflow_total: int = 0,
        check_timeouts: dict[str, int] | None = None,
    ) -> None:
        self.runs_total = runs_total
        self.targets_overflow_total = targets_overflow_total
        self.check_timeouts = {} if check_timeouts is None else check_timeouts


class Scheduler:
    def __init__(self, registry: Registry, config: Config, settings: Settings, roots: Roots,
                 watchdog: Watchdog, nvml_factory: Callable[[], Any] | None = None,
                 torch_factory: Callable[[Session], Any] | None = None,
                 reload: Callable[[], tuple[Config, Settings]] | None = None,
                 publish: Callable[[Snapshot], None] | None = None):
        self.registry = registry
        self.config = config
        self.settings = settings
        self.roots = roots
        self.watchdog = watchdog
        self.nvml_factory = nvml_factory
        self.torch_factory = torch_factory  # None: from each process's files (_torch_from_files)
        self._reload = reload
        self._publish = publish  # called with each new snapshot (textfile mode writes it)
        self.stats = Stats()
        self.failing: str | None = None  # why the last run failed, until one completes (for /healthz)
        self.started_at = round(time.time(), 3)  # envdoctor_start_time_seconds: its changes count restarts
        self.snapshot: Snapshot = empty()
        self._doorbell = threading.Event()  # rung by stop and reload_requested: the loop's sleep ends at once
        self.reload_requested = _Rings(self._doorbell)
        self.stop = _Rings(self._doorbell)
        self._known_targets: set[str] = set()
        self._overflow_said: tuple[int, int] = (0, 0)  # (any overflow, max_targets) when last logged
        self._unreadable_said = False  # whether "processes not examined: permission denied" was last said
        self._system: dict[str, Any] = {}  # the node's system facts (_system_facts), and when they were gathered
        self._system_at = -SYSTEM_FACTS_SECONDS
        self._discovery = BoundedDiscovery(watchdog)  # a process whose /proc files hang a scan is left out
        self._announcements = BoundedAnnouncements(watchdog)  # a dead announce directory costs no run
        # memory.cache_growth judges each process from these samples, one per run: 720 runs at
        # the default 15 s interval is the last 3 hours, a few hundred KiB per process
        self.history = MemoryHistory(maxlen=720)
        self._workers: set[int] = set()  # this run's DataLoader workers (_dataloader_workers)
        self.torch_maps = TorchMaps()  # each torch process's maps lines, read again only when they may have changed
        self._plans: dict[tuple[tuple[str, ...], tuple[str, ...]], list[runner.Plan]] = {}
        self._frozen = False  # gc.freeze() done after the first run
        self._own_env: Mapping[str, str] = os.environ
        self._scrubbers: dict[tuple[str, ...], redact.Scrubber] = {}
        self._last_scrubbers: dict[tuple[str, ...], redact.Scrubber] = {}  # the last run's, taken over by this one
        self.secrets_memo = SecretsMemo()  # each target's secrets, worked out again only for a new environment
        self._run_lock = threading.Lock()
        self._states = metrics.StateRendering()  # the check state set's bytes, redone when a status changes
        self._lines = ExpositionCache()  # every other series' name and labels, rendered when it first appears
        self.one_cpu_runs = True  # False: a run's threads go wherever the kernel puts them (benchmarks compare)
        self.on_run_start: Callable[[], None] | None = None  # the daemon's main thread, woken to watch over a run
        self._running = False

    # -- one run ------------------------------------------------------------------
    def run_once(self) -> Snapshot:
        """One run, its threads kept on one CPU while it lasts (serve.onecpu says why)."""
        with OneCpu(self.one_cpu_runs):
            return self._run()

    def _run(self) -> Snapshot:
        t0 = time.perf_counter()
        started_unix = round(time.time(), 3)
        started = datetime.fromtimestamp(started_unix, timezone.utc).isoformat(timespec="seconds")
        host_kwargs: dict[str, Any] = dict(roots=self.roots, watchdog=self.watchdog)
        if self.nvml_factory is not None:
            host_kwargs["nvml_factory"] = self.nvml_factory
        host = HostSession(**host_kwargs)
        from envdoctor.checks.memory_cache_growth import HISTORY_FACT

        host.fact(HISTORY_FACT, lambda: self.history)
        # for this run only: our own environment decoded once (os.environ decodes every item
        # on every pass, and redaction passed over it twice per target). The last run's
        # scrubbers are taken over by the jobs still here: what they scrubbed is not scrubbed
        # again (measured over 64 sleepers: 230 texts a run scrubbed anew, 3 now)
        self._own_env = dict(os.environ)
        self._last_scrubbers, self._scrubbers = self._scrubbers, {}
        self.secrets_memo.next_pass()
        self.torch_maps.new_run()
        found = self._discover(host)
        self.stats.targets_overflow_total += found.overflow
        for pid, text in found.cgroups.items():  # read by discovery: the CPU quota lookups take them from here
            host.fact(proc_cgroup_key(pid), functools.partial(str, text))
        per_target = self._examine_all(found.targets, host)
        results = [r for rows in per_target for r in rows]
        self._last_scrubbers = {}  # the scrubbers of secrets this run did not see: their memos go
        # processes that are gone take their samples with them; one left out while a read of its
        # files hangs keeps its history for when it is examined again (helper-101)
        self.history.prune([*(t.label for t in found.targets), *self._discovery.hung_labels()])
        self._count_timeouts(results)
        report = Report(host=socket.gethostname(), version=__version__, started_at=started, target="node",
                        results=results, system=self._system_facts(host),
                        duration_seconds=time.perf_counter() - t0, started_unix=started_unix)
        self.stats.runs_total += 1
        seconds = time.perf_counter() - t0
        stuck = self.watchdog.stuck()
        serve_stats = {
            "targets": len(found.targets), "targets_overflow_total": self.stats.targets_overflow_total,
            "targets_unreadable": found.unreadable, "targets_hung": len(self._discovery.hung),
            "runs_total": self.stats.runs_total, "last_run_duration_seconds": seconds,
            "call_timeouts_total": self.watchdog.timeouts_total, "stuck_calls": len(stuck),
            "start_time_seconds": self.started_at,
        }
        body = metrics.render(report, self.registry.checks,
                              metrics.ServeCollector(found.targets, serve_stats, self.stats.check_timeouts),
                              self._states, self._lines)
        # level 1: 64 torch processes' 295 KB of metrics in 0.8 ms to 24 KB; level 6 took 2.5 ms for 19.5 KB
        snap = Snapshot(metrics=body, metrics_gzip=gzip.compress(body, compresslevel=1, mtime=0), report=report_json.encode(report, per_target),
                        completed_at=time.time(), completed_monotonic=time.monotonic(), run_seconds=seconds,
                        targets=tuple(t.label for t in found.targets))
        self._log_changes(found, seconds)
        host.let_go_of_where()  # its rows are made: a cycle less for the collector
        self.snapshot = snap  # swapped in whole: a request sees the old run or this one, never half
        if self._publish is not None:
            self._publish(snap)
        return snap

    def _system_facts(self, host: HostSession) -> dict[str, Any]:
        """The node's system facts for /report, as `check` gathers them (each item bounded;
        one that hangs is named under `unavailable`), every SYSTEM_FACTS_SECONDS: /report
        said only the daemon's Python version (helper-91)."""
        now = time.monotonic()
        if now - self._system_at >= SYSTEM_FACTS_SECONDS:
            from envdoctor import sysfacts

            session = Session(target=Target.node(), host=host, env_override={}, torch_factory=_no_torch)
            facts = sysfacts.gather(session, timeout=min(self.config.timeout, sysfacts.SERVE_TIMEOUT))
            scrub = redact.Scrubber(sorted(redact.secret_values([self._own_env]), key=len, reverse=True))
            self._system, self._system_at = scrub.any(facts), now
        return self._system

    def _discover(self, host: HostSession) -> discovery.Found:
        """This run's targets, each scan bounded by the config's timeout (serve.bounded_discovery)."""
        def scan(leave_out: set[int], progress: Callable[[int | str], None]) -> discovery.Found:
            return discovery.discover(
                self.roots, max_targets=self.settings.max_targets, selectors=self.settings.selectors,
                nvml_pids=lambda: discovery.nvml_pids_of(host.need("nvml")),
                exclude=discovery.own_family(self.roots.procfs) | leave_out, torch_maps_memo=self.torch_maps,
                reading=progress, announcements=self._announcements.read)

        self._announcements.timeout = self.config.timeout * BLAME_SHARE
        # the announcements' bound is added to the scan's: a slow directory costs its own wait,
        # not the time the rest of the scan has (helper-102: every run failed then)
        return self._discovery.find(scan, self.config.timeout, grace=self._announcements.timeout, known=self._known_targets)

    def _examine_all(self, targets: list[discovery.TargetInfo], host: HostSession) -> list[list[Result]]:
        """Every target's results, in order: all of their checks as one chain on one worker.

        A process's comm is redacted as its rows are, in `targets` itself.

        Examining 16 targets at once cost 2.5x the CPU of one at a time (282 against 114 ms
        a run with 64 sleepers, 25,000 against 3,600 context switches a run): every file
        read releases the GIL, and 16 threads, each handing its checks to the watchdog's
        16, woke one another for it at every read. Then each target in turn got a thread
        of its own that handed its checks to the watchdog: four hand-overs a target, 15 %
        of a run's CPU over 64 sleepers (81.5 against 69.6 ms a run with every call made
        in one thread). Now each target's memory sample and then its checks, target after
        target, are one chain (runner.run_batches): the caller is woken once a run unless
        a call is slow, and a call still running after runner.SLOW_CHECK_SECONDS (a hung
        read waiting out its timeout) is left behind while the rest go on beside it.
        """
        self._workers = _dataloader_workers(targets, self.roots)
        self._plans = {}  # this run's plan per selection: its settings and timeouts (config may be reloaded)
        examinations = [self._prepare(target, host) for target in targets]
        ran = iter(runner.run_batches([e.batch() for e in examinations if e is not None]))
        rows = [[] if e is None else self._finish(e, next(ran)) for e in examinations]
        for i, (target, e) in enumerate(zip(targets, examinations)):
            if e is not None:
                comm = _shown_comm(target.comm, e.secrets(), self._scrubber(e.secrets()))
                if comm != target.comm:
                    targets[i] = target.replace(comm=comm)
        return rows

    def _selection(self, target: discovery.TargetInfo) -> pipeline.Selection:
        if target.pid is None:
            return pipeline.Selection()
        if target.pid in self._workers:
            return pipeline.Selection(skip=[c for c in self.registry.checks if c not in WORKER_CHECKS])
        return pipeline.Selection(skip=[c for c in NODE_ONLY if c in self.registry.checks])

    def _planned(self, selection: pipeline.Selection) -> list[runner.Plan]:
        """pipeline.plan for this selection, made once a run: a run's targets share three
        selections (the node, a process, a DataLoader worker). Their settings are read-only
        to the checks, since every target's check now gets the same mapping."""
        key = (tuple(selection.only), tuple(selection.skip))
        plans = self._plans.get(key)
        if plans is None:  # a plan error is raised again for each target, not kept
            plans = [runner.Plan(p.check, MappingProxyType(p.config), p.timeout, p.raise_with)
                     for p in pipeline.plan(self.registry, self.config, selection)]
            self._plans[key] = plans
        return plans

    def _prepare(self, target: discovery.TargetInfo, host: HostSession) -> _Examination | None:
        """A target's session and what its part of the run's chain is; None when nothing runs on it."""
        if target.pid is None:
            session = Session(target=Target.node(), host=host, env_override={}, torch_factory=_no_torch)
            before = None
        else:
            # from its files, through the torch lines of maps discovery read this run (if any)
            factory = self.torch_factory or functools.partial(_torch_from_files, maps_hint=target.torch_maps,
                                                              memo=self.torch_maps, image=target.image)
            session = Session(target=Target(target.pid), host=host, torch_factory=factory)
            before = functools.partial(self._sample_memory, target, host)
        selection = self._selection(target)
        try:
            prepared = pipeline.prepare(self.registry, self.config, session, selection, mode="serve",
                                        planned=self._planned(selection))
        except Exception as exc:  # a plan error (a config that leaves nothing) must not stop the daemon
            if isinstance(exc, UsageError) and target.pid in self._workers:
                return None  # the config switched memory.cache_growth off: nothing runs on a worker
            log.event("error", "target not examined", target=target.label, reason=str(exc))
            return None
        return _Examination(session, prepared, self._own_env, before, self.config.timeout, self.secrets_memo)

    def _finish(self, examination: _Examination, ran: list[Result]) -> list[Result]:
        """A target's rows, redacted with its environment and ours."""
        results = examination.prepared.finish(ran)
        # (Not passed to log.protect: that set lives for the daemon's life and would grow
        # with every short job's tokens; no log line here carries a target's values.)
        scrub = self._scrubber(examination.secrets())
        return [scrub.result(r) for r in results]

    def _scrubber(self, secrets: list[str]) -> redact.Scrubber:
        """One Scrubber per distinct set of secrets in a run: the processes of one job share
        their environment, so they share its compiled pattern and what it already scrubbed."""
        key = tuple((s, isinstance(s, redact.Credential)) for s in secrets)  # a credential is masked anywhere
        with self._run_lock:
            scrub = self._scrubbers.get(key)
            if scrub is None:
                scrub = self._last_scrubbers.pop(key, None)
                if scrub is None:
                    scrub = redact.Scrubber(secrets, memo=True)
                else:
                    scrub.next_pass()
                self._scrubbers[key] = scrub
            return scrub

    def _sample_memory(self, target: discovery.TargetInfo, host: HostSession) -> None:
        """One memory sample of the process (rss, cgroup, shm, GPU, its attached allocator) into the history."""
        from envdoctor.attach_reader import process_live_facts

        try:
            nvml = host.need("nvml")
        except Unavailable:
            nvml = None
        try:
            self.history.sample([(target.label, target.pid)], self.roots, nvml,
                                lambda pid: process_live_facts(host, self.roots, target.label, pid).doc,
                                shared=host.fact)
        except Exception as exc:  # a sample that breaks costs this target's point, not the run
            log.event("debug", "memory sample failed", target=target.label, reason=f"{type(exc).__name__}: {exc}")

    def _count_timeouts(self, results: list[Result]) -> None:
        for r in results:
            if "timeout_seconds" in r.facts or "stuck_since" in r.facts:
                self.stats.check_timeouts[r.check] = self.stats.check_timeouts.get(r.check, 0) + 1

    def _log_changes(self, found: discovery.Found, seconds: float) -> None:
        labels = {t.label for t in found.targets}
        for t in found.targets:
            if t.label not in self._known_targets and t.pid is not None:
                log.event("info", "target appeared", target=t.label, source=t.source, comm=metrics.label_value(t.comm))
        hung = self._discovery.hung_labels()
        for gone in sorted(self._known_targets - labels):
            if gone in hung:  # left out while a read of its files is stuck: said then, and gone or back after
                continue
            if gone in found.left_out:  # still running: max_targets shrank, or more came first (helper-67)
                log.event("warn", "target no longer examined", target=gone, reason="more targets than max_targets")
            else:
                log.event("info", "target gone", target=gone)
        self._known_targets = labels | (self._known_targets & hung)
        for note in found.notes:
            log.event("debug", "discovery note", reason=note)
        # said when it starts, when max_targets changes and when it ends, not every run (helper-69:
        # 240 lines an hour at 15 s), nor as its count moves (helper-73: DataLoader workers come
        # and go); envdoctor_targets_overflow_total counts every run's
        overflow = (min(found.overflow, 1), self.settings.max_targets)
        if found.overflow and overflow != self._overflow_said:
            # max_targets = 1 examines the node alone, by choice (the Slurm epilog's): no warning
            # at every job's end (helper-81)
            level = "info" if self.settings.max_targets == 1 else "warn"
            log.event(level, "more targets than max_targets", overflow=found.overflow, max_targets=self.settings.max_targets)
        elif not found.overflow and self._overflow_said[0]:
            log.event("info", "targets within max_targets again", targets=len(found.targets), max_targets=self.settings.max_targets)
        self._overflow_said = overflow
        if bool(found.unreadable) != self._unreadable_said:  # said when it starts and when it ends, not every run
            if found.unreadable:
                log.event("warn", "processes not examined: permission denied", processes=found.unreadable,
                          reason="python processes of other users whose /proc/N/maps this daemon may not read: "
                                 "whether they run torch is not known; give it CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH "
                                 "(the systemd unit and the DaemonSet do)")
            else:
                log.event("info", "every python process readable again")
            self._unreadable_said = bool(found.unreadable)
        log.event("debug", "run complete", seconds=f"{seconds:.3f}", targets=len(found.targets))

    # -- the loop -----------------------------------------------------------------
    def next_delay(self) -> float:
        interval = self.settings.interval
        return max(0.0, interval * (1 + random.uniform(-JITTER, JITTER)))

    def loop(self) -> None:
        """Run, sleep, repeat until stop is set; never raises (a failed run is logged and retried)."""
        while not self.stop.is_set():
            if self.reload_requested.is_set():
                self.reload_requested.clear()
                self.apply_reload()
            t0 = time.monotonic()
            self._running = True
            if self.on_run_start is not None:
                self.on_run_start()
            try:
                self.run_once()
                self.failing = None
            except Exception as exc:  # the daemon outlives any one bad run; /healthz turns 503 if it persists
                error = f"{type(exc).__name__}: {exc}"
                log.event("error", "run failed", error=error)  # the log redacts its own lines
                # /healthz is anyone's who reaches the port: our secrets masked, one short line
                scrub = redact.Scrubber(sorted(redact.secret_values([os.environ]), key=len, reverse=True))
                self.failing = " ".join(scrub.text(redact.writable(error)).split())[:300]
            self.collect_garbage()
            self._running = False
            delay = self.next_delay() - (time.monotonic() - t0)
            if delay > 0:
                self._wait(delay)

    def busy(self) -> bool:
        """Whether CPU may be spent now: a run in progress, or calls stuck (a check that may
        be spending CPU in Python). The daemon's main thread beats the deadman every second
        then, else seldom (serve.mainbell)."""
        return self._running or bool(self.watchdog.stuck())

    def collect_garbage(self) -> None:
        """Free the run's reference cycles now, and keep what lives for the daemon's life
        out of every later collection.

        A run leaves ~11,000 objects in cycles (an exception kept with its traceback keeps
        its frames, a session's lazy facts close over the session). Left to the cyclic
        collector's own schedule they outlived several runs, with the environments and
        maps texts they hold: with 64 targets RSS climbed from 45 to 57 MiB in 30 runs.
        And each of its automatic full collections walked every module's objects too,
        ~120 ms of CPU a run. After the first run (the checks' lazy imports are done),
        everything alive is frozen: a collection then walks only what the last run left,
        ~3.5 ms (measured with 64 targets). Then what malloc holds free goes back to the
        kernel (serve.malloc): RSS 49 -> 38 MiB at 64 targets."""
        gc.collect()
        malloc.release_free_memory()
        if not self._frozen:
            gc.freeze()
            self._frozen = True

    def _wait(self, seconds: float) -> None:
        """Sleep until the next run, or until stop or a reload is asked for. One wait for
        the whole interval: waking every 0.2 s to look cost an idle daemon ~0.03 % of a core,
        a tenth of what its runs cost at 64 targets."""
        deadline = time.monotonic() + seconds
        while True:
            self._doorbell.clear()  # before looking: a ring after this ends the wait below
            left = deadline - time.monotonic()
            if self.stop.is_set() or self.reload_requested.is_set() or left <= 0:
                return
            self._doorbell.wait(left)

    def apply_reload(self) -> None:
        if self._reload is None:
            return
        try:
            self.config, self.settings = self._reload()
        except Exception as exc:  # a bad config keeps the old one
            log.event("error", "config reload failed; keeping the previous config", reason=str(exc))
            return
        log.event("info", "config reloaded", source=self.config.source or "(no file: defaults and ENVDOCTOR_ variables)", interval=self.settings.interval,
                  max_targets=self.settings.max_targets)

    def stuck_calls(self) -> list[str]:
        """What /healthz names: each stuck call's kind (a check id, `memory.sample`,
        `resolve`) and its target, nothing else of its key. A key can carry what a check
        read from a process (dist.env's name lookup keys on MASTER_ADDR's host), and
        /healthz answers without redaction: helper-65 saw a secret there."""
        out = []
        now = time.time()
        for key, since in self.watchdog.stuck().items():
            parts = key if isinstance(key, tuple) else (key,)
            scan = self._discovery.name(key)  # a scan's number means nothing to a reader; what it is stuck on does
            if scan is not None:
                name, since = scan
            else:
                name = ":".join(
                    str(k) if i == 0 or _is_target_label(k) or (i == 1 and parts[0] in OWN_NAMES) else "..."
                    for i, k in enumerate(parts))
            out.append(f"{name} for {now - since:.0f} s" if since else name)
        return sorted(out)
