#!/usr/bin/env bash
# Makes gVisor usable as corral's `isolation: gvisor` tier on the local Docker
# daemon: installs Debian's `runsc` if missing, registers it in
# /etc/docker/daemon.json under `runtimes.runsc` (every other key of the file
# is kept), and reloads dockerd with SIGHUP (never a restart: running
# containers stay up). Idempotent: a second run changes nothing and sends no
# signal. Needs root. Ends by starting one container under runsc and prints
# the runtime name on success.
#
# runsc's own network stack cannot start containers on these machines
# (Firecracker VMs), so the runtime is registered with `--network=host`:
# gVisor then uses the sandbox's own network namespace through the host
# stack, and the container still gets Docker's bridge network and isolation.
# Override the flags with CORRAL_GVISOR_ARGS (space-separated).
set -euo pipefail

runtime=runsc
config=${DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}
read -r -a args <<<"${CORRAL_GVISOR_ARGS:---network=host}"

if ! command -v runsc >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "ensure-gvisor: runsc not installed and this is not root; apt-get install runsc" >&2
    exit 1
  fi
  echo "ensure-gvisor: installing runsc" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >/dev/null 2>&1 || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runsc >/dev/null
  }
fi
if ! command -v jq >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    echo "ensure-gvisor: jq is needed to edit $config; apt-get install jq" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq >/dev/null 2>&1 || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq >/dev/null
  }
fi
path=$(command -v runsc)

args_json=$(printf '%s\n' "${args[@]}" | jq -R . | jq -s .)
current='{}'
[ -s "$config" ] && current=$(cat "$config")
wanted=$(jq --arg name "$runtime" --arg path "$path" --argjson args "$args_json" \
  '.runtimes[$name] = {path: $path, runtimeArgs: $args}' <<<"$current")
if [ "$(jq -S . <<<"$current")" != "$(jq -S . <<<"$wanted")" ]; then
  mkdir -p "$(dirname "$config")"
  tmp=$(mktemp "$config.XXXXXX")
  jq . <<<"$wanted" >"$tmp"
  mv "$tmp" "$config"
  pid=$(pgrep -o -x dockerd || true)
  if [ -z "$pid" ]; then
    echo "ensure-gvisor: wrote $config but no dockerd is running; start it to pick up runtime $runtime" >&2
    exit 1
  fi
  echo "ensure-gvisor: registered $runtime ($path ${args[*]}) in $config; reloading dockerd ($pid) with SIGHUP" >&2
  kill -HUP "$pid"
fi

for _ in $(seq 1 50); do
  docker info --format '{{json .Runtimes}}' 2>/dev/null | jq -e --arg name "$runtime" 'has($name)' >/dev/null && break
  sleep 0.2
done
docker info --format '{{json .Runtimes}}' | jq -e --arg name "$runtime" 'has($name)' >/dev/null || {
  echo "ensure-gvisor: dockerd did not pick up runtime $runtime from $config after SIGHUP" >&2
  exit 1
}
image=${CORRAL_GVISOR_PROBE_IMAGE:-corral-test/busybox}
if docker image inspect "$image" >/dev/null 2>&1; then
  out=$(timeout 60 docker run --rm --runtime "$runtime" "$image" echo gvisor-ok 2>&1) || {
    echo "ensure-gvisor: runtime $runtime is registered but cannot start a container: $out" >&2
    exit 1
  }
  [ "$out" = gvisor-ok ] || { echo "ensure-gvisor: unexpected probe output: $out" >&2; exit 1; }
fi
echo "$runtime"
