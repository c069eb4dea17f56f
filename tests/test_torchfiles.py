"""Torch facts read from files (envdoctor.torchfacts), never by importing torch.

Fixtures: tests/fixtures/torch_cu130/site-packages holds small pieces of real
files: torch 2.13.0+cu130's version.py, onnx/_constants.py and the header block
of its METADATA (from the CUDA wheel on PyPI), 4 KiB cut from its
libtorch_python.so and libtorch_cuda.so around the arch string and the -gencode
flags, and nvidia-cudnn-cu13 9.24.0.43's METADATA and cudnn_version.h. The whole
wheel (530 MB) is read by test_real_cuda_wheel when it is on disk.

Processes: a second interpreter (/usr/bin/python3.11 -S, not envdoctor's) with a
stub torch whose libtorch_python.so is a real shared library built here with gcc
and loaded with ctypes, examined with `check --pid N` in a process that refuses
any import of torch; the same inside a private mount namespace, where the stub
exists only under /proc/N/root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

import envdoctor.nvml
from envdoctor import torchfacts
from envdoctor.checks.cuda_runtime import CHECK as CUDA_RUNTIME
from envdoctor.context import Session, Target
from envdoctor.errors import Unavailable
from envdoctor.model import Status
from envdoctor.paths import Roots
from envdoctor.runner import Plan, run_one
from envdoctor.torchfacts import elf, locate, metadata
from fake_pynvml import FakeDevice, FakeNvml
from test_no_torch_import import GUARD

FIXTURE = Path(__file__).parent / "fixtures" / "torch_cu130" / "site-packages"
ARCHES_2_13_CU130 = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def copy_fixture(tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    shutil.copytree(FIXTURE, site)
    return site


# -- one torch folder ----------------------------------------------------------------------


def test_real_cuda_build_pieces_read_as_torch_reports_them():
    facts = torchfacts.read_installation(str(FIXTURE / "torch"))
    assert facts["source"] == "files"
    assert facts["torch_version"] == "2.13.0+cu130" and facts["torch_cuda_version"] == "13.0"
    assert facts["torch_hip_version"] is None and facts["git_version"] == "cf30153c4c131c8164ee7798e5022d810682e2cb"
    assert facts["torch_dist_version"] == "2.13.0"
    assert facts["arch_list"] == ARCHES_2_13_CU130
    assert facts["arch_source"].endswith("lib/libtorch_python.so")
    # cuDNN 9.24.0 from the header, in torch.backends.cudnn.version()'s form; the wheel pins 9.20
    assert facts["cudnn_version"] == 92400 and facts["cudnn_source"].endswith("cudnn_version.h")
    assert facts["cudnn_required"] == "9.20.0.48" and facts["errors"] == {}
    assert facts["cudnn_available"] is True
    assert facts["cuda_packages"] == {"nvidia-cudnn-cu13": "9.24.0.43"}
    assert facts["onnx_default_opset"] == 20  # torch/onnx/_constants.py: ONNX_DEFAULT_OPSET = 20
    # what only a running torch knows is None, with the reason
    assert facts["cuda_available"] is None and facts["num_threads"] is None
    assert "live setting" in facts["unknown"]["cudnn_benchmark"]


def test_arch_list_falls_back_to_the_gencode_flags_in_libtorch_cuda(tmp_path):
    site = copy_fixture(tmp_path)
    (site / "torch" / "lib" / "libtorch_python.so").unlink()
    facts = torchfacts.read_installation(str(site / "torch"))
    assert facts["arch_list"] == ARCHES_2_13_CU130 and facts["arch_source"].endswith("libtorch_cuda.so")


def test_no_arch_string_is_unknown_not_empty_guess(tmp_path):
    site = copy_fixture(tmp_path)
    for name in ("libtorch_python.so", "libtorch_cuda.so"):
        (site / "torch" / "lib" / name).write_bytes(b"\x00sm_80\x00 unrelated \x00sm_90\x00")  # lone tokens only
    facts = torchfacts.read_installation(str(site / "torch"))
    assert facts["arch_list"] == [] and "no arch string" in facts["unknown"]["arch_list"]


def test_a_cudnn_header_without_its_library_is_not_called_available(tmp_path):
    """helper-86: the header alone (its library deleted) read as cudnn_available True. Only a
    library file says so; none beside torch is unknown (a system cuDNN may serve it)."""
    site = copy_fixture(tmp_path)
    shutil.rmtree(site / "nvidia" / "cudnn" / "lib")
    facts = torchfacts.read_installation(str(site / "torch"))
    assert facts["cudnn_version"] == 92400 and facts["cudnn_available"] is None


def test_the_cudnn_frontend_package_is_not_read_as_cudnn(tmp_path):
    """helper-86: nvidia-cudnn-frontend 1.16.0 (without nvidia-cudnn-cu13) was read as cuDNN
    2.6.0, and failed against the 9.20 torch was built for."""
    site = copy_fixture(tmp_path)
    shutil.rmtree(site / "nvidia")
    shutil.rmtree(site / "nvidia_cudnn_cu13-9.24.0.43.dist-info")
    frontend = site / "nvidia_cudnn_frontend-1.16.0.dist-info"
    frontend.mkdir()
    (frontend / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-cudnn-frontend\nVersion: 1.16.0\n")
    facts = torchfacts.read_installation(str(site / "torch"))
    assert facts["cudnn_version"] is None and facts["errors"] == {}, facts["cudnn_source"]
    assert facts["cudnn_required"] == "9.20.0.48"


def test_a_leftover_torch_dist_info_does_not_decide_the_requirements(tmp_path):
    """helper-86: a torch-2.12.0.dist-info left beside 2.13.0's (sorted first) gave the cuDNN pin
    of 2.12.0. The dist-info whose version is version.py's is read."""
    site = copy_fixture(tmp_path)
    old = site / "torch-2.12.0.dist-info"
    old.mkdir()
    (old / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.12.0\n"
                                  "Requires-Dist: nvidia-cudnn-cu13==9.10.2.21\n")
    facts = torchfacts.read_installation(str(site / "torch"))
    assert facts["torch_dist_version"] == "2.13.0" and facts["cudnn_required"] == "9.20.0.48"


