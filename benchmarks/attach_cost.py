"""What envdoctor.attach() costs the job it watches: time and CPU per publication.

Run: python benchmarks/attach_cost.py [--publications 300] [--interval 5]

In a fresh interpreter each, two cases: a script without torch, and a torch script
with a DataLoader (2 loaders, batches seen) and a few settings changed, as a training
script looks when attach() publishes. Each publication is timed as the publisher
thread runs it (build the document, including the short-lived thread that reads
torch's live thread count, write a temporary file, rename it), wall time and CPU time
of the whole process (all threads). The share of a core is the CPU per publication
over the interval (default 5 s). Budget: <= 1 ms per publication, <= 0.1% of a core.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

CASE = """
import json, sys, time, statistics
import envdoctor
p = envdoctor.attach(interval=3600)       # the thread idles; publications are timed here
if {with_torch}:
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    torch.set_num_threads(2)
    torch.backends.cudnn.benchmark = True
    for _ in range(2):
        loader = DataLoader(TensorDataset(torch.zeros(256, 1024)), batch_size=32, num_workers=0, pin_memory=False)
        for batch in loader:
            pass
walls, cpus = [], []
for _ in range({n}):
    w0, c0 = time.perf_counter(), time.process_time()
    p.publish()
    walls.append(time.perf_counter() - w0)
    cpus.append(time.process_time() - c0)
walls.sort()
size = len(open(p.path, "rb").read())
print(json.dumps({{"median_ms": statistics.median(walls) * 1e3, "p99_ms": walls[int(len(walls) * 0.99) - 1] * 1e3,
                  "max_ms": walls[-1] * 1e3, "cpu_ms": sum(cpus) / len(cpus) * 1e3, "bytes": size,
                  "doc_cost": p.cost()}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publications", type=int, default=300)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=REPO)
    for label, with_torch in (("no torch", False), ("torch + 2 DataLoaders", True)):
        code = textwrap.dedent(CASE.format(with_torch=with_torch, n=args.publications))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
        if out.returncode:
            print(f"{label}: failed: {out.stderr.strip()[-300:]}")
            continue
        r = json.loads(out.stdout)
        share = r["cpu_ms"] / 1e3 / args.interval * 100
        print(f"{label:<22} per publication: median {r['median_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms, "
              f"max {r['max_ms']:.3f} ms wall; CPU {r['cpu_ms']:.3f} ms -> {share:.4f}% of a core at "
              f"{args.interval:g} s; document {r['bytes']} bytes")


if __name__ == "__main__":
    main()
