"""Issue 8, family 3: credentials inside values, and the opposite fault (masking by
coincidence). Hypothesis plants credentials of every shape and spelling in reports
and in the probe's stderr; the CLI runs plant them in real environments and read
every output format; the coincidence tests prove that public values stay visible."""

from __future__ import annotations

import json
import os
import re
import socket
import string
import subprocess
import sys
import urllib.parse

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from envdoctor import redact, secret_spans
from envdoctor.exporters import FORMATS
from envdoctor.model import Report, Result, Status
from helpers import cli

# A secret: no blanks (a credential is one token), at least one letter or digit at
# each end would make it "glued" in our embeddings, so any printable ASCII is allowed.
SECRET_CHARS = string.ascii_letters + string.digits + "!#$%*+-./:=?@^_~[]{}|"
secrets_st = st.text(SECRET_CHARS, min_size=8, max_size=40).filter(lambda s: s.strip(".:/=@") != "")
short_st = st.text(string.ascii_letters + string.digits, min_size=1, max_size=3)
DELIMS = [" ", "=", "'", '"', ":", ",", "(", ")", "\n", "; "]


def _spellings(secret: str) -> list[str]:
    return [secret, repr(secret)[1:-1], json.dumps(secret)[1:-1], urllib.parse.quote(secret, safe=""),
            secret.encode("unicode_escape").decode(),
            urllib.parse.quote(secret),  # quote()'s default keeps "/" (helper-82: a base64 key in a query)
            re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), urllib.parse.quote(secret, safe=""))]


def _fragments(secret: str, n: int = 8) -> list[str]:
    """Pieces long enough to identify a secret: its prefix and suffix."""
    return [secret[:n], secret[-n:]] if len(secret) >= n else [secret]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=secrets_st, name=st.sampled_from(["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "NCCL_AUTH_KEY",
                                                  "GITHUB_CREDENTIALS", "MY_UNKNOWN_SETTING"]),
       left=st.sampled_from(DELIMS), right=st.sampled_from(DELIMS), spelling=st.integers(0, 6),
       prefix=st.text(max_size=20), suffix=st.text(max_size=20))
def test_a_secret_variables_value_is_masked_in_every_spelling(secret, name, left, right, spelling, prefix, suffix):
    """Whatever a check echoes (repr, JSON, URL-quoted), the value of a secret-named or unknown
    variable does not reach a report: summary, fix, facts (keys too), target, system facts."""
    assume(secret not in redact.public_values([{name: secret}]))
    assume(not any(secret in t or t in secret for t in (prefix, suffix) if t))
    form = _spellings(secret)[spelling]
    text = f"{prefix} {left}{form}{right} {suffix}"
    result = Result(Status.WARN, text, text, {text: [text, {"k": text}]}, "x.y", "self")
    report = Report("h", "0", "2026-01-01T00:00:00+00:00", "self", [result], {"os": text})
    clean = redact.redact_report(report, [{name: secret, "PATH": "/usr/bin"}])
    r = clean.results[0]
    dumped = json.dumps([r.summary, r.remediation, r.facts, clean.system], ensure_ascii=False)
    shown = "\n".join([r.summary, r.remediation, *r.facts, *r.facts[next(iter(r.facts))][:1], clean.system["os"]])
    for spelled in _spellings(secret):
        assert spelled not in shown, (spelled, shown)
    assert redact.MASK in dumped


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.tuples(st.sampled_from(["HF_TOKEN", "DB_PASSWORD", "MY_UNKNOWN_SETTING", "NCCL_AUTH_KEY"]),
                                 st.one_of(secrets_st, short_st, st.text(SECRET_CHARS + " \n", min_size=1, max_size=300))),
                       min_size=1, max_size=4),
       pieces=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.sampled_from(["whole", "start", "end", "cut"]),
                                 st.sampled_from(DELIMS + ["", "x", "9"])), min_size=1, max_size=6))
