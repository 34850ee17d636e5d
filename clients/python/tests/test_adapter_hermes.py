"""hermes-agent's real terminal tool (``tools.terminal_tool`` of the PyPI
release, pinned in scripts/python-env.sh) on corral, case by case, each
test naming the behaviour of hermes' Docker backend
(``tools/environments/docker.py``) it mirrors; and side by side with that
backend on the same image where the difference is the point.

The tests use a ``corral serve`` of their own that allows persistent
sandboxes (hermes' default, ``container_persistent``), with its
``persistence_root`` in a temporary directory. Persistent sandboxes outlive
the service by design, so its fixture removes them (by this run's label)
after stopping it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

import corral
from corral.testing import LocalServer, docker_ids

from conftest import IMAGE, LABELS, RUN_ID, corral_binary

hermes_tt = pytest.importorskip("tools.terminal_tool", reason="hermes-agent is not installed (scripts/python-env.sh)")

from corral.adapters import hermes  # noqa: E402  (needs hermes-agent)

pytestmark = pytest.mark.server

HERMES_LABEL = "corraltest.hermes"


# -- fixtures ----------------------------------------------------------------


@pytest.fixture(scope="module")
def hermes_server(tmp_path_factory) -> Iterator[LocalServer]:
    """A service allowing persistent sandboxes; every container it made is
    removed after it stops (persistent ones stay past a service by design)."""
    mark = uuid.uuid4().hex[:12]
    root = tmp_path_factory.mktemp("corral-persist")
    cfg = {
        "defaults": {"image": IMAGE, "labels": {**LABELS, HERMES_LABEL: mark}},
        "persistence_root": str(root),
        "server": {"policy": {"allow_persistent": True}},
    }
    server = LocalServer(corral_binary(), config=cfg)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        server.close()
        left = docker_ids(f"{HERMES_LABEL}={mark}")
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def hermes_url(hermes_server: LocalServer) -> str:
    return hermes_server.url


@pytest.fixture
def service(hermes_url: str) -> Iterator[corral.Client]:
    with corral.Client(hermes_url) as client:
        yield client


@pytest.fixture
def terminal(hermes_server: LocalServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """hermes' terminal tool with ``TERMINAL_ENV=corral`` (switched with
    :func:`hermes.install`), in a ``HERMES_HOME`` of its own. Afterwards
    every hermes environment is cleaned up and every sandbox of the service
    released (hermes leaves them for the next process by default)."""
    home = tmp_path / "hermes-home"
    home.mkdir()
    monkeypatch.setenv("HERMES_HOME", str(home))
    monkeypatch.setenv("CORRAL_URL", hermes_server.url)
    monkeypatch.setenv("CORRAL_TOKEN", hermes_server.client_token or "")
    monkeypatch.setenv("TERMINAL_ENV", "corral")
    monkeypatch.setenv("TERMINAL_CONTAINER_MEMORY", "256")
    for name in ("TERMINAL_DOCKER_IMAGE", "TERMINAL_CWD", hermes.IMAGE_ENV, hermes.PROFILE_ENV, hermes.MAX_OUTPUT_ENV):
        monkeypatch.delenv(name, raising=False)
    hermes.install()
    try:
        yield hermes_tt
    finally:
        hermes_tt.cleanup_all_environments()
        for task in list(hermes_tt._task_env_overrides):
            hermes_tt.clear_task_env_overrides(task)
        with corral.Client(hermes_server.url) as client:
            for sb in client.list_sandboxes():
                client.delete_sandbox(sb.id)


def run(tt: Any, command: str, **kwargs: Any) -> Dict[str, Any]:
    """hermes' terminal tool, its JSON answer decoded."""
    return json.loads(tt.terminal_tool(command, **kwargs))


def env_of(tt: Any, task_id: str = "default") -> "hermes.CorralEnvironment":
    env = tt.get_active_env(task_id)
    assert isinstance(env, hermes.CorralEnvironment), env
    return env


def container_of(client: corral.Client, key: str) -> str:
    return client.sandbox_info(key).container_id


