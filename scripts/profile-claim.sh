#!/usr/bin/env bash
# Where a lone client's cycle spends its time, on CPU and off it:
#   scripts/profile-claim.sh [--clients N] [--secs S] [--body-bytes B]
# Starts a fresh local 3-node cluster (scripts/cluster.sh, release build), runs the cycle
# workload of idemraft-bench against it (default 1 client, 256-byte responses) and, while it
# runs, records the scheduler's switches and wake-ups of every thread (`perf sched record`)
# for S seconds (default 3), then the CPU samples (`perf record -g`) for S more. It prints,
# per node and thread kind: context switches, time on CPU, time runnable but waiting for a
# CPU (the wake-up delay) and time blocked, each per cycle, and the hottest symbols. Needs
# perf (Debian linux-perf) with the sched tracepoints; run as root. It refuses to run while
# a cluster of scripts/cluster.sh is up, since it needs .cluster/. Output in .profile/.
set -euo pipefail
cd "$(dirname "$0")/.."
clients=1 secs=3 body=256
while [ $# -gt 0 ]; do
  case "$1" in
    --clients) clients=${2:?--clients N}; shift ;;
    --secs) secs=${2:?--secs S}; shift ;;
    --body-bytes) body=${2:?--body-bytes B}; shift ;;
    *) echo "unknown option $1; see the head of $0" >&2; exit 2 ;;
  esac
  shift
done
command -v perf >/dev/null || { echo "perf is missing: apt-get install linux-perf" >&2; exit 2; }
if [ -e .cluster ]; then
  echo ".cluster/ exists: stop that cluster and remove .cluster/ first (scripts/cluster.sh down; rm -r .cluster)" >&2
  exit 2
fi
out=.profile
rm -rf "$out"; mkdir -p "$out"
cargo build --release -q -p idemraft-node -p idemctl -p idemraft-bench
bench_pid=""
cleanup() {
  [ -z "$bench_pid" ] || kill "$bench_pid" 2>/dev/null || true
  scripts/cluster.sh down >/dev/null 2>&1 || true
  rm -rf .cluster
}
trap cleanup EXIT
scripts/cluster.sh up >/dev/null
pids="$(cat .cluster/node-1.pid),$(cat .cluster/node-2.pid),$(cat .cluster/node-3.pid)"
# Long enough to cover the warm-up and both recordings; it is stopped when they are done.
target/release/idemraft-bench run --target "name=idemraft-3 kind=idemraft endpoints=127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 pids=$pids" \
  --workloads cycle --clients "$clients" --body-bytes "$body" --rounds 1 --warmup 1s --duration "$((2 * secs + 4))s" \
  --scratch-dir "$out" >"$out/bench.txt" 2>&1 &
bench_pid=$!
sleep 3
# Every thread of the three nodes, by tid, with its node and name, for the summary.
for i in 1 2 3; do
  p=$(cat ".cluster/node-$i.pid")
  for t in /proc/"$p"/task/*; do echo "$(basename "$t") node-$i $(cat "$t/comm")"; done
done >"$out/threads.txt"
leader=$(target/release/idemctl --endpoints 127.0.0.1:7101 -w json status 2>/dev/null | sed -n 's/.*"leader_id":\([0-9]*\).*/\1/p' | head -n 1)
perf sched record -a -o "$out/sched.data" -- sleep "$secs" 2>"$out/sched-record.log"
perf record -a -g -F 999 -o "$out/cpu.data" -- sleep "$secs" 2>"$out/cpu-record.log"
wait "$bench_pid" || true
bench_pid=""
rate=$(sed -n 's/^| cycle | [^|]* | idemraft-3 | [0-9]* | \([0-9]*\) |.*/\1/p' "$out/bench.txt" | head -n 1)
[ -n "$rate" ] || { echo "the benchmark did not report a cycle rate; see $out/bench.txt" >&2; exit 1; }
perf sched timehist -i "$out/sched.data" >"$out/timehist.txt" 2>/dev/null
echo "== $clients client(s), $body-byte responses: $rate cycles/s; the leader is node ${leader:-?}"
python3 - "$out/timehist.txt" "$out/threads.txt" "$rate" "$secs" <<'EOF'
import collections, re, sys
timehist, threads, rate, secs = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
who = {}
for line in open(threads):
    tid, node, name = line.split(maxsplit=2)
    # Pool threads differ only by a number: group them.
    who[tid] = (node, re.sub(r"[-_ ]?\d+$", "", name.strip()))
# time cpu task[tid/pid] wait sch run (msec); idle and other processes are skipped.
row = re.compile(r"^\s*[\d.]+\s+\[\d+\]\s+(.*?)\[(\d+)(?:/\d+)?\]\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
tids = collections.defaultdict(set)
for line in open(timehist):
    m = row.match(line)
    if not m or m.group(2) not in who:
        continue
    tids[who[m.group(2)]].add(m.group(2))
    a = agg[who[m.group(2)]]
    a[0] += 1
    a[1] += float(m.group(5))  # on CPU
    a[2] += float(m.group(4))  # runnable, waiting for a CPU
    a[3] += float(m.group(3))  # off CPU before this run: blocked, plus the delay
cycles = rate * secs
print(f"over {secs:.0f} s, about {cycles:.0f} cycles; per cycle:")
# Blocked: off CPU and not runnable (waiting for a message, a lock or the disk), per thread.
print(f"{'node':<7} {'thread':<16} {'threads':>7} {'switches':>9} {'on CPU us':>10} {'wake delay us':>14} {'blocked us/thread':>18}")
tot = [0, 0.0, 0.0, 0.0]
for (node, name), a in sorted(agg.items(), key=lambda kv: (kv[0][0], -kv[1][1])):
    for i in range(4):
        tot[i] += a[i]
    if a[1] * 1000 / cycles < 5 and a[0] / cycles < 0.1:
        continue
    n = len(tids[(node, name)])
    print(f"{node:<7} {name:<16} {n:>7} {a[0]/cycles:>9.1f} {a[1]*1000/cycles:>10.0f} {a[2]*1000/cycles:>14.0f} {(a[3]-a[2])*1000/cycles/n:>18.0f}")
print(f"{'all':<7} {'':<16} {'':>7} {tot[0]/cycles:>9.1f} {tot[1]*1000/cycles:>10.0f} {tot[2]*1000/cycles:>14.0f}")
EOF
echo "== hottest symbols on CPU (all processes, children folded in)"
perf report -i "$out/cpu.data" --no-children --sort comm,dso,symbol --stdio 2>/dev/null | grep -E '^ +[0-9]' \
  | sed -E 's/ +$//; s/ {2,}/  /g' | head -n 25
