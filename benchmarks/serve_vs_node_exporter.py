"""envdoctor serve side by side with Debian's node_exporter, in one run, as ratios.

    .venv/bin/python benchmarks/serve_vs_node_exporter.py [--targets 64] [--idle-seconds 60]

Both listen on free loopback ports; node_exporter runs its default collectors (what a
node already runs), serve runs every serve-mode check over the node and `--targets`
processes (sleep processes it selects by an environment variable through a config
file: 64 torch processes would need ~20 GiB here, and discovery's torch scan is the
same read of /proc/N/maps either way). Measured, per server:

- scrapes send Accept-Encoding: gzip as Prometheus does (`--plain` to leave it out);
- CPU per scrape: the server's own CPU time (utime+stime from /proc/PID/stat) over
  `--scrapes` sequential scrapes, divided by their number;
- scrape latency with 8 concurrent clients, `--requests` each: p50, p99, max;
- RSS (VmRSS) right after the scrapes, when serve has made only a run or two, and again
  after the idle window: the second is the steady figure. Each process's memory history
  fills in 720 runs, so `--interval 1 --idle-seconds 780` gives serve's RSS with full
  histories (three hours at 15 s), which the issue's steady-RSS line is about;
- idle CPU and thread wakeups (voluntary context switches of every thread, per
  second): over `--idle-seconds` with no scrapes, serve at
  `--interval` (15 s by default) over the targets.
With `--soak-seconds S`, serve alone afterwards: 8 scrapers (each `--soak-scrape-every`
seconds apart; back to back by default) while processes come and go; RSS and threads
over time, and RSS's Theil-Sen slope in MiB an hour over the last half and over the
part after every process's memory history is full (720 runs).
Figures vary with the machine's load; the ratios are the point.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
HISTORY_POINTS = 720  # samples serve keeps of each process's memory: full after this many runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def wakeups(pid: int) -> int:
    """Times the process's threads went to sleep (voluntary context switches, every thread):
    on a VM each wake of a thread that slept a while costs up to ~2 ms of CPU."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
        except OSError:  # a thread that ended meanwhile
            pass
    return total


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


GZIP = True  # Prometheus scrapes with Accept-Encoding: gzip; --plain measures without


def fetch(url: str) -> int:
    headers = {"Accept-Encoding": "gzip"} if GZIP else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return len(r.read())


