"""Run checks concurrently, each under its own timeout, and never fall over.

Each check runs in a daemon thread. The runner waits for each one only until
that check's deadline; a check that is still running then (a hung NVML call, a
stuck statfs on a dead NFS mount) becomes an `error` row naming where it hung,
and its thread is abandoned: being a daemon thread, it cannot keep the process
alive. All checks start together, so a run takes as long as its slowest check,
not the sum. An exception becomes an `error` row; Unavailable becomes `skip`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Iterable

from envdoctor.check import Check
from envdoctor.context import Context, Session
from envdoctor.errors import Unavailable
from envdoctor.model import Result, Status, error, skip

DEFAULT_TIMEOUT = 15.0


@dataclass
class Plan:
    """One check to run, with its resolved config and timeout."""

    check: Check
    config: dict
    timeout: float


def _where(exc: BaseException) -> str:
    """file:line of the innermost frame, so an error row points at the bug."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f"{os.path.basename(last.filename)}:{last.lineno}"


def _stuck_at(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return ""
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}()"


def run_one(plan: Plan, session: Session) -> Result:
    """Run one check in the calling thread and turn whatever happens into a Result."""
    check = plan.check
    started = time.perf_counter()
    try:
        for need in check.needs:
            session.need(need)
        result = check.run(Context(session, plan.config))
        if not isinstance(result, Result):
            result = error(f"check returned {type(result).__name__}, not a Result (a bug in {check.id})")
    except Unavailable as exc:
        result = skip(str(exc))
        result.remediation = exc.hint
    except Exception as exc:
        where = _where(exc)
        result = error(f"the check broke: {type(exc).__name__}: {exc}" + (f" (at {where})" if where else ""), exception=type(exc).__name__)
    result.check = check.id
    result.target = session.target.label
    result.duration_seconds = time.perf_counter() - started
    return result


def run(plans: Iterable[Plan], session: Session) -> list[Result]:
    """Run every plan concurrently; return one result per plan, in plan order."""
    plans = list(plans)
    slots: list[Result | None] = [None] * len(plans)
    threads: list[threading.Thread] = []
    started = time.perf_counter()

    def work(i: int, plan: Plan) -> None:
        slots[i] = run_one(plan, session)

    for i, plan in enumerate(plans):
        thread = threading.Thread(target=work, args=(i, plan), name=f"envdoctor-check-{plan.check.id}", daemon=True)
        thread.start()
        threads.append(thread)

    results: list[Result] = []
    for i, (plan, thread) in enumerate(zip(plans, threads)):
        thread.join(max(0.0, started + plan.timeout - time.perf_counter()))
        finished = slots[i]  # read once: an abandoned thread may still write its slot later
        if finished is not None and not thread.is_alive():
            results.append(finished)
            continue
        where = _stuck_at(thread)
        result = error(
            f"timed out after {plan.timeout:g} s" + (f", stuck at {where}" if where else "")
            + f"; raise it with [check.\"{plan.check.id}\"] timeout = N",
            timeout_seconds=plan.timeout,
        )
        result.check = plan.check.id
        result.target = session.target.label
        result.duration_seconds = time.perf_counter() - started
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
