#!/usr/bin/env bash
# Disk and memory per stored response byte, at several response sizes:
#   scripts/disk-per-payload.sh [--payload-mb N] [--sizes 1024,16384,262144]
# For each size: a fresh local 3-node cluster (scripts/cluster.sh, release build), then
# `idemraft-bench load` completes records of that size until about N MB of responses are
# stored (default 200), and the driver prints RSS and bytes on disk per node, per record and
# per stored response byte. The cluster is stopped and its data removed after each size.
# It refuses to run while a cluster of scripts/cluster.sh is up, since it needs .cluster/.
set -euo pipefail
cd "$(dirname "$0")/.."
payload_mb=200
sizes=1024,16384,262144
while [ $# -gt 0 ]; do
  case "$1" in
    --payload-mb) payload_mb=${2:?--payload-mb N}; shift ;;
    --sizes) sizes=${2:?--sizes LIST}; shift ;;
    *) echo "unknown option $1; see the head of $0" >&2; exit 2 ;;
  esac
  shift
done
if [ -e .cluster ]; then
  echo ".cluster/ exists: stop that cluster and remove .cluster/ first (scripts/cluster.sh down; rm -r .cluster)" >&2
  exit 2
fi
cargo build --release -q -p idemraft-node -p idemctl -p idemraft-bench
trap 'scripts/cluster.sh down >/dev/null 2>&1 || true; rm -rf .cluster' EXIT
for size in ${sizes//,/ }; do
  records=$(( payload_mb * 1000 * 1000 / size ))
  echo "== responses of $size bytes: $records records (${payload_mb} MB of responses)"
  scripts/cluster.sh up >/dev/null
  pids=$(cat .cluster/node-1.pid),$(cat .cluster/node-2.pid),$(cat .cluster/node-3.pid)
  target/release/idemraft-bench load --endpoints 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 \
    --pids "$pids" --data-dirs .cluster/node-1,.cluster/node-2,.cluster/node-3 \
    --records "$records" --body-bytes "$size" --clients 32 --max-secs 600
  for i in 1 2 3; do
    # One du over blobs/ and snapshots/ together: a snapshot's hard links to live blobs are
    # counted once, under blobs/, as the disk holds them.
    parts=$(du -sm .cluster/node-$i/blobs .cluster/node-$i/snapshots | cut -f1 | paste -sd' ')
    echo "   node $i: $(du -sm .cluster/node-$i/db | cut -f1) MB db, $(du -sm .cluster/node-$i/log | cut -f1) MB log, ${parts% *} MB blobs, ${parts#* } MB snapshots"
  done
  scripts/cluster.sh down >/dev/null
  rm -rf .cluster
done
