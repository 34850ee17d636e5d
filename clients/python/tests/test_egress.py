"""Egress counts outside raw HTTP: ``Sandbox.egress()`` of the sync and the
async client and the MCP tool ``egress`` (through the official MCP
client), against a real ``corral serve`` whose sandboxes have an egress
policy (``network: {egress: {allow: [pypi.test]}}``, written in the map
form the README shows) and a real test internet: the servers of
``corral_internet`` (the Rust egress tests' own), made and removed by the
``corral-internet`` binary. Each sandbox makes one allowed request
(``pypi.test``) and one denied one (``evil.test``), and the counts must
show both; another tenant gets not-found for the sandbox and for the MCP
session.

Needs: a Docker daemon, the images of ``scripts/build-test-images.sh
--net``, the corral and corral-internet binaries ($CORRAL_BIN and
$CORRAL_INTERNET_BIN, default ``target/debug/``), the pip packages
``mcp``, ``pytest``, ``pytest-asyncio``.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from typing import Any, AsyncIterator, Callable, Dict, Iterator, Optional

import anyio
import httpx
import pytest

import corral
from corral.errors import NotFoundError
from conftest import assert_no_leaks, corral_binary, server_config
from corral.testing import LocalServer
from mcp import ClientSession
from test_mcp import STEP_TIMEOUT, _http_client, _mcp_http_client, _ok

pytestmark = pytest.mark.server

# curl in the internet's client image (busybox's static wget cannot
# resolve names: static glibc has no resolver of its own).
ALLOWED = "curl -sf -m 10 -o /dev/null http://pypi.test/"
DENIED = "curl -sf -m 10 -o /dev/null http://evil.test/"


@pytest.fixture(scope="module")
def service(internet: Dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, Any]]:
    """A `corral serve` whose sandboxes (and MCP sessions' sandboxes) reach
    the test internet through their egress gateways; tenants alice and bob."""
    tokens = {name: secrets.token_hex(16) for name in ("alice", "bob")}
    cfg = server_config(
        daemon={"egress_network": internet["network"]},
        server={"tenants": {name: {"token": token} for name, token in tokens.items()}},
    )
    cfg["defaults"]["image"] = internet["image"]
    cfg["defaults"]["network"] = {"egress": {"allow": ["pypi.test"]}}
    path = tmp_path_factory.mktemp("egress") / "corral.yaml"
    path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    server = LocalServer(corral_binary(), config=str(path))
    try:
        server.start()
        yield {"url": server.url, "tokens": tokens}
    finally:
        code = server.stop()
        tail = server.log_tail()
        server.close()
        assert_no_leaks()
        assert code == 0, f"corral serve exited with {code} on SIGTERM:\n{tail}"


@contextlib.asynccontextmanager
async def _streams_and_session_id(url: str, token: str) -> AsyncIterator[Any]:
    """The MCP client's streamable HTTP transport sending `token`, and a
    function giving the session id the server assigned."""
    headers = {"Authorization": f"Bearer {token}"}
    if _mcp_http_client is None:  # mcp 1.x hands out a getter itself
        async with _http_client(url, headers=headers) as streams:
            yield streams[0], streams[1], streams[2]
        return
    seen: list = []

    async def hook(response: httpx.Response) -> None:
        sid = response.headers.get("mcp-session-id")
        if sid:
            seen.append(sid)

    async with _mcp_http_client(headers=headers) as http:
        http.event_hooks["response"].append(hook)
        async with _http_client(url, http_client=http) as streams:
            get: Callable[[], Optional[str]] = lambda: seen[-1] if seen else None
            yield streams[0], streams[1], get


def _moved(counts: Dict[str, Any]) -> None:
    assert counts["dns_allowed"] >= 1 and counts["connections_allowed"] >= 1, counts
    assert counts["dns_refused"] >= 1, counts
    assert any("evil.test" in r for r in counts["recent_refusals"]), counts


def test_sync_client_reads_the_counts_and_another_tenant_gets_not_found(service: Dict[str, Any]) -> None:
    alice = corral.Client(service["url"], token=service["tokens"]["alice"])
    bob = corral.Client(service["url"], token=service["tokens"]["bob"])
    with alice, bob:
        with alice.sandbox() as sb:
            before = sb.egress()
            assert before["dns_refused"] == 0 and before["connections_allowed"] == 0, before
            allowed = sb.run(ALLOWED, timeout=60)
            assert allowed.exit_code == 0, allowed
            denied = sb.run(DENIED, timeout=60)
            assert denied.exit_code != 0, denied
            _moved(sb.egress())
            # Bob names alice's sandbox: not found, as if it did not exist.
            with pytest.raises(NotFoundError):
                bob.request("GET", f"/v1/sandboxes/{sb.id}/egress", idempotent=True)
        # A sandbox without a policy has no counts: not found, said so.
        with alice.sandbox(spec={"network": "none"}) as plain:
            with pytest.raises(NotFoundError) as e:
                plain.egress()
            assert "egress" in str(e.value), e.value


@pytest.mark.asyncio
async def test_async_client_reads_the_counts(service: Dict[str, Any]) -> None:
    async with corral.AsyncClient(service["url"], token=service["tokens"]["alice"]) as client:
        async with client.sandbox() as sb:
            assert (await sb.run(ALLOWED, timeout=60)).exit_code == 0
            assert (await sb.run(DENIED, timeout=60)).exit_code != 0
            _moved(await sb.egress())


@pytest.mark.asyncio
async def test_mcp_egress_tool_counts_the_sessions_sandbox(service: Dict[str, Any]) -> None:
    mcp_url = service["url"] + "/mcp"
    async with _streams_and_session_id(mcp_url, service["tokens"]["alice"]) as (read, write, session_id):
        async with ClientSession(read, write) as session:
            with anyio.fail_after(STEP_TIMEOUT):
                await session.initialize()
            await _ok(session, "run_command", {"command": ALLOWED})
            with anyio.fail_after(STEP_TIMEOUT):
                denied = await session.call_tool("run_command", {"command": DENIED})
            assert "exit" in "".join(getattr(c, "text", "") for c in denied.content), denied
            with anyio.fail_after(STEP_TIMEOUT):
                result = await session.call_tool("egress", {})
            structured = getattr(result, "structured_content", None) or getattr(result, "structuredContent")
            _moved(structured)
            text = "".join(getattr(c, "text", "") for c in result.content)
            assert "refused" in text and "evil.test" in text, text
            # Bob presenting alice's MCP session id: no such session.
            sid = session_id()
            if sid:
                r = await anyio.to_thread.run_sync(
                    lambda: httpx.post(
                        mcp_url,
                        headers={
                            "Authorization": f"Bearer {service['tokens']['bob']}",
                            "Mcp-Session-Id": sid,
                            "Accept": "application/json, text/event-stream",
                            "Content-Type": "application/json",
                        },
                        json={
                            "jsonrpc": "2.0",
                            "id": 9,
                            "method": "tools/call",
                            "params": {"name": "egress", "arguments": {}},
                        },
                        timeout=30,
                    )
                )
                assert r.status_code == 404, (r.status_code, r.text)
            else:
                pytest.fail("the MCP client gave no session id to try as another tenant")
