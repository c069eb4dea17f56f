"""The `envdoctor` command. This is the only layer that prints to the user and
decides exit codes: 0 nothing at or above --fail-on, 1 something is, 2 bad usage
or bad config (one clear line naming file, line and key; never a traceback).

Heavy modules (rich tables, prometheus_client, psutil, the checks) are imported
inside the commands that need them, so `envdoctor --help` and every command start fast.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable, List, Optional

import typer

from envdoctor import __version__, check_command
# under their old names, which tests and callers use (envdoctor.stopping: the pre-flight child needs them without typer)
from envdoctor.stopping import EXIT_IO, OUTPUT_ERRNOS  # noqa: F401 - OUTPUT_ERRNOS: callers use it from here
from envdoctor.stopping import ClosedStdout as _ClosedStdout  # noqa: F401
from envdoctor.stopping import kill_everything_started as _kill_everything_started
from envdoctor.stopping import kill_probes as _kill_probes
from envdoctor.stopping import on_sigint as _on_sigint, on_sigterm as _on_sigterm  # noqa: F401

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2

app = typer.Typer(
    name="envdoctor",
    help="Catch the CUDA and system-environment problems that waste GPU training runs.\n\n"
    "`envdoctor check` runs every check and prints a report; its exit code says whether anything "
    "is at or above --fail-on. `envdoctor checks` lists the checks, `envdoctor explain ID` says what one "
    "reads, why it matters and how to fix it. `envdoctor exec -- CMD` is a container's entrypoint: it checks, "
    "fixes what it safely can, then becomes CMD. `envdoctor serve` is the node monitor: Prometheus metrics about "
    "the node and every training process on it.",
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


def _die(message: str) -> None:
    raise typer.Exit(check_command.usage_error(message))


def _scrubbed(text: str) -> str:
    return check_command.scrubbed(text)


_absolute = check_command.absolute


def _directory(flag: str, text: str) -> Path:
    try:
        return check_command.directory(flag, text)
    except check_command.Ended as ended:
        raise typer.Exit(ended.code) from None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"envdoctor {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Catch the CUDA and system-environment problems that waste GPU training runs."""


def _deadman_bounded(command: Callable[..., None]) -> Callable[..., None]:
    """Run a command under the deadman's heartbeat (envdoctor.deadman), from before the
    plug-ins are imported to its last write: a plug-in wedged in C holding the interpreter
    lock, at import or in its check, then ends the process with its stack instead of
    hanging it for good. Not for exec, which becomes the job and runs plug-ins in a child."""

    @functools.wraps(command)
    def bounded(*args: Any, **kwargs: Any) -> None:
        from envdoctor.deadman import Heartbeat
        from envdoctor.forked import contained

        with contained(), Heartbeat():  # and nothing a check or plug-in started outlives the command
            command(*args, **kwargs)

    return bounded


