#!/usr/bin/env bash
# Runs every test: unit tests, the real-daemon integration tests (Docker, and
# Podman's compatible socket), and the Python client's and MCP server's tests
# against a real `corral serve` / `corral mcp`. Sets up what they need first
# (a daemon, the offline test images, Podman's service, a Python venv at
# target/pyenv with the adapters' frameworks from PyPI, pinned: mini-swe-agent,
# Ray, hermes-agent). Extra arguments go to cargo test.
#
# The engine contract (corral_testing::contract) runs against the Docker
# daemon here; its Kubernetes instantiation runs too when
# CORRAL_TEST_KUBECONFIG names a cluster (see README, "The engine
# contract"), and otherwise says each case is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-docker.sh
# --net: the egress tests' sandbox and "internet" image (crates/corral-docker/tests/egress.rs).
scripts/build-test-images.sh --net
# The registry the pull tests run on loopback (crates/corral-docker/tests/pull.rs).
scripts/ensure-registry.sh >/dev/null

# Podman's Docker-compatible socket, for crates/corral-docker/tests/podman.rs
# (installed when missing; stopped when the tests end).
mkdir -p target
podman_sock=/tmp/corral-podman-$$.sock
scripts/podman-service.sh "$podman_sock" >target/podman-service.log 2>&1 &
podman_pid=$!
trap 'kill $podman_pid 2>/dev/null || true; rm -f "$podman_sock"' EXIT
for _ in $(seq 1 300); do
  [ -S "$podman_sock" ] && podman --url "unix://$podman_sock" version >/dev/null 2>&1 && break
  if ! kill -0 $podman_pid 2>/dev/null; then
    echo "test.sh: the Podman service did not start:" >&2
    cat target/podman-service.log >&2
    exit 1
  fi
  sleep 1
done
export CORRAL_TEST_PODMAN="unix://$podman_sock"

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