def test_cudnn_version_from_the_package_when_no_header(tmp_path):
    site = copy_fixture(tmp_path)
    shutil.rmtree(site / "nvidia")
    facts = torchfacts.read_installation(str(site / "torch"))
    assert facts["cudnn_version"] == 92400 and facts["cudnn_source"] == "nvidia-cudnn-cu13 9.24.0.43"


def test_cudnn_older_than_the_build_is_the_error_torch_would_raise(tmp_path):
    site = copy_fixture(tmp_path)
    header = site / "nvidia" / "cudnn" / "include" / "cudnn_version.h"
    header.write_text(header.read_text().replace("#define CUDNN_MINOR 24", "#define CUDNN_MINOR 1"))
    facts = torchfacts.read_installation(str(site / "torch"))
    assert facts["cudnn_version"] == 90100
    assert "cuDNN version incompatibility" in facts["errors"]["cudnn_version"]
    # judged by cuda.runtime on a GPU node: a fail naming it
    fake = FakeNvml(devices=[FakeDevice(compute_capability=(9, 0), name="NVIDIA H100")], driver="580.65", cuda=13000)
    s = Session(env_override={}, nvml_factory=lambda: envdoctor.nvml.connect(lib=fake, timeout=2.0),
                torch_factory=lambda _s: torchfacts.read_installation(str(site / "torch")))
    r = run_one(Plan(CUDA_RUNTIME, {}, 30), s)
    assert r.status is Status.FAIL and "cuDNN does not load" in r.summary and "9.20.0.48" in r.summary


def test_files_facts_judged_on_a_gpu_the_build_lacks(tmp_path):
    """sm_75..sm_120 SASS and no PTX: a compute capability 7.0 GPU (V100) has no kernels."""
    fake = FakeNvml(devices=[FakeDevice(compute_capability=(7, 0), name="Tesla V100-SXM2-32GB")], driver="580.65", cuda=13000)
    s = Session(env_override={}, nvml_factory=lambda: envdoctor.nvml.connect(lib=fake, timeout=2.0),
                torch_factory=lambda _s: torchfacts.read_installation(str(FIXTURE / "torch")))
    r = run_one(Plan(CUDA_RUNTIME, {}, 30), s)
    assert r.status is Status.FAIL and "sm_70" in r.summary, r.summary


@pytest.mark.parametrize("text", ["__version__ = ", "", "x = 1\n", "\xff\xfe garbage"])
def test_broken_version_py_is_an_error_row_with_a_reason(tmp_path, text):
    site = copy_fixture(tmp_path)
    (site / "torch" / "version.py").write_text(text, errors="surrogateescape")
    with pytest.raises(torchfacts.TorchFilesError, match="no readable version.py"):
        torchfacts.read_installation(str(site / "torch"))
    s = Session(env_override={}, nvml_factory=lambda: (_ for _ in ()).throw(Unavailable("no NVML")),
                torch_factory=lambda _s: torchfacts.read_installation(str(site / "torch")))
    r = run_one(Plan(CUDA_RUNTIME, {}, 30), s)
    assert r.status is Status.ERROR and "no readable version.py" in r.summary


def test_a_fifo_planted_in_torchs_place_answers_at_once(tmp_path):
    """A hostile container can put a FIFO where version.py or libtorch_python.so
    should be: reading it must fail at once, not hang the run."""
    site = copy_fixture(tmp_path)
    lib = site / "torch" / "lib" / "libtorch_python.so"
    lib.unlink()
    os.mkfifo(lib)
    started = time.monotonic()
    facts = torchfacts.read_installation(str(site / "torch"))
    assert facts["arch_list"] == ARCHES_2_13_CU130 and facts["arch_source"].endswith("libtorch_cuda.so")
    (site / "torch" / "version.py").unlink()
    os.mkfifo(site / "torch" / "version.py")
    with pytest.raises(torchfacts.TorchFilesError):
        torchfacts.read_installation(str(site / "torch"))
    assert time.monotonic() - started < 5


def test_metadata_reader_stops_at_the_header_and_survives_junk(tmp_path):
    dist = tmp_path / "x-1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_bytes(b"Name: x\nVersion: 1\nRequires-Dist: a==2\n\nRequires-Dist: not-a-header==9\n\xff")
    assert metadata.read_metadata(dist) == {"name": "x", "version": "1", "requires": ["a==2"]}
    (dist / "METADATA").write_bytes(b"\xff\xfe\x00")
    assert metadata.read_metadata(dist) is None
    assert metadata.read_metadata(tmp_path / "missing.dist-info") is None
    assert metadata.pinned(["nvidia-cudnn-cu12==9.1.0.70; platform_system == 'Linux'"], "nvidia-cudnn") == "9.1.0.70"
    assert metadata.pinned(["cuda-toolkit[cublas]==13.0.3"], "cuda-toolkit") == "13.0.3"


def test_cudnn_number_matches_torch_for_both_eras():
    assert metadata.cudnn_from_version("9.1.0.70") == 90100
    assert metadata.cudnn_from_version("8.9.2.26") == 8902
    assert metadata.cudnn_from_version("nonsense") is None


# -- the arch string in a real ELF file ---------------------------------------------------------


def build_so(tmp_path: Path, source: str, name: str = "libtorch_python.so") -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (gcc) to build a real shared library")
    c = tmp_path / f"{name}.c"
    c.write_text(source)
    out = tmp_path / name
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(c)], check=True, capture_output=True, timeout=60)
    return out


