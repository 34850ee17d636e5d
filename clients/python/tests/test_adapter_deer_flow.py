"""deer-flow's sandbox contract, case by case, against
``corral.adapters.deer_flow``. deer-flow is not on PyPI, so these run
without it (the adapter's standalone mode); each test names the behaviour
of deer-flow's ``SandboxProvider``/``Sandbox`` (``deerflow/sandbox/``,
``deerflow/community/aio_sandbox/``) it mirrors.
``test_adapter_deer_flow_real.py`` drives deer-flow's own tools through the
adapter when a deer-flow checkout is at hand."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import httpx
import pytest

import corral
from corral.adapters import _deer_flow_search, deer_flow
from corral.adapters.deer_flow import CorralSandboxProvider, session_key
from corral.testing import LocalServer, docker_ids

from conftest import assert_no_leaks, corral_binary, server_config

pytestmark = pytest.mark.server

WS = "/mnt/user-data/workspace"


class RecordingTransport(httpx.BaseTransport):
    """The real HTTP transport, counting the requests it sends."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.requests: list = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def provider(corral_url):
    p = CorralSandboxProvider({"corral_url": corral_url})
    try:
        yield p
    finally:
        p.shutdown()


@pytest.fixture
def sandbox(provider):
    return provider.get(provider.acquire("thread-1", user_id="alice"))


def _container(provider, sandbox_id):
    return provider.client.sandbox_info(sandbox_id).container_id


# -- the provider ----------------------------------------------------------------


def test_same_thread_same_sandbox_across_providers(provider, corral_url):
    """AioSandboxProvider.acquire: "for the same thread_id, this method will
    return the same sandbox_id across multiple turns, multiple processes";
    the id is deterministic from user and thread (_deterministic_sandbox_id),
    so another user's thread of the same name gets another sandbox."""
    a = provider.acquire("t", user_id="alice")
    assert a == provider.acquire("t", user_id="alice") == session_key("t", "alice")
    provider.get(a).write_file(f"{WS}/mark", "alice's")
    other = CorralSandboxProvider({"corral_url": corral_url})
    try:
        assert other.acquire("t", user_id="alice") == a
        assert other.get(a).read_file(f"{WS}/mark") == "alice's"
        assert other.acquire("t", user_id="bob") != a
    finally:
        other.shutdown()


def test_anonymous_acquire_gets_a_sandbox_of_its_own(provider):
    """AioSandboxProvider: "Deterministic ID for thread-specific, random for
    anonymous"."""
    a, b = provider.acquire(None, user_id="u"), provider.acquire(None, user_id="u")
    assert a != b and provider.get(a) is not None and provider.get(b) is not None


def test_get_does_no_io(corral_url):
    """AioSandboxProvider.get "stays a pure in-memory lookup: async tool paths
    call this directly on the event loop" (tests/blocking_io/test_aio_sandbox_get.py)."""
    transport = RecordingTransport()
    client = corral.Client(corral_url, transport=transport)
    p = CorralSandboxProvider({}, client=client)
    try:
        sid = p.acquire("t-io", user_id="u")
        before = list(transport.requests)
        assert p.get(sid) is not None
        assert p.get("deerflow-unknown") is None
        assert transport.requests == before
    finally:
        p.shutdown()
        client.close()


def test_release_keeps_the_sandbox_for_the_threads_next_turn(provider):
    """AioSandboxProvider.release parks the sandbox in the warm pool (the
    container keeps running; get() no longer returns it) and the thread's
    next acquire reclaims it with its files."""
    sid = provider.acquire("turns", user_id="u")
    container = _container(provider, sid)
    provider.get(sid).write_file(f"{WS}/notes.txt", "turn 1")
    provider.release(sid)
    assert provider.get(sid) is None
    assert provider.acquire("turns", user_id="u") == sid
    assert provider.get(sid).read_file(f"{WS}/notes.txt") == "turn 1"
    assert _container(provider, sid) == container