def wait_ready(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            fetch(url)
            return
        except Exception:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within {timeout} s")


def per_scrape_cpu(pid: int, url: str, n: int) -> tuple[float, int]:
    size = fetch(url)
    before = cpu_seconds(pid)
    for _ in range(n):
        fetch(url)
    return (cpu_seconds(pid) - before) / n, size


def concurrent_latency(url: str, clients: int, requests: int) -> tuple[float, float, float, int]:
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()

    def client() -> None:
        mine = []
        for _ in range(requests):
            t0 = time.perf_counter()
            try:
                fetch(url)
            except Exception:
                with lock:
                    failures[0] += 1
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies.sort()
    p99 = latencies[max(0, int(len(latencies) * 0.99) - 1)]
    return statistics.median(latencies), p99, latencies[-1], failures[0]


def runs_total(url: str) -> float:
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        if line.startswith("envdoctor_runs_total "):
            return float(line.split()[1])
    return 0.0


def soak(pid: int, url: str, seconds: float, tag: str, scrape_every: float, filled_after: float) -> None:
    """serve alone: 8 scrapers and processes coming and going; RSS and threads over time.

    RSS is read every 5 s. At the end, its Theil-Sen slope (envdoctor.trend) in MiB an
    hour is printed over the last half of the soak and over the part after
    `filled_after` seconds, when every process's memory history is full (720 runs):
    the drift of a daemon whose bounded state has stopped growing."""
    from envdoctor import trend

    stop = threading.Event()
    failures = [0]
    total = [0]

    def scraper() -> None:
        while not stop.is_set():
            try:
                fetch(url)
            except Exception:
                failures[0] += 1
            total[0] += 1
            if scrape_every > 0:
                stop.wait(scrape_every)

    workers = [threading.Thread(target=scraper, daemon=True) for _ in range(8)]
    for w in workers:
        w.start()
    children: list[subprocess.Popen] = []
    t0 = time.monotonic()
    next_print = next_read = t0
    readings: list[tuple[float, float]] = []
    print(f"soak {seconds:g} s: t(s)  RSS(MiB)  threads")
    while time.monotonic() - t0 < seconds:
        children.append(subprocess.Popen(["sleep", "3"], env={**os.environ, tag: "1"}))
        children = [c for c in children if c.poll() is None]
        now = time.monotonic()
        if now >= next_read:
            readings.append((now - t0, rss_mib(pid)))
            next_read += 5.0
        if now >= next_print:
            threads = Path(f"/proc/{pid}/status").read_text().split("Threads:")[1].split()[0]
            print(f"  {now - t0:6.0f}  {rss_mib(pid):8.1f}  {threads:>7}", flush=True)
            next_print += max(10.0, seconds / 12)
        time.sleep(0.5)
    stop.set()
    for w in workers:
        w.join()
    for c in children:
        c.wait()
    print(f"soak: {total[0]} scrapes, {failures[0]} failed")
    for label, start in (("last half", seconds / 2), (f"after {filled_after:g} s (histories full)", filled_after)):
        part = [(t, r) for t, r in readings if t >= start]
        if len(part) >= 8:
            slope, _ = trend.theil_sen([t for t, _ in part], [r for _, r in part])
            print(f"RSS slope over the {label}: {slope * 3600:+.2f} MiB/h ({len(part)} readings, "
                  f"{min(r for _, r in part):.1f}-{max(r for _, r in part):.1f} MiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=64)
    parser.add_argument("--interval", type=float, default=15.0)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--requests", type=int, default=100, help="per client, 8 clients")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--plain", action="store_true", help="scrape without Accept-Encoding: gzip")
    parser.add_argument("--soak-seconds", type=float, default=0.0,
                        help="afterwards, soak serve alone this long (8 scrapers, processes coming and going) and print RSS")
    parser.add_argument("--soak-scrape-every", type=float, default=0.0,
                        help="each soak scraper waits this long between scrapes (default 0: back to back)")
    args = parser.parse_args()
    global GZIP
    GZIP = not args.plain
    node_exporter = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if node_exporter is None:
        raise SystemExit("needs Debian's prometheus-node-exporter (apt-get install prometheus-node-exporter)")

    tmp = Path(tempfile.mkdtemp(prefix=f"envdoctor-bench-{os.getpid()}-"))
    tag = f"ENVDOCTOR_BENCH_{os.getpid()}"
    (tmp / "envdoctor.toml").write_text(f"[serve]\nmax_targets = {args.targets + 8}\nselect_env = [\"{tag}\"]\n")
    sleepers = [subprocess.Popen(["sleep", "3600"], env={**os.environ, tag: "1"}) for _ in range(args.targets)]
    ne_port, sv_port = free_port(), free_port()
    ne = subprocess.Popen([node_exporter, f"--web.listen-address=127.0.0.1:{ne_port}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sv = subprocess.Popen([sys.executable, "-m", "envdoctor", "serve", "--web.listen-address", f"127.0.0.1:{sv_port}",
                           "--interval", str(args.interval), "--config", str(tmp / "envdoctor.toml")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = time.monotonic()
    servers = {"node_exporter": (ne.pid, f"http://127.0.0.1:{ne_port}/metrics"),
               "envdoctor serve": (sv.pid, f"http://127.0.0.1:{sv_port}/metrics")}
    try:
        for _, url in servers.values():
            wait_ready(url)
        time.sleep(2)
        rows: dict[str, dict[str, float]] = {}
        for name, (pid, url) in servers.items():
            cpu, size = per_scrape_cpu(pid, url, args.scrapes)
            p50, p99, worst, failed = concurrent_latency(url, 8, args.requests)
            rows[name] = {"cpu_ms": cpu * 1000, "bytes": size, "p50_ms": p50 * 1000, "p99_ms": p99 * 1000,
                          "max_ms": worst * 1000, "failed": failed, "rss": rss_mib(pid)}
        samples = sum(1 for line in urllib.request.urlopen(servers["envdoctor serve"][1]).read().decode().splitlines()
                      if line and not line.startswith("#"))
        runs_before = runs_total(servers["envdoctor serve"][1])
        before = {name: cpu_seconds(pid) for name, (pid, _) in servers.items()}
        slept = {name: wakeups(pid) for name, (pid, _) in servers.items()}
        time.sleep(args.idle_seconds)
        for name, (pid, _) in servers.items():
            rows[name]["idle_pct"] = (cpu_seconds(pid) - before[name]) / args.idle_seconds * 100
            rows[name]["wakeups"] = (wakeups(pid) - slept[name]) / args.idle_seconds
            rows[name]["rss_idle"] = rss_mib(pid)
        runs_in_all = runs_total(servers["envdoctor serve"][1])
        runs = runs_in_all - runs_before
        spent = rows["envdoctor serve"]["idle_pct"] * args.idle_seconds / 100
        per_run = spent / runs if runs else float("nan")
        if args.soak_seconds > 0:
            filled_after = max(0.0, HISTORY_POINTS * args.interval - (time.monotonic() - started))
            soak(sv.pid, servers["envdoctor serve"][1], args.soak_seconds, tag, args.soak_scrape_every, filled_after)
    finally:
        for p in (ne, sv, *sleepers):
            p.terminate()
        for p in (ne, sv, *sleepers):
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    ne_row, sv_row = rows["node_exporter"], rows["envdoctor serve"]
    print(f"serve: {args.targets} target processes + node, interval {args.interval:g} s, {samples} samples; "
          f"{args.scrapes} sequential scrapes; 8 clients x {args.requests}; idle {args.idle_seconds:g} s")
    print(f"{'':28}{'node_exporter':>16}{'envdoctor serve':>18}{'ratio':>10}")

    def line(label: str, key: str, fmt: str = "{:.2f}") -> None:
        a, b = ne_row[key], sv_row[key]
        ratio = f"{b / a:.3f}" if a else "n/a"
        print(f"{label:28}{fmt.format(a):>16}{fmt.format(b):>18}{ratio:>10}")

    line("response bytes" + (" (gzip)" if GZIP else ""), "bytes", "{:.0f}")
    line("CPU per scrape (ms)", "cpu_ms")
    line("p50 latency, 8 clients (ms)", "p50_ms")
    line("p99 latency, 8 clients (ms)", "p99_ms")
    line("max latency, 8 clients (ms)", "max_ms")
    line("failed requests", "failed", "{:.0f}")
    line("RSS after the scrapes (MiB)", "rss", "{:.1f}")
    line("RSS after the idle (MiB)", "rss_idle", "{:.1f}")
    line("idle CPU (% of one core)", "idle_pct", "{:.3f}")
    line("idle thread wakeups per s", "wakeups", "{:.2f}")
    print(f"serve: {runs:.0f} runs in the idle window ({runs_in_all:.0f} in all: histories are full after {HISTORY_POINTS}), {per_run * 1000:.0f} ms CPU per run over {args.targets + 1} targets; "
          f"at a {args.interval:g} s interval that is {per_run / args.interval * 100:.2f}% of one core")


if __name__ == "__main__":
    main()
