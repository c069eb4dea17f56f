"""serve renders /metrics from lines it keeps by series (envdoctor.serve.exposition_cache):
the bytes must be prometheus_client's generate_latest's, run after run, whatever the
families, labels and values, and what a run no longer uses must be forgotten."""

from __future__ import annotations

import math
import random

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from envdoctor.serve.exposition_cache import ExpositionCache

AWKWARD = ["", "plain", 'say "hi"', "back\\slash", "two\nlines", "ünïcødé ✓", "a b 0.0", "}{=,", " 1 ", "\t"]
VALUES = [0.0, -0.0, 1.0, 1, 2**53 + 1, 1e300, -1e-300, 12345678.9, 0.1, math.inf, -math.inf, math.nan, True]


class Families:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self):
        return iter(self.families)


def library(*collectors) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return generate_latest(registry)


def random_families(rng: random.Random, series: int) -> list[Metric]:
    families: list[Metric] = []
    for n in range(rng.randint(1, 6)):
        kind = rng.choice(["gauge", "counter", "info", "gauge"])
        name, doc = f"envdoctor_family_{n}", rng.choice(["Plain help.", "Help with \\ and\nnewline.", ""])
        labels = rng.sample(["target", "check", "status", "zone", "a"], rng.randint(0, 3))
        if kind == "gauge":
            family = GaugeMetricFamily(name, doc, labels=labels)
        elif kind == "counter":
            family = CounterMetricFamily(name, doc, labels=labels)
        else:
            family = InfoMetricFamily(name, doc, labels=labels)
        for _ in range(rng.randint(0, series)):
            values = [rng.choice(AWKWARD + [f"pid:{rng.randint(1, 50)}"]) for _ in labels]
            if kind == "info":
                family.add_metric(values, {"version": rng.choice(AWKWARD)})
            else:
                family.add_metric(values, rng.choice(VALUES))
        families.append(family)
    return families


def test_the_bytes_are_generate_latests_run_after_run_for_random_families():
    rng = random.Random(20261126)
    cache = ExpositionCache()
    for _ in range(300):  # one cache for every round: lines from earlier rounds must never leak in
        families = random_families(rng, series=12)
        assert cache.render(Families(families)) == library(Families(families))
        # the same series, new values: now from kept lines
        for family in families:
            family.samples = [s._replace(value=rng.choice(VALUES)) for s in family.samples]
        assert cache.render(Families(families)) == library(Families(families))


def test_families_outside_the_line_grammar_are_rendered_whole_by_prometheus_client():
    """A timestamp, an exemplar-free counter with its _created sample: generate_latest
    moves _created into a gauge family of its own, after the counter."""
    created = CounterMetricFamily("envdoctor_started", "With a creation time.", labels=["target"], created=1700000000.5)
    created.add_metric(["node"], 3.0, created=1700000000.5)
    stamped = GaugeMetricFamily("envdoctor_stamped", "A sample with a timestamp.", labels=["target"])
    stamped.add_metric(["node"], 1.5, timestamp=1700000000.25)
    plain = GaugeMetricFamily("envdoctor_plain", "Plain.", labels=["target"])
    plain.add_metric(["pid:1"], 2.0)
    families = Families([created, stamped, plain])
    cache = ExpositionCache()
    for _ in range(2):
        body = cache.render(families)
        assert body == library(families)
    assert b"envdoctor_started_created" in body and b"1700000000250" in body


def test_several_collectors_in_order_and_what_a_run_no_longer_uses_is_forgotten():
    def gauge(name: str, targets: list[str]) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, f"{name} help.", labels=["target"])
        for t in targets:
            family.add_metric([t], 1.0)
        return family

    cache = ExpositionCache()
    first = [Families([gauge("envdoctor_a", ["pid:1", "pid:2", "pid:3"])]), Families([gauge("envdoctor_b", ["node"])])]
    assert cache.render(*first) == library(*first) and len(cache) == 4
    later = [Families([gauge("envdoctor_a", ["pid:3", "pid:4"])]), Families([])]
    assert cache.render(*later) == library(*later)
    assert len(cache) == 2  # pid:1, pid:2 and envdoctor_b's node series are gone with their processes


def test_a_family_whose_type_or_help_changed_gets_its_own_lines():
    """A SIGHUP reload or a plug-in may declare a name again with another help or type."""
    cache = ExpositionCache()
    for kind, doc in (("gauge", "One help."), ("gauge", "Another help."), ("counter", "Another help.")):
        family = (GaugeMetricFamily if kind == "gauge" else CounterMetricFamily)("envdoctor_x", doc, labels=["target"])
        family.add_metric(["pid:9"], 4.0)
        assert cache.render(Families([family])) == library(Families([family]))
