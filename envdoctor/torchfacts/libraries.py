"""What `import torch` needs the dynamic loader to find, and what it would not.

torch's extension module `_C*.so` loads libtorch_python.so, which needs libtorch.so,
libtorch_cuda.so, and for a CUDA wheel the libraries of the nvidia-* wheels it pins
(libcudnn.so.9, libnccl.so.2, libcublas...), found through their RUNPATH
(`$ORIGIN/../../nvidia/cudnn/lib`...). An uninstalled nvidia-cudnn package, or a
torch/lib folder half deleted, makes `import torch` fail on every node ("libcudnn.so.9:
cannot open shared object file"), while every version file still reads well
(helper-86: cuda.runtime said ok).

Read as the loader searches (ld.so(8)), without loading anything: each library's
DT_NEEDED, then its DT_RUNPATH, or where it has none the DT_RPATH of it and of the
libraries that loaded it (conda's builds use RPATH), `$ORIGIN` being the folder the
file was opened in, and `..` after it taken on disk, as the kernel takes it;
then the ld.so cache and the system folders. And as torch itself does when that
fails: `torch/__init__.py` loads each CUDA library from `nvidia/*/lib` of any folder on
`sys.path` (pip puts torch and the nvidia-* wheels in lib64 and lib on some systems)
(helper-87). What the target's environment adds (LD_LIBRARY_PATH, PYTHONPATH) the
check applies: these facts are cached per installation. Only for a torch this process
can open as itself: through /proc/N/root an absolute symlink would be read against
our root, not the target's.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

from envdoctor.torchfacts import elf

MAX_LIBRARIES = 32  # of torch's own folder, followed from _C*.so (a wheel's chain is ~8)
MAX_CACHE = 16 * 1024 * 1024  # bytes of /etc/ld.so.cache read (a real one is ~100 KB)
SYSTEM_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
               "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu")
START = "lib/libtorch_python.so"


def missing_files(torch_dir: str, cuda: bool) -> list[str]:
    """The files every `import torch` opens that are not there (a partial install)."""
    missing = [name for name in ("__init__.py", START) + (("lib/libtorch_cuda.so",) if cuda else ())
               if not os.path.isfile(os.path.join(torch_dir, name))]
    return (["_C*.so"] if not _extension(torch_dir) else []) + missing


def _extension(torch_dir: str) -> str | None:
    try:
        names = os.listdir(torch_dir)
    except OSError:
        return None
    return next((os.path.join(torch_dir, n) for n in sorted(names) if n.startswith("_C.") and n.endswith(".so")), None)


def unresolved(torch_dir: str, sites: list[str], preloaded: set[str] = frozenset()) -> dict[str, str]:
    """{library: the torch library that needs it} for each library found in none of the
    loader's places but LD_LIBRARY_PATH, nor among `preloaded` (LD_PRELOAD's), nor where
    torch's own preload looks in `sites` (the interpreter's sys.path)."""
    lib_dir = os.path.realpath(os.path.join(torch_dir, "lib"))
    cache = _ld_cache()
    first = _extension(torch_dir) or os.path.join(torch_dir, START)
    todo: list[tuple[str, list[str]]] = [(first, [])]
    seen: set[str] = set()
    out: dict[str, str] = {}
    while todo and len(seen) < MAX_LIBRARIES:
        path, inherited = todo.pop(0)
        if os.path.realpath(path) in seen:
            continue
        seen.add(os.path.realpath(path))
        needs = elf.dynamic_needs(path)
        if needs is None:
            continue
        needed, runpath, rpath = needs
        origin = os.path.dirname(path)  # the folder as opened: a symlink's own, as the loader takes it
        chain = [_expand(p, origin) for p in rpath] + inherited  # every loader's RPATH up the chain (glibc's walk)
        dirs = [_expand(p, origin) for p in runpath] if runpath else chain  # RUNPATH: no RPATH at all
        for soname in needed:
            if "/" in soname or soname in preloaded:
                continue
            found = next((os.path.join(d, soname) for d in dirs if os.path.isfile(os.path.join(d, soname))), None)
            if found is not None:
                if os.path.realpath(os.path.dirname(found)) == lib_dir:
                    todo.append((found, chain))
            elif not (_in_cache(cache, soname) or any(os.path.isfile(os.path.join(d, soname)) for d in SYSTEM_DIRS)
                      or preloaded_from(sites, soname)):
                out.setdefault(soname, os.path.basename(path))
    return out


def preloaded_from(sites: list[str], soname: str) -> str | None:
    """Where torch's __init__ would load `soname` from: `nvidia/*/lib/` of a folder on sys.path."""
    for site in sites:
        for match in glob.glob(os.path.join(glob.escape(site), "nvidia", "*", "lib", glob.escape(soname))):
            if os.path.isfile(match):  # a dangling link or a folder of that name loads nothing (helper-88)
                return match
    return None


