"""Commands (``run``, a shell's ``run``) go over the clients' lean HTTP/1.1
connections (corral/_http1.py) rather than httpx: the same requests to the
same routes of a real ``corral serve``. These check what the lean client
must get right itself: answers of every size and shape, many requests in
flight (threads, tasks) each getting its own answer, kept-alive
connections reused, typed errors, and a restarted service (its kept
connections closed, its token new)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

import corral
from corral.testing import LocalServer, free_port

from conftest import assert_no_leaks, corral_binary, server_config

pytestmark = pytest.mark.server

BIG = 3_000_000


def test_sync_answers_of_every_shape_over_one_kept_connection(corral_client):
    assert corral_client._fast is not None, "plain http:// takes the lean client"
    with corral_client.sandbox() as sb:
        first = sb.run("echo one")
        assert (first.exit_code, first.stdout) == (0, "one\n")
        idle = list(corral_client._fast._idle)
        assert len(idle) == 1
        for _ in range(5):
            assert sb.run(["true"]).exit_code == 0
        # Still the one connection: kept alive, not reopened.
        assert corral_client._fast._idle == idle
        # An answer far larger than one read, JSON-escaped bytes, stdin.
        r = sb.run(f"head -c {BIG} /dev/zero | tr '\\0' a", max_output=4 << 20)
        assert r.stdout == "a" * BIG and not r.truncated
        assert sb.run(["printf", "\\001\\377\\042\\134"]).stdout_bytes == b"\x01\xff\"\\"
        assert sb.run("cat", stdin=b"\x00\x01" * 1000).stdout_bytes == b"\x00\x01" * 1000
        assert sb.run("exit 3").exit_code == 3
        with sb.shell("s") as sh:
            sh.run("export V=9")
            assert sh.run("echo $V").stdout == "9\n"


def test_sync_threads_each_get_their_own_answer(corral_client):
    with corral_client.sandbox() as a, corral_client.sandbox() as b:

        def one(i: int) -> None:
            sb = a if i % 2 else b
            r = sb.run(f"echo {i}-$(cat /proc/sys/kernel/hostname)")
            assert r.stdout.startswith(f"{i}-"), r.stdout

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(160)))
        assert 1 <= len(corral_client._fast._idle) <= 8


def test_sync_errors_are_typed(corral_client):
    with corral_client.sandbox() as sb:
        with pytest.raises(corral.InvalidRequestError) as ei:
            sb.run("true", max_output=1 << 40)
        assert ei.value.field == "max_output"
        with pytest.raises(corral.SandboxTimeoutError) as ei:
            sb.run("echo t; sleep 30", timeout=1)
        assert ei.value.result.stdout == "t\n"
        gone = corral_client.get_sandbox(sb.id)
    with pytest.raises(corral.SandboxNotFoundError):
        gone.run("true")
    # The connection survives error answers.
    assert len(corral_client._fast._idle) == 1


@pytest.mark.asyncio
async def test_async_many_commands_in_flight(corral_url):
    async with corral.AsyncClient(corral_url) as client:
        assert client._fast is not None
        sandboxes = [await client.create_sandbox() for _ in range(4)]
        try:

            async def one(i: int) -> None:
                r = await sandboxes[i % 4].run(f"echo {i}", max_output=4096)
                assert (r.exit_code, r.stdout) == (0, f"{i}\n")

            for _ in range(3):
                await asyncio.gather(*(one(i) for i in range(64)))
            assert 1 <= len(client._fast._idle) <= 64
            big = await sandboxes[0].run(f"head -c {BIG} /dev/zero | tr '\\0' b", max_output=4 << 20)
            assert big.stdout == "b" * BIG
            with pytest.raises(corral.InvalidRequestError) as ei:
                await sandboxes[0].run("true", max_output=1 << 40)
            assert ei.value.field == "max_output"
            async with sandboxes[1].shell() as sh:
                assert (await sh.run("echo $((6*7))")).stdout == "42\n"
        finally:
            for sb in sandboxes:
                await sb.delete()
        with pytest.raises(corral.SandboxNotFoundError):
            await sandboxes[0].run("true")


def _restart_server():
    return LocalServer(corral_binary(), config=server_config(), port=free_port())


def test_sync_restarted_service_new_connection_and_token(monkeypatch):
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    server = _restart_server()
    server.start()
    try:
        with corral.Client(server.url) as client:
            with client.sandbox() as sb:
                assert sb.run("echo a").stdout == "a\n"
            kept = list(client._fast._idle)
            assert len(kept) == 1
            server.stop()
            server.start()  # same port, a new generated token
            # A sandbox made elsewhere, so this client's first request after
            # the restart is the command: the kept connection was closed
            # by the old service and is not reused (nothing fails), and
            # the new token is read after the 401.
            with corral.Client(server.url) as other, other.sandbox() as made:
                sb = corral.Sandbox(client, _info=made.info)
                assert sb.run("echo b").stdout == "b\n"
                assert client._fast._idle != kept
    finally:
        server.close()
    assert_no_leaks()


@pytest.mark.asyncio
async def test_async_restarted_service_new_connection_and_token(monkeypatch):
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    server = _restart_server()
    server.start()
    try:
        async with corral.AsyncClient(server.url) as client:
            sb = await client.create_sandbox()
            assert (await sb.run("echo a")).stdout == "a\n"
            await sb.delete()
            kept = list(client._fast._idle)
            assert len(kept) == 1
            server.stop()
            server.start()
            # As in the sync test: the command is the first request.
            with corral.Client(server.url) as other, other.sandbox() as made:
                again = corral.AsyncSandbox(client, _info=made.info)
                r = await again.run("echo b")
                assert r.stdout == "b\n"
                assert client._fast._idle != kept
    finally:
        server.close()
    assert_no_leaks()
