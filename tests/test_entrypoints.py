"""The entry-point table cache (envdoctor.entrypoints): the same answer as
importlib.metadata, without importing it on a warm start, and never stale after
an install, an uninstall or a rewritten entry_points.txt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points as live_entry_points

import pytest

from envdoctor import entrypoints

GROUPS = ("envdoctor.checks", "envdoctor.exporters")


def names(eps):
    return [(e.name, e.value) for e in eps]


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("ENVDOCTOR_NO_CACHE", raising=False)
    return tmp_path / "cache" / "envdoctor"


@pytest.mark.parametrize("group", GROUPS)
def test_cold_warm_and_uncached_agree_with_importlib_metadata(group, cache_home, monkeypatch):
    truth = sorted((e.name, e.value) for e in live_entry_points(group=group))
    assert truth  # envdoctor is installed here: its built-ins are registered
    cold = entrypoints.entry_points(group)
    assert list(cache_home.glob("entry-points-*.json"))
    warm = entrypoints.entry_points(group)
    monkeypatch.setenv("ENVDOCTOR_NO_CACHE", "1")
    uncached = entrypoints.entry_points(group)
    assert sorted(names(cold)) == sorted(names(warm)) == sorted(names(uncached)) == truth
    assert all(e.dist is not None and e.dist.name for e in warm)


def plugin(site, version="1.0", entries=("acme.one = acme_plugin:ONE",)):
    dist = site / f"acme_plugin-{version}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: acme-plugin\nVersion: {version}\n")
    (dist / "entry_points.txt").write_text("[envdoctor.checks]\n" + "\n".join(entries) + "\n")
    (site / "acme_plugin.py").write_text("ONE = 'one'\nTWO = 'two'\n")
    return dist


def test_install_rewrite_and_uninstall_are_seen_at_once(tmp_path, cache_home, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    before = names(entrypoints.entry_points("envdoctor.checks"))
    assert ("acme.one", "acme_plugin:ONE") not in before
    dist = plugin(site)
    eps = {e.name: e for e in entrypoints.entry_points("envdoctor.checks")}
    assert eps["acme.one"].load() == "one" and eps["acme.one"].dist.name == "acme-plugin"
    # rewritten in place (same folder, same directory mtime possible): entry_points.txt's stat differs
    (dist / "entry_points.txt").write_text("[envdoctor.checks]\nacme.one = acme_plugin:ONE\nacme.two = acme_plugin:TWO\n")
    assert {"acme.one", "acme.two"} <= {e.name for e in entrypoints.entry_points("envdoctor.checks")}
    for f in dist.iterdir():
        f.unlink()
    dist.rmdir()
    assert names(entrypoints.entry_points("envdoctor.checks")) == before


def test_a_corrupt_cache_file_is_a_miss(cache_home):
    first = names(entrypoints.entry_points("envdoctor.checks"))
    for f in cache_home.glob("entry-points-*.json"):
        f.write_text("{not json")
    assert names(entrypoints.entry_points("envdoctor.checks")) == first
    for f in cache_home.glob("entry-points-*.json"):
        json.loads(f.read_text())  # rewritten whole


@pytest.mark.parametrize("damage", [1, 10**30, [1, 2], [["name-only"]], [[1, 2, 3]], "text"])
def test_a_cache_entry_of_the_wrong_shape_is_a_miss(cache_home, damage):
    """Helper-93: a group's rows replaced by an int (the fingerprint intact) gave every
    command a traceback until the entry expired a day later."""
    first = names(entrypoints.entry_points("envdoctor.checks"))
    for f in cache_home.glob("entry-points-*.json"):
        entry = json.loads(f.read_text())
        entry["facts"]["envdoctor.checks"] = damage
        f.write_text(json.dumps(entry))
    assert names(entrypoints.entry_points("envdoctor.checks")) == first
    for f in cache_home.glob("entry-points-*.json"):  # rewritten whole
        assert json.loads(f.read_text())["facts"]["envdoctor.checks"] != damage


def test_only_envdoctor_groups():
    with pytest.raises(ValueError):
        entrypoints.entry_points("console_scripts")


def test_a_warm_start_does_not_import_importlib_metadata(tmp_path):
    code = textwrap.dedent("""
        import json, sys
        from envdoctor import registry
        reg = registry.load()
        print(json.dumps({"checks": sorted(reg.checks), "metadata": "importlib.metadata" in sys.modules}))
    """)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("ENVDOCTOR_NO_CACHE", None)
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                      cwd=tmp_path, timeout=120, check=True).stdout) for _ in range(2)]
    assert runs[0]["checks"] == runs[1]["checks"] and "shm.size" in runs[1]["checks"]
    assert runs[0]["metadata"] is True and runs[1]["metadata"] is False


def test_a_warm_exec_preflight_does_not_import_hashlib(tmp_path):
    """hashlib maps libcrypto: 3-6 ms of every container start when the cache file's name
    or a check's module imported it at the top (the name is two checksums now)."""
    code = textwrap.dedent("""
        import json, os, sys, time
        from envdoctor.exec_preflight import ExecOptions, in_child
        answer = in_child(ExecOptions(timeout=30.0), dict(os.environ), ["true"], time.monotonic(), lambda m: None)
        print(json.dumps({"results": len(answer.get("results", [])), "hashlib": "hashlib" in sys.modules}))
    """)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("ENVDOCTOR_NO_CACHE", None)
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                      cwd=tmp_path, timeout=120, check=True).stdout.splitlines()[-1]) for _ in range(2)]
    assert runs[1]["results"] > 0
    assert runs[1]["hashlib"] is False


