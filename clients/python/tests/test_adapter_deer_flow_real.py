"""deer-flow's own code driving corral: its ``config.yaml`` machinery picks
``corral.adapters.deer_flow:CorralSandboxProvider``
(``get_sandbox_provider()``), and its sandbox tools
(``deerflow/sandbox/tools.py``: ``bash``, ``write_file``, ``read_file``,
``str_replace``, ``ls``, ``glob``, ``grep``) and ``SandboxMiddleware`` run
through it against a real ``corral serve``.

deer-flow is not on PyPI and needs Python 3.12, so this runs only when
``$CORRAL_DEERFLOW_SRC`` names a deer-flow checkout (else every case is
skipped, saying why), in a venv of its own::

    git clone https://github.com/bytedance/deer-flow /path/to/deer-flow
    python3.12 -m venv target/deerflow-venv
    target/deerflow-venv/bin/pip install /path/to/deer-flow/backend/packages/extension-api \\
        /path/to/deer-flow/backend/packages/harness pytest -e clients/python
    CORRAL_DEERFLOW_SRC=/path/to/deer-flow CORRAL_BIN=$PWD/target/debug/corral \\
        target/deerflow-venv/bin/python -m pytest -q clients/python/tests/test_adapter_deer_flow_real.py

(or, instead of installing the harness, its dependencies and
``CORRAL_DEERFLOW_SRC``: the test puts ``backend/packages/harness`` on
``sys.path`` when ``deerflow`` is not importable). The contract of each
``Sandbox`` method is tested without deer-flow in ``test_adapter_deer_flow.py``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from corral.testing import LocalServer, docker_ids

from conftest import LABELS, assert_no_leaks, corral_binary, server_config

SRC = os.environ.get("CORRAL_DEERFLOW_SRC")


def _import_deerflow():
    if not SRC:
        pytest.skip("CORRAL_DEERFLOW_SRC is not set: it names a deer-flow checkout (see this file's docstring)", allow_module_level=True)
    try:
        import deerflow  # noqa: F401
    except ImportError:
        harness = Path(SRC) / "backend" / "packages" / "harness"
        sys.path.insert(0, str(harness))
        try:
            import deerflow  # noqa: F401
        except ImportError as err:
            pytest.skip(f"deer-flow is not importable from {harness} ({err}): set up the venv as this file's docstring says", allow_module_level=True)
    if sys.version_info < (3, 12):
        pytest.skip("deer-flow needs Python 3.12 or later", allow_module_level=True)


_import_deerflow()

import corral.adapters.deer_flow as adapter  # noqa: E402  (after deer-flow, so it finds its base classes)
from deerflow.config.app_config import reset_app_config  # noqa: E402
from deerflow.sandbox.middleware import SandboxMiddleware  # noqa: E402
from deerflow.sandbox.sandbox import Sandbox as DeerFlowSandbox  # noqa: E402
from deerflow.sandbox.sandbox_provider import (  # noqa: E402
    SandboxProvider,
    get_sandbox_provider,
    shutdown_sandbox_provider,
)
from deerflow.sandbox.search import GrepMatch  # noqa: E402
from deerflow.sandbox.tools import (  # noqa: E402
    bash_tool,
    glob_tool,
    grep_tool,
    ls_tool,
    read_file_tool,
    str_replace_tool,
    write_file_tool,
)

pytestmark = pytest.mark.server
WS = "/mnt/user-data/workspace"


def _runtime(thread_id: str) -> SimpleNamespace:
    """A tool runtime as deer-flow's tests build one: state and context."""
    return SimpleNamespace(state={}, context={"thread_id": thread_id, "user_id": "df-user"}, config={})


def _use_corral(tmp_path: Path, monkeypatch, url: str, case: str) -> None:
    """config.yaml with the one-line switch; deer-flow loads it."""
    labels = {**LABELS, "corraltest.case": case}
    config = tmp_path / "config.yaml"
    config.write_text(
        "sandbox:\n"
        "  use: corral.adapters.deer_flow:CorralSandboxProvider\n"
        f"  corral_url: {url}\n"
        f"  spec: {{labels: {labels!r}}}\n".replace("'", '"')
    )
    monkeypatch.setenv("DEER_FLOW_CONFIG_PATH", str(config))
    monkeypatch.chdir(tmp_path)
    reset_app_config()
    shutdown_sandbox_provider()


