"""Tokens: a configured one (401 without it, works with it), and the one a
service generates when none is configured, which the client finds in the
service's token file by itself."""

from __future__ import annotations

import secrets
import stat
from pathlib import Path

import httpx
import pytest

import corral
from corral._discovery import runtime_dirs
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


def _token_file(url: str) -> Path:
    port = url.rsplit(":", 1)[1]
    for d in runtime_dirs():
        f = d / f"server-127.0.0.1-{port}.json"
        if f.exists():
            return f
    pytest.fail(f"no token file for {url} in {runtime_dirs()}")


def test_default_service_generates_a_token_the_client_finds(corral_url, monkeypatch):
    """The session's server runs with the default configuration: no token
    configured. It is still required, and the client finds it by itself."""
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    token = corral.find_token(corral_url)
    assert token is not None and len(token) == 64, token
    f = _token_file(corral_url)
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert stat.S_IMODE(f.parent.stat().st_mode) == 0o700

    # Another local process without the file gets nowhere.
    r = httpx.post(corral_url + "/v1/sandboxes", json={})
    assert r.status_code == 401 and r.json()["error"]["kind"] == "unauthorized", r.text
    assert httpx.get(corral_url + "/v1/health").status_code == 200

    # The client, configured with nothing but where the service is.
    monkeypatch.setenv("CORRAL_URL", corral_url)
    with corral.Sandbox() as sb:
        assert sb.run("echo found").stdout == "found\n"
    with corral.Client() as client:
        assert client.health().ok
        client.list_sandboxes()
    # Only loopback URLs get a token from a file.
    assert corral.find_token(corral_url.replace("127.0.0.1", "192.0.2.1")) is None
    assert corral.find_token(corral_url.replace("127.0.0.1", "localhost")) == token


@pytest.mark.asyncio
async def test_default_service_token_async(corral_url, monkeypatch):
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    monkeypatch.setenv("CORRAL_URL", corral_url)
    async with corral.AsyncSandbox() as sb:
        assert (await sb.run("echo async-found")).stdout == "async-found\n"
        events = [ev.kind async for ev in sb.stream("echo s")]
        assert events == ["stdout", "result"]


def test_a_restarted_service_is_followed_and_its_file_goes_with_it(monkeypatch):
    """The token file is removed at shutdown; a client of a service that
    restarted (a new token) reads the new file after its first 401."""
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    first = LocalServer(corral_binary(), config=server_config())
    first.start()
    try:
        url, port = first.url, first.port
        f = _token_file(url)
        client = corral.Client(url)
        old = corral.find_token(url)
        assert client.list_sandboxes() == []
    finally:
        assert first.stop() == 0
        first.close()
    assert not f.exists(), "the token file outlived its service"
    assert corral.find_token(url) is None
    second = LocalServer(corral_binary(), config=server_config(), port=port)
    second.start()
    try:
        new = corral.find_token(url)
        assert new is not None and new != old
        with client:
            with client.sandbox() as sb:
                assert sb.run("echo again").stdout == "again\n"
    finally:
        assert second.stop() == 0
        second.close()
        assert_no_leaks()
