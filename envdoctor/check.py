"""How a check declares itself: metadata as data, plus gather and judge.

A check module exposes `CHECK = Check(...)` and an entry point in the
`envdoctor.checks` group names it. Everything the engine needs to know about a
check (its id, what it needs, where it may run, whether it is intrusive, its
settings and their defaults, the metrics its facts become) is here as data, so
there is no second list to keep in step: the config validator, `envdoctor checks`,
`envdoctor explain`, the Prometheus exporter, `serve` and `exec` all read the same
declaration.

A check is `gather` (I/O through the context: files, NVML, the torch facts) and
`judge` (pure: facts and settings to a Result, built with model.verdict), so tests
feed facts straight to the judge and fixture trees to the gatherer. A plug-in
written against the older single `run(ctx)` keeps working unchanged.
"""

from __future__ import annotations

import re

from envdoctor.record import Value

TYPE_CHECKING = False  # typing only for type checkers: its import is ~2.5 ms of every start
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping

    from envdoctor.context import Context
    from envdoctor.model import Result

ID_PATTERN = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")

# What a check may need. A check that declares a need is skipped, with the reason,
# when the need cannot be met here, before its function runs.
NEEDS = ("nvml", "torch", "onnx")

# Where a check may run. `check` is the one-shot report, `serve` the node monitor
# (every interval, over every process on the node), `exec` the container entrypoint
# (on every container start, before the job), `inprocess` preflight() and attach()
# inside the training script. serve never runs an intrusive check; exec runs one only
# when what it takes is given back before the job starts (released_before_job).
MODES = ("check", "serve", "exec", "inprocess")
DEFAULT_MODES = ("check", "serve", "exec", "inprocess")


class Metric(Value):
    """A fact exported as a Prometheus gauge.

    `fact` names a key of Result.facts. When `label` is set the fact is a mapping
    {label value: number} and becomes one sample per entry (for example
    `memory="host"` / `memory="gpu0"`). Label values must be bounded names, never
    free-form text (DESIGN principle 3).

    When `info` is set, the fact is a list of mappings and each becomes one sample of
    value 1 whose labels are read from its keys: `info=(("gpu", "index"), ("uuid",
    "uuid"))` makes `{gpu="0",uuid="GPU-..."} 1` of `{"index": 0, "uuid": "GPU-..."}`.
    That is the info-metric pattern: one series per thing, to join other series on
    (as target_info does for processes). Its values are identifiers, cut at 128
    characters; the name should end in `_info`.
    """

    def __init__(
        self,
        name: str,  # without the envdoctor_ prefix, base unit in the name: "shm_size_bytes"
        fact: str,
        help: str,
        label: str | None = None,
        info: tuple[tuple[str, str], ...] = (),  # (label, key of each mapping) pairs
    ) -> None:
        self.name = name
        self.fact = fact
        self.help = help
        self.label = label
        self.info = info


class Check(Value):
    """One pluggable rule: its id, what it protects against, how it gathers facts and
    judges them (or one older `run`), its settings, and where it may run. Third-party
    checks declare one of these under the `envdoctor.checks` entry-point group."""

    def __init__(
        self,
        id: str,
        title: str,  # one line: what the check protects against
        run: Callable[["Context"], "Result"] | None = None,  # the older one-function form; or gather + judge
        explain: str = "",  # what it reads, why it matters to a CUDA job, how to fix it
        needs: tuple[str, ...] = (),
        enabled: bool = True,  # on by default?
        timeout: float | None = None,  # seconds; None means the run's default
        config: dict[str, Any] | None = None,  # setting keys and their defaults
        metrics: tuple[Metric, ...] = (),
        gather: Callable[["Context"], Any] | None = None,  # I/O through the context -> facts
        judge: Callable[[Any, Mapping[str, Any]], "Result"] | None = None,  # pure: (facts, settings) -> Result
        modes: tuple[str, ...] = DEFAULT_MODES,  # where it may run
        intrusive: bool = False,  # creates a CUDA context, loads onnxruntime, binds a port...
        # Intrusive, but everything it takes is given back before exec becomes the job (rank 0's
        # exchange store closes and its port is proved free): exec may run it when `modes` says so.
        released_before_job: bool = False,
    ) -> None:
        self.id = id
        self.title = title
        self.run = run
        self.explain = explain
        self.needs = needs
        self.enabled = enabled
        self.timeout = timeout
        self.config = {} if config is None else config
        self.metrics = metrics
        self.gather = gather
        self.judge = judge
        self.modes = modes
        self.intrusive = intrusive
        self.released_before_job = released_before_job
        self.__post_init__()

    def __post_init__(self) -> None:
        if not ID_PATTERN.match(self.id):
            raise ValueError(f"check id {self.id!r} is not a dotted lower-case id like 'shm.size'")
        unknown = set(self.needs) - set(NEEDS)
        if unknown:
            raise ValueError(f"check {self.id}: unknown needs {sorted(unknown)}; known: {NEEDS}")
        unknown_modes = set(self.modes) - set(MODES)
        if unknown_modes:
            raise ValueError(f"check {self.id}: unknown modes {sorted(unknown_modes)}; known: {MODES}")
        if self.run is None and (self.gather is None or self.judge is None):
            raise ValueError(f"check {self.id}: give run=, or both gather= and judge=")

    @property
    def defaults(self) -> dict[str, Any]:
        """The check's own settings and their defaults (`config=` in the declaration)."""
        return self.config

    def runs_in(self, mode: str) -> bool:
        """May this check run in `mode`? serve never runs an intrusive check (it would take
        from the jobs it watches); exec only one whose intrusion ends before the job starts."""
        if mode not in self.modes:
            return False
        if self.intrusive and mode == "serve":
            return False
        return not (self.intrusive and mode == "exec" and not self.released_before_job)

    def execute(self, ctx: "Context") -> "Result":
        """Gather then judge (or the older run). Both see every declared setting: the
        pipeline's plans already hold them (Config.settings_for), and a hand-made plan
        with fewer gets the declared defaults for the rest, so no check restates them."""
        if self.run is not None:
            return self.run(ctx)
        assert self.gather is not None and self.judge is not None
        if any(key not in ctx.config for key in self.defaults):
            ctx = ctx.replace(config={**self.defaults, **ctx.config})
        return self.judge(self.gather(ctx), ctx.config)
