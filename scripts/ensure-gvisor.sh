#!/usr/bin/env bash
# Makes gVisor usable as corral's `isolation: gvisor` tier on the local Docker
# daemon: installs Debian's `runsc` if missing, registers it in
# /etc/docker/daemon.json under `runtimes.runsc` and `runtimes.runsc-live`
# (every other key of the file is kept), and reloads dockerd with SIGHUP.
# Idempotent: a second run changes nothing and sends no signal. Needs root.
# Ends by starting one container under runsc and prints the runtime name on
# success.
#
# runsc's own network stack cannot start containers on these machines
# (Firecracker VMs), so the runtime is registered with `--network=host`:
# gVisor then uses the sandbox's own network namespace through the host
# stack, and the container still gets Docker's bridge network and isolation.
# Override the flags with CORRAL_GVISOR_ARGS (space-separated).
#
# runsc cannot checkpoint a sandbox on the host stack ("checkpoint not
# supported when using hostinet"), so gVisor sandboxes without network run
# under `runsc-live` (`--network=none --overlay`: loopback only, and the
# root file system's changes held in the sandbox's memory, where a
# checkpoint takes them along). Live snapshots use the daemon's checkpoint
# API, which needs its `experimental` setting: that one is not reloadable,
# so when it is off this script sets it and restarts dockerd, but only
# while no container runs (otherwise it says so and live snapshots stay
# refused, by name, until the daemon restarts). CORRAL_NO_EXPERIMENTAL=1
# leaves the setting alone.
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
  '.runtimes[$name] = {path: $path, runtimeArgs: $args}
   | .runtimes[$name + "-live"] = {path: $path, runtimeArgs: ["--network=none", "--overlay"]}' <<<"$current")
if [ "${CORRAL_NO_EXPERIMENTAL:-}" != 1 ]; then
  wanted=$(jq '.experimental = true' <<<"$wanted")
fi
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
  echo "ensure-gvisor: registered $runtime ($path ${args[*]}) and $runtime-live in $config; reloading dockerd ($pid) with SIGHUP" >&2
  kill -HUP "$pid"
fi

# The experimental setting takes a restart.
if [ "$(jq -r '.experimental // false' "$config" 2>/dev/null)" = true ] &&
  [ "$(docker version --format '{{.Server.Experimental}}' 2>/dev/null)" != true ]; then
  if [ -n "$(docker ps -q)" ]; then
    echo "ensure-gvisor: dockerd needs a restart for its experimental setting (live snapshots); containers are running, so it is left to you" >&2
  else
    pid=$(pgrep -o -x dockerd || true)
    echo "ensure-gvisor: restarting dockerd ($pid) for its experimental setting (live snapshots)" >&2
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet docker 2>/dev/null; then
      systemctl restart docker
    else
      kill "$pid"
      for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
      done
      (setsid dockerd >/tmp/dockerd.log 2>&1 &)
    fi
    for _ in $(seq 1 60); do
      docker info >/dev/null 2>&1 && break
      sleep 1
    done
    docker info >/dev/null 2>&1 || {
      echo "ensure-gvisor: dockerd did not come back within 60 s; see /tmp/dockerd.log" >&2
      exit 1
    }
  fi
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
