"""The real ``e2b`` SDK (from PyPI, pinned in scripts/python-env.sh) against a
real ``corral serve`` with its E2B-compatible listener, configured through
nothing but the SDK's environment variables (E2B_API_URL, E2B_SANDBOX_URL,
E2B_API_KEY). Every SDK call of the E2B surface is exercised, sync and async,
and the principals are attacked: another tenant's API key, and one sandbox's
envd access token against another sandbox.

Run under the newest pinned SDK and, with ``E2B_SDK_DIR`` (a directory the
oldest supported SDK is installed into with ``pip install --target``), the
oldest: the same file, unchanged.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Awaitable, Callable, Dict, Iterator, List

import httpx
import pytest

if os.environ.get("E2B_SDK_DIR"):
    sys.path.insert(0, os.environ["E2B_SDK_DIR"])

e2b = pytest.importorskip("e2b")
from e2b import AsyncSandbox, Sandbox  # noqa: E402
from e2b.exceptions import (  # noqa: E402
    AuthenticationException,
    NotFoundException,
    SandboxException,
    TimeoutException,
)
from e2b.sandbox.commands.command_handle import CommandExitException  # noqa: E402

from corral.testing import LocalServer, free_port  # noqa: E402

from conftest import IMAGE, LABELS, assert_no_leaks, corral_binary, remove_snapshot_images  # noqa: E402

pytestmark = [
    pytest.mark.server,
    # A finalizer that fails (a stream closed by the garbage collector that
    # hung until pytest-timeout) fails the test instead of passing with a
    # warning.
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
]


def e2b_version() -> str:
    from importlib.metadata import version

    return getattr(e2b, "__version__", None) or version("e2b")

TOKEN = "tok-e2b-default-" + uuid.uuid4().hex
OTHER_TOKEN = "tok-e2b-other-" + uuid.uuid4().hex
RUN = uuid.uuid4().hex[:10]


@pytest.fixture(scope="module", autouse=True)
def _garbage_collected_inside_the_pool_lock() -> Iterator[None]:
    """The worst moment a busy machine's garbage collector can pick, every
    time: inside the lock of httpcore's connection pool (the transport of
    the SDKs before pyqwest, 2.7.0 among them).

    A command handle the test never waited on holds an unfinished envd
    stream; once it is garbage in a reference cycle (a ``pytest.raises(...)
    as info`` in the same test makes one), the collector finalizes it
    wherever it runs, and closing the stream takes the pool lock again: a
    non-reentrant lock, so the thread waits on itself forever (httpcore
    issues 990 and 996). Under load that moment moved into a fixture's
    ``Sandbox.kill()``; here it is every request, so a handle left open
    hangs this file at once (and pytest-timeout fails it), not one run in
    three on a busy machine.
    """
    try:
        import httpcore._sync.connection_pool as pool
    except ImportError:
        yield
        return
    assign = pool.ConnectionPool._assign_requests_to_connections

    def collect_then_assign(self):  # type: ignore[no-untyped-def]
        gc.collect()
        return assign(self)

    pool.ConnectionPool._assign_requests_to_connections = collect_then_assign
    try:
        yield
    finally:
        pool.ConnectionPool._assign_requests_to_connections = assign


def run_on_a_new_loop(main: Callable[[], Awaitable[None]]) -> None:
    """``asyncio.run(main())`` for a test's async SDK calls.

    SDKs before pyqwest (2.7.0 among them) keep one async transport for the
    whole process (``AsyncTransportWithLogger.singleton``), and its pooled
    connections belong to the event loop that opened them. A second
    ``asyncio.run`` in the same process then closes a stale connection on
    the first, closed, loop (``RuntimeError: Event loop is closed``), so the
    second async test on a pytest worker failed whenever the first had run
    there. A user's program that calls ``asyncio.run`` once never meets this;
    a test per loop drops the process-wide transport first.
    """
    try:
        from e2b.api.client_async import AsyncTransportWithLogger
    except ImportError:
        pass
    else:
        if hasattr(AsyncTransportWithLogger, "singleton"):
            AsyncTransportWithLogger.singleton = None
    asyncio.run(main())


@contextlib.contextmanager
def e2b_service(**sections: Dict[str, object]) -> Iterator[Dict[str, str]]:
    """A corral serve of its own (two tenants, an E2B listener; `sections`
    merged over its config, one level deep), and the SDK's environment
    pointing at it. Shared by the other E2B test files."""
    e2b_port = free_port()
    config: Dict[str, Dict[str, object]] = {
        "defaults": {"image": IMAGE, "labels": dict(LABELS)},
        "server": {
            "token": TOKEN,
            "tenants": {"other": {"token": OTHER_TOKEN}},
            "e2b_listen": f"127.0.0.1:{e2b_port}",
        },
    }
    for name, values in sections.items():
        config.setdefault(name, {}).update(values)
    server = LocalServer(corral_binary(), config=config)
    server.start()
    url = f"http://127.0.0.1:{e2b_port}"
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DOMAIN")}
    os.environ["E2B_API_URL"] = url
    os.environ["E2B_SANDBOX_URL"] = url
    os.environ["E2B_API_KEY"] = TOKEN
    os.environ.pop("E2B_DOMAIN", None)
    try:
        yield {"url": url, "corral": server.url}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        code = server.stop()
        tail = server.log_tail()
        server.close()
        assert_no_leaks()
        assert code == 0, f"corral serve exited with {code}:\n{tail}"


@pytest.fixture(scope="module")
def e2b_server() -> Iterator[Dict[str, str]]:
    """A corral serve of its own (two tenants, an E2B listener), and the
    SDK's environment pointing at it."""
    with e2b_service() as server:
        yield server


