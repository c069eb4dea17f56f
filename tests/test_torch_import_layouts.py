"""cuda.runtime's "cannot be imported" against the real import, on a stand-in CUDA torch.

The stand-in is built here with gcc: a `torch/_C*.so` extension that needs
libtorch_python.so, which needs libtorch.so and libtorch_cuda.so, which needs
libcudnn.so.9 through RUNPATH `$ORIGIN/../../nvidia/cudnn/lib`, as the CUDA wheel's
libraries do; its `__init__.py` preloads cuDNN from `nvidia/cudnn/lib` of any sys.path
folder when the loader cannot find it, as torch 2.13's `_preload_cuda_deps` does. Each
layout is judged twice: by `python -c "import torch"` in a subprocess (the truth) and by
the check; they must agree (helper-87: four layouts that import failed the check).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from helpers import cli

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or not Path(sysconfig.get_paths()["include"], "Python.h").exists(),
                                reason="needs gcc and Python's headers to build the stand-in torch")

SOURCES = {
    "cudnn.c": "int cudnn_fn(void){return 9;}\n",
    "tcuda.c": "extern int cudnn_fn(void);\nint tcuda_fn(void){return cudnn_fn();}\n",
    "tcore.c": "int tcore_fn(void){return 1;}\n",
    "tpy.c": "extern int tcuda_fn(void); extern int tcore_fn(void);\nint tpy_fn(void){return tcuda_fn()+tcore_fn();}\n",
    "C.c": ("#include <Python.h>\nextern int tpy_fn(void);\n"
            "static PyObject* f(PyObject*s,PyObject*a){return PyLong_FromLong(tpy_fn());}\n"
            "static PyMethodDef m[]={{\"value\",f,METH_NOARGS,0},{0}};\n"
            "static struct PyModuleDef d={PyModuleDef_HEAD_INIT,\"_C\",0,-1,m};\n"
            "PyMODINIT_FUNC PyInit__C(void){return PyModule_Create(&d);}\n"),
}
INIT = '''import ctypes, glob, os, sys
_lib = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "libtorch_cuda.so")
try:
    ctypes.CDLL(_lib, mode=ctypes.RTLD_GLOBAL)
except OSError as err:  # torch 2.13: the CUDA libraries of nvidia-* wheels on sys.path
    found = [c for p in sys.path for c in glob.glob(os.path.join(p, "nvidia", "cudnn", "lib", "libcudnn.so.*[0-9]"))]
    if not found:
        raise
    ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(_lib, mode=ctypes.RTLD_GLOBAL)
from torch._C import value
'''
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")


def _gcc(*args: str) -> None:
    subprocess.run(["gcc", "-shared", "-fPIC", *args], check=True, capture_output=True)


def build(src: Path, site: Path, nvidia_site: Path, cuda_rpath: str = "$ORIGIN/../../nvidia/cudnn/lib",
          dtags: str = "--enable-new-dtags") -> Path:
    """The stand-in torch in `site`, its cuDNN in `nvidia_site`; `dtags` --disable-new-dtags
    writes RPATH (conda's builds) instead of RUNPATH. Returns the torch folder."""
    src.mkdir(exist_ok=True)
    for name, text in SOURCES.items():
        (src / name).write_text(text)
    torch, cudnn = site / "torch", nvidia_site / "nvidia" / "cudnn" / "lib"
    (torch / "lib").mkdir(parents=True)
    cudnn.mkdir(parents=True, exist_ok=True)
    _gcc("-o", str(cudnn / "libcudnn.so.9"), "-Wl,-soname,libcudnn.so.9", str(src / "cudnn.c"))
    _gcc("-o", str(torch / "lib/libtorch_cuda.so"), str(src / "tcuda.c"), f"-L{cudnn}", "-l:libcudnn.so.9",
         f"-Wl,{dtags},-rpath,{cuda_rpath}")
    _gcc("-o", str(torch / "lib/libtorch.so"), str(src / "tcore.c"), f"-Wl,{dtags},-rpath,$ORIGIN")
    _gcc("-o", str(torch / "lib/libtorch_python.so"), str(src / "tpy.c"), f"-L{torch / 'lib'}", "-ltorch",
         "-ltorch_cuda", f"-Wl,{dtags},-rpath,$ORIGIN", "-Wl,--allow-shlib-undefined")
    _gcc(f"-I{sysconfig.get_paths()['include']}", "-o", str(torch / f"_C{SUFFIX}"), str(src / "C.c"),
         f"-L{torch / 'lib'}", "-ltorch_python", f"-Wl,{dtags},-rpath,$ORIGIN/lib", "-Wl,--allow-shlib-undefined")
    (torch / "version.py").write_text("__version__ = '2.13.0+cu128'\ncuda = '12.8'\nhip = None\n")
    (torch / "__init__.py").write_text(INIT)
    return torch


def agree(tmp_path: Path, pythonpath: str, env: dict | None = None, python: str | None = None) -> tuple[bool, str]:
    """(whether `import torch` works, the check's row) for this PYTHONPATH, in this process's
    interpreter or, with `python`, in that one (`check --python`)."""
    full = {**os.environ, "PYTHONPATH": pythonpath, **(env or {})}
    imported = subprocess.run([python or sys.executable, "-c", "import torch; assert torch.value() == 10"], env=full,
                              capture_output=True, text=True, timeout=60, cwd=tmp_path).returncode == 0
    root = str(Path(__file__).resolve().parents[1])
    out = cli("check", "--only", "cuda.runtime", "-f", "compact", *(("--python", python) if python else ()),
              cwd=tmp_path, env={"PYTHONPATH": f"{root}:{pythonpath}", "XDG_CACHE_HOME": str(tmp_path / "cache"),
                                 **(env or {})})
    return imported, out.stdout


@pytest.mark.parametrize("layout", ["plain", "lib64 and lib", "symlinked torch", "rpath", "relative ld path",
                                    "ld preload", "pth folder"])
def test_a_torch_that_imports_is_never_called_unimportable(tmp_path, layout):
    env = None
    if layout == "plain":
        build(tmp_path / "src", tmp_path / "site", tmp_path / "site")
        path = str(tmp_path / "site")
    elif layout == "lib64 and lib":  # pip's platlib/purelib split (RHEL): found by torch's own preload
        build(tmp_path / "src", tmp_path / "lib64/site", tmp_path / "lib/site")
        path = f"{tmp_path / 'lib64/site'}:{tmp_path / 'lib/site'}"
    elif layout == "symlinked torch":  # $ORIGIN/../.. is taken on disk: beside the real folder
        build(tmp_path / "src", tmp_path / "store", tmp_path / "store")
        (tmp_path / "site").mkdir()
        (tmp_path / "site/torch").symlink_to(tmp_path / "store/torch")
        path = str(tmp_path / "site")
    elif layout == "rpath":  # libtorch_cuda.so without any path: found through its loader's RPATH
        torch = build(tmp_path / "src", tmp_path / "site", tmp_path / "site", cuda_rpath="/nowhere",
                      dtags="--disable-new-dtags")
        _gcc("-o", str(torch / "lib/libtorch_python.so"), str(tmp_path / "src/tpy.c"), f"-L{torch / 'lib'}", "-ltorch",
             "-ltorch_cuda", "-Wl,--disable-new-dtags,-rpath,$ORIGIN:$ORIGIN/../../nvidia/cudnn/lib",
             "-Wl,--allow-shlib-undefined")
        _gcc("-o", str(torch / "lib/libtorch_cuda.so"), str(tmp_path / "src/tcuda.c"),
             f"-L{tmp_path / 'site/nvidia/cudnn/lib'}", "-l:libcudnn.so.9")
        path = str(tmp_path / "site")
    elif layout == "relative ld path":  # cuDNN only on LD_LIBRARY_PATH, given relative to the working folder
        build(tmp_path / "src", tmp_path / "site", tmp_path / "elsewhere", cuda_rpath="/nowhere")
        path, env = str(tmp_path / "site"), {"LD_LIBRARY_PATH": "elsewhere/nvidia/cudnn/lib"}
    elif layout == "ld preload":  # helper-88: cuDNN given through LD_PRELOAD
        build(tmp_path / "src", tmp_path / "site", tmp_path / "elsewhere", cuda_rpath="/nowhere")
        (tmp_path / "elsewhere/nvidia/cudnn/lib/libcudnn.so.9").rename(tmp_path / "libcudnn.so.9")
        path, env = str(tmp_path / "site"), {"LD_PRELOAD": str(tmp_path / "libcudnn.so.9")}
    else:  # helper-88: a venv's torch, the nvidia wheels in a folder a .pth file of its site adds
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
        python = str(tmp_path / "venv/bin/python")
        site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True, timeout=60).stdout.strip())
        build(tmp_path / "src", site, tmp_path / "ext")
        (site / "ext.pth").write_text(f"# more packages\n{tmp_path / 'ext'}\n")
        imported, row = agree(tmp_path, "", python=python)
        assert imported, "the stand-in does not import: the layout is wrong, not the check"
        assert "import here" not in row, row
        return
    imported, row = agree(tmp_path, path, env)
    assert imported, "the stand-in does not import: the layout is wrong, not the check"
    assert "import here" not in row, row


def test_a_torch_whose_cudnn_is_gone_is_called_unimportable(tmp_path):
    build(tmp_path / "src", tmp_path / "site", tmp_path / "site")
    (tmp_path / "site/nvidia/cudnn/lib/libcudnn.so.9").unlink()  # pip uninstall nvidia-cudnn
    imported, row = agree(tmp_path, str(tmp_path / "site"))
    assert not imported
    assert "WARN" in row and "may not import here: libcudnn.so.9 (needed by libtorch_cuda.so)" in row, row
