"""What redaction masks for a target, kept from one serve run to the next.

Why: every run, each target's rows are scrubbed of the secrets of its environment
and of the daemon's own (`redact.secret_values`), which judges every variable of
both. A process's environment does not change while it runs, and the daemon's
rarely does, so the answer is the last run's. On an NVIDIA H100 node (a GPU
image's environment, 64 processes that imported CUDA torch) that judgement was 7 %
of a run under the profiler, more than any other function's own time.

An answer is found again by a digest (BLAKE2b, 16 bytes) of the environments'
text, so only digests and answers are held between runs, never an environment.
The text is each variable's name and value joined by NUL, which neither can hold
(an environment is a list of NUL-terminated strings), encoded losslessly; a mapping
that holds one anyway is spelled another way. Answers
hold while the host's public names (host name, interfaces, interpreter: what
`secret_values` leaves unmasked) are the same set; when they change, all are
forgotten. Like the scrubbers, the memo keeps the answers of this run and the last
one: a job that has gone takes its answer with it one run later.
"""

from __future__ import annotations

import hashlib
import itertools
import threading

from envdoctor import redact

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

MAX_ANSWERS = 4096  # per run: serve's max_targets is far below; beyond it answers are worked out, not kept


def digest(env: Mapping[str, str]) -> bytes:
    """16 bytes that differ for any two different environments (names, values, order)."""
    shadowed = getattr(env, "shadowed", ())  # a name's later entries (procfs.Environ): their values are secrets too
    items = [*env.items(), *shadowed] if shadowed else env.items()  # (serve digests every target's, every run)
    text = "\0".join(itertools.chain.from_iterable(items))
    if text.count("\0") != max(0, 2 * (len(env) + len(shadowed)) - 1):
        # a NUL inside a name or value, which no real environment holds, would make two
        # mappings join alike (helper-111): such a mapping is spelled by repr, which has none
        text = "\1" + repr(list(items))
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class SecretsMemo:
    """`redact.secret_values(envs)` (its defaults), answered from memory while the same
    environments come back. Thread-safe: a run's workers ask at once."""

    def __init__(self, max_answers: int = MAX_ANSWERS) -> None:
        self._lock = threading.Lock()
        self._now: dict[bytes, list[str]] = {}
        self._before: dict[bytes, list[str]] = {}  # the last run's (next_pass)
        self._host: frozenset[str] | None = None  # the public names the answers were worked out with
        self._first: tuple[Mapping[str, str], bytes] | None = None  # (envs[0], its digest): see _digest_first
        self._max = max_answers
        self.worked_out = 0  # answers not found in memory, for tests and benchmarks

    def next_pass(self) -> None:
        """A new run: the last run's answers are kept for it, and forgotten after it unless used."""
        with self._lock:
            self._before, self._now = self._now, {}

    def _digest_first(self, env: Mapping[str, str]) -> bytes:
        """The first environment's digest: serve passes its own there, one object for a
        whole run, so it is digested once a run, not once a target. Known by identity, so
        that mapping must not change while it is passed (serve copies os.environ each run)."""
        first = self._first
        if first is not None and first[0] is env:
            return first[1]
        found = digest(env)
        self._first = (env, found)
        return found

    def secret_values(self, envs: Sequence[Mapping[str, str]]) -> list[str]:
        """What `redact.secret_values(envs)` answers, longest first; a list of the caller's own."""
        host = redact.public_host_names()
        key = b"".join(self._digest_first(env) if i == 0 else digest(env) for i, env in enumerate(envs))
        with self._lock:
            if host is not self._host:
                if self._host is not None and host != self._host:
                    self._now.clear()
                    self._before.clear()
                self._host = host
            found = self._now.get(key)
            if found is None:
                found = self._before.pop(key, None)
                if found is not None:
                    self._now[key] = found
        if found is None:
            found = redact.secret_values(envs)
            with self._lock:
                self.worked_out += 1
                # kept only if worked out with the names it is filed under (they may have changed meanwhile)
                if self._host is host and redact.public_host_names() is host and len(self._now) < self._max:
                    self._now[key] = found
        return list(found)
