#!/usr/bin/env bash
# The side-by-side benchmark: Idemraft against etcd, Redis and PostgreSQL on this machine.
#
#   scripts/bench.sh [--quick] [--targets LIST] [--duration 3s] [--rounds 2] [--no-load] [--out FILE]
#                    [--workloads LIST] [--clients LIST] [--body-bytes LIST] [--compare-bin PATH]
#
# Installs what is missing (apt-get), starts every peer on 127.0.0.1 with its own data under
# .bench/ (git-ignored, wiped at start), runs idemraft-bench with all targets interleaved,
# loads 1M records into the 3-node Idemraft cluster for the memory figures, stops everything
# it started (also on error or Ctrl-C) and writes the results into docs/benchmarks.md between
# its generated-section markers (text outside them is kept). --quick: short runs, 20k records,
# report to .bench/report.md unless --out is given.
#
# Targets: idemraft-3 idemraft-3-log idemraft-1 etcd-3 redis-aof redis postgres postgres-ha
#   idemraft-3-log is idemraft-3 with --replay-fast-path false; it runs the replay workload only.
#   postgres-ha is a PostgreSQL primary with one synchronous streaming replica (synchronous_commit=on,
#   synchronous_standby_names = the replica), checked in pg_stat_replication before the runs; the
#   driver talks to the primary. Its two data directories are removed at the end.
# --workloads, --clients and --body-bytes are handed to the driver (default: all workloads,
# 1,16,64,256 clients; every workload with 256-byte responses, then the cycle workload again
# with 4 KiB and 64 KiB ones: --body-bytes 256,4096,65536; --quick: 256 only).
# The driver draws SVG charts of its figures into images/bench/ beside the report (for the
# full run, docs/images/bench/), and the report links them.
# --compare-bin PATH: also start every selected Idemraft target with the idemraft binary at
#   PATH (another build, e.g. the previous release) as NAME-cmp, on ports +1000, so the driver
#   interleaves the two builds run by run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
dir=.bench

invocation="scripts/bench.sh${*:+ $*}"
quick=0
targets="idemraft-3,idemraft-3-log,idemraft-1,etcd-3,redis-aof,redis,postgres,postgres-ha"
duration=3s
warmup=1s
rounds=2
load=1
records=1000000
out=docs/benchmarks.md
out_given=0
driver_extra=()
sizes_given=0
compare_bin=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --targets) targets="${2:?--targets LIST}"; shift ;;
    --duration) duration="${2:?--duration D}"; shift ;;
    --rounds) rounds="${2:?--rounds N}"; shift ;;
    --no-load) load=0 ;;
    --out) out="${2:?--out FILE}"; out_given=1; shift ;;
    --workloads) driver_extra+=(--workloads "${2:?--workloads LIST}"); shift ;;
    --clients) driver_extra+=(--clients "${2:?--clients LIST}"); shift ;;
    --body-bytes) driver_extra+=(--body-bytes "${2:?--body-bytes LIST}"); sizes_given=1; shift ;;
    --compare-bin) compare_bin="${2:?--compare-bin PATH}"; shift ;;
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$quick" = 1 ]; then
  duration=1s; warmup=300ms; rounds=1; records=20000
  [ "$out_given" = 1 ] || out="$dir/report.md"