def test_a_process_with_thousands_of_variables_is_scrubbed_as_one_with_a_few(values, pieces):
    """helper-70: a process with 70,000 variables made one serve run take 17 s, in a pattern of
    every value's spellings. Past a few hundred, the spellings are looked up by their first
    characters in each text; what is masked must not change: the same text, scrubbed by a
    scrubber of these values alone and by one that also holds 2,000 that are not there."""
    env = {f"{name}_{i}": value for i, (name, value) in enumerate(values)}
    text = ""
    for which, spelling, part, glue in pieces:
        form = _spellings(values[which % len(values)][1])[spelling]
        form = {"whole": form, "start": form[:20], "end": form[-20:], "cut": form[3:40]}[part]
        text += glue + form
    assume("filler" not in text)
    many = {**env, **{f"U{i:05d}": f"filler{i:05d}qq" for i in range(2000)}}
    index_above = secret_spans.INDEX_ABOVE
    try:
        secret_spans.INDEX_ABOVE = 10**9  # these few as one alternation, whatever their number
        few_scrubber = redact.Scrubber(redact.secret_values([env]))
        few_free = redact.scrub_free_text(text, [env])
    finally:
        secret_spans.INDEX_ABOVE = index_above
    many_scrubber = redact.Scrubber(redact.secret_values([many]))
    assert many_scrubber.text(text) == few_scrubber.text(text)
    assert many_scrubber.spans(text) == few_scrubber.spans(text)
    assert redact.scrub_free_text(text, [many]) == few_free


@settings(max_examples=150, deadline=None)
@given(user=st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=12),
       password=st.text(string.ascii_letters + string.digits + "!$%*+-.=_~", min_size=1, max_size=30),
       host=st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z][a-z0-9-]{0,8}){0,2}", fullmatch=True),
       scheme=st.sampled_from(["", "https://", "postgres://", "redis://", "s3://"]),
       shape=st.sampled_from(["userinfo", "pair", "header", "json"]),
       key=st.sampled_from(["token", "password", "api_key", "AWS_SECRET_ACCESS_KEY", "X-Auth-Token", "passwd", "secret"]))
def test_credentials_are_masked_by_shape_wherever_they_come_from(user, password, host, scheme, shape, key):
    """No environment knows these: a credential is recognised by its shape alone (URL
    userinfo, name=value pairs with a secret name, Authorization headers), short ones too."""
    if shape == "userinfo":
        text = f"MASTER_ADDR={scheme}{user}:{password}@{host} did not resolve"
    elif shape == "pair":
        text = f"TORCH_HOME=https://{host}/models?{key}={password}&x=1"
    elif shape == "header":
        text = f"curl -H 'Authorization: Bearer {password}{'x' * 6}' https://{host}/"
        password += "x" * 6
    else:
        text = json.dumps({key: password, "host": host})
    assume(text.count(password) == 1 and "*" not in password)  # it occurs once, as the credential
    masked = redact.mask_credentials(text)
    assert password not in masked, (text, masked)
    assert host in masked  # the rest of the value stays readable: mask the credential, not the line


@settings(max_examples=100, deadline=None)
@given(secret=st.one_of(secrets_st, short_st), spelling=st.integers(0, 4), cut=st.integers(0, 40),
       noise=st.text(string.printable, max_size=200))
