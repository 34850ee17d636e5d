#!/usr/bin/env python3
"""Checks that a sandbox paused to disk comes back after the Docker daemon
restarts: a `corral serve` of its own (gVisor without network, the tier
whose pause is a checkpoint), a sandbox whose shell loop counts in memory,
`pause()`, dockerd stopped and started again, `resume()`, and the count
goes on from where it was (not from 1).

    scripts/ensure-gvisor.sh && scripts/build-test-images.sh --python && cargo build --bin corral
    target/pyenv/bin/python scripts/live-restart.py

It restarts the host's dockerd, so it is no CI step, and it refuses to
when any container runs (nor does it stop a daemon systemd manages: it
restarts that one with systemctl). Prints each step with its time; exits
0 when the count went on, 1 otherwise. No sandbox of the run is left.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "clients" / "python"))

import corral  # noqa: E402
from corral.testing import LocalServer, docker_ids  # noqa: E402

LABEL = "live-restart.run"
COUNTER = (
    "setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; "
    "sleep 0.1; done' </dev/null >/dev/null 2>&1 & sleep 1; cat /tmp/c"
)


def sh(*args: str) -> str:
    return subprocess.run(args, capture_output=True, text=True).stdout.strip()


def restart_dockerd() -> None:
    systemd = shutil.which("systemctl") is not None and subprocess.run(
        ["systemctl", "is-active", "--quiet", "docker"], capture_output=True
    ).returncode == 0
    if systemd:
        subprocess.run(["systemctl", "restart", "docker"], check=True)
    else:
        old = sh("pgrep", "-o", "-x", "dockerd")
        subprocess.run(["kill", old], check=True)
        deadline = time.monotonic() + 90
        while subprocess.run(["kill", "-0", old], capture_output=True).returncode == 0:
            if time.monotonic() > deadline:
                raise SystemExit(f"live-restart: dockerd {old} did not stop within 90 s")
            time.sleep(0.2)
        subprocess.Popen("setsid dockerd >/tmp/dockerd.log 2>&1 &", shell=True)
    deadline = time.monotonic() + 60
    while subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            raise SystemExit("live-restart: dockerd did not come back within 60 s; see /tmp/dockerd.log")
        time.sleep(0.2)


def main() -> int:
    if sh("docker", "ps", "-q"):
        print("live-restart: containers are running; this restarts dockerd, so it is left to you", file=sys.stderr)
        return 2
    binary = os.environ.get("CORRAL_BIN", str(ROOT / "target" / "debug" / "corral"))
    config = {
        "defaults": {
            "image": "corral-test/python",
            "isolation": "gvisor",
            "network": "none",
            "labels": {LABEL: "1"},
        }
    }
    ok = False
    with LocalServer(binary, config=config) as server:
        client = corral.Client(server.url, token=server.client_token)
        with client.sandbox() as sb:
            before = int(sb.run(COUNTER).stdout.split()[-1])
            t = time.monotonic()
            how = sb.pause()
            print(f"paused to {how} in {time.monotonic() - t:.2f} s at count {before}")
            if how != "disk":
                print("live-restart: the daemon cannot checkpoint this tier (scripts/ensure-gvisor.sh)", file=sys.stderr)
                sb.resume()
                return 1
            pid = sh("pgrep", "-o", "-x", "dockerd")
            t = time.monotonic()
            restart_dockerd()
            print(f"dockerd {pid} -> {sh('pgrep', '-o', '-x', 'dockerd')} in {time.monotonic() - t:.2f} s")
            t = time.monotonic()
            sb.resume()
            print(f"resumed in {time.monotonic() - t:.2f} s")
            after = [int(n) for n in sb.run("cat /tmp/c; sleep 1; cat /tmp/c").stdout.split()]
            print(f"count after resume: {after}")
            ok = len(after) == 2 and before <= after[0] < after[1]
    left = docker_ids(f"{LABEL}=1")
    if left:
        print(f"live-restart: sandboxes left: {left}", file=sys.stderr)
        return 1
    print("live-restart: the count went on" if ok else "live-restart: the count did not go on")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
