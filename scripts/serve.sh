#!/usr/bin/env bash
# Starts corral's HTTP API (http://127.0.0.1:7070 unless told otherwise) after
# making sure of what it needs: a Docker daemon, the offline test image (the
# service's default image) and the corral binary. Arguments go to
# `corral serve` (see `corral serve --help`). Stop it with Ctrl-C: its
# sandboxes are removed on the way out.
#
#   scripts/serve.sh
#   scripts/serve.sh --listen 127.0.0.1:8080 --config my-corral.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-docker.sh
scripts/build-test-images.sh
cargo build -q --bin corral
exec target/debug/corral serve "$@"
