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


def unresolved(torch_dir: str, sites: list[str]) -> dict[str, str]:
    """{library: the torch library that needs it} for each library found in none of the
    loader's places but LD_LIBRARY_PATH, nor where torch's own preload looks in `sites`
    (the site folders this interpreter has besides PYTHONPATH)."""
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
        rpath = [_expand(p, origin) for p in rpath]
        chain = [] if runpath else rpath + inherited  # RPATH counts, its loaders' too, only without RUNPATH
        dirs = [_expand(p, origin) for p in runpath] if runpath else chain
        for soname in needed:
            if "/" in soname:
                continue
            found = next((os.path.join(d, soname) for d in dirs if os.path.exists(os.path.join(d, soname))), None)
            if found is not None:
                if os.path.realpath(os.path.dirname(found)) == lib_dir:
                    todo.append((found, chain))
            elif not (_in_cache(cache, soname) or any(os.path.exists(os.path.join(d, soname)) for d in SYSTEM_DIRS)
                      or preloaded_from(sites, soname)):
                out.setdefault(soname, os.path.basename(path))
    return out


def preloaded_from(sites: list[str], soname: str) -> str | None:
    """Where torch's __init__ would load `soname` from: `nvidia/*/lib/` of a folder on sys.path."""
    for site in sites:
        for match in glob.glob(os.path.join(glob.escape(site), "nvidia", "*", "lib", glob.escape(soname))):
            return match
    return None


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
    venv = re.match(r"^(.*)/lib(?:64)?/python(\d+\.\d+)/site-packages$", site)
    if venv:
        cfg = _read_text(os.path.join(venv.group(1), "pyvenv.cfg"))
        home = re.search(r"^\s*home\s*=\s*(.+?)\s*$", cfg, re.M)
        system = re.search(r"^\s*include-system-site-packages\s*=\s*true\s*$", cfg, re.M | re.I)
        if home and system:
            base = os.path.dirname(home.group(1))
            out += [f"{base}/{lib}/python{venv.group(2)}/{kind}" for lib in ("lib", "lib64")
                    for kind in ("site-packages", "dist-packages")]
    return out


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
