"""The service's JSON shapes as dataclasses."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

__all__ = [
    "Failure",
    "CommandUsage",
    "CommandResult",
    "SandboxInfo",
    "ResetResult",
    "FileEntry",
    "StreamEvent",
    "Health",
    "Snapshot",
    "WhoAmI",
]


def _b64(value: Any) -> Optional[bytes]:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


@dataclass(frozen=True)
class Failure:
    """Why a command did not complete normally.

    ``kind`` is one of ``timeout``, ``oom_killed``, ``container_lost``,
    ``daemon_unavailable``, ``capacity``, ``image_not_found``,
    ``invalid_spec``, ``unsupported``, ``spawn_failed``, ``agent_error``,
    ``protocol_violation`` (or a kind a newer service added); ``retryable`` says whether running it again may succeed.
    """

    kind: str
    message: str = ""
    retryable: bool = False
    container: Optional[Dict[str, Any]] = None

    @classmethod
    def from_json(cls, data: Optional[Mapping[str, Any]]) -> Optional["Failure"]:
        if not data:
            return None
        container = data.get("container")
        return cls(
            kind=str(data.get("kind") or "unknown"),
            message=str(data.get("message") or ""),
            retryable=bool(data.get("retryable", False)),
            container=dict(container) if isinstance(container, Mapping) else None,
        )


@dataclass(frozen=True)
class CommandUsage:
    """What a command's processes used, as the sandbox's agent measured them.

    ``cpu_ms`` is user and kernel CPU time together (``cpu_user_ms`` +
    ``cpu_system_ms``) of the command's main process, every descendant it
    waited for, and the orphans of its process group reaped before it ended.
    ``peak_memory_bytes`` is the largest resident set one of those processes
    reached: the biggest process's peak, not the sum over processes.
    Background processes still running when the command ended, and those
    that left its process group (``setsid``), are not counted.
    """

    cpu_ms: float
    cpu_user_ms: float
    cpu_system_ms: float
    peak_memory_bytes: int

    @classmethod
    def from_json(cls, data: Any) -> Optional["CommandUsage"]:
        if not isinstance(data, Mapping):
            return None
        return cls(
            cpu_ms=float(data.get("cpu_ms") or 0.0),
            cpu_user_ms=float(data.get("cpu_user_ms") or 0.0),
            cpu_system_ms=float(data.get("cpu_system_ms") or 0.0),
            peak_memory_bytes=int(data.get("peak_memory_bytes") or 0),
        )


@dataclass
class CommandResult:
    """A command's outcome.

    ``stdout``/``stderr`` are text (UTF-8, with U+FFFD where the bytes were
    not UTF-8); ``stdout_bytes``/``stderr_bytes`` are the exact bytes. When
    output went over ``max_output`` its head and tail are kept and
    ``*_truncated`` is set; ``*_total_bytes`` count everything the command
    wrote. ``usage`` says what its processes used (CPU time, peak memory; see
    :class:`CommandUsage`), ``None`` where the agent did not measure it (shell
    sessions). ``failure`` is ``None`` when the command ran to its exit,
    whatever its exit code. Shell-session results also say whether the shell was
    ``restarted`` before the command (earlier state lost) or ``ended`` after it,
    how many bytes background jobs printed since the previous command
    (``dropped_between_bytes``, dropped), and ``trusted``: always ``False`` for
    shell results, whose exit code a command can fake; grade with ``run``.
    """

    exit_code: Optional[int] = None
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    signal: Optional[int] = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_total_bytes: int = 0
    stderr_total_bytes: int = 0
    duration_ms: float = 0.0
    usage: Optional[CommandUsage] = None
    failure: Optional[Failure] = None
    sandbox_id: Optional[str] = None
    restarted: Optional[bool] = None
    ended: Optional[bool] = None
    dropped_between_bytes: Optional[int] = None
    trusted: Optional[bool] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "CommandResult":
        stdout = data.get("stdout") or ""
        stderr = data.get("stderr") or ""
        stdout_bytes = _b64(data.get("stdout_base64"))
        stderr_bytes = _b64(data.get("stderr_base64"))
        restarted = data.get("restarted")
        ended = data.get("ended")
        dropped = data.get("dropped_between_bytes")
        trusted = data.get("trusted")
        exit_code = data.get("exit_code")
        sig = data.get("signal")
        return cls(
            exit_code=int(exit_code) if exit_code is not None else None,
            stdout=stdout,
            stderr=stderr,
            stdout_bytes=stdout_bytes if stdout_bytes is not None else stdout.encode("utf-8"),
            stderr_bytes=stderr_bytes if stderr_bytes is not None else stderr.encode("utf-8"),
            signal=int(sig) if sig is not None else None,
            stdout_truncated=bool(data.get("stdout_truncated", False)),
            stderr_truncated=bool(data.get("stderr_truncated", False)),
            stdout_total_bytes=int(data.get("stdout_total_bytes") or 0),
            stderr_total_bytes=int(data.get("stderr_total_bytes") or 0),
            duration_ms=float(data.get("duration_ms") or 0.0),
            usage=CommandUsage.from_json(data.get("usage")),
            failure=Failure.from_json(data.get("failure")),
            sandbox_id=data.get("sandbox_id"),
            restarted=bool(restarted) if restarted is not None else None,
            ended=bool(ended) if ended is not None else None,
            dropped_between_bytes=int(dropped) if dropped is not None else None,
            trusted=bool(trusted) if trusted is not None else None,
            raw=dict(data),
        )

    @property
    def ok(self) -> bool:
        """The command ran to its exit with code 0."""
        return self.failure is None and self.exit_code == 0

    @property
    def truncated(self) -> bool:
        """Either stream was cut to its cap."""
        return self.stdout_truncated or self.stderr_truncated

    @property
    def output(self) -> str:
        """stdout followed by stderr."""
        return self.stdout + self.stderr

    @property
    def duration(self) -> float:
        """Wall time in seconds."""
        return self.duration_ms / 1000.0

    def raise_for_failure(self) -> "CommandResult":
        """Raise the typed exception when ``failure`` is set; else return self."""
        if self.failure is not None:
            from .errors import error_from_failure

            raise error_from_failure(self)
        return self

    def check(self) -> "CommandResult":
        """Raise when the command failed or exited non-zero; else return self."""
        self.raise_for_failure()
        if self.exit_code != 0:
            from .errors import CommandFailedError

            tail = (self.stderr or self.stdout).strip().splitlines()[-3:]
            msg = f"command exited with code {self.exit_code}"
            if tail:
                msg += ": " + " | ".join(tail)
            raise CommandFailedError(msg, result=self)
        return self


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as the service describes it. ``id`` (the session key) is the
    handle of every route; ``sandbox_id`` is corral's id of the current
    container incarnation; ``container_id`` the Docker container.
    ``resets_in_place`` says whether :meth:`Sandbox.reset` resets it in
    place (in milliseconds); when not, ``reset_unavailable_reason`` says why
    (a reset then replaces its container). ``owner`` is the principal it
    belongs to: ``tenant:NAME``, ``operator`` or ``mcp:TENANT:SESSION``
    (``None`` from a service without principals). ``result_integrity`` is
    ``False`` where the sandbox's tier lets a command forge what the service
    reports of another (e.g. ``isolation: gvisor`` for a sandbox that starts
    as a user, which only the service's configuration may choose), and
    ``result_integrity_gap`` then
    says why; ``None`` from a service that does not say."""

    id: str
    session: Optional[str] = None
    sandbox_id: Optional[str] = None
    owner: Optional[str] = None
    container_id: Optional[str] = None
    image: Optional[str] = None
    profile: Optional[str] = None
    persistent: bool = False
    alive: bool = True
    shells: List[str] = field(default_factory=list)
    resets_in_place: bool = False
    reset_unavailable_reason: Optional[str] = None
    result_integrity: Optional[bool] = None
    result_integrity_gap: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "SandboxInfo":
        return cls(
            id=str(data["id"]),
            session=data.get("session", data.get("id")),
            sandbox_id=data.get("sandbox_id"),
            owner=data.get("owner"),
            container_id=data.get("container_id"),
            image=data.get("image"),
            profile=data.get("profile"),
            persistent=bool(data.get("persistent", False)),
            alive=bool(data.get("alive", True)),
            shells=list(data.get("shells") or []),
            resets_in_place=bool(data.get("resets_in_place", False)),
            reset_unavailable_reason=data.get("reset_unavailable_reason"),
            result_integrity=None if data.get("result_integrity") is None else bool(data["result_integrity"]),
            result_integrity_gap=data.get("result_integrity_gap"),
            raw=dict(data),
        )


