"""The open-instruct switch (``$CORRAL_OPEN_INSTRUCT``, read by the startup
hook ``corral_autoload.pth``) under the launchers training really uses:
plain ``python``, Ray actors with and without a ``runtime_env``, and
``uv run`` (whose Ray workers are started with uv's runtime-env hook, which
skips ``RAY_RUNTIME_ENV_HOOK``). Real Ray and real uv (pinned in
``scripts/python-env.sh``) run the drivers; their actors build a backend
through open-instruct's module layout (``_fake_open_instruct``: its
``DockerBackend`` raises, so a command that answers ran in corral). Where
corral was asked for but a backend is not corral's, a warning says why.

Each Ray driver starts one local cluster (``num_cpus=2``, two actors).
Ray or uv missing fails the tests: nothing is skipped."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

import corral
from corral.adapters import open_instruct
from corral.testing import docker_ids

from test_adapter_open_instruct import _fake_open_instruct

pytestmark = pytest.mark.server

BIN = Path(sys.executable).parent


def _uv() -> str:
    uv = shutil.which("uv", path=str(BIN)) or shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not installed: run scripts/python-env.sh (it pins uv)", pytrace=False)
    return uv


def _require_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError as err:
        pytest.fail(f"ray is not installed ({err}): run scripts/python-env.sh (it pins ray)", pytrace=False)


def _env(tmp_path: Path, corral_url: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_OPEN_INSTRUCT", "RAY_"))}
    env.update(
        {
            "CORRAL_URL": corral_url,
            "CORRAL_TOKEN": corral.find_token(corral_url) or "",
            "PYTHONPATH": str(tmp_path),
            "PATH": os.pathsep.join([str(BIN), env.get("PATH", "")]),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
    )
    env.update(extra)
    return env


def _left(case: str) -> list:
    left = docker_ids("corral.sandbox", f"corraltest.case={case}")
    if left:
        subprocess.run(["docker", "rm", "-f", *left], capture_output=True)
    return left


def _defaults(corral_spec, case: str) -> str:
    labels = {**corral_spec()["labels"], "corraltest.case": case}
    return json.dumps({"spec": {"labels": labels}})


# -- without Ray ---------------------------------------------------------------


def _plain(tmp_path: Path, env: dict, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )


GENERIC_RESET = """\
from open_instruct.environments.generic_sandbox import GenericSandboxEnv
env = GenericSandboxEnv(backend="docker", image="corral-test/busybox")
print(env._do_reset().strip(), type(env._backend).__name__)
env._backend.close()
"""


def test_the_variable_alone_switches_plain_python(tmp_path, corral_url, corral_spec):
    """`CORRAL_OPEN_INSTRUCT=1 python train.py`: no line of corral in the
    training code, and GenericSandboxEnv's create_backend gives corral's."""
    _fake_open_instruct(tmp_path)
    case = uuid.uuid4().hex[:12]
    env = _env(
        tmp_path,
        corral_url,
        CORRAL_OPEN_INSTRUCT="1",
        CORRAL_OPEN_INSTRUCT_DEFAULTS=_defaults(corral_spec, case),
    )
    p = _plain(tmp_path, env, GENERIC_RESET)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "ready CorralBackend"
    assert _left(case) == []


def test_docker_backend_built_directly_warns(tmp_path, corral_url):
    """create_backend is switched; a DockerBackend built by name is not, and
    says so."""
    _fake_open_instruct(tmp_path)
    env = _env(tmp_path, corral_url, CORRAL_OPEN_INSTRUCT="1")
    code = """\
    from open_instruct.environments.backends import DockerBackend
    try:
        DockerBackend(image="x")
    except RuntimeError as err:
        print(err)
    """
    p = _plain(tmp_path, env, code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "the Docker backend was used"
    assert "DockerBackend was built directly, not through create_backend" in p.stderr
    assert "$CORRAL_OPEN_INSTRUCT asks for corral" in p.stderr


def test_unknown_layout_warns(tmp_path, corral_url):
    """An open-instruct whose backends module has no create_backend cannot be
    switched: the warning names the module and what is missing."""
    _fake_open_instruct(tmp_path)
    pkg = tmp_path / "open_instruct" / "environments"
    for name in ("backends.py", "__init__.py", "generic_sandbox.py"):
        path = pkg / name
        path.write_text(path.read_text().replace("create_backend", "make_backend"))
    env = _env(tmp_path, corral_url, CORRAL_OPEN_INSTRUCT="1")
    p = _plain(tmp_path, env, "import open_instruct.environments.generic_sandbox\n")
    assert p.returncode == 0, p.stderr
    assert "open_instruct.environments.backends has no create_backend" in p.stderr
    assert "stay its own (plain Docker)" in p.stderr


def test_unknown_switch_value_warns(tmp_path, corral_url):
    _fake_open_instruct(tmp_path)
    env = _env(tmp_path, corral_url, CORRAL_OPEN_INSTRUCT="corral please")
    p = _plain(tmp_path, env, "import open_instruct.environments\n")
    assert p.returncode == 0, p.stderr
    assert "$CORRAL_OPEN_INSTRUCT='corral please' is not one of 1, true, yes, on" in p.stderr


def test_the_startup_hook_is_installed():
    """The wheel (and an editable install) puts corral_autoload.pth into
    site-packages; install() warns when it is missing."""
    assert open_instruct.startup_hook_installed()


def test_install_warns_without_the_startup_hook(tmp_path, monkeypatch, caplog):
    """corral-client on PYTHONPATH rather than installed: no .pth in any
    site-packages, so uv run's workers would not be switched; install() says
    so, naming the file and the directories it looked in."""
    _fake_open_instruct(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("CORRAL_OPEN_INSTRUCT", "CORRAL_OPEN_INSTRUCT_DEFAULTS", "RAY_RUNTIME_ENV_HOOK"):
        monkeypatch.delenv(name, raising=False)
    empty = tmp_path / "site-packages"
    empty.mkdir()
    monkeypatch.setattr(open_instruct, "_site_dirs", lambda: [str(empty)])
    try:
        with caplog.at_level("WARNING", logger="corral.adapters"):
            open_instruct.install()
    finally:
        for name in [m for m in sys.modules if m == "open_instruct" or m.startswith("open_instruct.")]:
            del sys.modules[name]
        open_instruct._defaults = {}
    assert os.environ["CORRAL_OPEN_INSTRUCT"] == "1"
    assert f"corral_autoload.pth is not in this environment's site-packages ({empty})" in caplog.text


# -- Ray, under python and under uv run ------------------------------------------

#: A driver shaped like open-instruct's: EnvironmentPool actors (one per slot)
#: each build a backend through GenericSandboxEnv. Each actor reports its
#: backend, the command's answer, and the command line of the process that
#: started it (``uv run ...`` for a worker under uv).
RAY_DRIVER = """\
import os, sys
import ray

