"""Configuration: defaults < file < environment < command line.

The file is `--config FILE`, else $ENVDOCTOR_CONFIG, else ./envdoctor.toml, else the
`[tool.envdoctor]` table of ./pyproject.toml. Its shape:

    fail_on = "warn"           # run-wide settings at the top
    timeout = 20
    skip = ["onnx.opset"]

    [check."shm.size"]         # one table per check, keys declared by the check
    min_bytes = "1GiB"
    timeout = 5
    enabled = true

Every key is validated against the checks' own declarations (check.Check.config), so
a typo or a wrong type is caught at start, reported with file, line and key, and the
CLI exits 2. Nothing here exits: errors are ConfigError, the CLI decides.

Three words, one meaning each:
- a check's *defaults*: what it declares (`Check(config={...})`, `Check.defaults`);
- the *config*: what one run settled on from file, environment and command line
  (`Config`, loaded here);
- a check's *settings*: its defaults overlaid with the config (`Config.settings_for`),
  what the check reads as `ctx.settings` and its judge receives.
"""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path

from envdoctor.check import Check
from envdoctor.errors import ConfigError, ParseError
from envdoctor.record import Record
from envdoctor.units import parse_int, parse_size

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping

FAIL_ON = ("warn", "fail")
DEFAULT_TIMEOUT = 15.0
MAX_TIMEOUT = 86400.0  # one day: beyond it a deadline is a mistake (and overflows the clock)
RUN_KEYS = {
    "fail_on": str,
    "timeout": float,
    "only": list,
    "skip": list,
    "onnx": list,
    "python": str,
}
CHECK_RESERVED = {"enabled": bool, "timeout": float}
ENV_PREFIX = "ENVDOCTOR_"
PROBE_TIMEOUT_VAR = "ENVDOCTOR_PROBE_TIMEOUT"  # the torch probe's limit (envdoctor.probe)


class Config(Record):
    """The settled configuration of one run."""

    def __init__(
        self,
        fail_on: str = "fail",
        timeout: float = DEFAULT_TIMEOUT,
        only: list[str] | None = None,
        skip: list[str] | None = None,
        onnx: list[str] | None = None,
        python: str | None = None,
        checks: dict[str, dict[str, Any]] | None = None,  # id -> {key: value}, as given
        source: str | None = None,  # the file that was read, if any
        python_from: str = "",  # where `python` was set, as an error names it ("envdoctor.toml:5: python")
        timeout_explicit: bool = False,  # timeout came from the file, the environment or --timeout
        serve: dict[str, Any] | None = None,  # the [serve] table as given; envdoctor.serve.settings checks it
    ) -> None:
        self.fail_on = fail_on
        self.timeout = timeout
        self.only = [] if only is None else only
        self.skip = [] if skip is None else skip
        self.onnx = [] if onnx is None else onnx
        self.python = python
        self.checks = {} if checks is None else checks
        self.source = source
        self.python_from = python_from
        self.timeout_explicit = timeout_explicit
        self.serve = {} if serve is None else serve

    def settings_for(self, check: Check) -> dict[str, Any]:
        """The check's settings: its declared defaults overlaid with what was configured."""
        values = dict(check.defaults)
        for key, value in self.checks.get(check.id, {}).items():
            if key not in CHECK_RESERVED:
                values[key] = value
        return values

    check_config = settings_for  # the older name, kept for callers outside envdoctor

    def enabled(self, check: Check) -> bool:
        return bool(self.checks.get(check.id, {}).get("enabled", check.enabled))

    def timeout_for(self, check: Check) -> float:
        configured = self.checks.get(check.id, {}).get("timeout")
        if configured is not None:
            return float(configured)
        if check.timeout is not None and not self.timeout_explicit:
            # the check's author knows its cost: longer than the default for a cold torch import,
            # shorter for a quick read (what `explain` shows), unless the user set a run-wide
            # timeout: that bounds the whole run, these checks included
            return float(check.timeout)
        return self.timeout

    def set_timeout(self, seconds: float) -> None:
        """A run-wide timeout the user chose: it bounds every check without its own setting."""
        self.timeout = float(seconds)
        self.timeout_explicit = True


