#!/usr/bin/env bash
# The project's test command (README "Quick start"): every crate's tests, all green.
# Property tests and the crash test are seeded; a failure prints the seed to replay it.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace "$@"
