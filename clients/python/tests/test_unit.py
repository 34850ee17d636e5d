"""Pieces that need no server: the SSE parser, result and error parsing,
request bodies, the retry rule (over httpx's in-process transport)."""

from __future__ import annotations

import base64
import io
import json
import tarfile
import warnings

import httpx
import pytest

import corral
from corral import _core
from corral._sse import SSEDecoder, iter_sse
from corral.errors import error_from_response


def events(*chunks: bytes):
    return list(iter_sse(chunks))


# -- SSE -------------------------------------------------------------------


def test_sse_basic_events_and_fields():
    evs = events(b'event: stdout\ndata: {"data":"hi"}\n\nevent: result\ndata: {}\n\n')
    assert [(e.event, e.data) for e in evs] == [("stdout", '{"data":"hi"}'), ("result", "{}")]


def test_sse_line_ends_split_across_chunks():
    # CRLF split between chunks, a bare CR, and an event cut mid-field.
    evs = events(b"event: a\r", b"\ndata: 1\r\n\r", b"\nevent: b\rdata: 2\r\rev", b"ent: c\ndata: 3\n", b"\n")
    assert [(e.event, e.data) for e in evs] == [("a", "1"), ("b", "2"), ("c", "3")]


def test_sse_multiline_data_comments_and_defaults():
    evs = events(b": keep-alive\n\ndata: one\ndata:two\ndata\n\nid: 7\nretry: 300\ndata: x\n\n")
    assert evs[0].event == "message"
    assert evs[0].data == "one\ntwo\n"
    assert evs[1].id == "7" and evs[1].retry == 300


def test_sse_event_without_data_is_dropped_and_partial_event_at_eof_too():
    evs = events(b"event: lonely\n\nevent: x\ndata: y\n\nevent: cut\ndata: z")
    assert [(e.event, e.data) for e in evs] == [("x", "y")]


def test_sse_utf8_split_inside_a_character_and_bom():
    payload = "data: h\u00e9llo \u2603\n\n".encode()
    d = SSEDecoder()
    out = []
    for i in range(len(b"\xef\xbb\xbf" + payload)):
        out += d.feed((b"\xef\xbb\xbf" + payload)[i : i + 1])
    out += d.close()
    assert [e.data for e in out] == ["h\u00e9llo \u2603"]


# -- results and errors ----------------------------------------------------


def test_result_parsing_decodes_base64_and_failure():
    r = corral.CommandResult.from_json(
        {
            "exit_code": None,
            "signal": 9,
            "stdout": "\ufffd",
            "stdout_base64": base64.b64encode(b"\xff").decode(),
            "stderr": "e",
            "stdout_truncated": True,
            "stderr_truncated": False,
            "stdout_total_bytes": 10,
            "stderr_total_bytes": 1,
            "duration_ms": 12.5,
            "failure": {"kind": "timeout", "retryable": False, "message": "timed out", "container": None},
            "sandbox_id": "sb-1",
            "restarted": False,
            "ended": True,
        }
    )
    assert r.stdout_bytes == b"\xff" and r.stderr_bytes == b"e"
    assert r.truncated and r.duration == 0.0125 and not r.ok
    assert r.failure == corral.Failure(kind="timeout", message="timed out", retryable=False)
    assert r.ended is True and r.restarted is False
    with pytest.raises(corral.SandboxTimeoutError) as ei:
        r.raise_for_failure()
    assert ei.value.result is r and isinstance(ei.value, TimeoutError)


@pytest.mark.parametrize(
    "status,kind,cls,retryable",
    [
        (400, "invalid_spec", corral.InvalidSpecError, False),
        (400, "invalid_request", corral.InvalidRequestError, False),
        (400, "image_not_found", corral.ImageNotFoundError, False),
        (401, "unauthorized", corral.AuthenticationError, False),
        (410, "container_lost", corral.SandboxContainerLostError, True),
        (410, "oom_killed", corral.SandboxOOMError, False),
        (413, "too_large", corral.TooLargeError, False),
        (503, "daemon_unavailable", corral.DaemonUnavailableError, True),
        (503, "capacity", corral.CapacityError, True),
        (503, "shutting_down", corral.ServiceUnavailableError, True),
        (503, "overloaded", corral.ServiceOverloadedError, True),
        (500, "internal", corral.InternalError, False),
        (502, "agent_error", corral.AgentError, True),
        (502, "protocol_violation", corral.ProtocolViolationError, False),
        (418, "brand_new_kind", corral.InvalidRequestError, False),
    ],
)
def test_error_bodies_map_to_classes(status, kind, cls, retryable):
    body = {"error": {"kind": kind, "message": "m", "field": "spec.limits.memory", "retryable": retryable}}
    err = error_from_response(status, body)
    assert type(err) is cls
    assert (err.kind, err.message, err.retryable, err.status) == (kind, "m", retryable, status)
    assert err.field == "spec.limits.memory"


