"""The pre-flight of `envdoctor exec`: what runs in the forked child.

Everything that can hang or break is here, so that the process that will become
the job (envdoctor.entrypoint) only waits, bounded, for an answer: loading the
checks (a plug-in's import can hang) and the config, choosing the checks that
may run in exec, running them on the environment the command will inherit,
and with --fix making the changes their findings carry (envfix) and judging
those checks again on the fixed environment. The answer is JSON: the final
results, the changes made and kept, and the JSON report when one was asked for.
"""

from __future__ import annotations

import os
import time

from envdoctor.record import Record

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Sequence

EXIT_USAGE = 2
DEFAULT_TIMEOUT = 5.0
# Under a distributed launch the ranks compare themselves (dist.consistency) before the
# job: a rank may have to wait for the others to arrive and import torch, so the default
# bound is longer. It is only a bound: with every rank present the exchange takes ~2 s.
LAUNCH_TIMEOUT = 120.0
CROSS_RANK = ("dist.consistency",)
LAUNCH_VARIABLES = {"WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}

class ExecOptions(Record):
    def __init__(
        self,
        strict: bool = False,
        fix: bool = False,
        keep: Sequence[str] = (),
        report: str | None = None,
        only: Sequence[str] = (),
        skip: Sequence[str] = (),
        fail_on: str | None = None,
        timeout: float | None = None,  # None: DEFAULT_TIMEOUT, or LAUNCH_TIMEOUT under a distributed launch
        attach: bool = False,
    ) -> None:
        self.strict = strict
        self.fix = fix
        self.keep = keep
        self.report = report
        self.only = only
        self.skip = skip
        self.fail_on = fail_on
        self.timeout = timeout
        self.attach = attach


def default_budget(options: ExecOptions, env: Mapping[str, str]) -> float:
    """--timeout when given; else LAUNCH_TIMEOUT when this is one rank of a distributed
    launch (envdoctor.launch) and the cross-rank check is not left out; else DEFAULT_TIMEOUT."""
    if options.timeout is not None:
        return options.timeout
    from envdoctor import launch

    only, skip = _split(options.only), _split(options.skip)
    compared = any(c in only for c in CROSS_RANK) if only else not all(c in skip for c in CROSS_RANK)
    # A usable launch, or one whose launch variables --fix may repair (MASTER_PORT=0 on every
    # rank): the ranks then compare after the fix, and need the same time to meet.
    if compared and (not isinstance(launch.of(env), str) or launch.names_a_rank(env)):
        return LAUNCH_TIMEOUT
    return DEFAULT_TIMEOUT


# ----------------------------------------------------------------------------- choosing checks
def _split(items: Sequence[str]) -> list[str]:
    return [part.strip() for item in items for part in item.split(",") if part.strip()]


def runs_in_exec(check: Any) -> bool:
    """What each check declares (Check.modes): cheap reads of files, the environment, NVML and
    the torch facts, paid on every container start; an intrusive check only when what it takes
    is given back before the job starts (dist.consistency: rank 0's exchange store), never
    onnx.opset, torch.pin_memory or dist.master_port."""
    return check.runs_in("exec")


def select(registry: Any, config: Any, options: ExecOptions) -> list[Any]:
    """The runner plans for exec; unknown ids, or --only naming a check that does not
    run in exec, are bad usage (UsageError)."""
    from envdoctor import pipeline
    from envdoctor.errors import UsageError

    only, skip = _split(options.only), _split(options.skip)
    # the ids asked for, from --only or else the config's only (ENVDOCTOR_ONLY included): a
    # config naming only checks exec does not run started the job unchecked, even --strict
    asked, named = (only, "--only") if only else (list(config.only), "the config's only (or ENVDOCTOR_ONLY)")
    try:  # an unknown id is refused here, as in `check`
        plans = pipeline.plan(registry, config, pipeline.Selection(only=only, skip=skip))
    except pipeline.NothingToRun:  # said below, in exec's words
        plans = []
    except UsageError as exc:
        if not str(exc).startswith("unknown check id"):
            raise
        # the ids offered are those exec runs: `check`'s whole list named some exec then refused (helper-84)
        runnable = sorted(c.id for c in registry.checks.values() if runs_in_exec(c))
        raise UsageError(f"{str(exc).split('; `envdoctor checks`', 1)[0]}; exec runs: {', '.join(runnable)}") from None
    chosen = [p for p in plans if runs_in_exec(p.check)]
    # asked for, not skipped, and never run here: a loaded check that says so, or one of
    # envdoctor's own that a load for exec does not even import (registry.NOT_IN_EXEC)
    elsewhere = registry.not_imported | {c.id for c in registry.checks.values() if not runs_in_exec(c)}
    refused = sorted((set(asked) - pipeline.skipped(only, skip, config)) & elsewhere)
    if refused:
        # every check exec can run, not only those left of this selection (which is often none)
        runnable = sorted(c.id for c in registry.checks.values() if runs_in_exec(c))
        raise UsageError(f"{named} {', '.join(refused)}: does not run in exec (too slow or intrusive for every "
                         f"container start; it runs in `envdoctor check`). exec runs: {', '.join(runnable)}")
    selected = only or skip or config.only or config.skip
    if selected and not chosen and not registry.failures_selected(
            set(only) | set(config.only), pipeline.skipped(only, skip, config), pipeline.disabled_in(config)):
        # `--skip` of every check exec runs started the job "verified" by nothing, --strict too
        runnable = sorted(c.id for c in registry.checks.values() if runs_in_exec(c))
        raise UsageError(f"--only/--skip (or the config's only/skip) leave no check that runs in exec; "
                         f"exec runs: {', '.join(runnable)}{pipeline.left_out_hint(registry, set(only) | set(config.only))}")
    return chosen


# ----------------------------------------------------------------------------- a launcher as the command
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")
_NPROC_FLAGS = ("--nproc-per-node", "--nproc_per_node")
# torchrun's options that take no value (torch 2.13: the nargs=0 actions of its parser; launch's --use-env too)
_LAUNCHER_SWITCHES = frozenset({"--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "-m",
                                "--module", "--virtual-local-rank", "--virtual_local_rank", "--use-env", "--use_env"})


def launcher_ranks(argv: Sequence[str], env: Mapping[str, str] | None = None,
                   gpus: Callable[[], int | None] | None = None) -> int | None:
    """Processes per node when the command is torchrun (or `python -m torch.distributed.run`)
    and says how many: the ranks the thread budget is shared between (see launcher_workers)."""
    found = launcher_workers(argv, env, gpus)
    return found[0] if found else None


def launcher_workers(argv: Sequence[str], env: Mapping[str, str] | None = None,
                     gpus: Callable[[], int | None] | None = None) -> tuple[int, str] | None:
    """(processes per node, where that was read) when the command is torchrun or `python -m
    torch.distributed.run` and its --nproc-per-node can be known before it starts.

    `envdoctor exec -- torchrun --nproc-per-node 4 train.py` runs before torchrun has
    set LOCAL_WORLD_SIZE for its workers, and torchrun passes OMP_NUM_THREADS on to
    every worker: sized for the whole container, it would oversubscribe it 4 times.
    Read as torchrun's parser reads it (torch 2.13, helper-71): the last of repeated
    flags, an abbreviation argparse accepts (`--nproc-per=4`), `PET_NPROC_PER_NODE` when
    no flag is given, and `cpu` (or `auto` where no GPU is there to count) as the CPUs
    of the affinity mask, which is what torchrun starts, whatever the quota. `gpu` (and
    `auto` on a GPU node) is torch.cuda.device_count(): `gpus()`, the GPUs CUDA will see
    with this environment, counted from NVML (visible_gpus); not counted without it."""
    env = os.environ if env is None else env
    launched = _launcher_args(argv)
    if launched is None:
        return None
    launcher, args = launched
    value, source = None, ""
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg == "--":
            break  # the training script (after `--` too): what follows is its own
        name, eq, given = arg.partition("=")
        if len(name) > 3 and any(flag.startswith(name) for flag in _NPROC_FLAGS):
            value = given if eq else (args[i + 1] if i + 1 < len(args) else "")
            source = f"{launcher}'s {_NPROC_FLAGS[0]}"
        switch = name in _LAUNCHER_SWITCHES or (len(name) > 3 and any(s.startswith(name) for s in _LAUNCHER_SWITCHES))
        attached = not arg.startswith("--") and len(arg) > 2  # -r3, -mr3: the value is in the word
        i += 1 if eq or switch or attached else 2  # skip an option's separate value
    if value is None and env.get("PET_NPROC_PER_NODE"):
        value, source = env["PET_NPROC_PER_NODE"], "PET_NPROC_PER_NODE"
    if value is None:
        return None
    value = value.strip()
    count = _as_torchrun_reads(value)
    if count is not None:
        return (count, source) if count > 0 else None
    if value == "cpu" or (value == "auto" and not _accelerator_possible(env)):
        cpus = len(os.sched_getaffinity(0))
        return cpus, f"{source}={value} ({cpus} CPUs of the affinity mask)"
    if value in ("gpu", "auto") and gpus is not None:
        # torchrun starts torch.cuda.device_count() workers (and refuses `gpu` when that is 0)
        count = gpus()
        if count:
            return count, f"{source}={value} ({count} GPU{'s' if count != 1 else ''} CUDA sees here)"
    return None  # as many as the GPUs it sees, and they cannot be counted here


def _as_torchrun_reads(value: str) -> int | None:
    """The number torchrun's int(nproc_per_node) makes of a value, or None when it is no
    number: a sign and digit groups count (helper-82: '+4' is 4 workers, '4_0' is 40)."""
    if len(value) > 12 or not value.isascii():  # int() takes any Unicode digit; no worker count is one
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _launcher_args(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """(the launcher's name, its own arguments and the script's after them), or None for
    another command: `torchrun ...`, or python with `-m torch.distributed.run` however
    its options are written (`-u -m`, `-um`, `-mtorch.distributed.run`, an option's value)."""
    if not argv:
        return None
    if os.path.basename(argv[0]) == "torchrun":
        return "torchrun", list(argv[1:])
    if not os.path.basename(argv[0]).startswith("python"):
        return None
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in _PYTHON_VALUED_LONG:
            i += 2
            continue
        if arg.startswith("--") or not arg.startswith("-") or arg == "-":
            if arg.startswith("--"):
                i += 1
                continue
            return None  # a script, or stdin
        for at, letter in enumerate(arg[1:], 1):  # -u, -um, -mmodule, -X dev, -Wd
            if letter in "cmWX":
                rest = arg[at + 1:]
                value = rest or (argv[i + 1] if i + 1 < len(argv) else "")
                if letter == "c":
                    return None
                if letter == "m":
                    after = argv[i + (1 if rest else 2):]
                    return ("torchrun" if value == "torch.distributed.run" else value, list(after)) \
                        if value in _LAUNCHER_MODULES else None
                i += 1 if rest else 2
                break
        else:
            i += 1
    return None


_PYTHON_VALUED_LONG = ("--check-hash-based-pycs",)  # python's long options that take a value


def visible_gpus(env: Mapping[str, str], lib: Any = None) -> int | None:
    """How many GPUs torch.cuda.device_count() gives a process with this environment, from
    NVML's list and CUDA_VISIBLE_DEVICES as cuda.visible_devices reads it; None without NVML."""
    from envdoctor.errors import Unavailable
    from envdoctor.nvml import connect

    from envdoctor.checks.cuda_visible_devices import visible_count

    try:
        return visible_count(env, connect(lib))
    except Unavailable:
        return None


def _accelerator_possible(env: Mapping[str, str]) -> bool:
    """Whether torchrun's `auto` may count GPUs rather than CPUs: an NVIDIA driver that
    CUDA_VISIBLE_DEVICES does not hide entirely, or a ROCm device."""
    if os.path.exists("/dev/kfd"):
        return True
    if not os.path.exists("/proc/driver/nvidia/version"):
        return False
    visible = env.get("CUDA_VISIBLE_DEVICES")
    return visible is None or not (visible.strip() == "" or visible.strip().startswith("-1"))


# ----------------------------------------------------------------------------- the pre-flight (in the child)
def _clamped(plans: Sequence[Any], seconds: float) -> list[Any]:
    from envdoctor.runner import Plan

    # A check cut short by the pre-flight's bound gets more time from exec's --timeout, not its own setting.
    return [Plan(p.check, p.config, max(0.05, min(p.timeout, seconds)),
                 p.raise_with if seconds >= p.timeout else "raise exec's --timeout (it bounds the whole pre-flight)")
            for p in plans]


def _torch_facts(session: Any, timeout: float) -> Any:
    """The torch facts from the interpreter's files (nothing imported, nothing started);
    the probe only when no file says where its torch is."""
    from envdoctor.torchfacts import for_interpreter

    facts = for_interpreter(session.python, dict(session.env), session.roots.rootfs)
    if facts is not None:
        return facts
    facts = _probe(session.python, timeout)
    facts.setdefault("source", "probe")
    return facts


def _probe(python: str, timeout: float) -> Any:
    """The torch facts, bounded by exec's own budget (ENVDOCTOR_PROBE_TIMEOUT does not apply here)."""
    from envdoctor.probe import RAISE_HINT, ProbeError, run_probe

    try:
        return run_probe(python, timeout=timeout)
    except ProbeError as exc:  # the probe's own advice names a variable exec does not read
        raise ProbeError(str(exc).replace(RAISE_HINT, "exec's --timeout bounds it (torch facts are cached after "
                                                      "one full run)")) from None


def set_environ(env: Mapping[str, str]) -> None:
    """Make os.environ exactly `env`, in this (disposable) child. os.environ.clear() raised
    on a name the C library will not unset (an empty one, from `env =x envdoctor exec`);
    such an entry is left, and the job never gets it (entrypoint._passable).

    Only what differs is set: glibc's putenv scans the whole environment each time, so
    setting all of it again made the pre-flight quadratic in its size (helper-117: 4.8 s
    of the 5 s bound at 28,000 variables, a Kubernetes namespace's service links; 35,000
    were refused under --strict)."""
    current = os.environ
    for name in list(current):
        if name not in env:
            try:
                del current[name]
            except OSError:
                pass
    for name, value in env.items():
        if current.get(name) != value:
            current[name] = value


def _fix_and_judge_again(results: list[Any], plans: Sequence[Any], env: Mapping[str, str], keep: Sequence[str],
                         session: Any, deadline: float) -> tuple[Any, dict[str, str], list[Any]]:
    """--fix: work out the changes, make them, and judge the checks they came from again
    on the fixed environment (by `deadline`). Returns (the plan, the fixed env, results)."""
    from envdoctor import envfix, runner
    from envdoctor.context import Session

    fix = envfix.plan([r.to_dict() for r in sorted(results, key=lambda r: -r.status.severity)], env, keep)
    fixed_env = envfix.apply(env, fix.changes)
    if fix.changes:
        set_environ(fixed_env)  # exactly the fixed environment: a fix may unset a variable
        # Judged again: every check that wanted one of the changed variables (a change is
        # credited to one check, the loudest, but others may have asked for it too). A
        # cross-rank check cannot be judged again by one rank alone (the others have moved
        # on): its row keeps rank 0's verdict, with what was changed here; unless it never
        # ran because the launch variables were unusable and the fix changed them: then every
        # rank in that state runs it now, for the first time.
        changed = {c.name for c in fix.changes}
        again = {c.check for c in fix.changes} | {r.check for r in results
                                                  if changed & set(envfix.wanted(r.to_dict()))}
        again -= set(CROSS_RANK)
        again |= {r.check for r in results if r.check in CROSS_RANK and r.status.value == "skip"
                  and changed & LAUNCH_VARIABLES}
        fixed = Session(env_override=fixed_env, host=session.host, torch_factory=lambda s: session.need("torch"))
        plans = _clamped([p for p in plans if p.check.id in again], deadline - time.monotonic())
        rejudged = {r.check: r for r in runner.run(plans, fixed)}
        for result in rejudged.values():
            result.facts["exec_fixed"] = {c.name: {"from": c.old, "to": c.new} for c in fix.changes if c.check == result.check}
        results = [rejudged.get(r.check, r) for r in results]
    for result in results:
        if result.check in CROSS_RANK:
            _settle_cross_rank(result, fix, fixed_env, set(keep))
    for change in fix.kept:
        for result in results:
            if result.check == change.check:
                result.facts.setdefault("exec_kept", {})[change.name] = {"value": change.old, "wanted": change.new}
    return fix, fixed_env, results


def _settle_cross_rank(result: Any, fix: Any, fixed_env: Mapping[str, str], keep: set[str]) -> None:
    """A cross-rank row after --fix. Every rank runs the same `exec --fix` and holds the same
    verdict from rank 0; when each of its problems is a variable whose fix is the majority's
    value and this rank's fixed environment has that value for every one of them (it changed
    its own, or had it), every rank does (each checks the same on its own), so the ranks
    agree. A --keep that blocked one, or any other kind of problem (versions, GPUs, a missing
    rank), leaves rank 0's verdict as it was."""
    from envdoctor.model import Status

    changed = {c.name: {"from": c.old, "to": c.new} for c in fix.changes if c.check == result.check}
    if changed:
        result.facts["exec_fixed"] = changed
    wanted = result.fix_env or {}
    # --keep is the same on every rank (one command line): a kept variable may differ on
    # some rank, so no rank may call the ranks agreed, the one that has the value included.
    holds = bool(wanted) and not keep & set(wanted) and all(fixed_env.get(name) == value
                                                             for name, value in wanted.items())
    if result.status in (Status.WARN, Status.FAIL) and result.facts.get("fixable_by_env") and holds:
        here = ", ".join(f"{n} {_or_unset(v['from'])} -> {_or_unset(v['to'])}" for n, v in changed.items()) or "nothing"
        result.summary = (f"fixed by --fix on every rank (each takes the majority's value; here: {here}); "
                          f"rank 0 had found: {result.summary}")
        result.status = Status.OK
        result.remediation = ""
        result.fix_env = {}


def _or_unset(value: Any) -> str:
    return "unset" if value is None else str(value)


def job_python(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The interpreter the command runs: the command itself when it is one (`python
    train.py`, `/opt/venv/bin/python3.11 -m x`), or the one its `#!` line names (`torchrun`,
    `accelerate`, `deepspeed`: scripts pip wrote for the job's venv). Its torch is the
    job's, which may not be the one beside envdoctor."""
    from envdoctor.become import CannotRun, resolve_command

    if not argv:
        return None
    try:
        path = resolve_command(argv[0], env.get("PATH"))
    except CannotRun:
        return None
    if _is_python(argv[0]):
        return path
    return _shebang_python(path, env)


def _is_python(name: str) -> bool:
    import re

    return re.fullmatch(r"python[0-9.]*", os.path.basename(name)) is not None


# pip's form for a python whose path is too long (or has a space) for a `#!` line:
# `#!/bin/sh`, then this, the path, "$0" "$@"
_PIP_SH_EXEC = "'''exec' "


def _shebang_python(script: str, env: Mapping[str, str]) -> str | None:
    """The python a script's first lines run (`#!/venv/bin/python3`, `#!/usr/bin/env
    python3`, or pip's two-line form for a long path), or None: a binary, another
    interpreter, an unreadable file."""
    from envdoctor.become import CannotRun, resolve_command

    try:
        with open(script, "rb") as f:
            head = f.read(1024)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    lines = head.decode("utf-8", "replace").splitlines()
    words = lines[0][2:].split()
    if words[:1] == ["/bin/sh"] and len(lines) > 1 and lines[1].startswith(_PIP_SH_EXEC):
        import shlex

        try:
            words = shlex.split(lines[1][len(_PIP_SH_EXEC):])[:1]
        except ValueError:
            return None
    elif words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")][:1]  # `env -S python3 -u`
    if not words or not _is_python(words[0]):
        return None
    try:
        return resolve_command(words[0], env.get("PATH"))
    except CannotRun:
        return None


def cpu_threads_source_key() -> str:
    from envdoctor.checks.cpu_threads import PROCESSES_SOURCE

    return PROCESSES_SOURCE


def configured_python(config: Any) -> str | None:
    """`python` from the config file or ENVDOCTOR_PYTHON, found on the command's PATH
    (this child runs with the command's environment); a name that finds nothing is bad
    config, as in `check`. exec used to ignore it and judge another torch unsaid."""
    if not config.python:
        return None
    import shutil  # here: with its bz2 and lzma, ~3 ms of a start that has no python configured

    from envdoctor.errors import UsageError

    found = shutil.which(config.python)
    if found is None:
        raise UsageError(f"bad config: {config.python_from or 'python'}: {config.python!r}: no such executable interpreter")
    return found


def preflight(plans: Sequence[Any], env: Mapping[str, str], options: ExecOptions, budget: float,
              failures: Sequence[Any] = (), host: Any = None, started: float | None = None,
              python: str | None = None) -> dict[str, Any]:
    """Run the checks on `env` (then fix and judge again), in this (forked) process.

    Returns JSON-able data: final results, changes made and kept, and the JSON
    report text when asked for. Leaves 10% of the budget for the answer to travel.
    Plug-ins that failed to load (`failures`) are error rows, as in `check`.
    """
    from envdoctor import __version__, envfix, redact, runner
    from envdoctor.context import HostSession, Session
    from envdoctor.model import Report, host_name, started_now

    t0 = time.monotonic() if started is None else started  # the budget runs from here (monotonic is system-wide)
    started_at = started_now()
    # The child is disposable: give it the job's environment, so the torch probe and
    # every library it loads see what the command will see.
    set_environ(env)
    first = max(0.05, t0 + budget * 0.7 - time.monotonic())
    host = host or HostSession()
    session = Session(env_override=dict(env), host=host, torch_factory=lambda s: _torch_facts(s, max(0.05, first - 0.1)),
                      **({"python": python} if python else {}))
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
    report = Report(host=host_name(), version=__version__, started_at=started_at, target="self",
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


def in_child(options: ExecOptions, env: Mapping[str, str], argv: Sequence[str], started: float,
             send: Any, listed: list[Any] | None = None) -> dict[str, Any]:
    """The whole pre-flight, in the forked child: everything that can hang or break is
    here, loading the checks included (a plug-in's import may hang). Bad usage or a bad
    config comes back as {"stop": [2, line]}; before the checks run, the plan is sent
    ahead, so a pre-flight killed at the deadline can still say what did not finish."""
    from envdoctor import registry as registry_module
    from envdoctor.config import load as load_config
    from envdoctor.errors import ConfigError, UsageError

    set_environ(env)  # plug-ins and the config read the environment the command will get
    # A plug-in whose import hangs may take half of what is left, not the registry's 5 s:
    # with exec's default 5 s bound that was all of it, and one such plug-in left every
    # start with nothing verified (helper-37). The checks get the other half.
    left = options.timeout - (time.monotonic() - started) if options.timeout else registry_module.PLUGIN_IMPORT_TIMEOUT
    registry = registry_module.load(importing=lambda eps: send({"importing": [f"{ep.name} ({ep.value})" for ep in eps]}),
                                    import_timeout=max(0.1, min(registry_module.PLUGIN_IMPORT_TIMEOUT, left / 2)),
                                    listed=listed, for_mode="exec")
    try:
        # the settings of a check exec never runs wait unread, as a left-out plug-in's: `check` reads them
        config = load_config(registry.checks, known_ids=registry.unloaded_ids,
                             left_out=registry.left_out | registry.not_imported, unimported=registry.not_imported)
        workers = launcher_workers(argv, env, gpus=lambda: visible_gpus(env))
        threads = config.checks.setdefault("cpu.threads", {})
        if workers and "LOCAL_WORLD_SIZE" not in env and not threads.get("processes_per_node"):
            threads["processes_per_node"] = workers[0]  # as if configured: the ranks share the CPUs
            threads[cpu_threads_source_key()] = workers[1]  # said so, not "config"
        plans = select(registry, config, options)
    except ConfigError as exc:
        return {"stop": [EXIT_USAGE, f"bad config: {exc}"]}
    except UsageError as exc:
        return {"stop": [EXIT_USAGE, str(exc)]}
    fail_on = options.fail_on or config.fail_on
    only = set(_split(options.only)) | set(config.only)
    from envdoctor.pipeline import disabled_in

    from envdoctor.pipeline import skipped

    failures = registry.failures_selected(only, skipped(_split(options.only), _split(options.skip), config),
                                          disabled_in(config))
    send({"plan": [p.check.id for p in plans] + [f.row or f.name for f in failures], "fail_on": fail_on})
    try:  # the config's python when one is set (as `check` reads it), else the command's
        python = configured_python(config) or job_python(argv, env)
    except UsageError as exc:
        return {"stop": [EXIT_USAGE, str(exc)]}
    answer = preflight(plans, env, options, options.timeout, failures, started=started, python=python)
    answer["fail_on"] = fail_on
    return answer
