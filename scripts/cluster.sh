#!/usr/bin/env bash
# A local Idemraft cluster on 127.0.0.1, for trying it out and for scripts.
#
#   scripts/cluster.sh up [3|5]   build if needed, start N nodes, wait until healthy, show status
#   scripts/cluster.sh up [3|5] --tls   the same with TLS on the client ports and mutual TLS
#                                 between peers, using throwaway certs from idemctl dev-certs
#   scripts/cluster.sh up [3|5] --tokens   the same with bearer tokens: makes an admin token
#                                 and a token of tenant `default` (.cluster/*.token)
#   scripts/cluster.sh down       stop every node (SIGTERM, then SIGKILL after 10 s)
#   scripts/cluster.sh status     idemctl status against every node
#   scripts/cluster.sh kill N     SIGKILL node N (a crash)
#   scripts/cluster.sh restart N  start node N again with the same flags and data
#   scripts/cluster.sh logs N     follow node N's log
#
# Node i listens on 127.0.0.1:710i (client), 720i (peer) and 730i (HTTP). Data, logs and
# pid files live in .cluster/ at the repository root (git-ignored). Set IDEMRAFT_PROFILE=debug
# to use a debug build (faster to build, slower to run); extra node flags go in
# IDEMRAFT_NODE_FLAGS. With --tls the certificates live in .cluster/certs (the CA for idemctl
# is .cluster/certs/ca.pem: export IDEMCTL_CA to use it); the mode is remembered by restart.
# With --tokens, or with your own --tokens-file in IDEMRAFT_NODE_FLAGS, this script's own
# status calls send IDEMCTL_TOKEN if set, else the admin token it made.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/.cluster"
# The build profile is remembered by `up`, so restart and status use the same binaries.
profile="${IDEMRAFT_PROFILE:-$(cat "$dir/profile" 2>/dev/null || echo release)}"
if [ "$profile" = "release" ]; then bin="$root/target/release"; else bin="$root/target/debug"; fi

die() { echo "cluster.sh: $*" >&2; exit 1; }

build() {
  local flag=()
  [ "$profile" = "release" ] && flag=(--release)
  (cd "$root" && cargo build "${flag[@]}" -q -p idemraft-node -p idemctl) || die "build failed"
}

size() { cat "$dir/size" 2>/dev/null || echo 3; }

tls() { [ "$(cat "$dir/mode" 2>/dev/null)" = "tls" ]; }

tokens() { [ -f "$dir/tokens.toml" ] && [ "$(cat "$dir/tokens" 2>/dev/null)" = "on" ]; }

# idemctl with the cluster's CA when it runs with TLS, and an admin token when it checks
# tokens (Status is an admin call: without one every node would look unreachable).
ctl() {
  local token="${IDEMCTL_TOKEN:-}"
  if [ -z "$token" ] && tokens; then token=$(cat "$dir/admin.token"); fi
  if tls; then set -- --ca "$dir/certs/ca.pem" "$@"; fi
  if [ -n "$token" ]; then IDEMCTL_TOKEN="$token" "$bin/idemctl" "$@"; else env -u IDEMCTL_TOKEN "$bin/idemctl" "$@"; fi
}

# An admin token and a token of tenant `default`, each in its own file (mode 600), and the
# tokens file that holds their hashes.
make_tokens() {
  local admin tenant
  admin=$("$bin/idemctl" token new --admin) || die "idemctl token new failed"
  tenant=$("$bin/idemctl" token new --tenant default) || die "idemctl token new failed"
  (umask 077
    echo "$admin" | head -n 1 >"$dir/admin.token"
    echo "$tenant" | head -n 1 >"$dir/tenant.token"
    { echo "$admin" | sed -n '/^\[\[token\]\]/,$p'; echo; echo "$tenant" | sed -n '/^\[\[token\]\]/,$p'; } >"$dir/tokens.toml")
}

token_flags() { tokens && echo "--tokens-file $dir/tokens.toml"; return 0; }

tls_flags() {
  local i=$1 c="$dir/certs"
  tls || return 0
  echo "--tls-cert $c/node-$i.pem --tls-key $c/node-$i.key" \
    "--peer-tls-cert $c/node-$i.pem --peer-tls-key $c/node-$i.key --peer-tls-ca $c/ca.pem"
}

endpoints() {
  local n; n=$(size); local list=""
  for i in $(seq 1 "$n"); do list="${list:+$list,}127.0.0.1:710$i"; done
  echo "$list"
}

initial_cluster() {
  local n; n=$(size); local list=""
  for i in $(seq 1 "$n"); do list="${list:+$list,}$i=127.0.0.1:720$i"; done
  echo "$list"
}

running() { [ -f "$dir/node-$1.pid" ] && kill -0 "$(cat "$dir/node-$1.pid")" 2>/dev/null; }

start_node() {
  local i=$1
  running "$i" && { echo "node $i is already running (pid $(cat "$dir/node-$i.pid"))"; return 0; }
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  nohup "$bin/idemraft" --id "$i" --initial-cluster "$(initial_cluster)" --data-dir "$dir/node-$i" \
    $(tls_flags "$i") $(token_flags) ${IDEMRAFT_NODE_FLAGS:-} >>"$dir/node-$i.log" 2>&1 &
  echo $! >"$dir/node-$i.pid"
}