def test_capacity_is_a_daemon_unavailable_error_and_honours_retry_after():
    body = {"error": {"kind": "capacity", "message": "no room for sandbox sb-1", "retryable": True}}
    err = error_from_response(503, body)
    # Before capacity had a kind of its own it came as daemon_unavailable:
    # callers catching DaemonUnavailableError still catch it.
    assert isinstance(err, corral.DaemonUnavailableError) and err.retryable
    assert "CapacityError" in corral.__all__
    policy = corral.RetryPolicy(initial_delay=0.25, max_delay=4.0, jitter=False)
    full = httpx.Response(503, json=body, headers={"Retry-After": "10"})
    assert _core.should_retry_status(full)
    assert _core.status_retry_delay(policy, 1, full) == 10.0
    # No hint, or one shorter than the backoff: the backoff.
    assert _core.status_retry_delay(policy, 3, httpx.Response(503, json=body)) == 1.0
    assert _core.status_retry_delay(policy, 3, httpx.Response(503, headers={"Retry-After": "0"})) == 1.0
    # Nonsense is ignored; a long hint is capped.
    assert _core.retry_after(httpx.Response(503, headers={"Retry-After": "soon"})) is None
    assert _core.retry_after(httpx.Response(503, headers={"Retry-After": "-5"})) is None
    assert _core.retry_after(httpx.Response(503, headers={"Retry-After": "3600"})) == _core.MAX_RETRY_AFTER


def test_not_found_is_narrowed_by_message_and_route():
    nf = lambda msg, res: error_from_response(404, {"error": {"kind": "not_found", "message": msg}}, resource=res)
    assert type(nf("no sandbox 'x'", "file")) is corral.SandboxNotFoundError
    assert type(nf("sandbox 'x' is gone: it was evicted", "sandbox")) is corral.SandboxNotFoundError
    assert type(nf("sandbox 'x' has no shell session 'main'", "shell")) is corral.ShellNotFoundError
    assert type(nf('sandbox sb-1: "/nope" not found: missing', "file")) is corral.SandboxFileNotFoundError
    assert isinstance(nf('sandbox sb-1: "/nope" not found', "file"), FileNotFoundError)
    assert type(nf("no such route", "file")) is corral.NotFoundError
    assert type(error_from_response(502, None, text="bad gateway")) is corral.InternalError


def test_exec_body_shapes():
    assert _core.exec_body("echo hi") == {"command": "echo hi"}
    body = _core.exec_body(["ls", "-l"], timeout=1.5, cwd="/tmp", env={"A": 1}, stdin=b"\x00", max_output=10)
    assert body == {
        "argv": ["ls", "-l"],
        "timeout_ms": 1500,
        "cwd": "/tmp",
        "env": {"A": "1"},
        "stdin_base64": "AA==",
        "max_output": 10,
    }
    assert _core.exec_body("cat", stdin="text")["stdin"] == "text"
    with pytest.raises(ValueError):
        _core.exec_body("x", timeout=0)
    with pytest.raises(ValueError):
        _core.exec_body([])
    assert _core.file_mode(0o644) == "644" and _core.file_mode("0o755") == "755"
    with pytest.raises(ValueError):
        _core.file_mode("rw-")


def test_unpack_refuses_members_outside_the_destination(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("../evil")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(corral.CorralError, match="escapes"):
        _core.unpack_tar(buf.getvalue(), tmp_path / "out")
    assert not (tmp_path / "evil").exists()


# -- retries ---------------------------------------------------------------


def _counting_transport(answers):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, request.url.path))
        status, body = answers[min(len(calls), len(answers)) - 1]
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handler), calls


FAST = corral.RetryPolicy(attempts=3, initial_delay=0.001, max_delay=0.002, jitter=False)
UNAVAILABLE = {"error": {"kind": "daemon_unavailable", "message": "down", "field": None, "retryable": True}}


