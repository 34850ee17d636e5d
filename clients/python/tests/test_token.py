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


def _serve_until_ready_or_exit(config: dict, env: dict, tmp: Path) -> "tuple[int | None, str]":
    """`corral serve` on a free port with `config` and `env`: its exit
    code (None while it runs: it is then stopped) and its log."""
    import json
    import os
    import subprocess
    import time

    from corral.testing import free_port

    cfg = tmp / "corral.yaml"
    cfg.write_text(json.dumps(config))
    port = free_port()
    log = tmp / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [corral_binary(), "serve", "--listen", f"127.0.0.1:{port}", "--config", str(cfg)],
            stdout=out, stderr=subprocess.STDOUT,
            env={**{k: v for k, v in os.environ.items() if k != "CORRAL_TOKEN"}, **env},
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            code = proc.poll()
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    return code, log.read_text()


def _shared(tmp_path: Path) -> Path:
    """A fresh 1777 directory: /tmp's mode, never /tmp itself."""
    shared = tmp_path / "shared-tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


def test_a_shared_runtime_directory_is_refused_by_name_and_left_alone(tmp_path: Path) -> None:
    """Named as the runtime directory (where a generated token goes), a
    shared directory is refused by name and stays 1777."""
    shared = _shared(tmp_path)
    code, log = _serve_until_ready_or_exit(server_config(), {"CORRAL_RUNTIME_DIR": str(shared)}, tmp_path)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777, "corral serve changed a directory it did not make"
    assert code not in (None, 0), log
    assert str(shared) in log and "mode 1777" in log and "server.runtime_dir" in log, log
    assert not list(shared.iterdir()), list(shared.iterdir())


def test_the_slot_directorys_shared_parent_is_left_alone(tmp_path: Path) -> None:
    """`daemon.slot_dir` in a shared directory: the slot directory is made
    0700, its parent stays 1777."""
    shared = _shared(tmp_path)
    runtime = tmp_path / "runtime"
    cfg = server_config(daemon={"slot_dir": str(shared / "slots")})
    code, log = _serve_until_ready_or_exit(cfg, {"CORRAL_RUNTIME_DIR": str(runtime)}, tmp_path)
    assert code is None, log
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777, "the slot directory's parent was changed"
    assert stat.S_IMODE((shared / "slots").stat().st_mode) == 0o700
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700


def test_a_per_user_directory_another_user_made_first_is_not_used(tmp_path: Path) -> None:
    """The per-user runtime directory (`$XDG_RUNTIME_DIR/corral`, else
    `/tmp/corral-<uid>`) made first by another user: corral keeps no
    shared delta there (a planted directory could hand a fork someone
    else's delta) and changes nothing of it."""
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory of another user's")
    xdg = tmp_path / "xdg"
    planted = xdg / "corral"
    planted.mkdir(parents=True)
    os.chown(planted, 65534, 65534)
    planted.chmod(0o777)
    env = {"XDG_RUNTIME_DIR": str(xdg), "CORRAL_RUNTIME_DIR": str(tmp_path / "runtime")}
    code, log = _serve_until_ready_or_exit(server_config(), env, tmp_path)
    assert code is None, log
    assert not (planted / "deltas").exists(), log
    assert "uid 65534" in log and str(planted) in log, log
    st = planted.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (65534, 0o777)