def test_thread_directories_exist_and_are_writable(sandbox):
    """ensure_thread_directories_exist: "for other sandboxes (like aio),
    directories are already mounted in the container"; the bash tool runs
    `cd /mnt/user-data/workspace; <command>`."""
    out = sandbox.execute_command(
        "cd /mnt/user-data/workspace; pwd; for d in workspace uploads outputs; do stat -c '%a' /mnt/user-data/$d; done"
    )
    assert out == f"{WS}\n777\n777\n777\n"


def test_upload_attributes(provider):
    """SandboxProvider.uses_thread_data_mounts (False: uploads are synced
    with update_file, uploads.py's sync_to_sandbox) and
    needs_upload_permission_adjustment (True), as for remote sandboxes."""
    assert provider.uses_thread_data_mounts is False
    assert provider.needs_upload_permission_adjustment is True


def test_shutdown_removes_active_and_released_sandboxes(corral_url, corral_spec):
    """AioSandboxProvider.shutdown destroys active and warm-pool sandboxes;
    it is idempotent."""
    labels = {**corral_spec()["labels"], "corraltest.case": "df-shutdown"}
    p = CorralSandboxProvider({"corral_url": corral_url, "spec": {"labels": labels}})
    a = p.acquire("s1", user_id="u")
    p.acquire("s2", user_id="u")
    p.release(a)
    assert len(docker_ids("corraltest.case=df-shutdown")) == 2
    p.shutdown()
    p.shutdown()
    assert docker_ids("corraltest.case=df-shutdown") == []
    with pytest.raises(RuntimeError, match="shut down"):
        p.acquire("s3", user_id="u")


def test_reset_releases_like_shutdown(corral_url):
    """reset_sandbox_provider: "a provider override can release active
    sandboxes during reset"; the detached instance is not reused."""
    p = CorralSandboxProvider({"corral_url": corral_url})
    sid = p.acquire("r", user_id="u")
    p.reset()
    assert p.get(sid) is None
    with corral.Client(corral_url) as client, pytest.raises(corral.SandboxNotFoundError):
        client.sandbox_info(sid)


def test_sandboxes_go_when_the_gateway_exits(corral_url, corral_spec):
    """AioSandboxProvider registers atexit and signal handlers that shut it
    down; here the adapter's reaper removes what a process leaves."""
    labels = {**corral_spec()["labels"], "corraltest.case": "df-exit"}
    code = textwrap.dedent(
        f"""\
        from corral.adapters.deer_flow import CorralSandboxProvider
        p = CorralSandboxProvider({{"corral_url": {corral_url!r}, "spec": {{"labels": {labels!r}}}}})
        p.acquire("exit", user_id="u")
        print("acquired", flush=True)
        """
    )
    env = dict(os.environ, CORRAL_TOKEN=corral.find_token(corral_url) or "")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0 and "acquired" in p.stdout, p.stderr
    assert docker_ids("corraltest.case=df-exit") == []


# -- settings --------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings, field",
    [
        ({"imagee": "x"}, "sandbox.imagee"),
        ({"mounts": [{"host_path": "/srv", "container_path": "/srv"}]}, "sandbox.mounts"),
        ({"auto_restart": "yes"}, "sandbox.auto_restart"),
        ({"bash_command_timeout": 0}, "sandbox.bash_command_timeout"),
        ({"environment": ["A=1"]}, "sandbox.environment"),
        ({"spec": "big"}, "sandbox.spec"),
        ({"image": 3}, "sandbox.image"),
        ({"max_output": -1}, "sandbox.max_output"),
    ],
)
def test_bad_settings_name_the_key(settings, field):
    """deer-flow passes the sandbox block's extra keys through (SandboxConfig
    extra="allow"); a bad one is a ValueError naming the key and value."""
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        CorralSandboxProvider(settings)


