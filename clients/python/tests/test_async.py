"""The asyncio client against a real ``corral serve`` on a real daemon."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest

import corral

pytestmark = [pytest.mark.server, pytest.mark.asyncio]


async def test_async_run_stream_files_and_shell(corral_url):
    async with corral.AsyncClient(corral_url) as client:
        assert (await client.health()).ok
        async with client.sandbox() as sb:
            r = await sb.run("echo hi; echo err >&2; exit 2")
            assert (r.exit_code, r.stdout, r.stderr) == (2, "hi\n", "err\n")
            assert (await sb.run(["printf", "\\001\\377"])).stdout_bytes == b"\x01\xff"
            assert (await sb.run("cat", stdin=b"\x00\x01")).stdout_bytes == b"\x00\x01"

            seen = []
            stream = sb.stream("echo a; sleep 1; echo b")
            async for ev in stream:
                seen.append((time.monotonic(), ev))
            assert [ev.kind for _, ev in seen] == ["stdout", "stdout", "result"]
            assert seen[-1][0] - seen[0][0] > 0.5
            assert stream.result.stdout == "a\nb\n"

            await sb.write_file("/tmp/d/f.bin", b"\x00\xff" * 100, mkdirs=True)
            assert await sb.read_file("/tmp/d/f.bin") == b"\x00\xff" * 100
            assert await sb.read_text("/etc/passwd")
            with pytest.raises(corral.SandboxFileNotFoundError):
                await sb.read_file("/tmp/d/missing")

            async with sb.shell("s") as sh:
                await sh.run("cd /tmp/d; export V=7")
                r = await sh.run("echo $V $(pwd)")
                assert r.stdout == "7 /tmp/d\n" and r.restarted is False
                assert "s" in await sb.shells()
            sid = sb.id
        assert sid not in {s.id for s in await client.list_sandboxes()}


async def test_async_failures_are_typed(corral_url, corral_spec):
    async with corral.AsyncClient(corral_url) as client:
        async with client.sandbox() as sb:
            with pytest.raises(corral.SandboxTimeoutError) as ei:
                await sb.run("echo t; sleep 30", timeout=1)
            assert ei.value.result.stdout == "t\n"
            r = await sb.run("sleep 30", timeout=0.5, raise_on_failure=False)
            assert r.failure.kind == "timeout"
            with pytest.raises(corral.SandboxTimeoutError):
                async for _ in sb.stream("sleep 30", timeout=0.5):
                    pass

        async with client.sandbox(spec=corral_spec(limits={"memory": 32 << 20})) as sb:
            with pytest.raises(corral.SandboxOOMError):
                await sb.run("dd if=/dev/zero of=/dev/null bs=100M count=1", timeout=60)

        async with client.sandbox() as sb:
            subprocess.run(["docker", "rm", "-f", sb.container_id], check=True, capture_output=True)
            with pytest.raises(corral.SandboxContainerLostError) as ei:
                await sb.run("true", timeout=30)
            assert ei.value.retryable is True

        with pytest.raises(corral.SandboxNotFoundError):
            await client.get_sandbox("no-such-sandbox")
        with pytest.raises(corral.InvalidSpecError) as ei:
            await client.create_sandbox(spec=corral_spec(limits={"memory": 1}))
        assert "limits.memory" in (ei.value.field or "")


async def test_async_sandboxes_run_concurrently(corral_url):
    async with corral.AsyncClient(corral_url) as client:
        sandboxes = await asyncio.gather(*(client.create_sandbox() for _ in range(3)))
        try:
            # /proc/uptime is the host's clock: the three runs' intervals overlap.
            cmd = "cut -d' ' -f1 /proc/uptime; sleep 1; cut -d' ' -f1 /proc/uptime"
            results = await asyncio.gather(*(sb.run(cmd) for sb in sandboxes))
            spans = [tuple(float(x) for x in r.stdout.split()) for r in results]
            assert all(len(s) == 2 for s in spans)
            assert max(s[0] for s in spans) < min(s[1] for s in spans)
        finally:
            await asyncio.gather(*(sb.delete() for sb in sandboxes))


async def test_async_sandbox_await_and_own_client(corral_url, monkeypatch):
    monkeypatch.setenv("CORRAL_URL", corral_url)
    sb = await corral.AsyncSandbox()
    try:
        assert (await sb.run("echo own")).stdout == "own\n"
    finally:
        await sb.aclose()
    not_started = corral.AsyncSandbox(corral.AsyncClient(corral_url))
    with pytest.raises(RuntimeError):
        not_started.id
    await not_started.client.aclose()


async def test_async_events_follow_a_sandbox(corral_url, corral_spec):
    # The asyncio client has the lifecycle event stream too (both clients
    # are one source).
    async with corral.AsyncClient(corral_url) as client:
        events = client.events(after=0)
        async with client.sandbox(spec=corral_spec()) as sb:
            await sb.run("exit 3")
            key = sb.id
        mine = []

        async def read():
            async for ev in events:
                if ev.get("session") == key:
                    mine.append((ev["kind"], ev.get("outcome")))
                    if ev["kind"] == "removed":
                        return

        await asyncio.wait_for(read(), 60)
        await events.aclose()
        assert mine == [("created", None), ("command", "exit"), ("removed", None)]
