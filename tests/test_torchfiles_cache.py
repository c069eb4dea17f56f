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


def _site_with_cudnn(root):
    """A torch folder beside an nvidia-cudnn wheel: METADATA and cudnn_version.h."""
    td = _torch_tree(root)
    with open(os.path.join(td, "version.py"), "w") as f:  # a CUDA build: its cuDNN is read
        f.write("__version__ = '9.9.0+cu121'\ncuda = '12.1'\n")
    site = os.path.dirname(td)
    wheel = os.path.join(site, "nvidia_cudnn_cu12-9.1.0.70.dist-info")
    os.makedirs(wheel)
    with open(os.path.join(wheel, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: nvidia-cudnn-cu12\nVersion: 9.1.0.70\n")
    include = os.path.join(site, "nvidia", "cudnn", "include")
    os.makedirs(include)
    with open(os.path.join(include, "cudnn_version.h"), "w") as f:
        f.write("#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 1\n#define CUDNN_PATCHLEVEL 0\n")
    return td, site


@pytest.mark.parametrize("edit", ["header", "metadata", "onnx_constants"])
def test_an_edit_in_place_of_another_source_is_read_afresh(fresh, monkeypatch, edit):
    """helper-58: cudnn_version.h, a wheel's METADATA or torch/onnx/_constants.py written in
    place change no stamp of the first key; a later process served the old facts for 24 h."""
    td, site = _site_with_cudnn(fresh)
    os.makedirs(os.path.join(td, "onnx"))
    constants = os.path.join(td, "onnx", "_constants.py")
    with open(constants, "w") as f:
        f.write("ONNX_DEFAULT_OPSET = 17\n")
    before = torchfacts.read_installation_cached(td)
    monkeypatch.setattr(torchfacts, "_MEMO", type(torchfacts._MEMO)())
    site_mtime = os.stat(site).st_mtime_ns
    if edit == "header":
        with open(os.path.join(site, "nvidia", "cudnn", "include", "cudnn_version.h"), "w") as f:
            f.write("#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 5\n#define CUDNN_PATCHLEVEL 1\n")
    elif edit == "metadata":
        with open(os.path.join(site, "nvidia_cudnn_cu12-9.1.0.70.dist-info", "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: nvidia-cudnn-cu12\nVersion: 9.5.1.17\n")
    else:
        with open(constants, "w") as f:
            f.write("ONNX_DEFAULT_OPSET = 18\n")
    assert os.stat(site).st_mtime_ns == site_mtime  # nothing the first key looks at
    after = torchfacts.read_installation_cached(td)
    monkeypatch.setenv("ENVDOCTOR_NO_CACHE", "1")
    monkeypatch.setattr(torchfacts, "_MEMO", type(torchfacts._MEMO)())
    truth = torchfacts.read_installation_cached(td)
    drop = ("read_seconds",)
    assert {k: v for k, v in after.items() if k not in drop} == {k: v for k, v in truth.items() if k not in drop}
    assert {k: v for k, v in after.items() if k not in drop} != {k: v for k, v in before.items() if k not in drop}


def test_an_edit_that_restores_size_and_mtime_is_still_seen(fresh, monkeypatch):
    """helper-58: version.py rewritten in place, same size, mtime put back with `touch -r`."""
    td = _torch_tree(fresh)
    version = os.path.join(td, "version.py")
    assert torchfacts.read_installation_cached(td)["torch_version"] == "9.9.0+cpu"
    monkeypatch.setattr(torchfacts, "_MEMO", type(torchfacts._MEMO)())
    st = os.stat(version)
    with open(version, "r+b") as f:
        text = f.read()
        f.seek(0)
        f.write(text.replace(b"9.9.0", b"9.9.7"))
    os.utime(version, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(version).st_size == st.st_size and os.stat(version).st_mtime_ns == st.st_mtime_ns
    assert torchfacts.read_installation_cached(td)["torch_version"] == "9.9.7+cpu"


def test_an_entry_without_the_facts_is_a_miss(fresh, monkeypatch):
    import json

    td = _torch_tree(fresh)
    torchfacts.read_installation_cached(td)
    folder = fresh / "cache" / "envdoctor"
    (entry,) = [folder / p for p in os.listdir(folder) if p.startswith("torch-files-")]
    doc = json.loads(entry.read_text())
    doc["facts"] = {"torch_version": 1}
    entry.write_text(json.dumps(doc))
    monkeypatch.setattr(torchfacts, "_MEMO", type(torchfacts._MEMO)())
    assert torchfacts.read_installation_cached(td)["torch_version"] == "9.9.0+cpu"