def test_service_settings_are_named_not_applied(corral_url, caplog):
    """AIO's replicas and idle_timeout: here corral's provider.max_live and
    provider.idle_timeout_ms govern them, and the gateway says so."""
    with caplog.at_level(logging.WARNING, logger="corral.adapters"):
        p = CorralSandboxProvider({"corral_url": corral_url, "replicas": 3, "idle_timeout": 600, "port": 8080})
    p.shutdown()
    text = caplog.text
    assert "sandbox.replicas=3" in text and "provider.max_live" in text
    assert "sandbox.idle_timeout=600" in text and "provider.idle_timeout_ms" in text


def test_environment_resolves_gateway_variables(corral_url, monkeypatch):
    """AioSandboxProvider._resolve_env_vars: a value starting with $ is the
    gateway's variable of that name."""
    monkeypatch.setenv("DF_TEST_SECRET", "s3cret")
    p = CorralSandboxProvider({"corral_url": corral_url, "environment": {"KEY": "$DF_TEST_SECRET", "PLAIN": "v"}})
    try:
        sb = p.get(p.acquire("env", user_id="u"))
        assert sb.execute_command("echo $KEY $PLAIN") == "s3cret v\n"
    finally:
        p.shutdown()


# -- execute_command ---------------------------------------------------------------


def test_output_formats(sandbox):
    """LocalSandbox.execute_command: stdout, then "Std Error:" and stderr,
    then "Exit Code: N" when non-zero; "(no output)" when silent."""
    assert sandbox.execute_command("echo out") == "out\n"
    assert sandbox.execute_command("echo out; echo err >&2") == "out\n\nStd Error:\nerr\n"
    assert sandbox.execute_command("echo err >&2") == "err\n"
    assert sandbox.execute_command("echo out; exit 3") == "out\n\nExit Code: 3"
    assert sandbox.execute_command("true") == "(no output)"
    assert sandbox.execute_command("exit 2") == "\nExit Code: 2"


def test_env_is_per_command_and_names_are_checked(sandbox):
    """Sandbox.execute_command(env=...): per-call variables, never persisted;
    _validate_extra_env raises ValueError for a name that is not POSIX."""
    assert sandbox.execute_command("echo $TOKEN", env={"TOKEN": "abc"}) == "abc\n"
    assert sandbox.execute_command('echo "[$TOKEN]"') == "[]\n"
    with pytest.raises(ValueError, match="not a valid POSIX environment variable name"):
        sandbox.execute_command("true", env={"BAD;rm": "x"})


def test_timeout_notice(sandbox):
    """LocalSandbox: on timeout the whole process group is killed and the
    notice tells the model to background long-lived processes."""
    out = sandbox.execute_command("echo started; sleep 30 & sleep 30", timeout=1)
    assert out.startswith("started\n\nCommand timed out after 1 second and was terminated.")
    assert "2>&1 &" in out
    assert sandbox.execute_command("ps -o comm | grep -c '^sleep$'") == "0\n\nExit Code: 1"


def test_background_server_does_not_hold_the_turn(sandbox):
    """LocalSandbox: "a backgrounded long-lived process (server &) returns
    immediately instead of blocking the turn on an inherited pipe"."""
    out = sandbox.execute_command("sleep 60 & echo started", timeout=30)
    assert out == "started\n"


def test_service_failure_is_an_error_string(corral_url):
    """AioSandbox.execute_command returns "Error: <e>" when the sandbox API
    fails, never raises."""
    p = CorralSandboxProvider({"corral_url": corral_url, "auto_restart": False})
    try:
        sid = p.acquire("gone", user_id="u")
        sb = p.get(sid)
        p.client.delete_sandbox(sid)
        assert sb.execute_command("echo hi").startswith("Error: ")
    finally:
        p.shutdown()


# -- auto-restart (seed 001) -------------------------------------------------------


def test_killed_container_is_replaced_between_tool_calls(provider, sandbox):
    """AioSandboxProvider auto_restart (#2788): a sandbox container crashed or
    removed between two tool calls is replaced transparently; the next call
    gets a working sandbox, with the thread directories."""
    before = _container(provider, sandbox.id)
    subprocess.run(["docker", "rm", "-f", before], check=True, capture_output=True)
    assert sandbox.execute_command("ls -d /mnt/user-data/workspace; echo ok") == f"{WS}\nok\n"
    assert _container(provider, sandbox.id) != before
    # acquire after the crash keeps the same id (the thread's sandbox).
    assert provider.acquire("thread-1", user_id="alice") == sandbox.id


