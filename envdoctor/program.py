"""The `envdoctor` command's first step, taken before the CLI is imported.

Almost always it hands over to the CLI (`envdoctor.cli`). The exception is a process
that `envdoctor serve` has just replaced with itself (`envdoctor.serve.relaunch`):
its options were parsed by the CLI before the exec and wait in its environment, and
the daemon then runs without importing the CLI at all, for the weeks it runs.
"""

from __future__ import annotations

import os
import sys

SERVE_OPTIONS_VARIABLE = "ENVDOCTOR_SERVE_OPTIONS"

# Set by the two entry points below: only a process that is the `envdoctor` command
# may be replaced by `serve`. The CLI called from a test or another program runs the
# daemon in place.
relaunch_serve = False

# The descriptors this process started with, as the `envdoctor` command (None when
# envdoctor is a library in someone's process): `-o /dev/fd/N` may name only these,
# never one envdoctor opened itself (envdoctor.atomicfile).
inherited_descriptors: frozenset[int] | None = None


def _note_inherited_descriptors() -> None:
    global inherited_descriptors
    try:
        listed = os.listdir("/proc/self/fd")  # its own descriptor for the listing is gone after
    except OSError:
        return
    found = set()
    for name in listed:
        try:
            fd = int(name)
            os.fstat(fd)
        except (ValueError, OSError):
            continue
        found.add(fd)
    inherited_descriptors = frozenset(found)


def _note_inherited_children() -> None:
    from envdoctor.stopping import note_inherited_children

    note_inherited_children()


def _daemon_exit_code() -> int | None:
    """The daemon's exit code when this process is a relaunched `serve`, else None.
    Every other command pays one dictionary lookup for this."""
    if SERVE_OPTIONS_VARIABLE not in os.environ:
        return None
    from envdoctor.serve import relaunch

    options = relaunch.waiting_options()
    return None if options is None else relaunch.run(options)


