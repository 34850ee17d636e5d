"""A drop-in for open-instruct's code-execution ``SandboxBackend``
(``open_instruct/environments/backends.py``) running on corral.

The one-line switch, where ``DockerBackend`` was imported::

    from corral.adapters.open_instruct import CorralBackend as DockerBackend

``CorralBackend`` has the same constructor arguments as open-instruct's
``DockerBackend`` (``image``, ``timeout`` in seconds per command,
``mem_limit`` like ``"4g"``, default: the service's limit) plus corral's own (``base_url``, ``token``,
``spec``, ``profile``, ``client``), and the same methods:

* ``start()`` creates the sandbox;
* ``run_command(command, timeout=None)`` runs ``command`` with
  ``bash -c`` and returns ``ExecutionResult(stdout, stderr, exit_code)``; a
  command past its timeout gives exit code 124 and a
  ``"Command timed out after Ns."`` line before its stderr, an OOM-killed one
  137, as a ``timeout``/``docker exec`` pair would. ``timeout`` overrides the
  constructor's for one call (the original takes none);
* ``write_file(path, content)`` (str or bytes; parents are created),
  ``read_file(path, binary=False)`` (``FileNotFoundError`` when missing,
  ``IsADirectoryError`` for a directory);
* ``close()`` deletes the sandbox.

A lost container or an unreachable service raises corral's typed error
(``SandboxContainerLostError``, ``DaemonUnavailableError``, ...: all
:class:`corral.CorralError` with ``retryable``), where the original raised the
Docker SDK's ``APIError``; the caller's retry around ``start()``/``reset()``
keeps working. ``create_backend("corral", ...)`` (or ``"docker"``) mirrors
open-instruct's factory.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Union

from ..client import Client, Sandbox
from ..errors import CorralError, SandboxFileNotFoundError
from ..models import CommandResult

__all__ = ["ExecutionResult", "CorralBackend", "create_backend", "parse_mem_limit"]


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


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\"'\"'") + "'"


class CorralBackend:
    """open-instruct's ``SandboxBackend`` on a corral sandbox."""

    _MAX_OUTPUT_BYTES = 1_000_000

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

    def close(self) -> None:
        """Delete the sandbox (and close the client this backend made)."""
        sb, self._sandbox = self._sandbox, None
        try:
            if sb is not None:
                sb.delete()
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
        result: CommandResult = sb.run(
            [self._shell, "-c", command],
            timeout=limit if limit else None,
            max_output=self._MAX_OUTPUT_BYTES,
            raise_on_failure=False,
        )
        failure = result.failure
        stdout, stderr = result.stdout, result.stderr
        if failure is None:
            code = result.exit_code
            if code is None:
                code = 128 + result.signal if result.signal else -1
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
        """Write a file to the sandbox filesystem."""
        self.sandbox.write_file(path, content, mkdirs=True)

    def read_file(self, path: str, binary: bool = False) -> Union[str, bytes]:
        """Read a file from the sandbox filesystem."""
        sb = self.sandbox
        try:
            data = sb.read_file(path)
        except SandboxFileNotFoundError:
            raise FileNotFoundError(f"File not found in container: '{path}'") from None
        except CorralError as err:
            if err.field == "path" or err.kind in ("invalid_request", "file_error"):
                if _is_dir(sb, path):
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
    ``"docker"`` both give a :class:`CorralBackend`."""
    if backend_type in ("corral", "docker"):
        return CorralBackend(**kwargs)
    raise ValueError(f"Unknown backend type: {backend_type}. Supported: 'corral', 'docker'.")


def _register_with_open_instruct() -> None:
    """When open-instruct is loaded, make ``isinstance(b, SandboxBackend)``
    hold for ``CorralBackend`` too."""
    mod = sys.modules.get("open_instruct.environments.backends")
    base = getattr(mod, "SandboxBackend", None)
    register = getattr(base, "register", None)
    if callable(register):
        try:
            register(CorralBackend)
        except Exception:  # pragma: no cover - a foreign ABC refused
            pass


_register_with_open_instruct()

