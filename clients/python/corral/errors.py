"""Exceptions: one class per failure kind, each with ``kind``, ``message`` and
``retryable``.

Two sources produce them:

* an error answer of the service (HTTP 4xx/5xx with
  ``{"error": {"kind", "message", "field", "retryable"}}``), and
* a command result whose ``failure`` is set (the command timed out, was
  OOM-killed, lost its container, ...): the exception then carries the
  :class:`~corral.CommandResult` as ``result``, with whatever output the
  command produced before it failed.

``retryable`` says whether doing the same thing again may succeed (a lost
container, an unreachable daemon, a full cluster); a timeout, an OOM kill or a bad spec will
fail the same way again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Type

if TYPE_CHECKING:  # pragma: no cover
    from .models import CommandResult

__all__ = [
    "CorralError",
    "ConflictError",
    "SnapshotNotFoundError",
    "ServiceUnavailableError",
    "ServiceOverloadedError",
    "AuthenticationError",
    "InvalidRequestError",
    "InvalidSpecError",
    "ImageNotFoundError",
    "UnsupportedError",
    "NotFoundError",
    "SandboxNotFoundError",
    "ShellNotFoundError",
    "SandboxFileNotFoundError",
    "TooLargeError",
    "FileOperationError",
    "SandboxTimeoutError",
    "SandboxOOMError",
    "SandboxContainerLostError",
    "DaemonUnavailableError",
    "CapacityError",
    "SpawnFailedError",
    "AgentError",
    "InternalError",
    "CommandFailedError",
    "error_from_response",
    "error_from_failure",
]


class CorralError(Exception):
    """Base of every error the client raises.

    Attributes:
        kind: the service's kind string (``timeout``, ``oom_killed``,
            ``container_lost``, ``not_found``, ...).
        message: what happened, as the service said it.
        retryable: whether the same call may succeed later.
        status: the HTTP status of an error answer, else ``None``.
        field: the request field at fault (``spec.limits.memory``, ``path``...),
            else ``None``.
        result: the :class:`~corral.CommandResult` for a failed command, else
            ``None``.
        container: the container's state the service attached to a failure
            (a dict: ``id``, ``status``, ``exit_code``, ``oom_killed``, ...),
            else ``None``.
    """

    default_kind = "error"
    default_retryable = False

    def __init__(
        self,
        message: str,
        *,
        kind: Optional[str] = None,
        retryable: Optional[bool] = None,
        status: Optional[int] = None,
        field: Optional[str] = None,
        result: Optional["CommandResult"] = None,
        container: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind or self.default_kind
        self.retryable = self.default_retryable if retryable is None else bool(retryable)
        self.status = status
        self.field = field
        self.result = result
        self.container = dict(container) if container is not None else None

    def __str__(self) -> str:
        parts = [self.message or self.kind]
        extra = [f"kind={self.kind}"]
        if self.field:
            extra.append(f"field={self.field}")
        if self.status is not None:
            extra.append(f"status={self.status}")
        if self.retryable:
            extra.append("retryable")
        return f"{parts[0]} ({', '.join(extra)})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, message={self.message!r}, retryable={self.retryable!r})"


class ServiceUnavailableError(CorralError):
    """The corral service could not be reached (connection refused, reset,
    timed out) or is shutting down. Retryable."""

    default_kind = "service_unavailable"
    default_retryable = True


class ServiceOverloadedError(ServiceUnavailableError):
    """503 ``overloaded``: the service's own ceilings on work in flight
    (``server.limits``: its buffer budget or its concurrent commands) are
    reached, and nothing of the request ran, so sending it again is safe.
    Retryable once requests in flight finish; the answer carries
    ``Retry-After``."""

    default_kind = "overloaded"
    default_retryable = True


class AuthenticationError(CorralError):
    """401: the service needs ``Authorization: Bearer TOKEN`` and got none or
    a wrong one. A local service's generated token is found by itself; for
    others set ``token=`` or ``$CORRAL_TOKEN``."""

    default_kind = "unauthorized"


class ForbiddenError(CorralError, PermissionError):
    """403: the service refuses this request: its policy keeps a spec field
    from clients (host mounts, capabilities, weakened hardening, runtime,
    host environment, ``corral.*`` labels, ``persistent``, limits above its
    maxima, an image it does not allow), or a header (``Origin``, ``Host``).
    ``field`` names it, e.g. ``spec.mounts[0]``."""

    default_kind = "forbidden"


class InvalidRequestError(CorralError, ValueError):
    """400: a request field is wrong; ``field`` names it."""

    default_kind = "invalid_request"


class InvalidSpecError(InvalidRequestError):
    """400: the sandbox spec is invalid; ``field`` names the key at fault
    (e.g. ``spec.limits.memory``)."""

    default_kind = "invalid_spec"


class ImageNotFoundError(InvalidRequestError):
    """The image is neither present on the daemon nor pullable."""

    default_kind = "image_not_found"


class UnsupportedError(InvalidRequestError):
    """The daemon or host cannot do what the spec asks (a disk limit on a
    storage driver without quotas, an unknown runtime, ...)."""

    default_kind = "unsupported"


class NotFoundError(CorralError, LookupError):
    """404: no such sandbox, shell session or file."""

    default_kind = "not_found"


class SandboxNotFoundError(NotFoundError):
    """404: no sandbox with this id (never created, deleted, or evicted)."""


class ShellNotFoundError(NotFoundError):
    """404: no shell session of this name."""


class SandboxFileNotFoundError(NotFoundError, FileNotFoundError):
    """404: no file at this path inside the sandbox. Also a builtin
    :class:`FileNotFoundError`."""

    def __init__(self, message: str, **kwargs: Any) -> None:
        NotFoundError.__init__(self, message, **kwargs)

    def __str__(self) -> str:
        return NotFoundError.__str__(self)


class SnapshotNotFoundError(NotFoundError):
    """404: no snapshot of this name."""


class ConflictError(InvalidRequestError):
    """409: the request conflicts with what exists: a snapshot that forked
    sandboxes still use, or a session key that already has a sandbox."""


class TooLargeError(CorralError):
    """413: a body or file over the service's size limit."""

    default_kind = "too_large"


