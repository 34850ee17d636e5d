#!/usr/bin/env bash
# Builds corral's wheels into dist/ (or --out DIR), offline from this
# checkout (the build tools come from PyPI, pinned in scripts/wheel-tools.txt):
#   corral-<v>-py3-none-manylinux_2_17_x86_64.whl  the `corral` binary
#       (CLI, service, with the in-container agent embedded), built by
#       maturin statically linked (+crt-static on x86_64-unknown-linux-gnu,
#       as the agent is), so it needs no shared library and runs on any
#       x86_64 Linux; auditwheel verifies the tag;
#   corral_client-<v>-py3-none-any.whl  the Python client (clients/python),
#       which the binary wheel depends on.
# Then: pip install dist/*.whl  (corral on PATH, `import corral`).
#
#   scripts/build-wheel.sh              release build (minutes: a static
#                                       build of every crate)
#   scripts/build-wheel.sh --dev        debug build, same linking (what CI
#                                       tests; larger and slower binary)
#   scripts/build-wheel.sh --out DIR    write the wheels to DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

profile=release
out=dist
while [ $# -gt 0 ]; do
  case "$1" in
    --dev) profile=dev; shift ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "build-wheel: unknown argument '$1' (expected --dev or --out DIR)" >&2; exit 2 ;;
  esac
done

# The binary wheel pins the client wheel of the same version.
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
client_version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' clients/python/corral/_version.py)
pinned=$(sed -n 's/.*"corral-client==\([^"]*\)".*/\1/p' crates/corral-cli/pyproject.toml)
if [ "$version" != "$client_version" ] || [ "$version" != "$pinned" ]; then
  echo "build-wheel: versions disagree: Cargo.toml $version, clients/python/corral/_version.py" \
    "$client_version, corral-client==$pinned in crates/corral-cli/pyproject.toml" >&2
  exit 1
fi

tools=target/wheel-tools
if ! cmp -s scripts/wheel-tools.txt "$tools/.corral-stamp" 2>/dev/null; then
  echo "build-wheel: installing the build tools into $tools" >&2
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q --disable-pip-version-check -r scripts/wheel-tools.txt
  cp scripts/wheel-tools.txt "$tools/.corral-stamp"
fi

mkdir -p "$out"
rm -f "$out"/corral-"$version"-*.whl "$out"/corral_client-"$version"-*.whl

# The client: pure Python, built by its own backend (hatchling).
"$tools/bin/pip" wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
  -w "$out" clients/python

# The binary: an explicit --target keeps +crt-static off the build scripts
# and proc-macros (they must stay dynamic); maturin copies the binary into
# the wheel's scripts, so pip puts it on the venv's PATH.
target=x86_64-unknown-linux-gnu
profile_args=(--release)
[ "$profile" = dev ] && profile_args=(--profile dev)
RUSTFLAGS="-C target-feature=+crt-static" "$tools/bin/maturin" build --quiet --strip \
  -m crates/corral-cli/Cargo.toml --target "$target" "${profile_args[@]}" \
  --compatibility manylinux2014 --out "$out"

wheel=$(ls "$out"/corral-"$version"-*.whl)
# auditwheel reads the binary's dynamic section: a static binary needs no
# library outside the manylinux policy (none at all).
"$tools/bin/auditwheel" show "$wheel" | tee "$out/auditwheel.txt" >&2
grep -q 'manylinux_2_17_x86_64' "$out/auditwheel.txt" || {
  echo "build-wheel: auditwheel does not confirm manylinux_2_17_x86_64 for $wheel" >&2
  exit 1
}
ls -l "$out"/corral-"$version"-*.whl "$out"/corral_client-"$version"-*.whl