def test_probe_stderr_is_redacted_before_its_tail_is_cut(secret, spelling, cut, noise):
    """The probe's stderr tail: escaped spellings, secrets shorter than reports mask, and a cut
    that falls inside the secret: none leaves any identifying part of it."""
    from envdoctor.probe import _STDERR_TAIL, _tail

    assume(secret not in redact.public_values([os.environ, {"HF_TOKEN": secret}]))
    # a cut inside the word "token" before it leaves its last letters ("...n ***"): not the secret
    assume(len(secret) >= 4 or secret not in "token")
    form = _spellings(secret)[spelling]
    # place the secret so the tail's cut lands `cut` characters into it
    tail_room = _STDERR_TAIL - (len(form) - min(cut, len(form) - 1))
    text = "x" * 3000 + f" token {form} " + "." * max(0, tail_room - 8) + " " + noise
    said = _tail(text, {"HF_TOKEN": secret})
    # the secret's identifying fragments (for short secrets: the secret as a whole token) are gone
    if len(secret) >= 4:
        for fragment in _fragments(form, 4 if len(form) < 8 else 6):
            assert fragment not in said.replace(redact.MASK, "\0") or fragment in noise or fragment in "x" * 10 + "." * 10, \
                (fragment, said[:200])
    else:
        assert not re.search(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", said.replace(noise, "")), said[:200]


def test_values_that_are_public_anyway_are_not_masked():
    """Mask by credential, not by coincidence: a secret-named variable that happens to hold the
    host name, the interpreter path or an interface name does not hide them from the report."""
    host = socket.gethostname()
    interfaces = [name for _, name in socket.if_nameindex()]
    env = {"MY_API_KEY": host, "SECRET_PYTHON": sys.executable, "AUTH_IFACE": interfaces[0] * 1,
           "NCCL_SOCKET_IFNAME": interfaces[0], "DEPLOY_TOKEN": "tok-planted-0123456789"}
    text = f"host {host}, interpreter {sys.executable}, NCCL_SOCKET_IFNAME={interfaces[0]}, token tok-planted-0123456789"
    report = Report(host, "0", "2026-01-01T00:00:00+00:00", "self", [Result(Status.OK, text, "", {}, "x.y", "self")],
                    {"python_executable": sys.executable})
    clean = redact.redact_report(report, [env])
    summary = clean.results[0].summary
    assert host in summary and sys.executable in summary and f"NCCL_SOCKET_IFNAME={interfaces[0]}" in summary
    assert "tok-planted-0123456789" not in summary  # a real secret in the same line still goes
    assert clean.host == host


def test_a_credential_wins_over_a_shown_variable_that_holds_it_a_short_coincidence_does_not():
    """A secret-named variable's value of 8 characters or more is masked even where a shown
    variable holds it (helper-65: `OMP_NUM_THREADS=<HF_TOKEN>` was quoted whole) and when it is
    glued inside a longer word (`LOCAL_RANK=x<token>`). A shorter secret-named value that a shown
    variable also holds, and an unknown variable's value glued to other text, stay visible."""
    token = "hf_Qw7Zp2Lk9Rt4"
    env = {"HF_TOKEN": token, "OMP_NUM_THREADS": token, "LOCAL_RANK": f"x{token}", "AUTH_MODE": "local",
           "NCCL_SOCKET_IFNAME": "local", "CLUSTER_NAME": "gpu-pool", "PATH": "/usr/bin"}
    text = (f"OMP_NUM_THREADS='{token}' is invalid; LOCAL_RANK='x{token}' is not an integer; "
            f"NCCL_SOCKET_IFNAME=local; host gpu-pool7")
    report = Report("h", "0", "2026-01-01T00:00:00+00:00", "self", [Result(Status.FAIL, text, "", {}, "x.y", "self")], {})
    summary = redact.redact_report(report, [env]).results[0].summary
    assert token not in summary and token[:8] not in summary, summary
    assert "OMP_NUM_THREADS='***'" in summary and "LOCAL_RANK='x***'" in summary  # the judgement stays readable
    assert "NCCL_SOCKET_IFNAME=local" in summary and "gpu-pool7" in summary


def test_a_credential_that_is_part_of_the_hosts_names_leaves_them_whole():
    """helper-66: a credential that is part of the host name or of the interpreter's path turned
    them into `***7.cluster.local` and `***3`; helper-68: one of an "e" and seven blanks, whose
    stripped spelling is "e", turned "Debian" into "D***bian"."""
    host = "gpu-node-0017.cluster.local"
    env = {"HOST_TOKEN": "gpu-node-001", "PYTHON_SECRET": sys.executable[:-1], "MY_TOKEN": "e       "}
    text = f"host {host}; interpreter {sys.executable}; Debian GNU/Linux 12"
    report = Report(host, "0", "2026-01-01T00:00:00+00:00", "self", [Result(Status.FAIL, text, "", {}, "x.y", "self")],
                    {"python_executable": sys.executable, "os": "Debian GNU/Linux 12 (bookworm)"})
    clean = redact.redact_report(report, [env])
    assert clean.results[0].summary == text
    assert clean.host == host and clean.system["python_executable"] == sys.executable
    assert clean.system["os"] == "Debian GNU/Linux 12 (bookworm)"


def test_a_cut_quote_of_a_credential_is_masked_from_its_first_characters():
    """helper-68: a message that cuts a long value to 37 characters (dist.consistency quoting
    SLURM_PROCID) showed 36 of a 40-character token, which as a whole never appeared."""
    from envdoctor import launch

    token = "Zq9vK2mP7xLw4RtY8nB3cH6jD1fG5sA0eU7iO2pQ"
    text = f"SLURM_PROCID ({launch._short(token)} of {launch._short('x' + token)}): nothing to compare"
    assert token[:30] in text  # what the message shows before redaction
    clean = redact.Scrubber(redact.secret_values([{"MY_TOKEN": token}])).text(text)
    assert token[:8] not in clean and clean.count(redact.MASK) == 2, clean
    assert clean.startswith("SLURM_PROCID ('***") and "nothing to compare" in clean, clean


@pytest.mark.parametrize("first, second", [("alpha1234567beta", "beta987654321gamma"),
                                           ("Zq9vK2mP7xLw4RtY8nB3", "4RtY8nB3cH6jD1fG5sA0eU7i")])
def test_two_credentials_that_overlap_in_a_text_are_both_masked_whole(first, second):
    """Where one credential's end is another's start, masking them one after the other left the
    second's tail (`x ***987654321gamma y`): what is masked is every character either covers."""
    overlap = next(n for n in range(min(len(first), len(second)), 0, -1) if first.endswith(second[:n]))
    glued = first + second[overlap:]
    envs = [{"API_TOKEN": first, "DB_PASSWORD": second}]
    for text in (f"x {glued} y", f"x {glued}", f"{second[:overlap]}{glued}:{first}"):
        for clean in (redact.scrub_free_text(text, envs),
                      redact.Scrubber(redact.secret_values(envs)).text(text)):
            assert first[:6] not in clean and second[-6:] not in clean, (text, clean)
    assert redact.scrub_free_text(f"x {glued} y", envs) == "x *** y"
    scrubber = redact.free_text_scrubber(envs)
    assert scrubber.spans(f"x {glued} y") == [(2, 2 + len(glued))]


def test_a_word_of_repeated_credential_starts_is_masked_to_its_end():
    """Each credential start in a word is masked to the word's end (a cut quote of it): a word of
    hundreds of them, glued, is one masked word, found in one pass (searched for with that tail
    at every start, such a word cost its length squared)."""
    token = "Zq9vK2mP7xLw4RtY8nB3cH6jD1fG5sA0eU7iO2pQ"
    word = token[:20] * 3000 + "tail"
    scrubber = redact.Scrubber(redact.secret_values([{"MY_TOKEN": token}]))
    assert scrubber.text(f"a {word} b '{token[:17]}...' c") == "a *** b '***' c"
    assert scrubber.spans(f"a {word} b") == [(2, 2 + len(word))]


@settings(max_examples=150, deadline=None)
@given(body=st.text(SECRET_CHARS + " \n;,)", min_size=20, max_size=600), cut=st.integers(16, 600),
       glue=st.sampled_from(["x", "9", ""]), quote=st.sampled_from(["'", '"', "(", " "]))
def test_a_credential_holding_delimiters_is_masked_as_far_as_the_text_agrees(body, cut, glue, quote):
    """helper-72: the first 16 characters of a credential start a masked word, which ended at
    the first delimiter, inside the credential when it holds one (a PEM body's line breaks,
    '; '): glued to a letter (a long one, matched whole only as a token) or quoted cut short,
    the rest of it showed. It is now masked as far as the text agrees with it."""
    token = "Zq9vK2mP7xLw4RtY" + body
    assume(token.strip() == token)
    scrub = redact.Scrubber(redact.secret_values([{"TLS_CERT_KEY": token}]))
    for before, quoted, after in ((f"got {glue}", token, f"{glue} end"), (f"bad value {quote}", token[:cut], "... end")):
        clean = scrub.text(before + quoted + after)
        # the mask stands where the credential stood, and what follows it is the text's own
        # (to the end of the word the quote was part of, at most)
        assert clean.startswith(before + redact.MASK) and after.endswith(clean[len(before + redact.MASK):]), (
            before + quoted + after, clean)


def test_a_certificate_glued_to_a_word_or_quoted_cut_short_is_masked_whole():
    import base64
    import textwrap

    cert = "\n".join(textwrap.wrap(base64.b64encode(bytes(range(256)) * 2).decode(), 64))  # 11 lines, 683 characters
    scrub = redact.Scrubber(redact.secret_values([{"TLS_CERT_KEY": cert}]))
    assert scrub.text(f"key={cert}x") == "key=***x"
    assert scrub.text(f"bad key '{cert[:250]}...' given") == "bad key '***...' given"
    token = "AbcdefghijklmnopqrstUV " + "Z" * 300
    scrub = redact.Scrubber(redact.secret_values([{"SECRET_TOKEN": token, "LOCAL_RANK": "x" + token}]))
    assert scrub.text(f"LOCAL_RANK='x{token}' is not a number") == "LOCAL_RANK='x***' is not a number"


@pytest.mark.parametrize("value", ["\ud800abcdefgh", "\udc41bcdefghi", "ab\udcffcdefgh"])
def test_a_lone_surrogate_in_a_value_is_masked_not_raised(value):
    """helper-72: a surrogate that no byte makes (JSON's "\\ud800", from an attached document)
    raised UnicodeEncodeError out of the scrubber; one that a byte makes still works."""
    assert redact.scrub_free_text(f"x {value} y", [{"FOOBAR": value}]) == "x *** y"
    assert redact.Scrubber(redact.secret_values([{"MY_TOKEN": value}])).text(f"x {value} y") == "x *** y"


def test_a_very_long_credential_is_masked_where_a_shown_variable_holds_it_whole():
    """A credential longer than MAX_ANYWHERE_LENGTH is matched as a whole token only (helper-68:
    matched anywhere, 30,000 "a"s inside 60,000 took 6.8 s a format), and still wins over
    the shown variable that holds it."""
    token = "a" * 30000
    scrub = redact.Scrubber(redact.secret_values([{"MY_TOKEN": token, "OMP_NUM_THREADS": token}]))
    assert scrub.text(f"OMP_NUM_THREADS='{token}' is invalid") == "OMP_NUM_THREADS='***' is invalid"
    assert scrub.text("a" * 60000 + " b") == "*** b"


def test_a_long_credential_glued_inside_a_word_is_masked_from_its_first_characters():
    """A credential longer than MAX_ANYWHERE_LENGTH, glued inside a longer word, showed whole: it
    is found there by its first FRAGMENT_LENGTH characters and masked to the end of the word."""
    token = "".join(string.ascii_letters[i * 7 % 52] + str(i % 10) for i in range(200))  # 400 characters
    assert len(token) > redact.MAX_ANYWHERE_LENGTH
    scrub = redact.Scrubber(redact.secret_values([{"MY_TOKEN": token, "LOCAL_RANK": "x" + token}]))
    assert scrub.text(f"LOCAL_RANK='x{token}y' is not a number; {token}.") == "LOCAL_RANK='x***' is not a number; ***"
    assert scrub.text(f"cut: {token[:40]}...") == "cut: ***"


def test_check_pid_masks_a_token_that_the_ddp_and_thread_variables_hold(tmp_path):
    """The same through the CLI on a real process: the token stands in the variables the checks
    quote, and no output format shows it, while the checks still judge those variables."""
    token = "hf_Vb3Nm8Qs1Xw6Ty0"
    child_env = {**os.environ, "HF_TOKEN": token, "OMP_NUM_THREADS": token, "LOCAL_RANK": f"x{token}",
                 "WORLD_SIZE": token, "MASTER_PORT": token, "NCCL_SOCKET_IFNAME": token}
    child = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(60)"], env=child_env,
                             stdout=subprocess.PIPE)
    child.stdout.readline()
    try:
        for fmt in FORMATS:
            proc = cli("check", "--pid", str(child.pid), "--format", fmt)
            assert proc.returncode == 1, proc.stderr  # cpu.threads and dist.env fail on these values
            assert token not in proc.stdout + proc.stderr and token[:8] not in proc.stdout, (fmt, proc.stdout)
        rows = {r["check"]: r for r in json.loads(cli("check", "--pid", str(child.pid), "--format", "json").stdout)["results"]}
        assert rows["cpu.threads"]["status"] == "fail" and "OMP_NUM_THREADS='***'" in rows["cpu.threads"]["summary"]
    finally:
        child.kill()
        child.wait()


