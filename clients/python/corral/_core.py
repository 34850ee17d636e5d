"""What the sync and async clients share: configuration, request bodies,
answer parsing and the retry rule. No IO here."""

from __future__ import annotations

import base64
import io
import json
import os
import random
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

import httpx

from ._version import __version__
from .errors import CorralError, error_from_response

DEFAULT_URL = "http://127.0.0.1:7070"
USER_AGENT = f"corral-python/{__version__}"

Command = Union[str, Sequence[str]]
Stdin = Union[str, bytes, bytearray, memoryview, None]

# Seconds to wait for an answer beyond a command's own timeout (queueing,
# container start-up, network).
EXEC_GRACE = 60.0
# Sandbox creation may pull an image and start a container.
CREATE_TIMEOUT = 600.0


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of a request that failed before the service did anything
    (connection refused/reset) or that the service answered with a retryable
    503. Only idempotent requests are retried after they may have reached the
    service; a refused connection is retried for every request.

    ``attempts`` counts every try, the first included; delays double from
    ``initial_delay`` up to ``max_delay``, with jitter."""

    attempts: int = 4
    initial_delay: float = 0.25
    max_delay: float = 4.0
    jitter: bool = True

    def delay(self, attempt: int) -> float:
        """Seconds to wait before try number ``attempt + 1`` (attempt >= 1)."""
        d = min(self.max_delay, self.initial_delay * (2 ** (attempt - 1)))
        if self.jitter:
            d *= 1.0 + random.random()
        return min(d, self.max_delay * 2)


NO_RETRY = RetryPolicy(attempts=1)


def resolve_base_url(base_url: Optional[str]) -> str:
    url = base_url or os.environ.get("CORRAL_URL") or DEFAULT_URL
    if url.startswith("unix://"):
        # A bare socket URL: the socket becomes the transport, the host is
        # nominal.
        return "http://corral"
    return url.rstrip("/")


def resolve_uds(base_url: Optional[str], uds: Optional[str]) -> Optional[str]:
    if uds:
        return uds
    url = base_url or os.environ.get("CORRAL_URL") or ""
    if url.startswith("unix://"):
        return url[len("unix://") :]
    return os.environ.get("CORRAL_SOCKET") or None


def default_headers(token: Optional[str]) -> Dict[str, str]:
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def default_timeout(timeout: Union[float, httpx.Timeout, None]) -> httpx.Timeout:
    if isinstance(timeout, httpx.Timeout):
        return timeout
    if timeout is None:
        return httpx.Timeout(60.0, connect=10.0)
    return httpx.Timeout(float(timeout), connect=min(10.0, float(timeout)))


def new_session_key() -> str:
    """A fresh session key made here rather than by the service, so creating a
    sandbox can be retried without making two."""
    return "py-" + uuid.uuid4().hex[:20]


def seg(value: str) -> str:
    """One URL path segment."""
    return quote(str(value), safe="")


# --- request bodies -------------------------------------------------------


def seconds_to_ms(seconds: Optional[float], name: str) -> Optional[int]:
    if seconds is None:
        return None
    ms = int(round(float(seconds) * 1000))
    if ms <= 0:
        raise ValueError(f"{name} must be positive (seconds), got {seconds!r}")
    return ms


def exec_body(
    cmd: Command,
    *,
    timeout: Optional[float] = None,
    cwd: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    stdin: Stdin = None,
    max_output: Optional[int] = None,
    exclusive: bool = False,
    wait_for_output: bool = False,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if exclusive:
        body["exclusive"] = True
    if wait_for_output:
        body["wait_for_output"] = True
    if isinstance(cmd, str):
        body["command"] = cmd
    elif isinstance(cmd, (bytes, bytearray)):
        raise TypeError("cmd must be a str (run by /bin/sh -c) or a list of str (argv)")
    else:
        argv = [str(a) for a in cmd]
        if not argv:
            raise ValueError("cmd: an empty argv")
        body["argv"] = argv
    ms = seconds_to_ms(timeout, "timeout")
    if ms is not None:
        body["timeout_ms"] = ms
    if max_output is not None:
        body["max_output"] = int(max_output)
    if cwd is not None:
        body["cwd"] = str(cwd)
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if stdin is not None:
        if isinstance(stdin, str):
            body["stdin"] = stdin
        else:
            body["stdin_base64"] = base64.b64encode(bytes(stdin)).decode("ascii")
    return body


def shell_body(command: str, *, timeout: Optional[float] = None, max_output: Optional[int] = None) -> Dict[str, Any]:
    if not isinstance(command, str):
        raise TypeError("a shell session runs a command line (str)")
    body: Dict[str, Any] = {"command": command}
    ms = seconds_to_ms(timeout, "timeout")
    if ms is not None:
        body["timeout_ms"] = ms
    if max_output is not None:
        body["max_output"] = int(max_output)
    return body


def exec_read_timeout(timeout: Optional[float]) -> Optional[float]:
    """Seconds to wait for a command's answer: its own timeout plus a
    grace, or none when the command has none."""
    return None if timeout is None else float(timeout) + EXEC_GRACE


def exec_http_timeout(base: httpx.Timeout, timeout: Optional[float]) -> httpx.Timeout:
    """The HTTP read timeout for a command: its own timeout plus a grace, or
    none when the command has none."""
    read = None if timeout is None else float(timeout) + EXEC_GRACE
    return httpx.Timeout(connect=base.connect, read=read, write=base.write, pool=base.pool)


def create_body(
    *,
    session: Optional[str],
    image: Optional[str],
    spec: Optional[Mapping[str, Any]],
    profile: Optional[str],
    persistent: bool,
    pristine: Optional[bool] = None,
    template: Optional[str] = None,
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"session": session or new_session_key()}
    if template is not None:
        body["template"] = template
    if profile is not None:
        body["profile"] = profile
    if spec is not None:
        body["spec"] = dict(spec)
    if image is not None:
        body["image"] = image
    if persistent:
        body["persistent"] = True
    if pristine is not None:
        body["pristine"] = bool(pristine)
    return body


def context_tar(context: Union[None, bytes, str, "os.PathLike[str]"]) -> Optional[str]:
    """A build context as ``POST /v1/templates`` takes it: a tar archive
    (given as bytes, or made of a directory's files), base64."""
    if context is None:
        return None
    if isinstance(context, (bytes, bytearray)):
        data = bytes(context)
    else:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(os.fspath(context), arcname=".")
        data = buf.getvalue()
    return base64.b64encode(data).decode("ascii")


def fork_body(n: int, *, session_prefix: Optional[str], env: Optional[Mapping[str, str]]) -> Dict[str, Any]:
    """Body of ``POST /v1/snapshots/{name}/fork``. ``env`` is sent only when
    given: it carries the values of the snapshot's variables (it keeps
    their names only)."""
    body: Dict[str, Any] = {"count": n}
    if session_prefix is not None:
        body["session_prefix"] = session_prefix
    if env is not None:
        if isinstance(env, (str, bytes)) or not isinstance(env, Mapping):
            raise TypeError(f"env must be a mapping of variable names to values, got {type(env).__name__}")
        body["env"] = {str(k): str(v) for k, v in env.items()}
    return body


def file_mode(mode: Union[int, str, None]) -> Optional[str]:
    """A mode as the service's octal digits: 0o644 and "644" both give "644"."""
    if mode is None:
        return None
    if isinstance(mode, int):
        if mode < 0 or mode > 0o7777:
            raise ValueError(f"mode out of range: {mode!r}")
        return format(mode, "o")
    text = str(mode).strip()
    if text.startswith("0o"):
        text = text[2:]
    if not text or any(c not in "01234567" for c in text):
        raise ValueError(f"mode must be octal digits like '644', got {mode!r}")
    return text


def as_bytes(data: Union[bytes, bytearray, memoryview, str], encoding: str = "utf-8") -> bytes:
    if isinstance(data, str):
        return data.encode(encoding)
    return bytes(data)


def pack_dir(local_dir: Union[str, "os.PathLike[str]"]) -> bytes:
    """A tar of ``local_dir``'s contents (paths relative to it), symlinks kept
    as links."""
    root = Path(local_dir)
    if not root.is_dir():
        raise NotADirectoryError(f"not a directory: {root}")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root).as_posix()
            tar.add(str(path), arcname=rel, recursive=False)
    return buf.getvalue()


