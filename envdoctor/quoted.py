"""A value as a summary quotes it: repr, cut to a readable length.

Checks quote the variables they judge (`RANK='1,1,...'`), and an environment value
may be any length: an 82 KB CUDA_VISIBLE_DEVICES made an 82 KB summary (helper-78),
and a 40,000-character RANK filled dist.env's past the runner's cut, hiding the
findings after it (helper-85's cut, the suite's hostile-bytes test).
"""

from __future__ import annotations

SHOWN_CHARS = 200


def quoted_value(raw: str, limit: int = SHOWN_CHARS) -> str:
    """repr(raw), cut after `limit` characters with how much more there was."""
    if len(raw) <= limit:
        return repr(raw)
    return f"{raw[:limit]!r}... ({len(raw) - limit} more characters)"
