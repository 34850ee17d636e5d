"""Python client for corral's HTTP API (``corral serve``): hardened container
sandboxes for AI agents and RL rollouts.

::

    from corral import Sandbox

    with Sandbox() as sb:                        # POST /v1/sandboxes; deleted on exit
        r = sb.run("echo hello", timeout=10)
        print(r.exit_code, r.stdout)

The service is ``$CORRAL_URL`` (default ``http://127.0.0.1:7070``) with the
bearer token ``$CORRAL_TOKEN`` when it needs one. ``corral.aio`` has the same
API for asyncio (``AsyncClient``, ``AsyncSandbox``).
"""

from ._core import RetryPolicy
from ._version import __version__
from .aio import AsyncClient, AsyncCommandStream, AsyncSandbox, AsyncShell
from .client import Client, CommandStream, Sandbox, Shell
from .errors import (
    AgentError,
    AuthenticationError,
    CommandFailedError,
    CorralError,
    DaemonUnavailableError,
    FileOperationError,
    ImageNotFoundError,
    InternalError,
    InvalidRequestError,
    ProtocolViolationError,
    InvalidSpecError,
    NotFoundError,
    SandboxContainerLostError,
    SandboxFileNotFoundError,
    SandboxNotFoundError,
    SandboxOOMError,
    SandboxTimeoutError,
    ServiceUnavailableError,
    ShellNotFoundError,
    SpawnFailedError,
    TooLargeError,
    UnsupportedError,
)
from .models import CommandResult, Failure, FileEntry, Health, SandboxInfo, StreamEvent

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
    "CommandResult",
    "Failure",
    "FileEntry",
    "Health",
    "SandboxInfo",
    "StreamEvent",
    "CorralError",
    "ServiceUnavailableError",
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
    "SpawnFailedError",
    "AgentError",
    "ProtocolViolationError",
    "InternalError",
    "CommandFailedError",
]
