#!/usr/bin/env bash
# One seeded fault-injection run against real idemraft processes on 127.0.0.1:
#   scripts/jepsen.sh [--nodes 3|5] [--time SECS] [--seed N] [--faults LIST] [more idemraft-jepsen flags]
# Builds the node and the harness (release by default; IDEMRAFT_PROFILE=debug for a debug
# build), then runs `idemraft-jepsen --help`-documented flags as given. Exit code: 0 valid,
# 1 anomalies, 2 invalid run or undecided, 3 harness error, 4 writes stopped too long during a
# single-node fault. Run files land in target/jepsen/.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${IDEMRAFT_PROFILE:-release}
case "$profile" in
  release) cargo build --release -q -p idemraft-node -p idemraft-jepsen ;;
  debug) cargo build -q -p idemraft-node -p idemraft-jepsen ;;
  *) echo "IDEMRAFT_PROFILE must be release or debug, not '$profile'" >&2; exit 3 ;;
esac
target=${CARGO_TARGET_DIR:-target}
exec "$target/$profile/idemraft-jepsen" --binary "$target/$profile/idemraft" "$@"