def inspect(container: str, fmt: str) -> str:
    return subprocess.run(
        ["docker", "inspect", "-f", fmt, container], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


# -- commands ----------------------------------------------------------------


def test_command_exit_code_and_merged_stderr(terminal):
    """DockerEnvironment: `docker exec ... bash -c`, stderr=STDOUT; the
    terminal tool answers {"output", "exit_code", "error"}."""
    r = run(terminal, "echo out; echo err >&2; echo again; exit 3")
    assert r == {"output": "out\nerr\nagain", "exit_code": 3, "error": None}
    r = run(terminal, "echo $BASH_VERSION | cut -c1")
    assert r["exit_code"] == 0 and r["output"].isdigit(), "commands run with bash, as with docker exec bash -c"


def test_spec_carries_hermes_settings(terminal, service, monkeypatch):
    """DockerEnvironment's run args: --memory {container_memory}m, --cpus,
    --pids-limit 256, --network=none for docker_network false, docker_env
    set at creation, and the labels hermes-agent / hermes-task-id /
    hermes-profile."""
    monkeypatch.setenv("TERMINAL_CONTAINER_MEMORY", "96")
    monkeypatch.setenv("TERMINAL_CONTAINER_CPU", "0.5")
    monkeypatch.setenv("TERMINAL_DOCKER_NETWORK", "false")
    monkeypatch.setenv("TERMINAL_DOCKER_ENV", json.dumps({"HERMES_SETTING": "from-docker-env"}))
    r = run(terminal, "echo $HERMES_SETTING")
    assert r["output"] == "from-docker-env"
    env = env_of(terminal)
    cid = env.container_id
    assert inspect(cid, "{{.HostConfig.Memory}}") == str(96 << 20)
    assert inspect(cid, "{{.HostConfig.NanoCpus}}") == str(500_000_000)
    assert inspect(cid, "{{.HostConfig.PidsLimit}}") == "256"
    assert inspect(cid, "{{.HostConfig.NetworkMode}}") == "none"
    labels = json.loads(inspect(cid, "{{json .Config.Labels}}"))
    assert labels["hermes-agent"] == "1"
    assert labels["hermes-task-id"] == "default"
    assert labels["hermes-profile"] == "default"
    # docker_env is the sandbox's environment, never the engine's config.
    assert "from-docker-env" not in inspect(cid, "{{json .Config.Env}}")
    # container_persistent (default true): a persistent sandbox of the task's key.
    info = service.sandbox_info(hermes.session_key("default"))
    assert info.persistent and info.container_id == cid


def test_memory_limit_oom_is_137(terminal, monkeypatch):
    """A command the kernel OOM-kills: exit 137, as `docker exec` reports a
    SIGKILLed process; the sandbox keeps working."""
    monkeypatch.setenv("TERMINAL_CONTAINER_MEMORY", "32")
    r = run(terminal, "dd if=/dev/zero of=/dev/null bs=100M count=1")
    assert r["exit_code"] == 137, r
    assert run(terminal, "echo alive")["output"] == "alive"


def test_timeout_is_124_and_kills_the_command(terminal, service):
    """BaseEnvironment._wait_for_process: past the timeout, exit 124 and
    "[Command timed out after Ns]" after the output so far; the command is
    killed (in the sandbox: its whole process tree)."""
    r = run(terminal, "echo started; sleep 45; echo never", timeout=2)
    assert r["exit_code"] == 124
    assert r["output"] == "started\n\n[Command timed out after 2s]"
    sb = service.get_sandbox(hermes.session_key("default"))
    assert not _running(sb, "sleep 45")
    assert run(terminal, "echo next")["output"] == "next"


def test_own_exit_124_is_a_result(terminal):
    """A command that exits 124 by itself: the exit code, no timeout note."""
    r = run(terminal, "exit 124")
    assert (r["exit_code"], r["output"]) == (124, "")


def test_interrupt_is_130_and_kills_the_command(terminal, service):
    """hermes' interrupt (tools.interrupt.set_interrupt for the agent's
    thread): _wait_for_process kills the process, exit 130 and
    "[Command interrupted]"."""
    from tools.interrupt import set_interrupt

    run(terminal, "true")  # the sandbox exists
    sb = service.get_sandbox(hermes.session_key("default"))
    answer: Dict[str, Any] = {}
    worker = threading.Thread(target=lambda: answer.update(run(terminal, "echo working; sleep 77; echo never")))
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while not _running(sb, "sleep 77"):
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.1)
        set_interrupt(True, worker.ident)
        worker.join(60)
        assert not worker.is_alive()
    finally:
        set_interrupt(False, worker.ident)
    assert answer["exit_code"] == 130, answer
    # "working" was printed before the sleep started; it may still have been
    # on its way to hermes when the interrupt came.
    assert answer["output"] in ("working\n\n[Command interrupted]", "[Command interrupted]"), answer
    deadline = time.monotonic() + 60
    while _running(sb, "sleep 77"):
        assert time.monotonic() < deadline, "the interrupted command is still running"
        time.sleep(0.1)
    assert run(terminal, "echo after")["output"] == "after"


def _running(sb: corral.Sandbox, args: str) -> bool:
    """Whether a process with exactly these arguments runs in the sandbox
    (not the shell whose script merely mentions them)."""
    return any(line.strip() == args for line in sb.run("ps -o args", timeout=30).stdout.splitlines())


def test_stdin_data(terminal):
    """BaseEnvironment.execute(stdin_data=...): piped to the command (docker
    exec -i), which then sees EOF."""
    run(terminal, "true")
    env = env_of(terminal)
    r = env.execute("cat; echo; wc -c", stdin_data="line one\nline two\n")
    assert r["returncode"] == 0
    assert r["output"].startswith("line one\nline two\n")
    r = env.execute("wc -c", stdin_data="")
    assert r["output"].strip() == "0"


# -- files and state -----------------------------------------------------------


