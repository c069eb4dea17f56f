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
import re
import stat
import time
import zlib
from pathlib import Path

from envdoctor.atomicfile import write_atomic
from envdoctor.errors import OutputError

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping

NO_CACHE_VAR = "ENVDOCTOR_NO_CACHE"
MAX_AGE_SECONDS = 24 * 3600  # a safety net for whatever a fingerprint misses
KEEP_PER_KIND = 32  # the newest entries of one kind (entry-points, torch-probe, ...) kept
LEFTOVER_SECONDS = 60.0  # a temporary file this old was left by a writer that died


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get(NO_CACHE_VAR, "").strip().lower() in ("", "0", "false", "no")


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    return _cache_root(os.environ if environ is None else environ) / "envdoctor"


def entry_file(kind: str, key: str) -> Path:
    """The cache file for one entry of `kind` (entry-points, onnx-stack, ...) named by `key`.

    The name is two checksums of the key, not a hashlib digest: importing hashlib maps
    libcrypto, 3-6 ms of every warm start. A name is not a check: read() compares the
    whole fingerprint, so two keys that collide only evict each other's entry."""
    data = key.encode("utf-8", "surrogateescape")
    return cache_dir() / f"{kind}-{zlib.crc32(data):08x}{zlib.adler32(data):08x}.json"


def _cache_root(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME") or ""
    # The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    if os.path.isabs(base):
        return Path(base)
    home = environ.get("HOME")
    if home:
        return Path(home) / ".cache"
    # unset, or empty: Path.home() made HOME='' the root, and the cache /.cache
    import pwd

    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache"
    except KeyError:  # a uid with no passwd entry: no home at all
        return Path(".cache")  # relative: make_dir refuses it


def make_dir(directory: Path, environ: Mapping[str, str] | None = None) -> str:
    """Make `directory` (mode 0700) under the cache root and return its real path, or raise
    OSError: never a home directory (with HOME pointing nowhere, `nobody`'s /nonexistent,
    the cache is simply not used, as on a read-only home), never under a relative HOME,
    and never inside, or through, anything another user can change
    (envdoctor.private_dir: root with a user's HOME must not trust that user's files)."""
    from envdoctor.private_dir import make_private

    environ = os.environ if environ is None else environ
    root = _cache_root(environ)
    if not root.is_absolute():  # HOME=. or HOME=rel: a cache in whatever the working directory is
        raise FileNotFoundError(f"no absolute home directory to cache in (HOME={environ.get('HOME')!r})")
    if not root.parent.is_dir():  # the cache root may be made, never the home (or whatever) above it
        raise FileNotFoundError(f"no directory to cache in ({root.parent} does not exist)")
    real = make_private(directory)
    if real is None:
        raise PermissionError(f"{directory}: not a directory only this user can change")
    return real


_TRUSTED: dict[str, str | None] = {}  # directory -> its real path if only we can change it (per process)


def _trusted(directory: Path) -> str | None:
    """The cache directory's real path if no other user can change it or what is in it;
    looked up once per process (a directory nobody else can change stays that way)."""
    key = str(directory)
    if key not in _TRUSTED:
        from envdoctor.private_dir import only_ours

        _TRUSTED[key] = only_ours(directory)
    return _TRUSTED[key]


MAX_ENTRY_BYTES = 4 * 1024 * 1024  # the largest entry written is the torch probe's, well under 100 KiB


def _load_entry(name: str) -> Any:
    """The JSON in the file `name`, or None for anything that is not a small regular file
    of JSON: a FIFO (opened without blocking), a link (not followed), /dev/zero, a huge
    file, or JSON nested deeper than the parser can go are all misses, never a hang."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_ENTRY_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_ENTRY_BYTES + 1)
        if len(data) > MAX_ENTRY_BYTES:
            return None
        return json.loads(data)
    except (OSError, ValueError, RecursionError, MemoryError):
        return None
    finally:
        os.close(fd)


def read(path: Path, schema: str, fingerprint: Any, *, now: float | None = None) -> dict[str, Any] | None:
    """The facts stored at `path` if the entry has this schema and fingerprint and is fresh.

    `fingerprint` may be a function of the stored facts, for caches whose key depends
    on what was cached (the torch probe's sys.path): the file is still read once.
    """
    real = _trusted(path.parent)
    if real is None:  # another user's directory (root with their HOME): its entries are not ours to believe
        return None
    entry = _load_entry(os.path.join(real, path.name))
    if entry is None:
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
        real = make_dir(path.parent)
        _TRUSTED[str(path.parent)] = real
        target = Path(real) / path.name
        _clear_non_file(target)
        write_atomic(target, text, mode=0o600)
    except (OSError, OutputError, TypeError, ValueError):
        return False
    prune(Path(real) / path.name)
    return True


def _clear_non_file(target: Path) -> None:
    """Remove a link, FIFO or other non-file where an entry goes: write_atomic follows
    links (right for -o, wrong for a cache entry: it would write into /dev/zero or
    wherever the link points); a directory stays and the write fails (a miss)."""
    try:
        info = os.lstat(target)
    except OSError:
        return
    if not stat.S_ISREG(info.st_mode) and not stat.S_ISDIR(info.st_mode):
        os.unlink(target)


def prune(path: Path, *, keep: int = KEEP_PER_KIND, now: float | None = None) -> int:
    """Delete the other entries of `path`'s kind that can no longer be hits; how many went.

    A cache file is named for what it describes (one interpreter and search path, one
    python), so every venv, PYTHONPATH and scratch directory leaves a file of its own,
    and nothing removed them: one run of our test suite left 434. An entry older than
    MAX_AGE_SECONDS is a miss whatever it holds, so it goes; of the rest, only the
    newest `keep` of the kind stay. Called after a write, which only a miss makes, so
    the warm path never lists the directory. Never raises; follows no symlink; touches
    only names this module writes (KIND-HEX.json, and write_atomic's leftovers of them).
    """
    kind = re.escape(path.name.rsplit("-", 1)[0])
    ours = re.compile(rf"(?P<leftover>\.)?{kind}-[0-9a-f]+\.json(?(leftover)\.[^/]+\.tmp)")
    now = time.time() if now is None else now
    entries: list[tuple[float, str]] = []
    doomed: list[str] = []
    try:
        with os.scandir(path.parent) as listing:
            for item in listing:
                match = ours.fullmatch(item.name)
                if match is None or item.name == path.name:
                    continue
                try:
                    if not item.is_file(follow_symlinks=False):
                        continue
                    age = now - item.stat(follow_symlinks=False).st_mtime
                except OSError:
                    continue
                if match["leftover"]:
                    if age > LEFTOVER_SECONDS:  # a live writer renames its file within milliseconds
                        doomed.append(item.path)
                elif not -LEFTOVER_SECONDS <= age <= MAX_AGE_SECONDS:  # read() refuses it anyway
                    doomed.append(item.path)
                else:
                    entries.append((age, item.path))
    except OSError:
        return 0
    entries.sort()  # youngest first; `path` itself, just written, is younger than all and counts as one
    doomed += [p for _, p in entries[max(keep - 1, 0):]]
    removed = 0
    for p in doomed:
        try:
            os.unlink(p)
            removed += 1
        except OSError:
            pass
    return removed

