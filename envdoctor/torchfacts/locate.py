"""Where a target's torch lives, found from files alone.

A running process (`pid:N`) says what it loaded: /proc/N/maps lists every file
mapped into it, and once torch is imported that includes
.../torch/lib/libtorch_python.so (and torch/_C.cpython-*.so). The torch package
is the folder above lib/. Paths in maps are as the process sees them (its mount
namespace: a container's own tree), so every read goes through /proc/N/root.

A process that has not imported torch (yet), or an interpreter not yet started
(`self`, `--python PATH`), is looked up the way its `import torch` would look:
the site directories of its interpreter, found from its files (a venv's
pyvenv.cfg, PREFIX/lib/pythonX.Y/site-packages, Debian's dist-packages), the
site directories of extension modules it has mapped, and PYTHONPATH. The first
directory holding torch/version.py wins, as it would for import.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Callable, Iterable

MAX_MAPS = 16 * 1024 * 1024  # a big training process maps a few thousand files: well under 1 MB of text

_TORCH_LIB = re.compile(r"^(?P<torch>/.*/torch)/lib/libtorch(?:_python|_cuda|_cpu|)?\.so(?:\.\d+)*$")
_TORCH_C = re.compile(r"^(?P<torch>/.*/torch)/_C(?:\.cpython-[^/]*|\.abi3)?\.so$")
_SITE = re.compile(r"^(?P<site>/.*/(?:site|dist)-packages)/")


def mapped_files(maps_text: str) -> list[str]:
    """The file paths in /proc/N/maps text (the sixth column), in order, each once."""
    return list(mapped(maps_text))


def deleted_files(maps_text: str) -> list[str]:
    """Mapped files that were deleted or replaced on disk since they were mapped
    (a `pip install` over a running job): what the process runs is no longer there."""
    return [path for path, deleted in mapped(maps_text).items() if deleted]


_DELETED = " (deleted)"


# pip uninstalls (and so upgrades) by first renaming the package folder beside itself,
# as its AdjacentTempDirectory names it: "~", then i-1 of "-~.=%0123456789", then the
# name from its i-th letter (torch -> ~orch, ~~rch, ~-rch...). A running job's maps then
# names its libraries there, `(deleted)` once pip is done: they are torch's, replaced.
_STASH_FILLER = set("-~.=%0123456789")


def _is_torch_stash(folder: str) -> bool:
    return (len(folder) == len("torch") and folder[0] == "~"
            and any(folder[i:] == "torch"[i:] and set(folder[1:i]) <= _STASH_FILLER for i in range(1, len("torch"))))


def _unstashed(path: str) -> str | None:
    """A torch library's path in pip's stash spelled at its torch path, or None."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        if part.startswith("~") and _is_torch_stash(part):
            candidate = "/".join([*parts[:i], "torch", *parts[i + 1:]])
            if _TORCH_LIB.match(candidate) or _TORCH_C.match(candidate):
                return candidate
    return None


def mapped(maps_text: str) -> dict[str, bool]:
    """Every file path in maps text (the sixth column), in order of first appearance, each
    once: whether it was deleted (or replaced) on disk since it was mapped. One pass gives
    both the files and the replaced ones (serve reads every torch process's maps each run).
    A file in pip's stash of torch (`~orch/...`) is named at its torch path, replaced."""
    seen: dict[str, bool] = {}
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            path = parts[5]
            deleted = path.endswith(_DELETED)
            if deleted:
                path = path[: -len(_DELETED)]
            if "/~" in path:
                moved = _unstashed(path)
                if moved is not None:
                    path, deleted = moved, True
            if deleted:
                seen[path] = True
            elif path not in seen:
                seen[path] = False
    return seen


def torch_dirs_from_maps(files: Iterable[str]) -> list[str]:
    """torch package folders whose libraries are mapped, libtorch_python.so's first."""
    ranked: dict[str, int] = {}
    for path in files:
        m = _TORCH_LIB.match(path) or _TORCH_C.match(path)
        if m:
            rank = 0 if path.endswith("libtorch_python.so") else 1
            ranked[m.group("torch")] = min(rank, ranked.get(m.group("torch"), rank))
    return sorted(ranked, key=lambda d: ranked[d])


