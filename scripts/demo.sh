#!/usr/bin/env bash
# The main job on a fresh machine with Docker: build corral, build the offline
# test image if it is missing, and run a command in a hardened sandbox.
#
#   scripts/demo.sh                      # runs a default command
#   scripts/demo.sh -- 'uname -a; id'    # runs yours
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-docker.sh
scripts/build-test-images.sh
cargo build --release -q -p corral-cli
if [ "${1:-}" = "--" ]; then shift; fi
if [ "$#" -eq 0 ]; then
  set -- 'echo "hello from $(hostname)"; id; grep -E "^(CapEff|NoNewPrivs)" /proc/self/status'
fi
exec target/release/corral run --image corral-test/busybox --memory 256m --network none --timeout 60 -- "$@"