# --------------------------------------------------------------------------- finding the file
def _is_file(path: Path) -> bool:
    """is_file() that treats an unreadable directory as "no file there", not a crash."""
    try:
        return path.is_file()
    except OSError:
        return False


def _not_a_config_file(path: Path) -> str:
    """Why `path` cannot be read as a config file, in the words a user acts on."""
    import stat

    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "a symbolic link to nothing" if path.is_symlink() else "no such config file"
    except OSError as exc:
        return f"cannot read the config file: {exc.strerror or exc}"
    if stat.S_ISDIR(mode):
        return "a directory, not a config file (name the .toml file in it)"
    return "not a regular file (a device, FIFO or socket cannot be a config file)"


def find_file(explicit: str | None, cwd: Path | None = None, environ: Mapping[str, str] = os.environ) -> tuple[Path, str] | None:
    """(path, table prefix) of the config file to read, or None when there is none."""
    try:
        cwd = cwd or Path.cwd()
    except OSError:  # the working directory was removed under us
        return None
    chosen = explicit or environ.get(ENV_PREFIX + "CONFIG")
    if chosen:
        path = Path(chosen)
        if not _is_file(path):
            raise ConfigError(_not_a_config_file(path), file=str(path))
        return path, ("tool.envdoctor" if path.name == "pyproject.toml" else "")
    if _is_file(cwd / "envdoctor.toml"):
        return cwd / "envdoctor.toml", ""
    if os.path.lexists(cwd / "envdoctor.toml"):  # a directory, a FIFO, a dangling link: the run went on unconfigured, unsaid
        raise ConfigError(_not_a_config_file(cwd / "envdoctor.toml"), file=str(cwd / "envdoctor.toml"))
    pyproject = cwd / "pyproject.toml"
    if _is_file(pyproject):
        try:
            data = _parse_toml(_read_text(pyproject))
        except (ValueError, OSError, RecursionError):  # TOMLDecodeError, undecodable or huge text, a too long integer, too deep
            if _huge_with_our_table(pyproject):  # ours, but too big to read: said, not silently dropped (helper-45)
                raise ConfigError(f"larger than {MAX_CONFIG_BYTES >> 20} MiB: not read as a config file", file=str(pyproject))
            return None  # someone else's broken pyproject is not our config error
        tool = data.get("tool")
        if isinstance(tool, dict) and "envdoctor" in tool:  # a `tool` that is not a table is not ours to judge
            return pyproject, "tool.envdoctor"
    return None


# --------------------------------------------------------------------------- value coercion
def coerce(value: Any, default: Any, key: str, *, from_text: bool = False) -> Any:
    """Convert `value` to the type of `default`; raise ParseError saying what was expected.

    `from_text` is for environment variables, where everything arrives as a string.
    """
    if key.endswith("_bytes") and isinstance(default, int) and not isinstance(default, bool):
        return parse_size(value)
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if from_text and isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ParseError(f"expected true or false, got {value!r}")
    if isinstance(default, int):
        if from_text and isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
            return parse_int(value, "value")  # ParseError, not int()'s ValueError, for 5000 digits
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ParseError(f"expected an integer, got {value!r}")
    if isinstance(default, float):
        number = None
        if from_text and isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                raise ParseError(f"expected a number, got {value!r}") from None
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer too large for a float
                raise ParseError(f"expected a finite number, got {value!r}") from None
        if number is None:
            raise ParseError(f"expected a number, got {value!r}")
        if not math.isfinite(number):
            raise ParseError(f"expected a finite number, got {value!r}")
        return number
    if isinstance(default, str):
        if isinstance(value, str):
            return value
        raise ParseError(f"expected a string, got {value!r}")
    if isinstance(default, (list, tuple)):
        if from_text and isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        if not isinstance(value, list):
            raise ParseError(f"expected a list, got {value!r}")
        # a default of strings only (`["a", "b"]`) asks for strings: `[1, {a=1}]` reached the check
        if default and all(isinstance(item, str) for item in default):
            odd = next((item for item in value if not isinstance(item, str)), None)
            if odd is not None:
                raise ParseError(f"expected a list of strings, got the item {odd!r}")
        return value
    if isinstance(default, dict):
        if isinstance(value, dict):
            return value
        where = ", which only envdoctor.toml can give" if from_text else ""
        raise ParseError(f"expected a table{where}, got {value!r}")
    return value  # a default of None accepts any value the check then judges


