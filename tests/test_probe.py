"""The torch probe: real torch, stub torches in throw-away venvs, fake interpreters
that hang or crash, and the cache's invalidation rules."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envdoctor import diskcache
from envdoctor.errors import Unavailable
from envdoctor.probe import ProbeError, cache, probe_source, run_probe
from helpers import dies_with_its_parent

VENV_PY = Path(sys.executable)
SITE = Path(next(p for p in sys.path if p.endswith("site-packages")))

STUB_TORCH = '''
import os, sys
if os.environ.get("STUB_TORCH_NOISE"):
    print("hello from a noisy sitecustomize")  # stdout chatter must not break the result
    os.write(1, b"native code writes here too\\n")
if os.environ.get("STUB_TORCH_BROKEN"):
    raise ImportError("libcudnn.so.9: cannot open shared object file: No such file or directory")
__version__ = "2.4.0+cu121"
__file__ = __file__

class version:
    cuda = "12.1"
    hip = None
    git_version = "0000"

def _context(*args, **kwargs):
    raise RuntimeError("the facts probe must not create a CUDA context")

class _Cuda:
    _is_compiled = staticmethod(lambda: True)
    get_arch_list = staticmethod(lambda: ["sm_80", "sm_86", "sm_90", "compute_90"])
    is_available = staticmethod(lambda: True)
    device_count = staticmethod(lambda: 2)
    is_initialized = staticmethod(lambda: False)
    get_device_capability = staticmethod(_context)
    get_device_properties = staticmethod(_context)
    init = staticmethod(_context)
    _lazy_init = staticmethod(_context)
    current_device = staticmethod(_context)
cuda = _Cuda()

class _Cudnn:
    enabled = True
    benchmark = True
    deterministic = False
    is_available = staticmethod(lambda: True)
    version = staticmethod(lambda: 90100)
class backends:
    cudnn = _Cudnn()

are_deterministic_algorithms_enabled = lambda: True
is_deterministic_algorithms_warn_only_enabled = lambda: False
get_num_threads = lambda: 7
get_num_interop_threads = lambda: 3
'''


def make_stub_python(tmp_path: Path, torch_source: str | None = STUB_TORCH, name: str = "venv") -> Path:
    """A real venv (no pip: fast) holding a stub `torch` package, or none at all."""
    venv = tmp_path / name
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    if torch_source is not None:
        site = next((venv / "lib").glob("python3*/site-packages"))
        pkg = site / "torch"
        (pkg / "onnx").mkdir(parents=True)
        (pkg / "__init__.py").write_text(torch_source)
        (pkg / "version.py").write_text("__version__ = '2.4.0+cu121'\n")
        (pkg / "onnx" / "_constants.py").write_text("ONNX_BASE_OPSET = 9\nONNX_DEFAULT_OPSET = 17\n")
        dist = site / "torch-2.4.0+cu121.dist-info"
        dist.mkdir()
        (dist / "RECORD").write_text("torch/__init__.py,,\n")
    return python


def fake_interpreter(tmp_path: Path, body: str, name: str = "python") -> Path:
    """An executable that stands in for an interpreter: a shell script."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# -- the real torch of this venv ---------------------------------------------------------


@pytest.mark.real
def test_real_torch_facts(tmp_path):
    facts = run_probe(sys.executable, use_cache=False, cache_directory=tmp_path)
    version_file = SITE / "torch" / "version.py"
    expected = {}
    exec(version_file.read_text(), expected)
    assert facts["torch_version"] == expected["__version__"]
    assert facts["torch_cuda_version"] == expected["cuda"]  # None: this is a CPU build
    assert facts["cuda_available"] is False and facts["device_count"] == 0
    assert facts["cuda_initialized"] is False
    assert facts["cudnn_enabled"] is True and facts["cudnn_benchmark"] is False
    assert facts["deterministic_algorithms"] is False
    assert facts["num_threads"] >= 1
    constants = {}
    exec((SITE / "torch" / "onnx" / "_constants.py").read_text(), constants)
    assert facts["onnx_default_opset"] == constants["ONNX_DEFAULT_OPSET"]
    assert facts["probe_cached"] is False
    assert any(f.endswith("RECORD") for f in facts["stamp_files"])
    assert facts["errors"] == {}


