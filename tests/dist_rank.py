"""One rank of a test launch: torchrun runs this script instead of `-m envdoctor`, so a
test can make ONE rank different, the way a broken node or a wrong job script would.

    python -m torch.distributed.run --nproc-per-node=2 tests/dist_rank.py OUTDIR [envdoctor check args...]

Driven by environment variables (set for the whole launch; each names its local rank):
    DIST_TEST_SET="1:NCCL_ALGO=Ring"      export NCCL_ALGO=Ring on LOCAL_RANK 1 only
    DIST_TEST_ABSENT="1"                   LOCAL_RANK 1 exits 0 without starting the check
    DIST_TEST_FAKE_GPUS="2"                NVML is a fake with 2 GPUs (fixed UUIDs, same on every rank)

It then runs `envdoctor check -f json -o OUTDIR/rank<RANK>.json ARGS` in this process
(as `-m envdoctor` would) and writes the exit code to OUTDIR/rank<RANK>.rc.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fake_pynvml


def _for_me(spec: str) -> list[str]:
    local = os.environ.get("LOCAL_RANK", "")
    return [rest for item in spec.split(";") if item for who, _, rest in [item.partition(":")] if who == local]


def main() -> int:
    out = Path(sys.argv[1])
    rank = os.environ["RANK"]
    if os.environ.get("LOCAL_RANK") in os.environ.get("DIST_TEST_ABSENT", "").split(","):
        (out / f"rank{rank}.rc").write_text("absent")
        return 0
    for assignment in _for_me(os.environ.get("DIST_TEST_SET", "")):
        name, _, value = assignment.partition("=")
        os.environ[name] = value
    gpus = int(os.environ.get("DIST_TEST_FAKE_GPUS", "0") or 0)
    if gpus:
        import envdoctor.nvml as facade
        from fake_pynvml import FakeDevice, FakeNvml

        fake = FakeNvml(devices=[FakeDevice(uuid=f"GPU-fa4e0000-0000-0000-0000-00000000000{i}") for i in range(gpus)])
        real_connect = facade.connect
        facade.connect = lambda lib=None, timeout=facade.DEFAULT_TIMEOUT: real_connect(lib=fake, timeout=timeout)
    from envdoctor.cli import main as envdoctor_main

    sys.argv = ["envdoctor", "check", "-f", "json", "-o", str(out / f"rank{rank}.json"), *sys.argv[2:]]
    code = 0
    try:
        envdoctor_main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    (out / f"rank{rank}.rc").write_text(str(code))
    return code


if __name__ == "__main__":
    sys.exit(main())
