#!/usr/bin/env python3
"""Density: N live sandboxes brought up through `corral serve`, a command run
on every one, and what each live sandbox costs, split by who pays it.

    scripts/python-env.sh && cargo build --release --bin corral
    target/pyenv/bin/python scripts/bench-density.py [-n 1000] [--parallel 16] \
        [--rounds 3] [--binary target/release/corral] [--json]

It starts its own `corral serve` (the binary given, else $CORRAL_BIN, else
target/release/corral, else target/debug/corral) on a free loopback port,
with sandboxes of `--image` (default corral-test/busybox) on no network (a
Linux bridge takes at most 1024 ports, so 1,000 sandboxes on one bridge is
a limit of the kernel's, not corral's) and `provider.max_live` N plus a
little. Then:

1. creates N sandboxes through the async Python client, `--parallel` at a
   time, and reports creates/s and create p50/p99; it stops early, and
   says where and why, after `--max-failures` creates failed;
2. runs `echo` on every live sandbox `--rounds` times, `--parallel` (or
   `--command-parallel`) at a
   time, and reports command p50/p90/p99 and commands/s;
3. reports the cost per live sandbox: the service (RSS, open fds, OS
   threads of the `corral serve` process, growth over its idle start,
   divided by the sandboxes), the engine (dockerd's and containerd's RSS
   growth, and the PSS of each sandbox's `containerd-shim-runc-v2`), and
   the sandbox itself (its memory cgroup's usage, cgroup v1 or v2), with
   the machine's limits beside them (pid_max, the service's fd limit);
4. deletes every sandbox through the API, stops the service and removes
   whatever still carries this run's label (`corral-density=<run>`),
   also on Ctrl-C and SIGTERM, then checks none is left.

The machine is shared: the engine's growth includes whatever else ran
meanwhile, and the command latencies include the client's own CPU (the
Python client spends about 1.5 ms of CPU per command).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

import corral
from corral.testing import LocalServer

REPO = Path(__file__).resolve().parents[1]
LABEL = "corral-density"
PAGE = os.sysconf("SC_PAGE_SIZE")


def percentile(samples: List[float], p: float) -> float:
    """Nearest rank, like `corral bench`."""
    s = sorted(samples)
    if not s:
        return float("nan")
    rank = max(1, min(len(s), int(-(-p * len(s) // 1))))
    return s[rank - 1]


def binary(given: Optional[str]) -> str:
    for candidate in (given, os.environ.get("CORRAL_BIN"), REPO / "target/release/corral", REPO / "target/debug/corral"):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    raise SystemExit("no corral binary: cargo build --release --bin corral, or pass --binary")


# -- what a process costs ------------------------------------------------------


def proc_kb(path: str, field: str) -> int:
    """The kB value of ``field:`` in a /proc file, 0 when it cannot be read."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_kb(pid: int) -> int:
    return proc_kb(f"/proc/{pid}/status", "VmRSS")


def pss_kb(pid: int) -> int:
    """Proportional set size: shared pages (the shim's binary) split among
    the processes sharing them, so a sum over shims is what they cost."""
    return proc_kb(f"/proc/{pid}/smaps_rollup", "Pss")


def fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def nofile_limit(pid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return line.split()[3]
    except OSError:
        pass
    return "?"


def processes() -> Dict[int, List[str]]:
    out: Dict[int, List[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        out[int(entry)] = [a.decode(errors="replace") for a in argv if a]
    return out


def engine_pids() -> Dict[str, Optional[int]]:
    found: Dict[str, Optional[int]] = {"dockerd": None, "containerd": None}
    for pid, argv in processes().items():
        if not argv:
            continue
        name = os.path.basename(argv[0])
        if name in found and found[name] is None:
            found[name] = pid
    return found


def shims_of(containers: List[str]) -> Dict[str, int]:
    """The `containerd-shim-runc-v2 -id <container>` process of each container."""
    wanted = set(containers)
    out: Dict[str, int] = {}
    for pid, argv in processes().items():
        if not argv or "containerd-shim" not in os.path.basename(argv[0]):
            continue
        if "-id" in argv:
            i = argv.index("-id")
            if i + 1 < len(argv) and argv[i + 1] in wanted:
                out[argv[i + 1]] = pid
    return out


def cgroup_memory(container: str) -> Optional[int]:
    """Bytes the container's memory cgroup holds (cgroup v1 or v2, cgroupfs
    or systemd driver)."""
    patterns = [
        f"/sys/fs/cgroup/memory/docker/{container}/memory.usage_in_bytes",
        f"/sys/fs/cgroup/memory/system.slice/docker-{container}.scope/memory.usage_in_bytes",
        f"/sys/fs/cgroup/docker/{container}/memory.current",
        f"/sys/fs/cgroup/system.slice/docker-{container}.scope/memory.current",
    ]
    for pattern in patterns:
        for path in glob.glob(pattern):
            try:
                return int(Path(path).read_text().strip())
            except (OSError, ValueError):
                continue
    return None


def our_containers(run: str) -> List[str]:
    r = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc", "--filter", f"label={LABEL}={run}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return [c for c in r.stdout.split() if c]


def sweep(run: str) -> int:
    """Removes every container of this run (only this run's label)."""
    left = our_containers(run)
    for i in range(0, len(left), 100):
        subprocess.run(["docker", "rm", "-f", *left[i : i + 100]], capture_output=True, timeout=600)
    return len(left)


# -- the measurement -------------------------------------------------------------


class Density:
    def __init__(self, args: argparse.Namespace, server: LocalServer, run: str) -> None:
        self.args = args
        self.server = server
        self.run = run
        self.sandboxes: List[corral.AsyncSandbox] = []
        self.report: Dict[str, Any] = {"run": run, "requested": args.sandboxes, "parallel": args.parallel}
        self.samples: List[Dict[str, Any]] = []

    def service_pid(self) -> int:
        assert self.server.proc is not None
        return self.server.proc.pid

    def service_now(self) -> Dict[str, Any]:
        pid = self.service_pid()
        return {"rss_kb": rss_kb(pid), "fds": fds(pid), "threads": threads(pid)}

    async def create_all(self, client: corral.AsyncClient) -> None:
        n, parallel = self.args.sandboxes, self.args.parallel
        latencies: List[float] = []
        failures: List[str] = []
        gate = asyncio.Semaphore(parallel)
        stop = asyncio.Event()

        async def one() -> None:
            async with gate:
                if stop.is_set():
                    return
                t = time.perf_counter()
                try:
                    sb = await client.create_sandbox()
                except Exception as exc:  # noqa: BLE001 - reported, and counted against --max-failures
                    failures.append(f"{type(exc).__name__}: {exc}")
                    if len(failures) >= self.args.max_failures:
                        stop.set()
                    return
                latencies.append(time.perf_counter() - t)
                self.sandboxes.append(sb)
                live = len(self.sandboxes)
                if live % 100 == 0:
                    self.samples.append({"live": live, **self.service_now()})
                    print(f"  {live} live, service {self.samples[-1]}", file=sys.stderr)

        t = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        wall = time.perf_counter() - t
        self.report["create"] = {
            "live": len(self.sandboxes),
            "wall_s": round(wall, 2),
            "creates_per_s": round(len(latencies) / wall, 2) if wall else None,
            "p50_ms": round(percentile(latencies, 0.5) * 1e3, 1),
            "p99_ms": round(percentile(latencies, 0.99) * 1e3, 1),
            "failures": len(failures),
            "first_failures": sorted(set(failures))[:5],
            "stopped_early": stop.is_set(),
        }

    async def commands(self) -> None:
        parallel, rounds = self.args.command_parallel or self.args.parallel, self.args.rounds
        latencies: List[float] = []
        failures: List[str] = []
        gate = asyncio.Semaphore(parallel)

        async def one(sb: corral.AsyncSandbox) -> None:
            async with gate:
                t = time.perf_counter()
                try:
                    r = await sb.run(["echo", "ok"])
                    if r.exit_code != 0 or r.stdout.strip() != "ok":
                        failures.append(f"{sb.id}: exit {r.exit_code}")
                        return
                except Exception as exc:  # noqa: BLE001 - reported
                    failures.append(f"{sb.id}: {type(exc).__name__}: {exc}")
                    return
                latencies.append(time.perf_counter() - t)

        cpu0 = cpu_seconds(self.service_pid())
        t = time.perf_counter()
        for _ in range(rounds):
            await asyncio.gather(*(one(sb) for sb in self.sandboxes))
        wall = time.perf_counter() - t
        cpu = cpu_seconds(self.service_pid()) - cpu0
        self.report["commands"] = {
            "commands": len(latencies),
            "parallel": parallel,
            "per_s": round(len(latencies) / wall, 1) if wall else None,
            "p50_ms": round(percentile(latencies, 0.5) * 1e3, 2),
            "p90_ms": round(percentile(latencies, 0.9) * 1e3, 2),
            "p99_ms": round(percentile(latencies, 0.99) * 1e3, 2),
            "service_cpu_ms_per_command": round(cpu * 1e3 / max(1, len(latencies)), 3),
            "failures": len(failures),
            "first_failures": failures[:5],
        }

    def costs(self, idle: Dict[str, Any], engine_idle: Dict[str, int]) -> None:
        live = max(1, len(self.sandboxes))
        now = self.service_now()
        containers = our_containers(self.run)
        shims = shims_of(containers)
        shim_pss = [pss_kb(p) for p in shims.values()]
        shim_threads = [threads(p) for p in shims.values()]
        memory = [m for m in (cgroup_memory(c) for c in containers) if m is not None]
        engine = engine_pids()
        engine_now = {k: rss_kb(p) if p else 0 for k, p in engine.items()}
        self.report["service"] = {
            "idle": idle,
            "live": now,
            "rss_mb": round(now["rss_kb"] / 1024, 1),
            "per_sandbox_kb": round((now["rss_kb"] - idle["rss_kb"]) / live, 1),
            "fds_per_sandbox": round((now["fds"] - idle["fds"]) / live, 2),
            "threads_per_sandbox": round((now["threads"] - idle["threads"]) / live, 3),
            "fd_limit": nofile_limit(self.service_pid()),
            "samples": self.samples,
        }
        self.report["engine"] = {
            "dockerd_rss_growth_kb_per_sandbox": round((engine_now["dockerd"] - engine_idle["dockerd"]) / live, 1),
            "containerd_rss_growth_kb_per_sandbox": round(
                (engine_now["containerd"] - engine_idle["containerd"]) / live, 1
            ),
            "dockerd_threads": threads(engine["dockerd"]) if engine["dockerd"] else None,
            "shims_found": len(shims),
            "shim_pss_kb_mean": round(statistics.mean(shim_pss), 1) if shim_pss else None,
            "shim_threads_mean": round(statistics.mean(shim_threads), 1) if shim_threads else None,
        }
        self.report["sandbox"] = {
            "containers": len(containers),
            "cgroup_memory_kb_mean": round(statistics.mean(memory) / 1024, 1) if memory else None,
        }
        try:
            pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
        except (OSError, ValueError):
            pid_max = None
        self.report["machine"] = {"pid_max": pid_max, "cpus": os.cpu_count()}

    async def delete_all(self) -> None:
        gate = asyncio.Semaphore(self.args.parallel)
        failures: List[str] = []

        async def one(sb: corral.AsyncSandbox) -> None:
            async with gate:
                try:
                    await sb.delete()
                except Exception as exc:  # noqa: BLE001 - the sweep removes what is left
                    failures.append(f"{sb.id}: {exc}")

        t = time.perf_counter()
        await asyncio.gather(*(one(sb) for sb in self.sandboxes))
        wall = time.perf_counter() - t
        self.report["delete"] = {
            "wall_s": round(wall, 2),
            "per_s": round(len(self.sandboxes) / wall, 1) if wall else None,
            "failures": len(failures),
        }
        self.sandboxes = []


async def measure(args: argparse.Namespace, server: LocalServer, run: str) -> Dict[str, Any]:
    d = Density(args, server, run)
    engine = engine_pids()
    engine_idle = {k: rss_kb(p) if p else 0 for k, p in engine.items()}
    # The service's own baseline, after one sandbox came and went (its
    # connection pools and runtime threads exist then).
    async with corral.AsyncClient(server.url, token=server.client_token, timeout=300.0) as client:
        warm = await client.create_sandbox()
        await warm.run(["true"])
        await warm.delete()
        idle = d.service_now()
        try:
            print(f"creating {args.sandboxes} sandboxes, {args.parallel} at a time", file=sys.stderr)
            await d.create_all(client)
            print(f"created: {d.report['create']}", file=sys.stderr)
            await d.commands()
            print(f"commands: {d.report['commands']}", file=sys.stderr)
            d.costs(idle, engine_idle)
        finally:
            await d.delete_all()
    return d.report


def table(r: Dict[str, Any]) -> str:
    c, m, s, e, b = r["create"], r.get("commands", {}), r.get("service", {}), r.get("engine", {}), r.get("sandbox", {})
    lines = [
        f"density run {r['run']}: {c['live']} of {r['requested']} live, {r['parallel']} at a time",
        f"  creates: {c['creates_per_s']}/s (p50 {c['p50_ms']} ms, p99 {c['p99_ms']} ms), "
        f"{c['failures']} failed{' (stopped early)' if c['stopped_early'] else ''}",
    ]
    for f in c["first_failures"]:
        lines.append(f"    failure: {f}")
    if m:
        lines.append(
            f"  commands: {m['commands']} at {m['per_s']}/s, {m['parallel']} at a time, p50 {m['p50_ms']} ms, p90 {m['p90_ms']} ms, "
            f"p99 {m['p99_ms']} ms; service CPU {m['service_cpu_ms_per_command']} ms each; {m['failures']} failed"
        )
    if s:
        lines.append(
            f"  corral serve: {s['rss_mb']} MB RSS ({s['per_sandbox_kb']} KB, {s['fds_per_sandbox']} fds, "
            f"{s['threads_per_sandbox']} threads per sandbox; fd limit {s['fd_limit']})"
        )
    if e:
        lines.append(
            f"  engine: dockerd +{e['dockerd_rss_growth_kb_per_sandbox']} KB, containerd "
            f"+{e['containerd_rss_growth_kb_per_sandbox']} KB per sandbox; one shim each: "
            f"{e['shim_pss_kb_mean']} KB PSS, {e['shim_threads_mean']} threads ({e['shims_found']} found)"
        )
    if b:
        lines.append(f"  sandbox: {b['cgroup_memory_kb_mean']} KB of memory cgroup each ({b['containers']} containers)")
    if "delete" in r:
        d = r["delete"]
        lines.append(f"  deleted in {d['wall_s']} s ({d['per_s']}/s), {d['failures']} failed")
    lines.append(f"  machine: {r.get('machine', {})}; left after cleanup: {r.get('left', '?')}")
    return "\n".join(lines)


def interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--sandboxes", type=int, default=1000, help="live sandboxes to reach (default 1000)")
    ap.add_argument("--parallel", type=int, default=16, help="creates, commands, deletes in flight (default 16)")
    ap.add_argument(
        "--command-parallel", type=int, default=None,
        help="commands in flight, when other than --parallel (the load the latencies are taken under)",
    )
    ap.add_argument("--rounds", type=int, default=3, help="echo commands per sandbox (default 3)")
    ap.add_argument("--max-failures", type=int, default=20, help="stop creating after this many failed (default 20)")
    ap.add_argument("--image", default=os.environ.get("CORRAL_TEST_IMAGE", "corral-test/busybox"))
    ap.add_argument("--binary", help="the corral binary")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    for name in ("sandboxes", "parallel", "command_parallel", "rounds", "max_failures"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")

    run = uuid.uuid4().hex[:10]
    config = {
        "defaults": {"image": args.image, "network": "none", "labels": {LABEL: run}},
        "provider": {"max_live": args.sandboxes + 8},
    }
    # SIGTERM as Ctrl-C: both end in the cleanup below.
    signal.signal(signal.SIGTERM, interrupted)
    server = LocalServer(binary(args.binary), config=config, env={"RUST_LOG": "warn"})
    report: Dict[str, Any] = {"run": run}
    code = 0
    try:
        server.start()
        report = asyncio.run(measure(args, server, run))
    except KeyboardInterrupt:
        print(f"interrupted; removing the sandboxes of run {run}", file=sys.stderr)
        code = 130
    finally:
        # Nothing interrupts the cleanup: the service removes its sandboxes
        # on SIGTERM; the sweep takes whatever it could not (only this
        # run's label).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        server.close()
        swept = sweep(run)
        report["swept_after_stop"] = swept
        report["left"] = len(our_containers(run))
    if code:
        return code
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 1 if report["left"] else 0


if __name__ == "__main__":
    sys.exit(main())