@pytest.mark.real
def test_real_torch_second_run_comes_from_cache_without_a_subprocess(tmp_path, monkeypatch):
    first = run_probe(sys.executable, use_cache=True, cache_directory=tmp_path)
    assert first["probe_cached"] is False

    def no_subprocess(*args, **kwargs):
        raise AssertionError("a warm probe must not start a process")

    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    started = time.perf_counter()
    second = run_probe(sys.executable, use_cache=True, cache_directory=tmp_path)
    assert time.perf_counter() - started < 0.2
    assert second["probe_cached"] is True
    assert {k: v for k, v in second.items() if k != "probe_cached"} == {k: v for k, v in first.items() if k != "probe_cached"}


# -- no torch, no interpreter ------------------------------------------------------------


def test_interpreter_without_torch_is_unavailable_naming_it(tmp_path):
    python = make_stub_python(tmp_path, torch_source=None)
    with pytest.raises(Unavailable, match=f"no torch in {python}"):
        run_probe(str(python), use_cache=False)


def test_missing_interpreter_is_unavailable(tmp_path):
    with pytest.raises(Unavailable, match="does not exist"):
        run_probe(str(tmp_path / "nope" / "python"))
    with pytest.raises(Unavailable, match="not on PATH"):
        run_probe("no-such-python-anywhere-xyz")
    with pytest.raises(Unavailable, match="not an executable"):
        run_probe(str(tmp_path))


# -- stub torches: a CUDA build without a GPU, noisy, broken --------------------------------


def test_stub_cuda_torch_facts_and_no_context(tmp_path):
    """The facts mode reads a CUDA build's facts without calling anything that creates
    a context (the stub raises if get_device_capability/_lazy_init/... are called)."""
    python = make_stub_python(tmp_path)
    facts = run_probe(str(python), use_cache=False)
    assert facts["torch_version"] == "2.4.0+cu121"
    assert facts["torch_cuda_version"] == "12.1"
    assert facts["arch_list"] == ["sm_80", "sm_86", "sm_90", "compute_90"]
    assert facts["cuda_available"] is True and facts["device_count"] == 2
    assert facts["cudnn_version"] == 90100 and facts["cudnn_benchmark"] is True
    assert facts["deterministic_algorithms"] is True
    assert facts["num_threads"] == 7 and facts["num_interop_threads"] == 3
    assert facts["onnx_default_opset"] == 17
    assert facts["errors"] == {}, facts["errors"]
    assert facts["python"] == str(python)


def test_stdout_noise_does_not_hide_the_result(tmp_path, monkeypatch):
    python = make_stub_python(tmp_path)
    monkeypatch.setenv("STUB_TORCH_NOISE", "1")
    assert run_probe(str(python), use_cache=False)["torch_version"] == "2.4.0+cu121"


def test_broken_torch_is_a_probe_error_with_the_reason(tmp_path, monkeypatch):
    python = make_stub_python(tmp_path)
    monkeypatch.setenv("STUB_TORCH_BROKEN", "1")
    with pytest.raises(ProbeError, match="fails to import: ImportError: libcudnn.so.9"):
        run_probe(str(python), use_cache=False)


def test_broken_torch_is_not_cached(tmp_path, monkeypatch):
    python = make_stub_python(tmp_path)
    monkeypatch.setenv("STUB_TORCH_BROKEN", "1")
    with pytest.raises(ProbeError):
        run_probe(str(python), use_cache=True, cache_directory=tmp_path / "c")
    assert not (tmp_path / "c").exists() or not list((tmp_path / "c").iterdir())


# -- hangs and crashes ---------------------------------------------------------------------