@dataclass(frozen=True)
class ResetResult:
    """What :meth:`Sandbox.reset` did. Either way the sandbox is back in its
    state right after start (every process killed, every file change undone,
    shell sessions closed).

    ``mode`` is ``in_place`` (by the sandbox's agent, in milliseconds) or
    ``replaced`` (its container was replaced by a new one from the same
    spec); ``fallback_reason`` says why it was not in place (``None`` when it
    was); ``killed`` counts the processes an in-place reset killed;
    ``elapsed_ms`` is the time the reset took.
    """

    mode: str
    fallback_reason: Optional[str] = None
    killed: int = 0
    elapsed_ms: float = 0.0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ResetResult":
        return cls(
            mode=str(data.get("mode", "")),
            fallback_reason=data.get("fallback_reason"),
            killed=int(data.get("killed") or 0),
            elapsed_ms=float(data.get("elapsed_ms") or 0.0),
            raw=dict(data),
        )

    @property
    def in_place(self) -> bool:
        """The reset was done in place."""
        return self.mode == "in_place"


@dataclass(frozen=True)
class FileEntry:
    """One directory entry: ``type`` is ``file``, ``dir``, ``symlink`` or
    ``other``; ``mode`` the permission bits; ``target`` a symlink's target as
    stored (not resolved); ``mtime`` the last modification in seconds since
    the epoch; ``uid``/``gid`` the numeric owner and group, ``owner``/``group``
    their names in the sandbox's /etc/passwd and /etc/group (None when not
    named there)."""

    name: str
    type: str
    size: int = 0
    mode: int = 0
    target: Optional[str] = None
    mtime: float = 0.0
    uid: int = 0
    gid: int = 0
    owner: Optional[str] = None
    group: Optional[str] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "FileEntry":
        return cls(
            name=str(data.get("name", "")),
            type=str(data.get("type", "other")),
            size=int(data.get("size") or 0),
            mode=int(data.get("mode") or 0),
            target=data.get("target"),
            mtime=float(data.get("mtime") or 0.0),
            uid=int(data.get("uid") or 0),
            gid=int(data.get("gid") or 0),
            owner=data.get("owner"),
            group=data.get("group"),
        )

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"


