"""What `import torch` needs the dynamic loader to find, and what it would not.

torch's extension module loads libtorch_python.so, which needs libtorch.so,
libtorch_cuda.so, and for a CUDA wheel the libraries of the nvidia-* wheels it pins
(libcudnn.so.9, libnccl.so.2, libcublas...), found through its RUNPATH
(`$ORIGIN/../../nvidia/cudnn/lib`...). An uninstalled nvidia-cudnn package, or a
torch/lib folder half deleted, makes `import torch` fail on every node ("libcudnn.so.9:
cannot open shared object file"), while every version file still reads well
(helper-86: cuda.runtime said ok). Read here as the loader searches, without loading
anything: the libraries' DT_NEEDED and RUNPATH (envdoctor.torchfacts.elf), then the
ld.so cache and the system folders. LD_LIBRARY_PATH is the target's environment's,
applied by the check (these facts are cached per installation).
"""

from __future__ import annotations

import os
import re

from envdoctor.torchfacts import elf

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Callable

START = "libtorch_python.so"  # what torch/_C*.so loads first
MAX_LIBRARIES = 32  # of torch's own folder, followed from START (a wheel's chain is ~8)
MAX_CACHE = 16 * 1024 * 1024  # bytes of /etc/ld.so.cache read (a real one is ~100 KB)
SYSTEM_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
               "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu")


def missing_files(torch_dir: str, host: Callable[[str], Path], cuda: bool) -> list[str]:
    """The files every `import torch` opens that are not there (a partial install)."""
    missing = [name for name in ("__init__.py", f"lib/{START}") + (("lib/libtorch_cuda.so",) if cuda else ())
               if not host(f"{torch_dir}/{name}").is_file()]
    try:
        has_c = any(n.startswith("_C.") and n.endswith(".so") for n in os.listdir(host(torch_dir)))
    except OSError:
        has_c = False
    return (["_C*.so"] if not has_c else []) + missing


def unresolved(torch_dir: str, host: Callable[[str], Path]) -> dict[str, str]:
    """{library: the torch library that needs it} for each library the loader finds in none
    of its places but LD_LIBRARY_PATH: the needing file's RUNPATH, the ld.so cache, the
    system folders. Followed from libtorch_python.so through torch's own folder."""
    lib_dir = os.path.normpath(f"{torch_dir}/lib")
    cache = _ld_cache(host)
    todo, seen, out = [START], set(), {}
    while todo and len(seen) < MAX_LIBRARIES:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        needs = elf.dynamic_needs(host(f"{lib_dir}/{name}"))
        if needs is None:
            continue
        needed, paths = needs
        dirs = [os.path.normpath(p.replace("${ORIGIN}", lib_dir).replace("$ORIGIN", lib_dir)) for p in paths]
        for soname in needed:
            if "/" in soname:
                continue
            found = next((d for d in dirs if host(f"{d}/{soname}").exists()), None)
            if found == lib_dir:
                todo.append(soname)
            elif found is None and not _in_cache(cache, soname) and not any(
                    host(f"{d}/{soname}").exists() for d in SYSTEM_DIRS):
                out.setdefault(soname, name)
    return out


def _ld_cache(host: Callable[[str], Path]) -> bytes:
    try:
        with open(host("/etc/ld.so.cache"), "rb") as f:
            return f.read(MAX_CACHE)
    except OSError:
        return b""


def _in_cache(cache: bytes, soname: str) -> bool:
    """Whether ld.so.cache lists `soname`: its string table holds each name, and each path,
    ending in NUL (a name after a NUL or a '/')."""
    return re.search(rb"[\x00/]" + re.escape(soname.encode()) + rb"\x00", cache) is not None
