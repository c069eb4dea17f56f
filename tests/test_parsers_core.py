"""Property tests for the engine's own parsers: on any input they return a value
or raise envdoctor's ParseError, nothing else."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from envdoctor.errors import ParseError
from envdoctor.procfs import parse_environ
from envdoctor.units import docker_size, format_bytes, k8s_size, parse_size


@given(st.one_of(st.text(), st.integers(), st.floats(), st.none(), st.booleans(), st.binary()))
def test_parse_size_returns_bytes_or_parse_error(value):
    try:
        result = parse_size(value)
    except ParseError:
        return
    assert isinstance(result, int) and result >= 0


@pytest.mark.parametrize("text, expected", [
    ("64m", 64 * 1024**2), ("64M", 64 * 1024**2), ("16g", 16 * 1024**3), ("1GiB", 1024**3), ("1Gi", 1024**3),
    ("1.5g", int(1.5 * 1024**3)), ("1048576", 1048576), (" 2 MiB ", 2 * 1024**2), ("1GB", 10**9), ("512kB", 512000),
    (4096, 4096),
])
def test_parse_size_spellings(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "lots", "-1g", "1.2.3g", "5 parsecs", "1e9", True, -5, None])
def test_parse_size_rejects(bad):
    with pytest.raises(ParseError):
        parse_size(bad)


@given(st.integers(min_value=0, max_value=2**60))
def test_docker_and_k8s_sizes_round_up_and_parse_back(n):
    assert parse_size(docker_size(n)) >= n
    assert parse_size(k8s_size(n)) >= n
    assert isinstance(format_bytes(n), str)


def test_format_bytes_is_exact_where_it_can_be():
    assert format_bytes(64 * 1024**2) == "64 MiB"
    assert format_bytes(1536) == "1.5 KiB"


@given(st.binary())
def test_parse_environ_never_fails_on_bytes(data):
    env = parse_environ(data)
    assert all(isinstance(k, str) and k and isinstance(v, str) for k, v in env.items())


@given(st.dictionaries(st.text(alphabet=st.characters(blacklist_characters="=\0", blacklist_categories=("Cs",)), min_size=1),
                       st.text(alphabet=st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)))))
def test_parse_environ_round_trips_what_a_process_would_hold(env):
    data = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    assert parse_environ(data) == env


def test_parse_environ_rejects_non_bytes_with_parse_error():
    with pytest.raises(ParseError):
        parse_environ("A=1")  # type: ignore[arg-type]


def _environ_entry_by_entry(data: bytes) -> dict[str, str]:
    """The rule parse_environ keeps, written the slow way: each entry split at its first
    '=' and each side decoded on its own."""
    env = {}
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            env.setdefault(name.decode("utf-8", "replace"), value.decode("utf-8", "replace"))  # the first wins
    return env


@settings(max_examples=500)
@given(st.lists(st.one_of(st.binary(max_size=12), st.sampled_from([b"=", b"\0", b"\xc3", b"\xe2\x82", b"\xff", b"A=\xc3\0"])),
                max_size=12).map(b"".join))
def test_parse_environ_decoding_once_reads_what_each_entry_decoded_alone_reads(data):
    """Broken UTF-8 next to a NUL or an '=' must not swallow them when the block is decoded whole."""
    assert parse_environ(data) == _environ_entry_by_entry(data)


def test_a_name_given_twice_is_read_as_the_process_reads_it_the_first():
    assert parse_environ(b"PATH=/bin\0OMP_NUM_THREADS=64\0OMP_NUM_THREADS=1\0") == {"PATH": "/bin", "OMP_NUM_THREADS": "64"}


def test_a_running_process_with_a_duplicated_variable_is_judged_by_the_value_it_uses(tmp_path):
    """A real process started with OMP_NUM_THREADS twice in its environment block: Python
    (like glibc's getenv) sees the first; check --pid must judge that one too."""
    import json
    import os
    import subprocess
    import sys

    from helpers import cli

    code = "import os, sys, time; print(os.environ['OMP_NUM_THREADS'], flush=True); sys.stdin.read()"
    env = [b"PATH=/usr/bin:/bin", b"OMP_NUM_THREADS=64", b"OMP_NUM_THREADS=1"]
    # os.execve takes a mapping, which cannot hold a name twice: the C library's execve can
    launcher = ("import ctypes, sys\n"
                "libc = ctypes.CDLL(None, use_errno=True)\n"
                "def array(items):\n"
                "    return (ctypes.c_char_p * (len(items) + 1))(*items, None)\n"
                "argv = [a.encode() for a in (sys.argv[1], '-c', sys.argv[2])]\n"
                f"libc.execve(argv[0], array(argv), array({env!r}))\n"
                "sys.exit('execve failed: %d' % ctypes.get_errno())\n")
    proc = subprocess.Popen([sys.executable, "-c", launcher, sys.executable, code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "64"  # what the process itself uses
        out = cli("check", "--pid", str(proc.pid), "--only", "cpu.threads", "-f", "json", timeout=60)
        row = json.loads(out.stdout)["results"][0]
        assert "OMP_NUM_THREADS=64" in row["summary"], row["summary"]
    finally:
        proc.communicate("", timeout=30)


def test_a_secret_given_twice_is_masked_in_both_its_values():
    """helper-120: of HF_TOKEN given twice the first is the one programs read, and only it
    was taken as a secret; the second, held in OMP_NUM_THREADS too, was shown. Both are
    secrets; the one read stays the first, and serve's memo tells the two environments apart."""
    from envdoctor import redact
    from envdoctor.serve.secrets_memo import digest

    env = parse_environ(b"HF_TOKEN=hf_FirstTokenValue0001\0HF_TOKEN=hf_SecondDupTokenZZ9\0OMP_NUM_THREADS=hf_SecondDupTokenZZ9\0")
    assert env["HF_TOKEN"] == "hf_FirstTokenValue0001" and env.shadowed == (("HF_TOKEN", "hf_SecondDupTokenZZ9"),)
    secrets = redact.secret_values([env])
    assert "hf_FirstTokenValue0001" in secrets and "hf_SecondDupTokenZZ9" in secrets
    once = parse_environ(b"HF_TOKEN=hf_FirstTokenValue0001\0OMP_NUM_THREADS=hf_SecondDupTokenZZ9\0")
    assert once == {k: v for k, v in env.items()} and digest(once) != digest(env)
