"""`envdoctor exec`: check the environment a job is about to get, fix what can be
fixed from inside, then become the job.

For image builders: `ENTRYPOINT ["tini", "--", "envdoctor", "exec", "--"]`, or
`envdoctor exec -- python train.py` in a Slurm script. A 64 MiB /dev/shm or 128
OpenMP threads on a 2-CPU quota surfaces an hour into a run as a bus error or a
crawl; here it is one line in the container log before the first import.

The order of things (this module is the process that becomes the job; it never
starts a thread and never imports a check):
1. The command is resolved on the PATH it will get (envdoctor.become); not found
   is 127, found but not executable 126, as a shell says (one line, nothing runs).
2. The pre-flight (envdoctor.exec_preflight) runs in a forked child
   (envdoctor.forked; as the `envdoctor` command, forked before the CLI was even
   imported, envdoctor.exec_headstart), bounded as a whole by --timeout: loading the checks and the
   config, the checks that may run in exec on the environment the command will
   inherit, and with --fix the changes their findings carry, judged again. Past
   the bound the child and what it started are killed and the job starts (with
   --strict it does not: nothing was verified).
3. One logfmt line (envdoctor.log) per warn/fail/error result with its fix, one
   per variable --fix set, then one summary line: a log, not a table. --report
   FILE gets the JSON report, written atomically ('-': standard output).
4. --strict: a result at --fail-on or above (error counts as fail) stops here
   with 78 (EX_CONFIG); the command never runs.
5. Otherwise execve (envdoctor.become): same PID, signals, exit status and
   process tree as the command's own; no wrapper stays. envdoctor does not reap
   zombies: where the container has no init, run it under one (`docker run
   --init`, tini).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from envdoctor.become import CannotRun, become, resolve_command
from envdoctor.exec_preflight import DEFAULT_TIMEOUT, ExecOptions, default_budget, in_child

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Mapping, Sequence

__all__ = ["ExecOptions", "run", "EX_CONFIG", "EXIT_USAGE", "DEFAULT_TIMEOUT"]

EX_CONFIG = 78  # sysexits.h: the environment (configuration) is not fit to start the job
EXIT_USAGE = 2
MAX_TIMEOUT = 86400.0  # as envdoctor.config's (importing it here would cost exec ~15 ms at every start)
SOURCE = "envdoctor.exec"  # the `source=` field of every line exec logs
UNFINISHED_ROW = "exec.preflight"  # the report's one row when the pre-flight ended before it had a plan
_SEVERITY = {"ok": 0, "skip": 0, "warn": 1, "fail": 2, "error": 2}


def _is_variable_name(name: str) -> bool:
    """A name a shell could export: letters, digits and _, not starting with a digit."""
    return bool(name) and name.isascii() and not name[0].isdigit() and name.replace("_", "a").isalnum()


class Stop(Exception):
    """Leave with `code` after saying `line` (bad usage, or bad config found by the child)."""

    def __init__(self, code: int, line: str):
        super().__init__(line)
        self.code = code
        self.line = line


# How long one of exec's lines may wait for a full stderr (a log reader behind): they are
# said before the job starts or never; a stderr nobody reads delays the start once by this.
LOG_PATIENCE_SECONDS = 5.0


def log(level: str, message: str, **fields: Any) -> None:
    """One logfmt line on stderr (envdoctor.log: redacted, never raises), marked as exec's."""
    from envdoctor import log as logger

    logger.patience(LOG_PATIENCE_SECONDS)
    logger.event(level, message, **{k: v for k, v in fields.items() if v is not None}, source=SOURCE)


def _unfinished(check_ids: Sequence[str], why: str) -> list[dict[str, Any]]:
    return [{"check": check_id, "target": "self", "status": "error", "summary": why, "remediation": "",
             "facts": {}, "duration_seconds": 0.0} for check_id in check_ids]


