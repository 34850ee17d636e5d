#!/usr/bin/env python3
"""Runs E2B's own Python SDK test suite against corral's E2B listener and
reports the outcome by class.

    scripts/python-env.sh && scripts/build-test-images.sh --net && cargo build --bin corral
    target/pyenv/bin/python scripts/e2b-suite.py --e2b E2B_CHECKOUT [-n 2] [-k EXPR]
        [--isolation gvisor] [--network none]

E2B_CHECKOUT is a clone of github.com/e2b-dev/E2B (a checkout, or a bare git
directory whose HEAD is used). Nothing of it is copied into this project: its
`packages/python-sdk/tests` and `pytest.ini` are extracted under
target/e2b-suite/ for the run. The SDK under test is the pinned one in
target/pyenv (scripts/python-constraints.txt), not the checkout's source.

What the run sets up, as a new user of corral would:
- an image `corral-test/e2b-base` built offline from corral-test/net: E2B's
  template `base` has a user `user` whose home /home/user is the working
  directory, bash, python3 and git;
- a `corral serve` of its own on free loopback ports, the E2B listener on,
  that image as the default (template `base`), and only the SDK's own
  environment (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY) pointing at it.
  `--isolation gvisor --network none` makes the service's sandboxes
  gVisor ones without network, where pause goes to disk and forks and
  full snapshots are live (processes and memory kept); `-k "fork or
  snapshot or pause or connect"` runs that part.

Every test falls in one class (CLASSES below, matched on the test's node id):
- `cloud`: needs E2B's cloud or the internet (template builds on E2B's
  builder, volumes and secrets on E2B's control plane, hosts outside this
  machine). Not run: some curl outside hosts from inside the sandbox, and
  nothing here sends traffic off this machine.
- `refused`: run; corral refuses what it tests by design (each with why).
  Counted apart; a pass there is reported too (the class is then stale).
- `differs`: run; corral's answer differs from envd's in a way named here.
- `skew`: run; the test (from the checkout's HEAD) mocks an SDK internal the
  pinned newest SDK no longer calls, so it fails against any service.
- everything else (`served`) is expected to pass.

It prints, for sync and async apart, passed/failed/skipped/errors per class,
then every failure outside `refused` with its first error line. The exit code
is 0 when nothing failed outside `cloud`, `refused`, `differs` and `skew`. At the end no
sandbox of the run is left (checked by label).
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "clients" / "python"))

from corral.testing import LocalServer, docker_ids, free_port  # noqa: E402

IMAGE = "corral-test/e2b-base"
RUN_LABEL = "e2b-suite.run"
TOKEN = "e2b-suite-token"
# E2B's template `base`, as far as an offline build gets: user `user` at
# /home/user, bash, python3 (also as `python`), git.
DOCKERFILE = (
    "FROM corral-test/net\n"
    "RUN useradd -m -s /bin/bash -u 1000 user && ln -s python3 /usr/bin/python\n"
    "USER user\n"
    "WORKDIR /home/user\n"
    "ENV HOME=/home/user\n"
)
DOCKERFILE_HASH = hashlib.sha256(DOCKERFILE.encode()).hexdigest()[:16]

# (pattern on the node id relative to tests/, class, why). First match wins.
CLOUD = "cloud"
REFUSED = "refused"
SKEW = "skew"
DIFFERS = "differs"
SERVED = "served"
THREE_EVENTS = (
    "expects exactly 3 events for a file written through envd (its write path also changes the "
    "owner, a CHMOD); corral's watcher reports what its listings show: CREATE and WRITE"
)
CLASSES: List[Tuple[str, str, str]] = [
    ("*template_sync/*", CLOUD, "builds templates on E2B's template builder"),
    ("*template_async/*", CLOUD, "builds templates on E2B's template builder"),
    ("*volume_sync/*", CLOUD, "volumes live on E2B's control plane"),
    ("*volume_async/*", CLOUD, "volumes live on E2B's control plane"),
    ("*secret_sync/*", CLOUD, "secrets live on E2B's control plane"),
    ("*secret_async/*", CLOUD, "secrets live on E2B's control plane"),
    ("shared/git/*", CLOUD, "clones and pushes to hosts outside this machine"),
    ("*test_internet_access.py::*", CLOUD, "curls hosts outside this machine from the sandbox"),
    ("*test_network.py::*", CLOUD,
     "curls 1.1.1.1 and 8.8.8.8 from the sandbox, or fetches https://PORT-ID.DOMAIN through E2B's edge"),
    ("*test_egress_proxy.py::*", CLOUD, "an egress proxy on E2B's side"),
    ("*test_host.py::*httpbin*", CLOUD, "the httpbin template from E2B's cloud"),
    ("*test_host.py::test_ping_server", CLOUD,
     "fetches https://PORT-ID.DOMAIN: TLS and wildcard DNS of E2B's edge (get_host is served; "
     "corral's own test_e2b_mapped.py fetches it over http)"),
    ("*test_config_propagation.py::test_connect_sets_stable_host_routing_headers", CLOUD,
     "asserts the SDK's default cloud address, https://sandbox.e2b.app, which E2B_SANDBOX_URL replaces"),
    ("*test_metadata.py::test_write_file_without_metadata", SERVED, ""),
    ("*test_metadata.py::test_write_rejects_invalid_metadata", SERVED, ""),
    ("*test_metadata.py::*", REFUSED,
     "file metadata (user extended attributes, files.write(metadata=), envd 0.6.2): corral reports "
     "envd 0.5.7 and neither keeps nor lists them"),
    ("*test_watch.py::*_with_entry_info", REFUSED,
     "entry info in watch events (envd 0.6.3): corral's watcher compares listings; the SDK asks only a newer envd"),
    ("*test_watch.py::*_with_network_mounts_allowed", REFUSED,
     "allow_network_mounts (envd 0.6.4): the SDK asks only a newer envd"),
    ("*test_env_vars.py::test_bash_command_scoped_env_vars", REFUSED,
     "runs sudo: corral's commands run with no_new_privs, so no setuid program raises privileges"),
    ("*test_create.py::test_mcp_gateway_start_failure_kills_created_sandbox", REFUSED,
     "mcp (E2B's MCP gateway in the sandbox) is refused by name before anything is created"),
    ("*test_create.py::test_auto_pause_filesystem_only_reboots", REFUSED,
     "autoPauseMemory false: corral's pause freezes memory; a file-system-only pause is refused by name"),
    ("*test_create.py::test_auto_resume_wakes_on_http_request", REFUSED,
     "autoResume: a paused sandbox resumes on connect, not on traffic (refused by name)"),
    ("*test_snapshot_filesystem_only.py::test_pause_filesystem_only", REFUSED,
     "pause(keep_memory=False): refused by name (501 naming memory), the sandbox left running"),
    ("*test_watch.py::test_watch_iterated", DIFFERS, THREE_EVENTS),
    ("sync/*test_watch.py::test_watch_recursive_directory_changes", DIFFERS, THREE_EVENTS),
    ("*test_connect.py::test_connect_normalizes_unset_tokens", SKEW,
     "mocks POST /sandboxes/{id}/connect; the newest SDK calls /v2/sandboxes/{id}/connect, so the "
     "unmocked call reaches the service with a placeholder key"),
]


def classify(nodeid: str) -> Tuple[str, str]:
    for pattern, cls, why in CLASSES:
        if fnmatch.fnmatch(nodeid, pattern):
            return cls, why
    return SERVED, ""


def extract(e2b: Path, dest: Path) -> None:
    """The checkout's python-sdk tests and pytest.ini, into `dest`."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    sdk = e2b / "packages" / "python-sdk"
    if sdk.is_dir():
        shutil.copytree(sdk / "tests", dest / "tests")
        shutil.copy(sdk / "pytest.ini", dest / "pytest.ini")
        return
    # A bare git directory: its HEAD.
    archive = subprocess.run(
        ["git", f"--git-dir={e2b}", "archive", "HEAD", "packages/python-sdk/tests", "packages/python-sdk/pytest.ini"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest), "--strip-components=2"], input=archive, check=True)


