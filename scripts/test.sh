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
# CORRAL_TEST_KUBECONFIG names a cluster (see docs/book/src/development.md, "The engine
# contract"), and otherwise says each case is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-docker.sh
# gVisor: the engine contract and the trust attacks under runsc
# (contract_gvisor.rs, trust_gvisor.rs) are .ci/run's own step, not this run's.
scripts/ensure-gvisor.sh >/dev/null
# --net: the egress tests' sandbox and "internet" image (crates/corral-docker/tests/egress.rs);
# --python: the code-interpreter tests' image with a Jupyter kernel (clients/python/tests/test_code.py, test_e2b_code.py).
scripts/build-test-images.sh --net --python
# The registry the pull tests run on loopback (crates/corral-docker/tests/pull.rs).
scripts/ensure-registry.sh >/dev/null
# tmux: `corral top` is driven in a real terminal (crates/corral-cli/tests/top.rs);
# chromium and its driver: the dashboard is tested in a real headless browser
# (clients/python/tests/test_dashboard.py).
missing=()
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "test.sh: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || {
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    }
  else
    echo "test.sh: missing ${missing[*]} (apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi

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
cargo build --bin corral --bin corral-internet
# Three workers, a test file to each at a time (--dist loadfile: a file's
# module fixtures stay in one process): the tests mostly wait on sandboxes,
# so this takes a third of the serial time on two cores. Each worker starts
# its own `corral serve` and checks its own run's leftovers.
CORRAL_BIN="$PWD/target/debug/corral" target/pyenv/bin/python -m pytest -q -n 3 --dist loadfile clients/python/tests
echo "== the same e2b SDK tests under the oldest e2b SDK corral serves"
E2B_SDK_DIR="$PWD/target/pyenv/e2b-oldest" CORRAL_BIN="$PWD/target/debug/corral" \
  target/pyenv/bin/python -m pytest -q -n 2 -p no:cacheprovider clients/python/tests/test_e2b.py

echo "== the wheels and the service image as a user gets them (static debug build)"
scripts/test-dist.sh

left=$(docker ps -aq --filter label=corral.sandbox)
if [ -n "$left" ]; then
  echo "test.sh: containers left behind by the tests:" >&2
  docker ps -a --filter label=corral.sandbox >&2
  exit 1
fi
