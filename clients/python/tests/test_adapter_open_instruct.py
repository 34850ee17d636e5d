"""open-instruct's ``SandboxBackend`` contract, case by case, against
``CorralBackend``. open-instruct is not on PyPI, so each test names the
behaviour of ``DockerBackend`` / ``GenericSandboxEnv``
(``open_instruct/environments/backends.py``, ``generic_sandbox.py``) it
mirrors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from corral.adapters import _output, open_instruct
from corral.adapters.open_instruct import CorralBackend

pytestmark = pytest.mark.server


@pytest.fixture
def backend(corral_url):
    b = CorralBackend(timeout=60, base_url=corral_url)
    b.start()
    try:
        yield b
    finally:
        b.close()


# -- files: the editor tool's paths ------------------------------------------


def test_relative_read_resolves_against_root(backend):
    """DockerBackend.read_file -> container.get_archive("etc/hostname"): the
    archive API resolves a relative path against /, so the file comes back."""
    assert backend.read_file("etc/hostname") == backend.read_file("/etc/hostname")
    assert backend.read_file("etc/passwd").startswith("root:")


def test_relative_write_resolves_against_root(backend):
    """DockerBackend.write_file("relative.txt") -> put_archive(dirname or "/"):
    the file lands at /relative.txt. GenericSandboxEnv's editor passes
    model-written paths, and does not catch an error here."""
    backend.write_file("relative.txt", "rel\n")
    assert backend.run_command("cat /relative.txt").stdout == "rel\n"
    backend.write_file("tmp/sub/rel2.txt", b"two")
    assert backend.read_file("/tmp/sub/rel2.txt") == "two"
    assert backend.read_file("tmp/sub/rel2.txt", binary=True) == b"two"


def test_editor_create_flow(backend):
    """GenericSandboxEnv._editor_create: `test -d`, `test -e`, `mkdir -p
    parent`, then write_file(path); str_replace: read_file then write_file."""
    path = "testbed/pkg/mod.py"
    assert backend.run_command(f"test -d {path}").exit_code != 0
    parent = "/".join(path.rsplit("/", 1)[:-1]) or "/"
    backend.run_command(f"mkdir -p /{parent}")
    backend.write_file(path, "x = 1\n")
    content = backend.read_file(path)
    backend.write_file(path, content.replace("x = 1", "x = 2", 1))
    assert backend.run_command("cat /testbed/pkg/mod.py").stdout == "x = 2\n"


def test_parents_are_created(backend):
    """DockerBackend.put_archive raises NotFound for a missing parent; the
    adapter creates it (a deliberate difference: it never fails where Docker
    succeeds, and the editor runs `mkdir -p` first anyway)."""
    backend.write_file("/no/such/parent/f.txt", "made")
    assert backend.read_file("/no/such/parent/f.txt") == "made"


def test_missing_file_is_file_not_found(backend):
    """DockerBackend.read_file: docker NotFound -> FileNotFoundError naming the path."""
    with pytest.raises(FileNotFoundError, match="nothing-here.txt"):
        backend.read_file("/nothing-here.txt")
    with pytest.raises(FileNotFoundError):
        backend.read_file("nothing-here.txt")


def test_directory_is_is_a_directory_error(backend):
    """DockerBackend.read_file: a tar member with no file -> IsADirectoryError."""
    with pytest.raises(IsADirectoryError):
        backend.read_file("/etc")
    with pytest.raises(IsADirectoryError):
        backend.read_file("etc")


# -- commands ----------------------------------------------------------------


def test_stdout_keeps_its_first_million_bytes(backend):
    """DockerBackend.run_command: stdout_raw[:_MAX_OUTPUT_BYTES] with
    _MAX_OUTPUT_BYTES = 1_000_000: the head, no marker, the rest dropped."""
    r = backend.run_command("printf START; head -c 3000000 /dev/zero | tr '\\0' a; printf END")
    assert r.exit_code == 0
    assert len(r.stdout) == 1_000_000
    assert r.stdout.startswith("START" + "a" * 100)
    assert set(r.stdout[5:]) == {"a"}
    assert "END" not in r.stdout


def test_stderr_keeps_its_first_million_bytes(backend):
    """The same cap on stderr_raw, independently of stdout."""
    r = backend.run_command("echo out; { printf E; head -c 1500000 /dev/zero | tr '\\0' b; } >&2")
    assert r.stdout == "out\n"
    assert len(r.stderr) == 1_000_000 and r.stderr.startswith("Eb")


def test_output_under_the_cap_is_whole(backend):
    r = backend.run_command("head -c 999999 /dev/zero | tr '\\0' c")
    assert len(r.stdout) == 999_999


def test_timeout_gives_124_and_its_message(corral_url):
    """DockerBackend wraps the command in `timeout ... {self._timeout} bash -c`
    and, on exit code 124, prepends "Command timed out after {timeout}s.\\n"
    to stderr; the output so far is kept."""
    with CorralBackend(timeout=1, base_url=corral_url) as b:
        r = b.run_command("echo before; echo err >&2; sleep 30")
        assert r.exit_code == 124
        assert r.stderr == "Command timed out after 1s.\nerr\n"
        assert r.stdout == "before\n"


def test_exit_124_gets_the_timeout_message_too(backend):
    """DockerBackend knows a timeout by the exit code alone: a command that
    exits 124 by itself gets the same message."""
    r = backend.run_command("exit 124")
    assert r.exit_code == 124
    assert r.stderr == "Command timed out after 60s.\n"


def test_commands_run_with_bash(backend):
    """DockerBackend.run_command: `bash -c <command>`."""
    assert backend.run_command("echo ${BASH_VERSION:+bash}").stdout == "bash\n"


def test_generic_sandbox_bash_wrapper(backend):
    """GenericSandboxEnv._execute_bash runs `bash /tmp/.sandbox_bash_wrapper.sh
    <cmd>`, which keeps cwd and exports across calls in /tmp files."""
    wrapper = textwrap.dedent(
        """\
        #!/bin/bash
        set -a; source /tmp/.sandbox_env 2>/dev/null; set +a
        cd "$(cat /tmp/.sandbox_cwd 2>/dev/null || echo /testbed)" 2>/dev/null
        eval "$1"
        _exit_code=$?
        export -p > /tmp/.sandbox_env
        pwd > /tmp/.sandbox_cwd
        exit $_exit_code
        """
    )
    backend.run_command("mkdir -p /testbed/input /testbed/output")
    backend.write_file("/tmp/.sandbox_bash_wrapper.sh", wrapper)
    backend.run_command("chmod +x /tmp/.sandbox_bash_wrapper.sh")
    backend.run_command("echo /testbed > /tmp/.sandbox_cwd")
    assert backend.run_command("bash /tmp/.sandbox_bash_wrapper.sh 'cd input && export X=1'").exit_code == 0
    r = backend.run_command("bash /tmp/.sandbox_bash_wrapper.sh 'echo $PWD $X'")
    assert r.stdout == "/testbed/input 1\n"


@pytest.mark.skipif(
    not _output.supports_wait_for_output(),
    reason="this client's Sandbox.run lacks wait_for_output (issue 12 item 7 lands it)",
)
def test_background_job_output_is_waited_for_like_exec_run(backend):
    """container.exec_run returns when the exec's output streams close: a
    background job holding them is waited for, its output kept."""
    r = backend.run_command("echo fg; (sleep 2; echo bg) &")
    assert r.stdout == "fg\nbg\n"


# -- the switch ----------------------------------------------------------------


def _fake_open_instruct(root):
    """A package with open-instruct's module layout and import statements
    (the real one needs docker, ray, openenv and torch): backends.py defines
    create_backend, the package re-exports it, generic_sandbox.py does
    `from .backends import SandboxBackend, create_backend` and calls it in
    _do_reset exactly as GenericSandboxEnv does."""
    pkg = root / "open_instruct" / "environments"
    pkg.mkdir(parents=True)
    (root / "open_instruct" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .backends import DockerBackend, SandboxBackend, create_backend\n")
    (pkg / "backends.py").write_text(
        textwrap.dedent(
            """\
            from abc import ABC

            class SandboxBackend(ABC):
                pass

            class DockerBackend(SandboxBackend):
                def __init__(self, image="python:3.12-slim", timeout=1800, mem_limit="4g"):
                    raise RuntimeError("the Docker backend was used")

            def create_backend(backend_type, **kwargs):
                if backend_type == "docker":
                    return DockerBackend(**kwargs)
                raise ValueError(f"Unknown backend type: {backend_type}")
            """
        )
    )
    (pkg / "generic_sandbox.py").write_text(
        textwrap.dedent(
            """\
            from .backends import SandboxBackend, create_backend

            class GenericSandboxEnv:
                def __init__(self, backend="docker", timeout=300, **backend_kwargs):
                    self._backend_type = backend
                    self._timeout = timeout
                    self._backend_kwargs = backend_kwargs
                    self._backend = None

                def _do_reset(self):
                    bkwargs = dict(self._backend_kwargs)
                    bkwargs.setdefault("timeout", self._timeout)
                    self._backend = create_backend(self._backend_type, **bkwargs)
                    self._backend.start()
                    assert isinstance(self._backend, SandboxBackend)
                    return self._backend.run_command("echo ready").stdout
            """
        )
    )


def _run_child(tmp_path, code, env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_install_switches_generic_sandbox_env(tmp_path, corral_url, corral_spec):
    """install() replaces the create_backend that GenericSandboxEnv imported
    by name; the documented `CorralBackend as DockerBackend` import alone
    would not."""
    _fake_open_instruct(tmp_path)
    labels = corral_spec()["labels"]
    code = textwrap.dedent(
        f"""\
        import corral.adapters.open_instruct as oi
        oi.install(spec={{"labels": {labels!r}}})
        from open_instruct.environments.generic_sandbox import GenericSandboxEnv
        import open_instruct.environments as envs
        env = GenericSandboxEnv(backend="docker", image="corral-test/busybox", mem_limit="256m")
        print(env._do_reset().strip())
        print(type(env._backend).__name__, envs.create_backend is oi.create_backend)
        env._backend.close()
        """
    )
    p = _run_child(tmp_path, code, {"CORRAL_URL": corral_url})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["ready", "CorralBackend True"]


def test_install_reaches_ray_workers_through_the_runtime_env_hook(tmp_path, corral_url, monkeypatch):
    """Under Ray the factory runs in every EnvironmentPool actor: install()
    sets RAY_RUNTIME_ENV_HOOK so ray.init's runtime env gets
    worker_process_setup_hook=corral.adapters.open_instruct.install and the
    defaults; a worker process calling that hook is switched."""
    _fake_open_instruct(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RAY_RUNTIME_ENV_HOOK", "os.path.join")  # an earlier hook, to be chained
    monkeypatch.delenv("CORRAL_OPEN_INSTRUCT_DEFAULTS", raising=False)
    monkeypatch.delenv("CORRAL_OPEN_INSTRUCT", raising=False)  # install() sets it
    try:
        open_instruct.install(base_url=corral_url, shell="bash")
        assert os.environ["RAY_RUNTIME_ENV_HOOK"] == "corral.adapters.open_instruct.ray_runtime_env_hook"
        monkeypatch.setenv("CORRAL_PREVIOUS_RAY_RUNTIME_ENV_HOOK", f"{__name__}._earlier_hook")
        runtime_env = open_instruct.ray_runtime_env_hook({"env_vars": {"A": "1"}, "excludes": [".git/"]})
        assert runtime_env["worker_process_setup_hook"] == "corral.adapters.open_instruct.install"
        assert runtime_env["excludes"] == [".git/"] and runtime_env["earlier"] is True
        defaults = runtime_env["env_vars"]["CORRAL_OPEN_INSTRUCT_DEFAULTS"]
        assert runtime_env["env_vars"]["A"] == "1"
        chained = open_instruct.ray_runtime_env_hook({"worker_process_setup_hook": "some.setup"})
        assert chained["worker_process_setup_hook"].args == ("some.setup",)
    finally:
        for name in [m for m in sys.modules if m == "open_instruct" or m.startswith("open_instruct.")]:
            del sys.modules[name]
        open_instruct._defaults = {}
    # A worker: a fresh process with the runtime env's variables, in which Ray
    # calls the setup hook by name before the actor is made.
    code = textwrap.dedent(
        """\
        import importlib
        module, _, attr = "corral.adapters.open_instruct.install".rpartition(".")
        getattr(importlib.import_module(module), attr)()
        from open_instruct.environments.generic_sandbox import GenericSandboxEnv
        env = GenericSandboxEnv(backend="docker", image="corral-test/busybox")
        print(env._do_reset().strip(), env._backend._base_url)
        env._backend.close()
        """
    )
    p = _run_child(tmp_path, code, {"CORRAL_OPEN_INSTRUCT_DEFAULTS": defaults, "CORRAL_URL": "http://127.0.0.1:9"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"ready {corral_url}"


def _earlier_hook(runtime_env):
    env = dict(runtime_env or {})
    env["earlier"] = True
    return env


def test_create_backend_factory_names():
    """open-instruct's create_backend("docker", ...) signature; unknown names
    raise ValueError as the original does."""
    assert isinstance(open_instruct.create_backend("docker", image="x"), CorralBackend)
    assert isinstance(open_instruct.create_backend("corral"), CorralBackend)
    with pytest.raises(ValueError, match="Unknown backend type"):
        open_instruct.create_backend("modal")

