"""serve samples every process it examines each run, and memory.cache_growth judges the
history it keeps: a real leaking process is seen growing, with a time to exhaustion;
a steady one, a sawtooth and a step then plateau (the ground truth of
test_memory_real, there judged by `check --window`) are not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from serve_support import Serve, get, wait_until
from test_memory_real import SAWTOOTH, STEP

LEAKER = r"""
import sys, time
keep = []
while True:
    keep.append(bytearray(16 << 20))   # 16 MiB touched every 0.5 s: 32 MiB/s, like a graph kept per step
    for chunk in keep[-1:]:
        chunk[::4096] = b"x" * len(chunk[::4096])
    time.sleep(0.5)
    if len(keep) > 120:                # bounded: at most ~2 GiB, then it holds still
        time.sleep(3600)
"""

STEADY = "import time\nblock = bytearray(64 << 20)\nblock[::4096] = b'x' * len(block[::4096])\ntime.sleep(3600)\n"


def _series(text: str, name: str, target: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        m = re.match(rf'{name}\{{memory="([^"]+)",target="{target}"\}} (\S+)', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def test_serve_sees_a_leaking_process_grow_and_a_steady_one_hold(tmp_path):
    tag = f"ENVDOCTOR_MEMTEST_{os.getpid()}"
    env = {**os.environ, tag: "1"}
    cfg = tmp_path / "envdoctor.toml"
    cfg.write_text(f'[serve]\nselect_env = ["{tag}"]\n')
    procs: list[subprocess.Popen] = []  # every process this test starts, killed however it ends
    serve = None
    try:
        leaker = subprocess.Popen([sys.executable, "-c", LEAKER], env=env)
        procs.append(leaker)
        steady = subprocess.Popen([sys.executable, "-c", STEADY], env=env)
        procs.append(steady)
        calm = {name: subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL)
                for name, code in (("sawtooth", SAWTOOTH), ("step", STEP))}
        procs.extend(calm.values())
        started = time.monotonic()
        serve = Serve("--interval", "1", "--config", str(cfg), env={"ENVDOCTOR_DISABLE_PLUGIN_AUTOLOAD": "1"})
        leak, hold = f"pid:{leaker.pid}", f"pid:{steady.pid}"

        def judged():
            text = get(serve.url + "/metrics")[1].decode()
            growth = _series(text, "envdoctor_memory_growth_bytes_per_second", leak)
            return text if growth.get("rss", 0) > 0 else None

        wait_until(judged, timeout=90)
        time.sleep(max(0.0, 16 - (time.monotonic() - started)))  # every process has >= 10 s of samples
        text = judged()
        assert text, "the leak is no longer seen"
        growth = _series(text, "envdoctor_memory_growth_bytes_per_second", leak)
        eta = _series(text, "envdoctor_memory_exhaustion_eta_seconds", leak)
        # 32 MiB/s by construction; a loaded runner stretches the sleeps, so a wide band
        assert 4 << 20 < growth["rss"] < 64 << 20, growth
        assert eta.get("rss", 0) > 0, eta
        print(f"serve: leaker rss growth {growth['rss'] / 2**20:.1f} MiB/s, ETA {eta['rss']:.0f} s")
        assert re.search(rf'envdoctor_check_status\{{check="memory.cache_growth",status="(fail|warn)",target="{leak}"\}} 1', text)
        steady_growth = _series(text, "envdoctor_memory_growth_bytes_per_second", hold)
        assert steady_growth.get("rss", 0) == 0, steady_growth
        for name, proc in [("steady", steady), *calm.items()]:
            status = re.search(rf'envdoctor_check_status\{{check="memory.cache_growth",status="(\w+)",target="pid:{proc.pid}"\}} 1',
                               text)
            assert status and status.group(1) == "ok", (name, status and status.group(1))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        if serve is not None:
            assert serve.stop() == 0
    # the leaker's samples go with it: the history is pruned to the live targets