def test_idempotent_requests_retry_a_retryable_503():
    transport, calls = _counting_transport([(503, UNAVAILABLE), (503, UNAVAILABLE), (200, {"sandboxes": []})])
    with corral.Client("http://corral.test", transport=transport, retry=FAST) as c:
        assert c.list_sandboxes() == []
    assert len(calls) == 3


def test_retries_give_up_with_the_typed_error():
    transport, calls = _counting_transport([(503, UNAVAILABLE)])
    with corral.Client("http://corral.test", transport=transport, retry=FAST) as c:
        with pytest.raises(corral.DaemonUnavailableError) as ei:
            c.list_sandboxes()
    assert ei.value.retryable and len(calls) == 3


def test_commands_are_not_retried_after_reaching_the_service():
    transport, calls = _counting_transport([(503, UNAVAILABLE), (200, {})])
    with corral.Client("http://corral.test", transport=transport, retry=FAST) as c:
        sb = corral.Sandbox(c, _info=corral.SandboxInfo(id="s1"))
        with pytest.raises(corral.DaemonUnavailableError):
            sb.run("echo hi")
    assert calls == [("POST", "/v1/sandboxes/s1/exec")]


def test_creating_a_sandbox_sends_a_session_key_so_it_can_be_retried():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        import json

        seen.append(json.loads(request.content))
        if len(seen) == 1:
            return httpx.Response(503, json=UNAVAILABLE)
        return httpx.Response(201, json={"id": seen[-1]["session"], "container_id": "c", "image": "i"})

    with corral.Client("http://corral.test", transport=httpx.MockTransport(handler), retry=FAST) as c:
        sb = c.sandbox(image="busybox")
    assert len(seen) == 2 and seen[0] == seen[1]
    assert seen[0]["session"].startswith("py-") and seen[0]["image"] == "busybox"
    assert sb.id == seen[0]["session"]


def test_a_create_under_a_tier_without_result_integrity_warns_saying_why():
    gap = "isolation gvisor: results are not integrity-protected (...)"

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        gvisor = body.get("profile") == "graded-under-gvisor"
        return httpx.Response(
            201,
            json={
                "id": body["session"],
                "result_integrity": not gvisor,
                "result_integrity_gap": gap if gvisor else None,
            },
        )

    with corral.Client("http://corral.test", transport=httpx.MockTransport(handler), retry=FAST) as c:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sb = c.sandbox(image="busybox")
        assert sb.info.result_integrity is True and sb.info.result_integrity_gap is None
        with pytest.warns(corral.ResultIntegrityWarning, match="not integrity-protected") as w:
            sb = c.sandbox(profile="graded-under-gvisor")
        assert sb.id in str(w[0].message)
        assert (sb.info.result_integrity, sb.info.result_integrity_gap) == (False, gap)
    # A service that does not say leaves it unknown.
    assert corral.SandboxInfo.from_json({"id": "s"}).result_integrity is None


def test_pristine_is_sent_only_when_asked_and_reset_results_parse():
    def body(**kw):
        return _core.create_body(session="k", image=None, spec=None, profile=None, persistent=False, **kw)

    assert "pristine" not in body()
    assert body(pristine=True)["pristine"] is True
    assert body(pristine=False)["pristine"] is False
    r = corral.ResetResult.from_json({"mode": "in_place", "fallback_reason": None, "killed": 2, "elapsed_ms": 3.5})
    assert (r.mode, r.in_place, r.fallback_reason, r.killed, r.elapsed_ms) == ("in_place", True, None, 2, 3.5)
    r = corral.ResetResult.from_json({"mode": "replaced", "fallback_reason": "pristine is false", "killed": 0})
    assert not r.in_place and r.fallback_reason == "pristine is false"
    info = corral.SandboxInfo.from_json({"id": "s", "resets_in_place": False, "reset_unavailable_reason": "why"})
    assert (info.resets_in_place, info.reset_unavailable_reason) == (False, "why")


def test_an_unreachable_service_is_a_retryable_service_error():
    from corral.testing import free_port

    port = free_port()
    with corral.Client(f"http://127.0.0.1:{port}", retry=FAST) as c:
        with pytest.raises(corral.ServiceUnavailableError) as ei:
            c.health()
    assert ei.value.retryable and "cannot reach" in ei.value.message


