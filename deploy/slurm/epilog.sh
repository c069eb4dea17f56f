#!/usr/bin/env bash
# Slurm Epilog: after every job, one envdoctor run written for node_exporter's
# textfile collector, so nodes without `envdoctor serve` still report to Prometheus
# (the metrics are the same as serve's /metrics).
#
#   slurm.conf:  Epilog=/etc/slurm/epilog.d/envdoctor.sh
#   node_exporter --collector.textfile.directory=/var/lib/prometheus/node-exporter
#
# Settings (environment): ENVDOCTOR (the binary), ENVDOCTOR_TEXTFILE (default
# /var/lib/prometheus/node-exporter/envdoctor.prom, Debian's textfile directory),
# ENVDOCTOR_EPILOG_TIMEOUT (seconds, default 60), ENVDOCTOR_EPILOG_ARGS (extra serve
# arguments, e.g. --config /etc/envdoctor.toml).
#
# It always exits 0: a failing epilog drains the node in Slurm, and recording the
# node's state is no reason to take it out of service (health.sh decides that).
#
# The node only (ENVDOCTOR_SERVE__MAX_TARGETS=1, the overflow counter says how many
# processes were left out): the file is written once per job, so a process's series
# in it would outlive the process until the next job ends, and its alerts would never
# clear. Nodes that should report their processes run `envdoctor serve`.
set -u
export ENVDOCTOR_SERVE__MAX_TARGETS="${ENVDOCTOR_SERVE__MAX_TARGETS:-1}"
envdoctor="${ENVDOCTOR:-envdoctor}"
textfile="${ENVDOCTOR_TEXTFILE:-/var/lib/prometheus/node-exporter/envdoctor.prom}"
# shellcheck disable=SC2086  # ENVDOCTOR_EPILOG_ARGS is a list of words on purpose
timeout "${ENVDOCTOR_EPILOG_TIMEOUT:-60}" "$envdoctor" serve --once --textfile "$textfile" ${ENVDOCTOR_EPILOG_ARGS:-}
code=$?
if [ "$code" != 0 ]; then
  echo "envdoctor epilog: serve --once exited $code; $textfile left as it was" >&2
fi
exit 0
