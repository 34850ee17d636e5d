"""The service on a Unix socket, reached through ``uds=`` or a
``unix://`` URL, by the socket's owner without a token."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

import corral
from corral.testing import LocalServer

from conftest import assert_no_leaks, corral_binary, server_config

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def socket_server():
    with tempfile.TemporaryDirectory(prefix="corral-uds-") as tmp:
        path = str(Path(tmp) / "corral.sock")
        server = LocalServer(corral_binary(), config=server_config(), extra_args=["--unix-socket", path])
        server.start()
        try:
            yield path
        finally:
            code = server.stop()
            server.close()
            assert_no_leaks()
            assert code == 0


def test_client_over_unix_socket(socket_server, monkeypatch):
    # Only its owner may connect; the owner needs no token there (the
    # service checks the peer's uid).
    assert stat.S_IMODE(os.stat(socket_server).st_mode) == 0o600
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    with corral.Client(uds=socket_server, token="") as client:
        assert client.health().ok
        with client.sandbox() as sb:
            assert sb.run("echo via-socket").stdout == "via-socket\n"
    monkeypatch.setenv("CORRAL_URL", f"unix://{socket_server}")
    with corral.Sandbox() as sb:
        assert sb.run("echo via-url").stdout == "via-url\n"


@pytest.mark.asyncio
async def test_async_client_over_unix_socket(socket_server):
    async with corral.AsyncClient(f"unix://{socket_server}") as client:
        async with client.sandbox() as sb:
            assert (await sb.run("echo async-socket")).stdout == "async-socket\n"
            got = []
            async for ev in sb.stream("echo s"):
                got.append(ev.kind)
            assert got == ["stdout", "result"]
