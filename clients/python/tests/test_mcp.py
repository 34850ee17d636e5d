"""corral's MCP server, driven by the official Python MCP client (`mcp`).

Two transports, the same checks: `corral mcp` over stdio, and the
streamable HTTP endpoint `/mcp` of `corral serve`. Each test lists the
tools, runs a command, writes a file and reads it back, lists its
directory, keeps `cd` state in a shell session, and sees a bad argument
refused with the field named. Every sandbox is made from a config whose
`defaults.labels` carry a label unique to the test, so the test can see
its sandbox exist while the session is open and assert that none is left
once the session (and the server) has ended.

Needs: a Docker daemon, the image `corral-test/busybox`
(`scripts/build-test-images.sh`), the corral binary ($CORRAL_BIN, default
`target/debug/corral` of this repository) and the pip packages `mcp`,
`pytest` and `pytest-asyncio` (`anyio`, used for timeouts, comes with
`mcp`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import anyio
import httpx
import pytest

import corral
from conftest import remove_snapshot_images
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

try:  # mcp >= 2
    from mcp.client.streamable_http import streamable_http_client as _http_client
except ImportError:  # mcp 1.x
    from mcp.client.streamable_http import streamablehttp_client as _http_client

try:  # mcp >= 2: headers go through an http client of its own
    from mcp.shared._httpx_utils import create_mcp_http_client as _mcp_http_client
except ImportError:  # mcp 1.x: headers are an argument
    _mcp_http_client = None

try:  # mcp >= 2
    from mcp.shared.exceptions import MCPError as _McpError
except ImportError:  # mcp 1.x
    from mcp.shared.exceptions import McpError as _McpError

pytestmark = [pytest.mark.server, pytest.mark.asyncio]

REPO = Path(__file__).resolve().parents[3]

EXPECTED_TOOLS = {
    "run_code",
    "run_command",
    "read_file",
    "write_file",
    "list_files",
    "shell_run",
    "shell_close",
    "reset",
    "snapshot",
    "restore",
    "port_url",
    "egress",
}

# Snapshots the tests took, removed at the end of the module (by name:
# each lives in its MCP session's own namespace).
SNAPSHOTS: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _remove_snapshots() -> Iterator[None]:
    yield
    for name in SNAPSHOTS:
        remove_snapshot_images(name)


# Longest any one step may take: a sandbox start, a command, a teardown.
STEP_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def corral_bin() -> str:
    path = Path(os.environ.get("CORRAL_BIN", REPO / "target" / "debug" / "corral"))
    if not path.is_absolute():
        path = REPO / path
    if not path.is_file():
        pytest.fail(f"corral binary not found at {path}: run `cargo build` or set CORRAL_BIN")
    return str(path)


def _docker_ids(label: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={label}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.split()


def _remove(ids: list[str]) -> None:
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=120)


class Labelled:
    """A config file whose sandboxes carry `corraltest=<unique>`, and the
    leak checks by that label. Anything left is removed at the end, so a
    failing test still leaves nothing behind (after reporting it)."""

    def __init__(self, tag: str, defaults: str = "") -> None:
        self.value = f"{tag}-{uuid.uuid4().hex[:12]}"
        self.label = f"corraltest={self.value}"
        self._dir = tempfile.TemporaryDirectory(prefix="corral-mcp-test-")
        self.config = str(Path(self._dir.name) / "corral.yaml")
        Path(self.config).write_text(
            f"defaults:\n  labels:\n    corraltest: {self.value}\n{defaults}", encoding="utf-8"
        )

    def ids(self) -> list[str]:
        return _docker_ids(self.label)

    def wait_at_most(self, count: int, timeout: float) -> list[str]:
        """Waits until at most `count` containers carry the label; returns them."""
        deadline = time.monotonic() + timeout
        left = self.ids()
        while len(left) > count and time.monotonic() < deadline:
            time.sleep(0.25)
            left = self.ids()
        return left

    def close(self) -> None:
        _remove(self.ids())
        self._dir.cleanup()


@pytest.fixture
def labelled(request: pytest.FixtureRequest) -> Iterator[Labelled]:
    lab = Labelled(f"mcp-{request.node.name[:20]}")
    try:
        yield lab
    finally:
        lab.close()


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CORRAL_IMAGE", "corral-test/busybox")
    env.setdefault("CORRAL_LOG", "info")
    env.update(extra)
    return env


def _text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def _is_error(result: Any) -> bool:
    flag = getattr(result, "is_error", None)
    if flag is None:
        flag = getattr(result, "isError", None)
    return bool(flag)


async def _call(session: ClientSession, tool: str, args: dict[str, Any]) -> Any:
    with anyio.fail_after(STEP_TIMEOUT):
        return await session.call_tool(tool, args)


async def _ok(session: ClientSession, tool: str, args: dict[str, Any]) -> str:
    result = await _call(session, tool, args)
    text = _text(result)
    assert not _is_error(result), f"{tool} {args} failed: {text}"
    return text


async def exercise(session: ClientSession, labelled: Labelled) -> None:
    """The checks both transports must pass, on an initialized session."""
    with anyio.fail_after(STEP_TIMEOUT):
        tools = await session.list_tools()
    names = {t.name for t in tools.tools}
    assert EXPECTED_TOOLS <= names, names
    schemas = {t.name: getattr(t, "input_schema", None) or getattr(t, "inputSchema") for t in tools.tools}
    assert schemas["run_command"]["required"] == ["command"], schemas["run_command"]
    # Listing tools starts no sandbox.
    assert labelled.ids() == [], "a sandbox was started before any tool call"

    text = await _ok(session, "run_command", {"command": "echo hello"})
    assert "hello" in text and "exit code: 0" in text, text
    # The session's sandbox exists and carries the test's label.
    assert len(labelled.ids()) == 1, labelled.ids()

    result = await _call(session, "run_command", {"command": "echo oops >&2; exit 3"})
    assert _is_error(result), _text(result)
    assert "exit code: 3" in _text(result) and "oops" in _text(result), _text(result)

    result = await _call(session, "run_command", {"command": "sleep 30", "timeout_secs": 0.5})
    assert _is_error(result) and "timeout" in _text(result), _text(result)

    content = "line one\nünïcode ✓\n"
    text = await _ok(
        session,
        "write_file",
        {"path": "/tmp/mcp-test/dir/notes.txt", "content": content, "mkdirs": True},
    )
    assert "/tmp/mcp-test/dir/notes.txt" in text, text
    assert await _ok(session, "read_file", {"path": "/tmp/mcp-test/dir/notes.txt"}) == content
    # The file is really in the sandbox, not an echo of the tool.
    text = await _ok(session, "run_command", {"command": "cat /tmp/mcp-test/dir/notes.txt"})
    assert "ünïcode ✓" in text, text

    listing = await _ok(session, "list_files", {"path": "/tmp/mcp-test/dir"})
    assert "notes.txt" in listing, listing
    assert str(len(content.encode())) in listing, listing
    listing = await _ok(session, "list_files", {"path": "/tmp/mcp-test"})
    assert "dir/" in listing, listing

    result = await _call(session, "read_file", {"path": "/tmp/mcp-test/missing"})
    assert _is_error(result) and "not found" in _text(result), _text(result)

    await _ok(session, "shell_run", {"command": "cd /tmp/mcp-test/dir && export GREETING=hi"})
    text = await _ok(session, "shell_run", {"command": 'pwd; echo "$GREETING"'})
    assert "/tmp/mcp-test/dir" in text and "hi" in text, text
    # Another named session has its own state.
    text = await _ok(session, "shell_run", {"command": "pwd", "session": "other"})
    assert "/tmp/mcp-test/dir" not in text, text
    await _ok(session, "shell_close", {"session": "main"})
    text = await _ok(session, "shell_run", {"command": 'echo "[$GREETING]"'})
    assert "[]" in text and "restarted" not in text, text

    # A bad argument is an MCP error naming the field and the value.
    with pytest.raises(_McpError) as bad:
        await _call(session, "run_command", {"command": "true", "timeout_secs": -5})
    assert "timeout_secs" in str(bad.value) and "-5" in str(bad.value), str(bad.value)
    with pytest.raises(_McpError) as bad:
        await _call(session, "shell_run", {"command": "true", "session": "no spaces"})
    assert "session" in str(bad.value) and "no spaces" in str(bad.value), str(bad.value)

    # This sandbox was not started pristine: a reset replaces its container
    # (the old one is gone) and says why.
    text = await _ok(session, "reset", {})
    assert "replaced" in text and "pristine is false" in text, text
    assert len(labelled.ids()) == 1, labelled.ids()
    result = await _call(session, "read_file", {"path": "/tmp/mcp-test/dir/notes.txt"})
    assert _is_error(result) and "not found" in _text(result), _text(result)
    # Snapshot, change, restore: the session's sandbox is replaced by a
    # fork of the snapshot (the old one released) with the files as kept.
    snap = f"mcp-{uuid.uuid4().hex[:12]}"
    SNAPSHOTS.append(snap)
    await _ok(session, "write_file", {"path": "/srv/mcp-snap/f", "content": "kept", "mkdirs": True})
    text = await _ok(session, "snapshot", {"name": snap})
    assert snap in text, text
    await _ok(session, "write_file", {"path": "/srv/mcp-snap/f", "content": "changed"})
    before = labelled.ids()
    text = await _ok(session, "restore", {"name": snap})
    assert "restored" in text, text
    assert await _ok(session, "read_file", {"path": "/srv/mcp-snap/f"}) == "kept"
    after = labelled.ids()
    assert len(after) == 1 and after != before, (before, after)
    result = await _call(session, "restore", {"name": "no-such-snapshot-here"})
    assert _is_error(result) and "no such snapshot" in _text(result), _text(result)
    with pytest.raises(_McpError) as bad:
        await _call(session, "snapshot", {"name": "Bad Name"})
    assert "name" in str(bad.value) and "Bad Name" in str(bad.value), str(bad.value)


async def test_stdio_session_runs_commands_and_files_then_cleans_up(
    corral_bin: str, labelled: Labelled
) -> None:
    params = StdioServerParameters(
        command=corral_bin,
        args=["--config", labelled.config, "mcp"],
        env=_env(),
    )
    with tempfile.TemporaryFile(mode="w+") as errlog:
        try:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    with anyio.fail_after(STEP_TIMEOUT):
                        init = await session.initialize()
                    info = getattr(init, "server_info", None) or getattr(init, "serverInfo")
                    assert info.name == "corral", info
                    assert "sandbox" in (init.instructions or ""), init.instructions
                    await exercise(session, labelled)
        except BaseException:
            errlog.seek(0)
            sys.stderr.write(f"--- corral mcp stderr ---\n{errlog.read()}\n")
            raise
    # The client closed stdin and the server exited: its sandbox is gone.
    left = labelled.ids()
    assert left == [], f"corral mcp left containers behind: {left}"


def _structured(result: Any) -> Any:
    return getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)


async def test_reset_tool_returns_a_pristine_sandbox_to_its_start(corral_bin: str) -> None:
    lab = Labelled("mcp-reset", defaults="  pristine: true\n")
    params = StdioServerParameters(command=corral_bin, args=["--config", lab.config, "mcp"], env=_env())
    try:
        with tempfile.TemporaryFile(mode="w+") as errlog:
            try:
                async with stdio_client(params, errlog=errlog) as (read, write):
                    async with ClientSession(read, write) as session:
                        with anyio.fail_after(STEP_TIMEOUT):
                            await session.initialize()
                            tools = await session.list_tools()
                        reset = next(t for t in tools.tools if t.name == "reset")
                        assert "pristine" in (reset.description or ""), reset.description
                        # Before any other call: nothing to reset, nothing started.
                        text = await _ok(session, "reset", {})
                        assert "already pristine" in text, text
                        assert lab.ids() == []

                        await _ok(
                            session,
                            "write_file",
                            {"path": "/etc/mcp-reset/marker", "content": "dirty", "mkdirs": True},
                        )
                        await _ok(session, "run_command", {"command": "sleep 1000 >/dev/null 2>&1 &"})
                        await _ok(session, "shell_run", {"command": "export KEPT=1"})
                        container = lab.ids()
                        assert len(container) == 1, container

                        result = await _call(session, "reset", {})
                        text = _text(result)
                        assert not _is_error(result), text
                        assert "in place" in text, text
                        data = _structured(result)
                        assert data["mode"] == "in_place" and data["fallback_reason"] is None, data
                        assert data["killed"] >= 1, data

                        text = await _ok(
                            session,
                            "run_command",
                            {
                                "command": "test -e /etc/mcp-reset/marker && echo kept || echo gone; "
                                "for p in /proc/[0-9]*; do cat $p/comm; done 2>/dev/null | grep -c '^sleep$' || true"
                            },
                        )
                        assert "gone" in text and "kept" not in text, text
                        assert "\n0" in text, text
                        # A fresh shell, not reported as a lost one.
                        text = await _ok(session, "shell_run", {"command": 'echo "[$KEPT]"'})
                        assert "[]" in text and "restarted" not in text, text
                        # In place: the same container.
                        assert lab.ids() == container
            except BaseException:
                errlog.seek(0)
                sys.stderr.write(f"--- corral mcp stderr ---\n{errlog.read()}\n")
                raise
        left = lab.ids()
        assert left == [], f"corral mcp left containers behind: {left}"
    finally:
        lab.close()


@contextlib.asynccontextmanager
async def _http_streams(url: str, token: str) -> AsyncIterator[Any]:
    """The MCP client's streamable HTTP transport, sending the token."""
    headers = {"Authorization": f"Bearer {token}"}
    if _mcp_http_client is not None:
        async with _mcp_http_client(headers=headers) as http:
            async with _http_client(url, http_client=http) as streams:
                yield streams
    else:
        async with _http_client(url, headers=headers) as streams:
            yield streams


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`corral serve` as a subprocess, its stderr kept for failures."""

    def __init__(self, corral_bin: str, config: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.token = ""
        self._err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [corral_bin, "--config", config, "serve", "--listen", f"127.0.0.1:{self.port}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._err,
            env=_env(),
        )

    def stderr(self) -> str:
        self._err.seek(0)
        return self._err.read()

    def wait_listening(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"corral serve exited with {self.proc.returncode}:\n{self.stderr()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
            except OSError:
                time.sleep(0.1)
                continue
            # The service generated its token (no token is configured):
            # clients find it in its token file, as corral's own client does.
            self.token = corral.find_token(f"http://127.0.0.1:{self.port}")
            if self.token:
                return
            time.sleep(0.1)
        pytest.fail(f"corral serve did not listen on port {self.port} with a token file:\n{self.stderr()}")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then waits for the graceful shutdown; kills on timeout."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
            pytest.fail(f"corral serve did not stop within {timeout}s of SIGTERM:\n{self.stderr()}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._err.close()


@pytest.fixture
def server(corral_bin: str, labelled: Labelled) -> Iterator[Server]:
    srv = Server(corral_bin, labelled.config)
    try:
        srv.wait_listening()
        yield srv
    finally:
        srv.close()


async def test_streamable_http_sessions_get_own_sandboxes_released_on_close(
    server: Server, labelled: Labelled
) -> None:
    try:
        async with _http_streams(server.url, server.token) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                with anyio.fail_after(STEP_TIMEOUT):
                    init = await session.initialize()
                info = getattr(init, "server_info", None) or getattr(init, "serverInfo")
                assert info.name == "corral", info
                await exercise(session, labelled)

                # port_url: a link through the service to a server in the
                # session's sandbox, followed with a plain HTTP client.
                await _ok(
                    session,
                    "run_command",
                    {
                        "command": "mkdir -p /tmp/www && echo via-mcp-link > /tmp/www/index.html && "
                        "httpd -p 8082 -h /tmp/www </dev/null >/dev/null 2>&1; "
                        "for i in $(seq 1 50); do wget -q -O /dev/null http://127.0.0.1:8082/ && exit 0; sleep 0.1; done; exit 1"
                    },
                )
                text = await _ok(session, "port_url", {"port": 8082})
                url = text.split()[0]
                assert not url.startswith(server.url + "/"), f"a link on the API's origin: {url}"
                # Its host name is its own; glibc does not resolve
                # *.localhost, so the listener is reached with it as Host.
                parts = urllib.parse.urlsplit(url)
                assert parts.hostname.startswith("8082-") and parts.hostname.endswith(".localhost"), url
                assert f"'Host: {parts.netloc}'" in text, text
                page = await anyio.to_thread.run_sync(
                    lambda: httpx.get(f"http://127.0.0.1:{parts.port}{parts.path}", headers={"Host": parts.netloc}, timeout=30)
                )
                assert page.status_code == 200 and page.text == "via-mcp-link\n", (url, page.text)
                with pytest.raises(_McpError) as bad:
                    await _call(session, "port_url", {"port": 70000})
                assert "port" in str(bad.value), bad.value

                # A second MCP session gets a sandbox of its own.
                async with _http_streams(server.url, server.token) as streams2:
                    async with ClientSession(streams2[0], streams2[1]) as other:
                        with anyio.fail_after(STEP_TIMEOUT):
                            await other.initialize()
                        text = await _ok(
                            other,
                            "run_command",
                            {"command": "test -e /tmp/mcp-test/dir/notes.txt && echo shared || echo separate"},
                        )
                        assert "separate" in text, text
                        assert len(labelled.ids()) == 2, labelled.ids()
                # Closing that session (DELETE) released its sandbox while the
                # server and the first session live on.
                left = await anyio.to_thread.run_sync(labelled.wait_at_most, 1, 60.0)
                assert len(left) == 1, f"the closed session's sandbox was not released: {left}"
                await _ok(session, "run_command", {"command": "true"})
        # The first session is closed too: nothing of this test is left.
        left = await anyio.to_thread.run_sync(labelled.wait_at_most, 0, 60.0)
        assert left == [], f"closed MCP sessions left containers behind: {left}"
    except BaseException:
        sys.stderr.write(f"--- corral serve stderr ---\n{server.stderr()}\n")
        raise
    code = server.stop()
    assert code == 0, f"corral serve exited with {code}:\n{server.stderr()}"
    assert labelled.ids() == [], "corral serve left containers behind after stopping"