@app.command()
def check(
    only: List[str] = typer.Option([], "--only", metavar="ID", help="Run only this check (repeatable, or ID,ID)."),
    skip: List[str] = typer.Option([], "--skip", metavar="ID", help="Do not run this check (repeatable, or ID,ID)."),
    fmt: Optional[str] = typer.Option(None, "--format", "-f", metavar="FORMAT",
                                      help="text (default), json, markdown, junit, prometheus, compact, or a plug-in's format."),
    pid: Optional[int] = typer.Option(None, "--pid", metavar="PID", help="Examine another process (its environment, /dev/shm, cgroup) through /proc/PID."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PATH", help="Interpreter whose torch is read (default: this one; with --pid, the torch that process has loaded)."),
    onnx: List[str] = typer.Option([], "--onnx", metavar="FILE", help="ONNX model to audit (repeatable)."),
    window: Optional[float] = typer.Option(None, "--window", metavar="SECONDS",
                                           help="Sample the target's memory for this long, then judge its growth (memory.cache_growth; "
                                                "it skips a window under its min_window_seconds, 10 s by default: 30-60 s finds a leak)."),
    config_file: Optional[str] = typer.Option(None, "--config", metavar="FILE",
                                              help="Config file (default: $ENVDOCTOR_CONFIG, ./envdoctor.toml or [tool.envdoctor] in ./pyproject.toml)."),
    fail_on: Optional[str] = typer.Option(None, "--fail-on", metavar="LEVEL",
                                          help="Exit 1 when any result is at or above this level: warn or fail (default fail; error counts as fail)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", metavar="SECONDS",
                                            help="Per-check timeout for every check. Unset, it is 15 s and the checks that "
                                                 "declare their own keep theirs (90 s for those that may import torch, "
                                                 "300 s for dist.consistency; `envdoctor explain ID` shows it); given "
                                                 "(or in the config or ENVDOCTOR_TIMEOUT), it bounds those too. Only a "
                                                 "[check.\"ID\"] timeout in the config beats it."),
    output_text: Optional[str] = typer.Option(None, "--output", "-o", metavar="FILE", help="Write the report to FILE instead of standard output ('-': standard output)."),
    procfs_text: str = typer.Option("/proc", "--path.procfs", metavar="DIR", help="procfs mount point (e.g. /host/proc in a container)."),
    sysfs_text: str = typer.Option("/sys", "--path.sysfs", metavar="DIR", help="sysfs mount point."),
    rootfs_text: str = typer.Option("/", "--path.rootfs", metavar="DIR", help="Root file system to read (e.g. /host/root in a container)."),
) -> None:
    """Run the checks once and print a report.

    Exit codes: 0 nothing at or above --fail-on; 1 something is; 2 bad usage or config;
    74 the report could not be written.
    """
    raise typer.Exit(check_command.run_guarded(
        only=only, skip=skip, fmt=fmt, pid=pid, python=python, onnx=onnx, window=window, config_file=config_file,
        fail_on=fail_on, timeout=timeout, output_text=output_text, procfs_text=procfs_text, sysfs_text=sysfs_text,
        rootfs_text=rootfs_text))


@app.command("checks", short_help="List every check, built-in and plug-in.")
@_deadman_bounded
def list_checks() -> None:
    """List every registered check, built-in and plug-in, with its one-line purpose."""
    from envdoctor import registry as registry_module

    from envdoctor.exporters.common import one_line  # plug-in titles and errors: no raw control characters

    registry = registry_module.load()
    width = max((len(i) for i in [*registry.ids, *(f.row or f.name for f in registry.failures)]), default=10)
    lines = []  # plug-in titles and reasons are their own text: masked as their rows are, in one pass
    for check_id in registry.ids:
        check = registry.checks[check_id]
        origin = registry.origins.get(check_id, "")
        needs = f" [needs {', '.join(check.needs)}]" if check.needs else ""
        off = " (off by default)" if not check.enabled else ""
        runs = [m for m in check.modes if check.runs_in(m)]
        where = "" if check.runs_in("check") else f" (not in `check`; runs in: {', '.join(runs) or 'no mode'})"
        plugin = f" (plug-in from {origin})" if origin != "envdoctor" else ""
        lines.append(one_line(f"{check_id:<{width}}  {check.title}{needs}{off}{where}{plugin}"))
    for failure in registry.failures:
        lines.append(one_line(f"{failure.row or failure.name:<{width}}  BROKEN plug-in from {failure.distribution}: "
                              f"{failure.reason}"))
    typer.echo(_scrubbed("\n".join(lines)))


@app.command(short_help="What a check reads, why it matters, its fix.")
@_deadman_bounded
def explain(check_id: str = typer.Argument(..., metavar="ID", help="A check id, e.g. shm.size.")) -> None:
    """Print what a check reads, why it matters to a CUDA job, how to fix a failure, and its settings."""
    import inspect

    from envdoctor import registry as registry_module
    from envdoctor.config import env_name

    registry = registry_module.load()
    check = registry.get(check_id)
    lines: list[str] = []
    say = lines.append
    broken = [f for f in registry.failures if check_id in f.ids]
    if check is None and broken:  # `checks` lists a broken plug-in's id: say what became of it
        for failure in broken:
            say(f"{failure.row or failure.name}: BROKEN plug-in from {failure.distribution} ({failure.value}): {failure.reason}")
        say(f'\nIts row goes with [check."{check_id}"] enabled = false in envdoctor.toml, '
            f"or {env_name(check_id, 'ENABLED')}=0.")
        typer.echo(_scrubbed("\n".join(lines)))
        return
    if check is None:
        from envdoctor.pipeline import shown_id

        _die(f"unknown check id {shown_id(check_id)}; `envdoctor checks` lists them: {', '.join(registry.ids)}")
    say(f"{check.id}: {check.title}\n")
    say(inspect.cleandoc(check.explain or "(this check has no explanation)"))
    say("")
    if check.needs:
        say(f"Needs: {', '.join(check.needs)} (skipped with the reason when missing).")
    say(f"Enabled by default: {'yes' if check.enabled else 'no'}.")
    say(f"\nSettings, in envdoctor.toml under [check.\"{check.id}\"] (or {env_name(check.id, 'KEY')}):")
    from envdoctor.config import DEFAULT_TIMEOUT, toml_value

    say(f"  enabled = {toml_value(check.enabled)}")
    timeout = check.timeout if check.timeout is not None else DEFAULT_TIMEOUT
    say(f"  timeout = {toml_value(float(timeout))}" + ("" if check.timeout is not None else "  # the run's default"))
    for key, default in check.config.items():  # TOML has no null: a default of None is said, not shown as ""
        say(f"  # {key}: unset by default; any value, for the check to judge" if default is None
            else f"  {key} = {toml_value(default)}")
    if check.metrics:
        say("\nMetrics:")
        for m in check.metrics:
            extra = [name for name, _key in m.info] if m.info else [m.label] if m.label else []
            label = "{" + ",".join(["target", *extra]) + "}"
            say(f"  envdoctor_{m.name}{label}  {m.help}")
    # a plug-in's title, explanation and defaults are its own text: masked as its rows are
    typer.echo(_scrubbed("\n".join(lines)))


def _click_errors() -> tuple[type, type]:
    """click's UsageError and ClickException, from typer's public BadParameter (typer
    0.28 carries its own copy of click; earlier ones import click itself)."""
    mro = typer.BadParameter.__mro__
    return (next(c for c in mro if c.__name__ == "UsageError"), next(c for c in mro if c.__name__ == "ClickException"))


def _run_app() -> int:
    """The CLI, with click's errors said in one line on stderr, as ours are.

    In its own (standalone) mode click prints a usage error as four lines (usage, a
    hint, a blank, the error); ours are one line that names what is wrong, for logs and
    CI output. `envdoctor` alone still prints the help."""
    usage_error, click_error = _click_errors()
    try:
        code = app(standalone_mode=False)
    except click_error as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            exc.show()
            return exc.exit_code
        from envdoctor.exporters.common import one_line

        where = exc.ctx.command_path if isinstance(exc, usage_error) and exc.ctx is not None else ""
        hint = f" (see `{where} --help`)" if where else ""
        if where.endswith(" exec"):  # exec speaks logfmt, its usage errors too: `--timeout=abc` was the odd one out
            from envdoctor.entrypoint import log

            log("error", f"{exc.format_message()}{hint}", exit=exc.exit_code)
            return exc.exit_code
        # click quotes the value it refused, which may be a token pasted into the wrong flag; said
        # where stderr can take it, and the exit code says it either way (`2>&-` ended with 1)
        check_command.say(f"envdoctor: {one_line(_scrubbed(exc.format_message()))}{hint}")
        return exc.exit_code
    except typer.Abort:
        check_command.say("envdoctor: aborted")
        return 1
    return code if isinstance(code, int) else 0


def main() -> None:
    """Console-script entry point; a Ctrl-C ends quietly with 130, SIGTERM with 143, as
    shells expect, and neither leaves a probe (or anything it started) running."""
    from envdoctor import stopping

    sys.exit(stopping.run_command(_run_app))


def console_main() -> None:
    """The `envdoctor` command: main(), then exit without the interpreter's teardown.

    Unloading a few hundred modules and settling the watchdog's idle workers costs
    ~10 ms of CPU and ~20 ms of wall time at the end of a warm `check` (a fifth of
    it), after the report is written and flushed: nothing envdoctor holds needs a
    clean shutdown (-o files are complete, renamed into place, before this point).
    `python -m envdoctor` (module_main) and main() keep the ordinary exit, for
    callers that catch SystemExit, unless a call is still stuck.
    """
    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    _exit_now(code)


def module_main() -> None:
    """`python -m envdoctor`: main() with the ordinary exit (a runpy caller may catch
    SystemExit), unless a bounded call is still stuck. Then the interpreter's teardown
    is skipped as console_main does: a check stuck inside a C++ extension (onnxruntime
    creating a session) keeps running while the process's static destructors run, and
    the process died with "terminate called without an active exception" (SIGABRT)
    after a complete report."""
    from envdoctor.watchdog import default_watchdog

    try:
        main()
    except SystemExit as exc:
        if default_watchdog().stuck():
            _exit_now(exc.code)
        raise
    if default_watchdog().stuck():
        _exit_now(0)


def _exit_now(code: object) -> None:
    """Leave with `code` (SystemExit's meaning), skipping teardown (program.exit_now).

    os._exit runs no atexit handler, so the one that matters is called here: a torch
    probe whose check timed out runs in its own session and would outlive the run."""
    from envdoctor.program import exit_now

    _kill_probes()
    exit_now(code)


@app.command("exec", context_settings={"allow_interspersed_args": False},
             short_help="Check, fix what is safe, then become the job.")
def exec_command(
    strict: bool = typer.Option(False, "--strict", help="Do not start the command when a result is at or above --fail-on: exit 78."),
    fix: bool = typer.Option(False, "--fix", help="Set or unset the variables the findings say would fix them (thread "
                                                  "counts, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, CUBLAS_WORKSPACE_CONFIG, CUDA_LAUNCH_BLOCKING; "
                                                  "under a launch, the majority's value of a variable the ranks disagree "
                                                  "on) for the command."),
    keep: List[str] = typer.Option([], "--keep", metavar="VAR", help="Never change this variable with --fix (repeatable)."),
    report: Optional[str] = typer.Option(None, "--report", metavar="FILE", help="Also write the JSON report to FILE (atomically; '-': standard output)."),
    only: List[str] = typer.Option([], "--only", metavar="ID", help="Run only this check (repeatable, or ID,ID)."),
    skip: List[str] = typer.Option([], "--skip", metavar="ID", help="Do not run this check (repeatable, or ID,ID)."),
    fail_on: Optional[str] = typer.Option(None, "--fail-on", metavar="LEVEL", help="What --strict refuses: warn or fail (default fail; error counts as fail)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", metavar="SECONDS", help="Bound on the whole pre-flight; past it the command starts anyway (not with --strict). Default 5, or 120 for a rank of a distributed launch (torchrun, srun), whose ranks compare themselves first (dist.consistency)."),
    attach: bool = typer.Option(False, "--attach", help="Make the command publish its live torch settings (as envdoctor.attach() would), for check --pid and serve."),
    command: Optional[List[str]] = typer.Argument(None, metavar="-- CMD [ARGS]...", help="The command to become."),
) -> None:
    """Check the environment, fix what can be fixed from inside (--fix), then become CMD.

    Runs the cheap checks on the environment CMD will inherit, logs one line per problem
    to stderr, then execs CMD in the same process (same PID, signals and exit status).
    Exit codes when CMD does not start: 78 --strict refused; 2 bad usage; 126/127 CMD
    cannot be run or is not found.
    """
    from envdoctor import entrypoint

    options = entrypoint.ExecOptions(strict=strict, fix=fix, keep=keep, report=report, only=only, skip=skip,
                                     fail_on=fail_on, timeout=timeout, attach=attach)
    raise typer.Exit(entrypoint.run(options, command or []))


@app.command(short_help="Prometheus metrics on the node and its jobs.")
def serve(
    listen_address: str = typer.Option("127.0.0.1:10061", "--web.listen-address", metavar="HOST:PORT",
                                       help="Address to answer /metrics, /report, /healthz on (default: loopback only)."),
    web_config_file: Optional[str] = typer.Option(None, "--web.config.file", metavar="FILE",
                                                  help="exporter-toolkit web config: TLS, client certificates, basic auth."),
    interval: Optional[float] = typer.Option(None, "--interval", metavar="SECONDS", help="Seconds between runs (default 15, or [serve] interval)."),
    textfile_text: Optional[str] = typer.Option(None, "--textfile", metavar="PATH",
                                                help="Also write each run to PATH (*.prom) for node_exporter's textfile collector."),
    once: bool = typer.Option(False, "--once", help="Run once, write --textfile (or, without one, print the metrics) and exit; no HTTP server."),
    config_file: Optional[str] = typer.Option(None, "--config", metavar="FILE",
                                              help="Config file: checks' settings and [serve] (default: $ENVDOCTOR_CONFIG, ./envdoctor.toml or "
                                                   "[tool.envdoctor] in ./pyproject.toml); SIGHUP reads it again."),
    procfs_text: str = typer.Option("/proc", "--path.procfs", metavar="DIR", help="procfs mount point (e.g. /host/proc in a container)."),
    sysfs_text: str = typer.Option("/sys", "--path.sysfs", metavar="DIR", help="sysfs mount point."),
    rootfs_text: str = typer.Option("/", "--path.rootfs", metavar="DIR", help="Root file system to read (e.g. /host/root in a container)."),
) -> None:
    """Monitor the node and every training process on it; serve Prometheus metrics.

    Exit codes: 0 after SIGTERM/SIGINT (or after --once); 2 bad usage, config or web config;
    74 when --once could not write --textfile or its metrics to stdout, or could not list
    the processes for want of open files or finish discovering them within `timeout`; 75 when the listen address is in use or not on
    this host yet (a later start may succeed); killed by SIGPROF (155 in a shell), with every
    thread's stack on stderr, when a plug-in check held the interpreter for 20 s of CPU (so
    that the supervisor restarts it; a daemon stopped or frozen spends none and goes on, unless
    stopped for over 300 s: SIGALRM then ends it when continued).

    [serve] settings may also come from ENVDOCTOR_SERVE__NAME variables
    (ENVDOCTOR_SERVE__INTERVAL=30); README "Running the monitor" lists them, every metric and the endpoints.
    """
    from envdoctor import program
    from envdoctor.serve import Daemon, Options, StartError

    if config_file is not None and not config_file.strip():  # it fell back to ./envdoctor.toml unsaid
        _die("--config needs a file name (it was empty)")
    if textfile_text is not None and (not textfile_text.strip() or textfile_text.endswith("/")):
        _die(f"--textfile {textfile_text!r}: give the path of a *.prom file")  # Path() made '' '.' and a.prom/ a.prom
    procfs, sysfs, rootfs = (_directory(flag, text) for flag, text in
                             (("--path.procfs", procfs_text), ("--path.sysfs", sysfs_text), ("--path.rootfs", rootfs_text)))
    options = Options(listen_address=listen_address, web_config_file=web_config_file, interval=interval,
                      # absolute, as the config files: a plug-in check's chdir() must not move them
                      textfile=None if textfile_text is None else _absolute(textfile_text), once=once,
                      config_file=str(_absolute(config_file)) if config_file else config_file,
                      procfs=procfs, sysfs=sysfs, rootfs=rootfs, config_given=config_file)
    if program.relaunch_serve and not once:
        from envdoctor.serve import relaunch

        relaunch.replace_process(options)  # returns only when it could not: the daemon then runs here
    from envdoctor.stdout_guard import PluginsPrintToStderr

    try:
        with PluginsPrintToStderr():  # a plug-in's print at import is not `--once`'s exposition (helper-85)
            daemon = Daemon(options)
    except StartError as exc:
        check_command.usage_error(str(exc))
        raise typer.Exit(exc.code) from None
    from envdoctor.forked import contained

    with contained(orphans=once):  # what a plug-in's check started ends with the run (cron's --once too)
        code = daemon.run()
    if program.relaunch_serve and not once:  # the daemon ran here (its exec failed): leave as program.module_main says
        program.exit_now(code)
    raise typer.Exit(code)
