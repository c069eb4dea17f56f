"""Wait until one descriptor can be read or written, whatever its number.

select.select() refuses a descriptor of 1024 or more (FD_SETSIZE). A process started
with that many open (a launcher that leaks descriptors into its children) got its
pipes numbered above it, and `ValueError: filedescriptor out of range in select()`
ended exec's pre-flight, a report's write or a rank's exchange with a traceback.
poll() has no such limit.
"""

from __future__ import annotations

import math
import select


def ready(fd: int, *, write: bool = False, timeout: float | None = None) -> bool:
    """True once `fd` can be read (or written, `write=True`) without blocking, or has hung
    up or failed (the read or write then says how); False when `timeout` seconds passed
    first. `timeout` None waits as long as it takes."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000))))
