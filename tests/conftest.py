"""Shared test helpers: running the CLI as a user would, the example plug-in
installed for real, and golden files with an update flag."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
REPO = TESTS.parent


def pytest_configure(config):
    """Every envdoctor the suite runs, in-process or as a child, caches under a directory
    of this test process's own, removed at the end: the suite used to leave hundreds of
    entries in the user's ~/.cache/envdoctor (one per scratch search path)."""
    cache_home = tempfile.mkdtemp(prefix="envdoctor-test-cache-")
    config._envdoctor_cache_home = (cache_home, os.environ.get("XDG_CACHE_HOME"))
    os.environ["XDG_CACHE_HOME"] = cache_home


def pytest_unconfigure(config):
    cache_home, before = getattr(config, "_envdoctor_cache_home", (None, None))
    if cache_home is None:
        return
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before
    shutil.rmtree(cache_home, ignore_errors=True)


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/* from the current output")


@pytest.fixture
def update_golden(request) -> bool:
    return request.config.getoption("--update-golden")


@pytest.fixture(scope="session")
def plugin_path(tmp_path_factory) -> Path:
    """The example plug-in package, built and installed by pip into its own directory.

    Putting that directory on PYTHONPATH makes its entry points visible exactly as
    an installed third-party distribution's would be, without touching the venv.
    """
    target = tmp_path_factory.mktemp("plugin-site")
    # Build from a private copy: setuptools writes build/ and *.egg-info into the source
    # tree, and parallel test workers installing from one tree corrupt each other's build.
    source = tmp_path_factory.mktemp("plugin-src") / "plugin_example"
    shutil.copytree(TESTS / "plugin_example", source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, text=True)
    return target


@pytest.fixture
def plugin_env(plugin_path) -> dict:
    existing = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": str(plugin_path) + (os.pathsep + existing if existing else "")}
