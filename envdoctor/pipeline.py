"""One run, start to finish: target -> context -> checks -> results -> redaction.

The CLI and preflight() both come through here, so selection, timeouts, system
facts and redaction behave the same whichever way envdoctor is used.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from envdoctor import __version__, redact, registry as registry_module, runner, sysfacts
from envdoctor.check import Check
from envdoctor.config import Config
from envdoctor.context import Roots, Session, Target
from envdoctor.errors import UsageError
from envdoctor.model import Report, Result, host_name, skip, started_now
from envdoctor.record import Record
from envdoctor.registry import Registry
from envdoctor.watchdog import DONE

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Mapping, Sequence

SYSFACTS_TIMEOUT = 10.0
ENV_READ_TIMEOUT = 2.0  # redaction's own read of the target's environment, when no check read it


class Selection(Record):
    """Which checks a run includes, from --only/--skip and the config's enabled flags."""

    def __init__(
        self,
        only: Sequence[str] = (),
        skip: Sequence[str] = (),
    ) -> None:
        self.only = only
        self.skip = skip


def disabled_in(config: Config) -> Callable[[str], bool]:
    """Whether the config switches an id off (`[check."ID"] enabled = false`)."""
    return lambda check_id: not config.checks.get(check_id, {}).get("enabled", True)


def skipped(only: Iterable[str], skip: Iterable[str], config: Config) -> set[str]:
    """The ids a run leaves out: --skip, and the config's skip (the file's or the environment's)
    less what --only names, since the command line beats them. Every place that selects
    checks or their failure rows uses this one set (helper-51: a broken plug-in named by
    --only and skipped in the file lost its error row, and the run passed with no rows)."""
    return set(skip) | (set(config.skip) - set(only))


def plan(registry: Registry, config: Config, selection: Selection) -> list[runner.Plan]:
    """The checks to run, in id order; unknown ids are a usage error."""
    known = set(registry.checks) | registry.unloaded_ids
    only = list(selection.only) or list(config.only)
    # The command line beats the file and the environment: a check named by --only runs even
    # where their `skip` lists it (as it runs where they say `enabled = false`); --skip wins.
    skip = skipped(selection.only, selection.skip, config)
    for check_id in [*only, *skip]:
        if check_id not in known:
            raise UsageError(f"unknown check id {shown_id(check_id)}{_named_by(check_id, selection, config)}; "
                             f"`envdoctor checks` lists them: {', '.join(sorted(known))}")
    asked_out = [check_id for check_id in selection.only if check_id in registry.left_out]
    if asked_out:  # asked for by name, on the command line: not dropped without a word
        raise UsageError(f"--only {', '.join(asked_out)}: {_left_out(asked_out)}")
    plans = []
    for check_id in registry.ids:
        check = registry.checks[check_id]
        if only and check_id not in only:
            continue
        if not only and not config.enabled(check):
            continue
        if check_id in skip:
            continue
        plans.append(runner.Plan(check, config.settings_for(check), config.timeout_for(check)))
    # one of envdoctor's own that this load left out, asked for by name: its row says where it runs (prepare)
    unimported = (set(only) & registry.not_imported) - skip
    if not plans and (only or skip) and not unimported and not registry.failures_selected(only, skip, disabled_in(config)):
        raise NothingToRun("--only/--skip (or the config's only/skip) leave no check to run" + left_out_hint(registry, only))
    return plans


def shown_id(check_id: str, limit: int = 100) -> str:
    """An id as an error quotes it: repr, cut after `limit` characters (helper-85: a 100 KB id
    was echoed whole)."""
    if len(check_id) <= limit:
        return repr(check_id)
    return f"{check_id[:limit]!r}... ({len(check_id) - limit} more characters)"


def _named_by(check_id: str, selection: Selection, config: Config) -> str:
    """Where an id came from, when not from the command line: a variable an image or a CI
    job set reads like a typo on the command line, and nothing pointed at it (helper-84)."""
    if check_id in selection.only or check_id in selection.skip:
        return ""
    key = "only" if check_id in config.only else "skip"
    return f" in ENVDOCTOR_{key.upper()} (the environment) or the config's {key}"


