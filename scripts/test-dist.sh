#!/usr/bin/env bash
# corral as a user gets it, the wheels and the service image:
# 1. installs the wheels into a new venv with cargo's target dir and
#    ~/.cargo/bin off PATH (no Rust toolchain to be found), runs
#    `corral run` on the daemon, starts the venv's `corral serve` in the
#    background on a free port and runs the README's first Python example
#    and the quickstart example (examples/python/quickstart.py) through it;
# 2. builds the service image from the binary the wheel installed
#    (scripts/build-service-image.sh --binary), runs it against the host's
#    daemon socket on a free port with a token, runs the example through it
#    and stops it (its sandboxes go with it); the image is removed after.
# Needs a Docker daemon and the offline test images
# (scripts/build-test-images.sh).
#
#   scripts/test-dist.sh                 builds the wheels first (scripts/build-wheel.sh --dev)
#   scripts/test-dist.sh --wheels DIR    installs the ones in DIR instead
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

wheels=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) wheels=${2:?--wheels needs a directory}; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "test-dist: unknown argument '$1' (expected --wheels DIR)" >&2; exit 2 ;;
  esac
done
if [ -z "$wheels" ]; then
  wheels=target/wheel-dist
  scripts/build-wheel.sh --dev --out "$wheels" >/dev/null
fi
wheels=$(cd "$wheels" && pwd)

work=$(mktemp -d)
serve_pid=""
image="corral-test/service:test-dist-$$"
service=""
cleanup() {
  if [ -n "$serve_pid" ]; then
    kill -TERM "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
  fi
  if [ -n "$service" ]; then
    docker stop -t 30 "$service" >/dev/null 2>&1 || true
    docker rm -f "$service" >/dev/null 2>&1 || true
  fi
  docker rmi "$image" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== installing $(cd "$wheels" && ls corral-*.whl corral_client-*.whl | tr '\n' ' ')into a new venv"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check -c scripts/wheel-constraints.txt \
  "$wheels"/corral-*.whl "$wheels"/corral_client-*.whl

# The user's machine: the venv first, then PATH without cargo's binaries
# and this checkout's build output.
clean_path=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -e '\.cargo/bin' -e "^$root/target" | paste -sd: -)
export PATH="$work/venv/bin:$clean_path"
unset CARGO CARGO_HOME CARGO_TARGET_DIR RUSTUP_HOME CORRAL_BIN CORRAL_CONFIG CORRAL_TOKEN CORRAL_URL CORRAL_ENDPOINT
if command -v cargo >/dev/null 2>&1 || command -v rustc >/dev/null 2>&1; then
  echo "test-dist: a Rust toolchain is still on PATH ($(command -v cargo rustc | tr '\n' ' '))" >&2
  exit 1
fi
[ "$(command -v corral)" = "$work/venv/bin/corral" ] || {
  echo "test-dist: corral on PATH is '$(command -v corral)', not the venv's" >&2
  exit 1
}
corral --version
cd "$work"   # away from the checkout, so `import corral` is the installed one

echo "== corral run (the daemon directly)"
out=$(timeout 120 corral run --image corral-test/busybox -- echo ran-from-the-wheel)
[ "$out" = "ran-from-the-wheel" ] || { echo "test-dist: corral run printed '$out'" >&2; exit 1; }

echo "== corral serve, then examples/python/quickstart.py through it"
port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export CORRAL_RUNTIME_DIR="$work/runtime" CORRAL_URL="http://127.0.0.1:$port"
corral serve --quiet --listen "127.0.0.1:$port" >"$work/serve.log" 2>&1 &
serve_pid=$!
wait_healthy() {
  python - <<'PY'
import time, corral
deadline = time.monotonic() + 60
while True:
    try:
        assert corral.Client(retry=None).health().ok
        break
    except corral.CorralError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.2)
PY
}
wait_healthy || { cat "$work/serve.log" >&2; exit 1; }
python -c 'import corral, sys; print("import corral:", corral.__file__); sys.exit(0 if "/venv/" in corral.__file__ else 1)'
# Prints the example's output on stderr and its sandbox's container id.
quickstart() {
  timeout 180 python "$root/examples/python/quickstart.py" >"$work/quickstart.out"
  cat "$work/quickstart.out" >&2
  grep -q '^hello from ' "$work/quickstart.out" || { echo "test-dist: the example printed no greeting" >&2; exit 1; }
  sed -n 's/^sandbox .* (container \([0-9a-f]*\),.*/\1/p' "$work/quickstart.out"
}
# The README's first Python example, as a new user pastes it: the first
# fenced python block of README.md, run by the venv's Python.
echo "== README.md's first Python example through the wheel's corral serve"
python - "$root/README.md" >"$work/readme.py" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"^```python\n(.*?)^```", text, re.S | re.M)
if not m:
    sys.exit("test-dist: README.md has no python block")
print(m.group(1), end="")
PY
timeout 180 python "$work/readme.py" >"$work/readme.out" || { echo "test-dist: README.md's first Python example failed" >&2; exit 1; }
cat "$work/readme.out"
grep -q '^3 hello' "$work/readme.out" || { echo "test-dist: README.md's first Python example printed no '3 hello'" >&2; exit 1; }
container=$(quickstart)

kill -TERM "$serve_pid"
wait "$serve_pid" || { echo "test-dist: corral serve exited with $?" >&2; cat "$work/serve.log" >&2; exit 1; }
serve_pid=""
if [ -n "$container" ] && [ -n "$(docker ps -aq --filter "id=$container")" ]; then
  echo "test-dist: the example's sandbox $container was left behind" >&2
  exit 1
fi
echo "test-dist: the wheel: ok"

echo "== the service image (FROM scratch, the wheel's binary) against the host's daemon socket"
"$root/scripts/build-service-image.sh" --binary "$work/venv/bin/corral" --tag "$image"
port=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export CORRAL_URL="http://127.0.0.1:$port"
CORRAL_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(32))')
export CORRAL_TOKEN
sock=/var/run/docker.sock
# The port inside is the one published: the service answers to Host
# names with its listen port only.
service=$(docker run -d --label corraltest=service-image -p "127.0.0.1:$port:$port" -e CORRAL_TOKEN \
  -v "$sock:$sock" --group-add "$(stat -c %g "$sock")" "$image" serve --quiet --listen "0.0.0.0:$port")
wait_healthy || { docker logs "$service" >&2; exit 1; }
container=$(quickstart)
docker stop -t 30 "$service" >/dev/null
status=$(docker inspect -f '{{.State.ExitCode}}' "$service")
[ "$status" = 0 ] || { echo "test-dist: the service container exited with $status" >&2; docker logs "$service" >&2; exit 1; }
docker rm "$service" >/dev/null
service=""
if [ -n "$container" ] && [ -n "$(docker ps -aq --filter "id=$container")" ]; then
  echo "test-dist: the example's sandbox $container was left behind by the service image" >&2
  exit 1
fi
echo "test-dist: ok"
