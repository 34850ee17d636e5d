#!/usr/bin/env bash
# Builds the images corral's tests, benchmarks and demo use, offline.
#
# No registry is needed: every image is assembled from Debian packages on this
# machine and `docker build`/`docker import`ed locally. Images that already
# exist are kept (pass --force to rebuild).
#
#   corral-test/busybox   FROM scratch + busybox-static (+ bash-static): a few MB
#   corral-test/scratch   FROM scratch with nothing but a marker file: no shell
#   corral-test/debian    debootstrap minbase bookworm (bash, coreutils, python3);
#                         only with --debian, it takes minutes
#   corral-test/net       debootstrap minbase bookworm with curl, git, pip and
#                         ca-certificates (the egress tests' sandbox and "the
#                         internet"'s servers); only with --net, minutes
#   corral-test/python    debootstrap minbase bookworm with Debian's ipykernel,
#                         matplotlib, pandas and numpy (the code-context tests'
#                         sandbox: a Jupyter kernel without a registry); only
#                         with --python, minutes
set -euo pipefail

force=0
debian=0
net=0
python=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    --debian) debian=1 ;;
    --net) net=1 ;;
    --python) python=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "build-test-images: unknown argument '$arg' (expected --force, --debian, --net or --python)" >&2; exit 2 ;;
  esac
done

have_image() { [ "$force" = 0 ] && docker image inspect "$1" >/dev/null 2>&1; }

need_pkg() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "build-test-images: installing ${missing[*]}" >&2
    if [ "$(id -u)" != 0 ]; then
      echo "build-test-images: need root to install ${missing[*]} (or install them yourself)" >&2
      exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT

if ! have_image corral-test/busybox; then
  need_pkg busybox-static bash-static
  mkdir -p "$ctx/busybox/rootfs/bin" "$ctx/busybox/rootfs/usr/bin" "$ctx/busybox/rootfs/sbin" \
           "$ctx/busybox/rootfs/root" "$ctx/busybox/rootfs/home/user" "$ctx/busybox/rootfs/etc" \
           "$ctx/busybox/rootfs/tmp" "$ctx/busybox/rootfs/var/tmp" "$ctx/busybox/rootfs/run"
  cp /bin/busybox "$ctx/busybox/rootfs/bin/busybox"
  cp /bin/bash-static "$ctx/busybox/rootfs/bin/bash"
  for applet in $(/bin/busybox --list); do
    [ -e "$ctx/busybox/rootfs/bin/$applet" ] || ln -s busybox "$ctx/busybox/rootfs/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$ctx/busybox/rootfs/etc/passwd"
  printf 'root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n' > "$ctx/busybox/rootfs/etc/group"
  cat > "$ctx/busybox/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY rootfs/ /
RUN ["/bin/busybox", "chown", "1000:1000", "/home/user"]
RUN ["/bin/busybox", "chmod", "1777", "/tmp", "/var/tmp"]
ENV PATH=/bin:/usr/bin:/sbin HOME=/root
CMD ["/bin/sh"]
DOCKERFILE
  docker build -q -t corral-test/busybox "$ctx/busybox" >/dev/null 2>"$ctx/build.log" || { cat "$ctx/build.log" >&2; exit 1; }
  echo "built corral-test/busybox"
fi

if ! have_image corral-test/scratch; then
  mkdir -p "$ctx/scratch"
  echo "corral scratch test image" > "$ctx/scratch/marker"
  printf 'FROM scratch\nCOPY marker /marker\n' > "$ctx/scratch/Dockerfile"
  docker build -q -t corral-test/scratch "$ctx/scratch" >/dev/null 2>"$ctx/build.log" || { cat "$ctx/build.log" >&2; exit 1; }
  echo "built corral-test/scratch"
fi

if [ "$debian" = 1 ] && ! have_image corral-test/debian; then
  need_pkg debootstrap
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  debootstrap --variant=minbase --include=python3,procps bookworm "$ctx/debian" "$mirror" >/dev/null
  tar -C "$ctx/debian" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - corral-test/debian >/dev/null
  echo "built corral-test/debian"
fi

if [ "$net" = 1 ] && ! have_image corral-test/net; then
  need_pkg debootstrap
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  debootstrap --variant=minbase --include=python3,python3-pip,curl,git,ca-certificates,procps \
    bookworm "$ctx/net" "$mirror" >/dev/null
  tar -C "$ctx/net" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - corral-test/net >/dev/null
  echo "built corral-test/net"
fi

if [ "$python" = 1 ] && ! have_image corral-test/python; then
  need_pkg debootstrap
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  debootstrap --variant=minbase --include=python3,procps bookworm "$ctx/python" "$mirror" >/dev/null
  # debootstrap's --include cannot resolve ipykernel's dependency tree; apt in
  # the chroot can.
  echo "deb $mirror bookworm main" > "$ctx/python/etc/apt/sources.list"
  mount -t proc proc "$ctx/python/proc"
  trap 'umount "$ctx/python/proc" 2>/dev/null || true; rm -rf --one-file-system "$ctx"' EXIT
  chroot "$ctx/python" apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive chroot "$ctx/python" apt-get install -y -qq --no-install-recommends \
    python3-ipykernel python3-matplotlib python3-pandas python3-numpy >/dev/null
  chroot "$ctx/python" apt-get clean
  umount "$ctx/python/proc"
  tar -C "$ctx/python" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - corral-test/python >/dev/null
  echo "built corral-test/python"
fi
