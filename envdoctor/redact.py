"""Keep secrets out of every output (DESIGN principle 3), and keep every string
of a report safe to write in any format.

Applied once to the whole report before any exporter sees it (and to log lines
and the probe's stderr, which are free text from places we do not control):

1. Showing the environment: only names on an allow-list relevant to the checks
   (CUDA_*, NCCL_*, OMP_*, the DDP variables, ...) may have their values shown,
   and even those are masked when the name looks like a secret (TOKEN, SECRET,
   KEY, PASSWORD, CREDENTIAL, ...). `visible_env()` applies this rule.
2. Credentials inside values, whatever variable they came from: the password of
   a URL's userinfo (`postgres://user:pw@db`, `user:pw@host` in MASTER_ADDR), the
   whole userinfo of a URL that has no password (`https://TOKEN@github.com`), the
   value of `token=`/`password=`/`api_key:`-style pairs, and `Bearer`/`Basic`
   credentials. These are masked by shape, so a credential in an allow-listed
   variable is masked too.
3. A safety net over every string: the value of a secret-looking variable, or of
   a variable that is on neither the allow-list nor the list of well-known
   harmless names, is masked wherever it appears as a whole token, in its plain
   and its escaped spellings (repr, JSON, URL-quoted), so a check or a probe that
   echoes it still leaks nothing. Mask by credential, not by coincidence: a value
   that is public anyway (the value of a shown, non-secret variable, the host
   name, an interpreter path, a network interface name) is not masked because a
   secret-looking variable happens to hold the same text; that would hide what
   was judged and protect nothing. A secret-looking variable's value of 8
   characters or more is a credential, though, and wins over a shown variable:
   `OMP_NUM_THREADS=<the token>` shows the token, so it is masked there too, and
   inside longer words (`LOCAL_RANK=x<the token>`) and from its first
   FRAGMENT_LENGTH characters on (a message's cut quote of it), unless
   it is part of the host name, an interface name or an interpreter path. Very
   short values are left alone in reports
   (masking every "1" would make them unreadable and a secret is not one
   character long) but not in the probe's stderr (`scrub_free_text`), which is
   another program's output and may print a short password whole.

Each string is also made writable in every format: lone surrogates (bytes that
were not UTF-8, kept by Python's surrogateescape) become `\\xNN` text, so no
exporter and no `-o FILE` fails to encode a report.
"""

from __future__ import annotations

import encodings.unicode_escape  # noqa: F401 - _spellings' codec, loaded now: with no descriptor left a lazy
# codec import fails, and every log line with it (helper-105: serve's 'cannot accept connections')
import functools
import json
import os
import re
import sys
import time
import urllib.parse
from collections import abc
from collections.abc import Mapping

from envdoctor import secret_spans
from envdoctor.model import Report, Result

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Iterable

MASK = "***"

ALLOWED_PREFIXES = (
    "CUDA_", "NCCL_", "OMP_", "MKL_", "OPENBLAS_", "VECLIB_", "NUMEXPR_", "KMP_", "GOMP_",
    "TORCH_", "PYTORCH_", "CUBLAS_", "CUDNN_", "NVIDIA_", "TORCHELASTIC_", "ENVDOCTOR_",
    "SLURM_",  # job and step ids, task counts, node lists: what an srun launch is read from
)
ALLOWED_NAMES = frozenset({
    "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "LD_LIBRARY_PATH",
})
# Names whose values are not secret and appear legitimately in reports (paths, the user).
HARMLESS_NAMES = frozenset({
    "PATH", "HOME", "PWD", "OLDPWD", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM",
    "HOSTNAME", "TMPDIR", "TEMP", "TMP", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "SHLVL",
    "_", "MAIL", "EDITOR", "PAGER", "COLUMNS", "LINES", "TZ", "NO_COLOR",
})
HARMLESS_PREFIXES = ("LC_", "XDG_", "PYENV_", "CONDA_", "PIP_", "PYTHON")
SECRET_NAME = re.compile(r"TOKEN|SECRET|KEY|PASSW(OR)?D|PASS$|CREDENTIAL|AUTH|PRIVATE|COOKIE|SESSION|SIGNATURE|CERT", re.I)
MIN_SECRET_LENGTH = 4  # shortest value of a secret-named variable that we scrub from reports
MIN_UNKNOWN_LENGTH = 8  # shortest value of an unknown variable that we scrub
# A secret-named variable's value this long is a credential, not a coincidence: it is
# masked even where a shown variable holds the same text, and inside longer words.
MIN_CREDENTIAL_LENGTH = 8
# Longer spellings of one are matched whole as tokens only: with no word boundary to start
# from, that costs the text's length times the form's (helper-68: a value of 30,000 "a"s in
# another of 60,000 took 6.8 s a format). Glued inside a word, one is found by its first
# FRAGMENT_LENGTH characters instead, and masked from there to the end of the word.
MAX_ANYWHERE_LENGTH = 256
# A credential's first characters, and the rest of the word they start, are masked wherever they
# appear: a message that cuts a long value ('Zq9vK2mP...U7i...') showed most of it (helper-68).
FRAGMENT_LENGTH = secret_spans.FRAGMENT_LENGTH

