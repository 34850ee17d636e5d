#!/usr/bin/env bash
# Builds corral:<version>, `corral serve` as a container image, offline:
# FROM scratch with the static `corral` binary (the one the wheel carries,
# built the same way: +crt-static on x86_64-unknown-linux-gnu, the
# in-container agent embedded), a passwd/group naming nobody, and the
# writable directories the service uses. It runs as 65534:65534 and serves
# on 0.0.0.0:7070; beyond loopback it needs a token. Against the host's
# Docker daemon:
#
#   docker run -d -p 7070:7070 -e CORRAL_TOKEN=$(openssl rand -hex 32) \
#     -v /var/run/docker.sock:/var/run/docker.sock \
#     --group-add $(stat -c %g /var/run/docker.sock) corral:0.1.0
#
# deploy/kubernetes/serve.yaml runs the same image in a cluster.
#
#   scripts/build-service-image.sh                 release build, tag corral:<version>
#   scripts/build-service-image.sh --dev           debug build (quicker to build)
#   scripts/build-service-image.sh --binary FILE   use this static corral (e.g. a wheel's)
#   scripts/build-service-image.sh --tag REF       tag REF instead
#   scripts/build-service-image.sh --save FILE     also `docker save` it to FILE
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

profile=release
binary=""
tag=""
save=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dev) profile=dev; shift ;;
    --binary) binary=${2:?--binary needs a file}; shift 2 ;;
    --tag) tag=${2:?--tag needs an image reference}; shift 2 ;;
    --save) save=${2:?--save needs a file}; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "build-service-image: unknown argument '$1' (expected --dev, --binary FILE, --tag REF or --save FILE)" >&2; exit 2 ;;
  esac
done

if [ -z "$binary" ]; then
  target=x86_64-unknown-linux-gnu
  dir=release
  [ "$profile" = dev ] && dir=debug
  (cd "$root" && RUSTFLAGS="-C target-feature=+crt-static" cargo build --quiet --profile "$profile" \
    -p corral-cli --bin corral --target "$target")
  binary="$root/target/$target/$dir/corral"
fi
[ -x "$binary" ] || { echo "build-service-image: '$binary' is not an executable" >&2; exit 1; }
# FROM scratch has no loader or libc: the binary must need none.
if readelf -l "$binary" | grep -q 'Requesting program interpreter'; then
  echo "build-service-image: '$binary' is dynamically linked; build it with -C target-feature=+crt-static" >&2
  exit 1
fi
version=$("$binary" --version | awk '{print $2}')
[ -n "$version" ] || { echo "build-service-image: cannot read the binary's version" >&2; exit 1; }
tag=${tag:-corral:$version}

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/root/etc" "$ctx/root/tmp" "$ctx/root/var/lib/corral" "$ctx/root/usr/local/bin"
chmod 1777 "$ctx/root/tmp"
chmod 0700 "$ctx/root/var/lib/corral"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/var/lib/corral:/sbin/nologin\n' > "$ctx/root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$ctx/root/etc/group"
cp "$binary" "$ctx/root/usr/local/bin/corral"
cat > "$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY root/ /
# The state directory (seal key, runtime files, snapshots) is the service's.
COPY --chown=65534:65534 root/var/lib/corral /var/lib/corral
ENV HOME=/var/lib/corral
USER 65534:65534
EXPOSE 7070
ENTRYPOINT ["/usr/local/bin/corral"]
CMD ["serve", "--quiet", "--listen", "0.0.0.0:7070"]
DOCKERFILE
docker build --quiet --label "corral.version=$version" -t "$tag" "$ctx" >/dev/null
echo "built $tag ($(stat -c %s "$binary") byte corral)"
if [ -n "$save" ]; then
  docker save -o "$save" "$tag"
  echo "saved $tag to $save"
fi
