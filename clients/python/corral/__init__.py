"""Python client for corral's HTTP API (``corral serve``): hardened container
sandboxes for AI agents and RL rollouts.

::

    from corral import Sandbox

    with Sandbox() as sb:                        # POST /v1/sandboxes; deleted on exit
        r = sb.run("echo hello", timeout=10)
        print(r.exit_code, r.stdout)

The service is ``$CORRAL_URL`` (default ``http://127.0.0.1:7070``) with the
bearer token ``$CORRAL_TOKEN``, else the one a local service generated
(:func:`find_token` reads it from the service's token file). ``corral.aio`` has the same
API for asyncio (``AsyncClient``, ``AsyncSandbox``).
"""

from ._core import RetryPolicy
from ._discovery import find_token
from ._version import __version__
from .aio import AsyncClient, AsyncCommandStream, AsyncSandbox, AsyncShell
from .client import Client, CommandStream, Sandbox, Shell
from .code import CodeContext, Execution, ExecutionError, Logs, Result
from .errors import (
    AgentError,
    AuthenticationError,
    CommandFailedError,
    ConflictError,
    CapacityError,
    CorralError,
    DaemonUnavailableError,
    FileOperationError,
    ForbiddenError,
    ImageNotFoundError,
    InternalError,
    InvalidRequestError,
    ProtocolViolationError,
    InvalidSpecError,
    ResultIntegrityWarning,
    NotFoundError,
    SandboxContainerLostError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
    SandboxOOMError,
    SandboxTimeoutError,
    ServiceOverloadedError,
    ServiceUnavailableError,
    ShellNotFoundError,
    SnapshotNotFoundError,
    SpawnFailedError,
    TooLargeError,
    UnsupportedError,
)
from .models import CommandResult, CommandUsage, Failure, FileEntry, Health, ResetResult, SandboxInfo, Snapshot, StreamEvent, WhoAmI

__all__ = [
    "__version__",
    "Client",
    "Sandbox",
    "Shell",
    "CommandStream",
    "AsyncClient",
    "AsyncSandbox",
    "AsyncShell",
    "AsyncCommandStream",
    "RetryPolicy",
    "find_token",
    "CommandResult",
    "CodeContext",
    "Execution",
    "ExecutionError",
    "Logs",
    "Result",
    "CommandUsage",
    "Failure",
    "FileEntry",
    "Health",
    "SandboxInfo",
    "ResetResult",
    "Snapshot",
    "StreamEvent",
    "WhoAmI",
    "CorralError",
    "ServiceUnavailableError",
    "ServiceOverloadedError",
    "AuthenticationError",
    "ForbiddenError",
    "InvalidRequestError",
    "InvalidSpecError",
    "ImageNotFoundError",
    "UnsupportedError",
    "NotFoundError",
    "SandboxNotFoundError",
    "ShellNotFoundError",
    "SnapshotNotFoundError",
    "ConflictError",
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
    "ProtocolViolationError",
    "InternalError",
    "CommandFailedError",
    "ResultIntegrityWarning",
]