def test_removed_session_is_started_again(provider, sandbox, caplog):
    """The idle/eviction path: AIO's get() returns None for an evicted sandbox
    and the tool acquires again; here the next call does it, with a warning."""
    sandbox.write_file(f"{WS}/f", "old")
    provider.client.delete_sandbox(sandbox.id)
    with caplog.at_level(logging.WARNING, logger="corral.adapters"):
        assert sandbox.execute_command("echo again") == "again\n"
    assert "removed by the service" in caplog.text
    with pytest.raises(FileNotFoundError):
        sandbox.read_file(f"{WS}/f")


def test_auto_restart_off_reports_the_loss(corral_url):
    """auto_restart: false preserves the old behaviour: the dead sandbox is
    kept and its calls fail (here: recovery fail, an Error string)."""
    p = CorralSandboxProvider({"corral_url": corral_url, "auto_restart": False})
    try:
        sid = p.acquire("dead", user_id="u")
        sb = p.get(sid)
        subprocess.run(["docker", "rm", "-f", _container(p, sid)], check=True, capture_output=True)
        out = sb.execute_command("echo hi")
        assert out.startswith("Error: ") and "container_lost" in out
    finally:
        p.shutdown()


# -- files ------------------------------------------------------------------------


def test_read_file_and_line_ranges(sandbox):
    """Sandbox.read_file(path, start_line, end_line): 1-indexed, inclusive
    (LocalSandbox joins the selected lines without their newlines)."""
    sandbox.write_file(f"{WS}/lines.txt", "one\ntwo\r\nthree\nfour\n")
    assert sandbox.read_file(f"{WS}/lines.txt") == "one\ntwo\r\nthree\nfour\n"
    assert sandbox.read_file(f"{WS}/lines.txt", start_line=2, end_line=3) == "two\nthree"
    assert sandbox.read_file(f"{WS}/lines.txt", start_line=4) == "four"
    assert sandbox.read_file(f"{WS}/lines.txt", end_line=1) == "one"
    assert sandbox.read_file(f"{WS}/lines.txt", start_line=9) == ""


def test_read_errors_are_local_sandboxes(sandbox):
    """LocalSandbox.read_file re-raises OSError subclasses with the path as
    given; read_file_tool maps FileNotFoundError, IsADirectoryError and
    UnicodeDecodeError (binary files) to its messages."""
    with pytest.raises(FileNotFoundError) as e:
        sandbox.read_file(f"{WS}/missing.txt")
    assert e.value.filename == f"{WS}/missing.txt"
    with pytest.raises(IsADirectoryError):
        sandbox.read_file(WS)
    sandbox.update_file(f"{WS}/blob.bin", b"\x89PNG\x00\xff")
    with pytest.raises(UnicodeDecodeError):
        sandbox.read_file(f"{WS}/blob.bin")


def test_write_file_creates_overwrites_and_appends(sandbox):
    """Sandbox.write_file: creates parents (LocalSandbox os.makedirs),
    overwrites by default, appends with append=True (AIO reads then writes)."""
    path = f"{WS}/deep/er/notes.md"
    sandbox.write_file(path, "a\n")
    sandbox.write_file(path, "b\n", append=True)
    assert sandbox.read_file(path) == "a\nb\n"
    sandbox.write_file(path, "c\n")
    assert sandbox.read_file(path) == "c\n"
    sandbox.write_file(f"{WS}/new-by-append.txt", "x", append=True)
    assert sandbox.read_file(f"{WS}/new-by-append.txt") == "x"
    with pytest.raises(IsADirectoryError):
        sandbox.write_file(WS, "x")