def test_file_tools_write_and_read_back(terminal):
    """hermes' write_file / read_file tools (ShellFileOperations over the
    terminal environment; writes pipe the content through stdin)."""
    from tools.file_tools import read_file_tool, write_file_tool

    content = "first line\nsecond: ünïcode\n" + "x" * 5000 + "\n"
    w = json.loads(write_file_tool("/workspace/notes/todo.txt", content))
    assert "error" not in w or not w["error"], w
    r = json.loads(read_file_tool("/workspace/notes/todo.txt"))
    assert "first line" in r["content"] and "second: ünïcode" in r["content"], r
    assert run(terminal, "cat /workspace/notes/todo.txt | md5sum")["output"].split()[0] == (
        __import__("hashlib").md5(content.encode()).hexdigest()
    )


def test_state_persists_across_calls(terminal):
    """hermes' session snapshot and cwd tracking: exported variables and the
    working directory carry to the next call (functions do not: hermes
    re-dumps only `export -p` after a command)."""
    r = run(terminal, "mkdir -p /workspace/proj && cd /workspace/proj && export GREETING=hello && LOCAL=x")
    assert r["exit_code"] == 0, r
    r = run(terminal, 'pwd; echo "$GREETING"; echo "${LOCAL:-unset}"')
    assert r["output"] == "/workspace/proj\nhello\nunset"


def test_isolation_between_task_ids(terminal, service):
    """register_task_env_overrides(task_id, {"docker_image": ...}) gives a
    task its own sandbox (hermes' RL/benchmark isolation): files and
    containers are not shared; cleanup_vm releases one task's."""
    for task in ("rollout-a", "rollout-b"):
        terminal.register_task_env_overrides(task, {"docker_image": IMAGE})
    assert run(terminal, "echo secret-a > /workspace/a.txt", task_id="rollout-a")["exit_code"] == 0
    r = run(terminal, "cat /workspace/a.txt", task_id="rollout-b")
    assert r["exit_code"] != 0 and "secret-a" not in r["output"]
    a, b = env_of(terminal, "rollout-a"), env_of(terminal, "rollout-b")
    assert a.container_id != b.container_id
    assert service.sandbox_info(hermes.session_key("rollout-a")).container_id == a.container_id
    assert run(terminal, "cat /workspace/a.txt", task_id="rollout-a")["output"] == "secret-a"


# -- recovery (hermes PR #39415, "No such container") ---------------------------


def test_recovers_from_docker_rm_keeping_the_workspace(terminal, service):
    """DockerEnvironment.execute: a persistent task's container removed
    out-of-band is recreated with the same spec, the session snapshot is
    re-initialised, and the command succeeds; here the service recreates it
    (recovery ``recreate``) and the persistent workspace is still there."""
    assert run(terminal, "echo kept > /workspace/keep.txt && echo lost > /tmp/lost.txt")["exit_code"] == 0
    key = hermes.session_key("default")
    before = container_of(service, key)
    subprocess.run(["docker", "rm", "-f", before], check=True, capture_output=True, timeout=60)

    r = run(terminal, "cat /workspace/keep.txt; cat /tmp/lost.txt 2>/dev/null || echo tmp-is-new")
    assert r == {"output": "kept\ntmp-is-new", "exit_code": 0, "error": None}
    after = container_of(service, key)
    assert after != before
    # hermes' session snapshot was taken again: state carries on as before.
    assert run(terminal, "export AFTER=yes; cd /workspace")["exit_code"] == 0
    assert run(terminal, 'echo "$AFTER"; pwd')["output"] == "yes\n/workspace"
    assert container_of(service, key) == after


def test_real_nonzero_exit_is_not_a_lost_container(terminal, service):
    """hermes' Docker backend decides "container gone" from the words "No
    such container" / "is not running" in the output of a failed command;
    here only the service's typed failure does. A command printing those
    words and exiting 1 is a result: same container, its files intact."""
    run(terminal, "echo mine > /tmp/marker")
    key = hermes.session_key("default")
    before = container_of(service, key)
    r = run(terminal, "echo 'Error response from daemon: No such container: abc123'; echo 'container x is not running' >&2; exit 1")
    assert r["exit_code"] == 1
    assert "No such container: abc123" in r["output"]
    assert container_of(service, key) == before
    assert run(terminal, "cat /tmp/marker")["output"] == "mine"


def test_recovers_when_the_service_forgot_the_sandbox(terminal, service):
    """A sandbox the service no longer has (released by another process,
    evicted): the next call asks for it again under the same key, as hermes
    probes for a reusable container by its labels, and runs the command."""
    assert run(terminal, "echo durable > /workspace/d.txt")["exit_code"] == 0
    key = hermes.session_key("default")
    service.delete_sandbox(key)
    r = run(terminal, "cat /workspace/d.txt")
    assert r == {"output": "durable", "exit_code": 0, "error": None}
    assert service.sandbox_info(key).persistent