def build_image() -> None:
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode == 0:
        if subprocess.run(["docker", "image", "inspect", "-f", "{{.Config.Labels}}", IMAGE],
                          capture_output=True, text=True).stdout.find(DOCKERFILE_HASH) >= 0:
            return
    dockerfile = DOCKERFILE + f"LABEL e2b-suite.dockerfile={DOCKERFILE_HASH}\n"
    with tempfile.TemporaryDirectory() as ctx:
        Path(ctx, "Dockerfile").write_text(dockerfile)
        subprocess.run(["docker", "build", "-q", "-t", IMAGE, ctx], check=True, stdout=subprocess.DEVNULL)
    print(f"e2b-suite: built {IMAGE}", file=sys.stderr)


def results(junit: Path) -> List[Tuple[str, str, str]]:
    """(node id, outcome, first line of the message) of every test case."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        classname = case.get("classname", "")
        name = case.get("name", "")
        path = classname.replace(".", "/")
        # classname is module path with dots; the node id we classify on is
        # the file path and the test name.
        nodeid = f"{path}.py::{name}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or child.text or "").strip().splitlines()[:1]
                message = message[0] if message else ""
                break
        out.append((nodeid, outcome, message))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--e2b", required=True, type=Path, help="a clone of e2b-dev/E2B (checkout or bare)")
    p.add_argument("-n", default="2", help="pytest-xdist workers (default 2)")
    p.add_argument("-k", default=None, help="pytest -k expression, to run a part")
    p.add_argument("--timeout", default="90", help="per-test timeout, seconds")
    p.add_argument("--binary", default=os.environ.get("CORRAL_BIN", str(ROOT / "target" / "debug" / "corral")))
    p.add_argument("--json", type=Path, help="also write the per-test outcomes here")
    p.add_argument("--isolation", choices=["container", "gvisor"], default=None,
                   help="the service's isolation tier (default: corral's, container)")
    p.add_argument("--network", choices=["bridge", "none"], default=None,
                   help="the service's sandbox network (default: corral's)")
    args = p.parse_args()

    work = ROOT / "target" / "e2b-suite"
    extract(args.e2b.resolve(), work)
    build_image()

    # Collect first, to leave the cloud class out by node id.
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/sync", "tests/async"],
        cwd=work,
        capture_output=True,
        text=True,
    )
    nodeids = [line.strip() for line in collected.stdout.splitlines() if "::" in line]
    if not nodeids:
        print(collected.stdout[-3000:], collected.stderr[-3000:], file=sys.stderr)
        print("e2b-suite: nothing collected", file=sys.stderr)
        return 2
    cloud = [n for n in nodeids if classify(n.removeprefix("tests/"))[0] == CLOUD]
    deselect = work / "deselect.txt"
    deselect.write_text("".join(f"{n}\n" for n in cloud))

    e2b_port = free_port()
    defaults = {"image": IMAGE, "labels": {RUN_LABEL: "1"}}
    if args.isolation:
        defaults["isolation"] = args.isolation
    if args.network:
        defaults["network"] = args.network
    config = {
        "defaults": defaults,
        "server": {"token": TOKEN, "e2b_listen": f"127.0.0.1:{e2b_port}"},
    }
    url = f"http://127.0.0.1:{e2b_port}"
    junit = work / "junit.xml"
    with LocalServer(args.binary, config=config) as server:
        env = dict(os.environ)
        env.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=TOKEN)
        env.pop("E2B_DOMAIN", None)
        env.pop("E2B_DEBUG", None)
        cmd = [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-n", args.n, "--timeout", args.timeout, f"--junitxml={junit}",
            "-o", "junit_family=xunit1",
            "tests/sync", "tests/async",
        ]
        for n in cloud:
            cmd += ["--deselect", n]
        if args.k:
            cmd += ["-k", args.k]
        run = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
        tail = server.log_tail(20)
    left = docker_ids(f"{RUN_LABEL}=1")
    if not junit.exists():
        print(run.stdout[-5000:], run.stderr[-3000:], file=sys.stderr)
        return 2

    counts: Dict[Tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    failures = []
    per_test = []
    for nodeid, outcome, message in results(junit):
        rel = nodeid.split("tests/", 1)[-1]
        cls, why = classify(rel)
        flavour = "async" if rel.startswith("async/") else "sync" if rel.startswith("sync/") else "shared"
        counts[(flavour, cls)][outcome] += 1
        per_test.append({"test": rel, "class": cls, "outcome": outcome, "message": message})
        if outcome in ("failed", "error") and cls == SERVED:
            failures.append((rel, message))
    for n in cloud:
        rel = n.removeprefix("tests/")
        flavour = "async" if rel.startswith("async/") else "sync"
        counts[(flavour, CLOUD)]["not run"] += 1

    print(f"E2B suite against corral ({len(nodeids)} collected)")
    for (flavour, cls), c in sorted(counts.items()):
        parts = ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
        print(f"  {flavour:6} {cls:8} {parts}")
    for wanted in (REFUSED, DIFFERS, SKEW):
        named = [t for t in per_test if t["class"] == wanted]
        if named:
            print(f"{wanted}:")
            for t in named:
                why = classify(t["test"])[1]
                stale = "  (PASSED: the class is stale)" if t["outcome"] == "passed" else ""
                print(f"  {t['test']} [{t['outcome']}]{stale}: {why}")
    if failures:
        print("failing outside the named classes:")
        for rel, message in failures:
            print(f"  {rel}: {message[:200]}")
    if left:
        print(f"e2b-suite: {len(left)} sandboxes left: {' '.join(left)}", file=sys.stderr)
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
    if args.json:
        args.json.write_text(json.dumps(per_test, indent=1))
    if run.returncode not in (0, 1):
        print(run.stdout[-3000:], file=sys.stderr)
        print(tail, file=sys.stderr)
    return 1 if failures or left else 0


if __name__ == "__main__":
    sys.exit(main())