def test_only_rodata_is_read_in_an_elf_file(tmp_path):
    # the writable decoy lands in .data; a whole-file scan would see both lists
    so = build_so(tmp_path, textwrap.dedent("""
        const char arch_flags[] = "sm_80 sm_90 compute_90";
        char decoy[] = "sm_35 sm_37 sm_50 sm_52 sm_60 sm_61 sm_70";
        const char *keep(void) { decoy[0] = 's'; return arch_flags; }
    """))
    assert elf.arch_string(so) == ["sm_80", "sm_90", "compute_90"]
    raw = tmp_path / "raw.bin"
    raw.write_bytes(so.read_bytes()[64:])  # no ELF header any more: scanned whole, the longer decoy wins
    assert elf.arch_string(raw) == ["sm_35", "sm_37", "sm_50", "sm_52", "sm_60", "sm_61", "sm_70"]


@pytest.mark.parametrize("cut", [0, 4, 63, 64, 200, 1000])
def test_truncated_or_empty_libraries_answer_none(tmp_path, cut):
    so = build_so(tmp_path, 'const char a[] = "x";\n', "libx.so")
    bad = tmp_path / "bad.so"
    bad.write_bytes(so.read_bytes()[:cut])
    assert elf.arch_string(bad) is None and elf.gencode_arches(bad) is None
    assert elf.arch_string(tmp_path / "missing.so") is None
    assert elf.arch_string(tmp_path) is None  # a directory


def test_a_section_table_that_points_past_any_file_is_only_a_bad_file(tmp_path):
    """A name-table offset of 2**64-1 made pread raise OverflowError out of the scan, an
    `error` row in cuda.runtime and torch.cudnn, from any user's file (helper-20)."""
    import struct

    so = build_so(tmp_path, 'const char arch_flags[] = "sm_80 sm_90";\nconst char *keep(void) { return arch_flags; }\n')
    data = bytearray(so.read_bytes())
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shstrndx, = struct.unpack_from("<H", data, 0x3E)
    for offset in (0xFFFFFFFFFFFFFFFF, 0x7FFFFFFFFFFFFFFF):
        struct.pack_into("<Q", data, shoff + shstrndx * 64 + 24, offset)  # the name table's sh_offset
        bad = tmp_path / "bad.so"
        bad.write_bytes(data)
        assert elf.arch_string(bad) == ["sm_80", "sm_90"]  # no table: the file is scanned from its start
        assert elf.gencode_arches(bad) is None


