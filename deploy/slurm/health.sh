#!/usr/bin/env bash
# Slurm HealthCheckProgram (or a cron job): drain this node when envdoctor finds a
# `fail`, with a one-line reason in NHC's form, and put it back when the problem
# is gone. Like LBNL NHC it only ever resumes a node that it drained itself (the
# reason starts with "envdoctor:"), and it never overwrites a reason an admin set.
#
#   slurm.conf:  HealthCheckProgram=/etc/slurm/envdoctor-health.sh
#                HealthCheckInterval=300
#
# Settings (environment): ENVDOCTOR (the binary), SCONTROL (default scontrol),
# ENVDOCTOR_HEALTH_ARGS (extra arguments to `envdoctor check`, e.g. --skip onnx.opset),
# ENVDOCTOR_HEALTH_TIMEOUT (seconds for the whole check, default 120),
# ENVDOCTOR_NODENAME (default: the short host name, as slurmd names the node).
#
# Exit: 0 healthy (or envdoctor could not run: a broken monitor must not drain the
# cluster), 1 drained (the reason is printed on stdout, one line).
set -u
envdoctor="${ENVDOCTOR:-envdoctor}"
scontrol="${SCONTROL:-scontrol}"
node="${ENVDOCTOR_NODENAME:-$(hostname -s)}"
errors=$(mktemp)
trap 'rm -f "$errors"' EXIT

# shellcheck disable=SC2086  # ENVDOCTOR_HEALTH_ARGS is a list of words on purpose
report=$(timeout "${ENVDOCTOR_HEALTH_TIMEOUT:-120}" "$envdoctor" check --format json --fail-on fail \
         ${ENVDOCTOR_HEALTH_ARGS:-} 2>"$errors")
code=$?

# The node's current drain reason ("" when none), from `scontrol show node -o`: the text
# after Reason=, up to the " [user@time]" Slurm appends (newer releases print more fields,
# Comment= and the like, after it).
current_reason=$("$scontrol" show node "$node" -o 2>/dev/null | sed -n 's/.*[[:space:]]Reason=\(.*\)$/\1/p' \
                 | sed 's/ \[[^]@]*@[^]]*\].*$//')
case "$current_reason" in
  ""|"(null)"|"none") ours=none ;;
  envdoctor:*) ours=yes ;;
  *) ours=no ;;
esac

case $code in
  0)
    if [ "$ours" = yes ]; then
      "$scontrol" update NodeName="$node" State=RESUME
      echo "envdoctor: healthy again, resumed $node (was: $current_reason)"
    fi
    exit 0 ;;
  1)
    # NHC's form: subject, observed, expected, in one line; the first failing check
    # names the reason, "(+N more)" counts the rest. Capped to fit scontrol's listing.
    reason=$(printf '%s' "$report" | python3 -c '
import json, sys
rows = json.load(sys.stdin)["results"]
bad = [r for r in rows if r["status"] in ("fail", "error")]
first = bad[0]
text = " ".join(("envdoctor: %s: %s" % (first["check"], first["summary"])).replace("\"", "'"'"'").split())
more = " (+%d more)" % (len(bad) - 1) if len(bad) > 1 else ""
room = 200 - len(more)
print((text if len(text) <= room else text[:room - 1] + "\u2026") + more)' 2>/dev/null) || reason="envdoctor: a check failed (report unreadable)"
    echo "$reason"
    if [ "$ours" = no ]; then
      echo "envdoctor: $node is already drained by someone else ($current_reason); left as it is" >&2
    else
      "$scontrol" update NodeName="$node" State=DRAIN Reason="$reason"
    fi
    exit 1 ;;
  124)
    echo "envdoctor health check timed out after ${ENVDOCTOR_HEALTH_TIMEOUT:-120} s (ENVDOCTOR_HEALTH_TIMEOUT); nothing drained" >&2
    exit 0 ;;
  *)
    echo "envdoctor health check could not run (exit $code): $(head -c 300 "$errors" | tr '\n' ' ')" >&2
    exit 0 ;;
esac
