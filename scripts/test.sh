#!/usr/bin/env bash
# The project's test command (README "Quick start"): every crate's tests, all green.
# Property tests and the crash test are seeded; a failure prints the seed to replay it.
# Ends with one summary line over all test binaries, so the last line tells the whole story.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace "$@" 2>&1 | tee "$log" || status=$?
passed=$(grep -E '^test result:' "$log" | sed -E 's/.* ([0-9]+) passed.*/\1/' | awk '{s+=$1} END {print s+0}')
failed=$(grep -E '^test result:' "$log" | sed -E 's/.* ([0-9]+) failed.*/\1/' | awk '{s+=$1} END {print s+0}')
echo "tests: ${passed} passed, ${failed} failed"
if [ "$status" -eq 0 ] && [ "$passed" -eq 0 ]; then
  echo "no test ran: that is a failure, not a pass" >&2
  exit 1
fi
exit "$status"
