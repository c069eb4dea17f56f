"""`envdoctor check` and `envdoctor exec` options, read without importing the CLI, when plain.

Why: the CLI's import (typer and the click it vendors, ~45 ms) was the longest step of a
warm `check` and of exec's start before the job (benchmarks/startup_vs_collect_env.py,
benchmarks/exec_vs_import_torch.py). Both commands run often and unattended (CI, every
container start), and almost always with a few ordinary options.

This reads exactly what the CLI would, and nothing else: every option once or repeated,
as `--opt value` or `--opt=value` (a short one as `-f value`), and for exec all before
`--`. Anything else (`--help`, an unknown or misspelt option, a missing value, a number
the option cannot take, a stray word, `-fjson`) returns None, and the CLI parses the
line and says what is wrong, as before. tests/test_plain_argv.py compares the two
readings on many command lines.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping, Sequence


FLAG, LIST, TEXT, INT, FLOAT = "flag", "list", "text", "int", "float"

# option word -> (the command's parameter, what it takes); the last use of a TEXT/INT/FLOAT counts
EXEC = {
    "--strict": ("strict", FLAG), "--fix": ("fix", FLAG), "--attach": ("attach", FLAG),
    "--keep": ("keep", LIST), "--only": ("only", LIST), "--skip": ("skip", LIST),
    "--report": ("report", TEXT), "--fail-on": ("fail_on", TEXT), "--timeout": ("timeout", FLOAT),
}
CHECK = {
    "--only": ("only", LIST), "--skip": ("skip", LIST), "--onnx": ("onnx", LIST),
    "--format": ("fmt", TEXT), "-f": ("fmt", TEXT), "--pid": ("pid", INT), "--python": ("python", TEXT),
    "--window": ("window", FLOAT), "--config": ("config_file", TEXT), "--fail-on": ("fail_on", TEXT),
    "--timeout": ("timeout", FLOAT), "--output": ("output_text", TEXT), "-o": ("output_text", TEXT),
    "--path.procfs": ("procfs_text", TEXT), "--path.sysfs": ("sysfs_text", TEXT),
    "--path.rootfs": ("rootfs_text", TEXT),
}
_NUMBERS = {INT: int, FLOAT: float}  # what click's INT and FLOAT do with a word


def read(words: Sequence[str], spec: Mapping[str, tuple[str, str]]) -> dict[str, Any] | None:
    """The parameters `words` give under `spec` (only those given, plus every LIST as a
    list), or None when the CLI must read them."""
    found: dict[str, Any] = {field: [] for field, kind in spec.values() if kind == LIST}
    i = 0
    while i < len(words):
        word = words[i]
        name, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        if name not in spec:
            return None
        field, kind = spec[name]
        if kind == FLAG:
            if eq:
                return None
            found[field] = True
            i += 1
            continue
        if not eq:  # the value is the next word, whatever it is (as click takes it)
            if i + 1 >= len(words):
                return None
            value, i = words[i + 1], i + 1
        i += 1
        if kind == LIST:
            found[field].append(value)
        elif kind in _NUMBERS:
            try:
                found[field] = _NUMBERS[kind](value)
            except ValueError:
                return None
        else:
            found[field] = value
    return found


def split_exec(argv: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """`envdoctor exec OPTIONS -- CMD...` as (OPTIONS, CMD); None for any other line."""
    if len(argv) < 3 or argv[1] != "exec" or "--" not in argv[2:]:
        return None
    end = list(argv).index("--", 2)
    return list(argv[2:end]), list(argv[end + 1:])


def parse_exec(options: Sequence[str]) -> dict[str, Any] | None:
    """The ExecOptions fields `options` give, or None when the CLI must read them."""
    return read(options, EXEC)


def parse_check(argv: Sequence[str]) -> dict[str, Any] | None:
    """`envdoctor check OPTIONS` as check_command.run's parameters; None for any other line."""
    if len(argv) < 2 or argv[1] != "check":
        return None
    return read(argv[2:], CHECK)
