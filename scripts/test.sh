#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then run all of it.
#
#   bash scripts/test.sh            # the whole suite, in parallel
#   bash scripts/test.sh -k shm     # extra arguments go to pytest
#
# What it installs: a virtual environment in .venv with envdoctor (editable) and
# its test, torch and onnx extras. torch is pinned to 2.13.0 and installed first,
# so nothing later can resolve another torch (which would pull gigabytes of CUDA
# wheels). prometheus and promtool come from Debian's `prometheus` package and
# systemd-analyze from `systemd` when missing (deploy/ is tested against them), tini
# (the init `envdoctor exec` is tested under) from `tini`, and serve's and deploy's
# tests get prometheus-node-exporter, curl and openssl the same way.
# The real-environment tests (unshare + tmpfs /dev/shm, cgroup v1 CPU quotas,
# running as another user) need root, as CI has.
set -euo pipefail
cd "$(dirname "$0")/.."

# The real programs the tests run against, from Debian, in one apt-get when any is missing:
# prometheus + promtool (metrics lint, rules, the fleet's Prometheus), systemd-analyze (the
# unit), node_exporter (web config and textfile collector side by side), curl and openssl
# (TLS, mTLS, basic auth with real certificates; deploy/README's commands), tini (the init
# `envdoctor exec` is tested under), gcc (builds the stand-in CUDA torch whose import
# cuda.runtime is compared with: tests/test_torch_import_layouts.py).
missing=""
need() { command -v "$1" >/dev/null 2>&1 || case " $missing " in *" $2 "*) ;; *) missing="$missing $2" ;; esac; }
need promtool prometheus
need prometheus prometheus
need systemd-analyze systemd
need prometheus-node-exporter prometheus-node-exporter
need curl curl
need openssl openssl
need tini tini
need gcc gcc
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "== installing$missing (Debian packages)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
    else
        echo "!! missing$missing and this is not root: the tests that need them will skip" >&2
    fi
fi

echo "== installing envdoctor and the test dependencies into .venv"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[test,torch,onnx]" "torch==2.13.0"  # named again: the extra is only a floor
# Which torch came: the pin, and its build. The local wheel (/opt/wheels here) is the CPU
# build, for one Python; on a Python it has no wheel for, PyPI's Linux torch is the CUDA
# build with its nvidia-* libraries (about 5 GB), which the suite runs with too. CUDA
# libraries beside a CPU build mean a later step resolved something that wants them.
# (The list is read whole: `pip list | grep -q` under pipefail fails when grep stops early.)
torch_version="$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))')"
cuda_libraries="$(.venv/bin/python -m pip list --format=freeze 2>/dev/null | grep -i '^nvidia-' | grep -vic '^nvidia-ml-py' || true)"
case "$torch_version" in
    2.13.0+cpu) [ "$cuda_libraries" = 0 ] || { echo "!! $cuda_libraries CUDA libraries (nvidia-*) were pulled in beside torch's CPU build; an install step is wrong" >&2; exit 1; } ;;
    2.13.0|2.13.0+*) echo "== torch $torch_version, not the CPU build: no CPU wheel of torch 2.13.0 for this Python was found; the tests run with it, on the CPU" ;;
    *) echo "!! torch $torch_version was installed, not the pinned 2.13.0; an install step is wrong" >&2; exit 1 ;;
esac

echo "== running the test suite"
exec .venv/bin/python -m pytest -n auto "$@"
