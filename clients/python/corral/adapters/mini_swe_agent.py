"""A drop-in for mini-swe-agent's environments (``DockerEnvironment``,
``LocalEnvironment``) running on corral.

The one-line switch, in a mini-swe-agent YAML config::

    environment:
      environment_class: corral.adapters.mini_swe_agent.CorralEnvironment
      image: python:3.12-slim        # the rest of DockerEnvironment's keys work as before

or in Python, where ``DockerEnvironment`` was imported::

    from corral.adapters.mini_swe_agent import CorralEnvironment as DockerEnvironment

``CorralEnvironment(**kwargs)`` takes ``DockerEnvironmentConfig``'s keys
(``image``, ``cwd``, ``env``, ``forward_env``, ``timeout``, ``interpreter``;
the Docker-CLI-only ``executable``, ``run_args``, ``container_timeout`` and
``pull_timeout`` are accepted and ignored) plus corral's (``base_url``,
``token``, ``spec``, ``profile``, ``session``, ``max_output``), starts the
sandbox at once, and has the same methods:

* ``execute(action, cwd="", *, timeout=None) -> dict``: ``action`` is
  mini-swe-agent 2's ``{"command": ...}`` dict (or, as in 1.x, the command
  string). The command runs with ``interpreter`` (``bash -lc``) in ``cwd``
  (default ``config.cwd``) with ``env``/``forward_env``; stdout and stderr are
  interleaved in ``output``, as with ``stderr=STDOUT``. The answer is
  ``{"output": str, "returncode": int, "exception_info": str}``. A timeout
  (the command's whole process tree is killed) gives ``returncode`` -1, the
  output so far and ``exception_info``/``extra`` naming ``TimeoutExpired``; a
  1.x string action raises :class:`subprocess.TimeoutExpired` instead, which
  1.x agents catch. An OOM kill gives 137; a lost container or unreachable
  daemon gives -1 with corral's message (``extra.retryable`` says whether a
  new sandbox would do), and raises the typed :class:`corral.CorralError` for
  a 1.x string action. Output whose first line is
  ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` with return code 0 raises
  mini-swe-agent's ``Submitted``, as its environments do.
* ``get_template_vars(**kwargs)``: the config merged with ``kwargs`` (the
  token is never included); ``serialize()``; ``cleanup()`` deletes the
  sandbox (also on garbage collection).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union

from ..client import Client, Sandbox
from ..errors import CorralError
from ..models import CommandResult

__all__ = ["CorralEnvironment", "CorralEnvironmentConfig", "Submitted", "recursive_merge"]

FINAL_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

try:  # mini-swe-agent 2.x
    from minisweagent.exceptions import Submitted as Submitted  # type: ignore[import-not-found]
except Exception:  # pragma: no cover - depends on what is installed

    class Submitted(Exception):  # type: ignore[no-redef]
        """Raised when the output says the task is complete (stands in for
        ``minisweagent.exceptions.Submitted`` when mini-swe-agent is not
        installed)."""

        def __init__(self, *messages: dict) -> None:
            self.messages = messages
            super().__init__()


# Keys that must not reach prompts, trajectories or logs.
_SECRET_KEYS = ("token",)


@dataclass
class CorralEnvironmentConfig:
    """``DockerEnvironmentConfig``'s keys plus corral's."""

    image: Optional[str] = None
    """Image; ``None``: the service's default."""
    cwd: str = "/"
    """Working directory in which to execute commands."""
    env: Dict[str, str] = field(default_factory=dict)
    """Environment variables to set for every command."""
    forward_env: List[str] = field(default_factory=list)
    """Host environment variables to forward when set (``env`` wins)."""
    timeout: int = 30
    """Timeout for executing commands, in seconds."""
    interpreter: List[str] = field(default_factory=lambda: ["bash", "-lc"])
    """Interpreter the command is appended to."""
    # Docker CLI keys of DockerEnvironmentConfig: accepted, not used.
    executable: str = "docker"
    run_args: List[str] = field(default_factory=lambda: ["--rm"])
    container_timeout: str = "2h"
    pull_timeout: int = 120
    # corral
    base_url: Optional[str] = None
    """The corral service; ``None``: ``$CORRAL_URL`` or the default."""
    token: Optional[str] = field(default=None, repr=False)
    """Bearer token; ``None``: ``$CORRAL_TOKEN``, else a local service's generated
    token. Never dumped."""
    spec: Optional[Dict[str, Any]] = None
    """A full corral sandbox spec (``image`` above overrides its image)."""
    profile: Optional[str] = None
    """A profile of the service's config."""
    session: Optional[str] = None
    """Session key (the same key gets the same sandbox)."""
    max_output: Optional[int] = None
    """Bytes of output kept (head and tail); ``None``: the service's 1 MiB."""

    def model_dump(self, mode: str = "python", **_: Any) -> Dict[str, Any]:
        """The config as a dict (pydantic's name, for code that calls it)."""
        data = dataclasses.asdict(self)
        for key in _SECRET_KEYS:
            data.pop(key, None)
        return data


