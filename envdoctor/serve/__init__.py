"""`envdoctor serve`: the node monitor.

One daemon per GPU node. A scheduler thread runs the serve-mode checks over the
node and every workload process each interval and swaps in a pre-rendered
snapshot; the HTTP server answers /metrics, /report, /healthz and / from it; in
textfile mode each snapshot is also written for node_exporter's textfile
collector. The main thread only waits for signals: SIGTERM/SIGINT stop within a
second (exit 0), SIGHUP re-reads the config.

Modules: discovery (which processes), scheduler (runs, loop, reload), snapshot
(one rendered run), metrics (the daemon's own families), httpd (the endpoints),
webconfig (TLS and basic auth), textfile (atomic .prom writes), settings ([serve]).
Nothing here calls sys.exit: `start()` validates and returns an error line, the
CLI decides the exit code.
"""

from __future__ import annotations

import errno
import signal
import socket
import threading
from pathlib import Path

from envdoctor.record import Record
from envdoctor.stdout_guard import PluginsPrintToStderr  # here: run() must need no file to import (out of descriptors)

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable

# Prometheus' default-port allocations list gives 9100-9999 to exporters and that
# range is full; allocations go on above 10000. 10061 is on no exporter's entry we
# could find; see README "Running the monitor".
DEFAULT_PORT = 10061
DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"
EXIT_IO = 74  # --once could not write --textfile (as `check -o` does)


def _wait_for_stop(stop: threading.Event, scheduler: Any) -> None:
    """The main thread's part while the daemon runs: signals and the deadman's beat
    (serve.mainbell: asleep while idle, awake every second while a run goes on)."""
    from envdoctor import deadman
    from envdoctor.serve.mainbell import IDLE_BEAT_SECONDS, MainBell

    try:
        bell = MainBell()
    except OSError:  # no descriptor left for its pipe: woken every second, as before it
        deadman.beat()
        while not stop.wait(deadman.BEAT_SECONDS):
            deadman.beat()
        return
    with bell:
        scheduler.on_run_start = bell.ring
        try:
            while not stop.is_set():
                wait = deadman.BEAT_SECONDS if scheduler.busy() else IDLE_BEAT_SECONDS
                # the backstop counts from this beat, and the next may be `wait` away
                deadman.beat(deadman.BACKSTOP_SECONDS + wait)
                bell.wait(wait)
        finally:
            scheduler.on_run_start = None


class Options(Record):
    def __init__(
        self,
        listen_address: str = DEFAULT_ADDRESS,
        web_config_file: str | None = None,
        interval: float | None = None,
        textfile: Path | None = None,
        once: bool = False,
        config_file: str | None = None,  # absolute: a plug-in check's chdir() must not move it
        procfs: Path = Path("/proc"),
        sysfs: Path = Path("/sys"),
        rootfs: Path = Path("/"),
        config_given: str | None = None,  # config_file as the user typed it, to name it so in errors
    ) -> None:
        self.listen_address = listen_address
        self.web_config_file = web_config_file
        self.interval = interval
        self.textfile = textfile
        self.once = once
        self.config_file = config_file
        self.procfs = procfs
        self.sysfs = sysfs
        self.rootfs = rootfs
        self.config_given = config_given


EXIT_TEMPFAIL = 75  # sysexits' EX_TEMPFAIL: the listen address is taken, or not on this host yet; try again


def _lists_processes(procfs: Path) -> bool:
    """Whether `procfs` holds a process's directory, as a procfs does: a wrong --path.procfs
    (helper-67: /tmp) ran with the node alone and said nothing. Unreadable counts as
    holding one: the runs say why."""
    import os

    try:
        with os.scandir(procfs) as entries:
            return any(entry.name.isdigit() for entry in entries)
    except OSError:
        return True


