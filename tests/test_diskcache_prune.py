"""The cache directory stays bounded: a write removes its kind's entries that can no
longer be hits (too old), and all but the newest few, and nothing else.

Before this, every interpreter and search path left an entry of its own for good:
one run of the test suite left 434 files in root's ~/.cache/envdoctor."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envdoctor import diskcache

HOUR = 3600.0


def _entry(directory: Path, name: str, age_seconds: float, now: float) -> Path:
    path = directory / name
    path.write_text("{}")
    os.utime(path, (now - age_seconds, now - age_seconds))
    return path


def test_a_write_removes_expired_entries_of_its_kind_and_keeps_fresh_ones(tmp_path):
    now = time.time()
    expired = [_entry(tmp_path, f"entry-points-{i:04x}.json", 25 * HOUR + i, now) for i in range(5)]
    fresh = [_entry(tmp_path, f"entry-points-{i:04x}.json", 60 * i, now) for i in range(100, 105)]
    other_kind = _entry(tmp_path, "torch-probe-00aa.json", 48 * HOUR, now)

    assert diskcache.write(tmp_path / "entry-points-ffff.json", "s/v1", ["key"], {"a": 1})

    assert not any(p.exists() for p in expired)
    assert all(p.exists() for p in fresh)
    assert other_kind.exists(), "an entry of another kind is that kind's own write to prune"
    assert diskcache.read(tmp_path / "entry-points-ffff.json", "s/v1", ["key"]) == {"a": 1}


def test_only_the_newest_entries_of_a_kind_stay(tmp_path):
    now = time.time()
    paths = [_entry(tmp_path, f"torch-probe-{i:04x}.json", 10.0 * i, now) for i in range(50)]

    written = tmp_path / "torch-probe-ffff.json"
    assert diskcache.write(written, "s/v1", 1, {})

    kept = sorted(tmp_path.glob("torch-probe-*.json"))
    assert len(kept) == diskcache.KEEP_PER_KIND
    assert written in kept
    # the youngest others (ages 0, 10, ... s) are the ones kept
    assert set(kept) - {written} == set(paths[: diskcache.KEEP_PER_KIND - 1])


def test_prune_leaves_foreign_names_directories_and_symlinks_alone(tmp_path):
    now = time.time()
    victim = tmp_path / "precious.json"
    victim.write_text("keep me")
    os.utime(victim, (now - 90 * 24 * HOUR,) * 2)
    link = tmp_path / "entry-points-0bad.json"
    link.symlink_to(victim)
    hook = tmp_path / "attach-hook-0123456789abcdef"
    hook.mkdir()
    os.utime(hook, (now - 90 * 24 * HOUR,) * 2)
    near_misses = [_entry(tmp_path, name, 90 * 24 * HOUR, now) for name in (
        "entry-points-XYZ.json",           # not hex
        "entry-points-00.json.bak",        # not ours
        ".entry-points-00.json",           # a dot but no .tmp: not write_atomic's
        "my-entry-points-00.json",         # another prefix
    )]

    assert diskcache.prune(tmp_path / "entry-points-ffff.json", now=now) == 0

    assert victim.read_text() == "keep me"
    assert link.is_symlink()
    assert hook.is_dir()
    assert all(p.exists() for p in near_misses)


def test_a_dead_writers_temporary_file_goes_a_live_ones_stays(tmp_path):
    now = time.time()
    dead = _entry(tmp_path, ".onnx-stack-00ab.json.k2j4x9.tmp", 10 * 60, now)
    live = _entry(tmp_path, ".onnx-stack-00cd.json.p0q1r2.tmp", 0.5, now)

    assert diskcache.prune(tmp_path / "onnx-stack-ffff.json", now=now) == 1

    assert not dead.exists()
    assert live.exists()


def test_an_entry_dated_in_the_future_goes(tmp_path):
    now = time.time()
    future = _entry(tmp_path, "onnx-stack-0001.json", -2 * HOUR, now)  # a clock set back since
    assert diskcache.prune(tmp_path / "onnx-stack-ffff.json", now=now) == 1
    assert not future.exists()


def test_prune_of_a_missing_or_unreadable_directory_is_nothing(tmp_path):
    assert diskcache.prune(tmp_path / "absent" / "entry-points-ffff.json") == 0
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        # root reads a 0o000 directory anyway; either way prune answers a count
        assert diskcache.prune(locked / "entry-points-ffff.json") == 0
    finally:
        locked.chmod(0o700)


def test_the_cli_prunes_a_littered_cache_directory(tmp_path):
    """A real `envdoctor checks` whose entry-points cache misses (a search path it has not
    seen) writes its entry and leaves the directory at the bound."""
    cache = tmp_path / "xdg" / "envdoctor"
    cache.mkdir(parents=True)
    now = time.time()
    expired = [_entry(cache, f"entry-points-{i:04x}.json", 30 * HOUR, now) for i in range(300)]
    fresh = [_entry(cache, f"entry-points-{i:04x}.json", 1.0 * i, now) for i in range(1000, 1060)]
    unrelated = _entry(cache, "torch-probe-0001.json", 30 * HOUR, now)
    scratch = tmp_path / "scratch"  # a new sys.path entry: the CLI's cache file is a new name
    scratch.mkdir()

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(scratch)}
    env.pop("ENVDOCTOR_NO_CACHE", None)
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "checks"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr

    left = sorted(cache.glob("entry-points-*.json"))
    assert len(left) == diskcache.KEEP_PER_KIND
    assert not any(p.exists() for p in expired)
    assert set(fresh[: diskcache.KEEP_PER_KIND - 1]) <= set(left)
    assert unrelated.exists()


def test_a_missing_home_is_never_created(tmp_path):
    """With HOME=/nonexistent (nobody's) a write made /nonexistent/.cache/envdoctor."""
    home = tmp_path / "no-such-home"
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    env["HOME"] = str(home)
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "checks"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert not home.exists()

    existing = tmp_path / "home"
    existing.mkdir()
    env["HOME"] = str(existing)
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "checks"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert list((existing / ".cache" / "envdoctor").glob("entry-points-*.json")), "an existing home is used"


def test_an_xdg_cache_home_under_a_missing_home_is_not_created(tmp_path):
    """XDG_CACHE_HOME=/missing/home/.cache made the home too (helper-20); its own last
    directory may be made, as the XDG spec asks."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "nohome" / ".cache"), "HOME": str(tmp_path / "nohome")}
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "checks"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0 and not (tmp_path / "nohome").exists(), proc.stderr
    (tmp_path / "home").mkdir()
    env["XDG_CACHE_HOME"] = str(tmp_path / "home" / "cache")
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "checks"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0 and list((tmp_path / "home" / "cache" / "envdoctor").glob("entry-points-*"))


@pytest.mark.parametrize("home", [".", "rel"])
def test_a_relative_home_is_no_place_for_a_cache(tmp_path, home):
    """HOME=. wrote ./.cache/envdoctor into whatever the working directory was (helper-21)."""
    (tmp_path / "rel").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    env["HOME"] = home
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "checks"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not list(tmp_path.rglob(".cache")), list(tmp_path.rglob("*"))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act with another user's HOME")
def test_root_with_another_users_home_leaves_nothing_of_its_own_there(tmp_path):
    """`sudo` without -H keeps the user's HOME: root's cache directories (0700, root's)
    in it locked the user out of their own cache (helper-21)."""
    home = tmp_path / "alice"
    (home / ".cache").mkdir(parents=True)
    for d in (home, home / ".cache"):
        os.chown(d, 65534, 65534)
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    env["HOME"] = str(home)
    proc = subprocess.run([sys.executable, "-m", "envdoctor", "checks"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert list((home / ".cache").iterdir()) == []


@pytest.mark.parametrize("plant", ["fifo", "zero", "deep", "huge", "link"])
def test_a_planted_entry_is_a_quick_miss(tmp_path, plant):
    """What sits where an entry should be, put there by a tool gone wrong or by hand:
    a FIFO nobody writes to (it hung the read), a link to /dev/zero (memory grew without
    end), JSON nested 100,000 deep (RecursionError), a 120 MB file, a link to a good
    entry elsewhere. Each is a miss, at once; the next write replaces it."""
    good = diskcache.write(tmp_path / "elsewhere" / "pin-memory-0000.json", "s/v1", ["key"], {"a": 1})
    assert good
    path = tmp_path / "pin-memory-00aa.json"
    if plant == "fifo":
        os.mkfifo(path)
    elif plant == "zero":
        path.symlink_to("/dev/zero")
    elif plant == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif plant == "huge":
        path.write_text('{"schema": "s/v1", "facts": {"a": "' + "x" * (120 * 1024 * 1024) + '"}}')
    else:
        path.symlink_to(tmp_path / "elsewhere" / "pin-memory-0000.json")
    started = time.monotonic()
    assert diskcache.read(path, "s/v1", ["key"]) is None
    assert time.monotonic() - started < 5
    assert diskcache.write(path, "s/v1", ["key"], {"b": 2})  # replaces the name, never writes through it
    assert diskcache.read(path, "s/v1", ["key"]) == {"b": 2}
    assert path.is_file() and not path.is_symlink()
    assert diskcache.read(tmp_path / "elsewhere" / "pin-memory-0000.json", "s/v1", ["key"]) == {"a": 1}


def test_an_empty_home_is_no_home_at_the_root():
    """Helper-41: with HOME='' Python's Path.home() is '/', and `exec --attach` made
    /.cache/envdoctor/attach-hook-* at the file system's root. An empty HOME is read as
    an unset one: the user's home from the password database."""
    import pwd

    from envdoctor import diskcache

    home = pwd.getpwuid(os.getuid()).pw_dir
    assert diskcache.cache_dir({"HOME": ""}) == Path(home) / ".cache" / "envdoctor"
    assert diskcache.cache_dir({"HOME": "", "XDG_CACHE_HOME": "/x/cache"}) == Path("/x/cache/envdoctor")
    assert diskcache.cache_dir({"HOME": "/h"}) == Path("/h/.cache/envdoctor")
