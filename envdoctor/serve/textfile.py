"""Textfile mode: the same exposition written for node_exporter's textfile collector.

For nodes that already run node_exporter: `--textfile /var/lib/node_exporter/envdoctor.prom`
writes each run's exposition there atomically (a temporary file in the same
directory, then a rename), so the collector never reads half a file. The
exposition carries no timestamps (the collector refuses them). The file name must
end in `.prom`, the only files the collector reads.
"""

from __future__ import annotations

import os
from pathlib import Path

from envdoctor.atomicfile import write_atomic


def check_path(path: Path) -> str | None:
    """Why `path` cannot be a textfile target, or None when it can."""
    if path.suffix != ".prom":
        return f"--textfile {path}: node_exporter's textfile collector reads only *.prom files"
    if not path.parent.is_dir():
        return f"--textfile {path}: the directory {path.parent} does not exist"
    return None


def write(path: Path, exposition: bytes) -> None:
    """Write atomically; raises envdoctor.errors.OutputError with a one-line reason.

    Not into a FIFO: write_atomic writes one as it is (right for `check -o` into a
    pipe), but a reader that opened it and stopped reading would block the scheduler's
    thread for good once the pipe's 64 KiB filled, and every later run with it."""
    import os
    import stat

    from envdoctor.errors import OutputError

    try:
        fifo = stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        fifo = False  # missing (created by the write) or unreadable (the write says why)
    if fifo:
        raise OutputError(f"cannot write {path}: it is a FIFO; the textfile collector reads regular files")
    # a new file readable by node_exporter's user; an existing one keeps the mode it was given
    write_atomic(path, exposition, mode=None if os.path.exists(path) else 0o644)
