"""`envdoctor check`'s work, after its options are read: the checks, the report, the exit code.

Kept apart from the CLI (envdoctor.cli) so that a plain `check` line, read without
typer (envdoctor.plain_argv), runs exactly this code too: the CLI's import (typer and
the click it vendors) was about half of a warm `check` (benchmarks/startup_vs_collect_env.py).
Nothing here imports typer: a usage error is said in one line and ends the run as
`Ended(2)`, which `run` turns into its exit code.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

from envdoctor.stopping import EXIT_IO

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Optional, Sequence

EXIT_OK, EXIT_FOUND, EXIT_USAGE = 0, 1, 2


class Ended(Exception):
    """The command ends here with `code`; what went wrong has been said."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def say(line: str) -> None:
    """One line on standard error, or nothing when it is closed (as click's echo does)."""
    try:
        sys.stderr.write(f"{line}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # closed, or None (started with 2>&-)
        pass


def usage_error(message: str) -> int:
    """Say a usage error in one line, masked (it may quote what the user typed); EXIT_USAGE."""
    from envdoctor.exporters.common import one_line

    say(f"envdoctor: {one_line(scrubbed(message))}")
    return EXIT_USAGE


def die(message: str) -> None:
    raise Ended(usage_error(message))


def scrubbed(text: str) -> str:
    """`text` with our environment's secrets masked, as in every report (DESIGN principle 3)."""
    from envdoctor.redact import mask_own_secrets

    return mask_own_secrets(text)


def absolute(text: str) -> Path:
    """`text` against today's working directory, so a check's os.chdir() cannot move it; as
    given when that directory was removed (the write then says so in one line)."""
    try:
        return Path(text).absolute()
    except OSError:  # getcwd() fails in a removed directory
        return Path(text)


def directory(flag: str, text: str) -> Path:
    """A --path.* value as a directory that exists. Taken as text, not as a typer Path:
    Path('') is '.', and --path.rootfs '' silently read the working directory."""
    if not text.strip():
        die(f"{flag} needs a directory, not ''")
    path = Path(text)
    try:
        there = path.is_dir()
    except OSError as exc:  # ENAMETOOLONG: is_dir() passes it on (Python 3.11)
        die(f"{flag} {path}: {exc.strerror or exc}")
    if not there:
        die(f"{flag} {path} is not a directory")
    return path


def run_guarded(**options) -> int:
    """`run` under the deadman's heartbeat (envdoctor.deadman), from before the plug-ins are
    imported to the report's last write: a plug-in wedged in C holding the interpreter lock
    then ends the process with its stack instead of hanging it; and nothing a check or
    plug-in started outlives the command."""
    from envdoctor.deadman import Heartbeat
    from envdoctor.forked import contained

    with contained(), Heartbeat():
        return run(**options)


def run(**options) -> int:
    """The checks run once and their report written; the exit code (EXIT_* above, or EXIT_IO)."""
    try:
        return _run(**options)
    except Ended as ended:
        return ended.code


def _run(only: Sequence[str] = (), skip: Sequence[str] = (), fmt: Optional[str] = None, pid: Optional[int] = None,
         python: Optional[str] = None, onnx: Sequence[str] = (), window: Optional[float] = None,
         config_file: Optional[str] = None, fail_on: Optional[str] = None, timeout: Optional[float] = None,
         output_text: Optional[str] = None, procfs_text: str = "/proc", sysfs_text: str = "/sys",
         rootfs_text: str = "/") -> int:
    from envdoctor import export
    from envdoctor.config import FAIL_ON
    from envdoctor.model import Status

    formats = export.names()
    if fmt is not None and fmt not in formats:
        die(f"--format must be one of {', '.join(formats)}, not {fmt!r}")
    if fail_on is not None and fail_on not in FAIL_ON:
        die(f"--fail-on must be warn or fail, not {fail_on!r}")
    if timeout is not None:
        from envdoctor.config import check_timeout
        from envdoctor.errors import ParseError

        try:
            check_timeout(timeout)
        except ParseError as exc:
            die(f"--timeout: {exc}")
    if window is not None and not (0 < window <= 7 * 86400):
        die("--window must be a positive number of seconds (at most a week)")
    if python is not None:
        import shutil

        found = shutil.which(python)
        if found is None:
            die(f"--python {python}: no such executable interpreter")
        python = found
    procfs, sysfs, rootfs = (directory(flag, text) for flag, text in
                             (("--path.procfs", procfs_text), ("--path.sysfs", sysfs_text), ("--path.rootfs", rootfs_text)))
    # Settled before any check runs: a check may chdir() or change the umask, and the report
    # must still land where the user's shell meant, with the mode the user's umask gives.
    if output_text is not None and not output_text.strip():
        die("--output needs a file name (it was empty)")  # Path('') is the working directory
    if config_file is not None and not config_file.strip():  # it fell back to ./envdoctor.toml unsaid
        die("--config needs a file name (it was empty)")
    if any(not str(name).strip() for name in onnx):  # Path('') is '.': ".: is a directory" (helper-93)
        die("--onnx needs a file name (it was empty)")
    if output_text == "-":  # the usual spelling of standard output (it wrote a file named '-')
        output_text = None
    if output_text is not None and output_text.startswith("-"):  # `-o --format json` took the next option as the file
        die(f"--output {output_text}: looks like an option, not a file name (for a file named so, write ./{output_text})")
    output = None if output_text is None else absolute(output_text)
    umask = None
    if output is not None:
        from envdoctor.atomicfile import current_umask

        umask = current_umask()
    if output_text and output_text.endswith("/"):  # Path() drops the slash: x.json/ wrote a file x.json
        say(f"envdoctor: cannot write {output_text}: it names a directory; give a file name")
        raise Ended(EXIT_IO)

    for flag, given in (("--only", only), ("--skip", skip)):
        if given and not any(part.strip() for item in given for part in item.split(",")):
            die(f"{flag} {' '.join(given)!r} names no check id; `envdoctor checks` lists them")  # `--only ,` ran every check
    only = [part.strip() for item in only for part in item.split(",") if part.strip()]
    skip = [part.strip() for item in skip for part in item.split(",") if part.strip()]
    from envdoctor.stdout_guard import PluginsPrintToStderr

    started = None
    if pid is not None:
        from envdoctor.announce import start_ticks

        started = start_ticks(procfs, pid)  # to tell, after the run, whether it is still the same process
    with PluginsPrintToStderr():  # what plug-ins print must not land in the report (helper-85)
        registry, config, sampling, report = _checked(only, skip, pid, python, onnx, window, config_file, fail_on,
                                                      timeout, fmt, formats, procfs, sysfs, rootfs)
    fmt = fmt or os.environ.get("ENVDOCTOR_FORMAT") or "text"
    emit(report, fmt, registry, config.fail_on, output, umask)
    if started is not None and (start_ticks(procfs, pid) != started or _is_zombie(procfs, pid)):
        # Its rows that could not read it are skip ("exited during the run"), and a job the OOM
        # killer took during --window looked healthy, exit 0 (helper-120). As when there is no
        # such process at the start: 2, and one line.
        say(f"envdoctor: process {pid} exited during the run: the report is partial (rows that could not "
            "read it say so)")
        return EXIT_USAGE
    threshold = Status.WARN.severity if config.fail_on == "warn" else Status.FAIL.severity
    worst = max((r.status.severity for r in report.results), default=0)
    return EXIT_FOUND if worst >= threshold else EXIT_OK


def _is_zombie(procfs, pid: int) -> bool:
    """Exited, and not yet reaped by its parent: still in /proc, with nothing left to read."""
    from envdoctor.procfs import process_kind

    kind = process_kind(procfs, pid)
    return kind is not None and kind[0] == "zombie"


def _checked(only, skip, pid, python, onnx, window, config_file, fail_on, timeout, fmt, formats, procfs, sysfs,
             rootfs):
    """The plug-ins loaded, the config read and the checks run: (registry, config, memory
    sampling, report)."""
    from envdoctor import pipeline
    from envdoctor.config import load as load_config
    from envdoctor.context import Roots
    from envdoctor.errors import ConfigError, UsageError

    registry = pipeline.load_registry()
    try:
        config = load_config(registry.checks, explicit_file=config_file, known_ids=registry.unloaded_ids, left_out=registry.left_out)
        if config.serve or any(k.startswith("ENVDOCTOR_SERVE__") for k in os.environ):
            # checked here too: a file (or environment) CI passes with `check` must not stop the node's daemon
            from envdoctor.serve.settings import from_config as serve_settings

            serve_settings(config)
    except ConfigError as exc:
        die(f"bad config: {exc}")
    if fail_on:
        config.fail_on = fail_on
    if timeout:
        config.set_timeout(timeout)
    fmt = fmt or os.environ.get("ENVDOCTOR_FORMAT") or "text"
    if fmt not in formats:
        die(f"ENVDOCTOR_FORMAT must be one of {', '.join(formats)}, not {fmt!r}")

    sampling = memory_window(config, registry, window)
    roots = Roots(procfs=procfs, sysfs=sysfs, rootfs=rootfs)
    try:
        session = pipeline.build_session(config, pid=pid, roots=roots, python=python, onnx_files=onnx)
        with _WindowProgress(session, sampling, only, skip):
            report = pipeline.execute(registry, config, session, pipeline.Selection(only=only, skip=skip))
    except UsageError as exc:
        die(str(exc))
    return registry, config, sampling, report


def emit(report, fmt: str, registry, fail_on: str, output: Optional[Path], umask: Optional[int] = None) -> None:
    import shutil

    from envdoctor import export
    from envdoctor.atomicfile import write_atomic
    from envdoctor.errors import OutputError

    # sys.stdout is None when envdoctor was started with fd 1 closed (`envdoctor check >&-`)
    to_terminal = output is None and sys.stdout is not None and sys.stdout.isatty()
    color = to_terminal and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"
    width = shutil.get_terminal_size((120, 24)).columns  # the terminal's, or $COLUMNS, or 120 in a pipe
    try:
        text = export.render(fmt, report, export.ExportOptions(catalog=registry.checks, fail_on=fail_on,
                                                               color=color, width=width))
    except export.FormatError as exc:  # a plug-in format that broke, hung or gave no text: nothing written
        die(str(exc))
    if output is None:
        write_stdout(text)
        return
    try:
        write_atomic(output, text, umask=umask)  # a reader never sees half a report; nothing else is touched
    except OutputError as exc:
        say(f"envdoctor: {scrubbed(str(exc))}")
        raise Ended(EXIT_IO)


def _write_whole(text: str) -> None:
    """All of `text` on standard output. Through its descriptor where it has one: into a
    pipe someone set non-blocking, the text layer wrote what fit, and the rest was dropped
    at exit without a word (exit 0, half a report); atomicfile's writer waits instead."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
        data = text.encode(sys.stdout.encoding or "utf-8", sys.stdout.errors or "strict")
    except (AttributeError, io.UnsupportedOperation, LookupError):  # a stream without a descriptor (embedded use)
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from envdoctor.atomicfile import write_descriptor

    write_descriptor(fd, data)


def write_stdout(text: str) -> None:
    """Standard output, or one line and exit 74 when it is closed or full (never a traceback)."""
    try:
        if sys.stdout is None:  # started with standard output closed
            raise OSError(9, "standard output is closed")
        _write_whole(text)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush cannot fail again
        except (OSError, ValueError, AttributeError):  # AttributeError: no sys.stdout at all
            pass
        say(f"envdoctor: cannot write the report to standard output: {reason}")
        raise Ended(EXIT_IO)


# -- check --window: memory.cache_growth samples for that long ---------------------------

MEMORY_CHECK = "memory.cache_growth"


def memory_window(config, registry, window: Optional[float]) -> float:
    """Give memory.cache_growth its window (from --window, else its config) and a timeout
    that outlasts it; returns the window in seconds (0: no sampling)."""
    check = registry.checks.get(MEMORY_CHECK)
    if check is None:
        return 0.0
    settings = config.checks.setdefault(MEMORY_CHECK, {})
    if window is not None:
        settings["window_seconds"] = float(window)
    seconds = float(config.settings_for(check).get("window_seconds", 0) or 0)
    if seconds > 0:
        settings["timeout"] = max(float(settings.get("timeout", 0) or 0), seconds + config.timeout)
    return seconds


class _WindowProgress:
    """A progress bar on standard error (a terminal only) while the memory check samples."""

    def __init__(self, session, window: float, only: Sequence[str], skip: Sequence[str]):
        self.session, self.window = session, window
        self.wanted = window > 0 and (not only or MEMORY_CHECK in only) and MEMORY_CHECK not in skip
        self.progress = None

    def __enter__(self):
        if not self.wanted or not sys.stderr.isatty():
            return self
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn("sampling memory of {task.fields[target]}"), BarColumn(),
                                 TextColumn("{task.completed:.0f}/{task.total:.0f} s"), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=True)
        self.progress.start()
        task = self.progress.add_task("sample", total=self.window, target=self.session.target.label)
        self.session.progress = lambda done, total: self.progress.update(task, completed=done)
        return self

    def __exit__(self, *exc_info):
        if self.progress is not None:
            self.progress.stop()
            self.session.progress = None
        return False
