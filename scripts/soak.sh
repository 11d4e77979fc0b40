#!/usr/bin/env bash
# A soak: a fresh local 3-node cluster under a paced, mixed-size (64 B to 256 KiB) claim +
# complete load whose records expire during the run, reporting RSS, disk, records, latency and
# the term every interval; fails when, after the first TTL period, an interval's mean RSS or
# mean disk moves more than 10 % from the first such interval's (expired records must give
# their space back).
#   scripts/soak.sh [--minutes 40] [--ttl-secs 600] [--every-secs 60] [--rate 100] [--seed 1] [--smoke]
# With a 10-minute TTL the live state is about 60,000 records (close to 1 GB per node) at the
# default rate; the 30 minutes after the first TTL period are judged (figures in
# docs/deployment.md, "Sizing"). --ttl-secs 60 holds a tenth of that.
# --smoke (CI's few minutes) judges only failed cycles and leader changes and prints the drift.
# Release build by default; IDEMRAFT_PROFILE=debug for the debug build (CI runs a few minutes
# of it). The run is bounded by --minutes and stops by itself; the cluster is stopped and its
# data removed at the end, also on failure. Refuses to run while .cluster/ exists.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=40
ttl=600
every=60
rate=100
seed=1
smoke=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=${2:?--minutes N}; shift ;;
    --ttl-secs) ttl=${2:?--ttl-secs N}; shift ;;
    --every-secs) every=${2:?--every-secs N}; shift ;;
    --rate) rate=${2:?--rate N}; shift ;;
    --seed) seed=${2:?--seed N}; shift ;;
    --smoke) smoke=(--smoke) ;;
    *) echo "unknown option $1; see the head of $0" >&2; exit 2 ;;
  esac
  shift
done
if [ -e .cluster ]; then
  echo ".cluster/ exists: stop that cluster and remove .cluster/ first (scripts/cluster.sh down; rm -r .cluster)" >&2
  exit 2
fi
profile=${IDEMRAFT_PROFILE:-release}
case "$profile" in
  release) cargo build --release -q -p idemraft-node -p idemctl -p idemraft-bench ;;
  debug) cargo build -q -p idemraft-node -p idemctl -p idemraft-bench ;;
  *) echo "IDEMRAFT_PROFILE must be release or debug, not '$profile'" >&2; exit 2 ;;
esac
target=${CARGO_TARGET_DIR:-target}
trap 'scripts/cluster.sh down >/dev/null 2>&1 || true; rm -rf .cluster' EXIT
# The shortest TTL a node accepts is a minute; a shorter one needs a node that allows it.
scripts/cluster.sh up >/dev/null
pids=$(cat .cluster/node-1.pid),$(cat .cluster/node-2.pid),$(cat .cluster/node-3.pid)
"$target/$profile/idemraft-bench" soak --endpoints 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 \
  --pids "$pids" --data-dirs .cluster/node-1,.cluster/node-2,.cluster/node-3 \
  --secs $((minutes * 60)) --ttl-secs "$ttl" --every-secs "$every" --rate "$rate" --seed "$seed" "${smoke[@]}"