def test_without_persist_across_processes_a_loss_is_reported(terminal, service, monkeypatch):
    """docker_persist_across_processes false: hermes does not recover (and
    removes the container at cleanup). The lost container is reported, exit
    -1 with corral's message, and the typed failure is on the environment."""
    monkeypatch.setenv("TERMINAL_DOCKER_PERSIST_ACROSS_PROCESSES", "false")
    monkeypatch.setenv("TERMINAL_CONTAINER_PERSISTENT", "false")
    run(terminal, "true")
    env = env_of(terminal)
    subprocess.run(["docker", "rm", "-f", env.container_id], check=True, capture_output=True, timeout=60)
    r = run(terminal, "echo hi")
    assert r["exit_code"] == -1
    assert "lost" in r["output"] or "removed" in r["output"], r
    assert env.last_failure is not None and env.last_failure.kind == "container_lost"


# -- limits on output and bad settings --------------------------------------------


def test_output_beyond_max_output_says_where_it_was_cut(terminal, monkeypatch):
    """hermes' Docker backend keeps all output; corral keeps max_output per
    stream ($TERMINAL_CORRAL_MAX_OUTPUT), head and tail, and says how many
    bytes it dropped between them."""
    monkeypatch.setenv(hermes.MAX_OUTPUT_ENV, "1000")
    run(terminal, "true")
    env = env_of(terminal)
    r = env.execute("head -c 5000 /dev/zero | tr '\\000' a; printf END")
    out = r["output"]
    assert r["returncode"] == 0
    assert out.startswith("a" * 500 + "\n[... ")
    # hermes' wrapper prints its working-directory marker line after the
    # command (and takes it out of the answer): it counts in the stream.
    marker_line = 1 + 2 * len(env._cwd_marker) + len(env.cwd) + 1
    assert f"[... {5003 + marker_line - 1000} bytes elided by corral" in out
    assert out.endswith("aaaEND")


@pytest.mark.parametrize(
    "name, value, field, shown",
    [
        ("TERMINAL_DOCKER_EXTRA_ARGS", '["--privileged"]', "docker_extra_args", "--privileged"),
        ("TERMINAL_DOCKER_VOLUMES", '["/etc:/host-etc"]', "spec.mounts[0]", "/etc"),
        ("TERMINAL_DOCKER_VOLUMES", '["no-colon"]', "docker_volumes[0]", "no-colon"),
        ("TERMINAL_CONTAINER_MEMORY", "lots", "TERMINAL_CONTAINER_MEMORY", "lots"),
        (hermes.MAX_OUTPUT_ENV, "big", hermes.MAX_OUTPUT_ENV, "big"),
    ],
)
def test_bad_settings_name_the_field_and_value(terminal, monkeypatch, name, value, field, shown):
    """A setting corral cannot honour is an error naming it and its value
    (host mounts: the service's policy refuses them to clients)."""
    monkeypatch.setenv(name, value)
    r = run(terminal, "echo never")
    assert r["exit_code"] == -1, r
    assert field in r["error"] and shown in r["error"], r


def test_persistent_refused_names_the_setting(corral_url, tmp_path, monkeypatch):
    """A service that does not allow persistent sandboxes (the default
    policy) refuses hermes' default container_persistent; the error says
    which setting to change on either side."""
    monkeypatch.setenv("HERMES_HOME", str(tmp_path))
    monkeypatch.setenv("CORRAL_URL", corral_url)
    monkeypatch.setenv("CORRAL_TOKEN", corral.find_token(corral_url) or "")
    monkeypatch.setenv("TERMINAL_ENV", "corral")
    hermes.install()
    try:
        r = run(hermes_tt, "echo never")
        assert r["exit_code"] == -1
        assert "allow_persistent" in r["error"] and "TERMINAL_CONTAINER_PERSISTENT=false" in r["error"], r
        monkeypatch.setenv("TERMINAL_CONTAINER_PERSISTENT", "false")
        assert run(hermes_tt, "echo fine")["output"] == "fine"
    finally:
        hermes_tt.cleanup_all_environments()
        with corral.Client(corral_url) as c:
            for sb in c.list_sandboxes():
                if sb.id.startswith("hermes-"):
                    c.delete_sandbox(sb.id)


# -- the switch and the process lifecycle (real child processes) ---------------


def _hermes_child(server: LocalServer, home: Path, body: str, **env: str) -> subprocess.Popen:
    child_env = dict(os.environ)
    for name in ("TERMINAL_ENV", "TERMINAL_DOCKER_IMAGE", "CORRAL_OPEN_INSTRUCT"):
        child_env.pop(name, None)
    child_env.update(
        {
            "HERMES_HOME": str(home),
            "CORRAL_URL": server.url,
            "CORRAL_TOKEN": server.client_token or "",
            "TERMINAL_CONTAINER_MEMORY": "256",
        }
    )
    child_env.update(env)
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(body)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env,
    )