class FileOperationError(CorralError, OSError):
    """A file operation failed inside the sandbox (not a directory, permission
    denied, ...)."""

    default_kind = "file_error"

    def __init__(self, message: str, **kwargs: Any) -> None:
        CorralError.__init__(self, message, **kwargs)

    def __str__(self) -> str:
        return CorralError.__str__(self)


class SandboxTimeoutError(CorralError, TimeoutError):
    """The command ran past its timeout; its whole process tree was killed.
    ``result`` holds the output it produced until then. Not retryable: the
    same command would time out again."""

    default_kind = "timeout"

    def __init__(self, message: str, **kwargs: Any) -> None:
        CorralError.__init__(self, message, **kwargs)

    def __str__(self) -> str:
        return CorralError.__str__(self)


class SandboxOOMError(CorralError, MemoryError):
    """The command (or the sandbox) was killed for running out of memory."""

    default_kind = "oom_killed"

    def __init__(self, message: str, **kwargs: Any) -> None:
        CorralError.__init__(self, message, **kwargs)

    def __str__(self) -> str:
        return CorralError.__str__(self)


class SandboxContainerLostError(CorralError):
    """The sandbox's container disappeared (removed or killed out-of-band, the
    daemon restarted). Retryable in a new sandbox (or with ``recovery:
    recreate``)."""

    default_kind = "container_lost"
    default_retryable = True


class DaemonUnavailableError(CorralError):
    """The container daemon behind the service does not answer. Retryable."""

    default_kind = "daemon_unavailable"
    default_retryable = True


class CapacityError(DaemonUnavailableError):
    """The engine has no room for the sandbox now (on Kubernetes: no node
    can take the pod, e.g. too little memory or CPU, a quota). Retryable
    later, when sandboxes end or the cluster grows; the service's answer
    carries ``Retry-After``. A :class:`DaemonUnavailableError`, as the
    service reported it before it had a kind of its own."""

    default_kind = "capacity"
    default_retryable = True


class SpawnFailedError(CorralError):
    """The command could not be started (no such program, bad cwd, ...)."""

    default_kind = "spawn_failed"


class AgentError(CorralError):
    """corral lost its control stream to the sandbox's agent while the
    container kept running, or the agent did not answer. Retryable."""

    default_kind = "agent_error"
    default_retryable = True


class ProtocolViolationError(CorralError):
    """The sandbox's control stream carried something the agent never sends
    (a frame for a command corral did not start, output after the exit
    report, ...). The sandbox is finished and nothing it reported can be
    trusted. Not retryable: evidence of tampering or a bug, not a passing
    fault."""

    default_kind = "protocol_violation"


class InternalError(CorralError):
    """500: the service failed in a way it did not classify."""

    default_kind = "internal"


class CommandFailedError(CorralError):
    """Raised by ``run(..., check=True)`` when the command exited non-zero.
    ``result`` holds its output; ``exit_code`` its exit code."""

    default_kind = "nonzero_exit"

    @property
    def exit_code(self) -> Optional[int]:
        return self.result.exit_code if self.result is not None else None