class NothingToRun(UsageError):
    """The selection leaves no check (exec says it in its own words: envdoctor.exec_preflight)."""


def _left_out(ids: list[str]) -> str:
    return f"{'a plug-in' if len(ids) == 1 else 'plug-ins'} left out by ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1, not run"


def left_out_hint(registry: Registry, only: Iterable[str]) -> str:
    """'; acme.x: a plug-in left out by ...' when `only` names such ids: why none of them ran."""
    named = [check_id for check_id in only if check_id in registry.left_out]
    return f"; {', '.join(named)}: {_left_out(named)}" if named else ""


def make_target(pid: int | None, roots: Roots) -> Target:
    """Validate --pid: a process that does not exist is bad usage, said in one line."""
    if pid is None:
        return Target()
    if pid <= 0:
        raise UsageError(f"--pid must be a positive process id, got {pid}")
    try:
        there = (roots.procfs / str(pid)).is_dir()
    except OSError:  # a name too long for the file system (a pid of 4,000 digits): no such process either
        there = False
    if not there:
        raise UsageError(f"no process {pid} (nothing at {roots.procfs / str(pid)})")
    from envdoctor.procfs import explain_kind, process_kind

    kind = process_kind(roots.procfs, pid)
    if kind is not None:  # nothing of it can be examined: say so once, not as nine skipped rows
        raise UsageError(f"--pid {pid}: {explain_kind(pid, *kind)}")
    return Target(pid)


class Prepared(Record):
    """A target's run before it runs: the checks to start, and the rows it has already (a
    plug-in that could not be loaded, a check asked for that runs in another mode)."""

    def __init__(self, plans: list[runner.Plan], failures: list[Result], elsewhere: list[Result]) -> None:
        self.plans = plans
        self.failures = failures
        self.elsewhere = elsewhere

    def finish(self, ran: list[Result]) -> list[Result]:
        """Every row of the target, the checks' results among them, sorted by check id."""
        results = self.failures + ran + self.elsewhere
        results.sort(key=lambda r: r.check)
        return results


def prepare(registry: Registry, config: Config, session: Session, selection: Selection = Selection(),
            mode: str = "check", planned: list[runner.Plan] | None = None) -> Prepared:
    """What run_checks runs on one target. `planned`: plan(registry, config, selection),
    when the caller has it already (serve's targets share a few selections)."""
    if planned is None:
        planned = plan(registry, config, selection)
    plans = [p for p in planned if p.check.runs_in(mode)]
    only = set(selection.only) | set(config.only)
    skip = skipped(selection.only, selection.skip, config)
    failures = registry.failures_selected(only, skip, disabled_in(config))
    # asked for by name and never run here: a loaded check that says so, or one of envdoctor's
    # own that a load for this mode left out (serve's NOT_IN_SERVE), imported for its row alone
    unimported = [registry_module.unimported_check(i) for i in sorted((only & registry.not_imported) - skip)]
    elsewhere = _elsewhere([p.check for p in planned if p.check.id in only and not p.check.runs_in(mode)]
                           + [c for c in unimported if c is not None and not c.runs_in(mode)], mode, session)
    if mode == "check" and elsewhere and not plans and not failures:
        # one skip row and exit 0 read as a pass in CI; exec refuses the same selection
        raise UsageError(f"--only (or the config's only) leaves no check to run: {elsewhere[0].summary}"
                         + (f" (and {len(elsewhere) - 1} more like it)" if len(elsewhere) > 1 else ""))
    if mode == "check" and planned and not plans and not failures and not elsewhere:
        # --skip of all but a check that runs elsewhere (preflight.live): "0 checks" and exit 0
        raise UsageError(f"--only/--skip (or the config's only/skip) leave no check that runs in `check`: "
                         f"left are {', '.join(p.check.id for p in planned)}, which run only inside a job (envdoctor.preflight())")
    return Prepared(plans, runner.load_failure_results(failures, session), elsewhere)


