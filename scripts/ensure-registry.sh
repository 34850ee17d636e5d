#!/usr/bin/env bash
# Makes sure Debian's `docker-registry` (the reference distribution registry)
# and `htpasswd` (apache2-utils: the logins of a registry that refuses
# anonymous pulls) are installed, for the tests that pull from a real
# registry on loopback (corral_testing::registry starts one per test with its
# own config and storage). Needs root for the install; prints the registry
# binary's path.
set -euo pipefail

registry_bin() {
  for bin in docker-registry registry /usr/bin/docker-registry; do
    if command -v "$bin" >/dev/null 2>&1; then
      command -v "$bin"
      return 0
    fi
  done
  return 1
}

missing=()
registry_bin >/dev/null || missing+=(docker-registry)
command -v htpasswd >/dev/null 2>&1 || missing+=(apache2-utils)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "ensure-registry: ${missing[*]} not installed and this is not root; apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "ensure-registry: installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  }
  # The package starts a system service on :5000; the tests run their own.
  if command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now docker-registry >/dev/null 2>&1 || true
  fi
fi
registry_bin