def test_a_huge_section_entry_size_costs_no_memory(tmp_path):
    """e_shentsize 65535 x 4096 entries in a sparse file: the table read was 268 MB at
    once, enough for any user to get serve (MemoryMax=256M) OOM-killed (helper-20)."""
    import struct

    so = build_so(tmp_path, 'const char arch_flags[] = "sm_80 sm_90";\nconst char *keep(void) { return arch_flags; }\n')
    data = bytearray(so.read_bytes()[:64])
    struct.pack_into("<Q", data, 0x28, 64)  # e_shoff
    struct.pack_into("<HHH", data, 0x3A, 65535, 4096, 1)  # e_shentsize, e_shnum, e_shstrndx
    bad = tmp_path / "sparse.so"
    with open(bad, "wb") as f:
        f.write(data)
        f.truncate(64 + 65535 * 4096 + 4096)
    reader = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from pathlib import Path
        from envdoctor.torchfacts import elf
        found = elf.arch_string(Path({str(bad)!r}))
        # VmHWM, not ru_maxrss: that one keeps the forking parent's figure across exec
        print(found, next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")))
    """)], capture_output=True, text=True, timeout=120)
    assert reader.returncode == 0, reader.stderr
    found, peak_kib = reader.stdout.rsplit(" ", 1)
    assert found == "None" and int(peak_kib) < 96 * 1024, reader.stdout  # 4 MiB chunks of zeros, not 268 MB


# -- where a target's torch is -----------------------------------------------------------------


def test_maps_give_the_torch_folder():
    maps = textwrap.dedent("""\
        55d0c0000000-55d0c0001000 r--p 00000000 fe:00 1 /usr/bin/python3.11
        7f0000000000-7f0000001000 r--p 00000000 fe:00 2 /opt/env/lib/python3.11/site-packages/numpy/core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so
        7f0000001000-7f0000002000 r--p 00000000 fe:00 3 /opt/env/lib/python3.11/site-packages/torch/lib/libc10.so
        7f0000002000-7f0000003000 r--p 00000000 fe:00 4 /opt/env/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so
        7f0000003000-7f0000004000 r--p 00000000 fe:00 5 /opt/env/lib/python3.11/site-packages/torch/lib/libtorch_python.so (deleted)
        7f0000004000-7f0000005000 rw-p 00000000 00:00 0
        7f0000005000-7f0000006000 rw-p 00000000 00:00 0 [heap]
        7f0000006000-7f0000007000 r--p 00000000 fe:00 6 /opt/env/lib/python3.11/site-packages/torch/_C.cpython-311-x86_64-linux-gnu.so
    """)
    files = locate.mapped_files(maps)
    assert locate.torch_dirs_from_maps(files) == ["/opt/env/lib/python3.11/site-packages/torch"]
    assert locate.site_dirs_from_maps(files) == ["/opt/env/lib/python3.11/site-packages"]
    assert locate.deleted_files(maps) == ["/opt/env/lib/python3.11/site-packages/torch/lib/libtorch_python.so"]
    assert locate.mapped_files("garbage\n\x00\n1 2 3\n") == []
    both = locate.mapped(maps + maps.replace(" (deleted)", ""))  # one pass: each file once, replaced if ever so
    assert list(both) == files and [f for f, gone in both.items() if gone] == locate.deleted_files(maps)


def make_venv(tmp_path: Path, name: str = "venv", system_site: bool = False) -> Path:
    args = [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / name)]
    if system_site:
        args.insert(4, "--system-site-packages")
    subprocess.run(args, check=True, capture_output=True, timeout=120)
    return tmp_path / name / "bin" / "python"


def stub_torch(site: Path, version: str = "2.99.0+cu128", cuda: str | None = "12.8") -> Path:
    pkg = site / "torch"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "version.py").write_text(f"__version__ = {version!r}\ncuda = {cuda!r}\nhip = None\ngit_version = 'stub'\n")
    # `import torch` would fail at once: proof that nothing imported it to get the facts
    (pkg / "__init__.py").write_text("raise ImportError('stub torch: read its files, do not import it')\n")
    return pkg


def no_probe(*_a, **_k):
    raise AssertionError("the probe ran although torch's files were there")


def test_a_venv_interpreter_is_read_from_its_site_packages(tmp_path, monkeypatch):
    python = make_venv(tmp_path)
    site = next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))
    stub_torch(site)
    monkeypatch.setattr("envdoctor.probe.run_probe", no_probe)
    facts = torchfacts.gather(Session(python=str(python), env_override={"HOME": str(tmp_path)}))
    assert facts["torch_version"] == "2.99.0+cu128" and facts["python"] == str(python)
    assert facts["torch_dir"] == str(site / "torch")


def test_system_site_packages_decides_whether_the_base_torch_counts(tmp_path, monkeypatch):
    """A venv's pyvenv.cfg as `python -m venv` writes it: `home` names the base
    interpreter's bin/, and include-system-site-packages says whether its
    site-packages are searched after the venv's own."""
    base = tmp_path / "base"
    (base / "bin").mkdir(parents=True)
    stub_torch(base / "lib" / "python3.11" / "site-packages", "2.97.0+cu126", "12.6")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setattr("envdoctor.probe.run_probe", no_probe)
    for include, found in (("true", "2.97.0+cu126"), ("false", None)):
        (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\ninclude-system-site-packages = {include}\nversion = 3.11.7\n")
        facts = torchfacts.for_interpreter(str(venv / "bin" / "python"), {})
        assert (facts["torch_version"] if facts else None) == found, include


def test_a_kept_directory_listing_follows_a_python_installed_later(tmp_path):
    """serve searches the same interpreters' lib/ every run, so the python3* names of a
    directory are kept; a python3.X added (or removed) afterwards must still be seen."""
    prefix = tmp_path / "usr"
    (prefix / "lib" / "python3.11").mkdir(parents=True)
    (prefix / "lib" / "other").mkdir()

    def host(path: str) -> Path:
        return Path(path)

    first = locate._lib_python_dirs(str(prefix), host)
    assert first == [f"{prefix}/lib/python3.11/site-packages", f"{prefix}/lib/python3.11/dist-packages"]
    assert locate._lib_python_dirs(str(prefix), host) == first  # the kept listing answers alike
    before = os.stat(prefix / "lib").st_mtime_ns
    (prefix / "lib" / "python3.12").mkdir()
    if os.stat(prefix / "lib").st_mtime_ns == before:  # a coarse clock: make the change visible
        os.utime(prefix / "lib", ns=(before + 10**9, before + 10**9))
    assert locate._lib_python_dirs(str(prefix), host)[:2] == [f"{prefix}/lib/python3.12/site-packages",
                                                               f"{prefix}/lib/python3.12/dist-packages"]
    shutil.rmtree(prefix / "lib" / "python3.11")
    os.utime(prefix / "lib", ns=(before + 2 * 10**9, before + 2 * 10**9))
    assert all("python3.11" not in d for d in locate._lib_python_dirs(str(prefix), host))


def test_an_interpreter_without_torch_falls_back_to_the_probe_which_says_so(tmp_path):
    python = make_venv(tmp_path)
    with pytest.raises(Unavailable, match="no torch in"):
        torchfacts.gather(Session(python=str(python), env_override={"HOME": str(tmp_path)}))


@pytest.mark.real
def test_files_agree_with_the_probe_on_this_venvs_real_torch(tmp_path):
    from envdoctor.probe import run_probe

    files = torchfacts.gather(Session(env_override={}))
    probed = run_probe(sys.executable, use_cache=False, cache_directory=tmp_path)
    for key in ("torch_version", "torch_cuda_version", "torch_hip_version", "git_version", "onnx_default_opset",
                "arch_list", "cuda_compiled", "torch_dir"):
        assert files[key] == probed[key], key
    if probed["torch_cuda_version"] is None:
        assert files["cudnn_available"] is probed["cudnn_available"] is False


# -- another process -----------------------------------------------------------------------


OTHER_PYTHON = next((p for p in ("/usr/bin/python3.11", "/usr/bin/python3") if os.path.exists(p)), None)


def start_holder(python: str, lib: Path, site: Path, prefix: list[str] | None = None, setup: str = "") -> subprocess.Popen:
    """A process that has 'imported torch' as far as /proc can tell: its libtorch_python.so is
    loaded (ctypes dlopen) and the stub's folder is on its path; then it waits."""
    code = textwrap.dedent(f"""
        import ctypes, mmap, sys, time
        sys.path.insert(0, {str(site)!r})
        try:
            keep = ctypes.CDLL({str(lib)!r})
        except OSError:  # not a real shared library (no C compiler here): map it as a file instead
            f = open({str(lib)!r}, "rb")
            keep = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        print("ready", flush=True)
        time.sleep(120)
    """)
    cmd = [*(prefix or []), python, "-S", "-c", code] if not setup else [*(prefix or []), "sh", "-c", setup + f' exec {python} -S -c "$0"', code]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"holder did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc


def arch_lib(tmp_path: Path) -> Path:
    """A libtorch_python.so holding the arch string: built by gcc when there is one,
    else a plain file with the string (read whole, as a non-ELF file is)."""
    if shutil.which("gcc") or shutil.which("cc"):
        return build_so(tmp_path, 'const char flags[] = "sm_80 sm_90 sm_120";\nconst char *f(void) { return flags; }\n')
    raw = tmp_path / "libtorch_python.so"
    raw.write_bytes(b"\x7fnot-elf\x00sm_80 sm_90 sm_120\x00tail")
    return raw


def run_check_without_torch(*args: str, tmp_path: Path) -> tuple[dict, dict]:
    """`envdoctor check ARGS --format json` in a fresh interpreter that refuses any torch import."""
    code = GUARD + textwrap.dedent(f"""
        import runpy, json
        sys.argv = ["envdoctor", "check", "--format", "json", *{list(args)!r}]
        code = 0
        try:
            runpy.run_module("envdoctor", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code
        sys.stderr.write(json.dumps({{"attempts": ATTEMPTS, "torch_loaded": "torch" in sys.modules, "code": code}}) + "\\n")
    """)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("ENVDOCTOR_CONFIG", None)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=work)
    verdict = json.loads(proc.stderr.strip().splitlines()[-1])
    return verdict, json.loads(proc.stdout)


@pytest.mark.real
@pytest.mark.skipif(OTHER_PYTHON is None, reason="needs a second interpreter (/usr/bin/python3)")
def test_check_pid_reports_the_other_process_torch_without_importing_torch(tmp_path):
    site = tmp_path / "other-site"
    pkg = stub_torch(site)
    lib = shutil.copy(arch_lib(tmp_path), pkg / "lib" / "libtorch_python.so")
    holder = start_holder(OTHER_PYTHON, Path(lib), site)
    try:
        verdict, report = run_check_without_torch("--pid", str(holder.pid), "--only", "cuda.runtime,torch.cudnn",
                                                  tmp_path=tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert verdict["attempts"] == [] and verdict["torch_loaded"] is False, verdict
    rows = {r["check"]: r for r in report["results"]}
    assert rows["cuda.runtime"]["target"] == f"pid:{holder.pid}"
    assert rows["cuda.runtime"]["facts"]["torch_version"] == "2.99.0+cu128"  # not this venv's 2.13.0+cpu
    assert rows["cuda.runtime"]["facts"]["arch_list"] == ["sm_80", "sm_90", "sm_120"]
    assert rows["torch.cudnn"]["facts"]["torch_version"] == "2.99.0+cu128"


@pytest.mark.real
def test_a_process_in_its_own_mount_namespace_is_read_through_proc_root(tmp_path):
    """The stub exists only inside the process's mount namespace (a tmpfs over an empty
    directory): readable through /proc/N/root, not at the path the process names."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux) for a private mount namespace")
    built = arch_lib(tmp_path)
    staging = tmp_path / "staging"
    stub_torch(staging)
    shutil.copy(built, staging / "torch" / "lib" / "libtorch_python.so")
    hidden = Path(f"/tmp/envdoctor-ns-{os.getpid()}-{time.monotonic_ns()}")
    hidden.mkdir()
    setup = f"mount -t tmpfs none {hidden} && cp -r {staging}/torch {hidden}/ &&"
    holder = None
    try:
        holder = start_holder(sys.executable, hidden / "torch" / "lib" / "libtorch_python.so", hidden,
                              prefix=["unshare", "-m", "--propagation", "private"], setup=setup)
        assert not (hidden / "torch").exists()  # not from here...
        facts = torchfacts.for_process(Roots(), holder.pid)
        assert facts["torch_version"] == "2.99.0+cu128"  # ...but through /proc/N/root
        assert facts["torch_dir"] == f"{hidden}/torch" and facts["torch_imported"] is True
        assert facts["arch_list"] == ["sm_80", "sm_90", "sm_120"]
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        hidden.rmdir()


@pytest.mark.real
def test_a_process_that_has_not_imported_torch_yet_is_read_from_its_venv(tmp_path):
    python = make_venv(tmp_path)
    site = next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))
    stub_torch(site, "2.98.0+cpu", None)
    holder = subprocess.Popen([str(python), "-c", "import time; print('ready', flush=True); time.sleep(120)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        facts = torchfacts.gather(Session(target=Target(holder.pid), env_override={}))
    finally:
        holder.kill()
        holder.wait()
    assert facts["torch_version"] == "2.98.0+cpu" and facts["torch_imported"] is False
    assert facts["venv"] == str(tmp_path / "venv")
    assert facts["cudnn_available"] is False and facts["arch_list"] == []


@pytest.mark.real
def test_a_venv_python_started_by_name_from_path_is_read_from_its_venv(tmp_path):
    """`PATH=venv/bin:$PATH python train.py` without activating: argv[0] is a bare
    `python`, VIRTUAL_ENV is unset and /proc/N/exe is the base interpreter, so the venv
    was found nowhere and the process was said to have no torch (helper-18)."""
    make_venv(tmp_path)
    site = next((tmp_path / "venv" / "lib").glob("python3*/site-packages"))
    stub_torch(site, "2.97.0+cpu", None)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = f"{tmp_path / 'venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    holder = subprocess.Popen(["python", "-c", "import time; print('ready', flush=True); time.sleep(120)"],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with open(f"/proc/{holder.pid}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[0] == b"python"
        facts = torchfacts.gather(Session(target=Target(holder.pid)))  # its PATH, from /proc/N/environ
    finally:
        holder.kill()
        holder.wait()
    assert facts["torch_version"] == "2.97.0+cpu" and facts["venv"] == str(tmp_path / "venv")


def test_a_bare_name_on_path_that_is_another_interpreter_is_not_taken(tmp_path):
    """A `python` first on PATH that is not what the process runs says nothing about it."""
    from envdoctor.torchfacts import _found_on_path

    other = tmp_path / "bin"
    other.mkdir()
    (other / "sleep").write_text("#!/bin/sh\n")
    (other / "sleep").chmod(0o755)
    real = os.path.realpath(shutil.which("sleep"))
    holder = subprocess.Popen([real, "60"])
    try:
        exe = os.readlink(f"/proc/{holder.pid}/exe")
        assert _found_on_path("sleep", f"{other}:{os.path.dirname(real)}", exe, Path) == []  # the first one is another
        assert _found_on_path("sleep", f"relative/bin:{os.path.dirname(real)}", exe, Path) == [real]
        assert _found_on_path("sleep", "", exe, Path) == []
    finally:
        holder.kill()
        holder.wait()


def test_a_vanished_process_is_a_reason_not_a_traceback(tmp_path):
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(Unavailable, match="exited|gone|cannot read"):
        torchfacts.for_process(Roots(), proc.pid)


def test_a_process_without_torch_skips_with_the_reason(tmp_path):
    holder = subprocess.Popen(["sleep", "60"])
    try:
        with pytest.raises(Unavailable, match=f"no torch in pid:{holder.pid}"):
            torchfacts.for_process(Roots(), holder.pid)
    finally:
        holder.kill()
        holder.wait()


def test_procfs_root_is_honoured(tmp_path):
    """--path.procfs: a copied maps file under a fixture procfs, the torch under its root/."""
    proc = tmp_path / "proc" / "4242"
    (proc / "root").mkdir(parents=True)
    shutil.copytree(FIXTURE, proc / "root" / "opt" / "site-packages")
    (proc / "maps").write_text("7f00-7f01 r--p 00000000 fe:00 5 /opt/site-packages/torch/lib/libtorch_python.so\n")
    facts = torchfacts.for_process(Roots(procfs=tmp_path / "proc"), 4242)
    assert facts["torch_version"] == "2.13.0+cu130" and facts["torch_dir"] == "/opt/site-packages/torch"
    assert facts["arch_list"] == ARCHES_2_13_CU130


# -- the real CUDA wheel ------------------------------------------------------------------------


WHEEL_DIR = Path("/tmp/torchcuda")
FETCH_VAR = "ENVDOCTOR_FETCH_CUDA_WHEEL"


def cuda_wheel() -> tuple[Path | None, str]:
    """torch 2.13.0's CUDA wheel and, when there is none, why: $ENVDOCTOR_TORCH_CUDA_WHEEL,
    else /tmp/torchcuda (where `pip download --no-deps torch==2.13.0 --platform
    manylinux_2_28_x86_64 --only-binary=:all: -d /tmp/torchcuda` puts it), else fetched
    from PyPI into /tmp/torchcuda when ENVDOCTOR_FETCH_CUDA_WHEEL=1 (530 MB)."""
    named = os.environ.get("ENVDOCTOR_TORCH_CUDA_WHEEL")
    if named:
        return (Path(named), "") if Path(named).is_file() else (None, f"ENVDOCTOR_TORCH_CUDA_WHEEL={named} is not a file")
    found = sorted(WHEEL_DIR.glob("torch-2.13.0-cp*-manylinux*.whl"))
    if found:
        return found[0], ""
    if os.environ.get(FETCH_VAR) != "1":
        return None, (f"torch 2.13.0's CUDA wheel (530 MB) is not in {WHEEL_DIR}; set {FETCH_VAR}=1 to fetch it "
                      "from PyPI, or ENVDOCTOR_TORCH_CUDA_WHEEL=PATH")
    # --isolated and an explicit index: a local find-links or constraints file must not
    # substitute the CPU build for the CUDA one
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--no-cache-dir",
                           "--index-url", "https://pypi.org/simple", "torch==2.13.0", "--platform",
                           "manylinux_2_28_x86_64", "--only-binary=:all:", "-d", str(WHEEL_DIR)],
                          capture_output=True, text=True, timeout=1800, env=dict(os.environ, PIP_CONFIG_FILE=os.devnull))
    found = sorted(WHEEL_DIR.glob("torch-2.13.0-cp*-manylinux*.whl"))
    if not found:
        return None, f"could not fetch torch 2.13.0's CUDA wheel (offline?): {(proc.stderr or proc.stdout)[-300:]}"
    return found[0], ""


@pytest.mark.real
def test_real_cuda_wheel(tmp_path):
    wheel, why = cuda_wheel()
    if wheel is None:
        pytest.skip(why)
    wanted = ("torch/version.py", "torch/lib/libtorch_python.so", "torch/onnx/_constants.py")
    with zipfile.ZipFile(wheel) as z:
        for name in wanted:
            z.extract(name, tmp_path)
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.startswith("torch-"))
        z.extract(meta, tmp_path)
    facts = torchfacts.read_installation(str(tmp_path / "torch"))
    assert facts["torch_version"].startswith("2.13.0+cu") and facts["torch_cuda_version"]
    assert facts["arch_list"] == ARCHES_2_13_CU130  # the list the 4 KiB fixture was cut from
    assert facts["cudnn_required"] == "9.20.0.48"
    # the fixture pieces are what the wheel holds
    assert (tmp_path / "torch" / "version.py").read_bytes() == (FIXTURE / "torch" / "version.py").read_bytes()


def test_torch_cudnn_on_a_gpu_node_from_files_says_the_flags_are_unknown(tmp_path):
    """Files cannot know the live cuDNN flags: the row says so instead of claiming defaults."""
    from envdoctor.checks.torch_cudnn import CHECK as TORCH_CUDNN

    fake = FakeNvml(devices=[FakeDevice(compute_capability=(9, 0), name="NVIDIA H100")], driver="580.65", cuda=13000)
    s = Session(env_override={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
                nvml_factory=lambda: envdoctor.nvml.connect(lib=fake, timeout=2.0),
                torch_factory=lambda _s: torchfacts.read_installation(str(FIXTURE / "torch")))
    r = run_one(Plan(TORCH_CUDNN, {}, 30), s)
    assert r.status is Status.OK, r.summary
    assert "benchmark=?" in r.summary and "unknown from torch's files" in r.summary
    assert r.facts["cudnn_benchmark"] is None


def test_a_reinstalled_torch_is_read_afresh_and_an_unchanged_one_is_remembered(tmp_path):
    site = copy_fixture(tmp_path)
    torch_dir = str(site / "torch")
    first = torchfacts.read_installation_cached(torch_dir)
    first["arch_list"].append("mutated by a caller")
    again = torchfacts.read_installation_cached(torch_dir)
    assert again["arch_list"] == ARCHES_2_13_CU130  # a copy each time: callers cannot spoil it
    version = site / "torch" / "version.py"
    version.write_text(version.read_text().replace("2.13.0+cu130", "2.13.1+cu130"))
    os.utime(version, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert torchfacts.read_installation_cached(torch_dir)["torch_version"] == "2.13.1+cu130"


@pytest.mark.real
def test_a_torch_replaced_under_a_running_process_is_said(tmp_path):
    """pip install over a running job: the process keeps the old library (maps says
    "(deleted)"); the facts are the new files', and the warning says so."""
    site = tmp_path / "site"
    pkg = stub_torch(site)
    lib = Path(shutil.copy(arch_lib(tmp_path), pkg / "lib" / "libtorch_python.so"))
    holder = start_holder(sys.executable, lib, site)
    try:
        assert torchfacts.for_process(Roots(), holder.pid)["torch_files_replaced"] == []
        replacement = tmp_path / "new.so"
        replacement.write_bytes(lib.read_bytes())
        os.replace(replacement, lib)  # what pip does: a new file at the same path
        (pkg / "version.py").write_text("__version__ = '2.99.1+cu128'\ncuda = '12.8'\n")
        facts = torchfacts.for_process(Roots(), holder.pid)
        # serve's discovery keeps the maps lines naming a torch folder; the replaced library is among them
        lines = "\n".join(line for line in Path(f"/proc/{holder.pid}/maps").read_text().splitlines() if "/torch/" in line)
        assert torchfacts.for_process(Roots(), holder.pid, maps_hint=lines) == facts
    finally:
        holder.kill()
        holder.wait()
    assert facts["torch_version"] == "2.99.1+cu128"
    assert facts["torch_files_replaced"] == [str(lib)]
    assert any("replaced on disk" in w for w in facts["warnings"])


def test_cached_facts_are_copies_a_caller_may_change(tmp_path):
    """read_installation_cached hands out copies: a check that edits the facts it was given
    (warnings appended, a list sorted) must not change what the next process is told."""
    torch_dir = str(stub_torch(tmp_path / "site"))
    first = torchfacts.read_installation_cached(torch_dir)
    first["warnings"].append("changed by a caller")
    first["torch_version"] = "0"
    for value in first.values():
        if isinstance(value, dict):
            value["planted"] = True
    second = torchfacts.read_installation_cached(torch_dir)
    assert "changed by a caller" not in second["warnings"] and second["torch_version"] == "2.99.0+cu128"
    assert not any(isinstance(v, dict) and "planted" in v for v in second.values())
    fresh = torchfacts.read_installation(torch_dir)
    assert {k: v for k, v in second.items() if k != "read_seconds"} == {k: v for k, v in fresh.items() if k != "read_seconds"}


def test_a_library_truncated_while_it_is_read_never_kills_the_reader(tmp_path):
    """The arch scan mapped the file: its owner truncating it under the reader (any
    user's job is serve's target) killed serve with SIGBUS (helper-19). Read, it just ends."""
    lib = tmp_path / "libtorch_python.so"
    size = 32 * 1024 * 1024
    with open(lib, "wb") as f:
        f.truncate(size)
        f.seek(size // 2)
        f.write(b"\x00sm_80 sm_90\x00")
    flipper = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os
        fd = os.open({str(lib)!r}, os.O_RDWR)
        while True:
            os.ftruncate(fd, 0)
            os.ftruncate(fd, {size})
    """)])
    try:
        reader = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            from pathlib import Path
            from envdoctor.torchfacts import elf
            for _ in range(300):
                elf.arch_string(Path({str(lib)!r}))
            print("done")
        """)], capture_output=True, text=True, timeout=300)
    finally:
        flipper.kill()
        flipper.wait()
    assert reader.returncode == 0 and reader.stdout.strip() == "done", (reader.returncode, reader.stderr[-500:])