@pytest.fixture
def deerflow_corral(tmp_path, monkeypatch, corral_url):
    _use_corral(tmp_path, monkeypatch, corral_url, "df-real")
    try:
        yield
    finally:
        shutdown_sandbox_provider()
        reset_app_config()
    assert docker_ids("corraltest.case=df-real") == []


def _container(provider, sandbox_id: str) -> str:
    return provider.client.sandbox_info(sandbox_id).container_id


def test_config_yaml_picks_the_corral_provider(deerflow_corral):
    """get_sandbox_provider(): resolve_class(config.sandbox.use, SandboxProvider)."""
    provider = get_sandbox_provider()
    assert isinstance(provider, adapter.CorralSandboxProvider) and isinstance(provider, SandboxProvider)
    assert adapter.DEERFLOW is True
    sid = provider.acquire("probe", user_id="df-user")
    assert isinstance(provider.get(sid), DeerFlowSandbox)


def test_a_misspelt_key_is_named(tmp_path, monkeypatch):
    """SandboxConfig passes extra keys through (extra="allow"); the provider
    names a key it does not know, with its value."""
    config = tmp_path / "config.yaml"
    config.write_text("sandbox:\n  use: corral.adapters.deer_flow:CorralSandboxProvider\n  corral_urll: http://x\n")
    monkeypatch.setenv("DEER_FLOW_CONFIG_PATH", str(config))
    reset_app_config()
    shutdown_sandbox_provider()
    try:
        with pytest.raises(ValueError, match=r"sandbox\.corral_urll: 'http://x'"):
            get_sandbox_provider()
    finally:
        reset_app_config()


def test_tools_drive_the_sandbox(deerflow_corral):
    """deer-flow's sandbox tools, lazily acquiring the thread's sandbox
    (ensure_sandbox_initialized) and answering the model as they do on AIO."""
    rt = _runtime("tools")
    assert bash_tool.func(rt, "where", "pwd") == f"{WS}\n"
    sid = rt.state["sandbox"]["sandbox_id"]
    assert sid == adapter.session_key("tools", "df-user")
    assert write_file_tool.func(rt, "write", f"{WS}/src/app.py", "x = 41\nname = 'corral'\n") == "OK"
    assert str_replace_tool.func(rt, "fix", f"{WS}/src/app.py", "x = 41", "x = 42") == "OK"
    assert read_file_tool.func(rt, "read", f"{WS}/src/app.py") == "x = 42\nname = 'corral'\n"
    assert read_file_tool.func(rt, "read", f"{WS}/src/app.py", 2, 2) == "name = 'corral'"
    assert read_file_tool.func(rt, "read", f"{WS}/nope.py") == f"Error: File not found: {WS}/nope.py"
    assert read_file_tool.func(rt, "read", WS) == f"Error: Path is a directory, not a file: {WS}"
    assert write_file_tool.func(rt, "append", f"{WS}/src/app.py", "z = 1\n", True) == "OK"
    assert bash_tool.func(rt, "run", "cat src/app.py | wc -l; echo oops >&2; exit 5") == "3\n\nStd Error:\noops\n\nExit Code: 5"
    listing = ls_tool.func(rt, "list", WS)
    assert f"{WS}/src/" in listing.splitlines() and f"{WS}/src/app.py" in listing.splitlines()
    assert f"{WS}/src/app.py" in glob_tool.func(rt, "find", "**/*.py", WS)
    grep = grep_tool.func(rt, "search", r"x\s*=\s*\d+", WS)
    assert f"{WS}/src/app.py:1: x = 42" in grep, grep
    assert grep_tool.func(rt, "search", "(bad", WS).startswith("Error: Invalid regex pattern")