@pytest.fixture
def sbx(e2b_server: Dict[str, str]) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(timeout=300, metadata={"run": RUN}, envs={"GREETING": "hello"})
    try:
        yield sandbox
    finally:
        sandbox.kill()


# -- the control plane -------------------------------------------------------


def test_lifecycle_list_info_timeout_connect_kill(e2b_server: Dict[str, str]) -> None:
    sandbox = Sandbox.create(timeout=120, metadata={"run": RUN, "case": "life"})
    try:
        assert sandbox.is_running()
        info = sandbox.get_info()
        assert info.sandbox_id == sandbox.sandbox_id
        assert info.metadata == {"run": RUN, "case": "life"}
        first_end = info.end_at
        sandbox.set_timeout(600)
        assert sandbox.get_info().end_at > first_end

        listed = Sandbox.list(query=e2b.SandboxQuery(metadata={"case": "life"})).next_items()
        assert [s.sandbox_id for s in listed] == [sandbox.sandbox_id]
        assert Sandbox.list(query=e2b.SandboxQuery(metadata={"case": "none"})).next_items() == []

        again = Sandbox.connect(sandbox.sandbox_id)
        assert again.commands.run("echo $((6*7))").stdout == "42\n"
    finally:
        assert sandbox.kill() is True
    assert Sandbox.kill(sandbox.sandbox_id) is False
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sandbox.sandbox_id)
    assert not sandbox.is_running()


def test_a_timeout_of_zero_ends_the_sandbox_now(e2b_server: Dict[str, str]) -> None:
    # E2B's set_timeout(0) is "time out now"; it was refused as a bad value.
    sandbox = Sandbox.create(timeout=300)
    try:
        sandbox.set_timeout(0)
        _ended(sandbox)
    finally:
        with contextlib.suppress(Exception):
            sandbox.kill()


def test_refreshes_keep_alive_and_network_updates_are_refused_by_name(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    import datetime

    url, mine = e2b_server["url"], {"X-API-KEY": TOKEN}
    theirs = {"X-API-KEY": OTHER_TOKEN}
    before = Sandbox.get_info(sbx.sandbox_id).end_at
    r = httpx.post(f"{url}/sandboxes/{sbx.sandbox_id}/refreshes", json={"duration": 3000}, headers=mine)
    assert r.status_code == 204, r.text
    after = Sandbox.get_info(sbx.sandbox_id).end_at
    assert after > before and after > datetime.datetime.now(after.tzinfo) + datetime.timedelta(seconds=2900), (before, after)
    for body, field in (({"duration": 0}, "duration"), ({"duration": 10**9}, "duration"), ({"ttl": 5}, "ttl")):
        r = httpx.post(f"{url}/sandboxes/{sbx.sandbox_id}/refreshes", json=body, headers=mine)
        assert r.status_code == 400 and field in r.json()["message"], r.text
    r = httpx.post(f"{url}/sandboxes/{sbx.sandbox_id}/refreshes", json={"duration": 60}, headers=theirs)
    assert r.status_code == 404, r.text

    r = httpx.put(f"{url}/sandboxes/{sbx.sandbox_id}/network", json={"denyOut": ["0.0.0.0/0"]}, headers=mine)
    assert r.status_code == 501 and r.json()["message"].startswith("network"), r.text
    r = httpx.put(f"{url}/sandboxes/{sbx.sandbox_id}/network", json={}, headers=theirs)
    assert r.status_code == 404, r.text
    if hasattr(sbx, "update_network"):
        with pytest.raises(SandboxException, match="network"):
            sbx.update_network({"deny_out": ["8.8.8.8"]})
    assert sbx.is_running()


def test_a_sandbox_ends_when_its_timeout_passes(e2b_server: Dict[str, str]) -> None:
    sandbox = Sandbox.create(timeout=1)
    _ended(sandbox)


def _ended(sandbox: Sandbox) -> None:
    """Waits (on the SDK's own probe, so with no wall-clock assertion) for
    the lifetime timer to release `sandbox`, and checks it is gone."""
    for _ in range(200):
        if not sandbox.is_running():
            break
        asyncio.run(asyncio.sleep(0.1))
    assert not sandbox.is_running()
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sandbox.sandbox_id)


def _docker_state(server: Dict[str, str], sandbox_id: str) -> str:
    # The E2B sandbox is a sandbox of corral's own API too (one runtime):
    # its container is named there.
    r = httpx.get(f"{server['corral']}/v1/sandboxes/{sandbox_id}", headers={"Authorization": f"Bearer {TOKEN}"})
    r.raise_for_status()
    out = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Status}}", r.json()["container_id"]],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    return out


