#!/usr/bin/env bash
# The project's test command (README "Quick start"): every crate's tests, then the SDK suites
# of other languages (each installs its packages from its registry on first use and runs the
# shared conformance scenarios against a 3-node cluster of the binaries just built, on free
# loopback ports). Property tests and the crash test are seeded; a failure prints the seed.
# Ends with one summary line over everything, so the last line tells the whole story.
#   scripts/test.sh [cargo test args]   IDEMRAFT_SKIP_SDKS=1 runs the Rust suites only
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
# The node's tests run the idemctl binary, which cargo test builds for no package of its own
# (the idemctl crate has no integration test): build every binary first.
cargo build -q --workspace --bins
cargo test --workspace "$@" 2>&1 | tee "$log" || status=$?
passed=$(grep -E '^test result:' "$log" | sed -E 's/.* ([0-9]+) passed.*/\1/' | awk '{s+=$1} END {print s+0}')
failed=$(grep -E '^test result:' "$log" | sed -E 's/.* ([0-9]+) failed.*/\1/' | awk '{s+=$1} END {print s+0}')
sdks=""
if [ "${IDEMRAFT_SKIP_SDKS:-0}" != "1" ]; then
  for sdk in python typescript; do
    echo "== SDK suite: $sdk"
    if IDEMRAFT_BIN="$PWD/target/debug" "sdk/$sdk/run-tests.sh"; then
      sdks="$sdks, $sdk SDK ok"
    else
      sdks="$sdks, $sdk SDK FAILED"
      status=1
    fi
  done
fi
echo "tests: ${passed} passed, ${failed} failed${sdks}"
if [ "$status" -eq 0 ] && [ "$passed" -eq 0 ]; then
  echo "no test ran: that is a failure, not a pass" >&2
  exit 1
fi
exit "$status"