def test_hanging_probe_is_killed_with_its_group_and_says_what_it_printed(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    python = fake_interpreter(tmp_path, f"""
        echo "importing torch from a dead NFS mount..." >&2
        sleep 300 &
        echo $! > {pidfile}
        sleep 300
    """)
    started = time.perf_counter()
    with pytest.raises(ProbeError) as info:
        run_probe(str(python), timeout=0.8, use_cache=False)
    assert time.perf_counter() - started < 10
    message = str(info.value)
    assert "did not finish within 0.8 s" in message
    assert "dead NFS mount" in message
    assert "ENVDOCTOR_PROBE_TIMEOUT" in message
    grandchild = int(pidfile.read_text())
    for _ in range(50):  # the kernel reaps it shortly after SIGKILL
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        try:
            with open(f"/proc/{grandchild}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except OSError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the probe's child {grandchild} outlived the timeout")


def test_crashing_probe_names_the_signal(tmp_path):
    python = fake_interpreter(tmp_path, """
        echo "Fatal Python error: Segmentation fault" >&2
        kill -SEGV $$
    """)
    with pytest.raises(ProbeError, match="killed by SIGSEGV.*Segmentation fault"):
        run_probe(str(python), use_cache=False)


def test_probe_that_prints_no_result(tmp_path):
    python = fake_interpreter(tmp_path, """
        echo "sitecustomize: refusing to run" >&2
        exit 3
    """)
    with pytest.raises(ProbeError, match="exited with status 3 without a result.*refusing to run"):
        run_probe(str(python), use_cache=False)


def test_timeout_from_environment(monkeypatch, tmp_path):
    python = fake_interpreter(tmp_path, "sleep 30\n")
    monkeypatch.setenv("ENVDOCTOR_PROBE_TIMEOUT", "0.3")
    with pytest.raises(ProbeError, match="within 0.3 s"):
        run_probe(str(python), use_cache=False)


def test_a_flood_of_output_is_cut_before_it_is_scrubbed(tmp_path, monkeypatch):
    """16 MiB of answer and no marker, with 100 secret variables set: scrubbing all of it
    held the interpreter lock for 29 s (the run's deadman fired at 20 s). Only the end is
    scrubbed now, the secret there is masked, and the reason is one line."""
    for i in range(100):
        monkeypatch.setenv(f"MY_TOKEN_{i}", f"s3cr3t{i}value")
    python = fake_interpreter(tmp_path, "head -c 16000000 /dev/zero | tr '\\0' 'x'\n"
                                        "printf '\\nTraceback (most recent call last):\\n  s3cr3t7value\\nError\\n'\n")
    started = time.monotonic()
    with pytest.raises(ProbeError) as info:
        run_probe(str(python), use_cache=False, timeout=60)
    said = str(info.value)
    assert time.monotonic() - started < 10, said[-300:]
    assert "s3cr3t7value" not in said and "\n" not in said
    assert said.endswith("Traceback (most recent call last): / *** / Error"), said[-200:]


def test_an_end_of_output_with_no_line_break_to_cut_at_is_withheld(monkeypatch):
    from envdoctor.probe import _tail

    monkeypatch.setenv("MY_TOKEN", "t0ps3cr3t-" * 10)
    text = "y" * 100_000 + ("t0ps3cr3t-" * 10 + " ") * 2000
    assert _tail(text).startswith("(its output is withheld: where it was cut, no line break")


def test_a_multiline_secret_cut_by_the_window_leaves_nothing_near_it(monkeypatch):
    """A key with line breaks (PEM) cut by the window: its later lines are not
    recognisable alone, so what is kept must lie its longest spelling past the cut."""
    from envdoctor.probe import _SCRUB_WINDOW, _tail

    key = "\n".join("".join(chr(ord("a") + (i * 7 + j) % 26) for j in range(64)) for i in range(40))
    monkeypatch.setenv("DEPLOY_PRIVATE_KEY", key)
    head, error = "x" * 5000 + "\n", "Error: cuInit failed\n"
    for into in (1000, 2000, len(key) - 70):  # where in the key the window starts
        blanks = _SCRUB_WINDOW - (len(key) - into) - len(error)
        for pad in ("\n", "\n" + "y" * 70):  # blank lines, and lines of text
            said = _tail(head + key + pad * (blanks // len(pad)) + error)
            for line in key.splitlines():
                assert line[10:30] not in said, (into, said[:200])
            assert said.endswith("Error: cuInit failed"), said[-100:]


def test_short_secrets_inside_a_cut_multiline_one_do_not_bring_it_into_view():
    """helper-26: a multi-line secret full of a 2-character secret's value: masking made the
    remains longer than the margin counted, and the secret's last line showed."""
    from envdoctor.probe import _tail

    secret = "A" * 50 + "\n" + "on." * 9000 + "\n" + "TAILSECRET99"
    env = {"DB_PASSWORD": secret, "FEATURE_AUTH": "on"}
    assert "TAILSECRET99" not in _tail(secret[10:] + "\n", env, cut_start=True)
    text = "x\n" + secret + "\n"
    assert "TAILSECRET99" not in _tail(text + "\n" * (65566 - len(text)), env)


@pytest.mark.parametrize("printed, value", [
    ("ValueError: invalid token hf_AbCdEfGhIjKlMnOp1234 for repo\n", "hf_AbCdEfGhIjKlMnOp1234\n"),
    ("ValueError: invalid token hf_AbCdEfGhIjKlMnOp1234 for repo\n", "hf_AbCdEfGhIjKlMnOp1234\r\n"),
    (b"Error: bad password p\xe9ss-word-123\n".decode("utf-8", "surrogateescape"), "p\xe9ss-word-123"),
])
def test_a_secret_printed_stripped_or_as_latin1_bytes_is_masked(printed, value):
    """helper-26: a Kubernetes --from-file secret keeps its newline and a program prints it
    stripped; in a Latin-1 locale the environment holds "é" and the program prints 0xE9."""
    from envdoctor.probe import _tail

    said = _tail(printed, {"HF_TOKEN" if "hf_" in value else "DB_PASSWORD": value})
    assert value.strip()[:10] not in said and "***" in said, said


def test_a_credential_cut_by_the_window_loses_its_name_and_still_never_shows():
    """helper-25: `token=<21,000 characters>`, then blank lines, with the window starting
    inside the value: the rest no longer looked like a credential and showed."""
    from envdoctor.probe import _SCRUB_WINDOW, _tail

    value = "".join(chr(ord("A") + (i * 11) % 26) for i in range(21_000))
    for head in ("token=", "Authorization: Bearer ", "https://user:"):
        for blanks in (_SCRUB_WINDOW - 5000, _SCRUB_WINDOW - 20_000):
            text = "start\n" + head + value + ("@host" if head.startswith("https") else "") + "\n" * blanks + "y" * 100
            said = _tail(text)
            assert value[-40:-20] not in said and value[5000:5020] not in said, (head, blanks, said[:120])


def test_a_stdout_cut_at_its_limit_never_ends_in_part_of_a_secret(monkeypatch):
    """helper-25: stdout is kept to its first 16 MiB; a secret printed across that limit
    showed its first 20 characters at the tail's end."""
    from envdoctor.probe import _tail

    secret = "Qw7rT5yU3iO1pA9sD8fGhJkLzX"
    monkeypatch.setenv("MY_TOKEN", secret)
    said = _tail("line one\n" + "z" * 70_000 + "\nlast whole line\nlog: " + secret[:20], cut_end=True)
    assert secret[:12] not in said and "line one" in said, said[-80:]


def test_a_stderr_cut_at_its_start_never_begins_with_part_of_a_secret(monkeypatch):
    """helper-25: stderr keeps its last 256-512 KiB; a long secret cut there showed its end
    when the window was larger than what was kept (no cut seen)."""
    from envdoctor.probe import _tail

    blob = "".join(chr(ord("a") + (i * 5) % 26) for i in range(40_000))
    monkeypatch.setenv("MY_BLOB", blob)
    said = _tail(blob[-30_000:] + "\n" * 10 + "the real error\n", cut_start=True)
    assert blob[-100:-80] not in said, said[:120]
    said = _tail(blob[-30_000:] + "\n" * 10 + "later line\n" * 5000 + "the real error\n", cut_start=True)
    assert blob[-100:-80] not in said and said.endswith("the real error"), said[-120:]


@pytest.mark.parametrize("padding", ["\n", " ", "\r\n", "\t \n"])
def test_a_secret_cut_by_the_window_and_followed_by_blanks_never_shows(monkeypatch, padding):
    """helper-24: 5,000 characters, `token=<secret>` cut through by the scrubbed window,
    then ~65,000 blank characters and an error: the blanks are dropped from the one-line
    tail, which brought the secret's end into it (30 of 32 characters shown)."""
    from envdoctor.probe import _SCRUB_WINDOW, _tail

    secret = "Zq8vLr2mXw9TpK4sHn7dJc3fBg6yQa1e"
    monkeypatch.setenv("MY_API_TOKEN", secret)
    for lead in range(0, len(secret) + 8, 3):
        text = "a" * 5000 + "token=" + secret + padding * ((_SCRUB_WINDOW - len(secret) + lead) // len(padding)) + "Error: cuInit failed\n"
        said = _tail(text)
        for start in range(len(secret) - 5):
            assert secret[start:start + 6] not in said, (lead, said[:120])


def test_a_secret_longer_than_the_window_is_not_shown_in_part(monkeypatch):
    """A 100,000-character secret (a key in an environment variable) printed whole, then
    an error: no window shorter than it could recognise it, so its end would show."""
    from envdoctor.probe import _tail

    secret = "".join(chr(ord("a") + (i * 7) % 26) for i in range(100_000))
    monkeypatch.setenv("DEPLOY_PRIVATE_KEY", secret)
    said = _tail("x" * 50_000 + "Error: driver said key=" + secret + "\nError: cuInit failed\n")
    assert secret[-200:-180] not in said and secret[:20] not in said, said[:200]
    assert "cuInit failed" in said or "withheld" in said


# -- the cache -----------------------------------------------------------------------------


def counting_interpreter(tmp_path: Path, site: Path) -> tuple[Path, Path]:
    """A fake interpreter that answers like the probe and counts how often it ran."""
    counter = tmp_path / "runs"
    torch_dir = site / "torch"
    torch_dir.mkdir(parents=True, exist_ok=True)
    (torch_dir / "version.py").write_text("__version__ = '9.9'\n")
    facts = {"torch": True, "torch_version": "9.9", "torch_cuda_version": None, "sys_path": [str(site)],
             "site_dirs": [str(site)], "stamp_files": [str(torch_dir / "version.py")], "errors": {}}
    line = "ENVDOCTOR-PROBE-RESULT " + json.dumps(facts)
    python = fake_interpreter(tmp_path, f"""
        echo run >> {counter}
        cat <<'EOF'
{line}
EOF
    """)
    return python, counter


def runs(counter: Path) -> int:
    return len(counter.read_text().split()) if counter.exists() else 0


def test_cache_hit_then_invalidation_by_each_input(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    site.mkdir()
    python, counter = counting_interpreter(tmp_path, site)
    cdir = tmp_path / "cache"
    probe = lambda: run_probe(str(python), use_cache=True, cache_directory=cdir)  # noqa: E731

    assert probe()["probe_cached"] is False and runs(counter) == 1
    assert probe()["probe_cached"] is True and runs(counter) == 1

    # a pip install or uninstall changes site-packages' mtime
    (site / "newpkg-1.0.dist-info").mkdir()
    os.utime(site, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert probe()["probe_cached"] is False and runs(counter) == 2
    assert probe()["probe_cached"] is True

    # torch rebuilt in place: its version file changes
    version = site / "torch" / "version.py"
    version.write_text("__version__ = '9.9.1'\n")
    os.utime(version, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    assert probe()["probe_cached"] is False and runs(counter) == 3

    # an environment variable that changes what the interpreter finds
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "elsewhere"))
    assert probe()["probe_cached"] is False and runs(counter) == 4
    assert probe()["probe_cached"] is True
    # ...but not an unrelated one
    monkeypatch.setenv("SOME_UNRELATED_VARIABLE", "x")
    assert probe()["probe_cached"] is True and runs(counter) == 4

    # the interpreter itself replaced
    os.utime(python, ns=(time.time_ns(), time.time_ns() + 3 * 10**9))
    assert probe()["probe_cached"] is False and runs(counter) == 5

    # ENVDOCTOR_NO_CACHE=1
    monkeypatch.setenv("ENVDOCTOR_NO_CACHE", "1")
    assert run_probe(str(python), cache_directory=cdir)["probe_cached"] is False and runs(counter) == 6
    assert run_probe(str(python), cache_directory=cdir)["probe_cached"] is False and runs(counter) == 7


def test_cache_expires(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    site.mkdir()
    python, counter = counting_interpreter(tmp_path, site)
    cdir = tmp_path / "cache"
    run_probe(str(python), use_cache=True, cache_directory=cdir)
    real_time = time.time
    monkeypatch.setattr(diskcache.time, "time", lambda: real_time() + cache.MAX_AGE_SECONDS + 60)
    assert run_probe(str(python), use_cache=True, cache_directory=cdir)["probe_cached"] is False
    assert runs(counter) == 2


def test_negative_answer_is_cached_until_torch_arrives(tmp_path):
    python = make_stub_python(tmp_path, torch_source=None)
    cdir = tmp_path / "cache"
    with pytest.raises(Unavailable):
        run_probe(str(python), use_cache=True, cache_directory=cdir)
    assert len(list(cdir.glob("torch-probe-*.json"))) == 1
    site = next((python.parent.parent / "lib").glob("python3*/site-packages"))
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(STUB_TORCH)
    os.utime(site, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert run_probe(str(python), use_cache=True, cache_directory=cdir)["torch_version"] == "2.4.0+cu121"


def test_two_venvs_on_one_base_interpreter_have_separate_entries(tmp_path):
    with_torch = make_stub_python(tmp_path, name="a")
    without = make_stub_python(tmp_path, torch_source=None, name="b")
    assert os.path.realpath(with_torch) == os.path.realpath(without)  # same binary behind both links
    cdir = tmp_path / "cache"
    assert run_probe(str(with_torch), use_cache=True, cache_directory=cdir)["torch_version"] == "2.4.0+cu121"
    with pytest.raises(Unavailable):
        run_probe(str(without), use_cache=True, cache_directory=cdir)
    assert run_probe(str(with_torch), use_cache=True, cache_directory=cdir)["probe_cached"] is True


def test_corrupt_cache_is_ignored_and_replaced(tmp_path):
    site = tmp_path / "site-packages"
    site.mkdir()
    python, counter = counting_interpreter(tmp_path, site)
    cdir = tmp_path / "cache"
    run_probe(str(python), use_cache=True, cache_directory=cdir)
    (entry,) = cdir.glob("torch-probe-*.json")
    entry.write_text("{not json")
    assert run_probe(str(python), use_cache=True, cache_directory=cdir)["probe_cached"] is False
    assert json.loads(entry.read_text())["schema"] == cache.SCHEMA
    assert run_probe(str(python), use_cache=True, cache_directory=cdir)["probe_cached"] is True


def test_unwritable_cache_dir_still_answers(tmp_path):
    site = tmp_path / "site-packages"
    site.mkdir()
    python, counter = counting_interpreter(tmp_path, site)
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("")
    assert run_probe(str(python), use_cache=True, cache_directory=blocker / "cache")["torch_version"] == "9.9"


def test_cache_location_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "envdoctor"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # invalid per the spec: ignored
    assert cache.cache_dir() == Path.home() / ".cache" / "envdoctor"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_dir() == Path.home() / ".cache" / "envdoctor"


def test_cache_holds_no_environment_values(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    site.mkdir()
    python, _ = counting_interpreter(tmp_path, site)
    monkeypatch.setenv("PYTHON_SECRET_TOKEN", "hunter2-very-secret")
    cdir = tmp_path / "cache"
    run_probe(str(python), use_cache=True, cache_directory=cdir)
    (entry,) = cdir.glob("torch-probe-*.json")
    assert "hunter2-very-secret" not in entry.read_text()


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.one_of(st.binary(max_size=300),
                         st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                                      lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                                      max_leaves=20).map(lambda v: json.dumps(v).encode())))
def test_cache_load_never_raises_on_any_file_content(tmp_path_factory, content):
    cdir = tmp_path_factory.mktemp("c")
    python = "/usr/bin/python-that-does-not-matter"
    cache.cache_file(python, cdir).write_bytes(content)
    # whatever the file holds, it is never taken for valid facts of this interpreter
    assert cache.load(python, "hash", directory=cdir) is None


def test_probe_script_is_self_contained():
    """The probe runs in interpreters without envdoctor: it may import only the
    standard library and torch."""
    import ast

    tree = ast.parse(probe_source(), feature_version=(3, 8))  # old interpreters must parse it too
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert "envdoctor" not in imported
    assert imported - {"torch"} <= set(sys.stdlib_module_names)


def test_the_torch_probe_dies_with_envdoctor_even_by_sigkill(tmp_path):
    """A torch import hung on a dead mount must not outlive a SIGKILLed envdoctor (the OOM
    killer, `timeout -s KILL`): the probe asks the kernel for SIGKILL when its parent dies.
    Shown with the probe's own source in a real interpreter whose `torch` hangs on import."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    pidfile = tmp_path / "probe.pid"
    (site / "torch" / "__init__.py").write_text(
        f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    parent_code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        os.environ["PYTHONPATH"] = {str(site)!r}
        from envdoctor.probe import run_probe
        run_probe(sys.executable, use_cache=False, timeout=120)
    """)
    dies_with_its_parent(parent_code, pidfile, "the torch probe")


def test_a_non_ascii_secret_cut_inside_its_url_spelling_never_shows(monkeypatch):
    """helper-25: 2,000 CJK characters, URL-quoted (9 bytes of spelling each), cut by the
    window inside that spelling: its last 166 characters showed, decodable."""
    from urllib.parse import quote

    from envdoctor.probe import _SCRUB_WINDOW, _tail

    secret = "".join(chr(0x4E00 + (i * 37) % 20000) for i in range(2000))
    monkeypatch.setenv("MY_TOKEN", secret)
    spelled = quote(secret, safe="")
    text = "j" * 100_000 + "?p=" + spelled + "\n" * (_SCRUB_WINDOW - 100) + "Segmentation fault\n"
    said = _tail(text)
    assert spelled[-60:-30] not in said and "%E" not in said, said[:200]


def test_a_secret_overlapping_another_is_not_a_place_to_start_showing():
    """helper-27: one secret's text beginning inside another's match was invisible to a
    left-to-right search, and the tail started inside it, after its line break."""
    from envdoctor.probe import _SCRUB_MARGIN, _tail

    b, a = "PREFIX-abcdef", "abcdef-line-one\nsecond-line-of-secret-A"
    text = "x" * 100 + "\n" + "p" * (_SCRUB_MARGIN + 25) + " " + b + a[6:] + "\nTraceback: boom\n"
    assert "second-line-of-secret" not in _tail(text, {"B_TOKEN": b, "A_PASSWORD": a}, cut_start=True)
    s = "Q1\nperiodic-secret-value-Q1"
    assert "periodic-secret" not in _tail("y" * _SCRUB_MARGIN + " " + s + s[2:] + "\nboom\n", {"S_TOKEN": s},
                                          cut_start=True)


def test_finding_a_safe_start_is_linear_and_blank_secrets_mask_nothing():
    """helper-27: a secret of just "\\n" made every line break "inside a secret", and the
    search for a safe start rescanned every range for each: 85 s for 120,000 lines."""
    from envdoctor.probe import _tail

    started = time.monotonic()
    said = _tail("\n" * 120_000 + "Traceback: boom\n", {"EMPTY_TOKEN": "\n"}, cut_start=True)
    assert time.monotonic() - started < 5 and said == "Traceback: boom", said
    many = "".join(f"line {i} secret-{i % 7}\nx\n" for i in range(20_000)) + "Traceback: boom\n"
    env = {f"K{i}_TOKEN": f"secret-{i}\nx" for i in range(7)}
    started = time.monotonic()
    said = _tail(many, env, cut_start=True)
    assert time.monotonic() - started < 5 and said.endswith("Traceback: boom"), said[-100:]


def test_a_multiline_secret_across_the_end_cut_is_not_cut_inside():
    """helper-28: stdout cut at its limit, the end margin landing inside a PEM key printed
    whole: cutting back to the line break before it kept the key's first lines, which no
    longer matched any spelling."""
    from envdoctor.probe import _SCRUB_MARGIN, _tail

    pem = ("-----BEGIN PRIVATE KEY-----\n"
           + "\n".join("MIIEv%02dQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQ" % i for i in range(20))
           + "\n-----END PRIVATE KEY-----")
    env = {"SSH_PRIVATE_KEY": pem}
    for pre in ("step ok\n" * 20000 + "loading key:\n", "step ok\n" * 2000 + "loading key:\n"):
        text = pre + pem + "\n" + "progress 42%\n" * 2000
        for into in (30, 600, len(pem) - 10):
            out = _tail(text[: len(pre) + into + _SCRUB_MARGIN], env, cut_end=True)
            assert "QIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQ" not in out, (len(pre), into, out[-200:])
            assert "loading key:" in out or "withheld" in out, out[-200:]


def test_a_program_that_is_not_python_is_asked_about():
    """Helper-91: `--python /bin/true` said only that the probe 'exited with status 0
    without a result'; a program that succeeds and prints nothing did not run Python."""
    with pytest.raises(ProbeError, match="printed nothing: is it a Python interpreter"):
        run_probe("/bin/true", use_cache=False, timeout=30)