if os.environ.get("DRIVER_INSTALL") == "1":
    import corral.adapters.open_instruct as oi
    oi.install()

import json

# open-instruct's runtime_env: env_vars named from the driver's environment
# (after install()), or given literally.
runtime_env = None
if os.environ.get("DRIVER_RUNTIME_ENV"):
    names = os.environ["DRIVER_RUNTIME_ENV"].split(",")
    runtime_env = {"env_vars": {k: os.environ[k] for k in names if k in os.environ}}
if os.environ.get("DRIVER_RUNTIME_ENV_JSON"):
    runtime_env = {"env_vars": json.loads(os.environ["DRIVER_RUNTIME_ENV_JSON"])}

ray.init(num_cpus=2, include_dashboard=False, runtime_env=runtime_env, log_to_driver=True)


@ray.remote(num_cpus=1)
class EnvironmentPoolSlot:
    def reset(self):
        from open_instruct.environments.generic_sandbox import GenericSandboxEnv

        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            parent = f.read().split(b"\\0")
        launcher = " ".join([os.path.basename(parent[0].decode()), *(a.decode() for a in parent[1:2])])
        env = GenericSandboxEnv(backend="docker", image="corral-test/busybox")
        try:
            out = env._do_reset().strip()
            return f"{type(env._backend).__name__} {out} {launcher}"
        finally:
            if env._backend is not None:
                env._backend.close()


slots = [EnvironmentPoolSlot.remote() for _ in range(2)]
for line in ray.get([s.reset.remote() for s in slots]):
    print("actor:", line, flush=True)
ray.shutdown()
"""


def _ray_driver(tmp_path: Path, corral_url: str, corral_spec, launcher: list, **env_extra: str):
    _require_ray()
    _fake_open_instruct(tmp_path)
    (tmp_path / "driver.py").write_text(RAY_DRIVER)
    case = uuid.uuid4().hex[:12]
    env = _env(tmp_path, corral_url, **env_extra)
    env["CORRAL_OPEN_INSTRUCT_DEFAULTS"] = _defaults(corral_spec, case)
    p = subprocess.run(
        [*launcher, "driver.py"], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path
    )
    left = _left(case)
    assert p.returncode == 0, f"driver failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    actors = [line.split(" ", 1)[1] for line in p.stdout.splitlines() if line.startswith("actor: ")]
    assert left == []
    return actors


def _uv_run() -> list:
    # The venv's interpreter, no project: uv resolves nothing, and Ray's uv
    # hook starts every worker with the same `uv run --no-project --python ...`.
    return [_uv(), "run", "--no-project", "--python", sys.executable, "python"]


def test_uv_run_ray_actors_with_the_variable_alone(tmp_path, corral_url, corral_spec):
    """`CORRAL_OPEN_INSTRUCT=1 uv run python grpo_fast.py`, ray.init without
    a runtime_env: the actors, started by `uv run`, build corral's backend."""
    actors = _ray_driver(tmp_path, corral_url, corral_spec, _uv_run(), CORRAL_OPEN_INSTRUCT="1")
    assert len(actors) == 2
    for line in actors:
        assert line.startswith("CorralBackend ready uv run"), actors