def tar_filters_available() -> bool:
    """Whether this Python's ``tarfile`` has extraction filters (3.12, and
    the security releases 3.8.17, 3.9.17, 3.10.12, 3.11.4 and later)."""
    return hasattr(tarfile, "data_filter")


def unpack_tar(data: bytes, local_dir: Union[str, "os.PathLike[str]"]) -> List[str]:
    """Extract a tar into ``local_dir``, refusing members that would land
    outside it, device files and links pointing out. Returns the names.

    Extraction uses tarfile's ``data`` filter, which checks each member
    against the filesystem as it is when that member is extracted. A Python
    without filters (3.9.0 to 3.9.16) can only check the archive before
    extracting, which a chain of links defeats (``a -> .``, then
    ``b -> a/a/../..``, then ``b/file``): there, archives holding links are
    refused, and set-id bits and owners are dropped."""
    dest = Path(local_dir)
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    names: List[str] = []
    filters = tar_filters_available()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        members = tar.getmembers()
        for m in members:
            target = (root / m.name).resolve()
            if target != root and root not in target.parents:
                raise CorralError(f"archive member escapes the destination: {m.name!r}", kind="unsafe_archive")
            if m.isdev():
                raise CorralError(f"archive member is a device file: {m.name!r}", kind="unsafe_archive")
            if m.issym() or m.islnk():
                if not filters:
                    raise CorralError(
                        f"archive member is a link ({m.name!r} -> {m.linkname!r}): this Python's tarfile "
                        "has no extraction filters, so links cannot be extracted safely; use Python "
                        "3.9.17 or later",
                        kind="unsafe_archive",
                    )
                link = (target.parent / m.linkname) if m.issym() else (root / m.linkname)
                link = link.resolve()
                if link != root and root not in link.parents:
                    raise CorralError(
                        f"archive link points outside the destination: {m.name!r} -> {m.linkname!r}",
                        kind="unsafe_archive",
                    )
            if not filters:
                # What the data filter would do: no set-id or sticky bits, no
                # group/other write, owned by whoever extracts.
                m.mode &= 0o755
                m.uid, m.gid = os.getuid(), os.getgid()
                m.uname = m.gname = ""
            names.append(m.name)
        if filters:
            try:
                tar.extractall(str(root), members=members, filter="data")  # type: ignore[call-arg]
            except tarfile.FilterError as err:  # type: ignore[attr-defined]
                raise CorralError(f"unsafe archive member: {err}", kind="unsafe_archive") from err
        else:
            tar.extractall(str(root), members=members)
    return names


