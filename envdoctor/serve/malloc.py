"""glibc's malloc, told what a long-lived daemon with bursts of work needs.

Python hands objects over 512 bytes (an environment's strings, a maps file's text,
the run's metrics) to the C library's malloc. glibc keeps what is freed for reuse
instead of returning it, and the holes between what is still in use stay resident.
A serve run makes a burst of such allocations from 16 threads at once, then idles
for its interval: measured with 64 targets, the main heap held 12 MiB after a few
runs, 6 MiB once trimmed. Both knobs are glibc's (mallopt, malloc_trim); elsewhere
(musl, macOS) they are absent and these do nothing.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any


M_MMAP_THRESHOLD = -3  # glibc's malloc.h
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's default, fixed
_UNRESOLVED = object()
_libc: Any = _UNRESOLVED


def _glibc() -> Any:
    """The C library if it is glibc (has mallopt and malloc_trim), else None; looked up once.
    Through the symbols this process already has (dlopen(NULL): the interpreter is linked
    against its C library), not ctypes.util.find_library, which runs `ldconfig -p`."""
    global _libc
    if _libc is _UNRESOLVED:
        import ctypes

        try:
            libc = ctypes.CDLL(None)
            _libc = libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
        except (OSError, AttributeError):
            _libc = None
    return _libc


def limit_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas: it makes one per thread that allocates, and a server
    with a thread per connection would otherwise grow its RSS with every burst of
    concurrent scrapes (measured: +5 MiB after 8 concurrent clients)."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_ARENA_MAX, arenas)


def map_large_blocks_apart() -> None:
    """Keep every allocation over 128 KiB in a mapping of its own, returned to the kernel
    when freed. glibc starts so but, each time such a block is freed, raises its threshold
    to that size, so the next run's exposition (~280 KiB with 64 targets), report and
    maps texts came from the heap, leaving holes there between what stayed. Setting the
    threshold turns that adjustment off (mallopt(3)). Measured at 64 targets: 0.27 MiB
    less RSS (three A/B pairs); a few mmap calls a run."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def release_free_memory() -> bool:
    """Give the pages malloc holds free back to the kernel (after a run, before the idle
    interval). True when anything was released. ~1 ms with serve's heap."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