def flush_standard_streams() -> None:
    """What Python holds of stdout and stderr, written out before an _exit or an execve
    discards it."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with it closed (`>&-`): Python has no stream to flush
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (envdoctor check | head): nothing more can be said
            pass


def exit_now(code: object) -> None:
    """Flush what was said and leave with `code` (SystemExit's meaning), skipping the
    interpreter's teardown (see cli.console_main for why that is safe and worth it)."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        sys.stderr.write(f"{code}\n")
        code = 1
    flush_standard_streams()
    os._exit(code)


def _hold_reloads_while_starting() -> None:
    """`serve`: SIGHUP asks the daemon to re-read its config, and one that came while the
    process was still starting (Python, the CLI, the relaunch: about 0.3 s) killed it, the
    signal's default action; `kill -HUP $MAINPID` right after a start took the monitor
    down. It is ignored until the daemon installs its handler (an ignored signal stays
    ignored across the relaunch's execve); nothing is loaded yet that could be re-read."""
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        import signal

        try:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        except (ValueError, OSError):  # not the main thread: an embedding caller's business
            pass


def _head_start_exec() -> None:
    """`envdoctor exec ... -- CMD`: fork the pre-flight child before the CLI is imported,
    so that it imports the checks while the CLI parses (envdoctor.exec_headstart)."""
    if len(sys.argv) > 2 and sys.argv[1] == "exec":
        from envdoctor import exec_headstart

        if exec_headstart.wanted(sys.argv):
            exec_headstart.begin()


def _plain_line() -> tuple[str, dict, list[str]] | None:
    """`envdoctor exec OPTIONS -- CMD` or `envdoctor check OPTIONS` whose options are plain
    (envdoctor.plain_argv): ("exec" or "check", its options, exec's command), read
    without the CLI; else None (the CLI reads the line)."""
    if len(sys.argv) < 2 or sys.argv[1] not in ("exec", "check") or "_ENVDOCTOR_COMPLETE" in os.environ:
        return None  # (shell completion is the CLI's to answer, as for every other line)
    from envdoctor import plain_argv

    if sys.argv[1] == "check":
        options = plain_argv.parse_check(sys.argv)
        return None if options is None else ("check", options, [])
    line = plain_argv.split_exec(sys.argv)
    if line is None:
        return None
    options = plain_argv.parse_exec(line[0])
    return None if options is None else ("exec", options, line[1])


def _without_cli(command: str, options: dict, job: list[str]) -> None:
    """What the CLI's `check` or `exec` does with these options, as the `envdoctor` command:
    the report and its exit code, or exec becoming `job` (or leaving with the status it
    could not); as the CLI's exit, any probe is killed on the way out."""
    from envdoctor import stopping

    if command == "check":
        from envdoctor import check_command

        def run() -> int:
            return check_command.run_guarded(**options)
    else:
        from envdoctor import entrypoint

        def run() -> int:
            return entrypoint.run(entrypoint.ExecOptions(**options), job)
    try:  # a Ctrl-C ends with 130 and no word, as the CLI's commands do (the shell has said ^C)
        code: object = stopping.run_command(run, say_interrupted=False)
    except SystemExit as exc:  # SIGTERM's Terminated: leave now, as the CLI does, not through the teardown
        code = exc.code      # (a second signal during it changed the exit status: helper-57)
    stopping.kill_probes()
    exit_now(code)


def _is_interrupt(exc: BaseException) -> bool:
    """A KeyboardInterrupt, or one Python wrapped: raised inside a class body's
    __set_name__ (a dataclass field, functools.cached_property) it comes as the cause of
    a RuntimeError. Not a SystemExit: the CLI's exit after an interrupt it has handled
    and said."""
    if isinstance(exc, SystemExit):
        return False
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _interrupted_while_starting() -> int:
    """Ctrl-C while the CLI was still being imported, before its handler was installed:
    Python's own KeyboardInterrupt printed a traceback of whatever import it hit. Said as
    the CLI says it, with the CLI's status."""
    try:
        sys.stderr.write("envdoctor: interrupted\n")
    except (OSError, ValueError, AttributeError):  # stderr closed or None
        pass
    return 130


def _start_as_the_command() -> None:
    """What both entry points do first: hold serve's reloads, note what the process
    inherited, and run a relaunched daemon (which leaves with its exit code)."""
    global relaunch_serve
    _hold_reloads_while_starting()  # first: the window before it is the interpreter's start alone
    _note_inherited_descriptors()
    _note_inherited_children()
    code = _daemon_exit_code()
    if code is not None:
        exit_now(code)
    relaunch_serve = True


def console_main() -> None:
    """The `envdoctor` console script."""
    try:  # from the first line of ours: a Ctrl-C while starting is one line, not an import's traceback
        _start_as_the_command()
        _head_start_exec()
        plain = _plain_line()
        if plain is None:
            from envdoctor.cli import console_main as cli_console_main
        elif plain[0] == "check":  # here, where a Ctrl-C while importing is said in one line (helper-59)
            from envdoctor import check_command, stopping  # noqa: F401
        else:
            from envdoctor import entrypoint, stopping  # noqa: F401
    except BaseException as exc:
        if _is_interrupt(exc):
            exit_now(_interrupted_while_starting())
        _leave_if_shadowed(exc)
        raise
    try:
        if plain is not None:
            _without_cli(*plain)
        cli_console_main()  # leaves with os._exit: a head start never taken goes with the process
    except BaseException as exc:  # what the commands import as they go (check's forked.py: `import json`)
        if not _is_interrupt(exc):
            _leave_if_shadowed(exc)
        raise


def _leave_if_shadowed(exc: BaseException) -> None:
    """Leave in one line (exec: as its command) when a module of the job's path broke
    envdoctor (envdoctor.start_failure); return to re-raise anything else."""
    try:
        from envdoctor import start_failure
    except BaseException:  # noqa: B036 - not even that: the original failure is what to show
        return
    code = start_failure.leave(exc)
    if code is not None:
        exit_now(code)


def module_main() -> None:
    """`python -m envdoctor`. A relaunched daemon leaves as the console script does,
    without the interpreter's teardown: that joins the daemon's worker threads, and one
    still examining a process when SIGTERM came held the exit up for as long as its
    checks took (past 10 s on a loaded machine); a daemon's run is abandoned, not awaited."""
    try:  # the finally also covers a Ctrl-C that lands right after the fork
        _start_as_the_command()
        _head_start_exec()
        from envdoctor.cli import module_main as cli_module_main

        cli_module_main()
    except BaseException as exc:  # a Ctrl-C the CLI's own handler did not turn into 130 (not installed yet)
        if not _is_interrupt(exc):
            _leave_if_shadowed(exc)  # `python -m` searches the working directory first: a job folder's json.py
            raise
        raise SystemExit(_interrupted_while_starting()) from None
    finally:  # a runpy caller goes on after SystemExit: no child of ours may wait there for ever
        if "envdoctor.exec_headstart" in sys.modules:
            sys.modules["envdoctor.exec_headstart"].abandon()
