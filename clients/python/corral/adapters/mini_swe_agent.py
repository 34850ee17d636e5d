"""A drop-in for mini-swe-agent's environments (``DockerEnvironment``,
``LocalEnvironment``) running on corral.

The one-line switch, in a mini-swe-agent YAML config::

    environment:
      environment_class: corral.adapters.mini_swe_agent.CorralEnvironment
      image: python:3.12-slim        # the rest of DockerEnvironment's keys work as before

or in Python, where ``DockerEnvironment`` was imported::

    from corral.adapters.mini_swe_agent import CorralEnvironment as DockerEnvironment

``CorralEnvironment(**kwargs)`` takes ``DockerEnvironmentConfig``'s keys
(``image``, ``cwd``, ``env``, ``forward_env``, ``timeout``, ``interpreter``,
``container_timeout``; the Docker-CLI-only ``executable``, ``run_args`` and
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
* ``get_template_vars(**kwargs)``: the config, ``platform.uname()``'s keys
  (``system``, ``release``, ``version``, ``machine``, ``node``, as
  ``DockerEnvironment`` gives them: the stock ``mini.yaml`` and
  ``default.yaml`` templates need them) and ``kwargs`` (the token is never
  included); ``serialize()``; ``cleanup()`` deletes the sandbox.

As ``DockerEnvironment`` does:

* the configured ``cwd`` is created when the image lacks it (``docker run -w``
  creates it), so ``swebench.yaml``'s ``/testbed`` works on any image;
* ``container_timeout`` (``sleep``'s syntax: ``"2h"``, ``"30m"``, ``"90"``,
  ``"infinity"``) bounds the sandbox's life: after it the sandbox is deleted
  and commands fail, as ``docker exec`` into the stopped container does;
* the output is all of it: up to ``max_output`` bytes (default 64 MiB) per
  command. Beyond that corral keeps the head and the tail, and the text says
  so at the cut (``[... N bytes elided by corral ...]``): it never joins
  them silently;
* a command returns when its output streams close, so a background job that
  keeps them open is waited for (bounded by the timeout), as ``docker exec``
  waits for it (with a client that has ``wait_for_output``).

The sandbox is deleted by ``cleanup()``, when the environment is garbage
collected, at interpreter exit (a crash included) and on SIGTERM (the handler
chains to the one it replaced): never left running. ``DockerEnvironment``
relies on ``__del__``, which fails during interpreter shutdown.

Deliberate differences (corral is stricter):

* a timed-out command's whole process tree is killed, where ``docker exec``
  leaves the command's children running in the container;
* stdout and stderr keep the order in which they were written (both go to one
  pipe inside the sandbox), where the Docker CLI's demultiplexing may reorder
  them;
* an invalid ``container_timeout`` raises ``ValueError`` at construction,
  where Docker starts a container whose ``sleep`` exits at once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union

from ..client import Client, Sandbox
from ..errors import CorralError
from ..models import CommandResult
from . import _output, _reaper

__all__ = ["CorralEnvironment", "CorralEnvironmentConfig", "Submitted", "parse_container_timeout", "recursive_merge"]

FINAL_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

#: Bytes of output kept per command by default: "everything", as
#: ``DockerEnvironment`` returns, within a bound (head and tail beyond it).
DEFAULT_MAX_OUTPUT = 64 << 20

_SLEEP_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_container_timeout(value: Union[str, int, float]) -> Optional[float]:
    """``sleep``'s duration (``"2h"``, ``"30m"``, ``"90"``, ``"1.5d"``) in
    seconds; ``None`` for ``"infinity"``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip().lower()
    if text in ("inf", "infinity"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)([smhd]?)", text)
    if not m:
        raise ValueError(f"container_timeout: expected a duration like '2h', '30m' or '90', got {value!r}")
    return float(m.group(1)) * _SLEEP_UNITS[m.group(2)]

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
    container_timeout: str = "2h"
    """Max duration to keep the sandbox (``sleep``'s syntax); then it is deleted."""
    # Docker CLI keys of DockerEnvironmentConfig: accepted, not used.
    executable: str = "docker"
    run_args: List[str] = field(default_factory=lambda: ["--rm"])
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
    """Bytes of output kept per command; ``None``: 64 MiB. Beyond it the head
    and the tail are kept, joined by a line saying how many bytes were elided."""

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
        lifetime = parse_container_timeout(self.config.container_timeout)
        self._owns_client = client is None
        self._client = client or Client(self.config.base_url, token=self.config.token)
        self._sandbox: Optional[Sandbox] = None
        self._reaper_key: Optional[int] = None
        self._expiry: Optional[threading.Timer] = None
        try:
            self._sandbox = self._client.sandbox(
                image=self.config.image if self.config.spec is None else None,
                spec=self._spec(),
                profile=self.config.profile,
                session=self.config.session,
            )
            self._reaper_key = _reaper.track(
                self._sandbox.id, _reaper.client_factory(self.config.base_url, self.config.token, client)
            )
            self._make_cwd()
        except BaseException:
            self.cleanup()
            raise
        if lifetime is not None:
            # `docker run ... sleep <container_timeout>`: the container ends then.
            self._expiry = threading.Timer(lifetime, _reaper.delete_now, args=(self._reaper_key,))
            self._expiry.daemon = True
            self._expiry.start()
        self.logger.info("Started corral sandbox %s (container %s)", self._sandbox.id, self.container_id)

    def _make_cwd(self) -> None:
        """``docker run -w DIR`` creates DIR when the image lacks it."""
        cwd = self.config.cwd
        if not cwd or cwd == "/":
            return
        r = self.sandbox.run(["mkdir", "-p", cwd], timeout=60, raise_on_failure=False)
        if r.failure is not None or r.exit_code != 0:
            self.logger.warning("could not create the working directory %s: %s", cwd, r.output.strip())

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
                max_output=self.config.max_output or DEFAULT_MAX_OUTPUT,
                raise_on_failure=False,
                **_output.wait_for_output_kwargs(self.sandbox),
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
        # The interpreter's stderr goes to stdout inside the sandbox; stderr only
        # holds what /bin/sh itself said.
        text = _output.joined(result.stdout_bytes, result.stdout_truncated, result.stdout_total_bytes)
        text += _output.joined(result.stderr_bytes, result.stderr_truncated, result.stderr_total_bytes)
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
        return recursive_merge(self.config.model_dump(), platform.uname()._asdict(), kwargs)

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
        expiry, self._expiry = getattr(self, "_expiry", None), None
        if expiry is not None:
            expiry.cancel()
        sb, self._sandbox = getattr(self, "_sandbox", None), None
        key, self._reaper_key = getattr(self, "_reaper_key", None), None
        try:
            if sb is not None:
                sb.delete()
            _reaper.release(key)
        except CorralError as err:
            self.logger.warning("could not delete corral sandbox %s: %s", sb.id if sb else "?", err)
            # Left registered: the exit hook tries again.
        finally:
            if getattr(self, "_owns_client", False) and getattr(self, "_client", None) is not None:
                self._client.close()
                self._client = None  # type: ignore[assignment]

    def __enter__(self) -> "CorralEnvironment":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()

    def __del__(self) -> None:
        # During interpreter shutdown imports fail; the exit hook of
        # corral.adapters._reaper has deleted the sandbox by then.
        if sys.is_finalizing():
            return
        try:
            self.cleanup()
        except Exception:
            pass


def _as_error(result: CommandResult) -> CorralError:
    from ..errors import error_from_failure

    return error_from_failure(result)
