"""The monitor's settings: the `[serve]` table of the config file, then the flags.

    [serve]
    interval = 15            # seconds between runs (--interval wins)
    max_targets = 256        # the node counts as one; the rest is the overflow counter
    select_comm = ["train*"] # also examine processes whose comm matches
    select_env = ["SLURM_JOB_ID"]  # ... or whose environment sets one of these

Checked whole at start and on SIGHUP; a mistake is a ConfigError naming file,
line and key (exit 2 at start; on SIGHUP the old settings stay and the log says why).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from envdoctor.config import Config
from envdoctor.errors import ConfigError
from envdoctor.serve.discovery import Selectors

DEFAULT_INTERVAL = 15.0
DEFAULT_MAX_TARGETS = 256
MIN_INTERVAL = 1.0
# A day. /healthz already allows three intervals; far longer waits (1e10 s) passed
# the finite test and then overflowed the thread's timed wait, killing the scheduler
# while the HTTP side stayed up and /healthz said ok for good. Rarer runs: `--once` from cron.
MAX_INTERVAL = 86400.0
KEYS = ("interval", "max_targets", "select_comm", "select_env")


@dataclass(frozen=True)
class Settings:
    interval: float = DEFAULT_INTERVAL
    max_targets: int = DEFAULT_MAX_TARGETS
    selectors: Selectors = Selectors()


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


def from_config(config: Config, interval_flag: float | None = None) -> Settings:
    values: dict[str, Any] = {}
    for key, (value, line) in config.serve.items():
        full = f"serve.{key}"
        if key not in KEYS:
            raise ConfigError(f"unknown setting; known: {', '.join(KEYS)}", file=config.source, line=line, key=full)
        if key == "interval":
            if not valid_interval(value):
                raise ConfigError(f"expected {INTERVAL_RULE}", file=config.source, line=line, key=full)
            values[key] = float(value)
        elif key == "max_targets":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError("expected a whole number >= 1 (the node counts as one)", file=config.source, line=line, key=full)
            values[key] = value
        else:
            strings = _strings(value)
            if strings is None:
                raise ConfigError("expected a list of non-empty strings", file=config.source, line=line, key=full)
            values[key] = strings
    interval = interval_flag if interval_flag is not None else values.get("interval", DEFAULT_INTERVAL)
    return Settings(interval=interval, max_targets=values.get("max_targets", DEFAULT_MAX_TARGETS),
                    selectors=Selectors(comm=values.get("select_comm", ()), env=values.get("select_env", ())))