def test_update_file_is_binary_and_writable_by_any_user(sandbox):
    """Sandbox.update_file(path, bytes) for uploads and artifacts; the
    upload router makes synced files world-writable
    (_make_file_sandbox_writable)."""
    data = bytes(range(256)) * 4
    sandbox.update_file("/mnt/user-data/uploads/data.bin", data)
    assert sandbox.download_file("/mnt/user-data/uploads/data.bin") == data
    assert sandbox.execute_command("stat -c %a /mnt/user-data/uploads/data.bin") == "666\n"


def test_download_file_is_confined_to_user_data(sandbox):
    """Sandbox.download_file: PermissionError for '..' and for paths outside
    /mnt/user-data; OSError when the file cannot be read."""
    with pytest.raises(PermissionError, match="traversal"):
        sandbox.download_file("/mnt/user-data/../etc/passwd")
    with pytest.raises(PermissionError, match="must be under '/mnt/user-data'"):
        sandbox.download_file("/etc/passwd")
    with pytest.raises(OSError):
        sandbox.download_file("/mnt/user-data/outputs/none.txt")


# -- listings and searches -----------------------------------------------------------


@pytest.fixture
def tree(sandbox):
    sandbox.execute_command(
        "cd /mnt/user-data/workspace && mkdir -p src/pkg node_modules/lib docs && "
        "printf 'x = 42\\nname = \"Alpha\"\\n' > src/app.py && printf 'alpha beta\\nALPHA\\n' > src/pkg/util.py && "
        "echo 'x = 1' > node_modules/lib/skip.py && echo '# Alpha docs' > docs/readme.md && "
        "head -c 1000001 /dev/zero | tr '\\0' a > src/huge.py && printf 'alpha\\0bin' > src/blob.py"
    )
    return sandbox


def test_list_dir(tree):
    """LocalSandbox.list_dir: absolute paths to max_depth, directories with
    a trailing "/", sorted, IGNORE_PATTERNS names left out; [] for a path
    that is not a directory."""
    assert tree.list_dir(WS, max_depth=1) == [f"{WS}/docs/", f"{WS}/src/"]
    two = tree.list_dir(WS)
    assert f"{WS}/src/app.py" in two and f"{WS}/src/pkg/" in two
    assert f"{WS}/src/pkg/util.py" not in two
    assert not any("node_modules" in e for e in two)
    assert two == sorted(two)
    assert tree.list_dir(f"{WS}/nope") == []


def test_glob(tree):
    """Sandbox.glob: matches relative to the root (path_matches: "**/" also
    at the root), ignored trees skipped, (matches, truncated) capped at
    max_results; FileNotFoundError / NotADirectoryError for a bad root."""
    matches, truncated = tree.glob(WS, "**/*.py")
    assert sorted(matches) == [f"{WS}/src/app.py", f"{WS}/src/blob.py", f"{WS}/src/huge.py", f"{WS}/src/pkg/util.py"]
    assert truncated is False
    assert tree.glob(WS, "src/*.py", max_results=1)[1] is True
    assert f"{WS}/src/pkg" in tree.glob(WS, "**/pkg", include_dirs=True)[0]
    assert tree.glob(WS, "**/pkg")[0] == []
    with pytest.raises(FileNotFoundError):
        tree.glob(f"{WS}/nope", "*")
    with pytest.raises(NotADirectoryError):
        tree.glob(f"{WS}/src/app.py", "*")


def test_grep_regex_and_literal(tree):
    """Sandbox.grep: Python regex (case-insensitive by default), literal=True
    for plain strings, files over 1 MB and binary files skipped, ignored
    trees skipped, line numbers from 1."""
    matches, truncated = tree.grep(WS, r"x\s*=\s*\d+")
    assert [(m.path, m.line_number, m.line) for m in matches] == [(f"{WS}/src/app.py", 1, "x = 42")]
    assert truncated is False
    found = {(m.path, m.line_number) for m in tree.grep(WS, "alpha")[0]}
    assert found == {(f"{WS}/src/app.py", 2), (f"{WS}/src/pkg/util.py", 1), (f"{WS}/src/pkg/util.py", 2), (f"{WS}/docs/readme.md", 1)}
    sensitive = {(m.path, m.line_number) for m in tree.grep(WS, "ALPHA", case_sensitive=True)[0]}
    assert sensitive == {(f"{WS}/src/pkg/util.py", 2)}
    assert tree.grep(WS, "x = 4", literal=True)[0][0].line == "x = 42"
    assert tree.grep(WS, "(x", literal=True)[0] == []


