"""Whether the envdoctor a benchmark times is an editable install, which a user's is not.

An editable install (`pip install -e .`) puts a finder on every start of its venv's
interpreter (a .pth file that imports pathlib, importlib.util and friends before
`site` is done): measured here, `python -c pass` took 14 ms in the repository's
editable .venv against 6 ms in a regular one, and a warm `envdoctor check` about
5 ms more. The start-up benchmarks say so beside their figures, so a figure from a
developer's venv is not reported as a user's.
"""

from __future__ import annotations

import json
import subprocess

_ASK = ("import importlib.metadata as m\n"
        "try:\n    print(m.distribution('envdoctor').read_text('direct_url.json') or '')\n"
        "except m.PackageNotFoundError:\n    print('')\n")


def editable_note(python: str) -> str | None:
    """One line when `python`'s envdoctor is an editable install (PEP 610's direct_url.json
    says `"editable": true`), else None."""
    try:
        out = subprocess.run([python, "-c", _ASK], capture_output=True, text=True, timeout=60).stdout
        editable = bool(json.loads(out).get("dir_info", {}).get("editable")) if out.strip() else False
    except (OSError, subprocess.SubprocessError, ValueError, AttributeError):
        return None
    if not editable:
        return None
    return (f"note: {python} runs an editable envdoctor, whose finder every start pays and a user's "
            "install does not; for a user's figures pass --python of a regular install "
            "(python3 -m venv V && V/bin/pip install 'torch==2.13.0' '.[torch,onnx]')")