def run_checks(registry: Registry, config: Config, session: Session, selection: Selection = Selection(),
               mode: str = "check") -> list[Result]:
    """The selected checks that may run in `mode`, on one target; rows sorted by check id.
    Not yet redacted: redact before anything leaves (execute() does)."""
    prepared = prepare(registry, config, session, selection, mode)
    return prepared.finish(runner.run(prepared.plans, session))


def _elsewhere(checks: Sequence[Check], mode: str, session: Session) -> list[Result]:
    """A skip row for each check asked for by name that does not run in this mode, so
    `--only preflight.live` says why nothing ran instead of printing nothing."""
    rows = []
    for check in checks:
        where = ", ".join(m for m in check.modes if check.runs_in(m)) or "no mode"
        row = skip(f"{check.id} does not run in {mode} mode (it runs in: {where})"
                   + ("; it is intrusive, so serve and exec never run it" if check.intrusive and mode in ("serve", "exec") else ""))
        row.check, row.target = check.id, session.target.label
        rows.append(row)
    return rows


def execute(
    registry: Registry,
    config: Config,
    session: Session,
    selection: Selection = Selection(),
    *,
    with_sysfacts: bool = True,
    mode: str = "check",
) -> Report:
    """Run the selected checks on `session` and return the redacted report.

    System facts are gathered beside the checks, each item bounded, so the whole
    run ends within the checks' timeout (plus the interpreter's own start).
    """
    started_at = started_now()
    t0 = time.perf_counter()
    deadline = time.monotonic() + min(config.timeout, SYSFACTS_TIMEOUT)
    gathering = sysfacts.Gathering(session) if with_sysfacts else None
    results = run_checks(registry, config, session, selection, mode)
    system = gathering.finish(deadline) if gathering is not None else {}
    report = Report(host=host_name(), version=__version__, started_at=started_at,
                    target=session.target.label, results=results, system=system,
                    duration_seconds=time.perf_counter() - t0)
    return redact.redact_report(report, _environments(session))


def _environments(session: Session) -> list[Mapping[str, str]]:
    """The environments whose secret values must not leave: ours and the target's.

    The target's is read on the watchdog: if a check is stuck reading it (a FIFO
    where /proc/N/environ should be), redaction must not wait behind it forever.
    An environment no one could read cannot have leaked into the report either.
    """
    envs: list[Mapping[str, str]] = [os.environ]
    known = session.env_if_read()
    if known is not None:
        envs.append(known)
        return envs
    outcome = session.watchdog.call(("environ", session.target.label), lambda: session.env, ENV_READ_TIMEOUT)
    if outcome.kind == DONE:
        envs.append(outcome.value)
    return envs


def build_session(
    config: Config,
    *,
    pid: int | None = None,
    roots: Roots = Roots(),
    python: str | None = None,
    onnx_files: Sequence[str] = (),
    **overrides: Any,
) -> Session:
    target = make_target(pid, roots)
    files = tuple(Path(f) for f in [*config.onnx, *onnx_files])
    kwargs: dict[str, Any] = dict(target=target, roots=roots, onnx_files=files)
    chosen_python = python or config.python
    if chosen_python and not python:
        import shutil

        found = shutil.which(chosen_python)
        if found is None:  # as --python's own check: a typo here silently turned the torch checks into skips
            raise UsageError(f"bad config: {config.python_from or 'python'}: {chosen_python!r}: no such executable interpreter")
        chosen_python = found
    if chosen_python:
        kwargs["python"] = chosen_python
        kwargs["python_explicit"] = True  # --pid N --python PATH: that interpreter's torch, not the process's
    if config.timeout_explicit:
        kwargs["probe_timeout"] = probe_limit(config.timeout)
    kwargs.update(overrides)
    return Session(**kwargs)


def probe_limit(check_timeout: float) -> float:
    """The torch probe's limit under a run-wide timeout: a little less than the checks'
    own, so the probe is killed and its row says why before the check's deadline,
    never the probe's own 60 s default past it."""
    from envdoctor.probe import default_timeout

    return max(0.05, min(default_timeout(), check_timeout - min(1.0, check_timeout * 0.1)))


def load_registry(for_mode: str | None = None) -> Registry:
    return registry_module.load(for_mode=for_mode)
