"""`envdoctor serve` leaves the CLI behind: the daemon runs in a process that never imported it.

The CLI (typer and its vendored click) parses `serve`'s flags once, and then stays
resident for as long as the daemon runs, weeks on every node: 2.0 MiB of the
daemon's RSS over 64 targets (34.1 -> 32.1 MiB after 400 scrapes; README "Cost").
So once the CLI has parsed them, the process replaces itself (execve: the same pid,
so systemd, tini and kill see no change) with the same command line, and the parsed
options in its environment for the new image to find before it imports the CLI
(`envdoctor.program`). That image builds and runs the daemon as the CLI would have,
with the same error lines and exit codes.

The options name the pid they were made for; the new image keeps the pid, and a copy
of the variable inherited by anything else (a child, a shell that exported it) is
ignored. If the exec cannot be done the daemon runs where it is, as before.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from envdoctor.program import SERVE_OPTIONS_VARIABLE as OPTIONS_VARIABLE, flush_standard_streams

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any

PATH_OPTIONS = ("textfile", "procfs", "sysfs", "rootfs")  # Options fields that are Paths (JSON carries str)
EXIT_INTERRUPTED = 130


def _command_line() -> tuple[str, list[str]]:
    """What to exec to start this same command again: the `envdoctor` script itself when
    the kernel ran it through its shebang (so the process is still called `envdoctor`
    in ps, pgrep and top), else the interpreter with its original arguments and flags
    (`python -X ... -m envdoctor serve ...`)."""
    script = sys.argv[0] if sys.argv else ""
    if sys.orig_argv[1:] == sys.argv and script and not script.endswith(".py") and os.access(script, os.X_OK):
        return script, list(sys.argv)
    return sys.executable, list(sys.orig_argv)


def replace_process(options: Any) -> None:
    """Exec this command again with `options` (serve's Options) waiting in the environment.
    Returns only when that could not be done; the caller then runs the daemon itself."""
    path, argv = _command_line()
    if not path:
        return
    document = {"pid": os.getpid(), "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in ((name, getattr(options, name)) for name in options.field_names())}}
    env = {**os.environ, OPTIONS_VARIABLE: json.dumps(document)}
    flush_standard_streams()
    try:
        os.execve(path, argv, env)
    except OSError:
        return


def waiting_options() -> Any | None:
    """The Options a CLI left for this process (and takes them out of the environment, so
    no child inherits them), or None when there are none meant for this pid."""
    text = os.environ.pop(OPTIONS_VARIABLE, None)
    if text is None:
        return None
    from envdoctor.serve import Options

    try:
        document = json.loads(text)
        if document.get("pid") != os.getpid():
            return None
        return Options(**{k: (Path(v) if k in PATH_OPTIONS and v is not None else v)
                          for k, v in document["options"].items()})
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def run(options: Any) -> int:
    """Build and run the daemon as `envdoctor serve` does; its exit code. A bad start is
    one line on stderr and exit 2 (75 for a listen address taken or not up yet), a Ctrl-C
    before the daemon is up exit 130."""
    from envdoctor.serve import Daemon, StartError

    try:
        try:
            daemon = Daemon(options)
        except StartError as exc:
            from envdoctor.exporters.common import one_line

            from envdoctor.redact import mask_own_secrets

            sys.stderr.write(f"envdoctor: {one_line(mask_own_secrets(str(exc)))}\n")
            return exc.code
        from envdoctor.forked import contained

        with contained(orphans=False):  # on SIGTERM, what a plug-in's check started (a hung tool) goes too
            return daemon.run()
    except KeyboardInterrupt:
        try:
            sys.stderr.write("envdoctor: interrupted\n")
        except (OSError, ValueError):
            pass
        return EXIT_INTERRUPTED
