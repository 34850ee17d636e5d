#!/usr/bin/env bash
# Runs the Python client's tests (clients/python/tests) against a real
# `corral serve` on the real daemon: sets up the daemon, the offline test
# images, the corral binary and the Python venv (scripts/python-env.sh)
# first. Arguments go to pytest.
#
#   scripts/test-python.sh
#   scripts/test-python.sh -k stream -x
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-docker.sh
scripts/build-test-images.sh --net --python
cargo build -q --bin corral --bin corral-internet
scripts/python-env.sh
export CORRAL_BIN="${CORRAL_BIN:-$PWD/target/debug/corral}"
export CORRAL_INTERNET_BIN="${CORRAL_INTERNET_BIN:-$PWD/target/debug/corral-internet}"
cd clients/python
status=0
../../target/pyenv/bin/python -m pytest -q "$@" || status=$?
if [ $# -eq 0 ]; then
  # The e2b SDK tests again under the oldest SDK corral serves.
  E2B_SDK_DIR="$PWD/../../target/pyenv/e2b-oldest" \
    ../../target/pyenv/bin/python -m pytest -q -p no:cacheprovider tests/test_e2b.py || status=$?
fi
left=$(docker ps -aq --filter label=corraltest=pyclient)
if [ -n "$left" ]; then
  echo "test-python.sh: containers left behind by the tests:" >&2
  docker ps -a --filter label=corraltest=pyclient >&2
  docker rm -f $left >/dev/null 2>&1 || true
  exit 1
fi
exit "$status"
