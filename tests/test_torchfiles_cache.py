"""Torch's file facts are kept on disk for the next process, keyed on the files they come
from: a warm start reads one small JSON file instead of parsing version.py and the
package metadata, and a change to torch's files is read afresh."""

from __future__ import annotations

import os

import pytest

from envdoctor import torchfacts


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("ENVDOCTOR_NO_CACHE", raising=False)
    monkeypatch.setattr(torchfacts, "_MEMO", type(torchfacts._MEMO)())  # a new process's memory
    return tmp_path


def _torch_tree(root):
    """A minimal torch folder: what read_installation needs to name the version."""
    td = root / "site" / "torch"
    (td / "lib").mkdir(parents=True)
    (td / "version.py").write_text("__version__ = '9.9.0+cpu'\ncuda = None\ngit_version = 'abc'\n")
    return str(td)


def test_a_second_process_reads_the_facts_from_disk(fresh, monkeypatch):
    td = _torch_tree(fresh)
    first = torchfacts.read_installation_cached(td)
    assert first["torch_version"] == "9.9.0+cpu"
    assert [p for p in os.listdir(fresh / "cache" / "envdoctor") if p.startswith("torch-files-")]
    monkeypatch.setattr(torchfacts, "_MEMO", type(torchfacts._MEMO)())

    def unread(*args):
        raise AssertionError("read_installation ran: the disk entry was not used")

    monkeypatch.setattr(torchfacts, "read_installation", unread)
    assert torchfacts.read_installation_cached(td) == first


def test_changed_files_are_read_afresh(fresh, monkeypatch):
    td = _torch_tree(fresh)
    assert torchfacts.read_installation_cached(td)["torch_version"] == "9.9.0+cpu"
    monkeypatch.setattr(torchfacts, "_MEMO", type(torchfacts._MEMO)())
    version = os.path.join(td, "version.py")
    with open(version, "w") as f:  # a reinstall rewrites it: another inode or mtime or size
        f.write("__version__ = '9.9.1+cpu'\ncuda = None\n")
    os.utime(version, ns=(1, 1))
    assert torchfacts.read_installation_cached(td)["torch_version"] == "9.9.1+cpu"


def test_no_cache_reads_the_files_every_time(fresh, monkeypatch):
    monkeypatch.setenv("ENVDOCTOR_NO_CACHE", "1")
    td = _torch_tree(fresh)
    torchfacts.read_installation_cached(td)
    assert not (fresh / "cache" / "envdoctor").exists() or not [
        p for p in os.listdir(fresh / "cache" / "envdoctor") if p.startswith("torch-files-")]


def test_a_real_torch_reads_the_same_through_the_cache(fresh, monkeypatch):
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torch is not installed in this interpreter")
    td = list(spec.submodule_search_locations)[0]
    direct = torchfacts.read_installation(td)
    cached = torchfacts.read_installation_cached(td)
    monkeypatch.setattr(torchfacts, "_MEMO", type(torchfacts._MEMO)())
    from_disk = torchfacts.read_installation_cached(td)
    for facts in (cached, from_disk):
        assert {k: v for k, v in facts.items() if k != "read_seconds"} == \
            {k: v for k, v in direct.items() if k != "read_seconds"}
