"""A service with a bearer token: 401 without it, works with it."""

from __future__ import annotations

import secrets

import httpx
import pytest

import corral
from corral.testing import LocalServer

from conftest import assert_no_leaks, corral_binary, server_config

pytestmark = pytest.mark.server


@pytest.fixture(scope="module", params=["config", "env"])
def token_server(request):
    """A second server requiring a token, set in its config file
    (server.token) or in $CORRAL_TOKEN."""
    token = secrets.token_hex(16)
    if request.param == "config":
        server = LocalServer(corral_binary(), config=server_config(server={"token": token}))
    else:
        server = LocalServer(corral_binary(), config=server_config(), token=token)
    server.start()
    try:
        yield server, token
    finally:
        code = server.stop()
        server.close()
        assert_no_leaks()
        assert code == 0


def test_token_required(token_server, monkeypatch):
    server, token = token_server
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)

    # Health needs no token.
    with corral.Client(server.url) as anon:
        assert anon.health().ok
        with pytest.raises(corral.AuthenticationError) as ei:
            anon.list_sandboxes()
        assert ei.value.status == 401 and ei.value.kind == "unauthorized" and not ei.value.retryable
        with pytest.raises(corral.AuthenticationError):
            anon.sandbox()

    with corral.Client(server.url, token="wrong-" + token) as wrong:
        with pytest.raises(corral.AuthenticationError):
            wrong.list_sandboxes()

    r = httpx.get(server.url + "/v1/sandboxes")
    assert r.status_code == 401 and r.json()["error"]["kind"] == "unauthorized"
    assert token not in r.text

    with corral.Client(server.url, token=token) as client:
        with client.sandbox() as sb:
            assert sb.run("echo authorized").stdout == "authorized\n"
            assert sb.id in {s.id for s in client.list_sandboxes()}

    # From the environment.
    monkeypatch.setenv("CORRAL_TOKEN", token)
    monkeypatch.setenv("CORRAL_URL", server.url)
    with corral.Sandbox() as sb:
        assert sb.run("true").ok


@pytest.mark.asyncio
async def test_token_required_async(token_server, monkeypatch):
    server, token = token_server
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    async with corral.AsyncClient(server.url) as anon:
        with pytest.raises(corral.AuthenticationError):
            await anon.list_sandboxes()
    async with corral.AsyncClient(server.url, token=token) as client:
        async with client.sandbox() as sb:
            assert (await sb.run("echo ok")).stdout == "ok\n"