def site_dirs_from_maps(files: Iterable[str]) -> list[str]:
    """site-packages folders of the extension modules a process has mapped."""
    out: dict[str, None] = {}
    for path in files:
        m = _SITE.match(path)
        if m:
            out.setdefault(m.group("site"), None)
    return list(out)


def _lib_python_dirs(prefix: str, host: Callable[[str], Path]) -> list[str]:
    """PREFIX/lib/python3.X/site-packages (and dist-packages), for every X present."""
    out = []
    for lib in ("lib", "lib64"):
        try:
            names = _python_names(host(f"{prefix}/{lib}"))
        except OSError:
            continue
        for name in names:
            for leaf in ("site-packages", "dist-packages"):
                out.append(f"{prefix}/{lib}/{name}/{leaf}")
    return out


# serve looks for torch in every process that has not mapped it, every run, and
# /usr/lib lists hundreds of names: a directory's python3* names are kept while its
# (device, inode, mtime) stay the same, which any entry added or removed changes.
_NAMES_KEPT = 256
_python_names_kept: dict[tuple[int, int, int], list[str]] = {}


def _python_names(lib: Path) -> list[str]:
    """The python3* entries of `lib`, newest first."""
    st = os.stat(lib)
    key = (st.st_dev, st.st_ino, st.st_mtime_ns)
    names = _python_names_kept.get(key)
    if names is None:
        names = sorted((name for name in os.listdir(lib) if name.startswith("python3")), reverse=True)
        if len(_python_names_kept) >= _NAMES_KEPT:
            _python_names_kept.clear()
        _python_names_kept[key] = names
    return list(names)


def _pyvenv(prefix: str, host: Callable[[str], Path]) -> dict[str, str] | None:
    from envdoctor.torchfacts.metadata import read_head

    data = read_head(host(f"{prefix}/pyvenv.cfg"), 64 * 1024)
    if data is None:
        return None
    text = data.decode("utf-8", "replace")
    cfg = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            cfg[key.strip().lower()] = value.strip()
    return cfg


def interpreter_site_dirs(python: str, host: Callable[[str], Path], resolve: Callable[[str], str]) -> list[str]:
    """The site directories `python` would search, from its files (no interpreter started).

    `python` is the path as given (a venv's bin/python is a symlink to the base
    interpreter, and it is the link's location that selects the venv);
    `resolve` follows links as the target sees them.
    """
    dirs: list[str] = []
    prefix = os.path.dirname(os.path.dirname(python))
    venv = _pyvenv(prefix, host)
    if venv is not None:
        dirs += _lib_python_dirs(prefix, host)
        if venv.get("include-system-site-packages", "false").lower() != "true":
            return dirs
        home = venv.get("home")
        if home:
            dirs += _lib_python_dirs(os.path.dirname(home.rstrip("/")), host)
        return dirs
    real = resolve(python)
    for candidate in dict.fromkeys([prefix, os.path.dirname(os.path.dirname(real))]):
        dirs += _lib_python_dirs(candidate, host)
    version = re.search(r"python(3\.\d+)", os.path.basename(real))
    if real.startswith("/usr/") and version:
        # Debian's interpreter also searches these (site.py patched by the distro)
        dirs += [f"/usr/local/lib/python{version.group(1)}/dist-packages", "/usr/lib/python3/dist-packages"]
    return list(dict.fromkeys(dirs))


def find_torch(site_dirs: Iterable[str], host: Callable[[str], Path]) -> str | None:
    """The first site directory's torch folder holding version.py, as import would pick it."""
    for site in site_dirs:
        try:
            if site and host(f"{site}/torch/version.py").is_file():
                return f"{site}/torch"
        except OSError:  # a directory we may not enter is one import could not use either
            continue
    return None
