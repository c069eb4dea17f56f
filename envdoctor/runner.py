"""Run checks on the watchdog's bounded pool, and never fall over.

Every check of a run is started on the watchdog (envdoctor.watchdog), keyed by
(check id, target), and the runner waits for each only until that check's
deadline. Checks start one after another: the next starts when the last has
finished or has run SLOW_CHECK_SECONDS, so quick checks do not contend for the
GIL and a session's facts while slow ones (a probe, a hung read) still overlap.
What comes back becomes exactly one row:
- a Result: the check's verdict;
- Unavailable: `skip`, its hint in the fix column;
- any other exception, SystemExit and KeyboardInterrupt included: `error`,
  naming the exception and where it was raised;
- no answer by the deadline: `error` "timed out after N s, stuck at file:line";
- the same (check, target) still stuck from an earlier run: `error` "still stuck
  since ..., not started again", without spending a thread on it.
A run takes about as long as its slowest check, not the sum (at most
SLOW_CHECK_SECONDS more per check before it), and a daemon that re-runs a hung
check every interval keeps one stuck thread for it, not one per interval.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable

from envdoctor.check import Check
from envdoctor.context import Context, Session
from envdoctor.errors import Unavailable
from envdoctor.model import Result, Status, error, skip
from envdoctor.watchdog import DONE, RAISED, STUCK, Outcome, describe_exception

DEFAULT_TIMEOUT = 15.0
# Started all at once, the ~7 checks of each process contended for the GIL and for its
# session's facts: serve spent 2.5x the CPU over 64 processes (see serve.scheduler). A
# check in serve takes ~0.3 ms; one still running after this is left to run beside the next.
SLOW_CHECK_SECONDS = 0.05


@dataclass
class Plan:
    """One check to run, with its resolved settings and timeout."""

    check: Check
    config: dict
    timeout: float


def _call(plan: Plan, session: Session, deadline: float | None = None) -> Result:
    """Meet the check's needs, then gather and judge, in a watchdog worker."""
    check = plan.check
    for need in check.needs:
        session.need(need)
    result = check.execute(Context(session, plan.config, deadline))
    if not isinstance(result, Result):
        return error(f"check returned {type(result).__name__}, not a Result (a bug in {check.id})")
    return result


def _row(plan: Plan, outcome: Outcome) -> Result:
    """The one row an outcome becomes."""
    if outcome.kind == DONE:
        return outcome.value
    if outcome.kind == RAISED:
        exc = outcome.error
        if isinstance(exc, Unavailable):
            result = skip(str(exc))
            result.remediation = exc.hint
            return result
        return error(f"the check broke: {describe_exception(exc)}", exception=type(exc).__name__)
    if outcome.kind == STUCK:
        return error(f"{outcome.describe()}; a call that never returns keeps its thread, so envdoctor waits "
                     "for it rather than start another", stuck_since=outcome.since)
    at = f", stuck at {outcome.where}" if outcome.where else ""
    return error(f"timed out after {plan.timeout:g} s{at}; raise it with [check.\"{plan.check.id}\"] timeout = N",
                 timeout_seconds=plan.timeout)


def run_one(plan: Plan, session: Session) -> Result:
    """Run one check under its timeout and turn whatever happens into a Result."""
    return run([plan], session)[0]


def run(plans: Iterable[Plan], session: Session) -> list[Result]:
    """Run every plan, overlapping only slow ones; return one result per plan, in plan order."""
    plans = list(plans)
    watchdog = session.watchdog
    pending = []
    for plan in plans:
        deadline = time.monotonic() + plan.timeout
        call = watchdog.start((plan.check.id, session.target.label),
                              lambda plan=plan, deadline=deadline: _call(plan, session, deadline))
        pending.append((call, deadline))
        call.finished_within(min(SLOW_CHECK_SECONDS, plan.timeout))
    results: list[Result] = []
    for plan, (call, deadline) in zip(plans, pending):
        outcome = call.wait(deadline)
        result = _row(plan, outcome)
        result.check = plan.check.id
        result.target = session.target.label
        result.duration_seconds = outcome.seconds
        results.append(result)
    return results


def load_failure_results(failures, session: Session) -> list[Result]:
    """Rows for plug-ins that could not be loaded, so a broken plug-in is seen, not silent."""
    results = []
    for f in failures:
        r = Result(Status.ERROR, f"check {f.name} ({f.value}, from {f.distribution}) could not be loaded: {f.reason}",
                   f"fix or uninstall {f.distribution}, or set ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1", {"entry_point": f.value})
        r.check = f.name
        r.target = session.target.label
        results.append(r)
    return results
