"""CPU one `envdoctor serve` run costs over N target processes, measured in-process.

    .venv/bin/python benchmarks/serve_run_cpu.py [--targets 64] [--runs 20] [--rounds 3] [--history-points 720] [--torch]
        [--pause 15] [--reference] [--spread] [--profile FILE]

Starts N `sleep` processes (not our children: serve never examines its own) tagged
with an environment variable that a `[serve] select_env` config selects, builds the
daemon as `envdoctor serve --once` does, warms it with two runs, then times
`--runs` scheduler runs with getrusage (user + system CPU of this process, every
thread) and prints the median per run over `--rounds`, and what it means at a 15 s
interval in percent of one core (the issue's target: 0.5 %). Each run is followed
by the garbage collection the daemon's loop does after every run.

`--torch` starts python processes that have imported torch instead (this
interpreter's; ~250 MiB each with the CPU build, so fewer of them): a training
node's targets, whose maps (hundreds of lines), environments and torch installation
serve reads every run. Sleepers are the lower bound; these are what a node costs.

A daemon that has run for hours judges each process's memory history (720 points
at the default 15 s interval is 3 hours): `--history-points N` fills every
target's history with N samples first (copies of its real first sample, 15 s
apart, with 1 % noise), so the figure is that steady state's, not a fresh start's
(measured: 0.65 s a run at 720 points when trends were fitted on 160 of them,
against 0.33 s at 2). VmRSS after the runs is printed too (in-process: no HTTP
server, no typer; `serve_vs_node_exporter.py` measures the real daemon's).

`--pause 15` sleeps the daemon's interval after each run (not counted): runs back to
back find the CPU's caches warm and cost about a quarter less than the daemon's, so
with it a steady state with full histories is measured at the daemon's pace.

serve_vs_node_exporter.py measures the same from outside (the daemon's
/proc/PID/stat over an idle window); this one is quicker and runs the profile-able
code path, for comparing two versions of the code on one machine.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import math
import os
import pstats
import random
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def switches_now() -> int:
    """Voluntary context switches of this process so far, every thread: each is a thread
    that went to sleep waiting for another, the cost of handing work between threads."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


def faults_now() -> int:
    """Minor page faults of this process so far: each is a page the kernel had to hand
    over (again), e.g. one malloc gave back after the last run and this run wants anew."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def fill_history(history, points: int, interval: float) -> None:
    """Every target's history as if the daemon had sampled it `points` times already."""
    rng = random.Random(0)
    now = time.monotonic()
    for label in history.labels():
        first = history.latest(label)
        sampler = history._tracks[label].sampler  # the daemon's own, kept as the daemon keeps it
        history.forget(label)
        for i in range(points):
            values = {name: value * (1 + rng.gauss(0, 0.01)) for name, value in first.values.items()}
            t = now - (points - i) * interval
            # a NamedTuple since 2026-11-23, a frozen dataclass before: versions compare
            sample = first._replace(t=t, values=values) if hasattr(first, "_replace") else dataclasses.replace(first, t=t, values=values)
            history.add(label, sample, sampler)


def _cpu_ticks(pid: str) -> int | None:
    """utime + stime of a process, in clock ticks (/proc/PID/stat fields 14 and 15)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def wait_for_torch(marker: str, count: int, timeout: float = 300.0) -> None:
    """Until every torch sleeper has torch mapped (importing it takes seconds each) and
    has gone quiet: libtorch is mapped early in `import torch`, and runs measured while
    the imports still burn both CPUs cost several times what a settled node's do."""
    deadline = time.monotonic() + timeout
    before: dict[str, int | None] = {}
    while time.monotonic() < deadline:
        out = subprocess.run(["pgrep", "-f", f"time.sleep\\({marker}\\)$"], capture_output=True, text=True).stdout.split()
        ready = 0
        for pid in out:
            try:
                ready += "libtorch" in Path(f"/proc/{pid}/maps").read_text()
            except OSError:
                pass
        now = {pid: _cpu_ticks(pid) for pid in out}
        if ready >= count and now == before:
            return
        before = now
        time.sleep(1.0)
    raise SystemExit(f"torch did not load in {count} processes within {timeout:g} s")


def start_profiles() -> list[cProfile.Profile]:
    """cProfile over every thread the daemon has: a run's checks run in the watchdog's
    worker threads, which a profile of this thread alone shows as time spent waiting on a
    lock. From Python 3.12 one profile sees every thread (sys.monitoring is process-wide);
    before, each new thread gets its own, merged at the end."""
    profiles = [cProfile.Profile()]
    if sys.version_info < (3, 12):

        def profile_this_thread(*_: object) -> None:
            profile = cProfile.Profile()
            profiles.append(profile)
            profile.enable()  # replaces this hook in the new thread

        threading.setprofile(profile_this_thread)
    profiles[0].enable()
    return profiles