def test_async_tools_and_turns(deerflow_corral):
    """The async tool path (acquire_async off the loop, get() on it) and a
    turn boundary: SandboxMiddleware.after_agent releases the sandbox, the
    next turn's first tool call gets the thread's same sandbox back (AIO's
    warm pool), files included."""
    rt = _runtime("turns")
    out = asyncio.run(bash_tool.coroutine(rt, "write", "echo turn1 > notes.txt; cat notes.txt"))
    assert out == "turn1\n"
    sid = rt.state["sandbox"]["sandbox_id"]
    provider = get_sandbox_provider()
    SandboxMiddleware().after_agent(rt.state, rt)
    assert provider.get(sid) is None
    assert asyncio.run(bash_tool.coroutine(rt, "read", "cat notes.txt")) == "turn1\n"
    assert rt.state["sandbox"]["sandbox_id"] == sid


def test_container_killed_between_tool_calls(deerflow_corral):
    """Seed 001 (deer-flow #2788, auto-restart): the container is removed out
    of band between two tool calls; the next call gets a working sandbox."""
    rt = _runtime("crash")
    assert bash_tool.func(rt, "mark", "echo alive") == "alive\n"
    provider = get_sandbox_provider()
    sid = rt.state["sandbox"]["sandbox_id"]
    dead = _container(provider, sid)
    subprocess.run(["docker", "rm", "-f", dead], check=True, capture_output=True)
    assert bash_tool.func(rt, "again", "pwd; echo alive again") == f"{WS}\nalive again\n"
    assert _container(provider, sid) != dead
    assert write_file_tool.func(rt, "write", f"{WS}/after.txt", "ok") == "OK"


def test_shutdown_leaves_nothing(deerflow_corral):
    """shutdown_sandbox_provider(): every sandbox the provider acquired goes,
    released ones included."""
    for thread in ("s1", "s2"):
        assert bash_tool.func(_runtime(thread), "touch", "true") == "(no output)"
    get_sandbox_provider().release(adapter.session_key("s1", "df-user"))
    assert len(docker_ids("corraltest.case=df-real")) == 2
    shutdown_sandbox_provider()
    assert docker_ids("corraltest.case=df-real") == []


@pytest.fixture
def small_service():
    """corral's provider.max_live: 2, deer-flow's replicas."""
    server = LocalServer(corral_binary(), config=server_config(provider={"max_live": 2}))
    server.start()
    try:
        yield server
    finally:
        shutdown_sandbox_provider()
        reset_app_config()
        server.close()
        assert_no_leaks()


def test_replica_pressure_evicts_the_least_recently_used(tmp_path, monkeypatch, small_service):
    """AIO's replicas: at the limit the least recently used sandbox makes
    room; its thread's next tool call gets a new sandbox."""
    _use_corral(tmp_path, monkeypatch, small_service.url, "df-lru")
    a, b, c = _runtime("a"), _runtime("b"), _runtime("c")
    bash_tool.func(a, "a", "echo a > a.txt")
    bash_tool.func(b, "b", "echo b > b.txt")
    provider = get_sandbox_provider()
    b_container = _container(provider, b.state["sandbox"]["sandbox_id"])
    assert bash_tool.func(a, "touch a", "cat a.txt") == "a\n"  # b is the least recently used now
    assert bash_tool.func(c, "c", "echo c") == "c\n"
    live = {s.id for s in provider.client.list_sandboxes()}
    assert live == {a.state["sandbox"]["sandbox_id"], c.state["sandbox"]["sandbox_id"]}
    assert b_container not in {provider.client.sandbox_info(s).container_id for s in live}
    assert bash_tool.func(b, "b again", "cat b.txt 2>/dev/null || echo fresh") == "fresh\n"


def test_grep_results_are_deer_flows_objects(deerflow_corral):
    """With deer-flow installed the adapter returns its GrepMatch."""
    provider = get_sandbox_provider()
    sb = provider.get(provider.acquire("grep", user_id="df-user"))
    sb.write_file(f"{WS}/g.txt", "needle\n")
    matches, truncated = sb.grep(WS, "needle")
    assert [type(m) for m in matches] == [GrepMatch] and truncated is False