def test_grep_python_only_constructs(tree):
    """The pattern is deer-flow's Python regex (grep_tool validated it with
    re.compile): a lookbehind matches as Python says, and an invalid one
    raises re.error."""
    import re

    matches, _ = tree.grep(WS, r'(?<=name = ")Alpha')
    assert [(m.path, m.line_number) for m in matches] == [(f"{WS}/src/app.py", 2)]
    with pytest.raises(re.error):
        tree.grep(WS, "(unclosed")


def test_grep_glob_file_root_and_caps(tree):
    """Sandbox.grep: glob filters candidates relative to the root, a file
    may be the root, max_results caps with truncated=True, a bad root
    raises."""
    assert {m.path for m in tree.grep(WS, "alpha", glob="**/*.md")[0]} == {f"{WS}/docs/readme.md"}
    single = tree.grep(f"{WS}/src/pkg/util.py", "alpha")[0]
    assert [m.line_number for m in single] == [1, 2]
    matches, truncated = tree.grep(WS, "alpha", max_results=2)
    assert len(matches) == 2 and truncated is True
    with pytest.raises(FileNotFoundError):
        tree.grep(f"{WS}/nope", "x")


def test_grep_lines_are_cut(sandbox):
    """truncate_line: result lines longer than 200 characters end in "...";
    lines over 2000 characters are skipped (ReDoS guard)."""
    sandbox.write_file(f"{WS}/long.txt", "needle " + "b" * 300 + "\n" + "needle " + "c" * 3000 + "\n")
    matches, _ = sandbox.grep(f"{WS}/long.txt", "needle")
    assert [m.line_number for m in matches] == [1]
    assert len(matches[0].line) == 200 and matches[0].line.endswith("...")


# -- the grep prefilter (pure) ---------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, ere",
    [
        (r"x\s*=\s*\d+", "x[[:space:]]*=[[:space:]]*[0-9]+"),
        (r"\bword\b", "word"),
        (r"(?:a|b)+?c", "(a|b)+c"),
        (r"(?P<n>\w+)\.py$", r"([[:alnum:]_]+)\.py$"),
        (r"[\d_]{2,3}", "[0-9_]{2,3}"),
        (r"a{", r"a\{"),
        (r"{}", r"\{\}"),
    ],
)
def test_prefilter_translations(pattern, ere):
    assert _deer_flow_search.ere_prefilter(pattern) == ere


@pytest.mark.parametrize("pattern", [r"(?<=a)b", r"(a)\1", r"(?i)abc", r"\x41", r"[\W]"])
def test_prefilter_gives_up_on_python_only_constructs(pattern):
    assert _deer_flow_search.ere_prefilter(pattern) is None


def test_standalone_without_deer_flow():
    """Without deer-flow the adapter uses its own equivalents of deer-flow's
    helpers (the suite runs in both environments; deer-flow's own are checked
    by test_adapter_deer_flow_real.py)."""
    if deer_flow.DEERFLOW:
        pytest.skip("deer-flow is importable here: the adapter uses its helpers")
    assert deer_flow.DEERFLOW is False and _deer_flow_search.DEERFLOW_HELPERS is False
    assert _deer_flow_search.should_ignore_path("/w/node_modules/x.py")
    assert _deer_flow_search.should_ignore_path("/w/a.egg-info/PKG")
    assert not _deer_flow_search.should_ignore_path("/w/src/x.py")
    assert _deer_flow_search.path_matches("**/*.py", "top.py")


