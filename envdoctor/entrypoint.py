"""`envdoctor exec`: check the environment a job is about to get, fix what can be
fixed from inside, then become the job.

For image builders: `ENTRYPOINT ["envdoctor", "exec", "--"]`, or `envdoctor exec --
python train.py` in a Slurm script. A 64 MiB /dev/shm or 128 OpenMP threads on a
2-CPU quota surfaces an hour into a run as a bus error or a crawl; here it is one
line in the container log before the first import.

The order of things:
1. The command is resolved on the PATH it will get; not found is 127, found but
   not executable 126, as a shell says (one line, nothing else runs).
2. Everything that can hang or break runs in a forked child (envdoctor.forked),
   bounded as a whole by --timeout: loading the checks (a plug-in's import) and
   the config, then the checks that may run in exec, on the environment the
   command will inherit. With --fix, the changes the findings carry (envfix) are
   made to that environment and the checks they came from are judged again on it.
   Past the bound the child and what it started are killed, and the job starts
   (with --strict it does not: nothing was verified).
3. One line per warn/fail/error result with its fix goes to stderr, then one
   summary line: this is a log, not a table. --report FILE gets the JSON report.
4. --strict: a result at --fail-on or above (error counts as fail, a pre-flight
   that did not finish too) stops here with 78 (EX_CONFIG); the command never runs.
5. Otherwise execve(): the command replaces envdoctor in the same process, so its
   PID, signals, exit status and process tree are its own; no wrapper stays.

Python ignores SIGPIPE and SIGXFSZ for itself, and an ignored signal stays
ignored across execve; both go back to their defaults before the exec, as
subprocess does for its children, so `envdoctor exec -- yes | head` behaves as
`yes | head`. envdoctor does not reap zombies: where the container has no init,
run it under one (`docker run --init`, tini).
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

EX_CONFIG = 78  # sysexits.h: the environment (configuration) is not fit to start the job
EXIT_USAGE = 2
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
DEFAULT_TIMEOUT = 5.0
SOURCE = "envdoctor.exec"  # the `source=` field of every line exec logs

# The built-in checks exec runs, until every built-in declares its modes itself
# (Check.modes): cheap reads of files, the environment, NVML and the torch facts,
# paid on every container start. Never onnx.opset (imports onnx, reads models) nor
# torch.pin_memory (creates a CUDA context to measure). Plug-ins run in exec when
# their declaration allows it (Check.runs_in("exec")).
EXEC_BUILTINS = frozenset({"shm.size", "cpu.threads", "cuda.visible_devices", "dist.env", "gpu.health",
                           "cuda.runtime", "torch.cudnn"})
_SEVERITY = {"ok": 0, "skip": 0, "warn": 1, "fail": 2, "error": 2}


@dataclass
class ExecOptions:
    strict: bool = False
    fix: bool = False
    keep: Sequence[str] = ()
    report: str | None = None
    only: Sequence[str] = ()
    skip: Sequence[str] = ()
    fail_on: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    attach: bool = False


class Stop(Exception):
    """Leave with `code` after saying `line` (bad usage, a command that cannot run, --strict)."""

    def __init__(self, code: int, line: str):
        super().__init__(line)
        self.code = code
        self.line = line


def log(level: str, message: str, **fields: Any) -> None:
    """One logfmt line on stderr (envdoctor.log: redacted, never raises), marked as exec's."""
    from envdoctor import log as logger

    logger.event(level, message, **{k: v for k, v in fields.items() if v is not None}, source=SOURCE)


# ----------------------------------------------------------------------------- the command
def resolve_command(name: str, path_var: str | None) -> str:
    """The file execve will run for `name`, searched as a shell does on `path_var`
    (the PATH the command gets); Stop(127) when there is none, Stop(126) when the
    only match cannot be executed."""
    if not name:
        raise Stop(EXIT_NOT_FOUND, "no command: the command name is empty")
    if "/" in name:
        candidates = [name]
    else:
        dirs = (path_var if path_var is not None else os.defpath).split(os.pathsep)
        candidates = [os.path.join(d or ".", name) for d in dirs]
    refused = None
    for candidate in candidates:
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            if "/" in name:
                raise Stop(EXIT_CANNOT_EXECUTE, f"{name}: is a directory")
            continue
        if stat.S_ISREG(st.st_mode) and os.access(candidate, os.X_OK):
            return candidate
        refused = refused or candidate
    if refused is not None:
        raise Stop(EXIT_CANNOT_EXECUTE, f"{refused}: permission denied (not an executable file)")
    if "/" in name:
        raise Stop(EXIT_NOT_FOUND, f"{name}: no such file")
    raise Stop(EXIT_NOT_FOUND, f"{name}: command not found (PATH={path_var if path_var is not None else os.defpath})")