def _answer(proc: subprocess.Popen, timeout: float = 180) -> List[str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{err[-4000:]}"
    return out.splitlines()


TOOL = """\
import json
from tools.terminal_tool import terminal_tool
def run(cmd, **kw):
    return json.loads(terminal_tool(cmd, **kw))
"""


def test_one_line_switch_terminal_env(hermes_server, tmp_path):
    """`TERMINAL_ENV=corral hermes`: nothing else. The client's startup hook
    (corral_autoload.pth) switches hermes' terminal tool as it is imported;
    hermes then also lists the terminal and file tools (its requirement
    check knows the backend)."""
    body = TOOL + """\
import model_tools
names = {t["function"]["name"] for t in model_tools.get_tool_definitions(enabled_toolsets=["terminal", "file"], quiet_mode=True)}
print("tools", "terminal" in names, "write_file" in names)
r = run("echo via-startup-hook; cat /etc/hostname")
print("answer", r["exit_code"], r["output"].splitlines()[0])
"""
    proc = _hermes_child(hermes_server, tmp_path, body, TERMINAL_ENV="corral", TERMINAL_DOCKER_PERSIST_ACROSS_PROCESSES="false")
    lines = _answer(proc)
    assert "tools True True" in lines
    assert "answer 0 via-startup-hook" in lines


def test_plugin_entry_point_with_config_yaml(hermes_server, tmp_path):
    """`terminal.backend: corral` in config.yaml and `hermes plugins enable
    corral`: hermes' plugin loader loads the client's hermes_agent.plugins
    entry point, whose register() switches the backend (hermes 0.19.0 has no
    terminal-backend plugin API, so it installs), and hermes' config bridge
    selects it. $TERMINAL_ENV is not set at start."""
    (tmp_path / "config.yaml").write_text(
        "terminal:\n  backend: corral\n  docker_persist_across_processes: false\nplugins:\n  enabled: [corral]\n"
    )
    body = """\
from hermes_cli.plugins import discover_plugins, get_plugin_manager
discover_plugins()
loaded = get_plugin_manager()._plugins.get("corral")
print("plugin", bool(loaded and loaded.enabled), getattr(loaded, "error", None))
""" + TOOL + """\
r = run("echo via-plugin")
print("answer", r["exit_code"], r["output"] or r)
import os
print("backend", os.environ.get("TERMINAL_ENV"))
"""
    proc = _hermes_child(hermes_server, tmp_path, body)
    lines = _answer(proc)
    assert "plugin True None" in lines, lines
    assert "answer 0 via-plugin" in lines, lines
    assert "backend corral" in lines


class RecordingPluginContext:
    """A test double of the ``PluginContext`` of hermes sources newer than
    the PyPI release, which have ``register_terminal_environment_provider``
    (hermes-agent 0.19.0 does not): it records what is registered."""

    def __init__(self) -> None:
        self.providers: List[Any] = []

    def register_terminal_environment_provider(self, provider: Any) -> None:
        self.providers.append(provider)


def test_plugin_api_registers_a_provider(terminal):
    """Where hermes has the plugin API, register() hands it a provider
    (name "corral", a container backend) instead of patching hermes; its
    create_environment, called as hermes' _build_plugin_env calls it,
    gives a working environment."""
    ctx = RecordingPluginContext()
    hermes.register(ctx)
    [provider] = ctx.providers
    assert (provider.name, provider.is_container, provider.is_remote, provider.is_available()) == (
        "corral",
        True,
        True,
        True,
    )
    env = provider.create_environment(
        cwd="/root",
        timeout=60,
        task_id="plugin-api",
        image="",
        container_config={"container_memory": 128, "container_persistent": False, "docker_persist_across_processes": False},
    )
    try:
        assert env.execute("echo from-provider")["output"] == "from-provider\n"
        assert inspect(env.container_id, "{{.HostConfig.Memory}}") == str(128 << 20)
    finally:
        env.cleanup()


def test_released_at_exit_without_persist_across_processes(hermes_server, tmp_path):
    """docker_persist_across_processes false: hermes removes its container at
    exit (its atexit hook); so does corral, also when the process is
    stopped with SIGTERM mid-command."""
    case = uuid.uuid4().hex[:10]
    body = TOOL + f"""\
from tools.terminal_tool import register_task_env_overrides
register_task_env_overrides("exit-{case}", {{"docker_image": "{IMAGE}"}})
r = run("hostname", task_id="exit-{case}")
print("host", r["output"], flush=True)
"""
    proc = _hermes_child(
        hermes_server, tmp_path, body, TERMINAL_ENV="corral", TERMINAL_DOCKER_PERSIST_ACROSS_PROCESSES="false"
    )
    lines = _answer(proc)
    assert any(line.startswith("host ") for line in lines)
    assert docker_ids("corral.sandbox", f"hermes-task-id=exit-{case}") == []

    hang = TOOL + f"""\
from tools.terminal_tool import register_task_env_overrides
register_task_env_overrides("term-{case}", {{"docker_image": "{IMAGE}"}})
print("ready", flush=True)
run("echo started; sleep 120", task_id="term-{case}", timeout=300)
"""
    proc = _hermes_child(
        hermes_server, tmp_path, hang, TERMINAL_ENV="corral", TERMINAL_DOCKER_PERSIST_ACROSS_PROCESSES="false"
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 120
    with corral.Client(hermes_server.url) as client:
        while True:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            # Its own sandbox (no session key): found among the service's.
            try:
                if any(_running(client.get_sandbox(info.id), "sleep 120") for info in client.list_sandboxes()):
                    break
            except corral.SandboxNotFoundError:
                pass
            time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    deadline = time.monotonic() + 30
    while docker_ids("corral.sandbox", f"hermes-task-id=term-{case}"):
        assert time.monotonic() < deadline, "the sandbox outlived its SIGTERMed process"
        time.sleep(0.2)


def test_next_process_gets_the_same_sandbox(hermes_server, tmp_path, service):
    """docker_persist_across_processes (default): hermes' one long-lived
    container per task, found again by the next process; here the session
    key finds the same sandbox, the same container with its /tmp."""
    case = uuid.uuid4().hex[:10]
    body = TOOL + f"""\
from tools.terminal_tool import register_task_env_overrides
register_task_env_overrides("reuse-{case}", {{"docker_image": "{IMAGE}"}})
r = run("cat /tmp/first 2>/dev/null || (echo $$ > /tmp/first; echo new)", task_id="reuse-{case}")
print("answer", r["output"], flush=True)
"""
    first = _answer(_hermes_child(hermes_server, tmp_path, body, TERMINAL_ENV="corral"))
    key = hermes.session_key(f"reuse-{case}")
    container = container_of(service, key)
    second = _answer(_hermes_child(hermes_server, tmp_path, body, TERMINAL_ENV="corral"))
    assert "answer new" in first
    [answer] = [line for line in second if line.startswith("answer ")]
    assert answer != "answer new" and answer.split()[1].isdigit(), second
    assert container_of(service, key) == container
    service.delete_sandbox(key)


# -- side by side with hermes' own Docker backend --------------------------------


@pytest.fixture
def both_backends(hermes_server, tmp_path, monkeypatch):
    """hermes' terminal tool on its Docker backend and on corral, the same
    image (corral-test/busybox, which has bash) and settings, each under a
    task id of its own; hermes' Docker containers are removed by label after."""
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes-home"))
    monkeypatch.setenv("CORRAL_URL", hermes_server.url)
    monkeypatch.setenv("CORRAL_TOKEN", hermes_server.client_token or "")
    monkeypatch.setenv("TERMINAL_DOCKER_IMAGE", IMAGE)
    monkeypatch.setenv("TERMINAL_CONTAINER_MEMORY", "256")
    monkeypatch.setenv("TERMINAL_CONTAINER_DISK", "0")
    # hermes' once-per-process sweep of old exited hermes containers: not here.
    monkeypatch.setenv("TERMINAL_DOCKER_ORPHAN_REAPER", "false")
    case = uuid.uuid4().hex[:10]
    hermes.install()
    tasks = {"docker": f"docker-{case}", "corral": f"corral-{case}"}
    for task in tasks.values():
        hermes_tt.register_task_env_overrides(task, {"docker_image": IMAGE})

    def call(backend: str, command: str, **kwargs: Any) -> Dict[str, Any]:
        monkeypatch.setenv("TERMINAL_ENV", backend)
        return run(hermes_tt, command, task_id=tasks[backend], **kwargs)

    try:
        yield call, tasks
    finally:
        hermes_tt.cleanup_all_environments()
        for task in tasks.values():
            hermes_tt.clear_task_env_overrides(task)
        left = docker_ids(f"hermes-task-id={tasks['docker']}")
        if left:
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, timeout=120)
        with corral.Client(hermes_server.url) as client:
            for sb in client.list_sandboxes():
                client.delete_sandbox(sb.id)


SAME_ON_BOTH = [
    ("printf 'no newline'; exit 5", {}),
    ("mkdir -p /workspace/w && cd /workspace/w && export SIDE=by-side", {}),
    ('pwd; echo "$SIDE"', {}),
    ("exit 124", {}),
    ("echo first; sleep 30", {"timeout": 2}),
    ("cat /nonexistent", {}),
]


def test_same_answers_as_hermes_docker_backend(both_backends):
    """The terminal tool answers the same on hermes' Docker backend and on
    corral for exit codes, output, state across calls, a command's own 124,
    a missing file's error and a timeout. Merged stdout and stderr hold the
    same lines; corral keeps the order they were written in, where `docker
    exec` (separate streams, demultiplexed by the CLI) may not."""
    call, _ = both_backends
    for command, kwargs in SAME_ON_BOTH:
        docker = call("docker", command, **kwargs)
        ours = call("corral", command, **kwargs)
        assert ours == docker, (command, docker, ours)
    interleaved = "echo out; echo err >&2; echo again; exit 3"
    docker = call("docker", interleaved)
    ours = call("corral", interleaved)
    assert ours == {"output": "out\nerr\nagain", "exit_code": 3, "error": None}
    assert docker["exit_code"] == 3 and sorted(docker["output"].split("\n")) == ["again", "err", "out"], docker


def test_side_by_side_no_such_container_text(both_backends):
    """The difference seed 003 warns of: hermes' Docker backend takes a
    command that fails and prints "No such container" for a lost container:
    it "recovers" (finds its own healthy container by label), takes a new
    session snapshot (variables exported earlier are gone) and runs the
    command a second time. On corral it is a result, run once."""
    call, _ = both_backends
    fooled = "echo run >> /tmp/runs; echo 'Error: No such container: deadbeef'; exit 1"
    seen = {}
    for backend in ("docker", "corral"):
        assert call(backend, "export KEEP=kept")["exit_code"] == 0
        r = call(backend, fooled)
        assert r["exit_code"] == 1 and "No such container" in r["output"]
        seen[backend] = call(backend, 'wc -l < /tmp/runs; echo "${KEEP:-lost}"')["output"].split()
    assert seen["corral"] == ["1", "kept"]
    assert seen["docker"] == ["2", "lost"], (
        "hermes' Docker backend no longer reruns a command on these words: update the README's list of differences"
    )


def test_cleanup_vm_force_remove_removes_the_sandbox(hermes_server, tmp_path):
    """`cleanup_vm(task_id, force_remove=True)` (hermes' explicit teardown)
    with TERMINAL_CONTAINER_PERSISTENT=false: the sandbox is gone before
    the process exits, as hermes' Docker backend removes its container."""
    case = uuid.uuid4().hex[:10]
    body = TOOL + f"""\
from tools.terminal_tool import cleanup_vm, register_task_env_overrides
register_task_env_overrides("force-{case}", {{"docker_image": "{IMAGE}"}})
r = run("hostname", task_id="force-{case}")
print("ran", r["exit_code"], flush=True)
cleanup_vm("force-{case}", force_remove=True)
import subprocess
left = subprocess.run(["docker", "ps", "-aq", "--filter", "label=hermes-task-id=force-{case}"], capture_output=True, text=True).stdout.split()
print("left", len(left), flush=True)
"""
    lines = _answer(_hermes_child(hermes_server, tmp_path, body, TERMINAL_ENV="corral", TERMINAL_CONTAINER_PERSISTENT="false"))
    assert "ran 0" in lines
    assert "left 0" in lines, lines
    assert docker_ids("corral.sandbox", f"hermes-task-id=force-{case}") == []


@pytest.mark.parametrize("persist", ["true", "false"])
def test_cleanup_vm_force_remove_of_a_task_without_overrides(hermes_server, tmp_path, persist):
    """hermes 0.19.0 runs a task id without an image override in the shared
    "default" environment (`_resolve_container_task_id`) but its
    `cleanup_vm(task_id)` looks the raw id up: `cleanup_vm("t1",
    force_remove=True)` after `terminal_tool(..., task_id="t1")` found
    nothing and removed nothing. With corral the explicit teardown removes
    the sandbox the task's commands ran in before the call returns (with or
    without docker_persist_across_processes), and the task's next command
    gets a new one."""
    body = TOOL + """\
import subprocess
import tools.terminal_tool as tt
from tools.terminal_tool import cleanup_vm
def alive(cid):
    return subprocess.run(["docker", "ps", "-aq", "--no-trunc", "--filter", "id=" + cid], capture_output=True, text=True, check=True).stdout.split()
r = run("hostname", task_id="t1")
print("ran", r["exit_code"], flush=True)
env = tt.get_active_env("t1")
sandbox = env.sandbox.refresh()
print("before", len(alive(sandbox.container_id)), flush=True)
cleanup_vm("t1", force_remove=True)
print("after", len(alive(sandbox.container_id)), flush=True)
print("tracked", tt.get_active_env("t1") is not None, flush=True)
r = run("hostname", task_id="t1")
print("again", r["exit_code"], tt.get_active_env("t1").sandbox.refresh().container_id != sandbox.container_id, flush=True)
"""
    lines = _answer(
        _hermes_child(
            hermes_server,
            tmp_path,
            body,
            TERMINAL_ENV="corral",
            TERMINAL_CONTAINER_PERSISTENT="false",
            TERMINAL_DOCKER_PERSIST_ACROSS_PROCESSES=persist,
        )
    )
    assert "ran 0" in lines and "before 1" in lines, lines
    assert "after 0" in lines, lines
    assert "tracked False" in lines and "again 0 True" in lines, lines


def test_two_processes_without_persist_across_processes_share_nothing(hermes_server, tmp_path):
    """TERMINAL_DOCKER_PERSIST_ACROSS_PROCESSES=false with hermes' default
    container_persistent: two hermes processes of one task and profile get
    a sandbox each (hermes' Docker backend: a container per process), so the
    first to exit removes only its own."""
    case = uuid.uuid4().hex[:10]
    body = TOOL + f"""\
import sys
from tools.terminal_tool import register_task_env_overrides
register_task_env_overrides("pair-{case}", {{"docker_image": "{IMAGE}"}})
r = run("cat /etc/hostname", task_id="pair-{case}")
print("host", r["output"].strip(), flush=True)
sys.stdin.readline()
r = run("echo still-here", task_id="pair-{case}")
print("after", r["exit_code"], r["output"].strip(), flush=True)
"""
    env = {"TERMINAL_ENV": "corral", "TERMINAL_DOCKER_PERSIST_ACROSS_PROCESSES": "false"}

    def start() -> subprocess.Popen:
        child_env = dict(os.environ)
        for name in ("TERMINAL_ENV", "TERMINAL_DOCKER_IMAGE", "CORRAL_OPEN_INSTRUCT"):
            child_env.pop(name, None)
        child_env.update(
            {
                "HERMES_HOME": str(tmp_path),
                "CORRAL_URL": hermes_server.url,
                "CORRAL_TOKEN": hermes_server.client_token or "",
                "TERMINAL_CONTAINER_MEMORY": "256",
                **env,
            }
        )
        return subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(body)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env,
        )

    first, second = start(), start()
    try:
        assert first.stdout is not None and second.stdout is not None
        hosts = [first.stdout.readline().strip(), second.stdout.readline().strip()]
        assert all(h.startswith("host ") for h in hosts), hosts
        assert hosts[0] != hosts[1], "two processes share one sandbox"
        out, err = first.communicate("\n", timeout=120)
        assert first.returncode == 0, err[-3000:]
        out, err = second.communicate("\n", timeout=120)
        assert second.returncode == 0, err[-3000:]
        assert "after 0 still-here" in out, (out, err[-3000:])
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    deadline = time.monotonic() + 30
    while docker_ids("corral.sandbox", f"hermes-task-id=pair-{case}"):
        assert time.monotonic() < deadline, "a process's sandbox outlived it"
        time.sleep(0.2)