# -- credentials recognised by their shape ---------------------------------------------
# scheme://userinfo@host: the password (or, without one, the whole userinfo) is masked.
# Every pattern starts only at a token boundary, so a long value costs linear time.
_URL_USERINFO = re.compile(r"(?<![A-Za-z0-9+.-])(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s/@:'\"<>]*)"
                           r"(?::(?P<pw>[^\s/@'\"<>]*))?@(?=[^\s@])")
# user:password@host without a scheme (MASTER_ADDR=user:pw@node1).
_BARE_USERINFO = re.compile(r"(?<![\w/:.@+-])(?P<user>[\w.+-]+):(?P<pw>[^\s/@:'\"<>]+)@(?=[\w\[])")
# name=value / name: value, masked when the name ends in a secret word
# (api_key, AWS_SECRET_ACCESS_KEY, X-Auth-Token, password), not when it merely contains one (monkey).
_PAIR_HEAD = re.compile(r"(?<![A-Za-z0-9_.-])(?P<name>[A-Za-z0-9_.-]+)[\"']?[ \t]*[=:][ \t]*[\"']?")
_PAIR_VALUE = re.compile(r"[^\s&;'\"<>)}\]]+")
_SECRET_NAME_END = re.compile(r"(?:^|[_.-])(?:token|secret|password|passwd|passphrase|pwd|apikey|key|auth|"
                              r"credentials?|signature|private)$", re.I)
_BEARER = re.compile(r"(?i)(?P<head>\bauthorization[\"']?[ \t]*[:=][ \t]*[\"']?(?:(?:bearer|basic|digest|token|negotiate)[ \t]+)?"
                     r"|\bbearer[ \t]+)(?P<value>[^\s'\"<>,;]+)")
_SURROGATE = re.compile("[\ud800-\udfff]")
# Characters that every spelling (_spellings) leaves as they are: URL quoting's unreserved ones.
_SPELLED_ONE_WAY = re.compile(r"[A-Za-z0-9_.~-]+")


def looks_secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def is_allowed(name: str) -> bool:
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def _is_harmless(name: str) -> bool:
    return name in HARMLESS_NAMES or name.startswith(HARMLESS_PREFIXES)


