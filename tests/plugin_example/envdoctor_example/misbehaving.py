"""Checks that misbehave on purpose, to prove the runner contains them. Off by default."""

import time

from envdoctor.check import Check
from envdoctor.model import ok


def _sleep(ctx):
    time.sleep(ctx.config["seconds"])
    return ok("woke up")


def _raise(ctx):
    raise RuntimeError("this check is broken on purpose")


def _echo_env(ctx):
    # A careless plug-in that copies the whole environment into its output.
    env = dict(ctx.env)
    return ok("environment: " + " ".join(f"{k}={v}" for k, v in sorted(env.items())), env=env)


SLEEPY = Check(id="example.sleepy", title="Sleeps for `seconds`", run=_sleep, enabled=False, config={"seconds": 0.0})
RAISES = Check(id="example.raises", title="Always raises", run=_raise, enabled=False)
ECHO_ENV = Check(id="example.echo_env", title="Echoes the environment (careless)", run=_echo_env, enabled=False)