# --- answers --------------------------------------------------------------


def parse_json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        return None


def raise_for_error(response: httpx.Response, resource: Optional[str] = None) -> None:
    """Raise the typed error for a 4xx/5xx answer (whose body was read)."""
    if response.status_code < 400:
        return
    body = parse_json(response)
    text = ""
    if body is None:
        try:
            text = response.text[:500]
        except Exception:  # pragma: no cover - undecodable body
            text = ""
    raise error_from_response(response.status_code, body, resource=resource, text=text)


# The longest ``Retry-After`` the clients honour, in seconds: a longer hint
# is the service's to give, but a client that blocks for minutes is worse
# than one that raises and lets its caller decide.
MAX_RETRY_AFTER = 60.0


def should_retry_status(response: httpx.Response) -> bool:
    """A 503 the service marks retryable (daemon unavailable, no capacity,
    shutting down)."""
    if response.status_code != 503:
        return False
    body = parse_json(response)
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        return bool(body["error"].get("retryable", False))
    return True


def retry_after(response: httpx.Response) -> Optional[float]:
    """The answer's ``Retry-After`` in seconds (the service sends it with
    ``capacity``), capped at :data:`MAX_RETRY_AFTER`; ``None`` when absent
    or not a number of seconds."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        secs = float(value.strip())
    except ValueError:
        return None
    if secs != secs or secs < 0:  # NaN or negative
        return None
    return min(secs, MAX_RETRY_AFTER)


def status_retry_delay(policy: "RetryPolicy", attempt: int, response: httpx.Response) -> float:
    """Seconds to wait before retrying after a retryable 503: the policy's
    backoff, or the service's ``Retry-After`` when that is longer."""
    delay = policy.delay(attempt)
    hint = retry_after(response)
    return delay if hint is None else max(delay, hint)


# Transport errors after which the request surely did not reach the service.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# Transport errors after which it may have.
MAYBE_SENT = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadTimeout, httpx.WriteTimeout)


def may_retry_transport(exc: Exception, idempotent: bool) -> bool:
    if isinstance(exc, NOT_SENT):
        return True
    if isinstance(exc, httpx.ReadTimeout):
        return False  # a slow answer; trying again only doubles the wait
    return idempotent and isinstance(exc, MAYBE_SENT)


def transport_error(exc: Exception, url: str) -> CorralError:
    if isinstance(exc, httpx.TimeoutException):
        msg = f"no answer from the corral service at {url} in time: {exc}"
        kind = "service_timeout"
    else:
        msg = f"cannot reach the corral service at {url}: {exc}"
        kind = "service_unavailable"
    from .errors import ServiceUnavailableError

    err = ServiceUnavailableError(msg, kind=kind)
    err.__cause__ = exc
    return err


def lean_transport_error(exc: Exception, url: str) -> CorralError:
    """The error of a request of the lean HTTP/1.1 client (``_http1``) that
    got no answer, as :func:`transport_error` gives for httpx's."""
    from . import _http1
    from .errors import ServiceUnavailableError

    if isinstance(exc, _http1.Timeout):
        err = ServiceUnavailableError(f"no answer from the corral service at {url} in time: {exc}", kind="service_timeout")
    else:
        err = ServiceUnavailableError(f"cannot reach the corral service at {url}: {exc}", kind="service_unavailable")
    err.__cause__ = exc
    return err


def stream_event(event: str, data: str) -> Tuple[str, Any]:
    """Decode one SSE event of an exec stream into (kind, payload)."""
    try:
        payload = json.loads(data) if data else {}
    except json.JSONDecodeError:
        payload = {"data": data}
    return event, payload