def visible_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of an environment that may be shown, secret-looking values masked."""
    return {name: (MASK if looks_secret(name) else mask_credentials(value))
            for name, value in sorted(env.items()) if is_allowed(name)}


def mask_credentials(text: str) -> str:
    """Mask credentials recognised by shape: URL userinfo, name=value pairs, bearer tokens."""
    if not text:
        return text

    def url(m: re.Match) -> str:
        if m.group("pw") is not None:
            return f"{m.group('scheme')}{m.group('user')}:{MASK}@"
        return f"{m.group('scheme')}{MASK}@" if m.group("user") else m.group(0)

    text = _URL_USERINFO.sub(url, text)
    text = _BARE_USERINFO.sub(lambda m: f"{m.group('user')}:{MASK}@", text)
    text = _mask_pairs(text)
    return _BEARER.sub(lambda m: m.group(0) if m.group("value").startswith(MASK) else f"{m.group('head')}{MASK}", text)


def _mask_pairs(text: str) -> str:
    """Mask the value after every `secret_name=` / `secret_name:` head (heads only are
    matched, so `x=token=abc` still finds `token=`)."""
    out: list[str] = []
    done = 0
    for head in _PAIR_HEAD.finditer(text):
        if head.start() < done or not _SECRET_NAME_END.search(head.group("name")):
            continue
        if head.start() > 0 and text[head.start() - 1] == "/" and "=" not in head.group(0):
            continue  # a path and what happened to it ("/etc/passwd: permission denied"), not name: value
        quote = head.group(0)[-1]
        if quote in "'\"":  # a quoted value runs to its closing quote, spaces and all
            close = text.find(quote, head.end())
            end = len(text) if close < 0 else close
        else:
            value = _PAIR_VALUE.match(text, head.end())
            end = head.end() if value is None else value.end()
        if end == head.end() or text.startswith(MASK, head.end()):
            continue
        out.append(text[done:head.end()])
        out.append(MASK)
        done = end
    out.append(text[done:])
    return "".join(out)


# An undecodable byte as a message's repr() spells it (OMP_NUM_THREADS='\udcff'): shown as
# \xff too, as the byte itself is, so one byte reads one way in reports and in logs.
REPR_BYTE = re.compile(r"\\udc([89a-fA-F][0-9a-fA-F])")


def writable(text: str) -> str:
    """The text with lone surrogates (undecodable bytes) spelled as \\xNN, so it encodes as UTF-8."""
    if "\\udc" in text:
        text = REPR_BYTE.sub(r"\\x\1", text)
    if not _SURROGATE.search(text):
        return text

    def spell(m: re.Match) -> str:
        code = ord(m.group(0))
        return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"

    return _SURROGATE.sub(spell, text)


class Credential(str):
    """A secret-named variable's value of MIN_CREDENTIAL_LENGTH characters or more. Scrubbers
    mask it wherever it appears, glued inside a longer word too (`LOCAL_RANK=x<token>`
    showed the token whole), and `secret_values` keeps it even where a shown variable
    holds the same text (`OMP_NUM_THREADS=<token>` is the leak, not a coincidence)."""

    __slots__ = ()


def entries(env: Mapping[str, str]) -> Iterable[tuple[str, str]]:
    """Every (name, value) of an environment, with the later entries of a name given twice
    (procfs.Environ.shadowed), whose values must not leave either."""
    yield from env.items()
    yield from getattr(env, "shadowed", ())


def secret_values(envs: Iterable[Mapping[str, str]], *, min_secret: int = MIN_SECRET_LENGTH,
                  min_unknown: int = MIN_UNKNOWN_LENGTH, public: Iterable[str] = ()) -> list[str]:
    """Every value that must not appear in output, longest first (so a secret that
    contains another is masked whole). Values that are public anyway (see
    `public_values`) are left out: they are coincidences, not secrets. A credential
    (see `Credential`) is public only as the host's own names are (`public` and
    `_host_public`): a shown variable that holds it shows a secret."""
    envs = list(envs)
    public = set(public)
    host = _host_public()
    shown = public_values(envs, public)
    values: dict[str, str] = {}
    for env in envs:
        for name, value in entries(env):
            if not value:
                continue
            kind = _name_kind(name)
            core = value.strip()  # a spelling of it too: "e" and seven blanks masked every "e" (helper-68)
            if (kind is _SECRET and len(core) >= MIN_CREDENTIAL_LENGTH and not _inside(core, public)
                    and not _inside_host(core, host)):
                values[value] = Credential(value)  # over the same text from an unknown variable
            elif value in shown or value in values:
                continue
            elif kind is _SECRET:
                if len(value) >= min_secret:
                    values[value] = value
            elif kind is _UNKNOWN and len(value) >= min_unknown and not (
                    len(value) <= MAX_OPTION_WORD and _OPTION_WORD.fullmatch(value)):
                values[value] = value
    return sorted(values.values(), key=len, reverse=True)


# A long option alone (EXECFLAGS=--strict): vocabulary, not a secret; masked, it hid
# envdoctor's own words ("***: not starting true", helper-79). Written as options are:
# two dashes, lowercase words joined by dashes; a token that merely begins with a dash
# (base64url: '-Rk2Jx9_q3Wm...', helper-83) stays masked, as does a secret-named variable's.
_OPTION_WORD = re.compile(r"--[a-z]+(?:-[a-z0-9]+)*")
MAX_OPTION_WORD = 40


_SECRET, _SHOWN, _UNKNOWN = "secret", "shown", "unknown"


def _inside(value: str, texts: Iterable[str]) -> bool:
    """Whether `value` is part of one of `texts` (the host's names, the interpreters): such
    a value is masked as before, as a whole token and not where a shown variable holds it,
    so that `gpu-node-001` held by a token does not turn the host gpu-node-0017 into `***7`."""
    return any(value in text for text in texts)


_INSIDE_HOST: tuple[frozenset[str], dict[str, bool]] = (frozenset(), {})


def _inside_host(value: str, host: frozenset[str]) -> bool:
    """`_inside` the host's names, remembered while they stay the same set (10 s): serve asks
    for every secret of every process every run, and a node may have thousands of interfaces."""
    global _INSIDE_HOST
    names, known = _INSIDE_HOST
    if names is not host:
        names, known = _INSIDE_HOST = (host, {})
    found = known.get(value)
    if found is None:
        if len(known) >= 4096:
            known.clear()
        found = known[value] = _inside(value, host)
    return found


@functools.lru_cache(maxsize=4096)
def _name_kind(name: str) -> str:
    """What a variable's name says of its value: a secret, shown (allowed or harmless), or
    unknown. serve asks for every variable of every process every run, and the names
    repeat (PATH, HOME, the job's own): each is matched against the patterns once."""
    if looks_secret(name):
        return _SECRET
    return _SHOWN if is_allowed(name) or _is_harmless(name) else _UNKNOWN


def public_values(envs: Iterable[Mapping[str, str]], extra: Iterable[str] = ()) -> set[str]:
    """Text that is shown or known anyway: the values of shown non-secret variables and
    harmless ones, the host name, the interpreters, the network interfaces."""
    public: set[str] = {v for v in extra if v}
    for env in envs:
        for name, value in env.items():
            if value and _name_kind(name) is _SHOWN:
                public.add(value)
    public.update(_host_public())
    return public


_HOST_PUBLIC: tuple[float, frozenset[str]] = (-1e9, frozenset())
_HOST_PUBLIC_SECONDS = 10.0  # serve asks for every target of every run; interfaces come and go slowly


def _interface_names() -> list[str]:
    """This process's network interfaces: the names /proc/self/net/dev lists, as
    socket.if_nameindex() gives them over netlink (importing socket for that cost ~3 ms
    of every start); if_nameindex where /proc cannot be read."""
    try:
        with open("/proc/self/net/dev", "rb") as table:
            lines = table.read().decode("utf-8", "surrogateescape").splitlines()  # whole: 9,000 interfaces are 1.2 MB
    except OSError:
        lines = []
    if not lines or "|" not in lines[0]:  # unreadable, or not the kernel's table (helper-60: an empty file)
        import socket

        try:
            return [name for _, name in socket.if_nameindex()]
        except OSError:
            return []
    return [line.partition(":")[0].strip() for line in lines[2:] if ":" in line]


def _host_public() -> frozenset[str]:
    """The host name, the network interfaces and this interpreter: asked of the kernel at
    most every 10 s (if_nameindex is a netlink round trip, once per target per run before)."""
    global _HOST_PUBLIC
    at, names = _HOST_PUBLIC
    now = time.monotonic()
    if now - at < _HOST_PUBLIC_SECONDS:
        return names
    found: set[str] = {os.uname().nodename, *_interface_names()}  # the nodename: socket.gethostname()
    if sys.executable:
        found.add(sys.executable)
    names = frozenset(found)
    _HOST_PUBLIC = (now, names)
    return names


def public_host_names() -> frozenset[str]:
    """What `secret_values` leaves unmasked as the host's own: its name, its network
    interfaces and this interpreter. The same object while they are asked for again
    within 10 s; a new one after, equal if nothing changed."""
    return _host_public()


def _spellings(secret: str) -> set[str]:
    """The ways a program may print a value: as is, repr-escaped, JSON-escaped, URL-quoted.
    A value holding a byte that is not UTF-8 (an environment in Latin-1) comes from
    os.environ as a surrogate escape; it is quoted as the bytes it was, not refused."""
    if _SPELLED_ONE_WAY.fullmatch(secret):  # most values: every spelling is the value (a 70,000-variable
        return {secret}                     # environment spent 0.3 s of a serve run on them)
    try:
        raw = secret.encode("utf-8", "surrogateescape")
        native = os.fsencode(secret).decode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate no byte makes (JSON's "\ud800"): kept as it is
        raw, native = secret.encode("utf-8", "surrogatepass"), secret
    # As printed by a program that strips it (a Kubernetes --from-file secret keeps its
    # trailing newline), and as its bytes read back as UTF-8 (a Latin-1 locale's "é"
    # is printed as the byte 0xE9, which a UTF-8 reader sees as a surrogate escape).
    extra = {secret.strip(), native}
    if all(ord(c) < 256 for c in secret):
        extra.add(secret.encode("latin-1").decode("utf-8", "surrogateescape"))
    if _SURROGATE.search(secret):  # bytes that were not UTF-8, read as Latin-1's: the same text as a
        extra.add(raw.decode("latin-1"))  # UTF-8 variable holds it (helper-66: p\xe4ssw\xf6rd99 shown as pässwörd99)
    # URL-quoted as quote() does by default too, keeping "/" (helper-82: a base64 key with "/"
    # and "+" in a query string), and with lowercase hex digits, which URLs may use as well
    quoted = {urllib.parse.quote(raw, safe=""), urllib.parse.quote_plus(raw, safe=""), urllib.parse.quote(raw),
              urllib.parse.quote_plus(raw, safe="/")}
    quoted |= {_PERCENT_HEX.sub(lambda m: m.group(0).lower(), q) for q in quoted}
    forms = extra | quoted | {secret, secret.encode("unicode_escape", "backslashreplace").decode("ascii", "replace"),
                              json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1], repr(secret)[1:-1]}
    return {f for f in forms if f}


_PERCENT_HEX = re.compile(r"%[0-9A-F]{2}")


def longest_spelling(envs: Iterable[Mapping[str, str]]) -> int:
    """The length of the longest form, in any spelling, of any value scrub_free_text
    masks: how far past a cut through one of them its remains can reach."""
    return max((len(form) for value in secret_values(envs, min_secret=1) for form in _spellings(value)), default=0)


def free_text_scrubber(envs: Iterable[Mapping[str, str]]) -> "Scrubber":
    """The Scrubber scrub_free_text uses, for callers that also need its spans."""
    return Scrubber(secret_values(envs, min_secret=1))


_MEMO_TEXTS = 4096
_PLAIN = (int, float, bool, type(None))


class Scrubber:
    """Masks secrets and credentials in any JSON-like structure, and makes every string writable."""

    def __init__(self, secrets: Iterable[str], *, credentials: bool = True, memo: bool = False):
        forms: dict[str, int] = {}  # each spelling, and how it is matched (secret_spans: WHOLE, LONG, ANYWHERE)
        for secret in secrets:
            if secret and not secret.isspace():  # blanks identify nothing; "\n" would mask every line break
                credential = isinstance(secret, Credential)
                for form in _spellings(secret):
                    kind = secret_spans.WHOLE
                    if credential and len(form.strip()) >= MIN_CREDENTIAL_LENGTH:
                        long = len(form.strip()) > MAX_ANYWHERE_LENGTH
                        kind = secret_spans.LONG if long else secret_spans.ANYWHERE
                    forms[form] = max(forms.get(form, secret_spans.WHOLE), kind)
        self._forms = secret_spans.Forms(forms)
        self._credentials = credentials
        # memo=True where one scrubber sees the same texts again and again: in a serve run,
        # check ids, target labels, fact names and the same summary for every process of a
        # job, ~7,000 texts a run. Off by default: a log line's or a report's scrubber sees
        # each text once, and the memo would only cost memory. Bounded either way: _MEMO_TEXTS
        # a pass, and the pass before kept beside it (next_pass), so twice that at most.
        self._memo: dict[str, str] | None = {} if memo else None
        self._before: dict[str, str] = {}  # the memo of the pass before (next_pass)

    def next_pass(self) -> None:
        """A new pass over the same kind of texts (serve's next run): what the last pass
        scrubbed is kept for this one, and forgotten after it unless seen again. On a
        settled node most texts of a run are the last run's."""
        if self._memo is not None:
            self._before, self._memo = self._memo, {}

    def text(self, value: str) -> str:
        memo = self._memo
        if memo is None:
            return self._scrub(value)
        done = memo.get(value)
        if done is None:
            if len(memo) >= _MEMO_TEXTS:
                memo.clear()
            done = self._before.get(value)
            memo[value] = done = self._scrub(value) if done is None else done
        return done

    def _scrub(self, value: str) -> str:
        spans = self._forms.spans(value)  # whole values first: a credential mask would split them
        if spans:
            value = _masked(value, spans)
        if self._credentials:
            value = mask_credentials(value)
        return writable(value)

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where secret values (in any spelling) occur in `text`: sorted, merged (start, end)
        ranges, a credential's cut quote to the end of its word. Overlapping occurrences
        count too (a secret whose text begins inside another's), which a plain
        left-to-right search skips: masked one after the other, the second's tail showed."""
        return self._forms.spans(text)

    def any(self, value: Any) -> Any:
        kind = type(value)
        if kind is str:
            return self.text(value)
        if kind in _PLAIN:  # most facts: numbers (isinstance against typing's Mapping is slow)
            return value
        if kind is dict:
            return self._dict(value)
        if isinstance(value, str):  # a str subclass
            return self.text(value)
        if isinstance(value, abc.Mapping):
            return {self.any(k): self.any(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.any(v) for v in value]
        return value

    def _dict(self, value: dict) -> dict:
        """A plain dict's items, the common kinds handled here rather than by a call each:
        a serve run scrubs ~20 facts of every result of every process (a seventh of the
        run's CPU went to the per-item calls of `any`)."""
        text, nested = self.text, self.any
        out = {}
        for k, v in value.items():
            kind = type(v)
            out[text(k) if type(k) is str else nested(k)] = (
                text(v) if kind is str else v if kind in _PLAIN else nested(v))
        return out

    def result(self, result: Result) -> Result:
        # The check id and the target label are envdoctor's own names, public by construction:
        # masking them because a variable holds the same text (EXPERIMENT=cache_growth) turned
        # a row into `memory.***`, in every exporter and as a Prometheus label. Made writable only.
        return result.replace(summary=self.text(result.summary), remediation=self.text(result.remediation),
                       facts=self.any(result.facts), target=writable(result.target), check=writable(result.check),
                       fix_env=self.any(result.fix_env))


def _masked(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` with each of the sorted, disjoint `spans` replaced by MASK."""
    out: list[str] = []
    done = 0
    for start, end in spans:
        out.append(text[done:start])
        out.append(MASK)
        done = end
    out.append(text[done:])
    return "".join(out)


def scrubber_for(envs: Iterable[Mapping[str, str]], public: Iterable[str] = ()) -> Scrubber:
    """The Scrubber for a run whose environments (envdoctor's, the target's) are `envs`;
    `public` adds text known to be shown anyway (the report's host, its interpreters)."""
    return Scrubber(secret_values(envs, public=public))


def mask_own_secrets(text: str) -> str:
    """A one-line message of ours (a usage error, a broken plug-in's reason) with this
    process's secrets masked, as in reports: a plug-in's error may quote a token it read."""
    import os

    return scrubber_for([os.environ]).text(text)


def scrub_free_text(text: str, envs: Iterable[Mapping[str, str]]) -> str:
    """Redact another program's output (the probe's stderr): every secret value, short
    ones included, in every spelling, and every credential by shape. Redact before
    cutting a tail, so a cut never leaves a secret's last characters."""
    return free_text_scrubber(envs).text(text)


def redact_report(report: Report, envs: Iterable[Mapping[str, str]]) -> Report:
    """A copy of `report` with every secret value masked; exporters only ever see this."""
    system = report.system if isinstance(report.system, Mapping) else {}
    public = [report.host, *(str(system.get(k) or "") for k in ("python_executable", "envdoctor_python"))]
    scrub = scrubber_for(envs, public)
    return report.replace(results=[scrub.result(r) for r in report.results], system=scrub.any(report.system),
                   host=scrub.text(report.host), target=scrub.text(report.target))


def redact_results(results: Iterable[Result], envs: Iterable[Mapping[str, str]]) -> list[Result]:
    """Redacted copies of `results` (for callers that have results but no report)."""
    scrub = scrubber_for(envs)
    return [scrub.result(r) for r in results]
