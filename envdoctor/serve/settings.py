"""The monitor's settings: the `[serve]` table of the config file, then the flags.

    [serve]
    interval = 15            # seconds between runs (--interval wins)
    max_targets = 256        # the node counts as one; the rest is the overflow counter
    select_comm = ["train*"] # also examine processes whose comm matches
    select_env = ["SLURM_JOB_ID"]  # ... or whose environment sets one of these

Each key may also come from the environment, which beats the file (ENVDOCTOR_SERVE__INTERVAL,
ENVDOCTOR_SERVE__MAX_TARGETS, ENVDOCTOR_SERVE__SELECT_COMM=train*,python3,
ENVDOCTOR_SERVE__SELECT_ENV=SLURM_JOB_ID). Checked whole at start and on SIGHUP; a mistake is a ConfigError naming file,
line and key (exit 2 at start; on SIGHUP the old settings stay and the log says why).
"""

from __future__ import annotations

import math
import os

from envdoctor.config import Config
from envdoctor.errors import ConfigError
from envdoctor.record import Value
from envdoctor.serve.discovery import Selectors

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping

DEFAULT_INTERVAL = 15.0
DEFAULT_MAX_TARGETS = 256
MIN_INTERVAL = 1.0
# A day. /healthz already allows three intervals; far longer waits (1e10 s) passed
# the finite test and then overflowed the thread's timed wait, killing the scheduler
# while the HTTP side stayed up and /healthz said ok for good. Rarer runs: `--once` from cron.
MAX_INTERVAL = 86400.0
KEYS = ("interval", "max_targets", "select_comm", "select_env")


class Settings(Value):
    def __init__(
        self,
        interval: float = DEFAULT_INTERVAL,
        max_targets: int = DEFAULT_MAX_TARGETS,
        selectors: Selectors = Selectors(),
    ) -> None:
        self.interval = interval
        self.max_targets = max_targets
        self.selectors = selectors


def valid_interval(value: Any) -> bool:
    """A number of seconds from MIN_INTERVAL to MAX_INTERVAL. NaN compares false with everything,
    so `--interval nan` (or TOML's `interval = nan`) passed a plain `< MIN_INTERVAL` test:
    the delay came out 0 (runs back to back, a core at 100 %) and /healthz said 503 forever;
    `inf` ran once and never again while /healthz said ok."""
    return (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            and MIN_INTERVAL <= value <= MAX_INTERVAL)


INTERVAL_RULE = f"a finite number of seconds from {MIN_INTERVAL:g} to {MAX_INTERVAL:g}"


def _strings(value: Any) -> tuple[str, ...] | None:
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    return None


ENV_PREFIX = "ENVDOCTOR_SERVE__"  # ENVDOCTOR_SERVE__MAX_TARGETS=1: the environment beats the file, as for checks


def _from_text(key: str, text: str) -> Any:
    """An environment variable's text as the file's TOML value would be (a list: comma-separated)."""
    text = text.strip()
    if key.startswith("select_"):
        return [part.strip() for part in text.split(",")] if text else []
    if not text.isascii():  # int() takes other scripts' digits ('١' is 1)
        return text
    try:
        return int(text) if key == "max_targets" else float(text)
    except ValueError:
        return text  # refused below, with the rule


def _environment(environ: Mapping[str, str]) -> dict[str, tuple[Any, None, str]]:
    found: dict[str, tuple[Any, None, str]] = {}
    for var, text in environ.items():
        if not var.startswith(ENV_PREFIX):
            continue
        key = var[len(ENV_PREFIX):].lower()
        if key not in KEYS or var != var.upper():
            raise ConfigError(f"unknown setting; known: {', '.join(ENV_PREFIX + k.upper() for k in KEYS)}",
                              file="environment", key=var)
        found[key] = (_from_text(key, text), None, var)
    return found


def from_config(config: Config, interval_flag: float | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    values: dict[str, Any] = {}
    # every value is checked, the file's too where the environment overrides it: a bad
    # line must not wait for the day the variable is gone (helper-45)
    given = [(key, value, line, None) for key, (value, line) in config.serve.items()]
    given += [(key, value, line, var) for key, (value, line, var) in _environment(os.environ if environ is None else environ).items()]
    for key, value, line, var in given:
        source = {"file": "environment", "key": var} if var else {"file": config.source, "line": line, "key": f"serve.{key}"}
        if key not in KEYS:
            raise ConfigError(f"unknown setting; known: {', '.join(KEYS)}", **source)
        if key == "interval":
            if not valid_interval(value):
                raise ConfigError(f"expected {INTERVAL_RULE}", **source)
            values[key] = float(value)
        elif key == "max_targets":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError("expected a whole number >= 1 (the node counts as one)", **source)
            values[key] = value
        else:
            strings = _strings(value)
            if strings is None:
                raise ConfigError("expected a list of non-empty strings" + (" (comma-separated)" if var else ""), **source)
            values[key] = strings
    interval = interval_flag if interval_flag is not None else values.get("interval", DEFAULT_INTERVAL)
    return Settings(interval=interval, max_targets=values.get("max_targets", DEFAULT_MAX_TARGETS),
                    selectors=Selectors(comm=values.get("select_comm", ()), env=values.get("select_env", ())))