def search_path(torch_dir: str, python: str | None, env: dict, python_version: str | None) -> list[str]:
    """The interpreter's sys.path as its files say (no interpreter started): PYTHONPATH, its
    site folders (a venv's and, with system site packages, its base's), the user site
    (~/.local, pip --user), torch's own site and its lib/lib64 twin, and the folders their
    `.pth` files add (helper-88: each was a place torch's preload finds nvidia/*/lib)."""
    from envdoctor.torchfacts import locate

    cwd = working_folder()
    dirs = [os.path.join(cwd, d) for d in (env.get("PYTHONPATH") or "").split(":") if d and (cwd or d.startswith("/"))]
    sites = locate.interpreter_site_dirs(python, lambda p: Path(p), os.path.realpath) if python else []
    version = python_version or (re.search(r"python(\d+\.\d+)", torch_dir) or [None, None])[1]
    home = env.get("HOME")
    if home and version and env.get("PYTHONNOUSERSITE") is None and _user_site_enabled(python):
        sites.append(f"{home}/.local/lib/python{version}/site-packages")
    dirs += sites + site_dirs(torch_dir)
    for site in sites:  # Python reads .pth files in its site folders only, not in PYTHONPATH's
        dirs += _pth_folders(site)
    return list(dict.fromkeys(dirs))


def working_folder() -> str:
    """The working folder relative entries are read against; "" where it was removed (a
    relative entry then names nothing, as for the loader)."""
    try:
        return os.getcwd()
    except OSError:
        return ""


def _user_site_enabled(python: str | None) -> bool:
    """Whether `python` searches the user site: not from a venv, unless it includes the
    system site packages (site.py's ENABLE_USER_SITE)."""
    if not python:
        return True
    from envdoctor.torchfacts import locate

    cfg = locate._pyvenv(os.path.dirname(os.path.dirname(python)), Path)
    return cfg is None or cfg.get("include-system-site-packages", "false").lower() == "true"


def _pth_folders(site: str) -> list[str]:
    """The folders a site folder's `.pth` files add (lines that name one; `import` lines run
    code, which is not read here)."""
    try:
        names = sorted(n for n in os.listdir(site) if n.endswith(".pth"))
    except OSError:
        return []
    out = []
    for name in names[:64]:
        for line in _read_text(os.path.join(site, name)).splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "import ", "import\t")):
                folder = os.path.join(site, line)
                if os.path.isdir(folder):
                    out.append(os.path.normpath(folder))
    return out


def preloads(env: dict) -> set[str]:
    """The libraries loaded before any other, by name: LD_PRELOAD's and /etc/ld.so.preload's
    (helper-88: a cuDNN given so was called missing, and exec --strict refused the job)."""
    listed = re.split(r"[\s:]+", env.get("LD_PRELOAD") or "") + re.split(r"\s+", _read_text("/etc/ld.so.preload"))
    return {os.path.basename(item) for item in listed if item}


def site_dirs(torch_dir: str) -> list[str]:
    """The site folders this interpreter also has: torch's own, its lib/lib64 twin (pip
    puts platform wheels in one and pure ones in the other on some systems), and the base
    interpreter's when a venv includes the system site packages."""
    site = os.path.dirname(os.path.normpath(torch_dir))
    out = [site]
    for a, b in (("/lib64/", "/lib/"), ("/lib/", "/lib64/")):
        if a in site + "/":
            out.append((site + "/").replace(a, b, 1).rstrip("/"))
            break
    venv = re.match(r"^(.*)/lib(?:64)?/python\d+\.\d+/site-packages$", site)
    if venv and os.path.isfile(os.path.join(venv.group(1), "pyvenv.cfg")):  # the venv's own folders, and its base's
        from envdoctor.torchfacts import locate

        out += locate.interpreter_site_dirs(f"{venv.group(1)}/bin/python", Path, os.path.realpath)
    return list(dict.fromkeys(out))


def _expand(path: str, origin: str) -> str:
    """`$ORIGIN` put in; `..` left for the kernel, which takes it on disk (helper-87: a
    symlinked torch's `$ORIGIN/../../nvidia` is beside the real folder, not the link)."""
    return path.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(65536)
    except OSError:
        return ""


def _ld_cache() -> bytes:
    try:
        with open("/etc/ld.so.cache", "rb") as f:
            return f.read(MAX_CACHE)
    except OSError:
        return b""


def _in_cache(cache: bytes, soname: str) -> bool:
    """Whether ld.so.cache lists `soname`: its string table holds each name, and each path,
    ending in NUL (a name after a NUL or a '/')."""
    return re.search(rb"[\x00/]" + re.escape(soname.encode()) + rb"\x00", cache) is not None
