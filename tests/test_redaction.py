"""No planted secret appears in any output format, for this process's environment
and for a --pid target's, even when a careless plug-in echoes the whole environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from envdoctor import redact
from envdoctor.exporters import FORMATS
from helpers import cli

SECRETS = {
    "HF_TOKEN": "hf_PlantedTokenValue8d7f6",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPLANTED",
    "DB_PASSWORD": "correct-horse-battery-planted",
    "MY_SERVICE_API_KEY": "sk-live-planted-0123456789",
    "GITHUB_CREDENTIALS": "ghp_plantedCredential42",
    "TORCH_HUB_TOKEN": "allowlisted-name-but-secret-planted",  # allow-listed prefix, secret-looking name
    "NCCL_AUTH_KEY": "nccl-planted-key-material",
    "DATABASE_URL": "postgres://user:plantedpw@db.internal/prod",  # an innocuous name, still never shown
}


def _assert_clean(text: str, where: str):
    for name, value in SECRETS.items():
        assert value not in text, f"{name}'s value leaked into {where}"
        # a fragment long enough to identify it must not leak either
        assert value[:12] not in text, f"a prefix of {name}'s value leaked into {where}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_secret_in_any_format_for_self(fmt, plugin_env):
    env = {**plugin_env, **SECRETS}
    proc = cli("check", "--format", fmt, env=env)  # every default check
    assert proc.returncode in (0, 1), proc.stderr
    _assert_clean(proc.stdout + proc.stderr, fmt)
    # and with the careless plug-in that copies the environment into its summary and facts
    proc = cli("check", "--format", fmt, "--only", "example.echo_env", env=env)
    assert "example.echo_env" in proc.stdout or fmt == "compact"  # compact prints only warn/fail/error rows
    _assert_clean(proc.stdout + proc.stderr, f"{fmt} (echo_env)")
    if fmt == "json":
        assert redact.MASK in proc.stdout


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_secret_in_any_format_for_a_pid_target(fmt, plugin_env):
    # The target holds the secrets; envdoctor's own environment does not.
    child_env = {**os.environ, **SECRETS, "OMP_NUM_THREADS": "4"}
    child = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"], env=child_env,
                             stdout=subprocess.PIPE)
    child.stdout.readline()  # started: its environ is readable (not the empty window right after exec)
    try:
        for args in (("check", "--pid", str(child.pid), "--format", fmt),
                     ("check", "--pid", str(child.pid), "--format", fmt, "--only", "example.echo_env")):
            proc = cli(*args, env=plugin_env)
            assert proc.returncode in (0, 1), proc.stderr
            assert f"pid:{child.pid}" in proc.stdout or fmt == "prometheus" and "pid:" in proc.stdout
            _assert_clean(proc.stdout + proc.stderr, f"{fmt} --pid {' '.join(args[4:])}")
            if "example.echo_env" in args and fmt in ("json", "markdown"):  # formats that carry summaries whole:
                # the target's environment really was read, secrets and all
                assert "OMP_NUM_THREADS" in proc.stdout and "HF_TOKEN" in proc.stdout
        # the allow-listed, non-secret value is still visible: redaction is not blanket
        proc = cli("check", "--pid", str(child.pid), "--format", "json", "--only", "example.echo_env", env=plugin_env)
        assert "OMP_NUM_THREADS=4" in proc.stdout
    finally:
        child.kill()
        child.wait()


def test_visible_env_allow_list_and_masks():
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "HOME": "/root", "NCCL_IB_KEY": "abc", "HF_TOKEN": "x" * 20, "RANK": "0"}
    assert redact.visible_env(env) == {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_IB_KEY": redact.MASK, "RANK": "0"}


def test_an_unknown_variable_holding_an_option_word_masks_nothing():
    """helper-79: EXECFLAGS=--strict masked exec's own words ("***: not starting true"). An
    option word is vocabulary; a secret-named variable holding one is still masked."""
    scrub = redact.Scrubber(redact.secret_values([{"EXECFLAGS": "--strict", "MY_FLAG": "--fail-on"}]))
    assert scrub.text("--strict: not starting true; --fail-on") == "--strict: not starting true; --fail-on"
    scrub = redact.Scrubber(redact.secret_values([{"EXECFLAGS": "--strict=x9Qz7", "API_TOKEN": "--strict-token"}]))
    assert scrub.text("--strict=x9Qz7 --strict-token") == "*** ***"
    # helper-83: a token that begins with a dash is no option word (base64url, 1 in 75 do)
    for token in ("-Rk2Jx9_q3WmZ8vLp0aTq7Yc", "--Rk2Jx9q3WmZ8vLp0aTq7Yc", "--" + "ab-" * 20):
        scrub = redact.Scrubber(redact.secret_values([{"GITHUB_PAT": token}]))
        assert scrub.text(f"token {token} here") == "token *** here", token


def test_scrubber_masks_longest_first_and_leaves_short_values():
    scrub = redact.Scrubber(redact.secret_values([{"A_TOKEN": "abcdefgh", "B_TOKEN": "abcdefghijkl", "X_KEY": "1"}]))
    assert scrub.text("v=abcdefghijkl w=abcdefgh n=1") == "v=*** w=*** n=1"
    assert scrub.any({"k": ["abcdefgh", 3]}) == {"k": ["***", 3]}


def test_scrubber_memo_gives_the_same_answers_and_stays_bounded():
    """serve reuses a scrubber for every process of a job and scrubs the same texts again
    and again; the memo must answer as the first pass did, and a long-lived scrubber
    (the log's) must not grow with every distinct line."""
    scrub = redact.Scrubber(["abcdefgh12"], memo=True)
    texts = [f"line {i} abcdefgh12 user:pw@host{i} token={i}x" for i in range(redact._MEMO_TEXTS + 50)]
    first = [scrub.text(t) for t in texts]
    assert all("abcdefgh12" not in t and ":pw@" not in t for t in first)
    assert [scrub.text(t) for t in texts] == first
    assert len(scrub._memo) <= redact._MEMO_TEXTS
    assert redact.Scrubber(["abcdefgh12"])._memo is None  # off unless asked for


def test_a_scrubbers_next_pass_reuses_the_last_passes_texts_and_then_forgets_them(monkeypatch):
    """serve keeps a job's scrubber from one run to the next (next_pass): a text the last
    run scrubbed is not scrubbed again, answers as it did, and a text no run has seen
    since is forgotten, so the memo follows what the node shows now."""
    scrub = redact.Scrubber(["abcdefgh12"], memo=True)
    scrubbed: list[str] = []
    real = scrub._scrub
    monkeypatch.setattr(scrub, "_scrub", lambda value: scrubbed.append(value) or real(value))
    first = [scrub.text(t) for t in ("pid 1 abcdefgh12", "user:pw@host", "gone after this pass")]
    assert first == ["pid 1 ***", "user:***@host", "gone after this pass"] and len(scrubbed) == 3
    scrub.next_pass()
    assert [scrub.text(t) for t in ("pid 1 abcdefgh12", "user:pw@host")] == first[:2]
    assert len(scrubbed) == 3  # answered from the last pass
    scrub.next_pass()
    scrub.next_pass()
    assert scrub.text("gone after this pass") == "gone after this pass" and len(scrubbed) == 4  # forgotten: scrubbed anew
    assert redact.Scrubber(["x"]).next_pass() is None  # no memo: nothing to keep


@pytest.mark.parametrize("text, masked", [
    ("/etc/passwd: permission denied", "/etc/passwd: permission denied"),  # a path and what happened to it
    ("/run/secrets/db_password: not found", "/run/secrets/db_password: not found"),
    ("password: hunter2", "password: ***"),
    ("cfg/api_key=abc", "cfg/api_key=***"),  # '=' after a path still masks: a value was given
    ("https://h/p?token=abc", "https://h/p?token=***"),
])
def test_a_path_ending_in_a_secret_word_is_not_a_secret(text, masked):
    """exec said "/etc/passwd: *** denied (not an executable file)"."""
    assert redact.mask_credentials(text) == masked


@pytest.mark.parametrize("fmt", ["json", "prometheus"])
def test_a_check_id_is_never_masked_because_a_variable_holds_the_same_text(fmt):
    """Helper-15: EXPERIMENT=cache_growth (an unknown variable, so a possible secret) turned
    the row into `memory.***`, the Prometheus label too. Check ids and target labels are
    envdoctor's own names; the variable's value is still masked where a check prints it."""
    env = {"EXPERIMENT": "cache_growth", "API_TOKEN": "shm.size", "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = cli("check", "--only", "memory.cache_growth,shm.size", "--format", fmt, env=env)
    assert proc.returncode in (0, 1), proc.stderr
    if fmt == "json":
        import json

        ids = sorted(r["check"] for r in json.loads(proc.stdout)["results"])
        assert ids == ["memory.cache_growth", "shm.size"], ids
    else:
        assert 'check="memory.cache_growth"' in proc.stdout and 'check="shm.size"' in proc.stdout
        assert 'check="memory.***"' not in proc.stdout


def test_a_log_lines_check_and_target_fields_are_not_masked(monkeypatch):
    from envdoctor import log

    monkeypatch.setenv("EXPERIMENT", "cache_growth")
    line = log.format_line("info", "x", {"check": "memory.cache_growth", "target": "pid:1", "note": "cache_growth"})
    assert "check=memory.cache_growth" in line and "target=pid:1" in line
    assert "note=***" in line or 'note="***"' in line  # other fields are still scrubbed


def test_a_huge_value_makes_a_bounded_log_line_cut_after_redaction(monkeypatch):
    """exec --fix logged a 100 KB NCCL_DEBUG twice in one line, 200 KB (helper-19)."""
    from envdoctor import log

    secret = "s3cr3t-" + "q" * 40
    monkeypatch.setenv("MY_API_TOKEN", secret)
    huge = "x" * (log.MAX_VALUE_CHARS - 20) + " " + secret + " " + "z" * 100_000  # the cut falls inside the secret
    line = log.format_line("info", f"set NCCL_DEBUG {huge}", {"old": huge, "check": "dist.env"})
    assert len(line) < 4 * log.MAX_VALUE_CHARS
    assert "more characters)" in line and "s3cr" not in line  # masked whole, then cut: no head of it is left
    assert "check=dist.env" in line
