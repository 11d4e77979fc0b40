#!/usr/bin/env bash
# The long schedule: every fault family alone, then all of them combined, on 3 and 5 nodes,
# for SEEDS seeds each (default 2), plus every planted bug, which must be caught. Prints one
# line per run and a final table; exits non-zero if any clean run is not valid (an anomaly, or
# exit 4: a single-node fault stopped writes for longer than the availability bound) or any
# planted bug escapes. Bounded: each run is --time TIME seconds (default 60) plus about 30 s.
# On a terminal it also prints, before each run, "schedule i/N", the time elapsed and an
# estimate of the time remaining; piped or in CI its output is as before.
#   SEEDS=5 TIME=90 scripts/jepsen-suite.sh
set -uo pipefail
cd "$(dirname "$0")/.."
seeds=${SEEDS:-2}
time=${TIME:-60}
profile=${IDEMRAFT_PROFILE:-release}
IDEMRAFT_PROFILE=$profile scripts/jepsen.sh --help >/dev/null || exit 3
target=${CARGO_TARGET_DIR:-target}
bin=("$target/$profile/idemraft-jepsen" --binary "$target/$profile/idemraft")
failures=0
# Progress: every run's planned length (its --time plus about 30 s), summed up front, so the
# remaining time is the planned remainder scaled by how fast the runs so far really went.
planned_total=$(( seeds * (2 * (6 * (time + 30) + 3 * time + 30) + 4 * (20 + 30)) ))
runs_total=$(( seeds * 18 ))
planned_done=0
run_index=0
suite_start=$SECONDS
mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
progress() { # name planned-seconds
  run_index=$((run_index + 1))
  [ -t 1 ] || return 0
  local elapsed=$((SECONDS - suite_start)) left
  if [ "$planned_done" -gt 0 ] && [ "$elapsed" -gt 0 ]; then
    left=$(( (planned_total - planned_done) * elapsed / planned_done ))
  else
    left=$((planned_total - planned_done))
  fi
  printf 'schedule %d/%d: %s; elapsed %s, estimated remaining %s\n' \
    "$run_index" "$runs_total" "$1" "$(mmss "$elapsed")" "$(mmss "$left")"
}
report() { printf '%-44s seed %-6s exit %s  %s\n' "$1" "$2" "$3" "$4"; }
run_one() { # name expect(0|1) time args...
  local name=$1 expect=$2 secs=$3; shift 3
  local out rc line
  progress "$name" $((secs + 30))
  # One directory per configuration, so every run's files survive the suite.
  local dir="$target/jepsen/suite/$(tr -c 'a-z0-9=\n-' '_' <<<"$name")"
  out=$("${bin[@]}" --out "$dir" "$@" 2>&1); rc=$?
  line=$(grep -E '^ops ' <<<"$out" | head -1)
  report "$name" "$seed" "$rc" "$line"
  # Faults that fired, as name×count.
  awk '/^faults /{on=1; next} on && /^  [a-z]/{split($2,c,"/"); printf "    %s x%s", $1, c[1]; next} on{exit}' <<<"$out"
  echo
  planned_done=$((planned_done + secs + 30))
  if [ "$rc" -ne "$expect" ]; then
    failures=$((failures + 1))
    grep -E '^(anomaly|invalid run|result|reproduce)' <<<"$out" | head -20
  fi
}
for seed in $(seq 1 "$seeds"); do
  for nodes in 3 5; do
    for faults in partition kill pause clock membership catch-up all; do
      # `all` has three times as many faults to give a turn each.
      t=$time; [ "$faults" = all ] && t=$((time * 3))
      run_one "nodes=$nodes faults=$faults" 0 "$t" --nodes "$nodes" --time "$t" --seed "$seed" --faults "$faults"
    done
  done
  run_one "planted skip-token-check" 1 20 --time 20 --seed "$seed" --faults kill-one --unsafe-planted-bugs skip-token-check
  run_one "planted local-clock" 1 20 --time 20 --seed "$seed" --faults kill-one --unsafe-planted-bugs local-clock
  run_one "planted ignore-leases" 1 20 --time 20 --seed "$seed" --faults pause-one --unsafe-planted-bugs ignore-leases
  run_one "planted stale-local-reads" 1 20 --time 20 --seed "$seed" --faults partition-one,partition-leader --unsafe-planted-bugs stale-local-reads
done
if [ -t 1 ]; then echo "suite: $runs_total runs in $(mmss $((SECONDS - suite_start)))"; fi
echo "suite: $failures unexpected results"
[ "$failures" -eq 0 ]