def stop_profiles(profiles: list[cProfile.Profile], path: str) -> None:
    """Every thread's profile merged into one file, and its top 25 by time of their own."""
    if sys.version_info < (3, 12):
        threading.setprofile(None)
    profiles[0].disable()
    stats = pstats.Stats(profiles[0])
    for profile in profiles[1:]:
        profile.create_stats()
        if profile.stats:  # a thread that did nothing while profiled has none, which pstats refuses
            stats.add(profile)
    stats.dump_stats(path)
    stats.sort_stats("tottime").print_stats(25)


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds, 0 or more."""
    value = float(text)
    if not math.isfinite(value) or value < 0 or value > 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a pause of 0 to 3600 seconds")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=64)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval", type=float, default=15.0)
    parser.add_argument("--history-points", type=int, default=0,
                        help="fill every target's memory history with this many samples first (720 = 3 h at 15 s)")
    parser.add_argument("--pause", type=seconds, default=0.0,
                        help="sleep this long after each run, as the daemon does between runs (15 = its default "
                             "interval): runs back to back find the CPU's caches warm; the daemon's do not")
    parser.add_argument("--torch", action="store_true",
                        help="targets are python processes that imported torch (this interpreter's; ~250 MiB each "
                             "with a CPU build), as on a training node, instead of sleep processes")
    parser.add_argument("--spread", action="store_true",
                        help="let a run's threads go to any CPU, as before 2026-11-26 (serve.onecpu keeps them on "
                             "one while a run lasts); compares the two on one machine")
    parser.add_argument("--reference", action="store_true",
                        help="also time a fixed workload that is not envdoctor's, back to back and after --pause "
                             "seconds idle (cold_start_reference.py): what this machine charges any work for "
                             "starting cold, beside the figure it inflates")
    parser.add_argument("--profile", metavar="FILE",
                        help="profile the timed runs with cProfile, every thread: write the stats to FILE (pstats) and "
                             "print the 25 functions that took the most time of their own; the CPU figures are "
                             "then cProfile's")
    args = parser.parse_args()

    tag = f"ENVDOCTOR_RUNCPU_{os.getpid()}"
    tmp = Path(tempfile.mkdtemp(prefix="envdoctor-runcpu-"))
    config = tmp / "envdoctor.toml"
    config.write_text(f'[serve]\nmax_targets = {args.targets + 8}\nselect_env = ["{tag}"]\n')
    marker = f"{3600 + os.getpid() % 1000}"  # a sleep length that names our sleepers for the cleanup
    # started by a shell that exits at once: the sleepers are reparented, not our children
    sleeper = (f"{shlex.quote(sys.executable)} -c 'import torch, time; time.sleep({marker})'" if args.torch
               else f"sleep {marker}")
    subprocess.run(["sh", "-c", f"for i in $(seq {args.targets}); do {sleeper} & done"],
                   env={**os.environ, tag: "1"}, check=True)
    try:
        if args.torch:
            wait_for_torch(marker, args.targets)
        # before the daemon exists: the threads it starts in its first runs are profiled too
        profiles = start_profiles() if args.profile else None
        from envdoctor.serve import Daemon, Options

        scheduler = Daemon(Options(once=True, config_file=str(config))).scheduler
        if args.spread:
            scheduler.one_cpu_runs = False  # an attribute older versions lack, and ignore
        tidy = getattr(scheduler, "collect_garbage", lambda: None)  # absent before 2026-11-23: versions compare
        for _ in range(2):
            examined = len(scheduler.run_once().targets) - 1  # less the node
            tidy()
        if args.history_points > 0:
            fill_history(scheduler.history, args.history_points, args.interval)
        per_run = []
        switched = faulted = 0
        for profile in profiles or ():
            profile.clear()  # the import, warm-up runs and history filling were profiled too: forgotten
        for _ in range(args.rounds):
            cpu = wall = 0.0
            for _ in range(args.runs):
                c0, t0, s0, f0 = cpu_now(), time.perf_counter(), switches_now(), faults_now()
                scheduler.run_once()
                tidy()
                cpu, wall = cpu + cpu_now() - c0, wall + time.perf_counter() - t0
                switched += switches_now() - s0
                faulted += faults_now() - f0
                if args.pause > 0:
                    time.sleep(args.pause)  # not counted: the daemon's sleep costs no CPU
            per_run.append((cpu / args.runs, wall / args.runs))
        if profiles:
            stop_profiles(profiles, args.profile)
        cpu = statistics.median(c for c, _ in per_run)
        wall = statistics.median(w for _, w in per_run)
        # torch processes already on the node are targets too (discovery finds them by their maps)
        others = f" and {examined - args.targets} other processes on this node" if examined != args.targets else ""
        print(f"{args.targets} targets{others} + node: CPU {cpu * 1000:.1f} ms per run (rounds: "
              f"{', '.join(f'{c * 1000:.1f}' for c, _ in per_run)}), wall {wall * 1000:.1f} ms; "
              f"at a {args.interval:g} s interval {cpu / args.interval * 100:.2f} % of one core; "
              f"history {args.history_points or 'as sampled'}; pause {args.pause:g} s; "
              f"{'spread' if args.spread else 'one CPU a run'} of {len(os.sched_getaffinity(0))}; VmRSS {rss_mib():.1f} MiB; "
              f"{switched / (args.rounds * args.runs):.0f} voluntary context switches and "
              f"{faulted / (args.rounds * args.runs):.0f} minor page faults a run")
        if args.reference:
            sys.path.insert(0, str(Path(__file__).parent))
            import cold_start_reference as reference

            print(f"reference work on this machine: {reference.describe(args.pause, reference.penalties(args.pause))}")
    finally:
        subprocess.run(["pkill", "-f", f"time.sleep\\({marker}\\)$" if args.torch else f"^sleep {marker}$"])
        shutil.rmtree(tmp, ignore_errors=True)  # its config file


if __name__ == "__main__":
    main()
