"""A cache of the torch probe's facts, so a warm `envdoctor check` starts no interpreter.

Importing torch costs seconds; the facts the probe gathers change only when the
interpreter, the torch installation, the driver or a few environment variables
change. One JSON file per interpreter under $XDG_CACHE_HOME/envdoctor (default
~/.cache/envdoctor) holds the facts and a fingerprint of everything they depend
on; a lookup recomputes the fingerprint with a few stat() calls and no
subprocess, and uses the facts only when it matches exactly.

The fingerprint covers:
  - the interpreter file as given (not resolved: two venvs share one binary but
    not one site-packages): mtime, size, inode, device;
  - every sys.path entry and site directory the probe reported, with its mtime or
    "missing": any pip install or uninstall adds or removes a *.dist-info folder
    in site-packages and so changes that directory's mtime; a new user site or
    a new directory on the path shows up as "missing" -> present;
  - torch's own files: torch/__init__.py, torch/version.py and the dist-info
    RECORD (mtime and size), for in-place rebuilds and editable installs;
  - a hash (never the values) of the environment variables that change what the
    probe sees: PYTHON*, CUDA_*, NVIDIA_*, OMP_*, MKL_*, TORCH_*, PYTORCH_*,
    CUBLAS_*, CUDNN_*, LD_*, HOME;
  - the driver: /proc/driver/nvidia/version, the /dev/nvidia* nodes and
    /etc/ld.so.cache (a new libcuda), so a driver change re-probes;
  - the probe script's own source.
Entries older than MAX_AGE_SECONDS are ignored as a safety net for anything the
fingerprint misses. An unreadable, corrupt or foreign cache file is ignored.
Writes are atomic (temporary file + rename). ENVDOCTOR_NO_CACHE=1 turns it off.
"""

from __future__ import annotations

import os
from pathlib import Path

from envdoctor import diskcache
from envdoctor.diskcache import MAX_AGE_SECONDS, NO_CACHE_VAR, cache_dir, enabled  # noqa: F401 (the cache's public face)

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping

SCHEMA = "envdoctor.torch-probe-cache/v1"
_ENV_PREFIXES = ("PYTHON", "CUDA_", "NVIDIA_", "OMP_", "MKL_", "TORCH_", "PYTORCH_", "CUBLAS_", "CUDNN_", "LD_")
_ENV_NAMES = ("HOME",)


def cache_file(python: str, directory: Path | None = None) -> Path:
    import hashlib  # here, not at import: it maps libcrypto, a cost every start paid

    digest = hashlib.sha256(python.encode("utf-8", "surrogateescape")).hexdigest()[:20]
    return (directory or cache_dir()) / f"torch-probe-{digest}.json"


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev]


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except (OSError, ValueError):
        return None


def env_hash(environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    import hashlib  # here, not at import: it maps libcrypto, a cost every start paid

    h = hashlib.sha256()
    for name in sorted(environ):
        if name.startswith(_ENV_PREFIXES) or name in _ENV_NAMES:
            if name == NO_CACHE_VAR:
                continue
            h.update(name.encode("utf-8", "surrogateescape") + b"=" + environ[name].encode("utf-8", "surrogateescape") + b"\0")
    return h.hexdigest()


def driver_stamp() -> str:
    """What changes when the NVIDIA driver or its user-space libraries change."""
    import hashlib  # here, not at import: it maps libcrypto, a cost every start paid

    h = hashlib.sha256()
    try:
        h.update(Path("/proc/driver/nvidia/version").read_bytes())
    except OSError:
        h.update(b"no-driver")
    try:
        h.update(",".join(sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))).encode())
    except OSError:
        pass
    h.update(repr(_stat("/etc/ld.so.cache")).encode())
    return h.hexdigest()


def static_fingerprint(python: str, probe_source_hash: str, environ=None) -> dict[str, Any]:
    """The part of the fingerprint known before the probe has run."""
    return {
        "python": python,
        "python_stat": _stat(python),
        "env": env_hash(environ),
        "driver": driver_stamp(),
        "probe": probe_source_hash,
    }


def _paths_of(facts: dict[str, Any]) -> list[str]:
    paths: list[str] = []
    for key in ("sys_path", "site_dirs"):
        value = facts.get(key) or []
        if isinstance(value, list):
            paths.extend(p for p in value if isinstance(p, str) and p)
    return sorted(set(paths))


def dynamic_fingerprint(facts: dict[str, Any]) -> dict[str, Any]:
    """The part that depends on where the probe found things."""
    stamp_files: Iterable[Any] = facts.get("stamp_files") or []
    return {
        "paths": [[p, _mtime(p)] for p in _paths_of(facts)],
        "torch_files": [[f, _stat(f)] for f in stamp_files if isinstance(f, str)],
    }


def load(python: str, probe_source_hash: str, *, directory: Path | None = None, now: float | None = None) -> dict[str, Any] | None:
    """The cached facts for `python` if they are still true; None otherwise."""
    static = static_fingerprint(python, probe_source_hash)

    def expected(facts: dict[str, Any]) -> dict[str, Any]:
        # part of the key depends on the facts themselves (the paths the probe reported)
        return {**static, **dynamic_fingerprint(facts)}

    return diskcache.read(cache_file(python, directory), SCHEMA, expected, now=now)


def store(python: str, facts: dict[str, Any], before: dict[str, Any], *, directory: Path | None = None) -> bool:
    """Save facts with their fingerprint; `before` is static_fingerprint() taken
    before the probe ran, so a change during the probe leaves a stale key, not
    stale facts. Never raises: a cache that cannot be written is just not used."""
    fingerprint = dict(before)
    fingerprint.update(dynamic_fingerprint(facts))
    return diskcache.write(cache_file(python, directory), SCHEMA, fingerprint, facts)