# -- replica pressure: corral's LRU ------------------------------------------------------


def _gone(container: str, wait: float = 30.0) -> bool:
    """Whether the container is removed (its removal may finish just after
    the answer that evicted it)."""
    import time

    deadline = time.monotonic() + wait
    while True:
        out = subprocess.run(
            ["docker", "ps", "-aq", "--no-trunc", "--filter", f"id={container}"], capture_output=True, text=True
        ).stdout.split()
        if not out or time.monotonic() > deadline:
            return not out
        time.sleep(0.25)


@pytest.fixture(scope="module")
def small_service():
    """A service of its own whose provider keeps at most two sandboxes
    (provider.max_live: AIO's replicas)."""
    server = LocalServer(corral_binary(), config=server_config(provider={"max_live": 2}))
    server.start()
    try:
        yield server
    finally:
        server.close()
        assert_no_leaks()


def test_replica_pressure_evicts_the_least_recently_used(small_service):
    """AioSandboxProvider replicas: "Max concurrent sandbox containers (LRU
    eviction when exceeded)": the third thread's sandbox takes the place of
    the least recently used one; that thread's next call gets a new one."""
    p = CorralSandboxProvider({"corral_url": small_service.url})
    try:
        a = p.get(p.acquire("a", user_id="u"))
        b = p.get(p.acquire("b", user_id="u"))
        b.write_file(f"{WS}/b.txt", "b")
        b_container = p.client.sandbox_info(b.id).container_id
        a.execute_command("true")  # b is now the least recently used
        c = p.get(p.acquire("c", user_id="u"))
        assert c.execute_command("echo c") == "c\n"
        live = {s.id for s in p.client.list_sandboxes()}
        assert live == {a.id, c.id}
        assert _gone(b_container)
        assert b.execute_command("echo back") == "back\n"
        with pytest.raises(FileNotFoundError):
            b.read_file(f"{WS}/b.txt")
    finally:
        p.shutdown()


# -- warm pool: a corral profile ---------------------------------------------------------


@pytest.fixture(scope="module")
def pooled_service():
    """A service with a warm pool "deerflow" of one started sandbox."""
    from conftest import IMAGE, LABELS

    pool_spec = {
        "image": IMAGE,
        "labels": {**LABELS, "corraltest.case": "df-pool"},
        "recovery": "recreate",
    }
    server = LocalServer(
        corral_binary(),
        config=server_config(provider={"max_live": 4, "pools": {"deerflow": {"spec": pool_spec, "warm": 1}}}),
    )
    server.start()
    try:
        yield server
    finally:
        server.close()
        assert_no_leaks()


def _pool_ready(server, wait: float = 60.0) -> bool:
    """Whether the service's pool "deerflow" holds a ready sandbox (its
    metric corral_pool_ready), once the service filled it."""
    import re
    import time

    token = corral.find_token(server.url)
    deadline = time.monotonic() + wait
    while True:
        text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {token}"}).text
        m = re.search(r'^corral_pool_ready\{pool="deerflow"\} (\d+)', text, re.M)
        if (m and int(m.group(1)) >= 1) or time.monotonic() > deadline:
            return bool(m and int(m.group(1)) >= 1)
        time.sleep(0.25)


def test_warm_pool_hands_a_started_sandbox_over(pooled_service):
    """AioSandboxProvider's warm pool ("container still running, no
    cold-start"): with `profile:` the thread gets one of the pool's sandboxes,
    started before it asked, with the thread directories."""
    assert _pool_ready(pooled_service)
    warm = docker_ids("corraltest.case=df-pool")
    assert len(warm) == 1
    p = CorralSandboxProvider({"corral_url": pooled_service.url, "profile": "deerflow"})
    try:
        sid = p.acquire("pooled", user_id="u")
        assert p.client.sandbox_info(sid).container_id.startswith(warm[0])
        assert p.get(sid).execute_command("cd /mnt/user-data/workspace; pwd") == f"{WS}\n"
    finally:
        p.shutdown()