def become(path: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
    """execve the command; returns (126/127 with a line said) only when that fails."""
    for name in ("SIGPIPE", "SIGXFSZ", "SIGXFZ"):
        signum = getattr(signal, name, None)
        if signum is not None:
            signal.signal(signum, signal.SIG_DFL)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # execve discards Python's buffers
        except (OSError, ValueError, AttributeError):
            pass  # closed, or None: Python started with that descriptor closed
    try:
        os.execve(path, list(argv), dict(env))
    except OSError as exc:
        code = EXIT_NOT_FOUND if exc.errno == errno.ENOENT else EXIT_CANNOT_EXECUTE
        why = "exec format error (not a binary and no #! line)" if exc.errno == errno.ENOEXEC else (exc.strerror or str(exc))
        if exc.errno == errno.ENOENT:
            why = "no such file, or its #! interpreter does not exist"
        log("error", f"cannot run {path}: {why}", exit=code)
        return code
    raise AssertionError("unreachable: execve returned")  # pragma: no cover


# ----------------------------------------------------------------------------- choosing checks
def _split(items: Sequence[str]) -> list[str]:
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


def runs_in_exec(check: Any, builtin: bool) -> bool:
    if not check.runs_in("exec"):
        return False
    return check.id in EXEC_BUILTINS if builtin else True


def select(registry: Any, config: Any, options: ExecOptions) -> list[Any]:
    """The runner plans for exec; unknown ids, or --only naming a check that does not
    run in exec, are bad usage (Stop(2))."""
    from envdoctor import pipeline
    from envdoctor.errors import UsageError

    only, skip = _split(options.only), _split(options.skip)
    try:
        plans = pipeline.plan(registry, config, pipeline.Selection(only=only, skip=skip))
    except UsageError as exc:
        raise Stop(EXIT_USAGE, str(exc)) from None
    chosen = [p for p in plans if runs_in_exec(p.check, registry.origins.get(p.check.id) == "envdoctor")]
    chosen_ids = {p.check.id for p in chosen}
    refused = [p.check.id for p in plans if p.check.id not in chosen_ids and p.check.id in only]
    if refused:
        raise Stop(EXIT_USAGE, f"--only {', '.join(refused)}: does not run in exec (too slow or intrusive for every "
                               f"container start; it runs in `envdoctor check`). exec runs: "
                               f"{', '.join(sorted(p.check.id for p in chosen)) or 'nothing else selected'}")
    return chosen


# ----------------------------------------------------------------------------- a launcher as the command
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_NPROC_FLAGS = ("--nproc-per-node", "--nproc_per_node")


def launcher_ranks(argv: Sequence[str]) -> int | None:
    """Processes per node when the command is torchrun (or `python -m torch.distributed.run`)
    with a numeric --nproc-per-node: the ranks the thread budget is shared between.

    `envdoctor exec -- torchrun --nproc-per-node 4 train.py` runs before torchrun has
    set LOCAL_WORLD_SIZE for its workers, and torchrun passes OMP_NUM_THREADS on to
    every worker: sized for the whole container, it would oversubscribe it 4 times."""
    if not argv:
        return None
    args = list(argv[1:])
    if os.path.basename(argv[0]) != "torchrun":
        if not (os.path.basename(argv[0]).startswith("python") and len(args) >= 2 and args[0] == "-m"
                and args[1] in _LAUNCHER_MODULES):
            return None
        args = args[2:]
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            break  # the training script: what follows is its own
        name, eq, value = arg.partition("=")
        if name in _NPROC_FLAGS:
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            return int(value) if value.isascii() and value.isdigit() and int(value) > 0 else None
    return None


# ----------------------------------------------------------------------------- the pre-flight (in the child)
def _clamped(plans: Sequence[Any], seconds: float) -> list[Any]:
    from envdoctor.runner import Plan

    return [Plan(p.check, p.config, max(0.05, min(p.timeout, seconds))) for p in plans]


def _probe(python: str, timeout: float) -> Any:
    """The torch facts, bounded by exec's own budget (ENVDOCTOR_PROBE_TIMEOUT does not apply here)."""
    from envdoctor.probe import TIMEOUT_VAR, ProbeError, run_probe

    try:
        return run_probe(python, timeout=timeout)
    except ProbeError as exc:
        raise ProbeError(str(exc).replace(f"raise the limit with {TIMEOUT_VAR}=SECONDS",
                                          "exec's --timeout bounds it (torch facts are cached after one full run)")) from None


def _fix_and_judge_again(results: list[Any], plans: Sequence[Any], env: Mapping[str, str], keep: Sequence[str],
                         session: Any, deadline: float) -> tuple[Any, dict[str, str], list[Any]]:
    """--fix: work out the changes, make them, and judge the checks they came from again
    on the fixed environment (by `deadline`). Returns (the plan, the fixed env, results)."""
    from envdoctor import envfix, runner
    from envdoctor.context import Session

    fix = envfix.plan([r.to_dict() for r in sorted(results, key=lambda r: -r.status.severity)], env, keep)
    fixed_env = envfix.apply(env, fix.changes)
    if fix.changes:
        os.environ.update(fixed_env)
        again = {c.check for c in fix.changes}
        fixed = Session(env_override=fixed_env, host=session.host, torch_factory=lambda s: session.need("torch"))
        plans = _clamped([p for p in plans if p.check.id in again], deadline - time.monotonic())
        rejudged = {r.check: r for r in runner.run(plans, fixed)}
        for result in rejudged.values():
            result.facts["exec_fixed"] = {c.name: {"from": c.old, "to": c.new} for c in fix.changes if c.check == result.check}
        results = [rejudged.get(r.check, r) for r in results]
    for change in fix.kept:
        for result in results:
            if result.check == change.check:
                result.facts.setdefault("exec_kept", {})[change.name] = {"value": change.old, "wanted": change.new}
    return fix, fixed_env, results


def preflight(plans: Sequence[Any], env: Mapping[str, str], options: ExecOptions, budget: float,
              failures: Sequence[Any] = (), host: Any = None, started: float | None = None) -> dict[str, Any]:
    """Run the checks on `env` (then fix and judge again), in this (forked) process.

    Returns JSON-able data: final results, changes made and kept, and the JSON
    report text when asked for. Leaves 10% of the budget for the answer to travel.
    Plug-ins that failed to load (`failures`) are error rows, as in `check`.
    """
    import socket
    from datetime import datetime, timezone

    from envdoctor import __version__, envfix, redact, runner
    from envdoctor.context import HostSession, Session
    from envdoctor.model import Report

    t0 = time.monotonic() if started is None else started  # the budget runs from here (monotonic is system-wide)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    # The child is disposable: give it the job's environment, so the torch probe and
    # every library it loads see what the command will see.
    os.environ.clear()
    os.environ.update(env)
    first = max(0.05, t0 + budget * 0.7 - time.monotonic())
    host = host or HostSession()
    session = Session(env_override=dict(env), host=host, torch_factory=lambda s: _probe(s.python, max(0.05, first - 0.1)))
    gathering = None
    if options.report:
        from envdoctor import sysfacts

        gathering = sysfacts.Gathering(session)
    results = runner.load_failure_results(failures, session) + runner.run(_clamped(plans, first), session)

    fix = envfix.FixPlan([], [])
    fixed_env = dict(env)
    if options.fix:
        fix, fixed_env, results = _fix_and_judge_again(results, plans, env, options.keep, session, t0 + budget * 0.9)
    results.sort(key=lambda r: r.check)
    system = gathering.finish(t0 + budget * 0.9) if gathering is not None else {}
    report = Report(host=socket.gethostname(), version=__version__, started_at=started_at, target="self",
                    results=results, system=system, duration_seconds=time.monotonic() - t0)
    report = redact.redact_report(report, [env, fixed_env])
    out: dict[str, Any] = {
        "results": [r.to_dict() for r in report.results],
        "changes": [c.to_dict() for c in fix.changes],
        "kept": [c.to_dict() for c in fix.kept],
    }
    if options.report:
        from envdoctor import export

        out["report"] = export.render("json", report)
    return out


# ----------------------------------------------------------------------------- the parent
def _unfinished(check_ids: Sequence[str], why: str) -> list[dict[str, Any]]:
    return [{"check": check_id, "target": "self", "status": "error", "summary": why, "remediation": "",
             "facts": {}, "duration_seconds": 0.0} for check_id in check_ids]


def _report_without_child(rows: list[dict[str, Any]], seconds: float) -> str:
    import json
    import socket
    from datetime import datetime, timezone

    from envdoctor import __version__
    from envdoctor.model import SCHEMA

    return json.dumps({"schema": SCHEMA, "host": socket.gethostname(), "version": __version__,
                       "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "target": "self",
                       "duration_seconds": round(seconds, 6), "system": {}, "results": rows}, indent=2) + "\n"


def _shown(name: str, value: str | None) -> str:
    """A variable's value for the log: only names on the allow-list, never secret-looking ones."""
    from envdoctor import redact

    if value is None:
        return "unset"
    return value if redact.is_allowed(name) and not redact.looks_secret(name) else redact.MASK


def _counts(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    return {s: sum(1 for r in rows if r["status"] == s) for s in ("fail", "error", "warn", "ok", "skip")}


def _log_results(rows: Sequence[Mapping[str, Any]], options: ExecOptions, fixable: set[str]) -> None:
    """One line per warn/fail/error result, loudest first, with its fix."""
    loud = sorted((r for r in rows if _SEVERITY.get(r["status"], 0) > 0), key=lambda r: -_SEVERITY[r["status"]])
    for row in loud:
        message = f"{row['status']} {row['check']}: {row['summary']}"
        if options.fix and row.get("remediation") and row["check"] not in fixable:
            message += " (cannot be fixed from inside the container)"
        log("warn" if row["status"] == "warn" else "error", message, check=row["check"], status=row["status"],
            fix=row.get("remediation") or None)


def _log_changes(changes: Sequence[Mapping[str, Any]], kept: Sequence[Mapping[str, Any]]) -> None:
    """`set OMP_NUM_THREADS 16 -> 2 (2 CPUs of cgroup quota)`, and what --keep protected."""
    for change in changes:
        name, old, new = change["name"], _shown(change["name"], change["from"]), _shown(change["name"], change["to"])
        log("info", f"set {name} {old} -> {new} ({change['reason']})", var=name, old=old, new=new, check=change["check"])
    for change in kept:
        name, old, new = change["name"], _shown(change["name"], change["from"]), _shown(change["name"], change["to"])
        log("info", f"kept {name}={old} (--keep); {change['check']} wanted {new} ({change['reason']})",
            var=name, old=old, wanted=new, check=change["check"])


def run(options: ExecOptions, argv: Sequence[str]) -> int:
    """Check, fix, report, then execve `argv`. Returns only when the command was not
    started: the exit status to leave with (2, 78, 126, 127)."""
    try:
        return _run(options, list(argv))
    except Stop as stop:
        log("error", stop.line, exit=stop.code)
        return stop.code


def _validate(options: ExecOptions, argv: list[str]) -> None:
    if not argv:
        raise Stop(EXIT_USAGE, "no command given: envdoctor exec [OPTIONS] -- CMD ARGS...")
    if options.timeout <= 0:
        raise Stop(EXIT_USAGE, "--timeout must be a positive number of seconds")
    if options.fail_on is not None and options.fail_on not in ("warn", "fail"):
        raise Stop(EXIT_USAGE, f"--fail-on must be warn or fail, not {options.fail_on!r}")
    if options.attach:
        import importlib.util

        if importlib.util.find_spec("envdoctor.attach") is None:
            raise Stop(EXIT_USAGE, "--attach needs the live view (envdoctor.attach), which this version of envdoctor "
                                   "does not have yet; run without --attach")
    if options.report:
        directory = os.path.dirname(os.path.abspath(options.report))
        if not os.path.isdir(directory):
            raise Stop(EXIT_USAGE, f"--report {options.report}: directory {directory} does not exist")
        if os.path.isdir(options.report):
            raise Stop(EXIT_USAGE, f"--report {options.report}: is a directory")


def _write_report(path: str, text: str) -> None:
    from envdoctor.atomicfile import write_atomic
    from envdoctor.errors import OutputError

    try:
        write_atomic(path, text)
    except OutputError as exc:  # the job still starts: a report path is not the environment
        log("error", f"--report: {exc}")


def _in_child(options: ExecOptions, env: Mapping[str, str], argv: Sequence[str], started: float,
              send: Any) -> dict[str, Any]:
    """The whole pre-flight, in the forked child: everything that can hang or break is
    here, loading the checks included (a plug-in's import may hang). Bad usage or a bad
    config comes back as {"stop": [2, line]}; before the checks run, the plan is sent
    ahead, so a pre-flight killed at the deadline can still say what did not finish."""
    from envdoctor import registry as registry_module
    from envdoctor.config import load as load_config
    from envdoctor.errors import ConfigError

    os.environ.clear()  # plug-ins and the config read the environment the command will get
    os.environ.update(env)
    registry = registry_module.load()
    try:
        config = load_config(registry.checks, known_ids={f.name for f in registry.failures})
        ranks = launcher_ranks(argv)
        threads = config.checks.setdefault("cpu.threads", {})
        if ranks and "LOCAL_WORLD_SIZE" not in env and not threads.get("processes_per_node"):
            threads["processes_per_node"] = ranks  # as if configured: the ranks share the CPUs
        plans = select(registry, config, options)
    except ConfigError as exc:
        return {"stop": [EXIT_USAGE, f"bad config: {exc}"]}
    except Stop as stop:
        return {"stop": [stop.code, stop.line]}
    fail_on = options.fail_on or config.fail_on
    only = set(_split(options.only)) | set(config.only)
    failures = [f for f in registry.failures if not only or f.name in only]
    send({"plan": [p.check.id for p in plans] + [f.name for f in failures], "fail_on": fail_on})
    answer = preflight(plans, env, options, options.timeout, failures, started=started)
    answer["fail_on"] = fail_on
    return answer


def _run(options: ExecOptions, argv: list[str]) -> int:
    _validate(options, argv)
    env = dict(os.environ)
    path = resolve_command(argv[0], env.get("PATH"))
    command = os.path.basename(argv[0])  # never its arguments: they may hold secrets

    from envdoctor import envfix, forked

    started = time.monotonic()
    outcome = forked.call(lambda send: _in_child(options, env, argv, started, send), options.timeout)
    if outcome.kind == forked.DONE and "stop" in outcome.value:
        raise Stop(*outcome.value["stop"])
    plan = next((m for m in outcome.messages if isinstance(m, dict) and "plan" in m), {})
    fail_on = plan.get("fail_on") or options.fail_on or "fail"
    changes: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    unfinished = None
    if outcome.kind == forked.DONE:
        rows = outcome.value["results"]
        changes, kept = outcome.value["changes"], outcome.value["kept"]
        report_text = outcome.value.get("report")
        _log_results(rows, options, {c["check"] for c in [*changes, *kept]})
    else:
        unfinished = (f"the pre-flight did not finish within {options.timeout:g} s"
                      + ("" if plan else " (it was still loading the checks and the config)") + "; raise --timeout"
                      if outcome.kind == forked.TIMED_OUT else f"the pre-flight broke: {outcome.error}")
        rows = _unfinished(plan.get("plan", []), unfinished)
        report_text = _report_without_child(rows, outcome.seconds) if options.report else None
        log("error", unfinished)
    _log_changes(changes, kept)
    final_env = envfix.apply(env, [envfix.Change(c["name"], c["from"], c["to"], c["reason"], c["check"]) for c in changes])
    if report_text is not None and options.report:
        _write_report(options.report, report_text)

    counts = _counts(rows)
    summary = (f"{len(rows)} check{'s' if len(rows) != 1 else ''} in {outcome.seconds:.2f} s: "
               + (", ".join(f"{n} {s}" for s, n in counts.items() if n) or "nothing to check"))
    if changes:
        summary += f"; {len(changes)} variable{'s' if len(changes) != 1 else ''} set by --fix"
    would = [] if options.fix else envfix.plan(sorted(rows, key=lambda r: -_SEVERITY.get(r["status"], 0)), env,
                                               options.keep).changes
    if would:
        summary += f"; --fix would set {', '.join(c.name for c in would)}"
    fields = dict(checks=len(rows), seconds=f"{outcome.seconds:.3f}", **{k: v for k, v in counts.items() if v},
                  fixed=len(changes) or None, command=command)
    at_or_above = [r for r in rows if _SEVERITY.get(r["status"], 0) >= (1 if fail_on == "warn" else 2)]
    if options.strict and (at_or_above or unfinished):
        why = f"{len(at_or_above)} at or above {fail_on}" if at_or_above else "the environment was not verified"
        log("error", f"{summary}; --strict: not starting {command}: {why}", **fields, action="refuse", exit=EX_CONFIG)
        return EX_CONFIG
    log("info", f"{summary}; starting {command}", **fields, action="start")
    return become(path, argv, final_env)
