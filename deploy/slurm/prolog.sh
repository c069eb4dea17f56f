#!/usr/bin/env bash
# Slurm prolog: refuse to start jobs on a node that envdoctor finds broken.
# A non-zero exit makes Slurm drain the node (with a reason of its own) and requeue the
# job; the failing rows, joined and cut at 200 characters, go to stderr, which slurmd
# writes to its log. health.sh is what gives a drain envdoctor's one-line reason.
# slurmd runs it with its own environment, not the job's: it judges the node
# (/dev/shm, CPU quota, GPUs, driver); a job's variables are judged in the job, by
# `envdoctor exec` in its batch script.
# Slurm waits for a prolog without a limit of its own (PrologEpilogTimeout aside), so the
# check is bounded here as in health.sh: 124 (timed out) drains nothing.
# Settings: ENVDOCTOR (path to the binary), ENVDOCTOR_PROLOG_ARGS (extra arguments),
# ENVDOCTOR_PROLOG_TIMEOUT (seconds, 60).
set -u
envdoctor="${ENVDOCTOR:-envdoctor}"
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT
report=$(timeout "${ENVDOCTOR_PROLOG_TIMEOUT:-60}" "$envdoctor" check --format json --fail-on fail \
         ${ENVDOCTOR_PROLOG_ARGS:-} 2>"$errors")
code=$?
case $code in
  0) exit 0 ;;
  1) reason=$(printf '%s' "$report" | python3 -c '
import json, sys
rows = json.load(sys.stdin)["results"]
bad = [r for r in rows if r["status"] in ("fail", "error")]
print("; ".join(r["check"] + ": " + r["summary"] for r in bad)[:200])' 2>/dev/null || echo "envdoctor found problems")
     echo "envdoctor: $reason" >&2
     exit 1 ;;
  124) echo "envdoctor prolog timed out after ${ENVDOCTOR_PROLOG_TIMEOUT:-60} s (ENVDOCTOR_PROLOG_TIMEOUT); the job starts" >&2
     exit 0 ;;
  *) echo "envdoctor prolog could not run (exit $code): $(cat "$errors")" >&2
     exit 0 ;;  # a broken prolog must not drain the whole cluster
esac