def test_pause_freezes_with_memory_kept_and_connect_resumes(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    if not hasattr(sbx, "pause"):
        pytest.skip(f"e2b {e2b_version()} has no pause")
    # A process holding a value only in its memory.
    keeper = sbx.commands.run("read v; sleep 600; echo never", background=True, stdin=True)
    sbx.commands.send_stdin(keeper.pid, "kept\n")
    sbx.files.write("/keeper.pid", str(keeper.pid))
    sbx.pause()
    assert _docker_state(e2b_server, sbx.sandbox_id) == "paused"
    assert Sandbox.get_info(sbx.sandbox_id).state == e2b.SandboxState.PAUSED
    assert not sbx.is_running()
    with pytest.raises(SandboxException, match="paused"):
        sbx.files.read("/keeper.pid")
    assert sbx.pause() is False  # already paused: E2B's 409
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert _docker_state(e2b_server, sbx.sandbox_id) == "running"
    assert resumed.get_info().state == e2b.SandboxState.RUNNING
    # The same process, alive: its memory was kept.
    assert keeper.pid in [p.pid for p in resumed.commands.list()]
    assert resumed.commands.run(f"kill -0 {keeper.pid} && echo alive").stdout == "alive\n"
    keeper.disconnect()


def test_list_pages_orders_and_filters(e2b_server: Dict[str, str]) -> None:
    case = uuid.uuid4().hex[:8]
    older = Sandbox.create(timeout=120, metadata={"run": RUN, "case": case})
    asyncio.run(asyncio.sleep(1.1))  # startedAt is shown to the second
    newer = Sandbox.create(timeout=120, metadata={"run": RUN, "case": case})
    try:
        query = e2b.SandboxQuery(metadata={"case": case})
        # Newest first, one a page, then no more.
        pages = Sandbox.list(query=query, limit=1)
        assert [s.sandbox_id for s in pages.next_items()] == [newer.sandbox_id]
        assert pages.has_next and pages.next_token
        assert [s.sandbox_id for s in pages.next_items()] == [older.sandbox_id]
        assert not pages.has_next
        fields = getattr(e2b.SandboxQuery, "__dataclass_fields__", {})
        if "template" in fields:  # SDKs that send order, startedAfter, template
            ids = lambda p: [s.sandbox_id for s in p.next_items()]  # noqa: E731
            assert ids(Sandbox.list(query=query, order="asc")) == [older.sandbox_id, newer.sandbox_id]
            assert ids(Sandbox.list(query=query, order="desc")) == [newer.sandbox_id, older.sandbox_id]
            started = newer.get_info().started_at
            after = e2b.SandboxQuery(metadata={"case": case}, started_after=started)
            assert ids(Sandbox.list(query=after)) == [newer.sandbox_id]
            template = e2b.SandboxQuery(metadata={"case": case}, template=newer.get_info().template_id)
            assert len(ids(Sandbox.list(query=template))) == 2
            unknown = e2b.SandboxQuery(metadata={"case": case}, template="unknown-template")
            assert ids(Sandbox.list(query=unknown)) == []
        url, key = e2b_server["url"], {"X-API-KEY": TOKEN}
        for params, field in (({"limit": "0"}, "limit"), ({"order": "up"}, "order"),
                              ({"nextToken": "x"}, "nextToken"), ({"startedAfter": "today"}, "startedAfter")):
            r = httpx.get(f"{url}/v2/sandboxes", params=params, headers=key)
            assert r.status_code == 400 and r.json()["message"].startswith(field), r.text
    finally:
        older.kill()
        newer.kill()


def test_a_pause_without_memory_is_refused_by_name(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    r = httpx.post(f"{e2b_server['url']}/sandboxes/{sbx.sandbox_id}/pause", json={"memory": False},
                   headers={"X-API-KEY": TOKEN})
    assert r.status_code == 501 and r.json()["message"].startswith("memory: false"), r.text
    assert _docker_state(e2b_server, sbx.sandbox_id) == "running"
    assert Sandbox.get_info(sbx.sandbox_id).state == e2b.SandboxState.RUNNING
    if not hasattr(sbx, "pause"):
        return
    try:
        paused = sbx.pause(keep_memory=False)  # SDKs that send it
    except TypeError:
        return
    except SandboxException as e:
        assert "memory: false" in str(e)
    else:
        raise AssertionError(f"pause(keep_memory=False) answered {paused!r}")
    assert sbx.is_running()


def test_templates_go_through_the_image_policy(e2b_server: Dict[str, str]) -> None:
    with pytest.raises(SandboxException, match="templateID 'registry.invalid/nope:1' is not allowed"):
        Sandbox.create(template="registry.invalid/nope:1")


def test_a_template_naming_a_snapshot_forks_it(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    name = f"e2b-snap-{RUN}"
    sbx.files.write("/from-snapshot.txt", "kept")
    # Snapshots are corral's own API: the same sandbox, the same token.
    r = httpx.post(
        f"{e2b_server['corral']}/v1/sandboxes/{sbx.sandbox_id}/snapshot",
        json={"name": name},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=120,
    )
    assert r.status_code in (200, 201), r.text
    try:
        fork = Sandbox.create(template=name, timeout=120)
        try:
            assert fork.get_info().template_id == name
            assert fork.files.read("/from-snapshot.txt") == "kept"
        finally:
            fork.kill()
        # Another tenant's key does not see the snapshot: the name is then
        # an image, which the policy refuses.
        with pytest.raises(SandboxException, match=f"templateID '{name}'"):
            Sandbox.create(template=name, api_key=OTHER_TOKEN)
    finally:
        remove_snapshot_images(name)


def test_bad_input_names_the_field_or_route(e2b_server: Dict[str, str]) -> None:
    url = e2b_server["url"]
    r = httpx.post(f"{url}/v2/sandboxes", json={"templateID": 5}, headers={"X-API-KEY": TOKEN})
    assert r.status_code == 400 and "templateID" in r.json()["message"]
    body = {"templateID": "base", "volumeMounts": [{"name": "v", "path": "/v"}]}
    r = httpx.post(f"{url}/v2/sandboxes", json=body, headers={"X-API-KEY": TOKEN})
    assert r.status_code == 400 and "volumeMounts" in r.json()["message"]
    r = httpx.get(f"{url}/v3/sandboxes", headers={"X-API-KEY": TOKEN})
    assert r.status_code == 404 and "GET /v3/sandboxes" in r.json()["message"]
    r = httpx.get(f"{url}/v2/sandboxes")
    assert r.status_code == 401 and "X-API-KEY" in r.json()["message"]


# -- commands ------------------------------------------------------------------


def test_foreground_commands_stream_and_keep_envs(sbx: Sandbox) -> None:
    out: List[str] = []
    err: List[str] = []
    r = sbx.commands.run(
        "echo $GREETING; echo $EXTRA; echo oops >&2; pwd",
        envs={"EXTRA": "more"},
        cwd="/tmp",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert r.exit_code == 0
    assert r.stdout == "hello\nmore\n/tmp\n"
    assert r.stderr == "oops\n"
    assert "".join(out) == r.stdout and "".join(err) == r.stderr


def test_a_non_zero_exit_raises_command_exit_exception(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as info:
        sbx.commands.run("echo partial; exit 3")
    assert info.value.exit_code == 3
    assert info.value.stdout == "partial\n"


def test_a_command_timeout_kills_it(sbx: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=1)
    # The client gives up at its deadline; the service kills the command at
    # the same one (well before the sleep would end).
    for _ in range(100):
        if all("sleep 30" not in " ".join(p.args) for p in sbx.commands.list()):
            break
        asyncio.run(asyncio.sleep(0.1))
    assert all("sleep 30" not in " ".join(p.args) for p in sbx.commands.list())
    assert "sleep 30" not in sbx.commands.run("ps -o args").stdout


def test_background_commands_stdin_list_connect_kill(sbx: Sandbox) -> None:
    handle = sbx.commands.run("read line; echo got:$line", background=True, stdin=True)
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    sbx.commands.send_stdin(handle.pid, "abc\n")
    assert handle.wait().stdout == "got:abc\n"

    if hasattr(sbx.commands, "stream_input"):
        fed = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.stream_input(fed.pid, ["a\n", b"b\n"])
        sbx.commands.close_stdin(fed.pid)
        assert fed.wait().stdout == "a\nb\n"
    if hasattr(sbx.commands, "close_stdin"):
        cat = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.send_stdin(cat.pid, "one\n")
        sbx.commands.close_stdin(cat.pid)
        assert cat.wait().stdout == "one\n"

    ticker = sbx.commands.run("echo started; sleep 600", background=True)
    seen: List[str] = []
    again = sbx.commands.connect(ticker.pid)
    assert sbx.commands.kill(ticker.pid) is True
    with pytest.raises(CommandExitException) as info:
        again.wait(on_stdout=seen.append)
    assert info.value.exit_code == -1
    assert "signal" in (info.value.error or "")
    assert sbx.commands.kill(ticker.pid) is False
    assert ticker.pid not in [p.pid for p in sbx.commands.list()]
    # A handle never waited on still holds its stream open: let it go, as
    # the SDK asks (see _garbage_collected_inside_the_pool_lock).
    ticker.disconnect()


# -- terminals --------------------------------------------------------------

PTY_IMAGE = os.environ.get("CORRAL_PYTHON_IMAGE", "corral-test/python")


def pty_image() -> str:
    """The image the SDK's PTY runs in: it starts ``/bin/bash -i -l``,
    which busybox lacks."""
    if subprocess.run(["docker", "image", "inspect", PTY_IMAGE], capture_output=True).returncode != 0:
        pytest.skip(f"{PTY_IMAGE} is not built: scripts/build-test-images.sh --python")
    return PTY_IMAGE


def test_pty_create_send_stdin_resize_kill(e2b_server: Dict[str, str]) -> None:
    from e2b.sandbox.commands.command_handle import PtySize

    sandbox = Sandbox.create(template=pty_image(), timeout=180, metadata={"run": RUN, "flavor": "pty"})
    try:
        term = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=120)
        events = iter(term)
        out = bytearray()

        def until(needle: bytes) -> str:
            """The terminal's output from now until ``needle`` shows."""
            start = len(out)
            for _, _, chunk in events:
                if chunk:
                    out.extend(chunk)
                    if needle in out[start:]:
                        return out[start:].decode(errors="replace")
            raise AssertionError(f"the terminal ended before {needle!r}: {bytes(out)!r}")

        # A prompt that shows only when the shell reads again: its text as
        # typed ("$((1+1))") differs from its expansion ("2").
        sandbox.pty.send_stdin(term.pid, b"PS1='R$((1+1))> '; echo $((6*7)); tty; stty size\n")
        seen = until(b"24 80\r\n")
        assert "42\r\n" in seen and "/dev/pts/" in seen, seen

        sandbox.pty.resize(term.pid, PtySize(rows=40, cols=100))
        sandbox.pty.send_stdin(term.pid, b"stty size\n")
        until(b"40 100\r\n")
        if hasattr(sandbox.pty, "stream_input"):
            sandbox.pty.stream_input(term.pid, [b"echo str", b"eamed$((2+1))\n"])
            until(b"streamed3\r\n")

        # An interactive program: the python3 REPL.
        sandbox.pty.send_stdin(term.pid, b"python3 -q\n")
        until(b">>> ")
        sandbox.pty.send_stdin(term.pid, b"print(6*7)\n")
        until(b"42\r\n>>> ")
        sandbox.pty.send_stdin(term.pid, b"exit()\n")
        until(b"R2> ")
        # What is typed just as the shell takes the terminal back from
        # python3 can lose its first bytes (the shell then runs a truncated
        # line: "leep: command not found"). Probe until a whole line comes
        # through; each probe's answer differs from its text as typed.
        for attempt in range(5):
            sandbox.pty.send_stdin(term.pid, b"echo $((%d*3))ready\n" % (attempt + 3))
            seen = until(b"R2> ")
            if f"{(attempt + 3) * 3}ready" in seen:
                break
        else:
            raise AssertionError(f"the shell never read a whole line: {bytes(out)!r}")

        # Ctrl-C interrupts the foreground command; the shell answers again.
        # The Ctrl-C is typed only once sleep runs on this terminal: typed
        # earlier, it would interrupt the shell's reading of the line.
        sandbox.pty.send_stdin(term.pid, b"sleep 100; echo $((1+1))slept\n")
        deadline = time.monotonic() + 30
        while "sleep" not in sandbox.commands.run("cat /proc/[0-9]*/comm 2>/dev/null || true").stdout.split():
            assert time.monotonic() < deadline, f"sleep never ran on the terminal: {bytes(out)!r}"
            time.sleep(0.05)
        sandbox.pty.send_stdin(term.pid, b"\x03")
        sandbox.pty.send_stdin(term.pid, b"echo $((40+2))x\n")
        assert "2slept" not in until(b"42x\r\n")

        assert term.pid in [p.pid for p in sandbox.commands.list()]
        assert sandbox.pty.kill(term.pid) is True
        with pytest.raises(CommandExitException) as info:
            term.wait()
        assert info.value.exit_code == -1
        assert sandbox.pty.kill(term.pid) is False

        # Bad sizes and a pty's input to a process without one are named.
        with pytest.raises(SandboxException, match="pty.size.cols"):
            sandbox.pty.create(PtySize(rows=24, cols=0))
        plain = sandbox.commands.run("sleep 60", background=True)
        try:
            with pytest.raises(SandboxException, match="input.pty"):
                sandbox.pty.send_stdin(plain.pid, b"x")
            # The oldest SDK's pty.resize lets its transport's own
            # exception through (not a SandboxException): the message is
            # what is checked.
            with pytest.raises(Exception, match="not started with a pty"):
                sandbox.pty.resize(plain.pid, PtySize(rows=10, cols=10))
            assert sandbox.commands.kill(plain.pid) is True
        finally:
            # An unfinished handle left to the collector hangs the SDK's
            # pool (see the fixture above).
            plain.disconnect()
    finally:
        sandbox.kill()


def test_pty_async(e2b_server: Dict[str, str]) -> None:
    from e2b.sandbox.commands.command_handle import PtySize

    image = pty_image()

    async def main() -> None:
        sandbox = await AsyncSandbox.create(template=image, timeout=180, metadata={"run": RUN, "flavor": "pty-async"})
        try:
            out = bytearray()
            term = await sandbox.pty.create(PtySize(rows=24, cols=80), on_data=out.extend, timeout=120)

            async def until(needle: bytes) -> None:
                for _ in range(300):
                    if needle in out:
                        return
                    await asyncio.sleep(0.1)
                raise AssertionError(f"{needle!r} did not show: {bytes(out)!r}")

            await sandbox.pty.send_stdin(term.pid, b"echo $((6*7))async\n")
            await until(b"42async\r\n")
            await sandbox.pty.resize(term.pid, PtySize(rows=33, cols=77))
            await sandbox.pty.send_stdin(term.pid, b"stty size\n")
            await until(b"33 77\r\n")
            await sandbox.pty.send_stdin(term.pid, b"exit 4\n")
            with pytest.raises(CommandExitException) as info:
                await term.wait()
            assert info.value.exit_code == 4
        finally:
            assert await sandbox.kill() is True

    run_on_a_new_loop(main)


def test_user_is_the_sandboxs_own_or_refused_by_name(sbx: Sandbox) -> None:
    assert sbx.commands.run("id -u", user="root").stdout == "0\n"
    with pytest.raises(SandboxException, match="user"):
        sbx.commands.run("id -u", user="nobody")


# -- files -----------------------------------------------------------------------


def test_files(sbx: Sandbox) -> None:
    info = sbx.files.write("/work/a.txt", "alpha")
    assert info.path == "/work/a.txt"
    sbx.files.write_files([
        {"path": "/work/b.bin", "data": bytes(range(256))},
        {"path": "/work/sub/c.txt", "data": "gamma"},
    ])
    assert sbx.files.read("/work/a.txt") == "alpha"
    assert sbx.files.read("/work/b.bin", format="bytes") == bytes(range(256))
    names = sorted(e.name for e in sbx.files.list("/work"))
    assert names == ["a.txt", "b.bin", "sub"]
    deep = sorted(e.path for e in sbx.files.list("/work", depth=2))
    assert "/work/sub/c.txt" in deep
    got = sbx.files.get_info("/work/b.bin")
    assert got.size == 256 and got.type == e2b.FileType.FILE
    assert sbx.files.get_info("/work/sub").type == e2b.FileType.DIR

    assert sbx.files.exists("/work/a.txt")
    assert not sbx.files.exists("/work/missing")
    assert sbx.files.make_dir("/work/new/deeper") is True
    assert sbx.files.make_dir("/work/new/deeper") is False
    moved = sbx.files.rename("/work/a.txt", "/work/new/a.txt")
    assert moved.path == "/work/new/a.txt"
    assert sbx.files.read("/work/new/a.txt") == "alpha"
    sbx.files.remove("/work/new")
    assert not sbx.files.exists("/work/new")
    with pytest.raises(NotFoundException):
        sbx.files.read("/work/new/a.txt")
    # What a command writes, files reads, and the other way round.
    sbx.commands.run("printf from-shell > /work/d.txt")
    assert sbx.files.read("/work/d.txt") == "from-shell"
    assert sbx.commands.run("cat /work/sub/c.txt").stdout == "gamma"


@pytest.fixture(scope="module")
def workdir_image() -> str:
    """An image whose WORKDIR is /home/user/work, built offline from the
    busybox test image."""
    name = "corral-test/e2b-workdir"
    subprocess.run(["docker", "build", "-q", "-t", name, "-"], check=True, capture_output=True,
                   input=b"FROM corral-test/busybox\nWORKDIR /home/user/work\n")
    return name


def test_relative_paths_are_where_commands_run(e2b_server: Dict[str, str], workdir_image: str) -> None:
    # E2B's relative paths are the user's home, where its commands run; on
    # corral, the sandbox's working directory (here the image's WORKDIR),
    # for files and commands alike. They were taken from / for files.
    sandbox = Sandbox.create(template=workdir_image, timeout=120)
    try:
        assert sandbox.commands.run("pwd").stdout.strip() == "/home/user/work"
        sandbox.files.write("rel.txt", "relative")
        assert sandbox.commands.run("cat /home/user/work/rel.txt").stdout == "relative"
        sandbox.commands.run("echo made > made.txt")
        assert sandbox.files.read("made.txt").strip() == "made"
        sandbox.files.make_dir("d/e")
        assert sandbox.files.exists("/home/user/work/d/e")
        assert [e.name for e in sandbox.files.list("d")] == ["e"]
        assert not sandbox.files.exists("/rel.txt")
    finally:
        sandbox.kill()


def test_relative_paths_watch_events_and_timeout_zero_async(e2b_server: Dict[str, str], workdir_image: str) -> None:
    # The async SDK over the same behaviours: relative paths where commands
    # run, a new file's CREATE then WRITE on the watch stream, and
    # set_timeout(0) ending the sandbox.
    async def main() -> None:
        sandbox = await AsyncSandbox.create(template=workdir_image, timeout=120)
        try:
            assert (await sandbox.commands.run("pwd")).stdout.strip() == "/home/user/work"
            await sandbox.files.write("rel.txt", "relative")
            assert (await sandbox.commands.run("cat /home/user/work/rel.txt")).stdout == "relative"
            await sandbox.files.make_dir("w")
            events: List[tuple] = []
            watch = await sandbox.files.watch_dir("w", on_event=lambda e: events.append((e.name, e.type)))
            await sandbox.files.write("w/new.txt", "content")
            wanted = [("new.txt", e2b.FilesystemEventType.CREATE), ("new.txt", e2b.FilesystemEventType.WRITE)]
            for _ in range(100):
                if events[:2] == wanted:
                    break
                await asyncio.sleep(0.1)
            await watch.stop()
            assert events[:2] == wanted, events
            await sandbox.set_timeout(0)
            for _ in range(200):
                if not await sandbox.is_running():
                    break
                await asyncio.sleep(0.1)
            assert not await sandbox.is_running()
        finally:
            with contextlib.suppress(Exception):
                await sandbox.kill()

    run_on_a_new_loop(main)


def test_files_answer_as_envd_does(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    # Removing what is not there is a no-op.
    sbx.files.remove("/nowhere/at/all")
    # A deep listing is in path order: each directory right before its own.
    for d in ("/walk/b", "/walk/a/x", "/walk/a/y"):
        sbx.files.make_dir(d)
    sbx.files.write("/walk/a.txt", "1")
    listed = [e.path for e in sbx.files.list("/walk", depth=2)]
    assert listed == ["/walk/a", "/walk/a/x", "/walk/a/y", "/walk/a.txt", "/walk/b"]
    # get_info on a symlink follows it: the target's type, its absolute path.
    sbx.commands.run("ln -s a.txt /walk/link")
    info = sbx.files.get_info("/walk/link")
    assert info.type == e2b.FileType.FILE and info.size == 1
    if getattr(info, "symlink_target", None) is not None:  # SDKs that show it
        assert info.symlink_target == "/walk/a.txt"
    # Files that state no size (/proc) have their content read, through
    # envd and through corral's own API alike.
    assert "Pid:" in sbx.files.read("/proc/self/status")
    r = httpx.get(f"{e2b_server['corral']}/v1/sandboxes/{sbx.sandbox_id}/files",
                  params={"path": "/proc/self/status"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and b"Pid:" in r.content, r.text


def test_gzip_uploads_are_decoded(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    import gzip

    url = e2b_server["url"]
    envd = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token}
    r = httpx.post(f"{url}/files", params={"path": "/gz/a.txt"}, content=gzip.compress(b"unzipped"),
                   headers={**envd, "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert sbx.files.read("/gz/a.txt") == "unzipped"
    r = httpx.post(f"{url}/files", params={"path": "/gz/b.txt"}, content=b"plain, not gzip",
                   headers={**envd, "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"})
    assert r.status_code == 400 and "body" in r.json()["message"]
    r = httpx.post(f"{url}/files", params={"path": "/gz/c.txt"}, content=b"x",
                   headers={**envd, "Content-Type": "application/octet-stream", "Content-Encoding": "br"})
    assert r.status_code == 501 and "Content-Encoding 'br'" in r.json()["message"]


def _signed(path: str, operation: str, token: str, expiration: "int | None" = None, user: str = "") -> Dict[str, str]:
    """E2B's v1 signature of a file URL, computed as its SDK documents it:
    `v1_` and the unpadded base64 of SHA-256 over PATH:OPERATION:USER:TOKEN
    (and :EXPIRATION)."""
    import hashlib

    raw = f"{path}:{operation}:{user}:{token}" + ("" if expiration is None else f":{expiration}")
    digest = base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()
    query = {"path": path, "signature": f"v1_{digest}"}
    if expiration is not None:
        query["signature_expiration"] = str(expiration)
    if user:
        query["username"] = user
    return query


def test_signed_urls_open_one_path_one_way_until_they_expire(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    import time

    url = e2b_server["url"]
    token = sbx._envd_access_token
    sbx.files.write("/signed/a.txt", "signed data")
    # No access token, no sandbox id: the signature alone opens the file.
    r = httpx.get(f"{url}/files", params=_signed("/signed/a.txt", "read", token))
    assert r.status_code == 200 and r.content == b"signed data", r.text
    r = httpx.post(f"{url}/files", params=_signed("/signed/b.txt", "write", token), content=b"uploaded",
                   headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 200, r.text
    assert sbx.files.read("/signed/b.txt") == "uploaded"
    later = int(time.time()) + 300
    r = httpx.get(f"{url}/files", params=_signed("/signed/a.txt", "read", token, later))
    assert r.status_code == 200 and r.content == b"signed data", r.text
    # Expired: E2B's own answer.
    r = httpx.get(f"{url}/files", params=_signed("/signed/a.txt", "read", token, int(time.time()) - 120))
    assert r.status_code == 401 and r.json() == {"code": 401, "message": "signature is already expired"}, r.text

    # What a signature does not open: another path, the other operation, a
    # later expiry than signed, a tampered signature.
    refused = [
        ("get", {**_signed("/signed/a.txt", "read", token), "path": "/etc/shadow"}),
        ("post", _signed("/signed/a.txt", "read", token)),
        ("get", {**_signed("/signed/a.txt", "read", token, later), "signature_expiration": str(later + 1)}),
        ("get", {**_signed("/signed/a.txt", "read", token), "signature": "v1_" + "A" * 43}),
    ]
    for method, params in refused:
        r = httpx.request(method.upper(), f"{url}/files", params=params, content=b"overwritten" if method == "post" else None,
                          headers={"Content-Type": "application/octet-stream"})
        assert r.status_code == 401, (method, params, r.status_code, r.text)
    assert sbx.files.read("/signed/a.txt") == "signed data"
    r = httpx.get(f"{url}/files", params={"path": "/signed/a.txt"})
    assert r.status_code == 400 and "E2b-Sandbox-Id" in r.json()["message"], r.text
    r = httpx.get(f"{url}/files", params={"path": "/signed/a.txt", "signature_expiration": str(later)})
    assert r.status_code == 400 and r.json()["message"].startswith("signature_expiration"), r.text

    # Attack: another tenant's sandbox signs with its own token. Naming this
    # sandbox does not open it; not naming one opens only its own sandbox,
    # where the path does not exist.
    other = Sandbox.create(api_key=OTHER_TOKEN, timeout=120)
    try:
        theirs = other._envd_access_token
        r = httpx.get(f"{url}/files", params=_signed("/signed/a.txt", "read", theirs),
                      headers={"E2b-Sandbox-Id": sbx.sandbox_id})
        assert r.status_code == 401, r.text
        r = httpx.get(f"{url}/files", params=_signed("/signed/a.txt", "read", theirs))
        assert r.status_code == 404 and b"signed data" not in r.content, r.text
    finally:
        other.kill()

    # The SDK's own signed URLs, where it makes them.
    try:
        signed_url = sbx.download_url("/signed/a.txt", use_signature_expiration=60)
    except TypeError:
        return
    if "signature=" in signed_url:
        assert httpx.get(signed_url).content == b"signed data"


def test_watch_dir_reports_creates_writes_and_removes(sbx: Sandbox) -> None:
    sbx.files.make_dir("/watched/sub")
    handle = sbx.files.watch_dir("/watched", recursive=True)
    seen: list = []

    def until(event: tuple) -> None:
        # The watcher lists the directory a few times a second: wait for it.
        for _ in range(100):
            seen.extend((e.name, e.type) for e in handle.get_new_events())
            if event in seen:
                return
            asyncio.run(asyncio.sleep(0.1))
        assert event in seen, seen

    try:
        sbx.files.write("/watched/new.txt", "1")
        until(("new.txt", e2b.FilesystemEventType.CREATE))
        sbx.commands.run("printf 12345 > /watched/new.txt")
        until(("new.txt", e2b.FilesystemEventType.WRITE))
        sbx.commands.run("touch /watched/sub/deep")
        until(("sub/deep", e2b.FilesystemEventType.CREATE))
        sbx.files.remove("/watched/new.txt")
        until(("new.txt", e2b.FilesystemEventType.REMOVE))
    finally:
        handle.stop()
    with pytest.raises(SandboxException):
        sbx.files.watch_dir("/watched/missing")


def test_watcher_events_are_there_when_asked(sbx: Sandbox) -> None:
    # The sync SDK polls: a change made before the poll is in its answer
    # (the watcher compares the directory once more), as envd's inotify
    # events are. A new file with content is CREATE then WRITE; a
    # subdirectory whose entries change has no WRITE of its own.
    sbx.files.make_dir("/asked/sub")
    handle = sbx.files.watch_dir("/asked", recursive=True)
    try:
        sbx.files.write("/asked/new.txt", "one")
        events = [(e.name, e.type) for e in handle.get_new_events()]
        assert events == [("new.txt", e2b.FilesystemEventType.CREATE), ("new.txt", e2b.FilesystemEventType.WRITE)], events
        # Same size: the modification time tells (after a tick of the
        # kernel's coarse file clock).
        sbx.commands.run("sleep 0.05")
        sbx.files.write("/asked/new.txt", "two")
        assert ("new.txt", e2b.FilesystemEventType.WRITE) in [(e.name, e.type) for e in handle.get_new_events()]
        sbx.files.write("/asked/sub/deep.txt", "deep")
        events = [(e.name, e.type) for e in handle.get_new_events()]
        assert events[0] == ("sub/deep.txt", e2b.FilesystemEventType.CREATE), events
        assert ("sub", e2b.FilesystemEventType.WRITE) not in events, events
        assert handle.get_new_events() == []
    finally:
        handle.stop()


# -- principals: attacks ------------------------------------------------------


def test_another_tenants_key_cannot_see_connect_or_kill(sbx: Sandbox) -> None:
    other = {"api_key": OTHER_TOKEN}
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id, **other)
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id, **other)
    assert Sandbox.kill(sbx.sandbox_id, **other) is False
    listed = Sandbox.list(api_key=OTHER_TOKEN).next_items()
    assert sbx.sandbox_id not in [s.sandbox_id for s in listed]
    assert sbx.is_running()
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key="not-a-token").next_items()


def _rpc(url: str, method: str, body: dict, sandbox_id: str, token: str) -> httpx.Response:
    return httpx.post(
        f"{url}/{method}",
        content=json.dumps(body),
        headers={"Content-Type": "application/json", "E2b-Sandbox-Id": sandbox_id, "X-Access-Token": token},
    )


def test_one_sandboxs_access_token_does_not_open_another(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    url = e2b_server["url"]
    victim = Sandbox.create(timeout=120)
    try:
        victim.files.write("/secret", "victim's")
        own = sbx._envd_access_token
        # The attacker's token with the victim's id: refused, nothing read.
        r = _rpc(url, "filesystem.Filesystem/Stat", {"path": "/secret"}, victim.sandbox_id, own)
        assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
        r = httpx.get(f"{url}/files", params={"path": "/secret"},
                      headers={"E2b-Sandbox-Id": victim.sandbox_id, "X-Access-Token": own})
        assert r.status_code == 401 and b"victim" not in r.content
        r = _rpc(url, "process.Process/List", {}, victim.sandbox_id, "")
        assert r.status_code == 401
        # An SDK object of the attacker's sandbox pointed at the victim.
        forged = Sandbox(
            sandbox_id=victim.sandbox_id,
            envd_version=sbx._envd_version,
            envd_access_token=own,
            sandbox_domain=None,
            connection_config=e2b.ConnectionConfig(
                extra_sandbox_headers={"E2b-Sandbox-Id": victim.sandbox_id, "X-Access-Token": own}
            ),
        )
        with pytest.raises((AuthenticationException, SandboxException)):
            forged.commands.run("cat /secret")
        # The victim's own token still works: the refusals were the token's.
        r = _rpc(url, "filesystem.Filesystem/Stat", {"path": "/secret"}, victim.sandbox_id,
                 victim._envd_access_token)
        assert r.status_code == 200 and r.json()["entry"]["name"] == "secret"
    finally:
        victim.kill()


def test_malformed_envd_calls_are_named(e2b_server: Dict[str, str], sbx: Sandbox) -> None:
    url, sid, tok = e2b_server["url"], sbx.sandbox_id, sbx._envd_access_token
    r = _rpc(url, "filesystem.Filesystem/Stat", {"path": 7}, sid, tok)
    assert r.status_code == 400 and r.json()["message"].startswith("path:")
    r = _rpc(url, "process.Process/SendSignal", {"process": {"pid": 1}, "signal": "SIGNAL_SIGHUP"}, sid, tok)
    assert r.status_code == 400 and r.json()["message"].startswith("signal:")
    # A server-streaming call with a truncated envelope: an error, not a hang.
    r = httpx.post(f"{url}/process.Process/Start", content=b"\x00\x00\x00\x00\x09{",
                   headers={"Content-Type": "application/connect+json", "E2b-Sandbox-Id": sid, "X-Access-Token": tok})
    assert r.status_code == 200
    flags, length = r.content[0], int.from_bytes(r.content[1:5], "big")
    end = json.loads(r.content[5:5 + length])
    assert flags == 2 and "announces 9 bytes" in end["error"]["message"]


# -- async ----------------------------------------------------------------------


def test_async_sdk(e2b_server: Dict[str, str]) -> None:
    async def main() -> None:
        sandbox = await AsyncSandbox.create(timeout=120, metadata={"run": RUN, "flavor": "async"})
        try:
            out: List[str] = []
            r = await sandbox.commands.run("echo async; echo e >&2", on_stdout=out.append)
            assert r.stdout == "async\n" and r.stderr == "e\n" and out == ["async\n"]
            with pytest.raises(CommandExitException):
                await sandbox.commands.run("exit 5")
            handle = await sandbox.commands.run("read x; echo x=$x", background=True, stdin=True)
            await sandbox.commands.send_stdin(handle.pid, "9\n")
            assert (await handle.wait()).stdout == "x=9\n"
            sleeper = await sandbox.commands.run("sleep 600", background=True)
            assert sleeper.pid in [p.pid for p in await sandbox.commands.list()]
            assert await sandbox.commands.kill(sleeper.pid) is True

            await sandbox.files.write("/a/b.txt", "async file")
            assert await sandbox.files.read("/a/b.txt") == "async file"
            assert [e.name for e in await sandbox.files.list("/a")] == ["b.txt"]
            assert await sandbox.files.exists("/a/b.txt")
            await sandbox.files.rename("/a/b.txt", "/a/c.txt")
            assert (await sandbox.files.get_info("/a/c.txt")).size == len("async file")
            await sandbox.files.remove("/a/c.txt")
            assert not await sandbox.files.exists("/a/c.txt")

            events: List[str] = []
            await sandbox.files.make_dir("/w")
            watch = await sandbox.files.watch_dir("/w", on_event=lambda e: events.append(e.name))
            await sandbox.files.write("/w/seen.txt", "x")
            for _ in range(100):
                if "seen.txt" in events:
                    break
                await asyncio.sleep(0.1)
            await watch.stop()
            assert "seen.txt" in events

            info = await sandbox.get_info()
            assert info.metadata["flavor"] == "async"
            await sandbox.set_timeout(300)
            again = await AsyncSandbox.connect(sandbox.sandbox_id)
            assert (await again.commands.run("echo via-connect")).stdout == "via-connect\n"
            paginator = AsyncSandbox.list(query=e2b.SandboxQuery(metadata={"flavor": "async"}))
            assert [s.sandbox_id for s in await paginator.next_items()] == [sandbox.sandbox_id]
        finally:
            assert await sandbox.kill() is True
        assert not await sandbox.is_running()

    run_on_a_new_loop(main)