def test_a_file_made_of_arch_tokens_costs_little_time_and_memory(tmp_path):
    """64 MiB of "\\0sm_1": every match was kept, 16 s and 1.7 GB, from any user's file
    that serve reads as a target's torch (helper-21)."""
    flood = tmp_path / "libtorch_python.so"
    flood.write_bytes((b"\x00sm_1" * 13421773)[:64 << 20])
    reader = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path
        from envdoctor.torchfacts import elf
        t = time.monotonic()
        found = elf.arch_string(Path({str(flood)!r}))
        # VmHWM, not ru_maxrss: that one keeps the forking parent's figure across exec
        peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
        print(found, round(time.monotonic() - t, 2), peak)
    """)], capture_output=True, text=True, timeout=120)
    assert reader.returncode == 0, reader.stderr
    found, seconds, peak_kib = reader.stdout.rsplit(" ", 2)
    assert found == "None"  # only lone tokens: none of them is the list
    assert int(peak_kib) < 128 * 1024, reader.stdout  # the interpreter is ~20 MB; it was 1.7 GB


@pytest.mark.real
def test_a_pip_upgrade_under_a_running_process_is_said(tmp_path):
    """pip moves the old package aside (torch -> ~orch, its AdjacentTempDirectory), installs
    the new one, then deletes the old: the job's maps names `~orch/lib/...(deleted)`, which
    no torch folder matched, so the replacement went unsaid (helper-31)."""
    site = tmp_path / "site"
    pkg = stub_torch(site)
    lib = Path(shutil.copy(arch_lib(tmp_path), pkg / "lib" / "libtorch_python.so"))
    holder = start_holder(sys.executable, lib, site)
    try:
        stash = site / "~orch"
        os.rename(pkg, stash)  # what pip's uninstall does first
        stub_torch(site, version="2.99.1+cu128")
        shutil.copy(stash / "lib" / "libtorch_python.so", pkg / "lib" / "libtorch_python.so")
        moved = torchfacts.for_process(Roots(), holder.pid)  # the stash still there
        shutil.rmtree(stash)  # and then deleted
        facts = torchfacts.for_process(Roots(), holder.pid)
    finally:
        holder.kill()
        holder.wait()
    for seen in (moved, facts):
        assert seen["torch_imported"] is True and seen["torch_version"] == "2.99.1+cu128"
        assert seen["torch_files_replaced"] == [str(pkg / "lib" / "libtorch_python.so")]


def _needs_installed_torch() -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # found, not imported: only its files are read
        pytest.skip("needs torch (scripts/test.sh installs torch==2.13.0)")


def _torch_without(tmp_path: Path, *left_out: str) -> Path:
    """The installed (CPU) torch, as symlinks in a folder of its own, less `left_out` (paths
    under torch/): a partial install, as an interrupted pip leaves one."""
    import importlib.util

    real = Path(importlib.util.find_spec("torch").origin).parent  # located, not imported
    site = tmp_path / "site-packages"
    mirror = site / "torch"
    (mirror / "lib").mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name != "lib" and entry.name not in left_out:
            (mirror / entry.name).symlink_to(entry)
    for entry in (real / "lib").iterdir():
        if f"lib/{entry.name}" not in left_out:
            (mirror / "lib" / entry.name).symlink_to(entry)
    return mirror


def test_a_library_torch_needs_that_is_nowhere_fails_its_import(tmp_path):
    """helper-86: with nvidia-cudnn uninstalled (libcudnn.so.9 needed by libtorch_python.so) or
    torch/lib half deleted, every version still read well and cuda.runtime said ok; `import
    torch` fails on every node. Read as the loader searches: DT_NEEDED, RUNPATH ($ORIGIN),
    the ld.so cache, the system folders, then the target's LD_LIBRARY_PATH. A missing file of
    torch's own fails; a library nowhere envdoctor looks warns (helper-88: places it cannot read)."""
    _needs_installed_torch()
    from envdoctor.checks import cuda_runtime
    from envdoctor.torchfacts import libraries

    whole = str(_torch_without(tmp_path / "whole"))
    assert libraries.missing_files(whole, False) == [] and libraries.unresolved(whole, []) == {}
    partial = str(_torch_without(tmp_path / "partial", "lib/libshm.so"))
    assert libraries.unresolved(partial, []) == {"libshm.so": "libtorch_python.so"}
    gone = str(_torch_without(tmp_path / "gone", "__init__.py", "lib/libtorch_python.so"))
    assert libraries.missing_files(gone, False) == ["__init__.py", "lib/libtorch_python.so"]
    facts = torchfacts.read_installation(partial)
    r = cuda_runtime.judge(cuda_runtime.RuntimeFacts(facts, libraries_missing={"libshm.so": "libtorch_python.so"}), {})
    assert r.status is Status.WARN and "may not import here: libshm.so (needed by libtorch_python.so)" in r.summary, r.summary
    r = cuda_runtime.judge(cuda_runtime.RuntimeFacts(facts, files_missing=("__init__.py",)), {})
    assert r.status is Status.FAIL and "cannot be imported here: __init__.py missing from" in r.summary, r.summary