SECRET_PW = "Pl4nted-Pw-9f8e7d"
SECRET_TOKEN = "ghp_Pl4ntedTokenValue0123456789"


@pytest.mark.parametrize("fmt", FORMATS)
def test_cli_masks_credentials_inside_allow_listed_values_in_every_format(fmt, tmp_path):
    """A user:password@host in MASTER_ADDR and a token in a URL of an allow-listed variable:
    shown (they are judged) but with the credential masked, in every format, to stdout and -o."""
    env = {"MASTER_ADDR": f"trainer:{SECRET_PW}@master-node.invalid", "MASTER_PORT": "29500", "WORLD_SIZE": "2",
           "RANK": "1", "TORCH_HOME": f"https://{SECRET_TOKEN}@models.example.invalid/hub",
           "PYTORCH_KERNEL_CACHE_PATH": f"/cache?token={SECRET_TOKEN}", "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1",
           "COLUMNS": "1000"}  # one line per row: a value is found whole
    out = tmp_path / f"report.{fmt}"
    for extra in ((), ("-o", str(out))):
        proc = cli("check", "--only", "dist.env", "--format", fmt, "--timeout", "5", *extra, env=env)
        assert proc.returncode in (0, 1), proc.stderr
        text = proc.stdout + proc.stderr + (out.read_text(encoding="utf-8") if extra else "")
        for secret in (SECRET_PW, SECRET_TOKEN):
            for fragment in _fragments(secret):
                assert fragment not in text, f"{fragment!r} leaked in {fmt} {extra}"
        if fmt in ("json", "markdown", "text"):
            assert "master-node.invalid" in text  # the judged value is still shown, minus the credential


