"""deer-flow's own ``E2BSandboxProvider`` (``deerflow.community.e2b_sandbox``,
on the real ``e2b`` and ``e2b-code-interpreter`` SDKs) configured to a real
``corral serve``: its ``config.yaml`` names the provider, the SDK's
environment (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY) names corral, and
deer-flow's sandbox tools (``bash``, ``write_file``, ``read_file``,
``str_replace``, ``ls``) run end to end.

deer-flow is not on PyPI and needs Python 3.12, so this runs only when
``$CORRAL_DEERFLOW_SRC`` names a deer-flow checkout, in a venv of its own::

    python3.12 -m venv target/deerflow-e2b-venv
    target/deerflow-e2b-venv/bin/pip install $CORRAL_DEERFLOW_SRC/backend/packages/extension-api \\
        $CORRAL_DEERFLOW_SRC/backend/packages/harness e2b==2.63.0 e2b-code-interpreter==2.11.5 \\
        pytest -e clients/python
    CORRAL_DEERFLOW_SRC=... CORRAL_BIN=$PWD/target/debug/corral \\
        target/deerflow-e2b-venv/bin/python -m pytest -q clients/python/tests/test_e2b_deer_flow_real.py

What differs from E2B's cloud: the provider's bootstrap runs ``sudo ln``
(E2B's code-interpreter template runs as an unprivileged ``user``); a corral
sandbox runs as its image's user, root here, so the template is an image
with a ``sudo`` that only runs its arguments (built below from the offline
test image, with the `/mnt` a distribution's image has).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from corral.testing import LocalServer, docker_ids, free_port

from conftest import IMAGE, LABELS, assert_no_leaks, corral_binary

SRC = os.environ.get("CORRAL_DEERFLOW_SRC")
if not SRC:
    pytest.skip("CORRAL_DEERFLOW_SRC is not set: it names a deer-flow checkout (see this file's docstring)", allow_module_level=True)
if sys.version_info < (3, 12):
    pytest.skip("deer-flow needs Python 3.12 or later", allow_module_level=True)
try:
    import deerflow  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(SRC) / "backend" / "packages" / "harness"))
pytest.importorskip("deerflow.community.e2b_sandbox", reason="deer-flow's e2b provider is not importable (see the docstring)")

from deerflow.config.app_config import reset_app_config  # noqa: E402
from deerflow.sandbox.sandbox_provider import get_sandbox_provider, shutdown_sandbox_provider  # noqa: E402
from deerflow.sandbox.tools import (  # noqa: E402
    bash_tool,
    ls_tool,
    read_file_tool,
    str_replace_tool,
    write_file_tool,
)

pytestmark = pytest.mark.server

TOKEN = "tok-df-e2b-" + uuid.uuid4().hex
TEMPLATE = "corral-test/e2b-sudo"


def _build_template() -> None:
    """The offline test image plus a ``sudo`` that runs its arguments."""
    with tempfile.TemporaryDirectory() as ctx:
        shim = Path(ctx, "sudo")
        shim.write_text('#!/bin/sh\nexec "$@"\n')
        shim.chmod(0o755)  # COPY keeps the mode (no BuildKit needed)
        # /mnt as a distribution's image has it (the bootstrap links into it).
        Path(ctx, "Dockerfile").write_text(f"FROM {IMAGE}\nCOPY sudo /usr/bin/sudo\nRUN mkdir -p /mnt\n")
        subprocess.run(["docker", "build", "-q", "-t", TEMPLATE, ctx], check=True, capture_output=True)


@pytest.fixture(scope="module")
def deerflow_on_corral(tmp_path_factory):
    _build_template()
    port = free_port()
    config = {
        "defaults": {"image": IMAGE, "labels": {**LABELS, "corraltest.case": "df-e2b"}},
        "server": {"token": TOKEN, "e2b_listen": f"127.0.0.1:{port}"},
    }
    server = LocalServer(corral_binary(), config=config)
    server.start()
    work = tmp_path_factory.mktemp("df-e2b")
    (work / "config.yaml").write_text(
        "sandbox:\n"
        "  use: deerflow.community.e2b_sandbox:E2BSandboxProvider\n"
        f"  template: {TEMPLATE}\n"
        "  idle_timeout: 600\n"
        "  replicas: 2\n"
    )
    env = {
        "E2B_API_URL": f"http://127.0.0.1:{port}",
        "E2B_SANDBOX_URL": f"http://127.0.0.1:{port}",
        "E2B_API_KEY": TOKEN,
        "DEER_FLOW_CONFIG_PATH": str(work / "config.yaml"),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    cwd = os.getcwd()
    os.chdir(work)
    reset_app_config()
    shutdown_sandbox_provider()
    try:
        yield
    finally:
        shutdown_sandbox_provider()
        reset_app_config()
        os.chdir(cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        code = server.stop()
        tail = server.log_tail()
        server.close()
        assert_no_leaks()
        assert docker_ids("corraltest.case=df-e2b") == []
        assert code == 0, tail


def _runtime(thread_id: str) -> SimpleNamespace:
    return SimpleNamespace(state={}, context={"thread_id": thread_id, "user_id": "df-user"}, config={})


def test_deer_flow_e2b_provider_runs_its_tools_on_corral(deerflow_on_corral):
    provider = get_sandbox_provider()
    assert type(provider).__name__ == "E2BSandboxProvider"
    rt = _runtime("e2b-tools")
    ws = "/mnt/user-data/workspace"
    assert bash_tool.func(rt, "hello", "echo hello from corral") == "hello from corral\n"
    sid = rt.state["sandbox"]["sandbox_id"]
    assert write_file_tool.func(rt, "write", f"{ws}/app.py", "x = 41\n") == "OK"
    assert str_replace_tool.func(rt, "fix", f"{ws}/app.py", "x = 41", "x = 42") == "OK"
    assert read_file_tool.func(rt, "read", f"{ws}/app.py") == "x = 42\n"
    listing = ls_tool.func(rt, "list", ws)
    assert "app.py" in listing, listing
    # A non-zero exit is E2B's CommandExitException, which deer-flow's
    # provider reports as an error with the command's stderr.
    out = bash_tool.func(rt, "run", f"cat {ws}/app.py; echo oops >&2; exit 3")
    assert out.startswith("Error: Command exited with code 3") and "oops" in out, out
    # The provider's sandbox is a corral sandbox under the token's tenant.
    import httpx

    r = httpx.get(
        f"{os.environ['E2B_API_URL']}/sandboxes/{sid}", headers={"X-API-KEY": TOKEN}
    )
    assert r.status_code == 200 and r.json()["templateID"] == TEMPLATE
