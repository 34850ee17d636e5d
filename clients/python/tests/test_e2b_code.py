"""The real ``e2b-code-interpreter`` (from PyPI, pinned in
scripts/python-env.sh) against a real ``corral serve``: its ``run_code`` and
code contexts run on corral's code contexts (Jupyter kernels inside the
sandbox), configured by one profile line. Needs the offline image
``corral-test/python`` (``scripts/build-test-images.sh --python``).

Attacks: another sandbox's access token and another tenant's key cannot
drive a context; code in one sandbox cannot reach another sandbox's kernel;
a kernel spawning past the pids limit or printing forever stays bounded and
the service keeps answering.
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
import uuid
from typing import Dict, Iterator, Optional

import httpx
import pytest

e2b_ci = pytest.importorskip("e2b_code_interpreter")
from e2b.exceptions import SandboxException, TimeoutException  # noqa: E402
from e2b_code_interpreter import AsyncSandbox, Sandbox  # noqa: E402

from corral.testing import LocalServer, free_port  # noqa: E402
from conftest import LABELS, assert_no_leaks, corral_binary  # noqa: E402

pytestmark = pytest.mark.server

PY_IMAGE = os.environ.get("CORRAL_PYTHON_IMAGE", "corral-test/python")
MAX_CONTEXTS = 6
TOKEN = "tok-code-" + uuid.uuid4().hex
OTHER_TOKEN = "tok-code-other-" + uuid.uuid4().hex


def have_image(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def serve(profiles: dict, limits: Optional[dict] = None) -> tuple:
    e2b_port = free_port()
    config = {
        "defaults": {"image": "corral-test/busybox", "labels": dict(LABELS)},
        "profiles": profiles,
        "server": {
            "token": TOKEN,
            "tenants": {"other": {"token": OTHER_TOKEN}},
            "e2b_listen": f"127.0.0.1:{e2b_port}",
            "limits": dict(limits or {}),
        },
    }
    server = LocalServer(corral_binary(), config=config)
    server.start()
    return server, f"http://127.0.0.1:{e2b_port}"


@pytest.fixture(scope="module")
def e2b_server() -> Iterator[str]:
    if not have_image(PY_IMAGE):
        pytest.skip(f"{PY_IMAGE} is not built: scripts/build-test-images.sh --python")
    # The one configuration line E2B's code interpreter needs.
    profile = {"image": PY_IMAGE, "labels": dict(LABELS), "limits": {"pids": 256}}
    server, url = serve({"code-interpreter": profile}, limits={"max_code_contexts": MAX_CONTEXTS})
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_DOMAIN")}
    os.environ.update({"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": TOKEN})
    os.environ.pop("E2B_DOMAIN", None)
    try:
        yield url
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


@pytest.fixture
def sbx(e2b_server: str) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(timeout=300)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_run_code_results_logs_errors_state_and_env(sbx: Sandbox) -> None:
    ex = sbx.run_code("x = 20\nx * 2 + 2")
    assert ex.error is None
    assert ex.text == "42"
    assert ex.execution_count is not None

    ex = sbx.run_code("print('hello', x)")
    assert ex.logs.stdout == ["hello 20\n"]
    assert ex.results == []

    ex = sbx.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('corral')\nplt.show()"
    )
    assert ex.error is None, ex.error
    pngs = [r.png for r in ex.results if r.png]
    assert len(pngs) == 1, ex.results
    assert base64.b64decode(pngs[0])[:8] == b"\x89PNG\r\n\x1a\n"

    ex = sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
    assert ex.error is None, ex.error
    main = [r for r in ex.results if r.is_main_result]
    assert len(main) == 1
    assert "<table" in main[0].html and "<td>x</td>" in main[0].html

    ex = sbx.run_code("def f():\n    raise ValueError('bad value')\nf()")
    assert ex.error is not None
    assert ex.error.name == "ValueError"
    assert ex.error.value == "bad value"
    # IPython's traceback (ANSI colours, as E2B's), naming the raising line.
    plain = re.sub(r"\x1b\[[0-9;]*m", "", ex.error.traceback)
    assert "raise ValueError('bad value')" in plain, plain

    ex = sbx.run_code("import os\nos.environ.get('ONLY_HERE'), os.environ.get('GREETING')", envs={"ONLY_HERE": "yes"})
    assert ex.text == "('yes', None)"
    # Per execution only: gone at the next.
    assert sbx.run_code("os.environ.get('ONLY_HERE')").results == []
    assert sbx.run_code("x").text == "20"


def test_contexts_are_kept_apart_listed_restarted_and_removed(sbx: Sandbox) -> None:
    a = sbx.create_code_context()
    b = sbx.create_code_context(cwd="/tmp")
    assert a.id != b.id and a.language == "python" and b.cwd == "/tmp"
    sbx.run_code("secret = 'in-a'", context=a)
    assert sbx.run_code("secret", context=a).text == "'in-a'"
    ex = sbx.run_code("secret", context=b)
    assert ex.error is not None and ex.error.name == "NameError"
    assert sbx.run_code("import os; os.getcwd()", context=b).text == "'/tmp'"
    ids = {c.id for c in sbx.list_code_contexts()}
    assert {a.id, b.id} <= ids
    sbx.restart_code_context(a)
    assert sbx.run_code("secret", context=a).error.name == "NameError"
    sbx.remove_code_context(b)
    assert b.id not in {c.id for c in sbx.list_code_contexts()}
    with pytest.raises(Exception) as e:
        sbx.run_code("1", context=b)
    assert b.id in str(e.value)
    with pytest.raises(Exception) as e:
        sbx.create_code_context(language="r")
    assert "'r'" in str(e.value)


def test_contexts_beyond_the_services_limit_are_refused_by_name(sbx: Sandbox) -> None:
    sbx.run_code("1")  # the default context counts
    made = [sbx.create_code_context() for _ in range(MAX_CONTEXTS - 1)]
    try:
        with pytest.raises(Exception) as e:
            sbx.create_code_context()
        assert "max_code_contexts" in str(e.value), e.value
    finally:
        # Their kernels would share the module's sandbox's memory with the
        # tests after this one (a flood there was OOM-killed beside them).
        for ctx in made:
            sbx.remove_code_context(ctx)


def test_timeout_interrupts_a_busy_loop_and_the_context_lives_on(sbx: Sandbox) -> None:
    sbx.run_code("kept = 7")
    with pytest.raises(TimeoutException):
        sbx.run_code("while True:\n    pass", timeout=3)
    # The interrupt landed: the same kernel (its state) answers the next run.
    ex = sbx.run_code("kept + 1", timeout=60)
    assert ex.error is None, ex.error
    assert ex.text == "8"


def test_printing_forever_and_spawning_past_the_pids_limit_stay_bounded(sbx: Sandbox) -> None:
    ex = sbx.run_code("print('x' * (8 << 20))", timeout=120)
    out = "".join(ex.logs.stdout)
    # Its head kept within the output budget (1 MiB per stream), with a notice.
    assert 0 < len(out) <= 1 << 20 and set(out) == {"x"}, len(out)
    assert any("dropped" in s for s in ex.logs.stderr), ex.logs.stderr
    # The SDK gives up after 4 s and closes the stream, which interrupts the
    # kernel; the flood it printed meanwhile is not queued for the next run,
    # and neither the kernel nor its relay grows with it (a print waits for
    # the kernel's buffer to be sent: before, both grew until the sandbox's
    # memory limit ended the kernel, and the next run reported that).
    with pytest.raises(TimeoutException):
        sbx.run_code("while True:\n    print('y' * 1000)", timeout=4)
    assert sbx.run_code("1 + 2", timeout=120).text == "3"
    ex = sbx.run_code(
        "import subprocess\nprocs = []\nfor _ in range(1000):\n    procs.append(subprocess.Popen(['sleep', '60']))",
        timeout=120,
    )
    assert ex.error is not None and ex.error.name == "BlockingIOError", ex.error
    # The kernel and the service still answer.
    assert sbx.run_code("len(procs) < 256", timeout=60).text == "True"
    sbx.run_code("for p in procs:\n    p.kill()\n    p.wait()", timeout=60)
    assert sbx.commands.run("echo up").stdout == "up\n"


def test_async_sdk_runs_code(e2b_server: str) -> None:
    async def main() -> None:
        sandbox = await AsyncSandbox.create(timeout=120)
        try:
            seen = []
            ex = await sandbox.run_code("print('async')\n3 * 3", on_stdout=lambda m: seen.append(m.line))
            assert ex.text == "9"
            assert seen == ["async\n"]
            ctx = await sandbox.create_code_context()
            await sandbox.run_code("v = 5", context=ctx)
            assert (await sandbox.run_code("v", context=ctx)).text == "5"
        finally:
            await sandbox.kill()

    asyncio.run(main())


def test_another_sandboxes_token_or_tenant_cannot_drive_a_context(e2b_server: str) -> None:
    a = Sandbox.create(timeout=120)
    b = Sandbox.create(timeout=120)
    try:
        a.run_code("mine = 1")
        body = {"code": "mine", "context_id": None, "language": None, "env_vars": None}
        base = {"E2b-Sandbox-Id": a.sandbox_id, "E2b-Sandbox-Port": "49999", "Content-Type": "application/json"}
        # b's envd token names a, refused.
        r = httpx.post(f"{e2b_server}/execute", json=body, headers={**base, "X-Access-Token": b._envd_access_token}, timeout=30)
        assert r.status_code == 401, r.text
        r = httpx.post(f"{e2b_server}/execute", json=body, headers=base, timeout=30)
        assert r.status_code == 401, r.text
        r = httpx.get(f"{e2b_server}/contexts", headers={**base, "X-Access-Token": "0" * 96}, timeout=30)
        assert r.status_code == 401, r.text
        # The right token runs it.
        r = httpx.post(f"{e2b_server}/execute", json=body, headers={**base, "X-Access-Token": a._envd_access_token}, timeout=30)
        assert r.status_code == 200
        lines = [json.loads(l) for l in r.text.splitlines()]
        assert {"type": "result", "text": "1", "is_main_result": True}.items() <= lines[0].items()
        # Another tenant's key does not find a.
        with pytest.raises(Exception):
            Sandbox.connect(a.sandbox_id, api_key=OTHER_TOKEN)
    finally:
        a.kill()
        b.kill()


def test_the_traffic_token_opens_contexts_never_code(e2b_server: str, sbx: Sandbox) -> None:
    """The traffic access token (for viewers of a private port) is what
    E2B's SDK sends with context calls, so it opens them; it never runs
    code, which takes the envd access token."""
    traffic, envd = sbx.traffic_access_token, sbx._envd_access_token
    assert traffic and envd and traffic != envd
    base = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999", "Content-Type": "application/json"}
    body = {"code": "open('/tmp/ran', 'w').write('x')", "context_id": None, "language": None, "env_vars": None}
    for headers in ({"E2B-Traffic-Access-Token": traffic}, {"X-Access-Token": traffic}):
        r = httpx.post(f"{e2b_server}/execute", json=body, headers={**base, **headers}, timeout=30)
        assert r.status_code == 401, (headers, r.status_code, r.text)
    assert sbx.files.exists("/tmp/ran") is False
    # The SDK's context calls, which carry the traffic token alone.
    ctx = sbx.create_code_context()
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    assert sbx.run_code("6 * 7", context=ctx).text == "42"
    sbx.remove_code_context(ctx)


def test_code_in_one_sandbox_cannot_reach_another_sandboxes_kernel(e2b_server: str) -> None:
    a = Sandbox.create(timeout=120)
    b = Sandbox.create(timeout=120)
    try:
        # A sandbox's kernel ports, as code inside it sees them (its own
        # kernel application; there is no connection file).
        kernel_ports = (
            "from ipykernel.kernelapp import IPKernelApp\n"
            "_app = IPKernelApp.instance()\n"
            "c = {'ip': _app.ip}\n"
            "[getattr(_app, k) for k in ('shell_port', 'iopub_port', 'control_port', 'stdin_port', 'hb_port')]"
        )
        ports = a.run_code(kernel_ports)
        assert ports.error is None, ports.error
        port_list = json.loads(ports.text)
        addr = a.run_code("import socket\nsocket.gethostbyname(socket.gethostname())").text.strip("'")
        assert json.loads(a.run_code("c['ip']").text.replace("'", '"')) == "127.0.0.1"
        # b's own kernel listens on b's loopback on ports of its own; one of
        # them can carry the number of one of a's (both are picked at
        # random), and connecting to it reaches b's kernel, not a's. So on
        # 127.0.0.1 the probe in b skips b's own kernel ports; every other
        # port of a's must be closed.
        b_ports = b.run_code(kernel_ports)
        assert b_ports.error is None, b_ports.error

        def probe(hosts: list, skip_on_loopback: list) -> str:
            return (
                "import socket\nres = []\n"
                f"for host in {hosts!r}:\n"
                f"    for p in {port_list!r}:\n"
                f"        if host == '127.0.0.1' and p in {skip_on_loopback!r}: continue\n"
                "        s = socket.socket(); s.settimeout(2)\n"
                "        try:\n            s.connect((host, p)); res.append((host, p, 'open'))\n"
                "        except OSError as e:\n            res.append((host, p, type(e).__name__))\n"
                "        finally:\n            s.close()\n"
                "[r for r in res if r[2] == 'open']"
            )

        ex = b.run_code(probe(["127.0.0.1", addr], json.loads(b_ports.text)), timeout=120)
        assert ex.error is None, ex.error
        assert ex.text == "[]", f"reachable from another sandbox: {ex.text}"
        # Inside a, the same probe reaches its own kernel on loopback (the probe works).
        assert a.run_code(probe(["127.0.0.1"], []), timeout=120).text != "[]"
    finally:
        a.kill()
        b.kill()


def test_code_interpreter_template_is_refused_by_name_without_its_profile() -> None:
    server, url = serve({})
    try:
        r = httpx.post(
            f"{url}/sandboxes",
            json={"templateID": "code-interpreter-v1", "timeout": 60},
            headers={"X-API-KEY": TOKEN},
            timeout=30,
        )
        assert r.status_code == 400, r.text
        assert "code-interpreter-v1" in r.text and "profiles" in r.text
    finally:
        server.stop()
        server.close()