def test_cli_probe_stderr_does_not_leak_escaped_short_or_cut_secrets(tmp_path):
    """A broken torch whose import error prints the secrets: escaped, short, and cut by the tail."""
    fake = tmp_path / "python"
    long_secret = "Zq9-" + "k" * 20 + "-EndOfSecret42"
    fake.write_text("#!/bin/sh\n"
                    f"printf '%s\\n' \"ValueError: bad token '$HF_TOKEN' json=\\\"$HF_TOKEN\\\" short=$DB_PASS\" >&2\n"
                    "printf 'repr: %s\\n' \"$ESCAPED\" >&2\n"
                    "head -c 1480 /dev/zero | tr '\\0' '.' >&2\n"
                    f"printf ' api_key=%s\\n' \"$HF_TOKEN\" >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    env = {"HF_TOKEN": long_secret, "DB_PASS": "a1b", "ESCAPED": repr("tab\there-Secret99\n")[1:-1],
           "OTHER_SECRET": "tab\there-Secret99\n", "ENVDOCTOR_NO_CACHE": "1", "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = cli("check", "--only", "torch.cudnn", "--python", str(fake), "--format", "json", env=env)
    assert proc.returncode in (0, 1), proc.stderr
    row = json.loads(proc.stdout)["results"][0]
    assert row["status"] == "error" and "exited with status 1" in row["summary"]
    text = proc.stdout
    for fragment in ("Zq9-kkkk", "EndOfSecret42", "Secret42", "here-Secret99", "short=a1b"):
        assert fragment not in text, f"{fragment!r} leaked: {row['summary'][-300:]}"


def test_cli_keeps_the_interpreter_and_host_visible_when_a_secret_variable_holds_them():
    env = {"MY_SESSION_KEY": sys.executable, "CLUSTER_AUTH_HOST": socket.gethostname(),
           "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"}
    proc = cli("check", "--only", "shm.size", "--format", "json", env=env)
    report = json.loads(proc.stdout)
    assert report["host"] == socket.gethostname()
    assert report["system"]["python_executable"] == sys.executable
    assert report["system"]["envdoctor_python"] == sys.executable


@settings(max_examples=100, deadline=None)
@given(secret=secrets_st, key=st.sampled_from(["token", "api_key", "password", "master", "url", "msg_detail"]),
       shape=st.sampled_from(["plain", "userinfo", "pair", "env"]), extra=st.text(max_size=30))
def test_log_lines_carry_no_credential(secret, key, shape, extra):
    """serve/exec log lines: one line each, a secret-named field masked whole, credentials
    masked by shape, the values of secret variables masked wherever they appear."""
    from envdoctor import log

    assume(secret not in redact.public_values([os.environ, {"HF_TOKEN": secret}]) and "*" not in secret)
    saved = os.environ.get("HF_TOKEN")
    os.environ["HF_TOKEN"] = secret
    value = {"plain": secret, "userinfo": f"https://u:{secret}@h.example/x", "pair": f"x?token={secret}&y=1",
             "env": f"{extra} {secret} {extra}"}[shape]
    if shape == "plain" and key not in ("token", "api_key", "password"):
        value = f"'{secret}'"  # a secret variable's value, quoted in a message
    try:
        line = log.format_line("info", f"run finished {value}", {key: value, "n": 3})
    finally:
        if saved is None:
            del os.environ["HF_TOKEN"]
        else:
            os.environ["HF_TOKEN"] = saved
    assert "\n" not in line
    assert secret not in line and repr(secret)[1:-1] not in line, line


def test_interface_names_are_if_nameindex_s_without_socket():
    """The public interface names come from /proc/self/net/dev, as if_nameindex gives them."""
    from envdoctor import redact

    assert sorted(redact._interface_names()) == sorted(name for _, name in socket.if_nameindex())


@pytest.mark.parametrize("table", [b"", b"not the kernel's table\n"], ids=["empty", "foreign"])
def test_a_net_dev_that_is_not_the_kernels_falls_back_to_if_nameindex(monkeypatch, table):
    """helper-60: a readable but empty /proc/self/net/dev gave no names, and a secret equal to
    an interface name was masked where it had not been."""
    import io

    from envdoctor import redact

    monkeypatch.setattr(redact, "open", lambda *a, **k: io.BytesIO(table), raising=False)
    assert sorted(redact._interface_names()) == sorted(name for _, name in socket.if_nameindex())
