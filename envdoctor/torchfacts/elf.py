"""The CUDA architectures a torch build carries, read from its shared libraries.

`torch.cuda.get_arch_list()` is `torch._C._cuda_getArchFlags().split()`, and that
string is a compile-time constant (TORCH_CUDA_ARCH_LIST turned into
"sm_75 sm_80 sm_86 sm_90 sm_100 sm_120") stored NUL-terminated in
libtorch_python.so's .rodata: one short string, found here without loading the
library. libtorch_cuda.so's .rodata also holds the nvcc flags the build used
("-gencode;arch=compute_75,code=sm_75;..."), a second witness and the fallback
when libtorch_python.so has no arch string (builds that moved it).

Both readers read only the .rodata section (about 1 MiB of a 32 MiB
libtorch_python.so, 9 MiB of a 470 MiB libtorch_cuda.so), a chunk at a time, never
more than MAX_SCAN bytes. A file that is not ELF (a test stub, a truncated copy) is scanned
from its start, bounded the same way. Nothing here raises on a bad file: it
answers None.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from pathlib import Path

MAX_SCAN = 64 * 1024 * 1024
MAX_NAMES = 1024 * 1024  # of the section-name table (a real one is ~500 bytes)
CHUNK = 4 * 1024 * 1024  # read at a time: the memory a scan holds, whatever the section's size
OVERLAP = 64 * 1024  # longer than any arch string or -gencode run
MAX_MATCHES = 1024  # a real .rodata has one arch list and a few stray tokens; a crafted file
# of 13 million "\0sm_1" took 16 s and 1.7 GB to list them all (helper-21)

# One whole NUL-terminated string made only of arch tokens: "sm_90", "sm_90a", "compute_90".
_ARCH_STRING = re.compile(rb"\x00((?:sm|compute)_\d+[a-z]?(?: (?:sm|compute)_\d+[a-z]?)*)(?=\x00)")
_GENCODE = re.compile(rb"(?:-gencode[;= ]arch=compute_\d+[a-z]?,code=(?:sm|compute)_\d+[a-z]?[; ]?)+")
_GENCODE_CODE = re.compile(rb"code=((?:sm|compute)_\d+[a-z]?)")


def _read(fd: int, size: int, offset: int) -> bytes:
    """Up to `size` bytes at `offset`; fewer (or none) where the file ends, or shrank."""
    return os.pread(fd, max(0, size), offset) if offset >= 0 else b""


def _section(fd: int, file_size: int, name: bytes) -> tuple[int, int] | None:
    """(offset, size) of the section called `name` in an ELF file, or None (then the
    caller scans the file's start): offsets and sizes are the file's own word, and an
    offset past 2**63 or an entry size that makes the table 256 MiB is only a bad file."""
    try:
        return _find_section(fd, file_size, name)
    except (OSError, OverflowError, ValueError, struct.error, IndexError):
        return None


def _find_section(fd: int, file_size: int, name: bytes) -> tuple[int, int] | None:
    header = _read(fd, 64, 0)
    if len(header) < 64 or header[:4] != b"\x7fELF":
        return None
    klass, data = header[4], header[5]
    end = "<" if data == 1 else ">"
    try:
        if klass == 2:
            shoff, = struct.unpack_from(end + "Q", header, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", header, 0x3A)
            fmt, off_at, entry = end + "IIQQQQ", (4, 5), 64
        elif klass == 1:
            shoff, = struct.unpack_from(end + "I", header, 0x20)
            shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", header, 0x2E)
            fmt, off_at, entry = end + "IIIIII", (4, 5), 40
        else:
            return None
        if shentsize != entry:  # the ELF spec's size; anything else is not a table we can read
            return None
        if not shoff or not shnum or shstrndx >= shnum or shoff + shnum * shentsize > file_size:
            return None
        count = min(shnum, 4096)
        table = _read(fd, count * shentsize, shoff)
        headers = [struct.unpack_from(fmt, table, i * shentsize) for i in range(count)]
        strtab_off, strtab_size = headers[shstrndx][off_at[0]], headers[shstrndx][off_at[1]]
        names = _read(fd, min(strtab_size, MAX_NAMES), strtab_off)
        for h in headers:
            stop = names.find(b"\x00", h[0])
            if h[0] < len(names) and stop >= 0 and names[h[0]:stop] == name:
                offset, size = h[off_at[0]], h[off_at[1]]
                if offset + size <= file_size:
                    return offset, size
    except (struct.error, IndexError):
        return None
    return None


def _scan(path: Path, pattern: re.Pattern, section: bytes = b".rodata") -> list[bytes]:
    """Every match of `pattern` in the file's `section` (or its start, if not ELF).

    Read with pread, a chunk at a time, never mapped: a mapped file that its owner
    truncates under us (any user's job is a target of serve) kills the reader with
    SIGBUS, which no Python code can catch. A file that shrinks now just ends early."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)  # a FIFO must not block us
    except (OSError, ValueError):
        return []
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return []
        where = _section(fd, st.st_size, section) or (0, st.st_size)
        # step back one byte so a string at the very start of the section still has its leading NUL
        start = max(0, where[0] - 1)
        return _matches(fd, pattern, start, start + min(where[1], MAX_SCAN) + 1)
    except (OSError, ValueError):
        return []
    finally:
        os.close(fd)


def _matches(fd: int, pattern: re.Pattern, start: int, end: int) -> list[bytes]:
    """The matches in [start, end), read CHUNK bytes at a time. Each read runs OVERLAP
    bytes past its chunk, and a chunk keeps only matches that start inside it, so a
    match across a boundary (all are far shorter than OVERLAP) is found whole, once."""
    found: list[bytes] = []
    for pos in range(start, end, CHUNK):
        data = _read(fd, min(end, pos + CHUNK + OVERLAP) - pos, pos)
        last = pos + CHUNK >= end or len(data) <= CHUNK
        for m in pattern.finditer(data):
            if last or m.start() < CHUNK:
                found.append(m.group(0))
                if len(found) >= MAX_MATCHES:  # a file made of arch tokens is no library: no answer
                    return []
        if len(data) <= CHUNK:  # the end of the file (or it shrank): nothing after this
            break
    return found


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


MAX_DYNAMIC = 64 * 1024  # bytes of .dynamic read (a real one is ~1 KiB: ~60 entries of 16 bytes)
MAX_NAME = 4096  # bytes of one library name or search path
DT_NULL, DT_NEEDED, DT_RPATH, DT_RUNPATH = 0, 1, 15, 29


def dynamic_needs(path: Path) -> tuple[list[str], list[str], list[str]] | None:
    """(the libraries `path` needs, by soname; its RUNPATH folders; its RPATH folders; as
    written, `$ORIGIN` left in): what the dynamic loader must find before `import torch`
    can load it, read from the file's .dynamic and .dynstr sections without loading it.
    None where the file is missing, not ELF, or its sections cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        header = _read(fd, 6, 0)
        if len(header) < 6 or header[:4] != b"\x7fELF":
            return None
        wide, end = header[4] == 2, "<" if header[5] == 1 else ">"
        dynamic, strings = _section(fd, st.st_size, b".dynamic"), _section(fd, st.st_size, b".dynstr")
        if dynamic is None or strings is None:
            return None
        table = _read(fd, min(dynamic[1], MAX_DYNAMIC), dynamic[0])
        entry = struct.Struct(end + ("qQ" if wide else "iI"))
        needed, runpath, rpath = [], [], []
        for at in range(0, len(table) - entry.size + 1, entry.size):
            tag, value = entry.unpack_from(table, at)
            if tag == DT_NULL:
                break
            if tag in (DT_NEEDED, DT_RUNPATH, DT_RPATH) and value < strings[1]:
                # each string read on its own: libtorch_cpu.so's .dynstr holds ~30 MB of symbol names
                raw = _read(fd, MAX_NAME, strings[0] + value)
                text = raw[:raw.find(b"\x00") if b"\x00" in raw else len(raw)].decode("utf-8", "replace")
                if tag == DT_NEEDED:
                    needed.append(text)
                else:
                    (runpath if tag == DT_RUNPATH else rpath).extend(p for p in text.split(":") if p)
        return needed, runpath, rpath
    except (OSError, ValueError, struct.error):
        return None
    finally:
        os.close(fd)
