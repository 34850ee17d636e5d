#!/usr/bin/env bash
# Runs every test: unit tests, the real-daemon integration tests, and the
# Python client's and MCP server's tests against a real `corral serve` /
# `corral mcp`. Sets up what they need first (a daemon, the offline test
# images, a Python venv at target/pyenv). Extra arguments go to cargo test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-docker.sh
scripts/build-test-images.sh
cargo test --workspace --all-targets --no-fail-fast "$@"

echo "== Python client and MCP tests (real corral serve / corral mcp)"
scripts/python-env.sh
cargo build --bin corral
CORRAL_BIN="$PWD/target/debug/corral" target/pyenv/bin/python -m pytest -q clients/python/tests

left=$(docker ps -aq --filter label=corral.sandbox)
if [ -n "$left" ]; then
  echo "test.sh: containers left behind by the tests:" >&2
  docker ps -a --filter label=corral.sandbox >&2
  exit 1
fi
