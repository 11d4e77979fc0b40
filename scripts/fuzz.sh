#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a fixed budget and prints, per target, the
# executions, executions per second, corpus size and findings (docs/fuzzing.md).
#
#   scripts/fuzz.sh [SECONDS]      # budget per target, default 60
#
# cargo-fuzz needs nightly compiler flags (-Z sanitizer, sancov passes); RUSTC_BOOTSTRAP=1 lets
# the stable toolchain accept them. Each target mutates a scratch corpus under fuzz/target/
# (kept between runs, never committed) seeded from the small committed fuzz/corpus/<target>/;
# crashes, leaks, timeouts and out-of-memory inputs land in fuzz/artifacts/<target>/.
# Exits 1 if any target found something.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
budget=${1:-60}
case "$budget" in
  '' | *[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS]" >&2; exit 2 ;;
esac
export RUSTC_BOOTSTRAP=1
export CARGO_TERM_COLOR=never

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

mapfile -t targets < <(cargo fuzz list)
echo "== building ${#targets[@]} targets (release, address sanitizer, coverage instrumentation)"
cargo fuzz build

# Options for libFuzzer:
# - a single allocation over 256 MiB is reported as a finding: no decoder should ever need one,
#   so it means a length prefix was trusted;
# - one input taking over 10 s is a finding too (the targets run each input in milliseconds).
fuzz_opts=(-max_total_time="$budget" -timeout=10 -malloc_limit_mb=256 -rss_limit_mb=2048 -print_final_stats=1)

summary=()
found=0
for t in "${targets[@]}"; do
  work="target/corpus/$t"
  log="target/fuzz-$t.log"
  mkdir -p "$work" "artifacts/$t" "corpus/$t"
  marker=$(mktemp)
  echo "== $t: ${budget}s"
  status=0
  cargo fuzz run "$t" "$work" "corpus/$t" -- "${fuzz_opts[@]}" >"$log" 2>&1 || status=$?
  stat() { grep -E "^stat::$1:" "$log" | awk '{print $2}' | tail -n 1; }
  execs=$(stat number_of_executed_units)
  rate=$(stat average_exec_per_sec)
  rss=$(stat peak_rss_mb)
  corp=$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -n 1 | sed 's/corp: //')
  new=$(find "artifacts/$t" -type f -newer "$marker" | wc -l)
  rm -f "$marker"
  findings="none"
  if [ "$status" -ne 0 ] || [ "$new" -gt 0 ]; then
    found=1
    findings="exit $status, $new new input(s) in fuzz/artifacts/$t/"
    grep -E '^(==[0-9]+==ERROR|thread .* panicked|SUMMARY)' "$log" | head -n 5 || true
  fi
  summary+=("$(printf '%-16s %10s execs %8s exec/s  corpus %-14s peak rss %5s MiB  findings: %s' \
    "$t" "${execs:-?}" "${rate:-?}" "${corp:-?}" "${rss:-?}" "$findings")")
done

echo "== summary (${budget}s per target; logs in fuzz/target/fuzz-<target>.log)"
printf '%s\n' "${summary[@]}"
exit "$found"
