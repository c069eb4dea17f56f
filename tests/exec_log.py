"""Reading what `envdoctor exec` logs: logfmt lines (envdoctor.log) marked source=envdoctor.exec."""

from __future__ import annotations

import shlex

SOURCE = "envdoctor.exec"


def events(stderr: str) -> list[dict[str, str]]:
    """Every line exec logged, as {key: value}; lines of anyone else (the job) are left out."""
    out = []
    for line in stderr.splitlines():
        if not line.startswith("ts=") or f"source={SOURCE}" not in line:
            continue
        fields = dict(token.split("=", 1) for token in shlex.split(line))
        out.append(fields)
    return out


def messages(stderr: str) -> list[str]:
    return [e["msg"] for e in events(stderr)]


def one(stderr: str, start: str) -> dict[str, str]:
    """The one event whose message starts with `start`."""
    found = [e for e in events(stderr) if e["msg"].startswith(start)]
    assert len(found) == 1, stderr
    return found[0]