_BY_KIND: Dict[str, Type[CorralError]] = {
    "unauthorized": AuthenticationError,
    "forbidden": ForbiddenError,
    "invalid_request": InvalidRequestError,
    "invalid_spec": InvalidSpecError,
    "image_not_found": ImageNotFoundError,
    "unsupported": UnsupportedError,
    "not_found": NotFoundError,
    "too_large": TooLargeError,
    "conflict": ConflictError,
    "file_error": FileOperationError,
    "timeout": SandboxTimeoutError,
    "oom_killed": SandboxOOMError,
    "container_lost": SandboxContainerLostError,
    "daemon_unavailable": DaemonUnavailableError,
    "capacity": CapacityError,
    "spawn_failed": SpawnFailedError,
    "agent_error": AgentError,
    "protocol_violation": ProtocolViolationError,
    "internal": InternalError,
    "shutting_down": ServiceUnavailableError,
    "overloaded": ServiceOverloadedError,
    "service_unavailable": ServiceUnavailableError,
}

# Which resource a 404 is about, by the route's last resource.
_NOT_FOUND_BY_RESOURCE: Dict[str, Type[NotFoundError]] = {
    "sandbox": SandboxNotFoundError,
    "shell": ShellNotFoundError,
    "file": SandboxFileNotFoundError,
    "snapshot": SnapshotNotFoundError,
}


def _class_for(kind: str, status: Optional[int]) -> Type[CorralError]:
    cls = _BY_KIND.get(kind)
    if cls is not None:
        return cls
    if status == 401:
        return AuthenticationError
    if status == 403:
        return ForbiddenError
    if status == 404:
        return NotFoundError
    if status == 413:
        return TooLargeError
    if status == 503:
        return ServiceUnavailableError
    if status is not None and 400 <= status < 500:
        return InvalidRequestError
    if status is not None and status >= 500:
        return InternalError
    return CorralError


def _not_found_class(message: str, field: Optional[str], resource: Optional[str]) -> Type[NotFoundError]:
    """Narrow a 404 to the missing thing: by the field the service names,
    else by its message, else by the route (a file route may be missing its
    sandbox rather than its file)."""
    if resource == "snapshot":
        # Snapshot routes name only snapshots in a 404.
        return SnapshotNotFoundError
    if field in ("id", "sandbox", "session"):
        return SandboxNotFoundError
    if field in ("name", "shell"):
        return ShellNotFoundError
    if field == "path":
        return SandboxFileNotFoundError
    low = message.lower()
    if "no such route" in low:
        return NotFoundError
    if "shell session" in low:
        return ShellNotFoundError
    if low.startswith("no sandbox") or (low.startswith("sandbox '") and " is gone" in low):
        return SandboxNotFoundError
    return _NOT_FOUND_BY_RESOURCE.get(resource or "", NotFoundError)


def error_from_response(
    status: int, body: Any, *, resource: Optional[str] = None, text: str = ""
) -> CorralError:
    """The exception for an error answer: ``status`` and its parsed JSON
    ``body`` (or ``None`` when it was not JSON; then ``text`` is used).
    ``resource`` (``sandbox``, ``shell``, ``file``) narrows a 404."""
    detail: Mapping[str, Any] = {}
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        detail = body["error"]
    kind = str(detail.get("kind") or "")
    message = str(detail.get("message") or text.strip() or f"HTTP {status}")
    field = detail.get("field")
    retryable = detail.get("retryable")
    if not kind:
        kind = {401: "unauthorized", 403: "forbidden", 404: "not_found", 413: "too_large", 503: "service_unavailable"}.get(
            status, "http_error"
        )
    cls = _class_for(kind, status)
    if cls is NotFoundError:
        cls = _not_found_class(message, field if isinstance(field, str) else None, resource)
    return cls(
        message,
        kind=kind,
        retryable=retryable if isinstance(retryable, bool) else None,
        status=status,
        field=field if isinstance(field, str) else None,
    )


def error_from_failure(result: "CommandResult") -> CorralError:
    """The exception for a command result whose ``failure`` is set; it
    carries the result."""
    failure = result.failure
    assert failure is not None, "error_from_failure needs a result with a failure"
    cls = _class_for(failure.kind, None)
    if cls is ServiceUnavailableError:
        cls = CorralError
    return cls(
        failure.message or failure.kind,
        kind=failure.kind,
        retryable=failure.retryable,
        result=result,
        container=failure.container,
    )


class ResultIntegrityWarning(UserWarning):
    """Warned when a sandbox is created under a tier that does not hold
    result integrity (``SandboxInfo.result_integrity`` is ``False``): a
    command in it could forge what the service reports of another command,
    an ``exclusive`` grader's result included. The message says why."""