@dataclass(frozen=True)
class StreamEvent:
    """One event of :meth:`Sandbox.stream`.

    ``kind`` is ``stdout`` or ``stderr`` for an output chunk (``text`` as
    UTF-8, lossy; ``data`` the exact bytes) and ``result`` for the last event
    (``result`` set). An interactive or terminal stream begins with
    ``started``: its input is open from then on.
    """

    kind: str
    text: str = ""
    data: bytes = b""
    result: Optional[CommandResult] = None

    @property
    def is_output(self) -> bool:
        return self.kind in ("stdout", "stderr")


@dataclass(frozen=True)
class Health:
    """``GET /v1/health``: ``status`` is ``ok`` when the daemon answers."""

    status: str
    version: str = ""
    daemon_endpoint: str = ""
    daemon_reachable: bool = False
    daemon_error: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Health":
        daemon = data.get("daemon") or {}
        return cls(
            status=str(data.get("status", "")),
            version=str(data.get("version", "")),
            daemon_endpoint=str(daemon.get("endpoint", "")),
            daemon_reachable=bool(daemon.get("reachable", False)),
            daemon_error=daemon.get("error"),
            raw=dict(data),
        )

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class Snapshot:
    """A snapshot: a sandbox's file system kept under ``name``, to fork
    sandboxes from (:meth:`Client.fork`). ``name`` is as the caller names
    it: bare for its own (and the operator's shared with it),
    ``NAMESPACE/NAME`` for another principal's (only the operator sees
    those). ``owner`` is the principal it belongs to (``tenant:NAME``,
    ``operator``, ``mcp:TENANT:SESSION``); ``read_only`` says the caller
    may fork it but not replace or delete it (an operator's snapshot
    shared with tenants). ``env_names`` are the variables its sandbox set:
    their values are not kept, a fork takes them from its ``env`` (else
    the service's defaults, else they are unset). ``kind`` is how it is
    kept: ``"delta"`` (a sandbox that resets in place: the service keeps
    its changes, forks start from ``base_image`` and take them in; no image
    is made) or ``"image"`` (the engine's image). ``image`` is the image a
    fork starts from (the engine's image holding it, or for a delta the
    source's), ``base_image`` the image its sandbox started from, ``source_sandbox`` corral's id of that sandbox,
    ``created`` seconds since the epoch, ``size`` the bytes it adds to its
    base, ``durable`` whether it is kept until deleted (otherwise it goes
    with the service)."""

    name: str
    kind: str = "image"
    image: str = ""
    source_sandbox: str = ""
    base_image: str = ""
    created: int = 0
    size: int = 0
    durable: bool = False
    owner: Optional[str] = None
    read_only: bool = False
    env_names: List[str] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Snapshot":
        return cls(
            name=str(data["name"]),
            kind=str(data.get("kind") or "image"),
            image=str(data.get("image") or ""),
            source_sandbox=str(data.get("source_sandbox") or ""),
            base_image=str(data.get("base_image") or ""),
            created=int(data.get("created") or 0),
            size=int(data.get("size") or 0),
            durable=bool(data.get("durable", False)),
            owner=data.get("owner"),
            read_only=bool(data.get("read_only", False)),
            env_names=[str(n) for n in data.get("env_names") or []],
            raw=dict(data),
        )


