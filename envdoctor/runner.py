"""Run checks on the watchdog's bounded pool, and never fall over.

Every check of a run is started on the watchdog (envdoctor.watchdog), keyed by
(check id, target), and the runner waits for each only until that check's
deadline. Checks start one after another, chained on one worker: the next starts
when the last has finished, or beside it on another worker once it has run
SLOW_CHECK_SECONDS, so quick checks do not contend for the GIL and a session's
facts while slow ones (a probe, a hung read) still overlap.
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

import functools
import itertools
import time

from envdoctor.check import Check
from envdoctor.context import Context, Session
from envdoctor.errors import Unavailable
from envdoctor.model import Result, Status, error, malformed, malformed_facts, skip
from envdoctor.record import Record
from envdoctor.watchdog import DONE, RAISED, STUCK, Outcome, Pending, describe_exception

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Sequence

DEFAULT_TIMEOUT = 15.0
# Started all at once, the ~7 checks of each process contended for the GIL and for its
# session's facts: serve spent 2.5x the CPU over 64 processes (see serve.scheduler). A
# check in serve takes ~0.3 ms; one still running after this is left to run beside the next.
SLOW_CHECK_SECONDS = 0.05


class Plan(Record):
    """One check to run, with its resolved settings and timeout."""

    def __init__(
        self,
        check: Check,
        config: dict,
        timeout: float,
        raise_with: str = "",  # how to give it more time, when a caller's bound (exec's --timeout) set it
    ) -> None:
        self.check = check
        self.config = config
        self.timeout = timeout
        self.raise_with = raise_with


def _call(plan: Plan, session: Session, deadline: float | None = None) -> Result:
    """Meet the check's needs, then gather and judge, in a watchdog worker."""
    check = plan.check
    for need in check.needs:
        session.need(need)
    result = check.execute(Context(session, plan.config, deadline))
    if not isinstance(result, Result):
        return error(f"check returned {type(result).__name__}, not a Result (a bug in {check.id})")
    problem = malformed(result) or (None if _built_in(check) else malformed_facts(result.facts, check.metrics))
    if problem is not None:
        return error(f"check returned a malformed Result: {problem} (a bug in {check.id})")
    return result


def _built_in(check: Check) -> bool:
    """One of envdoctor's own checks: its facts are rendered by the same code every run and
    tested, so serve does not walk them again for every result of every process."""
    function = check.run or check.gather
    return getattr(function, "__module__", "").startswith("envdoctor.checks.")


def _row(plan: Plan, outcome: Outcome) -> Result:
    """The one row an outcome becomes."""
    if outcome.kind in (DONE, RAISED) and outcome.seconds > plan.timeout:
        # It answered, but after its deadline: the caller was waiting on an earlier check
        # then. Judged by the clock, not by when the runner came to look, so a check's
        # verdict does not depend on which checks ran beside it.
        return error(f"timed out: answered after {outcome.seconds:.3g} s, past its {plan.timeout:.3g} s timeout; "
                     f"{_raise_hint(plan)}", timeout_seconds=plan.timeout)
    if outcome.kind == DONE:
        return _bounded(outcome.value)
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
    return error(f"timed out after {plan.timeout:.3g} s{at}; {_raise_hint(plan)}", timeout_seconds=plan.timeout)


MAX_TEXT_CHARS = 20_000  # of a row's summary or fix: a plug-in's 50 MB summary took 12.8 s to report (helper-85)


def _bounded(result: Any) -> Any:
    """The row with its summary and fix cut to MAX_TEXT_CHARS, saying how much more there was."""
    for name in ("summary", "remediation"):
        text = getattr(result, name, None)
        if isinstance(text, str) and len(text) > MAX_TEXT_CHARS:
            setattr(result, name, f"{text[:MAX_TEXT_CHARS]}... ({len(text) - MAX_TEXT_CHARS} more characters)")
    return result


def _raise_hint(plan: Plan) -> str:
    """Which knob gives this check more time: its own, or the bound the caller put on it."""
    return plan.raise_with or f"raise it with [check.\"{plan.check.id}\"] timeout = N"


def run_one(plan: Plan, session: Session) -> Result:
    """Run one check under its timeout and turn whatever happens into a Result."""
    return run([plan], session)[0]


