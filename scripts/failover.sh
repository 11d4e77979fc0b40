#!/usr/bin/env bash
# Measures failover: on a running local cluster (scripts/cluster.sh up), SIGKILL the leader
# and time how long until a claim succeeds again, then restart the killed node. Repeats
# ROUNDS times (default 3) and prints one line per round and the election timeout in use.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/.cluster"
profile="${IDEMRAFT_PROFILE:-$(cat "$dir/profile" 2>/dev/null || echo release)}"
if [ "$profile" = "release" ]; then bin="$root/target/release"; else bin="$root/target/debug"; fi
rounds="${ROUNDS:-3}"
n=$(cat "$dir/size" 2>/dev/null || echo 3)
eps=""; for i in $(seq 1 "$n"); do eps="${eps:+$eps,}127.0.0.1:710$i"; done
ctl() { "$bin/idemctl" --endpoints "$eps" "$@"; }
ctl status >/dev/null || { echo "failover.sh: no cluster answers; run scripts/cluster.sh up first" >&2; exit 1; }

leader() { ctl -w json status | grep -o '"leader_id":[0-9]*' | head -1 | cut -d: -f2; }
now_ms() { date +%s%3N; }

echo "election timeout: ${IDEMRAFT_ELECTION_TIMEOUT_MIN:-400ms}..${IDEMRAFT_ELECTION_TIMEOUT_MAX:-800ms} (node defaults unless set), heartbeat ${IDEMRAFT_HEARTBEAT:-100ms}"
for r in $(seq 1 "$rounds"); do
  l=$(leader)
  [ -n "$l" ] && [ "$l" != 0 ] || { echo "no leader before round $r" >&2; exit 1; }
  ctl claim failover.probe "warmup-round-$r-$(now_ms)" >/dev/null
  "$root/scripts/cluster.sh" kill "$l" >/dev/null
  start=$(now_ms)
  ctl --timeout 30s claim failover.probe "after-kill-round-$r-$start" >/dev/null
  end=$(now_ms)
  echo "round $r: killed leader $l; first successful claim after $((end - start)) ms; new leader $(leader)"
  "$root/scripts/cluster.sh" restart "$l" >/dev/null
  # Let the restarted node catch up before the next round.
  sleep 3
done