@dataclass(frozen=True)
class WhoAmI:
    """``GET /v1/whoami``: the principal the client's token acts as.

    ``principal`` is ``operator`` (the service's admin token, the owner of
    its Unix socket) or ``tenant:NAME`` (``server.token`` is tenant
    ``default``); ``tenant`` is that tenant's name (``None`` for the
    operator). ``max_sandboxes``, ``max_snapshots`` and
    ``max_snapshot_bytes`` are its tenant's quotas (``None``: no limit);
    past one the service answers :class:`~corral.CapacityError` with
    ``field`` naming the quota."""

    principal: str
    tenant: Optional[str] = None
    max_sandboxes: Optional[int] = None
    max_snapshots: Optional[int] = None
    max_snapshot_bytes: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "WhoAmI":
        def count(key: str) -> Optional[int]:
            value = data.get(key)
            return int(value) if value is not None else None

        tenant = data.get("tenant")
        return cls(
            principal=str(data.get("principal") or ""),
            tenant=str(tenant) if tenant is not None else None,
            max_sandboxes=count("max_sandboxes"),
            max_snapshots=count("max_snapshots"),
            max_snapshot_bytes=count("max_snapshot_bytes"),
            raw=dict(data),
        )

    @property
    def is_operator(self) -> bool:
        """The token is the operator's: it sees and acts on every tenant's
        sandboxes and snapshots."""
        return self.principal == "operator"
