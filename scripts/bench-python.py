#!/usr/bin/env python3
"""Round trip of a trivial command (`true`) through corral's Python client
against the same command through the raw Docker Engine API, in one run, on
the same container.

    scripts/python-env.sh && cargo build --bin corral
    target/pyenv/bin/python scripts/bench-python.py [-n 300] [--url URL]

Without --url it starts its own `corral serve` ($CORRAL_BIN, else
target/debug/corral) on a free loopback port. It creates one sandbox, then
alternates, for each of n rounds: one `Sandbox.run(["true"])` (HTTP to the
service, which hands it to the agent inside the container) and one raw
Docker exec (POST /containers/{id}/exec, POST /exec/{id}/start, GET
/exec/{id}/json for the exit code) on the sandbox's container over the
daemon's Unix socket. With the `e2b` SDK installed (scripts/python-env.sh
pins it) and its own service, a third path: the same command through the
e2b SDK (`commands.run("true")`, a sandbox of its own created through the
service's E2B-compatible listener, configured by E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY only), and two rows that split its cost:
the argv the SDK runs for it (`/bin/bash -l -c true`, envd's login shell)
through corral's client, and the same envd `Start` call sent without the
SDK over one kept HTTP/1.1 connection (the service's share). It prints
p50/p90/mean of each and the ratios, then deletes the sandboxes, stops the service and checks no
container of its own is left.

With --code (image corral-test/python: scripts/build-test-images.sh
--python): `run_code('1+1')` in a warm code context through corral's client
and through e2b-code-interpreter (template code-interpreter-v1, the profile
`code-interpreter`), against `python3 -c '1+1'` as a command in the same
sandbox: the cost a stateless agent pays each step.

With --throughput: commands/s that one Python process drives through the
asyncio client, `run(["true"])` in a loop per sandbox, with 1, 64 and 512
sandboxes at once (--levels), each level for --seconds, against the same
service's capacity measured from Rust in the same run: `corral loadgen`
sending the same `POST /v1/sandboxes/{id}/exec` requests to the same
sandboxes (one keep-alive connection and one command at a time per
sandbox). Besides cmd/s it reports CPU per command, of this Python process
(the client) and of `corral serve`, each from its own CPU time over the
level (getrusage and /proc/PID/stat). The sandboxes are small
(--memory-mb, default 16), created for the run and all deleted at its end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, List, Optional

import httpx

import corral
from corral.testing import LocalServer, free_port

try:
    import e2b
except ImportError:  # the e2b row is left out
    e2b = None

REPO = Path(__file__).resolve().parents[1]


def percentile(samples: List[float], p: float) -> float:
    s = sorted(samples)
    if not s:
        return float("nan")
    k = (len(s) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class DockerExec:
    """`true` in a container through the Engine API, as `docker exec` does."""

    def __init__(self, socket_path: str, container_id: str) -> None:
        self.http = httpx.Client(
            transport=httpx.HTTPTransport(uds=socket_path), base_url="http://docker", timeout=60.0
        )
        version = self.http.get("/version").json()["ApiVersion"]
        self.prefix = f"/v{version}"
        self.container_id = container_id

    def run(self, argv: List[str]) -> int:
        r = self.http.post(
            f"{self.prefix}/containers/{self.container_id}/exec",
            json={"Cmd": argv, "AttachStdout": True, "AttachStderr": True},
        )
        r.raise_for_status()
        exec_id = r.json()["Id"]
        with self.http.stream(
            "POST", f"{self.prefix}/exec/{exec_id}/start", json={"Detach": False, "Tty": False}
        ) as s:
            s.raise_for_status()
            for _ in s.iter_raw():
                pass
        info = self.http.get(f"{self.prefix}/exec/{exec_id}/json").json()
        if info.get("Running"):
            raise RuntimeError("exec still running after its stream closed")
        return int(info["ExitCode"])

    def close(self) -> None:
        self.http.close()


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000.0


def e2b_version() -> str:
    from importlib.metadata import version

    return version("e2b")


class RawEnvdStart:
    """envd's `process.Process/Start` as the SDK sends it, over one kept
    HTTP/1.1 connection: the Connect streaming envelope of a JSON request,
    read to its end-of-stream message."""

    def __init__(self, base: str, sandbox_id: str, token: Optional[str], argv: List[str]) -> None:
        import http.client
        import struct
        from urllib.parse import urlsplit

        u = urlsplit(base)
        self.conn = http.client.HTTPConnection(u.hostname, u.port)
        body = json.dumps({"process": {"cmd": argv[0], "args": argv[1:], "envs": {}}, "stdin": False}).encode()
        self.body = struct.pack(">BI", 0, len(body)) + body
        self.headers = {
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            "E2b-Sandbox-Id": sandbox_id,
            "X-Access-Token": token or "",
        }

    def run(self) -> None:
        self.conn.request("POST", "/process.Process/Start", body=self.body, headers=self.headers)
        r = self.conn.getresponse()
        data = r.read()
        if r.status != 200 or b'"end"' not in data or b'"exitCode":0' not in data:
            raise RuntimeError(f"envd Start: {r.status} {data[:200]!r}")


def docker_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        return host[len("unix://") :]
    return "/var/run/docker.sock"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--rounds", type=int, default=300, help="measured rounds of each (default 300)")
    ap.add_argument("--warmup", type=int, default=20, help="unmeasured rounds first (default 20)")
    ap.add_argument("--url", help="an already running corral service (default: start one)")
    ap.add_argument("--image", default=os.environ.get("CORRAL_TEST_IMAGE", "corral-test/busybox"))
    ap.add_argument("--code", action="store_true", help="code contexts against python3 -c as a command")
    ap.add_argument("--throughput", action="store_true", help="commands/s of one process against corral loadgen")
    ap.add_argument("--levels", default="1,64,512", help="sandboxes at once, per level (default 1,64,512)")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per level and driver (default 5)")
    ap.add_argument("--memory-mb", type=int, default=16, help="memory limit of each sandbox in MiB (default 16)")
    args = ap.parse_args(argv)
    if args.code:
        return code_main(args)
    if args.throughput:
        return throughput_main(args)

    run_label = f"corralbench.run={uuid.uuid4().hex[:12]}"
    key, value = run_label.split("=")
    server: Optional[LocalServer] = None
    if args.url:
        url = args.url
    else:
        binary = os.environ.get("CORRAL_BIN") or str(REPO / "target" / "debug" / "corral")
        config = {"defaults": {"image": args.image, "labels": {key: value}}}
        e2b_port = free_port()
        if e2b is not None:
            config["server"] = {"e2b_listen": f"127.0.0.1:{e2b_port}"}
        server = LocalServer(binary, config=config)
        server.start()
        url = server.url
        if e2b is not None:
            os.environ["E2B_API_URL"] = os.environ["E2B_SANDBOX_URL"] = f"http://127.0.0.1:{e2b_port}"
            os.environ["E2B_API_KEY"] = server.client_token or ""

    status = 0
    client = corral.Client(url)
    sb: Optional[corral.Sandbox] = None
    docker: Optional[DockerExec] = None
    e2b_sb = None
    try:
        sb = client.sandbox(image=args.image)
        assert sb.container_id, "the service did not say which container the sandbox is"
        docker = DockerExec(docker_socket(), sb.container_id)
        trivial = ["true"]

        def via_client() -> None:
            r = sb.run(trivial, timeout=30)
            if r.exit_code != 0:
                raise RuntimeError(f"client: exit {r.exit_code}")

        def via_docker() -> None:
            code = docker.run(trivial)
            if code != 0:
                raise RuntimeError(f"docker: exit {code}")

        paths: List[tuple] = [
            ("corral Python client, Sandbox.run(['true'])", via_client, []),
            ("raw Docker API exec (create+start+inspect)", via_docker, []),
        ]
        if e2b is not None and server is not None:
            e2b_sb = e2b.Sandbox.create(timeout=3600)

            def via_e2b() -> None:
                r = e2b_sb.commands.run("true")
                if r.exit_code != 0:
                    raise RuntimeError(f"e2b: exit {r.exit_code}")

            paths.append((f"e2b SDK {e2b_version()}, commands.run('true')", via_e2b, []))

            # What the SDK runs for commands.run("true") (envd's way: a
            # login shell), through corral's client: the same work in the
            # sandbox, so the ratio to it is the e2b path's own cost.
            login = ["/bin/bash", "-l", "-c", "true"]

            def via_client_login() -> None:
                r = sb.run(login, timeout=30)
                if r.exit_code != 0:
                    raise RuntimeError(f"client: exit {r.exit_code}")

            paths.append(("corral client, the SDK's argv (bash -l -c true)", via_client_login, []))

            # The same envd Start call without the SDK (one kept-alive
            # HTTP/1.1 connection, Connect's JSON envelope): the service's
            # share of the e2b path.
            envd = RawEnvdStart(os.environ["E2B_SANDBOX_URL"], e2b_sb.sandbox_id,
                                e2b_sb._envd_access_token, login)
            paths.append(("envd Start without the SDK (HTTP/1.1)", envd.run, []))
        for _ in range(args.warmup):
            for _, fn, _ in paths:
                fn()
        for i in range(args.rounds):
            # Rotate which goes first so drift on a shared machine hits all.
            for j in range(len(paths)):
                _, fn, samples = paths[(i + j) % len(paths)]
                samples.append(timed(fn))
        client_ms, docker_ms = paths[0][2], paths[1][2]
        rows = [(name, xs) for name, _, xs in paths]
        print(f"`true` round trip, {args.rounds} rounds each, same container ({sb.container_id[:12]}), same run")
        print(f"{'path':<46} {'p50 ms':>8} {'p90 ms':>8} {'mean ms':>8} {'min ms':>8}")
        for name, xs in rows:
            print(
                f"{name:<46} {percentile(xs, 0.5):8.2f} {percentile(xs, 0.9):8.2f} "
                f"{statistics.fmean(xs):8.2f} {min(xs):8.2f}"
            )
        ratio = percentile(client_ms, 0.5) / percentile(docker_ms, 0.5)
        print(f"p50 ratio client/docker: {ratio:.3f} (the client's round trip is {1 / ratio:.1f}x faster)")
        if len(paths) > 2:
            e2b_p50 = percentile(paths[2][2], 0.5)
            login_p50 = percentile(paths[3][2], 0.5)
            raw_p50 = percentile(paths[4][2], 0.5)
            print(f"p50 ratio e2b SDK/corral client: {e2b_p50 / percentile(client_ms, 0.5):.3f} (same service, "
                  "same run; the e2b sandbox is one of its own; target <= 1.5)")
            print(f"  of which the sandbox's own work: the SDK runs `bash -l -c true`, {login_p50:.2f} ms "
                  f"through corral's client")
            print(f"p50 ratio e2b SDK/corral client, same argv: {e2b_p50 / login_p50:.3f}; "
                  f"envd Start without the SDK/corral client, same argv: {raw_p50 / login_p50:.3f} "
                  "(the service's e2b path; the rest is the SDK's own time)")
    except Exception as exc:  # report, then clean up
        print(f"bench-python: {exc}", file=sys.stderr)
        status = 1
    finally:
        if docker is not None:
            docker.close()
        if e2b_sb is not None:
            e2b_sb.kill()
        if sb is not None:
            sb.delete()
        client.close()
        if server is not None:
            server.close()

    if server is not None and not no_leak(run_label):
        return 1
    return status


def code_main(args: argparse.Namespace) -> int:
    """The --code rows: run_code('1+1') against python3 -c '1+1'."""
    image = "corral-test/python" if args.image == "corral-test/busybox" else args.image
    run_label = f"corralbench.run={uuid.uuid4().hex[:12]}"
    key, value = run_label.split("=")
    binary = os.environ.get("CORRAL_BIN") or str(REPO / "target" / "debug" / "corral")
    e2b_port = free_port()
    spec = {"image": image, "labels": {key: value}}
    config = {
        "defaults": spec,
        "profiles": {"code-interpreter": spec},
        "server": {"e2b_listen": f"127.0.0.1:{e2b_port}"},
    }
    server = LocalServer(binary, config=config)
    server.start()
    os.environ["E2B_API_URL"] = os.environ["E2B_SANDBOX_URL"] = f"http://127.0.0.1:{e2b_port}"
    os.environ["E2B_API_KEY"] = server.client_token or ""
    client = corral.Client(server.url)
    status = 0
    sb = None
    ci = None
    try:
        sb = client.sandbox(image=image)
        paths: List[tuple] = []

        def command() -> None:
            r = sb.run(["python3", "-c", "1+1"], timeout=60)
            if r.exit_code != 0:
                raise RuntimeError(f"python3 -c: exit {r.exit_code}")

        def code() -> None:
            if sb.run_code("1+1").text != "2":
                raise RuntimeError("run_code gave no 2")

        paths.append(("command python3 -c '1+1' (corral client)", command, []))
        paths.append(("run_code('1+1'), corral client", code, []))
        try:
            import e2b_code_interpreter
        except ImportError:
            e2b_code_interpreter = None
        if e2b_code_interpreter is not None:
            ci = e2b_code_interpreter.Sandbox.create(timeout=3600)

            def via_e2b() -> None:
                if ci.run_code("1+1").text != "2":
                    raise RuntimeError("e2b run_code gave no 2")

            paths.append(("run_code('1+1'), e2b-code-interpreter", via_e2b, []))
        for _ in range(args.warmup):
            for _, fn, _ in paths:
                fn()
        for i in range(args.rounds):
            for j in range(len(paths)):
                _, fn, samples = paths[(i + j) % len(paths)]
                samples.append(timed(fn))
        print(f"code round trip, {args.rounds} rounds each, image {image}, same run")
        print(f"{'path':<46} {'p50 ms':>8} {'p90 ms':>8} {'mean ms':>8} {'min ms':>8}")
        for name, _, xs in paths:
            print(
                f"{name:<46} {percentile(xs, 0.5):8.2f} {percentile(xs, 0.9):8.2f} "
                f"{statistics.fmean(xs):8.2f} {min(xs):8.2f}"
            )
        floor = percentile(paths[0][2], 0.5)
        for name, _, xs in paths[1:]:
            print(f"{name}: {floor / percentile(xs, 0.5):.1f}x faster than the command (p50; target >= 5x)")
    except Exception as exc:  # report, then clean up
        print(f"bench-python: {exc}", file=sys.stderr)
        status = 1
    finally:
        if ci is not None:
            ci.kill()
        if sb is not None:
            sb.delete()
        client.close()
        server.close()
    return status if no_leak(run_label) else 1


def no_leak(run_label: str) -> bool:
    """True when no container of this run is left; removes (and names) any
    that is."""
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={run_label}"], capture_output=True, text=True
    ).stdout.split()
    if left:
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
        print(f"bench-python: containers left behind (removed): {left}", file=sys.stderr)
        return False
    print("leak check: no container left")
    return True


def cpu_seconds_of(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# Output kept per stream: the service reserves a command's worst case
# (max_output per stream) before running it, so the default of 64 MiB would
# cap the commands in flight far below 512.
THROUGHPUT_MAX_OUTPUT = 4096


async def drive_python(sandboxes: List["corral.AsyncSandbox"], seconds: float) -> tuple:
    """Each sandbox runs `true` in a loop for ``seconds``; returns
    (commands, wall seconds, client CPU seconds)."""
    stop_at = time.perf_counter() + seconds
    counts = [0] * len(sandboxes)

    async def loop(i: int, sb: "corral.AsyncSandbox") -> None:
        while time.perf_counter() < stop_at:
            r = await sb.run(["true"], timeout=30, max_output=THROUGHPUT_MAX_OUTPUT)
            if r.exit_code != 0:
                raise RuntimeError(f"python client: exit {r.exit_code}")
            counts[i] += 1

    cpu0, t0 = own_cpu_seconds(), time.perf_counter()
    await asyncio.gather(*(loop(i, sb) for i, sb in enumerate(sandboxes)))
    return sum(counts), time.perf_counter() - t0, own_cpu_seconds() - cpu0


def drive_rust(binary: str, url: str, token: str, ids: List[str], seconds: float) -> dict:
    """`corral loadgen` against the same route and sandboxes."""
    out = subprocess.run(
        [binary, "loadgen", "--url", url, "--seconds", str(seconds), "--max-output", str(THROUGHPUT_MAX_OUTPUT),
         "--json", *ids],
        capture_output=True, text=True, timeout=seconds + 120, env={**os.environ, "CORRAL_TOKEN": token},
    )
    if out.returncode != 0:
        raise RuntimeError(f"corral loadgen failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout)


def throughput_main(args: argparse.Namespace) -> int:
    levels = sorted({int(x) for x in args.levels.split(",") if x.strip()})
    if not levels or levels[0] < 1:
        raise SystemExit(f"--levels: give whole numbers of at least 1, got {args.levels!r}")
    most = levels[-1]
    run_label = f"corralbench.run={uuid.uuid4().hex[:12]}"
    key, value = run_label.split("=")
    binary = os.environ.get("CORRAL_BIN") or str(REPO / "target" / "debug" / "corral")
    config = {
        "defaults": {"image": args.image, "labels": {key: value}, "limits": {"memory": args.memory_mb << 20}},
        "provider": {"max_live": most + 8, "idle_timeout_ms": 0},
    }
    server = LocalServer(binary, config=config)
    server.start()
    assert server.proc is not None
    serve_pid = server.proc.pid
    token = server.client_token or ""
    status = 0
    rows: List[tuple] = []

    async def run() -> None:
        client = corral.AsyncClient(server.url, timeout=120)
        sandboxes: List[corral.AsyncSandbox] = []
        try:
            gate = asyncio.Semaphore(16)

            async def make() -> None:
                async with gate:
                    sandboxes.append(await client.create_sandbox(image=args.image))

            t0 = time.perf_counter()
            await asyncio.gather(*(make() for _ in range(most)))
            print(f"{most} sandboxes ({args.memory_mb} MiB each) created in {time.perf_counter() - t0:.1f} s", flush=True)
            for sb in sandboxes:  # warm: each connection and sandbox once
                await sb.run(["true"], timeout=30, max_output=THROUGHPUT_MAX_OUTPUT)
            for level in levels:
                group = sandboxes[:level]
                s0 = cpu_seconds_of(serve_pid)
                n, wall, cpu = await drive_python(group, args.seconds)
                s1 = cpu_seconds_of(serve_pid)
                rust = await asyncio.get_running_loop().run_in_executor(
                    None, drive_rust, binary, server.url, token, [sb.id for sb in group], args.seconds
                )
                s2 = cpu_seconds_of(serve_pid)
                rows.append((level, n, wall, cpu, s1 - s0, rust, s2 - s1))
                print(f"level {level}: python {n / wall:.0f} cmd/s, rust {rust['commands'] / rust['seconds']:.0f} cmd/s",
                      flush=True)
        finally:
            gate = asyncio.Semaphore(32)

            async def drop(sb: corral.AsyncSandbox) -> None:
                async with gate:
                    await sb.delete()

            await asyncio.gather(*(drop(sb) for sb in sandboxes), return_exceptions=True)
            await client.aclose()

    try:
        asyncio.run(run())
        print(f"`true` commands/s through corral serve ({args.seconds:g} s per level and driver, same run, "
              f"max_output {THROUGHPUT_MAX_OUTPUT})")
        print(f"{'sandboxes':>9} {'python cmd/s':>12} {'client CPU ms/cmd':>17} {'serve CPU ms/cmd':>16} "
              f"{'rust cmd/s':>10} {'serve CPU ms/cmd':>16} {'python/rust':>11}")
        for level, n, wall, cpu, serve_cpu, rust, rust_serve_cpu in rows:
            py_rate = n / wall
            rust_rate = rust["commands"] / rust["seconds"]
            print(f"{level:>9} {py_rate:>12.0f} {cpu * 1000 / max(n, 1):>17.3f} {serve_cpu * 1000 / max(n, 1):>16.3f} "
                  f"{rust_rate:>10.0f} {rust_serve_cpu * 1000 / max(rust['commands'], 1):>16.3f} "
                  f"{py_rate / rust_rate:>11.2f}")
    except Exception as exc:  # report, then clean up
        print(f"bench-python: {exc!r}", file=sys.stderr)
        status = 1
    finally:
        server.close()
    return status if no_leak(run_label) else 1


if __name__ == "__main__":
    sys.exit(main())