def test_a_warm_exec_preflight_of_a_binary_imports_no_shutil_or_shlex(tmp_path):
    """Reading the command's `#!` line and the config's python cost a start that has
    neither ~3 ms: shutil (with bz2 and lzma) and shlex were imported up front."""
    code = textwrap.dedent("""
        import json, os, sys, time
        from envdoctor.exec_preflight import ExecOptions, in_child
        in_child(ExecOptions(timeout=30.0), dict(os.environ), ["true"], time.monotonic(), lambda m: None)
        print(json.dumps(sorted(m for m in ("shutil", "shlex", "hashlib") if m in sys.modules)))
    """)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    for name in ("ENVDOCTOR_NO_CACHE", "ENVDOCTOR_PYTHON", "ENVDOCTOR_CONFIG"):
        env.pop(name, None)
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                      cwd=tmp_path, timeout=120, check=True).stdout.splitlines()[-1]) for _ in range(2)]
    assert runs[1] == []


def test_a_warm_check_does_not_import_hashlib(tmp_path):
    """The onnx stack's cache file was named by a sha256 of its stamp: every warm
    `envdoctor check` mapped libcrypto for a file name (diskcache.entry_file now)."""
    code = textwrap.dedent("""
        import atexit, json, sys
        atexit.register(lambda: print(json.dumps({"hashlib": "hashlib" in sys.modules,
                                                  "onnx": "onnx" in sys.modules}), file=sys.stderr))
        sys.argv = ["envdoctor", "check", "--only", "onnx.opset", "-f", "json"]
        from envdoctor.cli import main
        main()
    """)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("ENVDOCTOR_NO_CACHE", None)
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert json.loads(proc.stdout)["results"][0]["check"] == "onnx.opset", proc.stderr
        runs.append(json.loads(proc.stderr.splitlines()[-1]))
    assert runs[1] == {"hashlib": False, "onnx": False}  # the limits came from the cache, by a checksum name


def test_exec_preflight_lists_the_entry_points_once(monkeypatch):
    """exec's pre-flight child reads the entry points in _import_ahead and hands the list
    to its own registry load: no second directory scan, and the same checks."""
    from envdoctor import exec_headstart, registry

    calls = []
    real = registry.entry_points_of
    monkeypatch.setattr(registry, "entry_points_of", lambda group: calls.append(group) or real(group))
    monkeypatch.setattr(exec_headstart, "_listed", None)
    exec_headstart._import_ahead()
    assert calls == [registry.GROUP] and exec_headstart._listed
    assert set(registry.load(listed=exec_headstart._listed).checks) == set(registry.load().checks)
    assert calls == [registry.GROUP, registry.GROUP]  # the second from the plain load() only
