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
# systemd-analyze from `systemd` when missing (deploy/ is tested against them), and
# serve's and deploy's tests get prometheus-node-exporter, curl and openssl the same way.
# The real-environment tests (unshare + tmpfs /dev/shm, cgroup v1 CPU quotas,
# running as another user) need root, as CI has.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        echo "== installing prometheus and promtool (Debian package prometheus)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    else
        echo "!! prometheus/promtool are missing and this is not root: the promtool and Prometheus tests will skip" >&2
    fi
fi
# deploy/systemd is checked with systemd-analyze (verify, security --offline).
if ! command -v systemd-analyze >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        echo "== installing systemd-analyze (Debian package systemd)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
    else
        echo "!! systemd-analyze is missing and this is not root: the systemd unit tests will skip" >&2
    fi
fi

# serve's real tests: node_exporter (web config and textfile collector side by side),
# curl and openssl (TLS, mTLS and basic auth with real certificates); deploy's tests:
# node_exporter reads the Slurm epilog's textfile, deploy/README's commands use curl.
missing=""
command -v prometheus-node-exporter >/dev/null 2>&1 || missing="$missing prometheus-node-exporter"
command -v curl >/dev/null 2>&1 || missing="$missing curl"
command -v openssl >/dev/null 2>&1 || missing="$missing openssl"
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "== installing$missing (Debian packages)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
    else
        echo "!! missing$missing and this is not root: the serve tests that need them will skip" >&2
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
