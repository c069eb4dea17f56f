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
# `envdoctor exec` is tested under).
missing=""
need() { command -v "$1" >/dev/null 2>&1 || case " $missing " in *" $2 "*) ;; *) missing="$missing $2" ;; esac; }
need promtool prometheus
need prometheus prometheus
need systemd-analyze systemd
need prometheus-node-exporter prometheus-node-exporter
need curl curl
need openssl openssl
need tini tini
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
if .venv/bin/python -m pip list 2>/dev/null | grep -qi '^nvidia-cu'; then
    echo "!! a CUDA build of torch was pulled in; the install step is wrong" >&2
    exit 1
fi

echo "== running the test suite"
exec .venv/bin/python -m pytest -n auto "$@"
