"""A 50-node fleet on one machine: do the alerts find every planted problem, and
nothing else? What do Prometheus and the daemons pay for it?

    sudo .venv/bin/python benchmarks/fleet_simulation.py [--nodes 50] [--json out.json]

Each node is a real `envdoctor serve` in its own pid and mount namespace with its own
tmpfs /dev/shm, its own workload processes and its own GPUs (NVML is the only fake:
tests/fake_pynvml.py); see tests/fleet.py. One real Prometheus scrapes them all on
the loopback with deploy/prometheus/envdoctor.rules.yml loaded, every `for:` divided
by --compress (60: 15m becomes 15 s) so alerts fire within minutes; expressions and
thresholds are the shipped ones. The script waits until every planted problem's alert
fires (or --timeout), then reports:
- planted problems against the alerts that fired (all found, nothing else: exit 0);
- Prometheus' scrape duration per target, samples per target;
- CPU and RSS of the daemons (and of Prometheus) over a steady window;
- what that implies for 1,000 and 10,000 nodes.
Self-stopping: everything runs under `timeout`, and is stopped on the way out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import fleet  # noqa: E402

import psutil  # noqa: E402

GIB = 1024**3
CLEAN = {"env": {}, "gpu": 0}

# node index -> (what is planted, spec change, expected alerts as (alertname, check, target)),
# target: "node", a workload's index, or "*" for every workload of the node.
PLANTED = {
    3: ("/dev/shm is Docker's 64 MiB", {"shm": "64m"},
        [("EnvdoctorCheckFailing", "shm.size", "node"), ("EnvdoctorCheckFailing", "shm.size", "*")]),
    7: ("GPU 1 has uncorrectable ECC errors", {"gpus": [{}, {"ecc_uncorrected": 2}]},
        [("EnvdoctorCheckFailing", "gpu.health", "node")]),
    11: ("a job's CUDA_VISIBLE_DEVICES=0,x,1", {"workloads": [{"env": {"CUDA_VISIBLE_DEVICES": "0,x,1"}, "gpu": 0}]},
         [("EnvdoctorCheckFailing", "cuda.visible_devices", 0)]),
    19: ("a job's OMP_NUM_THREADS=64 on 2 CPUs", {"workloads": [CLEAN, {"env": {"OMP_NUM_THREADS": "64"}, "gpu": 1}]},
         [("EnvdoctorCheckWarning", "cpu.threads", 1)]),
    23: ("a job's WORLD_SIZE=2 RANK=3, no master", {"workloads": [{"env": {"WORLD_SIZE": "2", "RANK": "3"}, "gpu": 0}]},
         [("EnvdoctorCheckFailing", "dist.env", 0)]),
    31: ("GPU 0 fell off the bus", {"gpus": [{"lost": True}, {}]},
         [("EnvdoctorCheckFailing", "gpu.health", "node")]),
    42: ("GPU 0 has a page retirement pending", {"gpus": [{"retired_pages_pending": True}, {}]},
         [("EnvdoctorCheckFailing", "gpu.health", "node")]),
    45: ("60 GiB of GPU 1 held by a stray process", {"gpus": [{}, {"memory_used": 60 * GIB}]},
         [("EnvdoctorCheckWarning", "gpu.health", "node")]),
}


def specs(n: int) -> dict[str, dict]:
    out = {}
    for i in range(n):
        spec = {"shm": "1g", "gpus": [{}, {}], "workloads": [CLEAN] if i % 3 else [CLEAN, {"env": {}, "gpu": 1}]}
        spec.update(PLANTED.get(i, (None, {}, []))[1])
        out[f"node-{i:02d}"] = spec
    return out


def expected(f: fleet.Fleet) -> set[tuple[str, str, str, str]]:
    want = set()
    for i, (_, _, alerts) in PLANTED.items():
        name = f"node-{i:02d}"
        if name not in f.nodes:
            continue
        workloads = f.nodes[name].workloads
        for alertname, check, target in alerts:
            pids = workloads if target == "*" else [] if target == "node" else [workloads[target]]
            labels = ["node"] if target == "node" else [f"pid:{pid}" for pid in pids]
            want.update((alertname, name, check, label) for label in labels)
    return want


def alerts(f: fleet.Fleet, state: str) -> set[tuple[str, str, str, str]]:
    return {(m["alertname"], m.get("instance", ""), m.get("check", ""), m.get("target", ""))
            for m in (r["metric"] for r in f.query(f'ALERTS{{alertstate="{state}"}}'))}


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def memory(pids: list[int]) -> tuple[float, float]:
    """(sum of RSS, sum of PSS) in bytes: RSS counts shared pages once per process, PSS splits them."""
    rss = pss = 0.0
    for pid in pids:
        try:
            full = psutil.Process(pid).memory_full_info()
            rss += full.rss
            pss += getattr(full, "pss", full.rss)
        except psutil.Error:
            pass
    return rss, pss


def per_target(f: fleet.Fleet, expr: str) -> dict[str, float]:
    return {r["metric"]["instance"]: float(r["value"][1]) for r in f.query(expr)}


def prometheus_head_series(f: fleet.Fleet) -> float:
    """From Prometheus' own /metrics (it does not scrape itself here)."""
    with urllib.request.urlopen(f.prometheus_url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("prometheus_tsdb_head_series "):
                return float(line.split()[1])
    return float("nan")


def quantiles(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"min": values[0], "median": statistics.median(values), "p95": pick(0.95), "max": values[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--interval", type=float, default=15, help="serve --interval (seconds; serve's default)")
    parser.add_argument("--scrape-interval", default="5s")
    parser.add_argument("--compress", type=float, default=60, help="divide every alert's `for:` by this")
    parser.add_argument("--window", type=float, default=60, help="seconds of steady state measured for CPU")
    parser.add_argument("--timeout", type=float, default=300, help="give up waiting for alerts after this")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    reason = fleet.can_run()
    if reason:
        print(f"fleet simulation cannot run here: {reason}", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix=f"envdoctor-fleet-{os.getpid()}-") as tmp:
        workdir = Path(tmp)
        rules = fleet.compressed_rules(workdir / "rules.yml", args.compress)
        deadline = args.timeout + args.window + 120
        started = time.monotonic()
        with fleet.Fleet(specs(args.nodes), workdir, deadline=deadline, interval=args.interval,
                         scrape_interval=args.scrape_interval, evaluation_interval=args.scrape_interval,
                         rules=[rules]) as f:
            startup = time.monotonic() - started
            serve_pids = [n.serve_pid for n in f.nodes.values() if n.serve_pid]
            prom_pid = next((c.pid for c in psutil.Process(f.prometheus.pid).children() if c.name() == "prometheus"),
                            f.prometheus.pid)
            f.wait_for('up{job="envdoctor"} == 1', args.nodes, 120)

            # steady state: CPU over a window after every daemon's first runs
            time.sleep(args.interval)
            cpu0, prom0, t0 = cpu_seconds(serve_pids), cpu_seconds([prom_pid]), time.monotonic()
            time.sleep(args.window)
            cpu1, prom1, t1 = cpu_seconds(serve_pids), cpu_seconds([prom_pid]), time.monotonic()
            rss, pss = memory(serve_pids)
            prom_rss, _ = memory([prom_pid])

            want = expected(f)
            end = time.monotonic() + args.timeout
            while not want <= alerts(f, "firing") and time.monotonic() < end:
                time.sleep(2)
            firing, pending = alerts(f, "firing"), alerts(f, "pending")
            window = f"{int(time.monotonic() - started)}s"
            scrape = per_target(f, f'max_over_time(scrape_duration_seconds{{job="envdoctor"}}[{window}])')
            scrape_avg = per_target(f, f'avg_over_time(scrape_duration_seconds{{job="envdoctor"}}[{window}])')
            samples = per_target(f, 'scrape_samples_scraped{job="envdoctor"}')
            targets = per_target(f, "envdoctor_targets")
            head_series = prometheus_head_series(f)
            node = next(iter(f.nodes.values()))
            with urllib.request.urlopen(f"http://{node.address}/metrics", timeout=10) as r:
                metrics_bytes = len(r.read())
            ask_gzip = urllib.request.Request(f"http://{node.address}/metrics", headers={"Accept-Encoding": "gzip"})
            with urllib.request.urlopen(ask_gzip, timeout=10) as r:
                gzip_bytes = len(r.read())  # what Prometheus transfers (it asks for gzip)

    n = args.nodes
    scrape_s = float(args.scrape_interval.rstrip("s"))
    per_node = statistics.mean(samples.values())
    per_target_samples = sum(samples.values()) / sum(targets.values())
    cores = (cpu1 - cpu0) / (t1 - t0)
    figures = {
        "nodes": n, "serve_interval_s": args.interval, "scrape_interval_s": scrape_s, "startup_s": round(startup, 1),
        "planted": {f"node-{i:02d}": what for i, (what, _, _) in PLANTED.items() if i < n},
        "expected_alerts": sorted(want), "firing": sorted(firing), "pending": sorted(pending),
        "missed": sorted(want - firing), "unexpected": sorted((firing | pending) - want),
        "scrape_duration_max_s": quantiles(list(scrape.values())), "scrape_duration_avg_s": quantiles(list(scrape_avg.values())),
        "samples_per_node": quantiles(list(samples.values())), "samples_per_target": round(per_target_samples, 1),
        "targets_per_node": quantiles(list(targets.values())), "metrics_bytes_one_node": metrics_bytes, "metrics_gzip_bytes_one_node": gzip_bytes,
        "daemons_cpu_cores": round(cores, 4), "daemon_cpu_percent_of_core": round(100 * cores / n, 3),
        "daemons_rss_bytes": rss, "daemons_pss_bytes": pss, "daemon_rss_mib_each": round(rss / n / 2**20, 1),
        "prometheus_cpu_cores": round((prom1 - prom0) / (t1 - t0), 4), "prometheus_rss_bytes": prom_rss,
        "prometheus_head_series": head_series,
    }
    for fleet_size in (1_000, 10_000):
        figures[f"at_{fleet_size}_nodes"] = {
            "series": round(per_node * fleet_size),
            "scrapes_per_second_at_15s": round(fleet_size / 15, 1),
            "samples_per_second_at_15s": round(per_node * fleet_size / 15),
            "scrape_bytes_per_second_at_15s": round(gzip_bytes * fleet_size / 15),
        }
    report(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=list) + "\n")
    return 0 if not figures["missed"] and not figures["unexpected"] else 1


def report(fg: dict) -> None:
    mib = 2**20
    print(f"== {fg['nodes']} nodes, serve every {fg['serve_interval_s']:g} s, scraped every {fg['scrape_interval_s']:g} s "
          f"(started in {fg['startup_s']} s)")
    print("planted problems:")
    for node, what in fg["planted"].items():
        print(f"  {node}: {what}")
    print(f"alerts expected {len(fg['expected_alerts'])}, firing {len(fg['firing'])}, "
          f"missed {len(fg['missed'])}, unexpected (firing or pending) {len(fg['unexpected'])}")
    for a in fg["firing"]:
        print("  firing  " + " ".join(a) + ("" if a in fg["expected_alerts"] else "   <- NOT PLANTED"))
    for a in fg["missed"]:
        print("  MISSED  " + " ".join(a))
    for a in fg["pending"]:
        print("  pending " + " ".join(a) + ("" if a in fg["expected_alerts"] else "   <- NOT PLANTED"))
    q = lambda d, scale=1, unit="": " ".join(f"{k} {v * scale:.3g}{unit}" for k, v in d.items())  # noqa: E731
    print(f"scrape duration per target, worst over the run: {q(fg['scrape_duration_max_s'], 1000, ' ms')}")
    print(f"scrape duration per target, mean over the run:  {q(fg['scrape_duration_avg_s'], 1000, ' ms')}")
    print(f"samples per node: {q(fg['samples_per_node'])}; targets per node: {q(fg['targets_per_node'])}; "
          f"{fg['samples_per_target']} samples per target; /metrics of one node {fg['metrics_bytes_one_node']} bytes, "
          f"{fg['metrics_gzip_bytes_one_node']} gzipped")
    print(f"{fg['nodes']} daemons: {fg['daemons_cpu_cores']:.3f} cores together ({fg['daemon_cpu_percent_of_core']:.3f} % "
          f"of a core each), RSS {fg['daemons_rss_bytes'] / mib:.0f} MiB together ({fg['daemon_rss_mib_each']} MiB each), "
          f"PSS {fg['daemons_pss_bytes'] / mib:.0f} MiB")
    print(f"prometheus: {fg['prometheus_cpu_cores']:.3f} cores, RSS {fg['prometheus_rss_bytes'] / mib:.0f} MiB, "
          f"{fg['prometheus_head_series']:.0f} head series")
    for size in (1_000, 10_000):
        s = fg[f"at_{size}_nodes"]
        print(f"at {size} nodes (same mix, 15 s scrapes): {s['series']} series, {s['scrapes_per_second_at_15s']} scrapes/s, "
              f"{s['samples_per_second_at_15s']} samples/s, {s['scrape_bytes_per_second_at_15s'] / mib:.2f} MiB/s of gzipped /metrics")


if __name__ == "__main__":
    sys.exit(main())
