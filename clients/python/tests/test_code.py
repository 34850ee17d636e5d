"""corral's own code contexts through the Python client (sync and async)
against a real ``corral serve``: ``run_code`` with rich results, state,
contexts, per-run env, typed timeout and OOM, and kernels ended by reset and
by an exclusive command. Needs ``corral-test/python``
(``scripts/build-test-images.sh --python``)."""
from __future__ import annotations

import asyncio
import subprocess
from typing import Iterator

import pytest

import corral
from corral.errors import SandboxOOMError, SandboxTimeoutError, UnsupportedError
from corral.testing import LocalServer
from conftest import LABELS, corral_binary, running_server

pytestmark = pytest.mark.server

PY_IMAGE = "corral-test/python"


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    if subprocess.run(["docker", "image", "inspect", PY_IMAGE], capture_output=True).returncode != 0:
        pytest.skip(f"{PY_IMAGE} is not built: scripts/build-test-images.sh --python")
    with running_server(
        config={
            "defaults": {"image": PY_IMAGE, "labels": dict(LABELS)},
            "profiles": {"small": {"image": PY_IMAGE, "labels": dict(LABELS), "limits": {"memory": 256 << 20}}},
        },
    ) as srv:
        yield srv


def sandbox(server: LocalServer, **kw) -> corral.Sandbox:
    return corral.Sandbox.create(base_url=server.url, token=server.client_token, **kw)


def test_run_code_keeps_state_and_returns_rich_results(server: LocalServer) -> None:
    with sandbox(server) as sb:
        seen = []
        ex = sb.run_code("x = 41\nprint('hi')", on_stdout=seen.append)
        assert ex.logs.stdout == ["hi\n"] and seen == ["hi\n"] and ex.results == []
        ex = sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nx + 1")
        assert ex.text == "42"
        pngs = [r.png_bytes() for r in ex.results if r.png]
        assert len(pngs) == 1 and pngs[0][:8] == b"\x89PNG\r\n\x1a\n"
        ex = sb.run_code("import pandas as pd\npd.DataFrame({'a': [1]})")
        assert "<table" in ex.results[0].html
        ex = sb.run_code("1/0")
        assert ex.error is not None and ex.error.name == "ZeroDivisionError" and ex.error.traceback
        ex = sb.run_code("import os\nos.environ['ONLY']", env={"ONLY": "here"})
        assert ex.text == "'here'"
        assert sb.run_code("os.environ.get('ONLY', 'gone')").text == "'gone'"

        ctx = sb.create_code_context(cwd="/tmp")
        assert sb.run_code("import os; os.getcwd()", context=ctx).text == "'/tmp'"
        assert sb.run_code("x", context=ctx).error.name == "NameError"
        assert ctx.id in {c.id for c in sb.code_contexts()}
        sb.remove_code_context(ctx)
        assert ctx.id not in {c.id for c in sb.code_contexts()}
        with pytest.raises(corral.errors.InvalidRequestError) as e:
            sb.run_code("1", context=ctx)
        assert ctx.id in str(e.value)
        with pytest.raises(UnsupportedError):
            sb.create_code_context(language="bash")


def test_timeout_interrupts_and_output_is_capped(server: LocalServer) -> None:
    with sandbox(server) as sb:
        sb.run_code("kept = 1")
        with pytest.raises(SandboxTimeoutError):
            sb.run_code("while True:\n    pass", timeout=2)
        assert sb.run_code("kept").text == "1"
        ex = sb.run_code("print('z' * 100000)", max_output=1000)
        assert ex.truncated
        # The head that fits is kept (a print larger than the budget is cut,
        # not dropped whole), with a notice on stderr.
        assert "".join(ex.logs.stdout) == "z" * 1000, ex.logs.stdout
        assert any("dropped" in s for s in ex.logs.stderr), ex.logs.stderr


def test_printing_forever_is_bounded_typed_and_the_kernel_answers_after(server: LocalServer) -> None:
    with sandbox(server) as sb:
        seen = []
        with pytest.raises(SandboxTimeoutError):
            sb.run_code("while True:\n    print('y' * 1000)", timeout=4, max_output=20000, on_stdout=seen.append)
        # Within the budget although the kernel printed far more.
        assert 0 < sum(len(s) for s in seen) <= 20000, sum(len(s) for s in seen)
        # No backlog of the flood stands between the next run and its answer.
        assert sb.run_code("1 + 2", timeout=120).text == "3"
        assert sb.run("echo up").stdout == "up\n"


def test_an_oom_killed_kernel_is_typed_and_the_next_run_gets_a_fresh_one(server: LocalServer) -> None:
    with sandbox(server, profile="small") as sb:
        sb.run_code("state = 1")
        with pytest.raises(SandboxOOMError):
            sb.run_code("b = []\nwhile True:\n    b.append(bytearray(16 << 20))", timeout=120)
        ex = sb.run_code("'state' in globals()")
        assert ex.text == "False"