def recursive_merge(*dicts: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """Merge dicts left to right; nested dicts are merged, other values of
    later dicts win."""
    out: Dict[str, Any] = {}
    for d in dicts:
        if not d:
            continue
        for k, v in d.items():
            if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
                out[k] = recursive_merge(out[k], v)
            else:
                out[k] = v
    return out


class CorralEnvironment:
    """mini-swe-agent's environment interface on a corral sandbox."""

    def __init__(
        self,
        *,
        config_class: type = CorralEnvironmentConfig,
        logger: Optional[logging.Logger] = None,
        client: Optional[Client] = None,
        **kwargs: Any,
    ) -> None:
        self.logger = logger or logging.getLogger("minisweagent.environment")
        self.config = config_class(**kwargs)
        self._owns_client = client is None
        self._client = client or Client(self.config.base_url, token=self.config.token)
        self._sandbox: Optional[Sandbox] = None
        try:
            self._sandbox = self._client.sandbox(
                image=self.config.image if self.config.spec is None else None,
                spec=self._spec(),
                profile=self.config.profile,
                session=self.config.session,
            )
        except BaseException:
            if self._owns_client:
                self._client.close()
            raise
        self.logger.info("Started corral sandbox %s (container %s)", self._sandbox.id, self.container_id)

    def _spec(self) -> Optional[Dict[str, Any]]:
        if self.config.spec is None:
            return None
        spec = dict(self.config.spec)
        if self.config.image is not None:
            spec["image"] = self.config.image
        return spec

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            raise RuntimeError("the environment was cleaned up")
        return self._sandbox

    @property
    def container_id(self) -> Optional[str]:
        return self._sandbox.container_id if self._sandbox is not None else None

    # -- the environment interface ----------------------------------------

    def execute(self, action: Union[Mapping[str, Any], str], cwd: str = "", *, timeout: Optional[int] = None) -> Dict[str, Any]:
        """Execute a command in the sandbox and return the result as a dict."""
        legacy = isinstance(action, str)
        command = action if isinstance(action, str) else str(action.get("command", ""))
        cwd = cwd or self.config.cwd
        limit = timeout or self.config.timeout
        env: Dict[str, str] = {}
        for key in self.config.forward_env:
            value = os.getenv(key)
            if value is not None:
                env[key] = value
        env.update({str(k): str(v) for k, v in self.config.env.items()})
        # /bin/sh points the interpreter's stderr at its stdout, so the output
        # interleaves as it was written.
        argv = ["/bin/sh", "-c", 'exec 2>&1; exec "$@"', "sh", *self.config.interpreter, command]
        try:
            result: CommandResult = self.sandbox.run(
                argv,
                timeout=limit if limit else None,
                cwd=cwd or None,
                env=env or None,
                max_output=self.config.max_output,
                raise_on_failure=False,
            )
        except CorralError as err:
            # The service refused before running it (sandbox gone, lost
            # container it already knew of, unreachable service).
            if legacy:
                raise
            return {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {err.message}",
                "extra": {
                    "exception_type": type(err).__name__,
                    "exception": str(err),
                    "failure_kind": err.kind,
                    "retryable": err.retryable,
                },
            }
        output = self._observation(result, command, limit, legacy)
        if not legacy:
            self._check_finished(output)
        return output

    def _observation(self, result: CommandResult, command: str, limit: Any, legacy: bool) -> Dict[str, Any]:
        text = result.stdout + result.stderr
        failure = result.failure
        if failure is None:
            code = result.exit_code
            if code is None:
                code = 128 + result.signal if result.signal else -1
            return {"output": text, "returncode": code, "exception_info": ""}
        if failure.kind == "timeout":
            if legacy:
                raise subprocess.TimeoutExpired(command, limit, output=result.stdout_bytes + result.stderr_bytes)
            exc = subprocess.TimeoutExpired(command, limit)
            return {
                "output": text,
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {exc}",
                "extra": {
                    "exception_type": "TimeoutExpired",
                    "exception": str(exc),
                    "failure_kind": failure.kind,
                    "retryable": failure.retryable,
                },
            }
        if legacy and failure.kind not in ("oom_killed", "spawn_failed"):
            result.raise_for_failure()
        code = {"oom_killed": 137, "spawn_failed": 127}.get(failure.kind, -1)
        out: Dict[str, Any] = {
            "output": text + ("" if not text or text.endswith("\n") else "\n") + failure.message + "\n",
            "returncode": code,
            "exception_info": f"An error occurred while executing the command: {failure.message}",
            "extra": {
                "exception_type": type(_as_error(result)).__name__,
                "exception": failure.message,
                "failure_kind": failure.kind,
                "retryable": failure.retryable,
            },
        }
        if legacy:
            out.pop("exception_info")
            out.pop("extra")
        return out

    def _check_finished(self, output: Dict[str, Any]) -> None:
        """Raises ``Submitted`` when the output says the task is complete."""
        lines = str(output.get("output", "")).lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == FINAL_MARKER and output.get("returncode") == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> Dict[str, Any]:
        return recursive_merge(self.config.model_dump(), kwargs)

    def serialize(self) -> Dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                }
            }
        }

    def cleanup(self) -> None:
        """Delete the sandbox (its container is removed)."""
        sb, self._sandbox = getattr(self, "_sandbox", None), None
        try:
            if sb is not None:
                sb.delete()
        except CorralError as err:
            self.logger.warning("could not delete corral sandbox %s: %s", sb.id if sb else "?", err)
        finally:
            if getattr(self, "_owns_client", False) and getattr(self, "_client", None) is not None:
                self._client.close()
                self._client = None  # type: ignore[assignment]

    def __enter__(self) -> "CorralEnvironment":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()

    def __del__(self) -> None:
        try:
            self.cleanup()
        except Exception:
            pass


def _as_error(result: CommandResult) -> CorralError:
    from ..errors import error_from_failure

    return error_from_failure(result)
