#!/usr/bin/env bash
# The long schedule: seeded fault schedules over every fault family (partition, kill, pause,
# clock, membership, catch-up, power-loss, disk) and mixes of them, on 3 and/or 5 nodes, then
# (with --planted) every planted bug, each of which must be caught. Prints one line per run
# and, at the end, one summary table built from the runs' own verdict.json and nemesis.json:
# runs, ops, faults installed per kind, anomalies, and the longest window without a
# successful write per fault kind. Exits non-zero if any clean run is not valid (an anomaly,
# an invalid run, or exit 4: a single-node fault stopped writes for longer than the
# availability bound) or any planted bug escapes.
#
#   scripts/jepsen-suite.sh [--schedules N] [--nodes 3|5|3,5] [--time SECS] [--jobs J] [--planted]
#
# Schedule i (1-based) runs seed i on family i mod 9 (the ninth, `mix`, takes one kind from
# each of three families at once), with up to two of the family's kinds drawn by the seed,
# for --time seconds (default 20; a mix gets half as long again). With --nodes 3,5 the node
# count alternates every nine schedules, so 200 schedules cover each family 22 times, about
# half on each size. Each run takes its time plus about 25 s of start, warm-up and checks;
# --jobs 2 runs two schedules at a time (each on its own ports and directories). Clock
# faults need libfaketime (Debian package faketime); power-loss and disk faults need root
# and /dev/fuse.
set -uo pipefail
cd "$(dirname "$0")/.."
schedules=18
nodes_list=3,5
time=20
jobs=1
planted=0
while [ $# -gt 0 ]; do
  case "$1" in
    --schedules) schedules=${2:?--schedules N}; shift ;;
    --nodes) nodes_list=${2:?--nodes 3|5|3,5}; shift ;;
    --time) time=${2:?--time SECS}; shift ;;
    --jobs) jobs=${2:?--jobs J}; shift ;;
    --planted) planted=1 ;;
    -h|--help) sed -n 2,20p "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