def test_reset_and_exclusive_commands_end_every_kernel(server: LocalServer) -> None:
    with sandbox(server) as sb:
        sb.run_code("v = 1")
        ctx = sb.create_code_context()
        sb.run_code("w = 2", context=ctx)
        # An exclusive command kills every other process: the kernels too.
        r = sb.run("pgrep -f '[i]pykernel_launcher' | wc -l", exclusive=True)
        assert r.stdout.strip() == "0", r.stdout
        assert sb.run_code("'v' in globals()").text == "False"
        sb.run_code("v = 1")
        sb.reset()
        assert sb.code_contexts() == []
        assert sb.run("pgrep -f '[i]pykernel_launcher' | wc -l").stdout.strip() == "0"
        assert sb.run_code("'v' in globals()").text == "False"


def test_async_client_runs_code(server: LocalServer) -> None:
    async def main() -> None:
        sb = await corral.AsyncSandbox.create(base_url=server.url, token=server.client_token)
        try:
            got = []

            async def on_result(r: corral.Result) -> None:
                got.append(r.text)

            ex = await sb.run_code("6 * 7", on_result=on_result)
            assert ex.text == "42" and got == ["42"]
            ctx = await sb.create_code_context()
            await sb.run_code("a = 3", context=ctx)
            assert (await sb.run_code("a", context=ctx)).text == "3"
            assert [c.id for c in await sb.code_contexts()] == sorted([ctx.id, "default"])
        finally:
            await sb.delete()

    asyncio.run(main())


def test_mcp_run_code_returns_plots_as_image_content(server: LocalServer) -> None:
    import base64 as b64

    from mcp import ClientSession
    from test_mcp import _http_streams, _is_error

    async def main() -> None:
        async with _http_streams(server.url + "/mcp", server.client_token) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                await asyncio.wait_for(session.initialize(), 60)
                r = await asyncio.wait_for(session.call_tool("run_code", {"code": "n = 20\nn + 1"}), 180)
                assert not _is_error(r) and "21" in r.content[0].text, r
                r = await asyncio.wait_for(
                    session.call_tool(
                        "run_code",
                        {"code": "import matplotlib.pyplot as plt\nplt.plot([n, 1])\nplt.show()"},
                    ),
                    120,
                )
                images = [c for c in r.content if c.type == "image"]
                assert len(images) == 1 and (getattr(images[0], "mime_type", None) or getattr(images[0], "mimeType", None)) == "image/png", r
                assert b64.b64decode(images[0].data)[:4] == b"\x89PNG"
                r = await asyncio.wait_for(session.call_tool("run_code", {"code": "undefined_name"}), 120)
                assert _is_error(r) and "NameError" in r.content[0].text, r

    asyncio.run(main())


def test_another_tenants_key_cannot_drive_or_see_a_context() -> None:
    import uuid

    import httpx

    mine, theirs = "tok-mine-" + uuid.uuid4().hex, "tok-theirs-" + uuid.uuid4().hex
    srv = LocalServer(
        corral_binary(),
        config={
            "defaults": {"image": PY_IMAGE, "labels": dict(LABELS)},
            "server": {"token": mine, "tenants": {"theirs": {"token": theirs}}},
        },
    )
    srv.start()
    try:
        sb = corral.Sandbox.create(base_url=srv.url, token=mine)
        try:
            sb.run_code("secret = 'mine'")
            ctx = sb.create_code_context()
            other = httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {theirs}"}, timeout=60)
            base = f"/v1/sandboxes/{sb.id}/code"
            attempts = [
                other.post(base, json={"code": "secret"}),
                other.post(base, json={"code": "secret", "context": ctx.id}),
                other.get(f"{base}/contexts"),
                other.post(f"{base}/contexts", json={}),
                other.delete(f"{base}/contexts/{ctx.id}"),
            ]
            for r in attempts:
                # Not found: another tenant's sandbox is not there for them.
                assert r.status_code == 404, (r.request.method, r.request.url, r.status_code, r.text)
                assert "mine" not in r.text
            # A wrong token is refused outright.
            r = httpx.post(f"{srv.url}{base}", json={"code": "secret"}, headers={"Authorization": "Bearer nope"}, timeout=60)
            assert r.status_code == 401, r.text
            other.close()
            # Nothing of the owner's changed.
            assert sb.run_code("secret").text == "'mine'"
            assert ctx.id in {c.id for c in sb.code_contexts()}
        finally:
            sb.delete()
    finally:
        code = srv.stop()
        srv.close()
        assert code == 0
