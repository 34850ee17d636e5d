"""A drop-in for open-instruct's code-execution ``SandboxBackend``
(``open_instruct/environments/backends.py``) running on corral.

The one-line switch
-------------------

open-instruct never names ``DockerBackend`` where it runs commands:
``GenericSandboxEnv._do_reset`` (``open_instruct/environments/generic_sandbox.py``)
calls ``create_backend(self._backend_type, **bkwargs)``, a name it imported
with ``from .backends import SandboxBackend, create_backend``, and under Ray
that call runs inside every ``EnvironmentPool`` actor process
(``open_instruct/environments/pool.py`` makes one actor per pool slot). So the
switch replaces that factory in every process that builds a backend: the
driver, ``uv run``'s, every Ray worker. Set it once where training is
launched::

    CORRAL_OPEN_INSTRUCT=1 uv run python open_instruct/grpo_fast.py ...

The client's wheel installs ``corral_autoload.pth`` into site-packages;
``site`` runs it in every Python process of the environment, and with
``$CORRAL_OPEN_INSTRUCT`` set it replaces ``create_backend`` right after
``open_instruct.environments.backends`` is imported (:func:`switch_module`;
``"docker"`` and ``"corral"`` then give a :class:`CorralBackend`). Ray's
workers inherit the variable from the process that started the cluster
(``ray.init``), or from ``runtime_env={"env_vars": ...}``, which
open-instruct fills with the driver's ``os.environ``; under ``uv run``
Ray starts them with ``uv run`` too, in the same environment. Keyword
arguments of the backends come as JSON in ``$CORRAL_OPEN_INSTRUCT_DEFAULTS``
(``{"profile": "rl", "shell": "sh"}``); the service is found as the client
finds it (``$CORRAL_URL``, ``$CORRAL_TOKEN``).

In code, ``corral.adapters.open_instruct.install(**defaults)`` before
``ray.init`` does the same: it switches this process, sets both variables
for the processes it starts, and sets ``RAY_RUNTIME_ENV_HOOK`` (chained to
an earlier one and to an earlier ``worker_process_setup_hook``) for workers
of environments without the startup hook; under ``uv run`` Ray ignores
that hook, so :func:`install` warns when the startup hook is missing. Where
corral was asked for but a backend is still open-instruct's own, a warning
says why: ``DockerBackend(...)`` built directly rather than through
``create_backend``, a ``backends`` module without ``create_backend``, a
value of ``$CORRAL_OPEN_INSTRUCT`` that is neither on nor off, corral not
importable.

``from corral.adapters.open_instruct import CorralBackend as DockerBackend``
still works for code that constructs the backend itself.

The backend
-----------

``CorralBackend`` has the same constructor arguments as open-instruct's
``DockerBackend`` (``image``, ``timeout`` in seconds per command,
``mem_limit`` like ``"4g"``, default: the service's limit) plus corral's own
(``base_url``, ``token``, ``spec``, ``profile``, ``client``, ``shell``), and
the same methods, with ``DockerBackend``'s behaviour:

* ``start()`` creates the sandbox;
* ``run_command(command, timeout=None)`` runs ``command`` with ``bash -c``
  and returns ``ExecutionResult(stdout, stderr, exit_code)``. Each stream
  keeps its first 1,000,000 bytes, the rest is dropped (as
  ``DockerBackend._MAX_OUTPUT_BYTES``). A command past its timeout gives exit
  code 124 and a ``"Command timed out after Ns."`` line before its stderr, as
  ``timeout --signal=TERM --kill-after=10 N bash -c ...`` does, and so does a
  command that itself exits 124 (``DockerBackend`` tells them apart by the
  exit code alone). OOM-killed: 137. The command returns when its output
  streams close, so a background job holding them is waited for (bounded by
  the timeout), as ``exec_run`` does (with a client that has
  ``wait_for_output``). ``timeout`` overrides the constructor's for one call
  (the original takes none);
* ``write_file(path, content)`` (str or bytes), ``read_file(path,
  binary=False)`` (``FileNotFoundError`` when missing, ``IsADirectoryError``
  for a directory). A relative path is resolved against ``/``, as the Docker
  archive API resolves it (the editor tool passes model-written paths such as
  ``relative.txt``);
* ``close()`` deletes the sandbox.

The sandbox is also deleted at interpreter exit (a crash included), on
SIGTERM and SIGHUP, and on SIGINT without a terminal on stdin (the handler
chains to the one it replaced, e.g. Ray's); see :mod:`corral.adapters._reaper`.

Deliberate differences:

* ``write_file`` creates missing parent directories, where ``put_archive``
  raises ``docker.errors.NotFound`` (``GenericSandboxEnv``'s editor runs
  ``mkdir -p`` first anyway, so it sees no difference);
* a timed-out command's whole process tree is killed at once, where
  ``timeout`` sends SIGTERM to ``bash`` and SIGKILL 10 s later, leaving
  children that ignore it running;
* a lost container or an unreachable service raises corral's typed error
  (``SandboxContainerLostError``, ``DaemonUnavailableError``, ...: all
  :class:`corral.CorralError` with ``retryable``), where the original raised
  the Docker SDK's ``APIError``; ``GenericSandboxEnv.reset``'s retry keeps
  working.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Union

from ..client import Client, Sandbox
from ..errors import CorralError, SandboxFileNotFoundError
from ..models import CommandResult
from . import _output, _reaper

__all__ = [
    "ExecutionResult",
    "CorralBackend",
    "create_backend",
    "install",
    "switch_module",
    "startup_hook_installed",
    "parse_mem_limit",
    "resolve_path",
]

log = logging.getLogger("corral.adapters")

#: Bytes of each stream ``DockerBackend.run_command`` keeps (the first ones).
MAX_OUTPUT_BYTES = 1_000_000


@dataclass
class ExecutionResult:
    """Result from code or command execution (open-instruct's shape)."""

    stdout: str
    stderr: str
    exit_code: int


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_mem_limit(value: Union[str, int, None]) -> Optional[int]:
    """Docker's memory notation ("4g", "512m", "1024k", bytes) in bytes."""
    if value is None:
        return None
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmgt]?)(?:i?b)?\s*", str(value).lower())
    if not m:
        raise ValueError(f"mem_limit: expected a size like '4g' or '512m', got {value!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def resolve_path(path: str) -> str:
    """A path as the Docker archive API resolves it: relative to ``/``."""
    if path.startswith("/"):
        return path
    return posixpath.normpath("/" + path)


class CorralBackend:
    """open-instruct's ``SandboxBackend`` on a corral sandbox."""

    _MAX_OUTPUT_BYTES = MAX_OUTPUT_BYTES

    def __init__(
        self,
        image: Optional[str] = None,
        timeout: int = 1800,
        mem_limit: Union[str, int, None] = None,
        *,
        base_url: Optional[str] = None,
        token: Optional[str] = None,
        spec: Optional[Mapping[str, Any]] = None,
        profile: Optional[str] = None,
        client: Optional[Client] = None,
        shell: str = "bash",
    ) -> None:
        """
        Args:
            image: image to use; ``None``: the service's default image.
            timeout: per-command timeout in seconds (default 30 minutes).
            mem_limit: memory limit ("4g"); swap is capped at the same value.
                ``None`` (the default here; open-instruct's is "4g"): the
                service's configured limit. Setting it (or ``spec``) sends a
                spec, merged over the service's ``defaults``; the service's
                policy caps the limits a client may ask for.
            base_url, token: the corral service (default ``$CORRAL_URL``,
                ``$CORRAL_TOKEN``, else a local service's generated token).
            spec: a full corral sandbox spec; ``image`` and ``mem_limit`` are
                applied on top of it.
            profile: a profile of the service's config instead of a spec.
            client: a :class:`corral.Client` to share.
            shell: the shell that runs each command (``bash -c``), ``sh`` for
                images without bash.
        """
        self._image = image
        self._timeout = timeout
        self._mem_limit = mem_limit
        self._spec = dict(spec) if spec is not None else None
        self._profile = profile
        self._shell = shell
        self._owns_client = client is None
        self._client = client
        self._base_url = base_url
        self._token = token
        self._sandbox: Optional[Sandbox] = None
        self._reaper_key: Optional[int] = None

    # -- lifecycle ---------------------------------------------------------

    def _sandbox_spec(self) -> Optional[Dict[str, Any]]:
        memory = parse_mem_limit(self._mem_limit)
        if self._profile is not None:
            return None
        if self._spec is None and memory is None:
            return None
        spec: Dict[str, Any] = dict(self._spec or {})
        if self._image is not None:
            spec["image"] = self._image
        if memory is not None:
            limits = dict(spec.get("limits") or {})
            limits["memory"] = memory
            spec["limits"] = limits
        return spec

    def start(self) -> None:
        """Create the sandbox. Must be called before other operations."""
        if self._client is None:
            self._client = Client(self._base_url, token=self._token)
        spec = self._sandbox_spec()
        self._sandbox = Sandbox(
            self._client,
            image=self._image if spec is None else None,
            spec=spec,
            profile=self._profile,
        )
        self._reaper_key = _reaper.track(
            self._sandbox.id,
            _reaper.client_factory(self._base_url, self._token, None if self._owns_client else self._client),
        )

    def close(self) -> None:
        """Delete the sandbox (and close the client this backend made)."""
        sb, self._sandbox = self._sandbox, None
        key, self._reaper_key = self._reaper_key, None
        try:
            if sb is not None:
                sb.delete()
            _reaper.release(key)
        finally:
            if self._owns_client and self._client is not None:
                self._client.close()
                self._client = None

    def __enter__(self) -> "CorralBackend":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def sandbox(self) -> Sandbox:
        """The corral sandbox, for everything the backend interface lacks."""
        if self._sandbox is None:
            raise RuntimeError("Container not started. Call start() first.")
        return self._sandbox

    # -- commands ----------------------------------------------------------

    def run_command(self, command: str, timeout: Optional[float] = None) -> ExecutionResult:
        """Execute a shell command in the sandbox."""
        sb = self.sandbox
        limit = self._timeout if timeout is None else timeout
        # Twice the cap: corral's head (the first half) then holds the first
        # _MAX_OUTPUT_BYTES, which is what DockerBackend keeps.
        result: CommandResult = sb.run(
            [self._shell, "-c", command],
            timeout=limit if limit else None,
            max_output=2 * self._MAX_OUTPUT_BYTES,
            raise_on_failure=False,
            **_output.wait_for_output_kwargs(sb),
        )
        failure = result.failure
        stdout = _output.head_only(result.stdout_bytes, result.stdout_truncated, self._MAX_OUTPUT_BYTES).decode(
            "utf-8", errors="replace"
        )
        stderr = _output.head_only(result.stderr_bytes, result.stderr_truncated, self._MAX_OUTPUT_BYTES).decode(
            "utf-8", errors="replace"
        )
        if failure is None:
            code = result.exit_code
            if code is None:
                code = 128 + result.signal if result.signal else -1
            if code == 124:
                # DockerBackend knows a timeout by `timeout`'s exit code only.
                stderr = f"Command timed out after {limit}s.\n" + stderr
            return ExecutionResult(stdout=stdout, stderr=stderr, exit_code=code)
        if failure.kind == "timeout":
            return ExecutionResult(
                stdout=stdout, stderr=f"Command timed out after {limit}s.\n" + stderr, exit_code=124
            )
        if failure.kind == "oom_killed":
            return ExecutionResult(stdout=stdout, stderr=stderr + f"\n{failure.message}\n", exit_code=137)
        if failure.kind == "spawn_failed":
            return ExecutionResult(stdout=stdout, stderr=stderr + f"{failure.message}\n", exit_code=127)
        result.raise_for_failure()
        raise AssertionError("unreachable")  # pragma: no cover

    # -- files -------------------------------------------------------------

    def write_file(self, path: str, content: Union[str, bytes]) -> None:
        """Write a file to the sandbox filesystem (a relative path is
        relative to ``/``; missing parents are created)."""
        self.sandbox.write_file(resolve_path(path), content, mkdirs=True)

    def read_file(self, path: str, binary: bool = False) -> Union[str, bytes]:
        """Read a file from the sandbox filesystem."""
        sb = self.sandbox
        target = resolve_path(path)
        try:
            data = sb.read_file(target)
        except SandboxFileNotFoundError:
            raise FileNotFoundError(f"File not found in container: '{path}'") from None
        except CorralError as err:
            if err.field == "path" or err.kind in ("invalid_request", "file_error"):
                if _is_dir(sb, target):
                    raise IsADirectoryError(f"Path '{path}' is a directory, not a file.") from None
                raise FileNotFoundError(f"Failed to read file '{path}': {err.message}") from None
            raise
        if binary:
            return data
        return data.decode("utf-8", errors="replace")


def _is_dir(sb: Sandbox, path: str) -> bool:
    try:
        r = sb.run(["test", "-d", path], timeout=30, raise_on_failure=False)
    except CorralError:
        return False
    return r.failure is None and r.exit_code == 0


def create_backend(backend_type: str = "corral", **kwargs: Any) -> CorralBackend:
    """open-instruct's factory: a backend, not yet started. ``"corral"`` and
    ``"docker"`` both give a :class:`CorralBackend`; the keyword arguments
    given to :func:`install` are its defaults."""
    if backend_type in ("corral", "docker"):
        return CorralBackend(**{**_defaults, **kwargs})
    raise ValueError(f"Unknown backend type: {backend_type}. Supported: 'corral', 'docker'.")


#: Modules of open-instruct that hold a ``create_backend`` name to replace:
#: the definition, the package's re-export, and GenericSandboxEnv's
#: ``from .backends import create_backend``.
OPEN_INSTRUCT_MODULES = (
    "open_instruct.environments.backends",
    "open_instruct.environments",
    "open_instruct.environments.generic_sandbox",
)

#: The switch read by the startup hook (``corral_autoload``).
SWITCH_ENV = "CORRAL_OPEN_INSTRUCT"
#: The environment variable carrying :func:`install`'s keyword arguments to
#: Ray workers (JSON).
DEFAULTS_ENV = "CORRAL_OPEN_INSTRUCT_DEFAULTS"
#: The file in site-packages that runs the startup hook.
STARTUP_PTH = "corral_autoload.pth"
_RAY_HOOK_ENV = "RAY_RUNTIME_ENV_HOOK"
_PREVIOUS_RAY_HOOK_ENV = "CORRAL_PREVIOUS_RAY_RUNTIME_ENV_HOOK"
_SETUP_HOOK = "corral.adapters.open_instruct.install"

_defaults: Dict[str, Any] = {}


def install(*, ray: bool = True, **defaults: Any) -> None:
    """Make open-instruct's ``create_backend`` give :class:`CorralBackend`
    (for ``"docker"`` and ``"corral"``), here and in the processes started
    from here: it sets ``$CORRAL_OPEN_INSTRUCT``, which the startup hook
    (``corral_autoload.pth``) reads in each of them, ``uv run``'s Ray
    workers included. With ``ray=True`` it also sets ``RAY_RUNTIME_ENV_HOOK``
    for workers of an environment without the startup hook (ignored under
    ``uv run``), and warns when the hook is missing here.

    ``defaults`` are :class:`CorralBackend` keyword arguments applied to
    every backend (``base_url``, ``profile``, ``shell``, ``spec``, ...;
    JSON-serialisable, as they travel to the workers in ``$CORRAL_OPEN_INSTRUCT_DEFAULTS``;
    pass the token as ``$CORRAL_TOKEN``, not here). Called with no
    arguments (as Ray's ``worker_process_setup_hook`` calls it), the
    defaults come from that variable. Safe to call more than once. Raises
    ``ImportError`` when open-instruct is not importable.
    """
    global _defaults
    os.environ[SWITCH_ENV] = "1"
    if defaults:
        try:
            encoded = json.dumps(defaults)
        except TypeError as err:
            raise TypeError(f"install: defaults must be JSON-serialisable to reach Ray workers: {err}") from None
        os.environ[DEFAULTS_ENV] = encoded
        _defaults = dict(defaults)
    else:
        _defaults = _env_defaults()
    import importlib

    for name in OPEN_INSTRUCT_MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            if name == OPEN_INSTRUCT_MODULES[0]:
                raise
            continue
        if hasattr(mod, "create_backend"):
            setattr(mod, "create_backend", create_backend)
    _register_with_open_instruct()
    _guard_docker_backend(sys.modules.get(OPEN_INSTRUCT_MODULES[0]), "install()")
    if ray:
        _chain_ray_hook()
        if not startup_hook_installed():
            log.warning(
                "corral: %s is not in this environment's site-packages (%s): Ray workers started under "
                "`uv run` (which ignores RAY_RUNTIME_ENV_HOOK) and other processes will build open-instruct's "
                "own backends (plain Docker); install corral-client as a package (pip install, uv add) "
                "rather than through PYTHONPATH",
                STARTUP_PTH,
                ", ".join(_site_dirs()) or "none found",
            )


def switch_module(module: Any, *, why: str) -> None:
    """Replace ``create_backend`` in open-instruct's just-imported
    ``open_instruct.environments.backends`` (and in the other modules of
    :data:`OPEN_INSTRUCT_MODULES` already imported); the startup hook calls
    it. ``why`` names what asked for corral, for the warnings. Without a
    ``create_backend`` there (a layout this adapter does not know) it logs
    why open-instruct's own backends stay."""
    global _defaults
    _defaults = _env_defaults()
    if not callable(getattr(module, "create_backend", None)):
        log.warning(
            "corral: %s asks for corral, but %s has no create_backend (an open-instruct this adapter does not "
            "know): the backends it builds stay its own (plain Docker)",
            why,
            getattr(module, "__name__", module),
        )
    else:
        module.create_backend = create_backend
        for name in OPEN_INSTRUCT_MODULES[1:]:
            other = sys.modules.get(name)
            if other is not None and hasattr(other, "create_backend"):
                other.create_backend = create_backend
    _register_with_open_instruct(module)
    _guard_docker_backend(module, why)


def _guard_docker_backend(module: Any, why: str) -> None:
    """Make ``DockerBackend(...)`` built directly (not through the replaced
    ``create_backend``) log why it is not corral's."""
    cls = getattr(module, "DockerBackend", None)
    init = getattr(cls, "__init__", None)
    if cls is None or init is None or getattr(init, "_corral_guard", False):
        return
    import functools

    @functools.wraps(init)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> None:
        log.warning(
            "corral: %s asks for corral, but open-instruct's DockerBackend was built directly, not through "
            "create_backend: this backend runs on plain Docker (use create_backend or CorralBackend)",
            why,
        )
        init(self, *args, **kwargs)

    guarded._corral_guard = True  # type: ignore[attr-defined]
    try:
        cls.__init__ = guarded
    except (AttributeError, TypeError):  # pragma: no cover - a class that refuses attributes
        pass


def _site_dirs() -> list:
    import site

    dirs = list(getattr(site, "getsitepackages", lambda: [])())
    user = getattr(site, "getusersitepackages", lambda: None)()
    if user:
        dirs.append(user)
    return dirs


def startup_hook_installed() -> bool:
    """Whether ``corral_autoload.pth`` is in a site-packages directory of this
    interpreter (so ``site`` runs it in every process of the environment)."""
    return any(os.path.isfile(os.path.join(d, STARTUP_PTH)) for d in _site_dirs())


def _env_defaults() -> Dict[str, Any]:
    raw = os.environ.get(DEFAULTS_ENV)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as err:
        raise ValueError(f"${DEFAULTS_ENV}: not JSON: {err}") from None
    if not isinstance(value, dict):
        raise ValueError(f"${DEFAULTS_ENV}: expected a JSON object, got {type(value).__name__}")
    return value


def _chain_ray_hook() -> None:
    current = os.environ.get(_RAY_HOOK_ENV)
    ours = f"{__name__}.ray_runtime_env_hook"
    if current == ours:
        return
    if current:
        os.environ[_PREVIOUS_RAY_HOOK_ENV] = current
    os.environ[_RAY_HOOK_ENV] = ours


def ray_runtime_env_hook(runtime_env: Any) -> Any:
    """Ray's ``RAY_RUNTIME_ENV_HOOK`` (set by :func:`install`): runs an
    earlier hook, then adds ``worker_process_setup_hook`` (chained to one
    already there) and :func:`install`'s defaults to the job's runtime env."""
    previous = os.environ.get(_PREVIOUS_RAY_HOOK_ENV)
    if previous:
        runtime_env = _load(previous)(runtime_env)
    env: Dict[str, Any] = dict(runtime_env or {})
    setup = env.get("worker_process_setup_hook")
    if setup is None or setup == _SETUP_HOOK:
        env["worker_process_setup_hook"] = _SETUP_HOOK
    else:
        import functools

        env["worker_process_setup_hook"] = functools.partial(_chained_setup, setup)
    env_vars = dict(env.get("env_vars") or {})
    if DEFAULTS_ENV in os.environ:
        env_vars.setdefault(DEFAULTS_ENV, os.environ[DEFAULTS_ENV])
    if env_vars:
        env["env_vars"] = env_vars
    return env


def _chained_setup(previous: Union[str, Callable[[], Any]]) -> None:
    install(ray=False)
    (_load(previous) if isinstance(previous, str) else previous)()


def _load(path: str) -> Callable[..., Any]:
    import importlib

    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def _register_with_open_instruct(mod: Any = None) -> None:
    """When open-instruct is loaded, make ``isinstance(b, SandboxBackend)``
    hold for ``CorralBackend`` too."""
    if mod is None:
        mod = sys.modules.get("open_instruct.environments.backends")
    base = getattr(mod, "SandboxBackend", None)
    register = getattr(base, "register", None)
    if callable(register):
        try:
            register(CorralBackend)
        except Exception:  # pragma: no cover - a foreign ABC refused
            pass


_register_with_open_instruct()
