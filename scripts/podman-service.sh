#!/usr/bin/env bash
# Serves Podman's Docker-compatible API on a Unix socket, set up for corral's
# Podman tests, in the foreground (stop it with a signal):
#
#   scripts/podman-service.sh [SOCKET]        # default /tmp/corral-podman.sock
#
# Installs Debian's podman when missing (needs root), copies the offline test
# image corral-test/busybox from Docker into Podman's store, and runs the
# service with its own containers.conf: Podman's default ulimits (nofile and
# nproc at the host's hard limits) cannot be set by runc on machines that are
# themselves containers ("error setting rlimit type 7: operation not
# permitted"), so the test service lowers them to 4096. Nothing under /etc is
# changed.
set -euo pipefail
cd "$(dirname "$0")/.."
sock=${1:-/tmp/corral-podman.sock}

if ! command -v podman >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "podman-service: podman is not installed and this is not root; install it yourself" >&2
    exit 1
  fi
  echo "podman-service: installing podman" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman >/dev/null
fi

if ! podman image exists corral-test/busybox; then
  scripts/build-test-images.sh >&2
  docker save corral-test/busybox | podman load -q >&2
fi

mkdir -p target/podman
conf=$PWD/target/podman/containers.conf
printf '[containers]\ndefault_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]\n' > "$conf"
rm -f "$sock"
case "$sock" in /*) ;; *) sock=$PWD/$sock ;; esac
export CONTAINERS_CONF=$conf
# The service's helpers (conmon) may leave files in its working directory
# (an `oom` marker after a container's OOM kill): keep them out of the tree.
cd target/podman
exec podman system service --time=0 "unix://$sock"