class StartError(Exception):
    """Why the daemon cannot start: the CLI prints it and exits with `code` (2: bad usage,
    config or web config, which a restart would not mend)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _print_exposition(metrics: bytes) -> bool:
    """`serve --once` with no --textfile: what /metrics would have answered, on stdout
    (it printed nothing at all). False, with one log line, when stdout cannot take it."""
    import sys

    from envdoctor import log

    try:
        if sys.stdout is None:
            raise OSError("standard output is closed")
        out = getattr(sys.stdout, "buffer", None)
        if out is not None:
            out.write(metrics)
            out.flush()
        else:  # the CLI's stand-in for a closed stdout (or a caller's text stream)
            sys.stdout.write(metrics.decode("utf-8"))
            sys.stdout.flush()
        return True
    except (OSError, ValueError) as exc:
        log.event("error", "metrics not written to standard output", reason=str(getattr(exc, "strerror", None) or exc))
        return False


class Daemon:
    """Everything `serve` runs, built and checked by start(); run() blocks until stopped."""

    def __init__(self, options: Options, nvml_factory: Callable[[], Any] | None = None):
        from envdoctor import pipeline
        from envdoctor.context import Roots
        from envdoctor.serve import httpd, mainbell, settings, textfile, webconfig  # noqa: F401 - mainbell: run()'s
        from envdoctor.serve.scheduler import Scheduler
        from envdoctor.watchdog import default_watchdog

        self.options = options
        self.textfile_error: str | None = None
        for flag, path in (("--path.procfs", options.procfs), ("--path.sysfs", options.sysfs), ("--path.rootfs", options.rootfs)):
            if not Path(path).is_dir():
                raise StartError(f"{flag} {path} is not a directory")
        if not _lists_processes(options.procfs):
            from envdoctor import log

            log.event("warn", "no process under --path.procfs", path=str(options.procfs),
                      hint="not a procfs mount? only the node is examined (in a container: mount the host's /proc)")
        if options.interval is not None and not settings.valid_interval(options.interval):
            raise StartError(f"--interval must be {settings.INTERVAL_RULE}, not {options.interval:g}")
        if options.textfile is not None:
            why = textfile.check_path(options.textfile)
            if why:
                raise StartError(why)
        from envdoctor import deadman

        with deadman.Heartbeat():  # a plug-in wedged in C at import ends the start with its stack, not a hang
            self.registry = pipeline.load_registry(for_mode="serve")  # what never runs in serve is not imported
            config, serve_settings = self._load()
        try:
            self.web = webconfig.load(options.web_config_file)
        except webconfig.WebConfigError as exc:
            raise StartError(f"bad web config: {exc}") from None
        self.scheduler = Scheduler(self.registry, config, serve_settings,
                                   Roots(procfs=options.procfs, sysfs=options.sysfs, rootfs=options.rootfs),
                                   default_watchdog(), nvml_factory=nvml_factory, reload=self._load,
                                   # --once writes it after the run, once stdout is its own again (run())
                                   publish=self._write_textfile if options.textfile is not None and not options.once else None)
        self.server = None
        if not options.once:
            try:
                address = httpd.parse_address(options.listen_address)
            except ValueError as exc:
                raise StartError(str(exc)) from None
            try:
                self.server = httpd.Server(address, lambda: self.scheduler.snapshot, self.web,
                                           httpd.Health(lambda: self.scheduler.settings.interval, self.scheduler.stuck_calls,
                                                        lambda: self.scheduler.failing))
            except OSError as exc:
                # Another process holds the port (a predecessor still stopping), or the address
                # is not up yet at boot: a later start may succeed, so not 2, which a unit's
                # RestartPreventExitStatus=2 holds for good. Anything else (no permission for a
                # low port) is the setup's to mend: 2.
                transient = exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL)
                reason = exc.strerror or str(exc)
                if isinstance(exc, socket.gaierror):  # 256.1.1.1 is a name to the resolver (helper-116)
                    transient = exc.errno == socket.EAI_AGAIN  # the resolver could not be asked yet
                    reason = f"{address[0]} is not an IP address of this host, nor a name that resolves to one ({reason})"
                raise StartError(f"cannot listen on {options.listen_address}: {reason}"
                                 + ("; exit 75 so that a supervisor tries again" if transient else ""),
                                 EXIT_TEMPFAIL if transient else 2) from None

    def _load(self):
        """The config and [serve] settings, checked as a run will use them: an unknown id in
        ENVDOCTOR_ONLY/SKIP (the file's own only/skip are checked as it is read) was found
        only by each run, which then examined no process, while /healthz said ok."""
        from envdoctor import pipeline
        from envdoctor.config import load as load_config
        from envdoctor.errors import ConfigError, UsageError
        from envdoctor.serve import settings

        try:
            config = load_config(self.registry.checks, explicit_file=self.options.config_file,
                                 known_ids=self.registry.unloaded_ids,
                                 left_out=self.registry.left_out | self.registry.not_imported,
                                 unimported=self.registry.not_imported)
            pipeline.plan(self.registry, config, pipeline.Selection())
            return config, settings.from_config(config, self.options.interval)
        except (ConfigError, UsageError) as exc:
            message, path, given = str(exc), self.options.config_file, self.options.config_given
            if path and given and message.startswith(path):  # named as given, as check names it (helper-69)
                message = given + message[len(path):]
            raise StartError(f"bad config: {message}") from None

    def _write_textfile(self, snap) -> None:
        from envdoctor import log
        from envdoctor.errors import OutputError
        from envdoctor.serve import textfile

        before = self.textfile_error
        try:
            textfile.write(self.options.textfile, snap.metrics)
            self.textfile_error = None
            if before is not None:
                log.event("info", "textfile written again", path=str(self.options.textfile))
        except OutputError as exc:
            self.textfile_error = str(exc)
            if self.textfile_error != before:  # said once while it lasts, not every run (helper-69)
                log.event("error", "textfile not written", path=str(self.options.textfile), reason=str(exc))

    def run(self) -> int:
        from envdoctor import log
        from envdoctor.serve import httpd, malloc, webconfig

        from envdoctor import deadman

        scheduler = self.scheduler
        if self.options.once:
            from envdoctor.serve.discovery import DiscoveryFailed

            try:
                with deadman.Heartbeat(), PluginsPrintToStderr():  # their prints are not the exposition (helper-85)
                    snap = scheduler.run_once()
            except DiscoveryFailed as exc:  # nothing was examined: no exposition that says all is well
                log.event("error", "run failed", error=str(exc))
                return EXIT_IO
            if self.options.textfile is not None:  # here, not in the run: a link to /dev/stdout is
                self._write_textfile(snap)  # written through descriptor 1, stderr's while plug-ins ran (helper-112)
            if self.textfile_error:  # the run's last word must not read as success (exit 74)
                log.event("error", "one run complete, but the textfile was not written", targets=len(snap.targets),
                          seconds=f"{snap.run_seconds:.3f}", textfile=str(self.options.textfile or ""))
                return EXIT_IO
            if self.options.textfile is None and not _print_exposition(snap.metrics):
                return EXIT_IO
            log.event("info", "one run complete", targets=len(snap.targets), seconds=f"{snap.run_seconds:.3f}",
                      textfile=str(self.options.textfile or ""))
            return 0

        malloc.limit_arenas()
        malloc.map_large_blocks_apart()
        stop = scheduler.stop
        previous = {}

        def on_stop(signum, frame):
            stop.set()

        def on_hup(signum, frame):
            scheduler.reload_requested.set()

        from envdoctor.stopping import on_sigquit  # Ctrl-\: what the checks started goes, then the default (a core)

        for sig, handler in ((signal.SIGTERM, on_stop), (signal.SIGINT, on_stop), (signal.SIGHUP, on_hup),
                             (signal.SIGQUIT, on_sigquit)):
            # a stop signal the invoker ignores (`nohup`, a script's `serve &`, which ignores
            # SIGINT) stays ignored; SIGHUP was ignored by envdoctor itself while starting
            if sig != signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            previous[sig] = signal.signal(sig, handler)
        assert self.server is not None
        server_thread = threading.Thread(target=self.server.serve_forever, name="envdoctor-http", daemon=True)
        loop_thread = threading.Thread(target=scheduler.loop, name="envdoctor-scheduler", daemon=True)
        host, port = self.server.server_address[:2]
        log.event("info", "listening", address=httpd.show_address(host, port), interval=scheduler.settings.interval,
                  max_targets=scheduler.settings.max_targets, **webconfig.describe(self.web))
        server_thread.start()
        loop_thread.start()
        try:
            # Python runs a signal's handler in the main thread, between bytecodes; a signal the
            # kernel hands to another thread (one of the daemon's workers) did not interrupt a
            # wait on a lock (once seen: SIGTERM unanswered past 10 s on a loaded runner, with
            # waits of 60 s): the bell's wakeup fd hears it whichever thread took it. Each wake
            # is also the deadman's heartbeat: a plug-in wedged in C holding the interpreter
            # lock stops it, and the daemon exits to be restarted (envdoctor.deadman).
            _wait_for_stop(stop, scheduler)
        finally:
            deadman.disarm()
            log.event("info", "stopping")
            httpd.close(self.server)
            loop_thread.join(timeout=0.5)  # a run in progress is abandoned (daemon thread); exit is not held up
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0
