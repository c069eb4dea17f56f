"""Small JSON caches under $XDG_CACHE_HOME/envdoctor, for facts that are slow to
gather and change only when something is installed (the torch probe, the ONNX
stack's limits).

Each cache file holds {"schema", "created", "fingerprint", "facts"}; the caller
computes the fingerprint from cheap stat() calls and uses the facts only when it
matches. Reads never raise (a corrupt, foreign or unreadable file is a miss);
writes are atomic (temporary file + rename) and never raise either: a cache that
cannot be written is just not used. ENVDOCTOR_NO_CACHE=1 turns every cache off.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Mapping

from envdoctor.atomicfile import write_atomic
from envdoctor.errors import OutputError

NO_CACHE_VAR = "ENVDOCTOR_NO_CACHE"
MAX_AGE_SECONDS = 24 * 3600  # a safety net for whatever a fingerprint misses


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get(NO_CACHE_VAR, "").strip().lower() in ("", "0", "false", "no")


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or ""
    # The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "envdoctor"


def read(path: Path, schema: str, fingerprint: Any, *, now: float | None = None) -> dict[str, Any] | None:
    """The facts stored at `path` if the entry has this schema and fingerprint and is fresh.

    `fingerprint` may be a function of the stored facts, for caches whose key depends
    on what was cached (the torch probe's sys.path): the file is still read once.
    """
    try:
        with open(path, "rb") as f:
            entry = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("schema") != schema:
        return None
    facts, created = entry.get("facts"), entry.get("created")
    if not isinstance(facts, dict) or not isinstance(created, (int, float)):
        return None
    now = time.time() if now is None else now
    if not (0 <= now - created <= MAX_AGE_SECONDS):
        return None
    if callable(fingerprint):
        fingerprint = fingerprint(facts)
    # JSON turns tuples into lists; compare in the stored form.
    if json.loads(json.dumps(fingerprint)) != entry.get("fingerprint"):
        return None
    return facts


def write(path: Path, schema: str, fingerprint: Any, facts: dict[str, Any]) -> bool:
    entry = {"schema": schema, "created": time.time(), "fingerprint": fingerprint, "facts": facts}
    try:
        text = json.dumps(entry, sort_keys=True, allow_nan=False)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(path, text, mode=0o600)
        return True
    except (OSError, OutputError, TypeError, ValueError):
        return False
