"""Keep secrets out of every output (DESIGN principle 3).

Two layers, applied once to the whole report before any exporter sees it:

1. Showing the environment: only names on an allow-list relevant to the checks
   (CUDA_*, NCCL_*, OMP_*, the DDP variables, ...) may have their values shown,
   and even those are masked when the name looks like a secret (TOKEN, SECRET,
   KEY, PASSWORD, CREDENTIAL, ...). `visible_env()` applies this rule.
2. A safety net over every string of the report (summaries, fixes, facts, system
   facts): any value of a secret-looking variable, or of a variable that is on
   neither the allow-list nor the list of well-known harmless names, is replaced
   by MASK wherever it appears. A check that echoes a value it should not have
   therefore still leaks nothing. Very short values are left alone (masking every
   "1" would make reports unreadable; a secret is not one character long).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Iterable, Mapping

from envdoctor.model import Report, Result

MASK = "***"

ALLOWED_PREFIXES = (
    "CUDA_", "NCCL_", "OMP_", "MKL_", "OPENBLAS_", "VECLIB_", "NUMEXPR_", "KMP_", "GOMP_",
    "TORCH_", "PYTORCH_", "CUBLAS_", "CUDNN_", "NVIDIA_", "TORCHELASTIC_", "ENVDOCTOR_",
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
MIN_SECRET_LENGTH = 4  # shortest value of a secret-named variable that we scrub
MIN_UNKNOWN_LENGTH = 8  # shortest value of an unknown variable that we scrub


def looks_secret(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def is_allowed(name: str) -> bool:
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def _is_harmless(name: str) -> bool:
    return name in HARMLESS_NAMES or name.startswith(HARMLESS_PREFIXES)


def visible_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of an environment that may be shown, secret-looking values masked."""
    return {name: (MASK if looks_secret(name) else value) for name, value in sorted(env.items()) if is_allowed(name)}


def secret_values(envs: Iterable[Mapping[str, str]]) -> list[str]:
    """Every value that must not appear in output, longest first (so a secret that
    contains another is masked whole)."""
    values: set[str] = set()
    for env in envs:
        for name, value in env.items():
            if looks_secret(name):
                if len(value) >= MIN_SECRET_LENGTH:
                    values.add(value)
            elif not is_allowed(name) and not _is_harmless(name) and len(value) >= MIN_UNKNOWN_LENGTH:
                values.add(value)
    return sorted(values, key=len, reverse=True)


class Scrubber:
    """Replaces each secret value by MASK in any JSON-like structure."""

    def __init__(self, secrets: Iterable[str]):
        secrets = [s for s in secrets if s]
        self._pattern = re.compile("|".join(re.escape(s) for s in secrets)) if secrets else None

    def text(self, value: str) -> str:
        if self._pattern is None:
            return value
        return self._pattern.sub(MASK, value)

    def any(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.any(k): self.any(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.any(v) for v in value]
        return value

    def result(self, result: Result) -> Result:
        return replace(result, summary=self.text(result.summary), remediation=self.text(result.remediation),
                       facts=self.any(result.facts), target=self.text(result.target), fix_env=self.any(result.fix_env))


def redact_results(results: Iterable[Result], envs: Iterable[Mapping[str, str]]) -> list[Result]:
    """Copies of `results` with every secret value masked (serve: many targets, one scrub each)."""
    scrub = Scrubber(secret_values(envs))
    return [scrub.result(r) for r in results]


def redact_report(report: Report, envs: Iterable[Mapping[str, str]]) -> Report:
    """A copy of `report` with every secret value masked; exporters only ever see this."""
    scrub = Scrubber(secret_values(envs))
    return replace(report, results=[scrub.result(r) for r in report.results], system=scrub.any(report.system),
                   host=scrub.text(report.host))
