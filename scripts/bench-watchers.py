#!/usr/bin/env python3
"""The cost of watching a busy service: `/metrics` scrapes, an events
stream and the dashboard, against the same service and sandboxes left
unwatched, in one run.

    scripts/python-env.sh && cargo build --release --bin corral
    target/pyenv/bin/python scripts/bench-watchers.py [--sandboxes 200] [--window 30]
        [--corral target/release/corral] [--json]

It starts its own `corral serve` (every sandbox busybox, 32 MiB, labelled
`corral-bench-watchers=<run>`), creates N sandboxes, then runs one window
per phase on the same service, each with the same command load: one client
running `true` back to back over HTTP (round robin over 20 sandboxes), whose
round trips give p50/p90:

* `idle`: nobody watches.
* `metrics`: a Prometheus-like scraper, `GET /metrics` every 5 s
  (`server.metrics.usage_refresh_ms` is the default 10 s, so usage is read
  at most every 10 s however often it is scraped).
* `events`: one reader of `GET /v1/events` from the start of the window.
* `dashboard`: what the dashboard page does (`dashboard.html`), emulated
  request for request: every 2 s `/v1/health`, `/v1/sandboxes`,
  `/v1/whoami`, `/metrics` and `/v1/usage` (every sandbox's usage from the
  service's sample), on at most 6 connections (a browser's per host), and
  a `/v1/events` stream.
* `dashboard_each`: the same, but each sandbox's own
  `/v1/sandboxes/{id}/usage` every 2 s (what the page does when the
  service samples no usage, `usage_refresh_ms: 0`; on Docker each is a
  stats call that waits for the daemon's next collection, about 1 s).
* `all`: the three together.

Per phase it reports the service's CPU (utime+stime of its process over
the window, in % of one core), its resident memory at the end, the Docker
daemon's CPU (shared with everything else on the machine: a noisy
indication of the engine calls the watchers cause), and the commands' p50
and p90. The service is stopped with SIGTERM at the end (it removes its
sandboxes) and no container of the run may remain.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional

from corral.testing import LocalServer, docker_ids

REPO = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def percentile(samples: List[float], p: float) -> float:
    s = sorted(samples)
    if not s:
        return float("nan")
    k = (len(s) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def dockerd_pid() -> Optional[int]:
    out = subprocess.run(["pidof", "dockerd"], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


class Http:
    """One keep-alive HTTP/1.1 connection to the service, as a client (or a
    browser's connection) holds it."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def call(self, method: str, path: str, body: Optional[dict] = None) -> tuple:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=data, headers=headers)
                r = self.conn.getresponse()
                return r.status, r.read()
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
                if attempt:
                    raise
        raise RuntimeError("unreachable")


def events_reader(port: int, token: str, stop: threading.Event, counts: Dict[str, int]) -> None:
    """Reads `GET /v1/events` (from now on) until `stop`, counting events."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/v1/events", headers={"Authorization": f"Bearer {token}"})
    r = conn.getresponse()
    while not stop.is_set():
        try:
            line = r.fp.readline()
        except (TimeoutError, OSError):
            continue
        if not line:
            return
        if line.startswith(b"data:"):
            counts["events"] = counts.get("events", 0) + 1
    conn.close()


def metrics_scraper(port: int, token: str, stop: threading.Event, every: float, counts: Dict[str, int]) -> None:
    h = Http(port, token)
    while not stop.is_set():
        status, body = h.call("GET", "/metrics")
        assert status == 200, body[:300]
        counts["scrapes"] = counts.get("scrapes", 0) + 1
        counts["usage_series"] = sum(1 for l in body.decode().splitlines() if l.startswith("corral_usage_"))
        stop.wait(every)


def dashboard(port: int, token: str, stop: threading.Event, counts: Dict[str, int], each: bool = False) -> None:
    """The dashboard page's polling, request for request: every 2 s the
    service's health, the sandbox list, whoami, /metrics, and all the
    sandboxes' usage in one `/v1/usage` (`each`: every sandbox's own
    `/usage`, as the page does when the service samples no usage), on at
    most 6 connections (a browser's per host)."""
    conns: "queue.Queue[Http]" = queue.Queue()
    for _ in range(6):
        conns.put(Http(port, token))

    def get(path: str) -> tuple:
        h = conns.get()
        try:
            return h.call("GET", path)
        finally:
            conns.put(h)

    with ThreadPoolExecutor(6) as pool:
        while not stop.is_set():
            started = time.monotonic()
            fixed = list(pool.map(get, ["/v1/health", "/v1/sandboxes", "/v1/whoami", "/metrics"]))
            listed = json.loads(fixed[1][1])["sandboxes"]
            answers = [] if each else [get("/v1/usage")]
            if answers and answers[0][0] == 200:
                counts["usage_sampled"] = len(json.loads(answers[0][1])["sandboxes"])
            else:
                paths = [f"/v1/sandboxes/{sb['id']}/usage" for sb in listed]
                answers = list(pool.map(get, paths))
            counts["polls"] = counts.get("polls", 0) + 1
            counts["usage_reads"] = counts.get("usage_reads", 0) + len(answers)
            counts["usage_errors"] = counts.get("usage_errors", 0) + sum(1 for s, _ in answers if s != 200)
            counts["poll_seconds"] = time.monotonic() - started
            stop.wait(max(0.0, 2.0 - (time.monotonic() - started)))


def run_phase(name: str, srv_pid: int, port: int, token: str, keys: List[str], window: float) -> dict:
    stop = threading.Event()
    counts: Dict[str, int] = {}
    watchers: List[threading.Thread] = []
    if name in ("metrics", "all"):
        watchers.append(threading.Thread(target=metrics_scraper, args=(port, token, stop, 5.0, counts)))
    if name in ("events", "all", "dashboard", "dashboard_each"):
        watchers.append(threading.Thread(target=events_reader, args=(port, token, stop, counts)))
    if name in ("dashboard", "all", "dashboard_each"):
        each = name == "dashboard_each"
        watchers.append(threading.Thread(target=dashboard, args=(port, token, stop, counts, each)))
    d_pid = dockerd_pid()
    cpu0, d0, t0 = cpu_seconds(srv_pid), (cpu_seconds(d_pid) if d_pid else 0.0), time.monotonic()
    for w in watchers:
        w.daemon = True
        w.start()
    h = Http(port, token)
    lat: List[float] = []
    i = 0
    while time.monotonic() - t0 < window:
        key = keys[i % min(20, len(keys))]
        i += 1
        s = time.perf_counter()
        status, body = h.call("POST", f"/v1/sandboxes/{key}/exec", {"command": "true"})
        lat.append((time.perf_counter() - s) * 1000)
        assert status == 200 and json.loads(body)["exit_code"] == 0, body[:300]
    elapsed = time.monotonic() - t0
    cpu1, d1 = cpu_seconds(srv_pid), (cpu_seconds(d_pid) if d_pid else 0.0)
    stop.set()
    for w in watchers:
        w.join(10)
    return {
        "phase": name,
        "service_cpu_pct": (cpu1 - cpu0) / elapsed * 100,
        "service_rss_mib": rss_mib(srv_pid),
        "dockerd_cpu_pct": (d1 - d0) / elapsed * 100 if d_pid else None,
        "commands": len(lat),
        "p50_ms": percentile(lat, 0.5),
        "p90_ms": percentile(lat, 0.9),
        "watchers": counts,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sandboxes", type=int, default=200)
    ap.add_argument("--window", type=float, default=30.0, help="seconds per phase")
    ap.add_argument("--corral", default=None, help="the corral binary (default $CORRAL_BIN, target/release/corral, target/debug/corral)")
    ap.add_argument("--phases", default="idle,metrics,events,dashboard,all,dashboard_each")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    binary = args.corral or os.environ.get("CORRAL_BIN")
    if not binary:
        for p in (REPO / "target/release/corral", REPO / "target/debug/corral"):
            if p.exists():
                binary = str(p)
                break
    run = uuid.uuid4().hex[:12]
    label = f"corral-bench-watchers={run}"
    token = uuid.uuid4().hex
    config = {
        "defaults": {
            "image": "corral-test/busybox",
            "labels": {"corral-bench-watchers": run},
            "limits": {"memory": 32 << 20, "cpus": 0.5, "pids": 64},
        },
        "provider": {"max_live": args.sandboxes + 8},
    }
    results = []
    info: dict = {}
    srv = LocalServer(binary, config=config, token=token)
    try:
        srv.start()
        assert srv.proc is not None
        pid = srv.proc.pid
        h = Http(srv.port, token)

        def make(i: int) -> str:
            c = Http(srv.port, token)
            status, body = c.call("POST", "/v1/sandboxes", {"session": f"w{i}"})
            assert status == 201, body[:300]
            return f"w{i}"

        t = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            keys = list(pool.map(make, range(args.sandboxes)))
        made_s = time.monotonic() - t
        status, body = h.call("GET", "/v1/sandboxes")
        assert status == 200 and len(json.loads(body)["sandboxes"]) == args.sandboxes, body[:300]
        info = {
            "binary": binary,
            "sandboxes": args.sandboxes,
            "created_s": made_s,
            "window_s": args.window,
            "service_rss_mib_after_create": rss_mib(pid),
        }
        for phase in args.phases.split(","):
            # Settle between phases (background samples, stream teardown).
            time.sleep(3)
            r = run_phase(phase, pid, srv.port, token, keys, args.window)
            results.append(r)
            if not args.json:
                print(
                    f"{phase:<10} service {r['service_cpu_pct']:6.1f}% cpu {r['service_rss_mib']:7.1f} MiB  "
                    f"dockerd {r['dockerd_cpu_pct'] or 0:6.1f}%  {r['commands']:6d} cmds  "
                    f"p50 {r['p50_ms']:6.2f} ms  p90 {r['p90_ms']:6.2f} ms  {r['watchers']}",
                    flush=True,
                )
    finally:
        srv.close()
        deadline = time.monotonic() + 60
        while docker_ids(label) and time.monotonic() < deadline:
            time.sleep(1)
        left = docker_ids(label)
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
            print(f"bench-watchers: {len(left)} containers were left behind and removed", file=sys.stderr)
    if args.json:
        print(json.dumps({"run": info, "phases": results}, indent=2))
    else:
        idle = next((r for r in results if r["phase"] == "idle"), None)
        if idle:
            print(f"created {args.sandboxes} sandboxes in {info['created_s']:.1f} s; "
                  f"service RSS after creation {info['service_rss_mib_after_create']:.1f} MiB")
            for r in results[1:]:
                print(
                    f"{r['phase']:<10} vs idle: service cpu {r['service_cpu_pct'] - idle['service_cpu_pct']:+.1f} points, "
                    f"p50 x{r['p50_ms'] / idle['p50_ms']:.2f}, p90 x{r['p90_ms'] / idle['p90_ms']:.2f}"
                )
    return 1 if docker_ids(label) else 0


if __name__ == "__main__":
    sys.exit(main())