def test_uv_run_ray_actors_after_install_with_a_runtime_env(tmp_path, corral_url, corral_spec):
    """The issue's case: install() in the driver, then ray.init with
    open-instruct's runtime_env (env_vars from the driver), under `uv run`,
    which ignores RAY_RUNTIME_ENV_HOOK."""
    actors = _ray_driver(
        tmp_path,
        corral_url,
        corral_spec,
        _uv_run(),
        DRIVER_INSTALL="1",
        DRIVER_RUNTIME_ENV="CORRAL_OPEN_INSTRUCT,CORRAL_OPEN_INSTRUCT_DEFAULTS,CORRAL_URL,CORRAL_TOKEN",
    )
    assert len(actors) == 2
    for line in actors:
        assert line.startswith("CorralBackend ready uv run"), actors


def test_python_ray_actors_with_the_variable_in_the_runtime_env(tmp_path, corral_url, corral_spec):
    """Plain `python`, the cluster started without the variable, which only
    the job's runtime_env carries to the workers."""
    actors = _ray_driver(
        tmp_path,
        corral_url,
        corral_spec,
        [sys.executable],
        DRIVER_RUNTIME_ENV_JSON=json.dumps({"CORRAL_OPEN_INSTRUCT": "1"}),
    )
    assert len(actors) == 2
    for line in actors:
        assert line.startswith("CorralBackend ready"), actors


# -- the launcher signalled ------------------------------------------------------

#: open-instruct's shape again, the actors holding their sandboxes (as an
#: EnvironmentPool does between rollouts) until the launcher is stopped.
HOLDING_DRIVER = """\
import time
import ray

ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)


@ray.remote(num_cpus=1)
class EnvironmentPoolSlot:
    def start(self):
        from open_instruct.environments.generic_sandbox import GenericSandboxEnv

        self.env = GenericSandboxEnv(backend="docker", image="corral-test/busybox")
        out = self.env._do_reset().strip()
        return type(self.env._backend).__name__ + " " + out


slots = [EnvironmentPoolSlot.remote() for _ in range(2)]
print("ready", ray.get([s.start.remote() for s in slots]), flush=True)
time.sleep(600)
"""


def _read_line(proc: subprocess.Popen, deadline: float) -> str:
    import select

    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            return proc.stdout.readline()
        if proc.poll() is not None:
            return proc.stdout.readline()
    return ""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_signalled_uv_run_launcher_leaves_no_sandboxes(tmp_path, corral_url, corral_spec, sig):
    """`CORRAL_OPEN_INSTRUCT=1 uv run python grpo_fast.py` with an
    EnvironmentPool of Ray actors, the launcher (uv) signalled: Ray ends its
    workers without running their handlers, and each worker's guardian
    removes its sandbox within seconds (the time is printed)."""
    _require_ray()
    _fake_open_instruct(tmp_path)
    (tmp_path / "driver.py").write_text(HOLDING_DRIVER)
    case = uuid.uuid4().hex[:12]
    env = _env(tmp_path, corral_url, CORRAL_OPEN_INSTRUCT="1")
    env["CORRAL_OPEN_INSTRUCT_DEFAULTS"] = _defaults(corral_spec, case)
    log = open(tmp_path / "driver.err", "w")
    proc = subprocess.Popen(
        [*_uv_run(), "driver.py"],
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        line = _read_line(proc, time.monotonic() + 240)
        err = (tmp_path / "driver.err").read_text()[-6000:]
        assert line.startswith("ready"), f"driver: {line!r}\n{err}"
        assert line.count("CorralBackend ready") == 2, line
        assert len(docker_ids("corral.sandbox", f"corraltest.case={case}")) == 2
        signalled = time.monotonic()
        os.kill(proc.pid, sig)
        deadline = signalled + 30
        while docker_ids("corral.sandbox", f"corraltest.case={case}"):
            assert time.monotonic() < deadline, f"the sandboxes outlived the {sig.name}ed launcher by 30 s"
            time.sleep(0.1)
        took = time.monotonic() - signalled
        print(f"{sig.name} to the launcher: no sandboxes after {took:.2f} s")
        (tmp_path.parent / f"signal-{sig.name}.seconds").write_text(f"{took:.3f}\n")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)
        log.close()
        _left(case)