def _report_without_child(rows: list[dict[str, Any]], seconds: float) -> str:
    import json

    from envdoctor import __version__
    from envdoctor.model import SCHEMA, host_name, started_now

    return json.dumps({"schema": SCHEMA, "host": host_name(), "version": __version__,
                       "started_at": started_now(), "target": "self",
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
            message += " (not something --fix changes: see its fix)"
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
    except (Stop, CannotRun) as stop:
        log("error", stop.line, exit=stop.code)
        return stop.code


def _validate(options: ExecOptions, argv: list[str]) -> None:
    if not argv:
        raise Stop(EXIT_USAGE, "no command given: envdoctor exec [OPTIONS] -- CMD ARGS...")
    if not 0 < options.timeout <= MAX_TIMEOUT:  # NaN fails this too: it reached select() and raised
        raise Stop(EXIT_USAGE, f"--timeout must be a positive number of seconds, at most {MAX_TIMEOUT:g} (one day), "
                               f"not {options.timeout!r}")  # :g said 'not 86400' for 86400.0001
    if options.fail_on is not None and options.fail_on not in ("warn", "fail"):
        raise Stop(EXIT_USAGE, f"--fail-on must be warn or fail, not {options.fail_on!r}")
    for flag, given in (("--only", options.only), ("--skip", options.skip)):
        if given and not any(part.strip() for item in given for part in item.split(",")):
            raise Stop(EXIT_USAGE, f"{flag} {' '.join(given)!r} names no check id; `envdoctor checks` lists them")
    if options.report is not None and not options.report.strip():  # '' wrote nothing and said nothing
        raise Stop(EXIT_USAGE, "--report needs a file name")
    # An option that takes a value takes the next word, whatever it is: `--report --strict`
    # wrote a file named --strict and the job started although --strict was meant.
    if options.report is not None and options.report.startswith("-") and options.report != "-":
        raise Stop(EXIT_USAGE, f"--report {options.report}: looks like an option, not a file name "
                               f"(for a file named so, write ./{options.report})")
    for name in options.keep:
        if not _is_variable_name(name):
            raise Stop(EXIT_USAGE, f"--keep {name!r}: not a variable name (letters, digits and _, "
                                   "not starting with a digit), so it would keep nothing")
    if options.report and options.report != "-":
        if options.report.endswith("/"):  # os.path would write a file named as the directory it meant
            raise Stop(EXIT_USAGE, f"--report {options.report}: names a directory; give a file name")
        try:
            directory = os.path.dirname(os.path.abspath(options.report))
        except OSError:  # abspath asks getcwd, which fails in a removed working directory
            raise Stop(EXIT_USAGE, f"--report {options.report}: the working directory was removed; "
                                   "give an absolute path") from None
        if not os.path.isdir(directory):
            what = "is not a directory" if os.path.lexists(directory) else "does not exist"
            raise Stop(EXIT_USAGE, f"--report {options.report}: {directory} {what}")
        if os.path.isdir(options.report):
            raise Stop(EXIT_USAGE, f"--report {options.report}: is a directory")


def _attach_hook(env: Mapping[str, str]) -> dict[str, str]:
    """PYTHONPATH with a sitecustomize.py first, which calls envdoctor.attach() in the
    command's interpreter (and in any Python it starts). The directory must outlive this
    process (after execve nothing of envdoctor is left to remove it), so it is one per
    envdoctor installation, reused by every start, under the user's cache directory;
    a fresh private one under $TMPDIR only when that cannot be used."""
    from envdoctor.attach import startup_hook
    from envdoctor.errors import OutputError

    try:
        directory = _hook_directory()
        changes = startup_hook(directory, env)
    except (OSError, OutputError) as exc:  # no writable cache or temporary directory, a full disk: the job
        # still starts, unattached (as for --report); an OutputError escaped as a traceback, and no job (helper-43)
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        log("error", f"--attach: cannot write the start-up hook: {why}; "
                     "the command starts without publishing its live settings (set TMPDIR to a writable directory)")
        return {}
    log("info", f"--attach: the command publishes its live settings (hook in {directory})", hook=directory)
    return changes


def _hook_directory() -> str:
    """~/.cache/envdoctor/attach-hook-<installation>, created 0700 and used only when no one
    but us and root can change it or anything above it (whatever is in it runs in the
    job: envdoctor.private_dir); else the same in $TMPDIR; else a mkdtemp."""
    import hashlib
    import tempfile

    from envdoctor import __version__, diskcache
    from envdoctor.private_dir import make_private, only_ours

    installation = f"{os.path.dirname(os.path.abspath(__file__))}\0{__version__}"
    name = f"attach-hook-{hashlib.sha256(installation.encode()).hexdigest()[:16]}"

    try:
        found: str | None = diskcache.make_dir(diskcache.cache_dir() / name)
    except OSError:
        found = None
    if found is None:
        # No usable home (a read-only container): one directory per user and installation in
        # $TMPDIR, reused as the cache one is; a fresh one each start piled up one per start.
        # One that someone else made first (the name is predictable) is not used.
        shared = Path(tempfile.gettempdir()) / f"envdoctor-{name}-{os.geteuid()}"
        found = make_private(shared)
    if found is None:
        fresh = tempfile.mkdtemp(prefix="envdoctor-attach-")
        found = only_ours(Path(fresh))
        if found is None:
            os.rmdir(fresh)
    if found is None:  # the caller starts the job unattached, and says so
        raise PermissionError(f"no directory only this user can change, under {tempfile.gettempdir()} "
                              "or the cache directory, to put the hook in")
    return found


def _write_report(path: str, text: str) -> None:
    from envdoctor.atomicfile import write_atomic
    from envdoctor.errors import OutputError

    try:
        write_atomic("/dev/stdout" if path == "-" else path, text)  # '-': standard output, the job's too
    except OutputError as exc:  # the job still starts: a report path is not the environment
        log("error", f"--report: {exc}")


def _still_loading(plan: Mapping[str, Any], messages: Sequence[Any]) -> str:
    """What a pre-flight cut off before its plan was doing, and the knob that helps."""
    if plan:
        return "; raise --timeout"
    importing = next((m["importing"] for m in messages if isinstance(m, dict) and "importing" in m), None)
    if importing:
        return (f" (it was still importing plug-in checks: {', '.join(importing)}); raise --timeout, or set "
                "ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD=1 to run without plug-ins")
    return " (it was still loading the checks and the config); raise --timeout"


def _passable(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment execve can hand the job: an entry with an empty name (`env =x
    cmd`; the kernel takes any string) cannot be set, unset or passed on from Python,
    and broke the pre-flight and then execve with a traceback. It is dropped, and said."""
    env = {k: v for k, v in environ.items() if k and "=" not in k and "\0" not in k}
    if len(env) != len(environ):
        from envdoctor.redact import mask_own_secrets

        gone = [f"{k}={environ[k]}" for k in environ if k not in env]
        log("warn", f"dropped {len(gone)} environment entr{'y' if len(gone) == 1 else 'ies'} no program can "
                    f"look up and execve cannot pass on (an empty name): {mask_own_secrets(', '.join(gone))[:200]}",
            dropped=len(gone))
    return env


# What Python's C locale coercion (PEP 538) sets when the invoker set no locale at all
_COERCED_LOCALES = ("C.UTF-8", "C.utf8", "UTF-8")


def _as_invoked(environ: Mapping[str, str]) -> Mapping[str, str]:
    """The environment without the LC_CTYPE that Python's own start added: with no locale
    set (most slim images), the interpreter coerces the C locale and writes
    LC_CTYPE=C.UTF-8 into os.environ, and every job started by exec inherited a variable
    its invoker never set, which changes sorting and collation in non-Python programs
    (helper-43). The kernel's copy of the block the process started with says whether
    the invoker set it."""
    if environ.get("LC_CTYPE") not in _COERCED_LOCALES:
        return environ
    from envdoctor.procfs import parse_environ

    try:
        with open("/proc/self/environ", "rb") as f:
            started_with = parse_environ(f.read())
    except (OSError, ValueError):
        return environ
    given = started_with.get("LC_CTYPE")
    if given == environ["LC_CTYPE"]:
        return environ
    if given is None:
        return {k: v for k, v in environ.items() if k != "LC_CTYPE"}
    return {**environ, "LC_CTYPE": given}  # LC_CTYPE=C (or POSIX, or empty) was overwritten by the coercion (helper-45)


def _run(options: ExecOptions, argv: list[str]) -> int:
    env = _passable(_as_invoked(os.environ))
    options = options.replace(timeout=default_budget(options, env))
    _validate(options, argv)
    path = resolve_command(argv[0], env.get("PATH"))
    command = os.path.basename(argv[0])  # never its arguments: they may hold secrets

    # envdoctor.log (with redaction) before the fork: the child's pipeline needs it too, and
    # imported after the answer it cost the job's start ~13 ms more, one process after the other
    from envdoctor import envfix, exec_headstart, forked, log as _logger  # noqa: F401

    started = time.monotonic()
    waiting = exec_headstart.take()  # forked before the CLI was imported, when this is the `envdoctor` command
    if waiting is not None:
        outcome = waiting.run(options, env, argv, started, options.timeout)
    else:
        outcome = forked.call(lambda send: in_child(options, env, argv, started, send), options.timeout)
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
        unfinished = (f"the pre-flight did not finish within {options.timeout:g} s" + _still_loading(plan, outcome.messages)
                      if outcome.kind == forked.TIMED_OUT else f"the pre-flight broke: {outcome.error}")
        rows = _unfinished(plan.get("plan", []), unfinished)
        # cut off before it knew its checks: an empty `results` read as a clean report
        report_rows = rows or _unfinished([UNFINISHED_ROW], f"nothing was verified: {unfinished}")
        report_text = _report_without_child(report_rows, outcome.seconds) if options.report else None
        log("error", unfinished)
    _log_changes(changes, kept)
    final_env = envfix.apply(env, [envfix.Change(c["name"], c["from"], c["to"], c["reason"], c["check"]) for c in changes])
    if options.attach:
        final_env.update(_attach_hook(final_env))
    if report_text is not None and options.report:
        _write_report(options.report, report_text)

    counts = _counts(rows)
    summary = (f"{len(rows)} check{'s' if len(rows) != 1 else ''} in {outcome.seconds:.2f} s: "
               + (", ".join(f"{n} {s}" for s, n in counts.items() if n)
                  or ("nothing verified (the pre-flight did not finish)" if unfinished else "nothing to check")))
    if changes:
        summary += f"; {len(changes)} variable{'s' if len(changes) != 1 else ''} changed by --fix"
    would = [] if options.fix else envfix.plan(sorted(rows, key=lambda r: -_SEVERITY.get(r["status"], 0)), env,
                                               options.keep).changes
    if would:
        sets = [c.name for c in would if c.new is not None]
        unsets = [c.name for c in would if c.new is None]
        summary += "; --fix would " + " and ".join(
            part for part in (f"set {', '.join(sets)}" if sets else "", f"unset {', '.join(unsets)}" if unsets else "")
            if part)
    fields = dict(checks=len(rows), seconds=f"{outcome.seconds:.3f}", **{k: v for k, v in counts.items() if v},
                  fixed=len(changes) or None, command=command)
    at_or_above = [r for r in rows if _SEVERITY.get(r["status"], 0) >= (1 if fail_on == "warn" else 2)]
    if options.strict and (at_or_above or unfinished):
        why = f"{len(at_or_above)} at or above {fail_on}" if at_or_above else "the environment was not verified"
        log("error", f"{summary}; --strict: not starting {command}: {why}", **fields, action="refuse", exit=EX_CONFIG)
        return EX_CONFIG
    if os.getpid() == 1:  # said before it is too late: the job cannot say it (helper-71)
        log("warn", f"{command} becomes PID 1 with no init: a signal it has no handler for is dropped "
                    "(docker stop waits, then kills it) and orphans stay zombies; use docker run --init, "
                    "tini in the image, or shareProcessNamespace: true in a pod", command=command, action="pid1")
    log("info", f"{summary}; starting {command}", **fields, action="start")
    from envdoctor import log as logger

    logger.settle(LOG_PATIENCE_SECONDS)  # lines a full stderr dropped are said now, or never
    become(path, argv, final_env)  # returns never: the job runs here now, or CannotRun
