#!/usr/bin/env bash
# The payments example through a retry storm and a leader kill, on 127.0.0.1 only.
#
#   scripts/payments-demo.sh
#
# 1. starts a 3-node cluster (scripts/cluster.sh up) and the payments example on
#    127.0.0.1:$PAYMENTS_PORT (default 8080);
# 2. fires a retry storm at POST /v1/charges: for each of $DEMO_KEYS keys (default 20),
#    $DEMO_PARALLEL parallel clients (default 6), a double click (two requests at once) and an
#    impatient client that gives up after 0.2 s and retries; each charge takes 400 ms at the
#    bank, so duplicates really overlap;
# 3. kills the leader (scripts/cluster.sh kill N) once half the keys are under way;
# 4. checks with the bank's books (GET /v1/bank/charges) that each key was charged exactly
#    once, and that every client of a key got the same status and body;
# 5. stops what it started (the example, the cluster) and removes its scratch files.
#
# Every client retries only on 409, 503 or a timeout, at most $DEMO_ATTEMPTS times (default
# 40), and the whole storm is bounded by $DEMO_TIMEOUT seconds (default 120). Needs curl.
# Builds release binaries the first time.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

port="${PAYMENTS_PORT:-8080}"
keys="${DEMO_KEYS:-20}"
parallel="${DEMO_PARALLEL:-6}"
attempts="${DEMO_ATTEMPTS:-40}"
storm_timeout="${DEMO_TIMEOUT:-120}"
base="http://127.0.0.1:$port"
endpoints="127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
bin="$root/target/release"

die() { echo "payments-demo: $*" >&2; exit 1; }
command -v curl >/dev/null || die "needs curl"
for i in 1 2 3; do
  if [ -f .cluster/node-$i.pid ] && kill -0 "$(cat .cluster/node-$i.pid)" 2>/dev/null; then
    die "a cluster is already running; stop it first (scripts/cluster.sh down): the demo kills one of its nodes"
  fi
done
[ -d .cluster ] && had_cluster_dir=1 || had_cluster_dir=0

work="$(mktemp -d)"
payments_pid=""
cluster_started=0
cleanup() {
  set +e
  if [ -n "$payments_pid" ]; then
    kill -TERM "$payments_pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$payments_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$payments_pid" 2>/dev/null
  fi
  if [ "$cluster_started" = 1 ]; then
    scripts/cluster.sh down >/dev/null
    [ "$had_cluster_dir" = 0 ] && rm -rf .cluster
  fi
  rm -rf "$work"
}
trap cleanup EXIT

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

echo "== build (release; the first time takes a few minutes)"
cargo build --release -q -p idemraft-node -p idemctl
cargo build --release -q -p idemraft-payments-example --bin payments

echo "== cluster"
cluster_started=1
IDEMRAFT_PROFILE=release scripts/cluster.sh up >"$work/cluster-up.log" || { cat "$work/cluster-up.log"; die "cluster did not start"; }
grep -E 'ENDPOINT|leader|follower' "$work/cluster-up.log" || true

echo "== payments example on $base"
"$bin/payments" --endpoints "$endpoints" --listen "127.0.0.1:$port" --wait-ms 5000 >"$work/payments.log" 2>&1 &
payments_pid=$!
for _ in $(seq 1 100); do
  curl -s -o /dev/null -m 1 "$base/v1/bank/charges" && break
  kill -0 "$payments_pid" 2>/dev/null || { cat "$work/payments.log"; die "the example exited"; }
  sleep 0.1
done
curl -s -o /dev/null -m 1 "$base/v1/bank/charges" || die "the example did not start listening on $base"

# One client: the same key and body until an answer other than 409 or 503 (or a timeout).
# Writes "status body-digest replayed attempts" to $out.res, one status per attempt to $out.log.
client() {
  local key=$1 body=$2 max_time=$3 out=$4
  local n status
  for n in $(seq 1 "$attempts"); do
    status=$(curl -s -o "$out.body" -D "$out.headers" -w '%{http_code}' -m "$max_time" -X POST "$base/v1/charges" \
      -H 'content-type: application/json' -H "idempotency-key: $key" --data "$body" || true)
    echo "$status" >>"$out.log"
    case "$status" in
      409 | 503 | 000) sleep 0.25 ;;
      *)
        local replayed=false
        if grep -qi '^idempotent-replayed: true' "$out.headers"; then replayed=true; fi
        echo "$status $(sha256sum <"$out.body" | cut -c1-16) $replayed $n" >"$out.res"
        return 0
        ;;
    esac
  done
  echo "gave-up - false $attempts" >"$out.res"
}

