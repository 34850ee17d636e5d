"""What counts as a sandbox's activity for the service's idle timeout
(``provider.idle_timeout_ms``): what its owner does to it (a command, a
file), not what an observer reads (the list, a description, its usage, an
E2B listing, ``get_info`` or health probe, an MCP tool listing), so a
dashboard or monitor that polls keeps no abandoned sandbox alive, on every
front end. A real ``corral serve`` with a short idle timeout and an E2B
listener; a second client (the real SDKs) polls."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from typing import Any, AsyncIterator, Callable, Iterator, List

import pytest

import corral
from corral.testing import LocalServer, docker_ids, free_port

from conftest import LABEL, RUN_ID, assert_no_leaks, corral_binary, server_config

pytestmark = pytest.mark.server

IDLE_MS = 3000
TOKEN = "tok-lifecycle-" + uuid.uuid4().hex
#: How long past its idle timeout a polled sandbox may live before the test
#: calls it kept alive (the reaper runs every 200 ms; a loaded machine).
SLACK_S = 20


@pytest.fixture(scope="module")
def idle_server() -> Iterator[LocalServer]:
    cfg = server_config(
        provider={"idle_timeout_ms": IDLE_MS, "reap_interval_ms": 200},
        server={"e2b_listen": f"127.0.0.1:{free_port()}"},
    )
    server = LocalServer(corral_binary(), config=cfg, token=TOKEN)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        server.close()
        assert_no_leaks()


def _poll(url: str, sandbox_id: str, stop: threading.Event, reads: list) -> None:
    """A dashboard: the list, the description and the usage, as fast as the
    service answers."""
    with corral.Client(url, token=TOKEN) as observer:
        while not stop.is_set():
            observer.list_sandboxes()
            observer.usage()
            try:
                observer.get_sandbox(sandbox_id).usage()
            except corral.SandboxNotFoundError:
                pass
            reads.append(time.monotonic())
            time.sleep(0.05)


def test_a_polled_list_keeps_no_sandbox_alive(idle_server):
    """An abandoned sandbox goes at its idle timeout while a second client
    polls the list, its description and its usage all along."""
    with corral.Client(idle_server.url, token=TOKEN) as owner:
        sb = owner.create_sandbox()
        assert sb.run("echo used").stdout == "used\n"
        used = time.monotonic()
        stop, reads = threading.Event(), []
        poller = threading.Thread(target=_poll, args=(idle_server.url, sb.id, stop, reads), daemon=True)
        poller.start()
        try:
            deadline = used + IDLE_MS / 1000 + 20
            while any(s.id == sb.id for s in owner.list_sandboxes()):
                assert time.monotonic() < deadline, "a polled sandbox outlived its idle timeout by 20 s"
                time.sleep(0.1)
            gone = time.monotonic() - used
        finally:
            stop.set()
            poller.join(timeout=30)
        assert len(reads) >= 2, "the observer did not poll"
        assert IDLE_MS / 1000 <= gone, gone
        with pytest.raises(corral.SandboxNotFoundError):
            owner.get_sandbox(sb.id)


def test_what_the_owner_does_is_activity(idle_server):
    """Commands keep a sandbox: one used every second outlives its idle
    timeout several times over."""
    with corral.Client(idle_server.url, token=TOKEN) as owner:
        sb = owner.create_sandbox()
        try:
            until = time.monotonic() + 3 * IDLE_MS / 1000
            while time.monotonic() < until:
                assert sb.run("true").exit_code == 0
                time.sleep(1)
            assert owner.get_sandbox(sb.id).id == sb.id
        finally:
            owner.delete_sandbox(sb.id)


def _containers() -> List[str]:
    return docker_ids(LABEL, f"corraltest.run={RUN_ID}")


def _gone_while_polled(container: str, used: float, polls: Callable[[], None]) -> float:
    """Seconds from `used` until `container` is removed, `polls` run in a
    thread all along (it must poll at least twice)."""
    stop, reads, errors = threading.Event(), [], []

    def poll() -> None:
        while not stop.is_set():
            try:
                polls()
            except Exception as err:  # noqa: BLE001 - reported below
                errors.append(err)
                return
            reads.append(time.monotonic())
            time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        deadline = used + IDLE_MS / 1000 + SLACK_S
        while container in _containers():
            assert time.monotonic() < deadline, f"a polled sandbox outlived its idle timeout by {SLACK_S} s"
            assert not errors, errors
            time.sleep(0.1)
        gone = time.monotonic() - used
    finally:
        stop.set()
        poller.join(timeout=30)
    assert not errors, errors
    assert len(reads) >= 2, "the observer did not poll"
    return gone


# -- E2B: Sandbox.list, get_info and is_running are not activity -------------


def test_e2b_list_and_get_info_keep_no_sandbox_alive(idle_server):
    """An E2B sandbox used once goes at the service's idle timeout while a
    second client polls `Sandbox.list`, `Sandbox.get_info` and the
    sandbox's health (`is_running`) all along; its E2B lifetime (300 s) is
    far off."""
    e2b = pytest.importorskip("e2b")
    url = idle_server.config["server"]["e2b_listen"]
    opts = {"api_key": TOKEN, "api_url": f"http://{url}", "sandbox_url": f"http://{url}"}
    before = set(_containers())
    sbx = e2b.Sandbox.create(timeout=300, metadata={"case": "idle"}, **opts)
    try:
        assert sbx.commands.run("echo used").stdout == "used\n"
        used = time.monotonic()
        [container] = [c for c in _containers() if c not in before]
        probe = e2b.Sandbox.connect(sbx.sandbox_id, **opts)

        def polls() -> None:
            listed = e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"case": "idle"}), **opts).next_items()
            if any(s.sandbox_id == sbx.sandbox_id for s in listed):
                with contextlib.suppress(e2b.NotFoundException):
                    e2b.Sandbox.get_info(sbx.sandbox_id, **opts)
                probe.is_running()

        gone = _gone_while_polled(container, used, polls)
        assert IDLE_MS / 1000 <= gone, gone
        with pytest.raises(e2b.NotFoundException):
            e2b.Sandbox.get_info(sbx.sandbox_id, **opts)
        assert not any(s.sandbox_id == sbx.sandbox_id for s in e2b.Sandbox.list(**opts).next_items())
    finally:
        with contextlib.suppress(Exception):
            e2b.Sandbox.kill(sbx.sandbox_id, **opts)


# -- MCP: listing tools is not activity ---------------------------------------


def _is_error(result: Any) -> bool:
    # mcp >= 2 names it is_error, 1.x isError.
    return bool(getattr(result, "is_error", None) or getattr(result, "isError", False))


@contextlib.asynccontextmanager
async def _mcp(url: str) -> AsyncIterator[Any]:
    """An initialized MCP client session over streamable HTTP."""
    import anyio
    from mcp import ClientSession

    try:  # mcp >= 2: headers go through an http client of its own
        from mcp.client.streamable_http import streamable_http_client as http_client
        from mcp.shared._httpx_utils import create_mcp_http_client
    except ImportError:  # mcp 1.x: headers are an argument
        from mcp.client.streamable_http import streamablehttp_client as http_client

        create_mcp_http_client = None
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with contextlib.AsyncExitStack() as stack:
        if create_mcp_http_client is not None:
            http = await stack.enter_async_context(create_mcp_http_client(headers=headers))
            streams = await stack.enter_async_context(http_client(url, http_client=http))
        else:
            streams = await stack.enter_async_context(http_client(url, headers=headers))
        session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
        with anyio.fail_after(60):
            await session.initialize()
        yield session


@pytest.mark.asyncio
async def test_mcp_tool_listings_keep_no_sandbox_alive(idle_server):
    """An MCP session's sandbox, used by one command, goes at the idle
    timeout while that session and a second one list the tools all along;
    the session's next command gets a new sandbox."""
    import anyio

    pytest.importorskip("mcp")
    url = f"{idle_server.url}/mcp"
    async with _mcp(url) as owner, _mcp(url) as other:
        before = set(_containers())
        with anyio.fail_after(120):
            first = await owner.call_tool("run_command", {"command": "echo used"})
        assert not _is_error(first) and "used" in first.content[0].text, first
        used = time.monotonic()
        [container] = [c for c in _containers() if c not in before]
        deadline = used + IDLE_MS / 1000 + SLACK_S
        listings = 0
        while container in _containers():
            assert time.monotonic() < deadline, f"a sandbox whose tools were listed outlived its idle timeout by {SLACK_S} s"
            with anyio.fail_after(30):
                for session in (owner, other):
                    tools = await session.list_tools()
                    assert any(t.name == "run_command" for t in tools.tools)
            listings += 1
            await anyio.sleep(0.05)
        assert listings >= 2, "the tools were not listed"
        assert IDLE_MS / 1000 <= time.monotonic() - used
        with anyio.fail_after(120):
            again = await owner.call_tool("run_command", {"command": "echo again"})
        assert not _is_error(again) and "again" in again.content[0].text, again