def _alive(containers: List[str]) -> List[str]:
    """Those of `containers` (full ids) the daemon still has."""
    out = []
    for c in containers:
        found = subprocess.run(
            ["docker", "ps", "-aq", "--no-trunc", "--filter", f"id={c}"], capture_output=True, text=True, timeout=60
        ).stdout.split()
        if found:
            out.append(c)
    return out


@pytest.mark.parametrize("persist", ["false", "true"])
def test_two_processes_of_the_default_task_share_only_when_persisting(hermes_server, tmp_path, persist):
    """Two hermes processes on one profile, the task without an image
    override (hermes' shared "default" environment), running at once:
    with TERMINAL_DOCKER_PERSIST_ACROSS_PROCESSES=false each has a sandbox
    of its own, gone when its process exits; with true they share one (the
    session key), which outlives them for the next process."""
    body = TOOL + """\
import sys
import tools.terminal_tool as tt
r = run("cat /etc/hostname", task_id="pair")
env = tt.get_active_env("pair")
print("container", env.sandbox.refresh().container_id, env.sandbox.id, flush=True)
sys.stdin.readline()
r = run("echo still-here", task_id="pair")
print("after", r["exit_code"], r["output"].strip(), flush=True)
"""
    child_env = dict(os.environ)
    for name in ("TERMINAL_ENV", "TERMINAL_DOCKER_IMAGE", "CORRAL_OPEN_INSTRUCT"):
        child_env.pop(name, None)
    child_env.update(
        {
            "HERMES_HOME": str(tmp_path),
            "CORRAL_URL": hermes_server.url,
            "CORRAL_TOKEN": hermes_server.client_token or "",
            "TERMINAL_CONTAINER_MEMORY": "256",
            "TERMINAL_ENV": "corral",
            "TERMINAL_CONTAINER_PERSISTENT": "false",
            "TERMINAL_DOCKER_PERSIST_ACROSS_PROCESSES": persist,
        }
    )

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(body)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env,
        )

    procs = [start(), start()]
    seen = []
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if not line.startswith("container "):
                proc.kill()
                pytest.fail(f"{line!r}: {proc.communicate(timeout=30)[1][-3000:]}")
            seen.append(line.split()[1:])
        containers = [c for c, _ in seen]
        if persist == "false":
            assert containers[0] != containers[1], "two processes share one sandbox"
        else:
            assert containers[0] == containers[1], "persisting processes of one task got two sandboxes"
        for proc in procs:
            out, err = proc.communicate("\n", timeout=120)
            assert proc.returncode == 0, err[-3000:]
            assert "after 0 still-here" in out, (out, err[-3000:])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    if persist == "true":
        try:
            assert _alive(containers[:1]) == containers[:1], "the shared sandbox did not outlive its processes"
        finally:
            with corral.Client(hermes_server.url) as client:
                client.delete_sandbox(seen[0][1])
    else:
        deadline = time.monotonic() + 30
        while _alive(containers):
            assert time.monotonic() < deadline, f"a process's sandbox outlived it: {_alive(containers)}"
            time.sleep(0.2)