def _token_files(tmp_path, monkeypatch, files):
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    for name, data in files.items():
        p = d / name
        p.write_text(json.dumps(data))
        p.chmod(0o600)
    monkeypatch.setenv("CORRAL_RUNTIME_DIR", str(d))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return d


def test_find_token_matches_loopback_urls_by_port(tmp_path, monkeypatch):
    d = _token_files(
        tmp_path,
        monkeypatch,
        {
            "server-127.0.0.1-7070.json": {"listen": "127.0.0.1:7070", "port": 7070, "token": "lo"},
            "server-0.0.0.0-7070.json": {"listen": "0.0.0.0:7070", "port": 7070, "token": "any"},
            "server-[::1]-8080.json": {"listen": "[::1]:8080", "port": 8080, "token": "v6"},
            "server-0.0.0.0-9090.json": {"listen": "0.0.0.0:9090", "port": 9090, "token": "wide",
                                         "unix_socket": "/run/c.sock"},
        },
    )
    assert corral.find_token("http://127.0.0.1:7070") == "lo"
    assert corral.find_token("http://localhost:7070/") == "lo"
    assert corral.find_token("http://[::1]:8080") == "v6"
    assert corral.find_token("http://localhost:8080") == "v6"
    assert corral.find_token("http://127.0.0.1:9090") == "wide"
    assert corral.find_token("unix:///run/c.sock") == "wide"
    assert corral.find_token(uds="/run/other.sock") is None
    assert corral.find_token("http://127.0.0.1:1234") is None
    # Never for another host: the token would leave the machine.
    assert corral.find_token("http://gpu-box:9090") is None
    assert corral.find_token("http://10.0.0.5:9090") is None
    monkeypatch.setenv("CORRAL_URL", "http://127.0.0.1:7070")
    assert corral.find_token() == "lo"
    # A file others may write is no token to trust.
    (d / "server-127.0.0.1-7070.json").chmod(0o666)
    assert corral.find_token("http://127.0.0.1:7070") == "any"


def test_clients_send_the_token_they_find(tmp_path, monkeypatch):
    _token_files(tmp_path, monkeypatch, {"server-127.0.0.1-7070.json": {"listen": "127.0.0.1:7070", "port": 7070, "token": "found"}})
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    seen = []

    def handler(request):
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"sandboxes": []})

    with corral.Client("http://127.0.0.1:7070", transport=httpx.MockTransport(handler)) as c:
        c.list_sandboxes()
    monkeypatch.setenv("CORRAL_TOKEN", "from-env")
    with corral.Client("http://127.0.0.1:7070", transport=httpx.MockTransport(handler)) as c:
        c.list_sandboxes()
    with corral.Client("http://127.0.0.1:7070", token="given", transport=httpx.MockTransport(handler)) as c:
        c.list_sandboxes()
    assert seen == ["Bearer found", "Bearer from-env", "Bearer given"]


# -- principals ------------------------------------------------------------


def test_owners_env_names_and_whoami_parse():
    snap = corral.Snapshot.from_json(
        {
            "name": "alice/repo-ready",
            "owner": "tenant:alice",
            "read_only": True,
            "env_names": ["API_KEY", "MODE"],
            "image": "corral-snapshot/alice:repo-ready",
            "durable": True,
        }
    )
    assert (snap.name, snap.owner, snap.read_only, snap.env_names) == (
        "alice/repo-ready", "tenant:alice", True, ["API_KEY", "MODE"]
    )
    # An older service's answer: no owner, nothing read-only, no names.
    old = corral.Snapshot.from_json({"name": "s", "image": "corral-snapshot:s"})
    assert (old.owner, old.read_only, old.env_names) == (None, False, [])
    info = corral.SandboxInfo.from_json({"id": "ep-1", "owner": "mcp:alice:mcp-0a"})
    assert info.owner == "mcp:alice:mcp-0a"
    assert corral.SandboxInfo.from_json({"id": "ep-1"}).owner is None

    me = corral.WhoAmI.from_json(
        {"principal": "tenant:bob", "tenant": "bob", "max_sandboxes": 1, "max_snapshots": None,
         "max_snapshot_bytes": 1073741824}
    )
    assert (me.principal, me.tenant, me.max_sandboxes, me.max_snapshots, me.max_snapshot_bytes) == (
        "tenant:bob", "bob", 1, None, 1 << 30
    )
    assert not me.is_operator
    op = corral.WhoAmI.from_json({"principal": "operator", "tenant": None})
    assert op.is_operator and op.tenant is None and op.max_sandboxes is None
    assert "WhoAmI" in corral.__all__


