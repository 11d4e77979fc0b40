#!/usr/bin/env bash
# Builds the TypeScript SDK (@idemraft/client) and runs all of its tests: unit tests, then the
# integration tests and the shared conformance scenarios, which start their own 3-node
# clusters of the `idemraft` binary on free loopback ports. Exits nonzero on any failure.
#
# The binaries are taken from $IDEMRAFT_BIN (a directory holding idemraft and idemctl),
# default <repo root>/target/debug.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${IDEMRAFT_BIN:-$root/target/debug}"

for exe in idemraft idemctl; do
  if [ ! -x "$bin/$exe" ]; then
    echo "run-tests.sh: $bin/$exe not found." >&2
    echo "  Build the node and the CLI first: cargo build -p idemraft-node -p idemctl --bins" >&2
    echo "  (or point IDEMRAFT_BIN at a directory holding idemraft and idemctl)." >&2
    exit 1
  fi
done
IDEMRAFT_BIN="$(cd "$bin" && pwd)"
export IDEMRAFT_BIN

command -v node >/dev/null || { echo "run-tests.sh: node (>= 18) is not installed" >&2; exit 1; }
cd "$here"
# `npm ci` also builds the package (its prepare script); the explicit build below keeps this
# script correct if that ever changes.
if [ -f package-lock.json ]; then
  npm ci --no-audit --no-fund
else
  npm install --no-audit --no-fund
fi
npm run build
npm test