def test_ld_library_path_ld_preload_and_a_loaded_torch_answer_for_a_library(tmp_path):
    """The target's LD_LIBRARY_PATH and LD_PRELOAD are places the loader looks (helper-88: a
    library given through LD_PRELOAD was called missing); a process that has torch loaded
    found its libraries: none of them is a finding."""
    _needs_installed_torch()
    import importlib.util

    from envdoctor.checks import cuda_runtime
    from envdoctor.context import Session

    torch_dir = _torch_without(tmp_path, "lib/libshm.so")
    facts = torchfacts.read_installation(str(torch_dir))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    real = Path(importlib.util.find_spec("torch").origin).parent / "lib" / "libshm.so"
    (elsewhere / "libshm.so").symlink_to(real)

    class Ctx:
        def __init__(self, env):
            self.session = Session(env_override={"PATH": "/usr/bin", **env})
            self.target = self.session.target
            self.env = self.session.env

    assert cuda_runtime._import_problems(Ctx({}), facts) == ((), {"libshm.so": "libtorch_python.so"})
    assert cuda_runtime._import_problems(Ctx({"LD_LIBRARY_PATH": f"/nowhere:{elsewhere}"}), facts) == ((), {})
    assert cuda_runtime._import_problems(Ctx({"LD_PRELOAD": str(real)}), facts) == ((), {})
    assert cuda_runtime._import_problems(Ctx({}), {**facts, "torch_imported": True}) == ((), {})
    # the ground truth: the real import fails there, and works with the library on LD_LIBRARY_PATH
    code = ["-c", "import torch"]
    env = {**os.environ, "PYTHONPATH": str(torch_dir.parent)}
    assert subprocess.run([sys.executable, *code], env=env, capture_output=True, timeout=120).returncode != 0
    fine = subprocess.run([sys.executable, *code], env={**env, "LD_LIBRARY_PATH": str(elsewhere)}, capture_output=True,
                          text=True, timeout=120)
    assert fine.returncode == 0, fine.stderr[-500:]
