#!/usr/bin/env bash
# CI smoke of the benchmark driver: a seconds-long run of idemraft-bench against a 1-node
# Idemraft cluster from the debug build, so the driver cannot rot. Not a timed test: it checks
# only that the driver runs every workload and the load mode, and prints its tables.
# Needs nothing but the Rust toolchain (no etcd, Redis or PostgreSQL). Data in .bench/smoke/.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
dir=.bench/smoke
bin=target/debug

cargo build -q -p idemraft-node -p idemctl -p idemraft-bench

node_pid=""
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  if [ -n "$node_pid" ]; then
    kill -TERM "$node_pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$node_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$node_pid" 2>/dev/null || true
  fi
  [ "$code" = 0 ] || { echo "bench-smoke: failed; node log:" >&2; tail -n 20 "$dir/node.log" >&2 || true; }
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rm -rf "$dir"
mkdir -p "$dir"
ep=127.0.0.1:17131
"$bin/idemraft" --id 1 --initial-cluster 1=127.0.0.1:17231 --client-addr "$ep" --http-addr 127.0.0.1:17331 \
  --data-dir "$dir/node-1" >"$dir/node.log" 2>&1 &
node_pid=$!
deadline=$((SECONDS + 60))
until "$bin/idemctl" --endpoints "$ep" --timeout 1s -w json status 2>/dev/null | grep -q '"leader_id":[1-9]'; do
  kill -0 "$node_pid" 2>/dev/null || { echo "bench-smoke: the node exited" >&2; exit 1; }
  [ $SECONDS -lt $deadline ] || { echo "bench-smoke: no leader within 60 s" >&2; exit 1; }
  sleep 0.2
done

out="$dir/out.txt"
timeout 120 "$bin/idemraft-bench" run --quick --clients 1,4 --body-bytes 256,4096 --scratch-dir "$dir" \
  --subject idemraft-1 --charts-dir "$dir/charts" \
  --target "name=idemraft-1 kind=idemraft endpoints=$ep pids=$node_pid" | tee "$out"
timeout 120 "$bin/idemraft-bench" load --endpoints "$ep" --pids "$node_pid" --data-dirs "$dir/node-1" \
  --records 500 --clients 8 --max-secs 60 | tee -a "$out"

for want in '^floor: ' '^| cycle | 256 B | idemraft-1 | 1 |' '^| cycle | 4 KiB | idemraft-1 | 4 |' \
  '^| replay | 256 B | idemraft-1 | 4 |' '^| contention | 256 B | idemraft-1 | 4 |' '^load: '; do
  grep -q -- "$want" "$out" || { echo "bench-smoke: the output lacks '$want'" >&2; exit 1; }
done
for chart in cycle-256-ops cycle-4096-claim-p99 replay-256-op-p50; do
  grep -q '<polyline' "$dir/charts/$chart.svg" 2>/dev/null || { echo "bench-smoke: no line in chart $chart.svg" >&2; exit 1; }
done
echo "bench-smoke: the driver ran every workload at two sizes, the load mode, and drew its charts"
