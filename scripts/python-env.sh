#!/usr/bin/env bash
# Creates (or updates) the Python environment of the Python client's tests
# and benchmark: a venv at target/pyenv with the client installed editable
# (clients/python), pytest, pytest-asyncio, mcp, mini-swe-agent (pinned:
# the adapter tests run its real agent), ray and uv (pinned: the
# open-instruct switch is tested with Ray actors under `uv run`),
# hermes-agent (pinned: the hermes adapter is tested with its real terminal
# tool; its pins resolve together with the others), selenium (the dashboard
# is tested in headless chromium) and the e2b SDK (pinned: the newest in
# the venv, the oldest corral serves in $venv/e2b-oldest, for
# tests/test_e2b.py with E2B_SDK_DIR), e2b-code-interpreter (pinned:
# tests/test_e2b_code.py runs its run_code against code contexts),
# smolagents (pinned: tests/test_smolagents.py runs its E2BExecutor and a
# CodeAgent on corral through the E2B listener), pytest-timeout (every test runs
# under the per-test timeout of clients/python/pyproject.toml) and
# pytest-xdist (scripts/test.sh runs the test files on three workers). Every
# transitive version is pinned by scripts/python-constraints.txt (and
# scripts/python-constraints-e2b-oldest.txt for the oldest SDK), so a fresh
# machine installs what CI tested. Quick when nothing changed: a stamp of
# the inputs is kept in the venv.
#
#   scripts/python-env.sh          # then: target/pyenv/bin/python ...
#   PYTHON=python3.12 scripts/python-env.sh
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/pyenv
python=${PYTHON:-python3}
e2b_oldest="e2b==2.7.0"
constraints=scripts/python-constraints.txt
constraints_oldest=scripts/python-constraints-e2b-oldest.txt
reqs=(pytest pytest-asyncio pytest-timeout "pytest-xdist==3.8.0" mcp "mini-swe-agent==2.4.6" "ray==2.60.0" "uv==0.13.8" "hermes-agent==0.19.0" "selenium==4.27.1" "e2b==2.63.0" "e2b-code-interpreter==2.11.5" "smolagents==1.26.0" "python-dateutil<3" "rich==14.3.3")

if ! command -v "$python" >/dev/null 2>&1; then
  echo "python-env: $python not found (install python3 and python3-venv)" >&2
  exit 1
fi

stamp_of() {
  {
    echo "reqs: ${reqs[*]} oldest: $e2b_oldest"
    "$python" -c 'import sys; print(sys.version)'
    cat clients/python/pyproject.toml "$constraints" "$constraints_oldest"
  } | sha256sum | cut -d' ' -f1
}
want=$(stamp_of)

# The synchronous client (clients/python/corral/client.py, not in git) is
# written from the asyncio one; quick, and done on every run so an edit of
# aio.py reaches the editable install.
"$python" clients/python/tools/unasync.py

if [ -x "$venv/bin/python" ] && [ -f "$venv/.corral-stamp" ] && [ "$(cat "$venv/.corral-stamp")" = "$want" ] \
   && "$venv/bin/python" -c 'import corral, httpx, pytest, pytest_asyncio, pytest_timeout, xdist, mcp, minisweagent, ray, hermes_constants, selenium, e2b, e2b_code_interpreter, smolagents' >/dev/null 2>&1 \
   && [ -d "$venv/e2b-oldest/e2b" ] \
   && [ -x "$venv/bin/uv" ]; then
  echo "python-env: $venv is up to date"
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "python-env: creating $venv" >&2
  mkdir -p target
  if ! "$python" -m venv "$venv" 2>/dev/null; then
    # Debian's python3 lacks ensurepip without python3-venv.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      ver=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "python${ver}-venv" >/dev/null \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      rm -rf "$venv"
      "$python" -m venv "$venv"
    else
      echo "python-env: '$python -m venv' failed (install python3-venv)" >&2
      exit 1
    fi
  fi
fi

echo "python-env: installing the client and ${reqs[*]}" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
"$venv/bin/python" -m pip install -q --disable-pip-version-check -c "$constraints" -e clients/python "${reqs[@]}"
rm -rf "$venv/e2b-oldest"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-warn-conflicts --target "$venv/e2b-oldest" \
  -c "$constraints_oldest" "$e2b_oldest" "python-dateutil<3"
echo "$want" > "$venv/.corral-stamp"
echo "python-env: ready: $venv/bin/python"
