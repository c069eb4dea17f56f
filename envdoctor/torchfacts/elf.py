"""The CUDA architectures a torch build carries, read from its shared libraries.

`torch.cuda.get_arch_list()` is `torch._C._cuda_getArchFlags().split()`, and that
string is a compile-time constant (TORCH_CUDA_ARCH_LIST turned into
"sm_75 sm_80 sm_86 sm_90 sm_100 sm_120") stored NUL-terminated in
libtorch_python.so's .rodata: one short string, found here without loading the
library. libtorch_cuda.so's .rodata also holds the nvcc flags the build used
("-gencode;arch=compute_75,code=sm_75;..."), a second witness and the fallback
when libtorch_python.so has no arch string (builds that moved it).

Both readers map the file and scan only the .rodata section (about 1 MiB of a
32 MiB libtorch_python.so, 9 MiB of a 470 MiB libtorch_cuda.so), never more than
MAX_SCAN bytes. A file that is not ELF (a test stub, a truncated copy) is scanned
from its start, bounded the same way. Nothing here raises on a bad file: it
answers None.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
import struct
from pathlib import Path

MAX_SCAN = 64 * 1024 * 1024

# One whole NUL-terminated string made only of arch tokens: "sm_90", "sm_90a", "compute_90".
_ARCH_STRING = re.compile(rb"\x00((?:sm|compute)_\d+[a-z]?(?: (?:sm|compute)_\d+[a-z]?)*)(?=\x00)")
_GENCODE = re.compile(rb"(?:-gencode[;= ]arch=compute_\d+[a-z]?,code=(?:sm|compute)_\d+[a-z]?[; ]?)+")
_GENCODE_CODE = re.compile(rb"code=((?:sm|compute)_\d+[a-z]?)")


def _section(mm: mmap.mmap, name: bytes) -> tuple[int, int] | None:
    """(offset, size) of the section called `name` in an ELF file, or None."""
    if mm.size() < 64 or mm[:4] != b"\x7fELF":
        return None
    klass, data = mm[4], mm[5]
    end = "<" if data == 1 else ">"
    try:
        if klass == 2:
            shoff, = struct.unpack_from(end + "Q", mm, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", mm, 0x3A)
            fmt, off_at = end + "IIQQQQ", (4, 5)
        elif klass == 1:
            shoff, = struct.unpack_from(end + "I", mm, 0x20)
            shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", mm, 0x2E)
            fmt, off_at = end + "IIIIII", (4, 5)
        else:
            return None
        if not shoff or not shnum or shstrndx >= shnum or shoff + shnum * shentsize > mm.size():
            return None
        headers = [struct.unpack_from(fmt, mm, shoff + i * shentsize) for i in range(min(shnum, 4096))]
        strtab_off, strtab_size = headers[shstrndx][off_at[0]], headers[shstrndx][off_at[1]]
        for h in headers:
            start = strtab_off + h[0]
            if start >= strtab_off + strtab_size:
                continue
            stop = mm.find(b"\x00", start, strtab_off + strtab_size)
            if stop >= 0 and mm[start:stop] == name:
                offset, size = h[off_at[0]], h[off_at[1]]
                if offset + size <= mm.size():
                    return offset, size
    except struct.error:
        return None
    return None


def _scan(path: Path, pattern: re.Pattern, section: bytes = b".rodata") -> list[bytes]:
    """Every match of `pattern` in the file's `section` (or its start, if not ELF)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)  # a FIFO must not block us
    except (OSError, ValueError):
        return []
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return []
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
            where = _section(mm, section) or (0, mm.size())
            start, size = where[0], min(where[1], MAX_SCAN)
            # step back one byte so a string at the very start of the section
            # still has its leading NUL
            start = max(0, start - 1)
            return [m.group(0) for m in pattern.finditer(mm, start, start + size + 1)]
    except (OSError, ValueError):
        return []
    finally:
        os.close(fd)


def arch_string(path: Path) -> list[str] | None:
    """The arch list stored in libtorch_python.so, or None when the file has none.

    When several candidate strings are found, the one with the most tokens wins
    (a stray single "sm_80" elsewhere in .rodata is not the build's list).
    """
    found = [m.strip(b"\x00").decode("ascii") for m in _scan(path, _ARCH_STRING)]
    if not found:
        return None
    best = max(found, key=lambda s: len(s.split()))
    if len(best.split()) == 1 and len(set(found)) > 1:
        return None  # several lone tokens: none of them is clearly the list
    return best.split()


def gencode_arches(path: Path) -> list[str] | None:
    """The arch list implied by the nvcc -gencode flags stored in libtorch_cuda.so:
    code=sm_XY is machine code for sm_XY, code=compute_XY is PTX."""
    found = _scan(path, _GENCODE)
    if not found:
        return None
    best = max(found, key=len)
    arches: list[str] = []
    for m in _GENCODE_CODE.finditer(best):
        name = m.group(1).decode("ascii")
        if name not in arches:
            arches.append(name)
    return arches or None
