"""Textfile mode: the same exposition written for node_exporter's textfile collector.

For nodes that already run node_exporter: `--textfile /var/lib/node_exporter/envdoctor.prom`
writes each run's exposition there atomically (a temporary file in the same
directory, then a rename), so the collector never reads half a file. The
exposition carries no timestamps (the collector refuses them). The file name must
end in `.prom`, the only files the collector reads.
"""

from __future__ import annotations

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
    """Write atomically; raises envdoctor.errors.OutputError with a one-line reason."""
    write_atomic(path, exposition, mode=0o644)
