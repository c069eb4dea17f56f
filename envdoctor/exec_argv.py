"""`envdoctor exec`'s options, read without importing the CLI, when they are plain.

Why: exec runs on every container start, and the CLI's import (typer and the click it
vendors, ~45 ms) was the longest step before the job (benchmarks/exec_vs_import_torch.py).
The pre-flight child is forked first (envdoctor.exec_headstart) and imports the checks
meanwhile; the parent only has to read a handful of options and wait for the answer.

This reads exactly what the CLI's `exec` would, and nothing else: every option once or
repeated, as `--opt value` or `--opt=value`, all before `--`. Anything else (`--help`,
an unknown or misspelt option, a missing value, a value `--timeout` cannot take as a
number, a word before `--`) returns None, and the CLI parses the line and says what is
wrong, as before. The two are compared on many command lines by tests/test_exec_argv.py.
"""

from __future__ import annotations

from typing import Any, Sequence

FLAGS = {"--strict": "strict", "--fix": "fix", "--attach": "attach"}
REPEATED = {"--keep": "keep", "--only": "only", "--skip": "skip"}  # each use adds one value
VALUES = {"--report": "report", "--fail-on": "fail_on", "--timeout": "timeout"}  # the last use counts


def split(argv: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """`envdoctor exec OPTIONS -- CMD...` as (OPTIONS, CMD); None for any other line."""
    if len(argv) < 3 or argv[1] != "exec" or "--" not in argv[2:]:
        return None
    end = list(argv).index("--", 2)
    return list(argv[2:end]), list(argv[end + 1:])


def parse(options: Sequence[str]) -> dict[str, Any] | None:
    """The ExecOptions fields `options` give, or None when the CLI must read them."""
    found: dict[str, Any] = {"keep": [], "only": [], "skip": []}
    i = 0
    while i < len(options):
        name, eq, value = options[i].partition("=")
        if name in FLAGS and not eq:
            found[FLAGS[name]] = True
            i += 1
            continue
        if name not in REPEATED and name not in VALUES:
            return None
        if not eq:  # the value is the next word, whatever it is (as click takes it)
            if i + 1 >= len(options):
                return None
            value, i = options[i + 1], i + 1
        i += 1
        if name in REPEATED:
            found[REPEATED[name]].append(value)
        elif name == "--timeout":
            try:
                found["timeout"] = float(value)  # what click's FLOAT does with a word
            except ValueError:
                return None
        else:
            found[VALUES[name]] = value
    return found
