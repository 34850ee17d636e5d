#!/usr/bin/env bash
# Makes sure a Docker daemon answers: starts Debian's docker.io (installing it
# if needed) when none does. Needs root for the install and start.
set -euo pipefail

if docker info >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "ensure-docker: no daemon answers and this is not root; start Docker yourself" >&2
  exit 1
fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "ensure-docker: installing docker.io" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
fi
echo "ensure-docker: starting dockerd (log: /tmp/dockerd.log)" >&2
(dockerd >/tmp/dockerd.log 2>&1 &)
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  sleep 1
done
echo "ensure-docker: dockerd did not answer within 60 s; see /tmp/dockerd.log" >&2
tail -20 /tmp/dockerd.log >&2 || true
exit 1