leader() {
  "$bin/idemctl" --endpoints "$endpoints" --timeout 2s -w json status 2>/dev/null \
    | grep -o '"leader_id":[1-9][0-9]*' | head -n 1 | cut -d: -f2
}

run_id="$(date +%s)-$$"
mkdir -p "$work/c"
echo "== storm: $keys keys x ($parallel parallel + double click + impatient client), 400 ms per charge"
start=$(now_ms)
kill_at=""
killed=""
for i in $(seq 1 "$keys"); do
  key=$(printf 'demo-%s-%04d' "$run_id" "$i")
  body=$(printf '{"amount": %d, "currency": "usd", "delay_ms": 400, "metadata": {"order": "o-%04d"}}' $((1000 + i)) "$i")
  for p in $(seq 1 "$parallel"); do client "$key" "$body" 10 "$work/c/$i.parallel-$p" & done
  client "$key" "$body" 10 "$work/c/$i.click-1" &
  client "$key" "$body" 10 "$work/c/$i.click-2" &
  client "$key" "$body" 0.2 "$work/c/$i.impatient" &
  if [ "$i" -eq $(((keys + 1) / 2)) ]; then
    killed=$(leader)
    [ -n "$killed" ] || die "no leader to kill"
    scripts/cluster.sh kill "$killed" >/dev/null
    kill_at=$(( $(now_ms) - start ))
    echo "   killed the leader, node $killed, at +${kill_at} ms (key $i of $keys under way)"
  fi
  sleep 0.05
done

# Bounded wait for every client.
deadline=$((SECONDS + storm_timeout))
while [ -n "$(jobs -rp | grep -v "^$payments_pid\$" || true)" ]; do
  [ $SECONDS -lt $deadline ] || die "the storm did not finish within ${storm_timeout} s"
  sleep 0.2
done
elapsed=$(( $(now_ms) - start ))
new_leader=$(leader || true)

echo "== results"
books=$(curl -s -m 5 "$base/v1/bank/charges")
fired=$(cat "$work"/c/*.log | wc -l)
clients=$(find "$work/c" -name '*.res' | wc -l)
count_status() { cat "$work"/c/*.log | grep -c "^$1\$" || true; }
fails=0
once=0
for i in $(seq 1 "$keys"); do
  key=$(printf 'demo-%s-%04d' "$run_id" "$i")
  charges=$(echo "$books" | grep -o "\"$key\":{\"charges\":[0-9]*" | grep -o '[0-9]*$' || echo 0)
  answers=$(cat "$work/c/$i".*.res | cut -d' ' -f1,2 | sort -u)
  distinct=$(echo "$answers" | wc -l)
  if [ "$charges" = 1 ] && [ "$distinct" = 1 ] && [ "${answers%% *}" = 201 ]; then
    once=$((once + 1))
  else
    fails=$((fails + 1))
    echo "   key $key: charged $charges times, $distinct distinct answers: $(echo "$answers" | tr '\n' ';')"
  fi
done
replayed=$(cat "$work"/c/*.res | awk '$3 == "true"' | wc -l)
total=$(echo "$books" | grep -o '"total_charges":[0-9]*' | cut -d: -f2)
max=$(echo "$books" | grep -o '"max_charges_per_key":[0-9]*' | cut -d: -f2)
stale=$(echo "$books" | grep -o '"refused_stale":[0-9]*' | head -n 1 | cut -d: -f2)

printf '   %-38s %s\n' "keys" "$keys" \
  "clients" "$clients" \
  "HTTP requests fired (with retries)" "$fired" \
  "answered 201 / 409 / 503 / timeout" "$(count_status 201) / $(count_status 409) / $(count_status 503) / $(count_status 000)" \
  "final answers that were replays" "$replayed" \
  "bank: charges in all" "$total" \
  "bank: most charges for one key" "$max" \
  "bank: stale-token refusals" "$stale" \
  "keys charged exactly once, one answer" "$once of $keys" \
  "leader killed" "node $killed at +${kill_at} ms" \
  "new leader" "node ${new_leader:-?}" \
  "storm took" "${elapsed} ms"

if [ "$fails" -ne 0 ] || [ "$max" != 1 ] || [ "$total" != "$keys" ]; then
  die "FAILED: $fails keys were not charged exactly once with one answer"
fi
echo "OK: every key charged exactly once; every retry of a key got the same status and body"
