"""envdoctor: catch the CUDA and system-environment problems that waste GPU training runs.

`import envdoctor` is cheap: it imports neither torch nor NVML. `envdoctor.preflight()`
checks a training script's live settings from inside the script; `envdoctor.attach()`
publishes them, every few seconds, for `envdoctor check --pid` and `serve` to read.
"""

from __future__ import annotations

import os

__version__ = "0.1.0"


def _serve_checks_and_exporters_from_a_source_checkout() -> None:
    """In a source checkout, `checks/` and `exporters/` sit beside this package at the
    top of the repository; installed, they are `envdoctor.checks` and
    `envdoctor.exporters`. Adding the repository root to this package's search path
    makes `python -m envdoctor` and `import envdoctor` from the checkout find them
    exactly as an install does. Only where the root really is envdoctor's checkout.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    if (os.path.isfile(os.path.join(root, "checks", "__init__.py"))
            and os.path.isfile(os.path.join(root, "exporters", "__init__.py"))
            and os.path.isfile(os.path.join(root, "pyproject.toml"))
            and root not in __path__):
        __path__.append(root)


_serve_checks_and_exporters_from_a_source_checkout()

__all__ = ["__version__", "preflight", "PreflightError", "attach"]


def __getattr__(name: str) -> object:  # not typing.Any: typing is the largest import `import envdoctor` had
    # preflight lives in envdoctor.inprocess (it pulls in the runner and the checks); keep it
    # off the import path of `envdoctor` so `import envdoctor` stays cheap.
    if name in ("preflight", "PreflightError"):
        import importlib

        return getattr(importlib.import_module("envdoctor.inprocess"), name)
    if name == "attach":
        # envdoctor.attach is a module that is also callable (see its end): the same
        # object whether or not it was imported before, and only the standard library.
        import importlib

        return importlib.import_module("envdoctor.attach")
    raise AttributeError(f"module 'envdoctor' has no attribute {name!r}")