wait_healthy() {
  local n; n=$(size)
  local deadline=$((SECONDS + 60))
  while [ $SECONDS -lt $deadline ]; do
    local ready=0
    for i in $(seq 1 "$n"); do
      running "$i" || die "node $i exited; see $dir/node-$i.log: $(tail -n 3 "$dir/node-$i.log" 2>/dev/null)"
      local out code=0
      out=$(ctl --endpoints "127.0.0.1:710$i" --timeout 1s -w json status 2>/dev/null) || code=$?
      # Exit 6: the node answered but refused the token; waiting longer will not help.
      [ "$code" -eq 6 ] && die "node $i refuses this script's status calls: $out
  (a --tokens-file in IDEMRAFT_NODE_FLAGS needs an admin token in IDEMCTL_TOKEN; or use 'up --tokens')"
      if echo "$out" | grep -q '"leader_id":[1-9]'; then ready=$((ready + 1)); fi
    done
    [ "$ready" -eq "$n" ] && return 0
    sleep 0.2
  done
  die "the cluster did not elect a leader within 60 s; see the logs in $dir"
}

cmd="${1:-}"
case "$cmd" in
  up)
    shift
    n=3 mode=plain tok=off
    for a in "$@"; do
      case "$a" in
        --tls) mode=tls ;;
        --tokens) tok=on ;;
        3|5) n="$a" ;;
        *) die "up takes 3 or 5 nodes and optionally --tls and --tokens, not '$a'" ;;
      esac
    done
    if [ -f "$dir/size" ] && [ "$(size)" != "$n" ]; then
      for i in $(seq 1 "$(size)"); do running "$i" && die "a $(size)-node cluster is running; run 'scripts/cluster.sh down' first"; done
      die "$dir holds a $(size)-node cluster's data; remove it to start a $n-node cluster"
    fi
    if [ -f "$dir/mode" ] && [ "$(cat "$dir/mode")" != "$mode" ]; then
      for i in $(seq 1 "$(size)"); do running "$i" && die "a cluster in $(cat "$dir/mode") mode is running; run 'scripts/cluster.sh down' first"; done
    fi
    build
    mkdir -p "$dir"
    echo "$n" >"$dir/size"
    echo "$profile" >"$dir/profile"
    echo "$mode" >"$dir/mode"
    echo "$tok" >"$dir/tokens"
    if [ "$tok" = on ] && [ ! -f "$dir/tokens.toml" ]; then make_tokens; fi
    if tls && [ ! -f "$dir/certs/node-$n.pem" ]; then
      "$bin/idemctl" dev-certs "$dir/certs" --nodes "$n" >/dev/null || die "idemctl dev-certs failed"
    fi
    for i in $(seq 1 "$n"); do start_node "$i"; done
    wait_healthy
    ctl --endpoints "$(endpoints)" status
    echo
    if tls; then
      echo "cluster is up with TLS. try:  IDEMCTL_CA=$dir/certs/ca.pem $bin/idemctl claim payments.create order-0000000000000001"
    else
      echo "cluster is up. try:  $bin/idemctl claim payments.create order-0000000000000001"
    fi
    if tokens; then
      echo "bearer tokens are on: export IDEMCTL_TOKEN=\$(cat $dir/tenant.token) for keys of tenant default;"
      echo "  the admin token (status, members, quotas, the status page) is in $dir/admin.token"
    fi
    echo "endpoints: $(endpoints)   (IDEMCTL_ENDPOINTS defaults to the 3-node set)"
    ;;
  down)
    [ -d "$dir" ] || { echo "no cluster"; exit 0; }
    for f in "$dir"/node-*.pid; do
      [ -f "$f" ] || continue
      pid=$(cat "$f")
      kill -TERM "$pid" 2>/dev/null || true
    done
    for f in "$dir"/node-*.pid; do
      [ -f "$f" ] || continue
      pid=$(cat "$f")
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -KILL "$pid" 2>/dev/null || true
      rm -f "$f"
    done
    echo "stopped (data kept in $dir; remove it for a fresh cluster)"
    ;;
  status)
    [ -x "$bin/idemctl" ] || build
    ctl --endpoints "$(endpoints)" status
    ;;
  kill)
    i="${2:?kill N}"
    running "$i" || die "node $i is not running"
    kill -KILL "$(cat "$dir/node-$i.pid")"
    rm -f "$dir/node-$i.pid"
    echo "node $i killed (SIGKILL)"
    ;;
  restart)
    i="${2:?restart N}"
    if running "$i"; then
      kill -TERM "$(cat "$dir/node-$i.pid")"
      for _ in $(seq 1 100); do running "$i" || break; sleep 0.1; done
    fi
    start_node "$i"
    echo "node $i started (pid $(cat "$dir/node-$i.pid"))"
    ;;
  logs)
    i="${2:?logs N}"
    exec tail -n 50 -f "$dir/node-$i.log"
    ;;
  *)
    sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
