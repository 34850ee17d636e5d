#!/usr/bin/env bash
# Builds corral-agent:<version>, the image the Kubernetes backend's init
# container copies the agent from, offline: FROM scratch with nothing but
# the static agent binary (the same build the Docker backend embeds, in
# target/agent). No registry is needed to build it.
#
#   scripts/build-agent-image.sh              build (and tag) the image
#   scripts/build-agent-image.sh --save FILE  also `docker save` it to FILE
#   scripts/build-agent-image.sh --tag REF    tag it REF instead of corral-agent:<version>
#
# Then make it reachable for the cluster's nodes, e.g. `docker push REF`
# to your registry (and set kubernetes.agent_image: REF), `kind load
# docker-image corral-agent:<version>`, or `ctr -n k8s.io images import FILE`
# on each node.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
save=""
tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --save) save=${2:?--save needs a file}; shift 2 ;;
    --tag) tag=${2:?--tag needs an image reference}; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "build-agent-image: unknown argument '$1' (expected --save FILE or --tag REF)" >&2; exit 2 ;;
  esac
done

target=x86_64-unknown-linux-gnu
# crates/corral-agent/build_static.rs does the same build; cargo reuses it.
(cd "$root" && RUSTFLAGS="-C target-feature=+crt-static" cargo build --quiet --profile agent \
  -p corral-agent --target "$target" --target-dir "$root/target/agent")
agent="$root/target/agent/$target/agent/corral-agent"
version=$("$agent" --version | awk '{print $2}')
[ -n "$version" ] || { echo "build-agent-image: cannot read the agent's version" >&2; exit 1; }
tag=${tag:-corral-agent:$version}

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$agent" "$ctx/corral-agent"
cat > "$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY corral-agent /corral-agent
USER 65534:65534
ENTRYPOINT ["/corral-agent"]
DOCKERFILE
docker build --quiet --label "corral.version=$version" -t "$tag" "$ctx" >/dev/null
echo "built $tag ($(stat -c %s "$agent") byte agent)"
if [ -n "$save" ]; then
  docker save -o "$save" "$tag"
  echo "saved $tag to $save"
fi