fi
[ "$sizes_given" = 1 ] || [ "$quick" = 1 ] || driver_extra+=(--body-bytes 256,4096,65536)
charts_dir="$(dirname "$out")/images/bench"
[ -z "$compare_bin" ] || [ -x "$compare_bin" ] || { echo "bench.sh: --compare-bin $compare_bin is not an executable" >&2; exit 2; }
want() { case ",$targets," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
die() { echo "bench.sh: $*" >&2; exit 1; }

# --- install what is missing --------------------------------------------------------------
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
need=()
if want etcd-3; then
  command -v etcd >/dev/null || need+=(etcd-server)
  # etcd-client (the Rust crate) compiles etcd's protos with protoc.
  command -v protoc >/dev/null || need+=(protobuf-compiler)
fi
if want redis || want redis-aof; then command -v redis-server >/dev/null || need+=(redis-server); fi
if want postgres || want postgres-ha; then [ -n "$pgbin" ] && [ -x "$pgbin/initdb" ] || need+=(postgresql-15); fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
  pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
fi

# --- build --------------------------------------------------------------------------------
features=()
want etcd-3 && features=(--features idemraft-bench/etcd)
cargo build --release -q -p idemraft-node -p idemctl -p idemraft-bench "${features[@]}"
bin=target/release

# --- start and stop -----------------------------------------------------------------------
pids=()          # every process this script started, stopped by cleanup
pg_started=0
pg_ha=()         # postgres-ha data dirs this run made (primary first): cleanup stops their servers and removes them
cleanup() {
  local code=$?
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
  if [ "$pg_started" = 1 ]; then as_pg "$pgbin/pg_ctl" -D "$dir/pg/data" -m fast -w stop >/dev/null 2>&1 || true; fi
  for d in "${pg_ha[@]}"; do as_pg "$pgbin/pg_ctl" -D "$d" -m fast -w stop >/dev/null 2>&1 || true; done
  for d in "${pg_ha[@]}"; do rm -rf "$d"; done
  exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

wait_for() { # wait_for WHAT SECONDS CMD...: polls CMD every 0.2 s
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt "$deadline" ] || die "$what did not come up within ${secs}s (logs in $dir/)"
    sleep 0.2
  done
}

target_args=()
declare -A endpoints_of pids_of dirs_of
commands=()

# start_idemraft NAME NODES BASE [FLAGS...]: node i on client BASE+i, peer BASE+100+i, http BASE+200+i;
# the binary is $idemraft_bin (this build's unless --compare-bin starts the -cmp twin).
idemraft_bin=$bin/idemraft
start_idemraft() {
  local name=$1 n=$2 base=$3; shift 3
  local cluster="" eps="" ps="" ds=""
  for i in $(seq 1 "$n"); do cluster="${cluster:+$cluster,}$i=127.0.0.1:$((base + 100 + i))"; done
  mkdir -p "$dir/$name"
  for i in $(seq 1 "$n"); do
    local cmd=("$idemraft_bin" --id "$i" --initial-cluster "$cluster" --client-addr "127.0.0.1:$((base + i))"
      --http-addr "127.0.0.1:$((base + 200 + i))" --data-dir "$dir/$name/node-$i" "$@")
    "${cmd[@]}" >"$dir/$name/node-$i.log" 2>&1 &
    pids+=($!)
    ps="${ps:+$ps,}$!"; eps="${eps:+$eps,}127.0.0.1:$((base + i))"; ds="${ds:+$ds,}$dir/$name/node-$i"
    [ "$i" = 1 ] && commands+=("$name: ${cmd[*]}  (node i: --id i, ports +i)")
  done
  for i in $(seq 1 "$n"); do
    wait_for "$name node $i" 60 sh -c "'$bin/idemctl' --endpoints 127.0.0.1:$((base + i)) --timeout 1s -w json status | grep -q '\"leader_id\":[1-9]'"
  done
  endpoints_of[$name]=$eps; pids_of[$name]=$ps; dirs_of[$name]=$ds
  local only=""
  [ "${name%-cmp}" = idemraft-3-log ] && only=" only=replay"
  target_args+=(--target "name=$name kind=idemraft endpoints=$eps pids=$ps$only")
}

start_etcd() {
  local cluster="" eps="" ps=""
  for i in 1 2 3; do cluster="${cluster:+$cluster,}e$i=http://127.0.0.1:$((12370 + 10 * i))"; done
  mkdir -p "$dir/etcd"
  for i in 1 2 3; do
    local c=$((12369 + 10 * i)) p=$((12370 + 10 * i))
    local cmd=(etcd --name "e$i" --data-dir "$dir/etcd/e$i" --listen-client-urls "http://127.0.0.1:$c"
      --advertise-client-urls "http://127.0.0.1:$c" --listen-peer-urls "http://127.0.0.1:$p"
      --initial-advertise-peer-urls "http://127.0.0.1:$p" --initial-cluster "$cluster"
      --initial-cluster-state new --initial-cluster-token idemraft-bench --logger zap --log-level warn)
    "${cmd[@]}" >"$dir/etcd/e$i.log" 2>&1 &
    pids+=($!)
    ps="${ps:+$ps,}$!"; eps="${eps:+$eps,}127.0.0.1:$c"
    [ "$i" = 1 ] && commands+=("etcd-3: ${cmd[*]}  (member i: ports +10i)")
  done
  for i in 1 2 3; do
    wait_for "etcd member $i" 60 sh -c "curl -sf http://127.0.0.1:$((12369 + 10 * i))/health | grep -q true"
  done
  target_args+=(--target "name=etcd-3 kind=etcd endpoints=$eps pids=$ps")
}

start_redis() { # start_redis NAME PORT [FLAGS...]
  local name=$1 port=$2; shift 2
  mkdir -p "$dir/$name"
  local cmd=(redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/$name" "$@")
  "${cmd[@]}" >"$dir/$name/redis.log" 2>&1 &
  pids+=($!)
  commands+=("$name: ${cmd[*]}")
  wait_for "$name" 30 sh -c "redis-cli -p $port ping | grep -q PONG"
  target_args+=(--target "name=$name kind=redis endpoints=127.0.0.1:$port pids=$!")
}

start_postgres() {
  [ -n "$pgbin" ] || die "no PostgreSQL binaries under /usr/lib/postgresql/*/bin"
  mkdir -p "$dir/pg"
  [ "$(id -u)" = 0 ] && chown postgres "$dir/pg"
  as_pg "$pgbin/initdb" -D "$dir/pg/data" -U bench --auth=trust -E UTF8 >"$dir/pg/initdb.log" 2>&1 \
    || die "initdb failed; see $dir/pg/initdb.log"
  local opts="-p 15440 -c listen_addresses=127.0.0.1 -c unix_socket_directories= -c max_connections=300 -c synchronous_commit=on -c fsync=on"
  as_pg "$pgbin/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/postgres.log" -w -t 60 -o "$opts" start >/dev/null \
    || die "postgres did not start; see $dir/pg/postgres.log"
  pg_started=1
  commands+=("postgres: initdb -D $dir/pg/data -U bench --auth=trust; pg_ctl -D $dir/pg/data -o \"$opts\" start (as user postgres)")
  target_args+=(--target "name=postgres kind=postgres endpoints=127.0.0.1:15440 pids=$(head -n 1 "$dir/pg/data/postmaster.pid")")
}

# start_postgres_ha: a primary on 15441 and one streaming replica on 15442, made with
# pg_basebackup -R. synchronous_standby_names names the replica's application_name and
# synchronous_commit=on, so a commit is acknowledged once the replica has flushed it too.
start_postgres_ha() {
  [ -n "$pgbin" ] || die "no PostgreSQL binaries under /usr/lib/postgresql/*/bin"
  local d=$dir/pg-ha primary=15441 replica=15442
  mkdir -p "$d"
  [ "$(id -u)" = 0 ] && chown postgres "$d"
  pg_ha+=("$d/primary")
  as_pg "$pgbin/initdb" -D "$d/primary" -U bench --auth=trust -E UTF8 >"$d/initdb.log" 2>&1 \
    || die "postgres-ha: initdb failed; see $d/initdb.log"
  # Only the driver (bench) and the replica's WAL receiver (replicator), over 127.0.0.1.
  printf '%s\n' 'host all bench 127.0.0.1/32 trust' 'host replication replicator 127.0.0.1/32 trust' \
    >"$d/primary/pg_hba.conf"
  local common="-c listen_addresses=127.0.0.1 -c unix_socket_directories= -c max_connections=300 -c fsync=on -c wal_level=replica -c max_wal_senders=4"
  local popts="-p $primary $common -c synchronous_commit=on -c synchronous_standby_names=replica"
  local ropts="-p $replica $common -c hot_standby=on"
  as_pg "$pgbin/pg_ctl" -D "$d/primary" -l "$d/primary.log" -w -t 60 -o "$popts" start >/dev/null \
    || die "postgres-ha: the primary did not start; see $d/primary.log"
  local psql=("$pgbin/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$primary" -U bench -d postgres)
  # There is no standby yet, so this one commit must not wait for it.
  "${psql[@]}" -c "SET synchronous_commit = local" -c "CREATE ROLE replicator WITH REPLICATION LOGIN" \
    >"$d/setup.log" 2>&1 || die "postgres-ha: could not create the replication role; see $d/setup.log"
  pg_ha+=("$d/replica")
  as_pg "$pgbin/pg_basebackup" -d "host=127.0.0.1 port=$primary user=replicator application_name=replica" \
    -D "$d/replica" -R -X stream -c fast >"$d/basebackup.log" 2>&1 \
    || die "postgres-ha: pg_basebackup from the primary failed; see $d/basebackup.log"
  as_pg "$pgbin/pg_ctl" -D "$d/replica" -l "$d/replica.log" -w -t 60 -o "$ropts" start >/dev/null \
    || die "postgres-ha: the replica did not start; see $d/replica.log"
  # The promise rests on the replica being synchronous: refuse to measure otherwise.
  local rows="" deadline=$((SECONDS + 30))
  until [[ $'\n'"$rows"$'\n' == *$'\nreplica|sync\n'* ]]; do
    if [ $SECONDS -ge "$deadline" ]; then
      [ -n "$rows" ] || die "postgres-ha: no standby is streaming from the primary after 30s (pg_stat_replication is empty); see $d/replica.log"
      die "postgres-ha: the replica is not a synchronous standby, commits would not wait for it: pg_stat_replication (application_name|sync_state) shows '${rows//$'\n'/, }', not 'replica|sync'"
    fi
    sleep 0.2
    rows=$("${psql[@]}" -c "SELECT application_name, sync_state FROM pg_stat_replication" 2>&1) \
      || die "postgres-ha: cannot read pg_stat_replication on the primary: $rows"
  done
  echo "postgres-ha: pg_stat_replication on the primary shows ${rows//$'\n'/, } (application_name|sync_state)"
  commands+=("postgres-ha primary: initdb -D $d/primary -U bench --auth=trust; pg_hba.conf = 'host all bench 127.0.0.1/32 trust' + 'host replication replicator 127.0.0.1/32 trust'; pg_ctl -D $d/primary -o \"$popts\" start; CREATE ROLE replicator WITH REPLICATION LOGIN (as user postgres)")
  commands+=("postgres-ha replica: pg_basebackup -d \"host=127.0.0.1 port=$primary user=replicator application_name=replica\" -D $d/replica -R -X stream -c fast; pg_ctl -D $d/replica -o \"$ropts\" start (as user postgres); then pg_stat_replication on the primary must show replica|sync")
  target_args+=(--target "name=postgres-ha kind=postgres endpoints=127.0.0.1:$primary pids=$(head -n 1 "$d/primary/postmaster.pid"),$(head -n 1 "$d/replica/postmaster.pid")")
}

rm -rf "$dir"
mkdir -p "$dir"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
want idemraft-3 && start_idemraft idemraft-3 3 17100
want idemraft-3-log && start_idemraft idemraft-3-log 3 17120 --replay-fast-path false
want idemraft-1 && start_idemraft idemraft-1 1 17110
if [ -n "$compare_bin" ]; then
  idemraft_bin=$compare_bin
  want idemraft-3 && start_idemraft idemraft-3-cmp 3 18100
  want idemraft-3-log && start_idemraft idemraft-3-log-cmp 3 18120 --replay-fast-path false
  want idemraft-1 && start_idemraft idemraft-1-cmp 1 18110
  idemraft_bin=$bin/idemraft
fi
want etcd-3 && start_etcd
want redis-aof && start_redis redis-aof 16379 --appendonly yes --appendfsync always
want redis && start_redis redis 16380
want postgres && start_postgres
want postgres-ha && start_postgres_ha
[ ${#target_args[@]} -gt 0 ] || die "no target selected from '$targets'"

baseline=etcd-3; subject=idemraft-3
want idemraft-3 || subject=idemraft-1
driver=("$bin/idemraft-bench" run --duration "$duration" --warmup "$warmup" --rounds "$rounds"
  --baseline "$baseline" --subject "$subject" --scratch-dir "$dir" --charts-dir "$charts_dir"
  --charts-link images/bench/ "${driver_extra[@]}")
[ "$quick" = 1 ] && driver+=(--quick)
started=$(date -u +%Y-%m-%dT%H:%MZ)
t0=$SECONDS
echo "running: ${driver[*]} --target ... (${#target_args[@]} args)"
"${driver[@]}" "${target_args[@]}" | tee "$dir/results.md"
run_secs=$((SECONDS - t0))

load_out=""
if [ "$load" = 1 ] && [ -n "${endpoints_of[idemraft-3]:-}" ]; then
  load_cmd=("$bin/idemraft-bench" load --endpoints "${endpoints_of[idemraft-3]}" --pids "${pids_of[idemraft-3]}"
    --data-dirs "${dirs_of[idemraft-3]}" --records "$records")
  echo "loading $records records into idemraft-3 ..."
  load_out=$("${load_cmd[@]}") || load_out="$load_out
load: the load mode failed (exit $?); see the lines above"
  echo "$load_out"
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# --- report -------------------------------------------------------------------------------
ver() { "$@" 2>/dev/null | head -n 1 || echo "not installed"; }
section=$(mktemp)
{
  echo "<!-- bench:begin (generated by scripts/bench.sh; edit outside these markers) -->"
  echo "## Results of the last run"
  echo
  echo "Run $started; the interleaved runs took $((run_secs / 60)) min $((run_secs % 60)) s (the load mode comes after): ${rounds} round(s) of ${duration} after ${warmup} warm-up per cell."
  echo
  echo "**Machine:** $(nproc) vCPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), kernel $(uname -r),"
  echo "load average (1/5/15 min) $load_before before and $load_after after the run."
  echo
  echo '```'
  free -m
  echo '```'
  echo
  echo "**Versions:** Idemraft $(grep -m1 '^version' Cargo.toml | cut -d'"' -f2) (openraft $(grep -A1 'name = "openraft"' Cargo.lock | sed -n 's/version = "\(.*\)"/\1/p' | head -n 1), release build);"
  want etcd-3 && echo "etcd $(etcd --version 2>/dev/null | head -n 1 | awk '{print $3}');"
  (want redis || want redis-aof) && echo "Redis $(redis-server --version | awk '{print $3}' | cut -d= -f2);"
  (want postgres || want postgres-ha) && echo "PostgreSQL $("$pgbin/postgres" --version | awk '{print $3}');"
  echo "$(rustc --version | cut -d' ' -f1-2)."
  echo
  echo "**Commands** (from the repository root):"
  echo
  echo '```'
  echo "$invocation"
  for c in "${commands[@]}"; do echo "$c"; done
  echo "${driver[*]} --target 'name=... kind=... endpoints=... pids=...' (one per target)"
  [ -n "$load_out" ] && echo "${load_cmd[*]}"
  echo '```'
  echo
  echo "**Driver output:**"
  echo
  cat "$dir/results.md"
  if [ -n "$load_out" ]; then
    echo
    echo "**Memory at scale** (\`idemraft-bench load\`, 3-node cluster, after the run above):"
    echo
    echo '```'
    echo "$load_out"
    echo '```'
  fi
  echo "<!-- bench:end -->"
} >"$section"
mkdir -p "$(dirname "$out")"
if [ -f "$out" ] && grep -q '<!-- bench:begin' "$out"; then
  awk -v f="$section" '
    /<!-- bench:begin/ { while ((getline l < f) > 0) print l; skip = 1; next }
    /<!-- bench:end -->/ { skip = 0; next }
    !skip { print }' "$out" >"$out.tmp" && mv "$out.tmp" "$out"
else
  { echo "# Benchmarks"; echo; cat "$section"; } >"$out"
fi
rm -f "$section"
echo "report written to $out"
