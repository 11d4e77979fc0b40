#!/usr/bin/env bash
# Runs the Python SDK's tests: creates sdk/python/.venv, installs the package (its gRPC stubs
# are generated from the repository's .proto during the install) with its test extras, and
# runs pytest: unit tests, the shared conformance scenarios and the failover tests on a
# 3-node cluster it starts itself on free loopback ports, and the TLS and bearer-token tests
# on a second such cluster that requires client certificates and tokens.
#
# The node binary is taken from $IDEMRAFT_BIN (a directory holding idemraft and idemctl),
# else from <repo>/target/debug. Exits nonzero on any failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bin="${IDEMRAFT_BIN:-$repo/target/debug}"

for exe in idemraft idemctl; do
    if [[ ! -x "$bin/$exe" ]]; then
        echo "sdk/python: the node binary $bin/$exe is missing." >&2
        echo "Build it with: cargo build -p idemraft-node -p idemctl" >&2
        echo "(or set IDEMRAFT_BIN to a directory holding idemraft and idemctl)" >&2
        exit 1
    fi
done

python="${PYTHON:-python3}"
venv="$here/.venv"
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# Not editable: the tests run against the package as a user installs it.
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps "$here"
"$venv/bin/python" -m pip install --quiet "$here[test]"

cd "$here"
export IDEMRAFT_BIN="$bin"
exec "$venv/bin/python" -m pytest -p no:cacheprovider "$@"