profile=${IDEMRAFT_PROFILE:-release}
IDEMRAFT_PROFILE=$profile scripts/jepsen.sh --help >/dev/null || exit 3
target=${CARGO_TARGET_DIR:-target}
bin=("$target/$profile/idemraft-jepsen" --binary "$target/$profile/idemraft")
suite_dir="$target/jepsen/suite"
rm -rf "$suite_dir"
mkdir -p "$suite_dir"
IFS=, read -r -a sizes <<<"$nodes_list"
families=(partition kill pause clock membership catch-up power-loss disk mix)
kinds_of() { # family nodes
  case "$1" in
    partition)
      echo partition-one partition-leader partition-majority partition-bridge partition-oneway
      if [ "$2" -ge 5 ]; then echo partition-ring; fi ;;
    kill) echo kill-one kill-leader kill-minority kill-all ;;
    pause) echo pause-one pause-leader ;;
    clock) echo clock ;;
    membership) echo membership ;;
    catch-up) echo catch-up ;;
    power-loss) echo power-loss-one power-loss-leader power-loss-all ;;
    disk) echo disk-eio disk-slow ;;
  esac
}
pick() { # n words...: n distinct words, drawn with bash's RANDOM (seeded per schedule)
  local n=$1; shift
  local words=("$@") out=()
  while [ "${#out[@]}" -lt "$n" ] && [ "${#words[@]}" -gt 0 ]; do
    local k=$((RANDOM % ${#words[@]}))
    out+=("${words[$k]}")
    words=("${words[@]:0:$k}" "${words[@]:$((k + 1))}")
  done
  echo "${out[*]}"
}
faults_for() { # schedule nodes family
  RANDOM=$1
  local f out=()
  if [ "$3" = mix ]; then
    # shellcheck disable=SC2046
    for f in $(pick 3 partition kill pause clock catch-up power-loss disk); do
      # shellcheck disable=SC2046
      out+=("$(pick 1 $(kinds_of "$f" "$2"))")
    done
  else
    # shellcheck disable=SC2046
    read -r -a out <<<"$(pick 2 $(kinds_of "$3" "$2"))"
  fi
  local IFS=,
  echo "${out[*]}"
}
suite_start=$SECONDS
mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
run_one() { # dir expect(0|1) label args...
  local dir=$1 expect=$2 label=$3; shift 3
  local out rc
  mkdir -p "$dir"
  out=$("${bin[@]}" --out "$dir" "$@" 2>&1); rc=$?
  # Which result a run is expected to have: 0 for a clean run, 1 (anomalies) for a planted bug.
  echo "$expect $rc" >"$dir/expected"
  printf '%-66s exit %s  %s\n' "$label" "$rc" "$(grep -E '^ops ' <<<"$out" | head -1 | cut -d, -f1)"
  if [ "$rc" -ne "$expect" ]; then
    grep -E '^(anomaly|invalid run|result|reproduce)' <<<"$out" | head -12
  fi
}
lane() { # lane: every jobs-th schedule, starting at lane + 1
  local i
  for ((i = $1 + 1; i <= schedules; i += jobs)); do
    local family=${families[$(((i - 1) % 9))]}
    local nodes=${sizes[$(((i - 1) / 9 % ${#sizes[@]}))]}
    local t=$time
    if [ "$family" = mix ]; then t=$((time * 3 / 2)); fi
    local faults
    faults=$(faults_for "$i" "$nodes" "$family")
    if [ -t 1 ]; then
      printf 'schedule %d/%d, elapsed %s\n' "$i" "$schedules" "$(mmss $((SECONDS - suite_start)))"
    fi
    run_one "$suite_dir/s$(printf %04d "$i")" 0 "nodes=$nodes seed=$i faults=$faults" \
      --nodes "$nodes" --time "$t" --seed "$i" --faults "$faults"
  done
}
# Each lane picks its ports from its own range: a node restarted in one run must find its
# port free, not taken meanwhile by a node of a run in another lane.
span=$((20000 / jobs))
for ((l = 0; l < jobs; l++)); do
  IDEMRAFT_JEPSEN_PORTS="$((10000 + l * span))-$((10000 + (l + 1) * span))" lane "$l" &
done
wait
if [ "$planted" = 1 ]; then
  # Each bug with the faults that expose it (the regression tests in
  # jepsen-like-tests/tests/faults.rs use the same pairs).
  while read -r bug faults; do
    run_one "$suite_dir/planted-$bug" 1 "planted $bug ($faults)" \
      --time 15 --seed 1 --faults "$faults" --unsafe-planted-bugs "$bug"
  done <<'EOF'
skip-token-check kill-one
local-clock kill-one
ignore-leases pause-one
stale-local-reads partition-one,partition-leader
early-lease-expiry pause-one
retry-new-token kill-leader,partition-leader
replay-expired kill-one
ack-before-fsync power-loss-all
skip-dir-fsync power-loss
unsynced-snapshot power-loss
EOF
fi
python3 - "$suite_dir" <<'PY'
import json, os, sys
from collections import defaultdict
root = sys.argv[1]
families = ["partition", "kill", "pause", "clock", "membership", "catch-up", "power-loss", "disk", "mix"]
rows = defaultdict(lambda: {"runs": 0, "ops": 0, "faults": defaultdict(int), "anomalies": 0,
                            "unexpected": 0, "windows": defaultdict(int)})
for name in sorted(os.listdir(root)):
    d = os.path.join(root, name)
    if not os.path.exists(os.path.join(d, "expected")):
        continue
    expect, rc = open(os.path.join(d, "expected")).read().split()
    runs = sorted(r for r in os.listdir(d) if r.startswith("run-"))
    try:
        run = os.path.join(d, runs[-1])
        verdict = json.load(open(os.path.join(run, "verdict.json")))
        events = json.load(open(os.path.join(run, "nemesis.json")))
        summary = open(os.path.join(run, "summary.txt")).read()
    except (IndexError, OSError, ValueError):
        # The harness failed before it could judge (exit 3): counted, never skipped.
        r = rows["harness error"]
        r["runs"] += 1
        r["unexpected"] += 1
        continue
    nodes = next((l.split()[1].rstrip(",") for l in summary.splitlines() if l.startswith("nodes ")), "?")
    if name.startswith("planted-"):
        key = "planted " + name[len("planted-"):]
    else:
        key = f"{families[(int(name[1:]) - 1) % 9]} on {nodes}"
    r = rows[key]
    r["runs"] += 1
    s = verdict["verdict"]["summary"]
    r["ops"] += s.get("ops_ok", 0) + s.get("ops_unknown", 0) + s.get("ops_refused", 0)
    r["anomalies"] += sum(s.get("anomalies", {}).values()) + s.get("keys_illegal", 0) + len(verdict.get("harness_anomalies", []))
    r["unexpected"] += expect != rc
    for e in events:
        if e["outcome"]["outcome"] == "installed":
            r["faults"][e["fault"]] += 1
    for w in verdict["availability"]["per_kind"]:
        r["windows"][w["kind"]] = max(r["windows"][w["kind"]], w["longest_ms"])
print()
print(f"{'schedule':<30} {'runs':>5} {'ops':>9} {'anomalies':>9} {'unexpected':>10}  per fault kind: installed/longest write gap ms")
tot = {"runs": 0, "ops": 0, "anomalies": 0, "unexpected": 0}
allf = defaultdict(int)
for key in sorted(rows):
    r = rows[key]
    for k in tot:
        tot[k] += r[k]
    for f, n in r["faults"].items():
        allf[f] += n
    kinds = sorted(set(r["faults"]) | {k for k in r["windows"] if k != "none"})
    detail = ", ".join(f"{k} {r['faults'].get(k, 0)}/{r['windows'].get(k, 0)}" for k in kinds)
    print(f"{key:<30} {r['runs']:>5} {r['ops']:>9} {r['anomalies']:>9} {r['unexpected']:>10}  {detail}")
print(f"{'total':<30} {tot['runs']:>5} {tot['ops']:>9} {tot['anomalies']:>9} {tot['unexpected']:>10}  "
      f"{sum(allf.values())} faults installed")
print("faults installed per kind: " + ", ".join(f"{k} {n}" for k, n in sorted(allf.items())))
print(f"suite: {tot['unexpected']} unexpected results")
sys.exit(1 if tot["unexpected"] else 0)
PY
rc=$?
echo "suite: $schedules schedules in $(mmss $((SECONDS - suite_start)))"
exit "$rc"
