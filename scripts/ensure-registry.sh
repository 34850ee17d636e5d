#!/usr/bin/env bash
# Makes sure Debian's `docker-registry` (the reference distribution registry)
# is installed, for the tests that pull from a real registry on loopback
# (corral_testing::registry starts one per test with its own config and
# storage). Needs root for the install; prints the binary's path.
set -euo pipefail

for bin in docker-registry registry /usr/bin/docker-registry; do
  if command -v "$bin" >/dev/null 2>&1; then
    command -v "$bin"
    exit 0
  fi
done
if [ "$(id -u)" != 0 ]; then
  echo "ensure-registry: docker-registry is not installed and this is not root; apt-get install docker-registry" >&2
  exit 1
fi
echo "ensure-registry: installing docker-registry" >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry >/dev/null 2>&1 || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry >/dev/null
}
# The package starts a system service on :5000; the tests run their own.
if command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi
command -v docker-registry