def test_fork_sends_env_only_when_given_and_whoami_is_a_get():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, json.loads(request.content) if request.content else None))
        if request.url.path == "/v1/whoami":
            return httpx.Response(200, json={"principal": "tenant:default", "tenant": "default"})
        return httpx.Response(201, json={"sandboxes": [{"id": "f-0"}]})

    with corral.Client("http://corral.test", transport=httpx.MockTransport(handler), retry=FAST) as c:
        assert c.whoami().tenant == "default"
        (fork,) = c.fork("snap", env={"API_KEY": "x", "N": 1})
        assert fork.id == "f-0"
        c.fork("snap", 2, session_prefix="ep")
        with pytest.raises(TypeError):
            c.fork("snap", env="API_KEY=x")  # type: ignore[arg-type]
    assert seen == [
        ("GET", "/v1/whoami", None),
        ("POST", "/v1/snapshots/snap/fork", {"count": 1, "env": {"API_KEY": "x", "N": "1"}}),
        ("POST", "/v1/snapshots/snap/fork", {"count": 2, "session_prefix": "ep"}),
    ]


@pytest.mark.asyncio
async def test_async_fork_sends_env_and_whoami_parses():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content) if request.content else None))
        if request.url.path == "/v1/whoami":
            return httpx.Response(200, json={"principal": "operator", "tenant": None})
        return httpx.Response(201, json={"sandboxes": [{"id": "f-0"}]})

    async with corral.AsyncClient("http://corral.test", transport=httpx.MockTransport(handler)) as c:
        assert (await c.whoami()).is_operator
        (fork,) = await c.fork("snap", env={"API_KEY": "x"})
        assert fork.id == "f-0"
    assert seen == [("/v1/whoami", None), ("/v1/snapshots/snap/fork", {"count": 1, "env": {"API_KEY": "x"}})]


# -- one source for the sync and async clients -------------------------------


def _unasync_tool():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "tools" / "unasync.py"
    spec = importlib.util.spec_from_file_location("corral_unasync", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sync_client_is_current_with_the_async_one():
    # corral/client.py is written from corral/aio.py; an edit of either
    # alone fails here until `python tools/unasync.py` runs.
    tool = _unasync_tool()
    assert tool.is_current(), "corral/client.py is not current: run `python clients/python/tools/unasync.py`"
    assert corral.client.__file__ == str(tool.TARGET)


def test_unasync_writes_the_sync_forms_and_honours_its_marks():
    tool = _unasync_tool()
    src = (
        "import asyncio\n"
        "class AsyncSandbox:\n"
        "    async def run(self) -> AsyncIterator[int]:\n"
        "        async with self.client as c:\n"
        "            async for chunk in c.aiter_bytes():\n"
        "                await asyncio.sleep(1)\n"
        "        await self.aclose()\n"
        "    # unasync: async only\n"
        "    close = aclose\n"
        "    # unasync: end\n"
        "    # unasync: sync only\n"
        "    # self.start()\n"
        "    # unasync: end\n"
    )
    out = tool.unasync(src).split("\n", 2)[2]
    assert out == (
        "import time\n"
        "class Sandbox:\n"
        "    def run(self) -> Iterator[int]:\n"
        "        with self.client as c:\n"
        "            for chunk in c.iter_bytes():\n"
        "                time.sleep(1)\n"
        "        self.close()\n"
        "    self.start()\n"
    )
    with pytest.raises(ValueError, match="not ended"):
        tool.unasync("# unasync: async only\nx = 1\n")
    with pytest.raises(ValueError, match="must be commented out"):
        tool.unasync("# unasync: sync only\nx = 1\n# unasync: end\n")


def test_sync_and_async_clients_offer_the_same_methods():
    pairs = [
        (corral.Client, corral.AsyncClient),
        (corral.Sandbox, corral.AsyncSandbox),
        (corral.Shell, corral.AsyncShell),
        (corral.CommandStream, corral.AsyncCommandStream),
    ]
    renamed = {"__aenter__": "__enter__", "__aexit__": "__exit__", "__aiter__": "__iter__", "aclose": "close"}
    for sync, aio in pairs:
        public = {n for n in vars(aio) if not n.startswith("_") or n in renamed}
        want = {renamed.get(n, n) for n in public}
        assert want <= set(vars(sync)), (sync, want - set(vars(sync)))