def _leave_slow_ones_behind(timeouts: list[float], calls: list[Pending]) -> None:
    """Wait until every call of the chain has returned or has run SLOW_CHECK_SECONDS (or
    its timeout, if shorter); then the calls after a slow one go on beside it, on another
    worker. The wait is on the chain's last call, so a run of quick checks wakes the
    caller once, not once a check: that hand-over cost serve a quarter of its CPU."""
    last = next((call for call in reversed(calls) if not call.is_done()), None)
    at = 0
    while last is not None and at < len(calls):
        call, timeout = calls[at], timeouts[at]
        if call.is_done():
            at += 1
            continue
        limit = min(SLOW_CHECK_SECONDS, timeout)
        since = call.runnable_since()
        ran = 0.0 if since is None else time.monotonic() - since
        if ran >= limit:
            call.detach_rest()
            at += 1
            continue
        last.finished_within(limit - ran)


class Batch(Record):
    """One target's checks for run_batches, and what must run just before them on the same
    chain (serve's memory sample of the process, which its memory check then judges)."""

    def __init__(
        self,
        plans: list[Plan],
        session: Session,
        before: Callable[[], Any] | None = None,  # its value and exceptions are dropped: it must report its own
        before_key: str = "before",  # with the target's label, its watchdog key (a stuck one names it)
        before_timeout: float = DEFAULT_TIMEOUT,
        after: Callable[[], None] | None = None,  # once every check of the batch has returned (if it raises: ignored)
    ) -> None:
        self.plans = plans
        self.session = session
        self.before = before
        self.before_key = before_key
        self.before_timeout = before_timeout
        self.after = after
        self._returned = itertools.count(1)  # next() is one step under the GIL: two workers cannot both miss it


def run(plans: Iterable[Plan], session: Session) -> list[Result]:
    """Run every plan, overlapping only slow ones; return one result per plan, in plan order."""
    return run_batches([Batch(list(plans), session)])[0]


def run_batches(batches: Sequence[Batch]) -> list[list[Result]]:
    """Every batch's checks, as one chain on one worker: the checks of many targets (serve's
    run) start one after another without waking the caller between targets, and the calls
    after a slow one go on beside it. One list of results per batch, each in plan order.
    The batches' sessions share one watchdog (a HostSession's)."""
    links: list[tuple[tuple[str, str], Callable[[], Any], float]] = []
    for batch in batches:
        label = batch.session.target.label
        if batch.before is not None:
            links.append(((batch.before_key, label), batch.before, batch.before_timeout))
        for plan in batch.plans:
            links.append(((plan.check.id, label), functools.partial(_call_now, plan, batch), plan.timeout))
    if not links:
        return [[] for _ in batches]
    # One chain: a worker starts each call as soon as the one before it returns, and each
    # computes its deadline when it starts.
    calls = batches[0].session.watchdog.start_chain([(key, fn) for key, fn, _ in links])
    timeouts = [timeout for _, _, timeout in links]
    _leave_slow_ones_behind(timeouts, calls)
    deadlines = []
    for call, timeout in zip(calls, timeouts):
        since = call.runnable_since()
        deadlines.append((time.monotonic() if since is None else since) + timeout)
    out: list[list[Result]] = []
    at = 0
    for batch in batches:
        if batch.before is not None:
            calls[at].wait(deadlines[at])  # settled, so one that never returns is stuck, not waited for again
            at += 1
        label = batch.session.target.label
        results: list[Result] = []
        for plan in batch.plans:
            outcome = calls[at].wait(deadlines[at])
            at += 1
            result = _row(plan, outcome)
            result.check = plan.check.id
            result.target = label
            result.duration_seconds = outcome.seconds
            results.append(result)
        out.append(results)
    return out


def _call_now(plan: Plan, batch: Batch) -> Result:
    """_call with its deadline counted from when the worker starts it; the batch's `after`
    once the last of its checks has returned, on whichever worker ran that one."""
    try:
        return _call(plan, batch.session, time.monotonic() + plan.timeout)
    finally:
        if next(batch._returned) == len(batch.plans) and batch.after is not None:
            try:
                batch.after()
            except Exception:  # noqa: BLE001 - what it does is a saving (serve lets a session go early),
                pass  # and raised here it would become this check's row instead of its own result


def load_failure_results(failures, session: Session) -> list[Result]:
    """Rows for plug-ins that could not be loaded, so a broken plug-in is seen, not silent."""
    results = []
    for f in failures:
        r = Result(Status.ERROR, f"check {f.name} ({f.value}, from {f.distribution}) could not be loaded: {f.reason}",
                   f"fix or uninstall {f.distribution}, or set ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1", {"entry_point": f.value})
        r.check = f.row or f.name
        r.target = session.target.label
        results.append(r)
    return results
