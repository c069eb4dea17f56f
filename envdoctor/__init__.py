"""envdoctor: catch the CUDA and system-environment problems that waste GPU training runs.

`import envdoctor` is cheap: it imports neither torch nor NVML. `envdoctor.preflight()`
checks a training script's live settings from inside the script.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "preflight", "PreflightError"]


def __getattr__(name: str) -> Any:
    # preflight lives in envdoctor.inprocess (it pulls in the runner and the checks); keep it
    # off the import path of `envdoctor` so `import envdoctor` stays cheap.
    if name in ("preflight", "PreflightError"):
        import importlib

        return getattr(importlib.import_module("envdoctor.inprocess"), name)
    raise AttributeError(f"module 'envdoctor' has no attribute {name!r}")