def _coerce_run_key(key: str, value: Any, *, from_text: bool) -> Any:
    expected = RUN_KEYS[key]
    default: Any = {str: "", float: 0.0, list: []}[expected]
    given = value
    value = coerce(value, default, key, from_text=from_text)
    if key in ("only", "skip") and isinstance(given, str) and given.strip() and not value:
        # ENVDOCTOR_ONLY=, ran every check, where `--only ,` is bad usage
        raise ParseError(f"names no check id: {given!r}; `envdoctor checks` lists them")
    if key == "fail_on" and value not in FAIL_ON:
        raise ParseError(f"expected one of {', '.join(FAIL_ON)}, got {value!r}")
    if key == "timeout":
        check_timeout(value)
    if key in ("only", "skip", "onnx") and not all(isinstance(v, str) for v in value):
        raise ParseError(f"expected a list of strings, got {value!r}")
    if key == "onnx" and not all(v.strip() for v in value):  # '' is '.': ".: is a directory" (helper-95)
        raise ParseError("an empty file name")
    return value


# --------------------------------------------------------------------------- line numbers
_HEADER = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]\s*(#.*)?$")


def _normalise_table(name: str) -> str:
    return ".".join(part.strip().strip('"').strip("'") for part in re.findall(r'"[^"]*"|\'[^\']*\'|[^.]+', name))


def line_of(text: str, table: str, key: str | None) -> int | None:
    """Best-effort line number of `key` in `table` (or of the table header when key is None).

    tomllib reports positions only for syntax errors, so we find keys ourselves; a
    message with a line is worth the approximation.
    """
    current = ""
    header_line = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = _HEADER.match(line)
        if match and not line.lstrip().startswith("[["):
            current = _normalise_table(match.group(1))
            if current == table:
                header_line = number
            continue
        if current == table and key is not None:
            if re.match(rf"""^\s*["']?{re.escape(key)}["']?\s*=""", line):
                return number
    return header_line


# --------------------------------------------------------------------------- loading
def load(
    catalog: Mapping[str, Check],
    *,
    explicit_file: str | None = None,
    environ: Mapping[str, str] = os.environ,
    cwd: Path | None = None,
    known_ids: set[str] | None = None,
    left_out: Iterable[str] = (),
    unimported: Iterable[str] = (),
) -> Config:
    """Read file and environment into a Config validated against `catalog`.

    `known_ids` may add ids that are not runnable checks (plug-ins that failed to
    load) so that configuring them is not mistaken for a typo. Of those, `left_out`
    (plug-ins not imported at all: ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1) may have any
    setting in the environment too, unread, as in a file. `unimported`: envdoctor's own
    checks a run did not import (exec's and serve's, registry.NOT_IN), known and left out
    too, whose variables stay theirs as a loaded check's do.
    """
    config = Config()
    known = set(catalog) | (known_ids or set())
    found = find_file(explicit_file, cwd, environ)
    if found:
        path, prefix = found
        _apply_file(config, path, prefix, catalog, known)
    _apply_environment(config, environ, catalog, (known_ids or set()) - set(catalog), set(left_out), set(unimported))
    return config


# A config is a page of settings a person wrote. Parsing is not under --timeout (the checks
# are): a 46 MB file took 8.9 s against `check --timeout 1` (helper-39).
MAX_CONFIG_BYTES = 1 << 20


def _read_text(path: Path) -> str:
    """The file's text, or ValueError when it is over MAX_CONFIG_BYTES (read no further)."""
    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ValueError(f"larger than {MAX_CONFIG_BYTES >> 20} MiB: not read as a config file")
    return data.decode("utf-8")


def _huge_with_our_table(path: Path) -> bool:
    """A pyproject.toml over MAX_CONFIG_BYTES that names tool.envdoctor (a byte search; no parse)."""
    try:
        if os.stat(path).st_size <= MAX_CONFIG_BYTES:
            return False
        with open(path, "rb") as f:
            return b"tool.envdoctor" in f.read(64 * MAX_CONFIG_BYTES)
    except OSError:
        return False


def _parse_toml(text: str) -> dict[str, Any]:
    """tomllib.loads, imported when there is a file to read: most runs (a container's, a
    node's) have none, and the import cost ~3 ms of every start."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    return tomllib.loads(text)


def _apply_file(config: Config, path: Path, prefix: str, catalog: Mapping[str, Check], known: set[str]) -> None:
    name = str(path)
    try:
        text = _read_text(path)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise ConfigError(f"cannot read: {exc}", file=name) from None
    try:
        data = _parse_toml(text)
    except ValueError as exc:  # TOMLDecodeError, or an integer literal too long for int() (tomllib lets that escape)
        match = re.search(r"line (\d+)", str(exc))
        why = "an integer literal is too long (more than 4300 digits)" if "Exceeds the limit" in str(exc) else str(exc)
        line = int(match.group(1)) if match else None
        if line is None and "end of document" in why:  # tomllib names no line there: it is the last one
            line = max(1, len(text.rstrip("\n").split("\n")))  # lines as TOML counts them: "\n" only
        if text.startswith("\ufeff"):  # invisible in an editor; tomllib just says "Invalid statement"
            why += " (the file starts with a UTF-8 byte order mark: save it without one)"
        raise ConfigError(f"not valid TOML: {why}", file=name, line=line) from None
    except RecursionError:  # arrays or inline tables nested hundreds deep: tomllib recurses per level
        raise ConfigError("not valid TOML for envdoctor: nested too deeply", file=name) from None
    if prefix:
        for depth, part in enumerate(prefix.split(".")):
            data = data.get(part, {})
            if not isinstance(data, dict):
                table = ".".join(prefix.split(".")[:depth + 1])
                raise ConfigError(f"[{table}] must be a table, not {type(data).__name__}", file=name,
                                  line=line_of(text, "", part) if depth == 0 else line_of(text, prefix.rsplit(".", 1)[0], part),
                                  key=table)
    config.source = name

    def where(table: str, key: str | None) -> int | None:
        full = ".".join(p for p in (prefix, table) if p)
        return line_of(text, full, key)

    for key, value in data.items():
        if key == "check":
            continue
        if key == "serve":  # the monitor's own table, validated by envdoctor.serve.settings
            if not isinstance(value, dict):
                raise ConfigError("expected a table: [serve]", file=name, line=where("", key), key=key)
            config.serve = {k: (v, where("serve", k)) for k, v in value.items()}
            continue
        if key not in RUN_KEYS:
            raise ConfigError(f"unknown setting; known: {', '.join(sorted(RUN_KEYS))}, a [serve] table and [check.\"ID\"] tables",
                              file=name, line=where("", key), key=key)
        try:
            setattr(config, key, _coerce_run_key(key, value, from_text=False))
            config.timeout_explicit |= key == "timeout"
        except ParseError as exc:
            raise ConfigError(str(exc), file=name, line=where("", key), key=key) from None
        if key == "python":
            line = where("", key)
            config.python_from = f"{name}:{line}: python" if line else f"{name}: python"
        if key in ("only", "skip"):
            unknown = [v for v in getattr(config, key) if v not in known]
            if unknown:
                raise ConfigError(f"unknown check id {unknown[0]!r}; known: {', '.join(sorted(known))}",
                                  file=name, line=where("", key), key=key)

    tables = data.get("check", {})
    if not isinstance(tables, dict):
        raise ConfigError('expected tables like [check."shm.size"]', file=name, line=where("", "check"), key="check")
    for check_id, table in tables.items():
        table_name = f'check."{check_id}"'
        line_table = f"check.{check_id}"
        if check_id not in known:
            raise ConfigError(f"unknown check id; known: {', '.join(sorted(known))}",
                              file=name, line=where(line_table, None), key=table_name)
        if not isinstance(table, dict):
            raise ConfigError("expected a table of settings", file=name, line=where(line_table, None), key=table_name)
        check = catalog.get(check_id)
        if check is None:  # a plug-in that failed to load: judge nothing, but `enabled = false` hides its row
            if isinstance(table.get("enabled"), bool):
                config.checks.setdefault(check_id, {})["enabled"] = table["enabled"]
            continue
        settled = config.checks.setdefault(check_id, {})
        for key, value in table.items():
            full_key = f"{table_name}.{key}"
            allowed = {**{k: v() for k, v in CHECK_RESERVED.items()}, **check.config}
            if key not in allowed:
                known_keys = ", ".join(sorted(allowed))
                raise ConfigError(f"unknown setting for {check_id}; known: {known_keys}",
                                  file=name, line=where(line_table, key), key=full_key)
            try:
                settled[key] = _coerce_check_key(key, value, allowed[key], from_text=False)
            except ParseError as exc:
                raise ConfigError(str(exc), file=name, line=where(line_table, key), key=full_key) from None
            if key == "files" and isinstance(settled[key], list):
                settled[key] = [_relative_to(path, p) for p in settled[key]]
    config.onnx = [_relative_to(path, p) for p in config.onnx]


def _relative_to(config_file: Path, value: Any) -> Any:
    """Paths in a config file mean paths next to that file, wherever envdoctor runs from."""
    if isinstance(value, str) and value and not os.path.isabs(value):
        return str(config_file.parent / value)
    return value


def _coerce_check_key(key: str, value: Any, default: Any, *, from_text: bool) -> Any:
    value = coerce(value, default, key, from_text=from_text)
    if key == "files" and isinstance(value, list) and not all(str(v).strip() for v in value):
        raise ParseError("an empty file name")  # '' would be the config file's own directory (helper-95)
    if key == "timeout":
        check_timeout(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        _check_range(key, value)
    return value


def _check_range(key: str, value: float) -> None:
    """Every number a check takes is a size, a count, a time or a fraction: none is
    negative, and a fraction or a significance level is at most 1. alpha = -1 or
    max_used_fraction = 1e308 were taken and quietly made a rule that could never fire."""
    if value < 0:
        raise ParseError(f"expected a number >= 0, got {value!r}")
    if (key == "alpha" or key.endswith("_fraction")) and value > 1:
        raise ParseError(f"expected a fraction from 0 to 1, got {value!r}")
    if key == "alpha" and value == 0:
        raise ParseError("expected a significance level above 0 (0 would never call a trend significant)")


def check_timeout(value: float) -> float:
    """A timeout must be a finite number of seconds in (0, MAX_TIMEOUT]; ParseError says which rule broke."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ParseError(f"expected a finite number of seconds, got {value!r}")
    if value <= 0:
        raise ParseError(f"expected a positive number of seconds, got {value!r}")
    if value > MAX_TIMEOUT:
        raise ParseError(f"expected at most {MAX_TIMEOUT:g} seconds (one day), got {value!r}")
    return value


_TOML_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def toml_value(value: Any) -> str:
    """A default as it would be written in envdoctor.toml (so `explain` output can be pasted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):  # a basic string: control characters escaped, or the line is no TOML
        return '"' + "".join(_TOML_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if c < " " or c == "\x7f" else c)
                             for c in value) + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table: `{x = 1}`, a key that is no bare word quoted
        return "{" + ", ".join(f"{k if re.fullmatch(r'[A-Za-z0-9_-]+', str(k)) else toml_value(str(k))} = {toml_value(v)}"
                               for k, v in value.items()) + "}"
    return '""' if value is None else repr(value)


def env_id(check_id: str) -> str:
    """A check id as a variable name spells it: upper case, and every character a shell
    does not take in a name (`.`, and a broken plug-in's `DIST:NAME` `-` and `:`) as `_`."""
    return re.sub(r"[^A-Za-z0-9]", "_", check_id).upper()


def env_name(check_id: str, key: str) -> str:
    """ENVDOCTOR_CHECK__SHM_SIZE__MIN_BYTES for [check."shm.size"] min_bytes."""
    return f"{ENV_PREFIX}CHECK__{env_id(check_id)}__{key.upper()}"


def _apply_environment(config: Config, environ: Mapping[str, str], catalog: Mapping[str, Check],
                       broken: Iterable[str] = (), left_out: set[str] = frozenset(),
                       unimported: set[str] = frozenset()) -> None:
    for key in RUN_KEYS:
        var = ENV_PREFIX + key.upper()
        if var in environ:
            try:
                setattr(config, key, _coerce_run_key(key, environ[var], from_text=True))
                config.timeout_explicit |= key == "timeout"
            except ParseError as exc:
                raise ConfigError(str(exc), file="environment", key=var) from None
            if key == "python":
                config.python_from = f"environment: {var}"
    if ENV_PREFIX + "ONLY" in environ and ENV_PREFIX + "SKIP" not in environ:
        # the environment beats the file: a check ENVDOCTOR_ONLY names runs even where the
        # file's skip lists it, as --only beats both (helper-51); the environment's own skip wins
        config.skip = [check_id for check_id in config.skip if check_id not in config.only]
    if environ.get(PROBE_TIMEOUT_VAR, "").strip():  # read by the probe itself; a typo was silently 60 s
        try:
            check_timeout(coerce(environ[PROBE_TIMEOUT_VAR], 1.0, "timeout", from_text=True))
        except ParseError as exc:
            raise ConfigError(str(exc), file="environment", key=PROBE_TIMEOUT_VAR) from None
    by_env_id: dict[str, list[str]] = {}
    ours = set(catalog) | set(unimported)  # an unimported built-in holds its variables as a loaded one
    for check_id in sorted(ours):
        by_env_id.setdefault(env_id(check_id), []).append(check_id)
    for check_id in sorted(set(broken) - ours):
        # a broken plug-in never takes a loaded check's variable: `shm_size = nosuchmod:CHECK`
        # made ENVDOCTOR_CHECK__SHM_SIZE__MIN_BYTES an ambiguity error, and exec refused to start
        if not any(c in ours for c in by_env_id.get(env_id(check_id), [])):
            by_env_id.setdefault(env_id(check_id), []).append(check_id)
    for var, raw in environ.items():
        if not var.startswith(ENV_PREFIX + "CHECK__"):
            continue
        # split at the last "__": a check id may hold one itself (`vendor.ecc__strict`), a key does not
        parts = var[len(ENV_PREFIX + "CHECK__"):].rsplit("__", 1)
        named = by_env_id.get(parts[0], []) if len(parts) == 2 else []
        if not named:
            raise ConfigError("expected ENVDOCTOR_CHECK__<CHECK_ID>__<KEY> naming a known check, "
                              "e.g. ENVDOCTOR_CHECK__SHM_SIZE__MIN_BYTES", file="environment", key=var)
        if len(named) > 1:
            raise ConfigError(f"names {' and '.join(named)} alike; set it in envdoctor.toml under "
                              f'[check."ID"] instead', file="environment", key=var)
        check = catalog.get(named[0])
        if check is None:  # a plug-in that failed to load: as in a file, only `enabled` means anything
            if parts[1].lower() != "enabled" and named[0] in left_out:
                continue  # switched off as a whole: what it would have read waits for it unread
            if parts[1].lower() != "enabled":
                raise ConfigError(f"{named[0]} is a plug-in that did not load; only ENABLED can be set for it",
                                  file="environment", key=var)
            try:
                config.checks.setdefault(named[0], {})["enabled"] = coerce(raw, True, "enabled", from_text=True)
            except ParseError as exc:
                raise ConfigError(str(exc), file="environment", key=var) from None
            continue
        key = parts[1].lower()
        allowed = {**{k: v() for k, v in CHECK_RESERVED.items()}, **check.config}
        if key not in allowed:
            raise ConfigError(f"unknown setting for {check.id}; known: {', '.join(sorted(allowed))}", file="environment", key=var)
        try:
            config.checks.setdefault(check.id, {})[key] = _coerce_check_key(key, raw, allowed[key], from_text=True)
        except ParseError as exc:
            raise ConfigError(str(exc), file="environment", key=var) from None
