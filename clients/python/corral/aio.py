# unasync: async only
"""The asyncio client: :class:`AsyncClient`, :class:`AsyncSandbox`,
:class:`AsyncShell` and :class:`AsyncCommandStream`, the same API as the
synchronous one with ``await``::

    async with AsyncSandbox(image="python:3.12-slim") as sb:
        r = await sb.run("python -c 'print(6*7)'", timeout=10)
        async for ev in sb.stream("make test"):
            ...

The one source of both: corral/client.py, the synchronous client, is
written from this file by tools/unasync.py (see there how).
"""
# unasync: end
# unasync: sync only
# """The synchronous client: :class:`Client`, :class:`Sandbox`, :class:`Shell`
# and :class:`CommandStream`."""
# unasync: end

from __future__ import annotations

import inspect
import logging
import os
import json as _json
import asyncio
import warnings
from types import TracebackType
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union
# unasync: async only
from typing import Generator
# unasync: end

import httpx

from . import _core
from . import _http1
from . import code as _code
from ._core import Command, RetryPolicy, Stdin, seg
from ._discovery import TokenSource
from ._sse import SSEDecoder
from .errors import CorralError, NotFoundError, ResultIntegrityWarning, SandboxNotFoundError, ServiceUnavailableError, error_from_response
from .models import CommandResult, FileEntry, Health, ResetResult, SandboxInfo, Snapshot, StreamEvent, WhoAmI

__all__ = ["AsyncClient", "AsyncSandbox", "AsyncShell", "AsyncCommandStream"]

log = logging.getLogger("corral")

PathLike = Union[str, "os.PathLike[str]"]
Data = Union[bytes, bytearray, memoryview, str]


class AsyncClient:
    """A connection to a corral service.

    Args:
        base_url: the service, default ``$CORRAL_URL`` else
            ``http://127.0.0.1:7070``. ``unix:///path/to.sock`` talks over a
            Unix socket.
        token: bearer token, default ``$CORRAL_TOKEN``, else the token a
            local service generated, read from its token file for a loopback
            URL (:func:`corral.find_token`; read again after a 401, so a
            restarted service is followed). Over the Unix socket the
            socket's owner needs none.
        uds: path of a Unix socket to connect through (the host of
            ``base_url`` is then nominal).
        timeout: seconds to wait for an ordinary answer (commands wait for
            their own timeout plus a grace; creating a sandbox up to 10
            minutes), or an :class:`httpx.Timeout`.
        retry: retries of connection failures and retryable 503s
            (:class:`~corral.RetryPolicy`); ``None`` or ``attempts=1`` disables.
        transport: an httpx transport, for tests or custom networking.
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        *,
        token: Optional[str] = None,
        uds: Optional[str] = None,
        timeout: Union[float, httpx.Timeout, None] = None,
        retry: Optional[RetryPolicy] = RetryPolicy(),
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        self.base_url = _core.resolve_base_url(base_url)
        socket_path = _core.resolve_uds(base_url, uds)
        if transport is None and socket_path:
            transport = httpx.AsyncHTTPTransport(uds=socket_path)
        self._tokens = TokenSource(token, base_url, socket_path)
        self.retry = retry or _core.NO_RETRY
        self._timeout = _core.default_timeout(timeout)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=_core.default_headers(self._tokens.token),
            timeout=self._timeout,
            transport=transport,
        )
        # Commands go over a lean HTTP/1.1 client of their own (same requests,
        # a tenth of httpx's CPU); https and custom transports use httpx.
        self._fast: Optional[_http1.AsyncJsonPool] = None
        if transport is None and _http1.Endpoint.usable(self.base_url):
            self._fast = _http1.AsyncJsonPool(
                _http1.Endpoint(self.base_url, socket_path, _core.default_headers(self._tokens.token))
            )

    # -- plumbing ----------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Optional[Mapping[str, Any]] = None,
        content: Optional[bytes] = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Union[httpx.Timeout, float, None, object] = httpx.USE_CLIENT_DEFAULT,
        idempotent: bool = False,
        resource: Optional[str] = None,
    ) -> httpx.Response:
        """Send one request with the retry rule; raise the typed error for an
        error answer; return the (read) response otherwise."""
        attempt = 0
        refreshed = False
        while True:
            attempt += 1
            try:
                response = await self._http.request(
                    method,
                    path,
                    json=json,
                    params=params,
                    content=content,
                    headers=headers,
                    timeout=timeout,  # type: ignore[arg-type]
                )
            except httpx.TransportError as exc:
                if attempt < self.retry.attempts and _core.may_retry_transport(exc, idempotent):
                    delay = self.retry.delay(attempt)
                    log.debug("corral: %s %s failed (%s); retrying in %.2fs", method, path, exc, delay)
                    await asyncio.sleep(delay)
                    continue
                raise _core.transport_error(exc, self.base_url) from exc
            if response.status_code == 401 and not refreshed and self._refresh_token():
                # A restarted local service has a new generated token.
                refreshed = True
                continue
            if idempotent and attempt < self.retry.attempts and _core.should_retry_status(response):
                delay = _core.status_retry_delay(self.retry, attempt, response)
                log.debug("corral: %s %s answered 503; retrying in %.2fs", method, path, delay)
                await asyncio.sleep(delay)
                continue
            _core.raise_for_error(response, resource)
            return response

    async def post_json(
        self,
        path: str,
        body: Mapping[str, Any],
        *,
        read_timeout: Optional[float],
        resource: Optional[str] = None,
    ) -> Any:
        """``POST`` a JSON body that must not be sent twice (a command) and
        return the decoded JSON answer, with the retry rule of
        :meth:`request` (only a request that surely was not sent is tried
        again) and its typed errors. ``read_timeout``: seconds to wait for
        the answer (``None``: no limit)."""
        fast = self._fast
        if fast is None:
            timeout = httpx.Timeout(
                connect=self._timeout.connect, read=read_timeout, write=self._timeout.write, pool=self._timeout.pool
            )
            r = await self.request("POST", path, json=body, timeout=timeout, resource=resource)
            return r.json()
        data = _json.dumps(body, separators=(",", ":")).encode("utf-8")
        attempt = 0
        refreshed = False
        while True:
            attempt += 1
            try:
                answer = await fast.send("POST", path, data, read_timeout, self._timeout.connect)
            except _http1.NotSent as exc:
                if attempt < self.retry.attempts:
                    delay = self.retry.delay(attempt)
                    log.debug("corral: POST %s failed (%s); retrying in %.2fs", path, exc, delay)
                    await asyncio.sleep(delay)
                    continue
                raise _core.lean_transport_error(exc, self.base_url) from exc
            except (_http1.MaybeSent, _http1.Timeout) as exc:
                raise _core.lean_transport_error(exc, self.base_url) from exc
            if answer.status == 401 and not refreshed and self._refresh_token():
                refreshed = True
                continue
            if answer.status >= 400:
                response = httpx.Response(answer.status, headers=answer.headers, content=answer.body)
                _core.raise_for_error(response, resource)
            try:
                return _json.loads(answer.body)
            except ValueError as exc:
                raise CorralError(
                    f"the service's answer to POST {path} is not JSON: {answer.body[:200]!r}", kind="bad_answer"
                ) from exc

    def _refresh_token(self) -> bool:
        """After a 401: read the local service's token file again; True when
        it holds a new token (now sent)."""
        if not self._tokens.refresh():
            return False
        self._http.headers["Authorization"] = f"Bearer {self._tokens.token}"
        if self._fast is not None:
            self._fast.endpoint.set_headers(_core.default_headers(self._tokens.token))
        return True

    async def aclose(self) -> None:
        if self._fast is not None:
            await self._fast.aclose()
        await self._http.aclose()

    # unasync: async only
    close = aclose

    # unasync: end
    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    # -- service -----------------------------------------------------------

    async def health(self) -> Health:
        """``GET /v1/health`` (needs no token)."""
        r = await self.request("GET", "/v1/health", idempotent=True)
        return Health.from_json(r.json())

    async def whoami(self) -> WhoAmI:
        """``GET /v1/whoami``: the principal this client's token acts as
        (the operator or a tenant) and its tenant's quotas."""
        r = await self.request("GET", "/v1/whoami", idempotent=True)
        return WhoAmI.from_json(r.json())

    async def usage(self) -> Dict[str, Any]:
        """``GET /v1/usage``: every sandbox's usage at once, from the
        service's usage sample (taken at most once per
        ``server.metrics.usage_refresh_ms``, the one ``/metrics`` reports):
        ``{"age_ms", "sandboxes": [{"id", "sandbox_id", "cpu_cores",
        "usage"}]}``, ``usage`` as :meth:`AsyncSandbox.usage` gives it,
        ``cpu_cores`` what it used between the last two samples. Cheaper
        than each sandbox's :meth:`AsyncSandbox.usage` for many sandboxes;
        :class:`~corral.errors.UnsupportedError` when the service samples
        no usage."""
        r = await self.request("GET", "/v1/usage", idempotent=True)
        return dict(r.json())

    # -- images ------------------------------------------------------------

    async def images(self) -> Dict[str, Any]:
        """``GET /v1/images``: ``{"images": [{image, size, created}],
        "pulls": [{image, state, layers_done, layers, bytes, total_bytes,
        elapsed_ms}]}``: the images on the engine this client may name
        (``server.policy.images``), and the pulls under way (``state``
        ``queued`` or ``pulling``; a start of a missing image waits for one)."""
        r = await self.request("GET", "/v1/images", idempotent=True)
        return dict(r.json())

    async def pull(self, image: str, *, timeout: Optional[float] = 900.0) -> Dict[str, Any]:
        """``POST /v1/images/pull``: makes sure ``image`` is on the engine
        (pulling it as a start would; its progress shows in :meth:`images`)
        and returns ``{"image", "waited_ms"}``. Raises
        :class:`~corral.ForbiddenError` when the policy does not list it,
        :class:`~corral.ImageNotFoundError` for a name or tag the registry
        lacks, :class:`~corral.ServiceUnavailableError` (retryable) for a
        registry that is down or a pull past ``daemon.pull_timeout_ms``.
        ``timeout`` (seconds, ``None``: none) bounds the wait here."""
        r = await self.request("POST", "/v1/images/pull", json={"image": image}, timeout=timeout, idempotent=True)
        return dict(r.json())

    # -- events ------------------------------------------------------------

    async def events(self, *, after: Optional[int] = None) -> AsyncIterator[Dict[str, Any]]:
        """The lifecycle events of this client's sandboxes as they happen
        (``GET /v1/events``), one dict each: ``id``, ``time_ms``, ``kind``
        (``created``, ``start_failed``, ``command``, ``reset``, ``snapshot``,
        ``lost``, ``recovered``, ``evicted``, ``removed``), ``sandbox``,
        ``session``, ``owner``, ``outcome`` (``ok``, ``exit`` or the failure
        kind), ``detail``. ``after``: resume after that id (0: every event
        still kept); ``None``: from now on. A ``{"kind": "gap", ...}`` dict
        says some events were no longer kept. Runs until the caller stops
        iterating (or the service ends)."""
        params = {} if after is None else {"after": int(after)}
        req = self._http.build_request(
            "GET",
            "/v1/events",
            params=params,
            headers={"Accept": "text/event-stream"},
            timeout=httpx.Timeout(None, connect=self._timeout.connect),
        )
        try:
            response = await self._http.send(req, stream=True)
        except httpx.TransportError as exc:
            raise _core.transport_error(exc, self.base_url) from exc
        try:
            if response.status_code >= 400:
                await response.aread()
                _core.raise_for_error(response, None)
            decoder = SSEDecoder()
            async for chunk in response.aiter_bytes():
                for sse in decoder.feed(chunk):
                    if sse.event == "gap":
                        yield {"kind": "gap", "detail": sse.data}
                        continue
                    try:
                        yield dict(_json.loads(sse.data))
                    except ValueError:
                        continue
        except httpx.TransportError as exc:
            raise _core.transport_error(exc, self.base_url) from exc
        finally:
            await response.aclose()

    # -- sandboxes ---------------------------------------------------------

    def sandbox(
        self,
        *,
        image: Optional[str] = None,
        spec: Optional[Mapping[str, Any]] = None,
        profile: Optional[str] = None,
        session: Optional[str] = None,
        persistent: bool = False,
        pristine: Optional[bool] = None,
        template: Optional[str] = None,
    ) -> "AsyncSandbox":
        """Create (or, for an existing ``session`` key, get) a sandbox. Use it
        as a context manager to delete it at the end (the asyncio client's is
        created when it is awaited or its context is entered)."""
        return AsyncSandbox(
            self, image=image, spec=spec, profile=profile, session=session, persistent=persistent,
            pristine=pristine, template=template,
        )

    # unasync: async only
    async def create_sandbox(self, **kwargs: Any) -> "AsyncSandbox":
        """Create a sandbox now (arguments as :meth:`sandbox`)."""
        return await self.sandbox(**kwargs)

    # unasync: end
    # unasync: sync only
    # create_sandbox = sandbox
    #
    # unasync: end

    async def get_sandbox(self, sandbox_id: str) -> "AsyncSandbox":
        """An existing sandbox by id (raises :class:`SandboxNotFoundError`)."""
        info = await self.sandbox_info(sandbox_id)
        return AsyncSandbox(self, _info=info)

    async def sandbox_info(self, sandbox_id: str) -> SandboxInfo:
        r = await self.request("GET", f"/v1/sandboxes/{seg(sandbox_id)}", idempotent=True, resource="sandbox")
        return SandboxInfo.from_json(r.json())

    async def list_sandboxes(self) -> List[SandboxInfo]:
        """The caller's sandboxes (every principal's for the operator); a
        tenant never sees another's."""
        r = await self.request("GET", "/v1/sandboxes", idempotent=True)
        return [SandboxInfo.from_json(s) for s in r.json().get("sandboxes", [])]

    async def delete_sandbox(self, sandbox_id: str, *, missing_ok: bool = True) -> None:
        """Release a sandbox (destroyed unless persistent)."""
        try:
            await self.request("DELETE", f"/v1/sandboxes/{seg(sandbox_id)}", idempotent=True, resource="sandbox")
        except NotFoundError:
            if not missing_ok:
                raise

    # -- templates ---------------------------------------------------------

    async def build_template(
        self,
        name: str,
        *,
        dockerfile: Optional[str] = None,
        context: Union[None, bytes, str, "os.PathLike[str]"] = None,
        from_: Optional[str] = None,
        steps: Optional[Sequence[Mapping[str, Any]]] = None,
        start: Optional[str] = None,
        ready: Optional[str] = None,
        build_args: Optional[Mapping[str, str]] = None,
        skip_cache: bool = False,
        timeout: Optional[float] = 3600.0,
    ) -> Dict[str, Any]:
        """Build template ``name`` (``POST /v1/templates``) from a
        ``dockerfile`` (its text) with its ``context`` (a directory, or a tar
        archive as bytes), or ``from_`` an image (or ``"template:NAME"``)
        with ``steps``, in sandboxes of the caller's own spec. Waits for the
        build; returns the template (``build``: steps and how many came from
        the cache; ``log``: the build's last lines). Unchanged steps are not
        run again unless ``skip_cache``. A failing step raises
        :class:`CorralError` with ``kind`` ``build_failed``, naming the step,
        its Dockerfile line and the end of its output.
        :meth:`sandbox` ``(template=name)`` starts from it."""
        body: Dict[str, Any] = {"name": name, "skip_cache": bool(skip_cache)}
        if dockerfile is not None:
            body["dockerfile"] = dockerfile
        if from_ is not None:
            body["from"] = from_
        if steps is not None:
            body["steps"] = [dict(x) for x in steps]
        if start is not None:
            body["start"] = start
        if ready is not None:
            body["ready"] = ready
        if build_args:
            body["build_args"] = dict(build_args)
        ctx = _core.context_tar(context)
        if ctx is not None:
            body["context"] = ctx
        r = await self.request(
            "POST",
            "/v1/templates",
            json=body,
            timeout=httpx.Timeout(timeout, connect=self._timeout.connect),
        )
        return dict(r.json())

    async def templates(self) -> List[Dict[str, Any]]:
        """The caller's templates."""
        r = await self.request("GET", "/v1/templates", idempotent=True)
        return list(r.json().get("templates", []))

    async def template_info(self, name: str) -> Dict[str, Any]:
        """Template ``name`` (raises :class:`NotFoundError`, also for
        another principal's)."""
        r = await self.request("GET", f"/v1/templates/{seg(name)}", idempotent=True)
        return dict(r.json())

    async def delete_template(self, name: str, *, missing_ok: bool = False) -> None:
        """Delete template ``name`` (sandboxes started from it go on)."""
        try:
            await self.request("DELETE", f"/v1/templates/{seg(name)}", idempotent=True)
        except NotFoundError:
            if not missing_ok:
                raise

    # -- snapshots ---------------------------------------------------------

    async def snapshots(self) -> List[Snapshot]:
        """The snapshots the caller may see (``GET /v1/snapshots``): its own
        and the operator's shared with it (``read_only``); the operator
        sees every principal's, another's named ``NAMESPACE/NAME``."""
        r = await self.request("GET", "/v1/snapshots", idempotent=True)
        return [Snapshot.from_json(s) for s in r.json().get("snapshots", [])]

    async def snapshot_info(self, name: str) -> Snapshot:
        """Snapshot ``name`` (raises :class:`SnapshotNotFoundError`, also for
        another principal's: what the caller may not see is answered as
        absent)."""
        r = await self.request("GET", f"/v1/snapshots/{seg(name)}", idempotent=True, resource="snapshot")
        return Snapshot.from_json(r.json())

    async def delete_snapshot(self, name: Union[str, Snapshot], *, missing_ok: bool = False) -> None:
        """Delete a snapshot. Raises :class:`ConflictError` while sandboxes
        forked from it exist, :class:`ForbiddenError` (``field`` ``name``)
        for an operator's snapshot shared with the caller read-only,
        :class:`SnapshotNotFoundError` for an unknown one or another
        principal's (unless ``missing_ok``)."""
        name = name.name if isinstance(name, Snapshot) else name
        try:
            await self.request("DELETE", f"/v1/snapshots/{seg(name)}", idempotent=True, resource="snapshot")
        except NotFoundError:
            if not missing_ok:
                raise

    async def fork(
        self,
        snapshot: Union[str, Snapshot],
        n: int = 1,
        *,
        session_prefix: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> List["AsyncSandbox"]:
        """Start ``n`` sandboxes from a snapshot, all or nothing: each has its
        file system and the spec of the sandbox it was taken from. Their
        session keys are ``<session_prefix>-<i>`` (default: random).

        A snapshot keeps the names of its sandbox's variables
        (``Snapshot.env_names``), never their values: each fork takes them
        from ``env``, else from the service's defaults, else leaves them
        unset; other variables in ``env`` are added.

        An unknown snapshot, or another principal's, raises
        :class:`SnapshotNotFoundError`. A snapshot of a sandbox with
        settings the service keeps from clients (a host mount, say) raises
        :class:`ForbiddenError` naming the field; ``n`` above the service's
        ``max_live`` raises :class:`InvalidRequestError` naming ``count``;
        ``n`` past the tenant's ``max_sandboxes`` raises
        :class:`CapacityError` naming it. Delete the sandboxes (or use each
        as a context manager) when done."""
        name = snapshot.name if isinstance(snapshot, Snapshot) else snapshot
        body = _core.fork_body(n, session_prefix=session_prefix, env=env)
        r = await self.request(
            "POST",
            f"/v1/snapshots/{seg(name)}/fork",
            json=body,
            timeout=httpx.Timeout(_core.CREATE_TIMEOUT, connect=self._timeout.connect),
            resource="snapshot",
        )
        return [AsyncSandbox(self, _info=SandboxInfo.from_json(s)) for s in r.json().get("sandboxes", [])]

    async def _create(self, body: Dict[str, Any]) -> SandboxInfo:
        # The session key is made here when not given, so a retry after a
        # lost answer gets the same sandbox rather than a second one.
        r = await self.request(
            "POST",
            "/v1/sandboxes",
            json=body,
            timeout=httpx.Timeout(_core.CREATE_TIMEOUT, connect=self._timeout.connect),
            idempotent=True,
        )
        info = SandboxInfo.from_json(r.json())
        if info.result_integrity is False:
            warnings.warn(
                ResultIntegrityWarning(f"sandbox {info.id}: {info.result_integrity_gap}"),
                stacklevel=3,
            )
        return info


class AsyncSandbox:
    """A sandbox: a hardened container with corral's agent inside.

    Made through ``client``, else a client of its own built from
    ``base_url``/``token``/``$CORRAL_URL``/``$CORRAL_TOKEN``. The
    synchronous ``Sandbox(image=...)`` creates one at once; the asyncio
    one is created when it is awaited or its context is entered. As a
    context manager it is deleted on exit::

        async with AsyncSandbox() as sb:
            r = await sb.run("echo hi")
            print(r.stdout)

    Args:
        image: image, overriding the service's default.
        spec: sandbox spec keys as under ``defaults`` in corral's config
            (``image``, ``env``, ``limits``, ``network``, ...), merged over
            the service's ``defaults``. What it may change is the service's
            policy: a refused field raises :class:`ForbiddenError`.
        profile: a profile or pool name of the service's config.
        session: session key: the same key gets the same sandbox until it is
            deleted. Default: a fresh key.
        persistent: keep ``/workspace`` and the home directory per session key.
        pristine: start the sandbox so that :meth:`reset` returns it to its
            state right after start in place, in milliseconds (changes to its
            root file system then live in memory and count against its memory
            limit); overrides the spec's, profile's or defaults' ``pristine``.
            A sandbox that cannot (read-only root, a non-root user, a runtime
            other than runc, persistent) is replaced by a reset instead;
            ``info.resets_in_place`` and ``info.reset_unavailable_reason`` say
            which.
        template: a template of the caller's (:meth:`AsyncClient.build_template`)
            to start from: its image, environment, working directory, user,
            start and ready commands. Not with ``image`` or ``profile``.
    """

    def __init__(
        self,
        client: Optional[AsyncClient] = None,
        *,
        image: Optional[str] = None,
        spec: Optional[Mapping[str, Any]] = None,
        profile: Optional[str] = None,
        session: Optional[str] = None,
        persistent: bool = False,
        pristine: Optional[bool] = None,
        template: Optional[str] = None,
        base_url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: Union[float, httpx.Timeout, None] = None,
        _info: Optional[SandboxInfo] = None,
    ) -> None:
        self._body = None
        if _info is None:
            self._body = _core.create_body(
                session=session, image=image, spec=spec, profile=profile, persistent=persistent, pristine=pristine,
                template=template,
            )
        self._owns_client = client is None
        self.client = client if client is not None else AsyncClient(base_url, token=token, timeout=timeout)
        self._info = _info
        self._deleted = False
        # unasync: sync only
        # self.start()
        # unasync: end

    @classmethod
    async def create(cls, client: Optional[AsyncClient] = None, **kwargs: Any) -> "AsyncSandbox":
        """Same as ``AsyncSandbox(client, **kwargs)``, created."""
        return await cls(client, **kwargs).start()

    async def start(self) -> "AsyncSandbox":
        """Create the sandbox (once; a created one is returned as it is)."""
        if self._info is None and self._body is not None:
            try:
                self._info = await self.client._create(self._body)
            except BaseException:
                if self._owns_client:
                    await self.client.aclose()
                raise
        return self

    # unasync: async only
    def __await__(self) -> Generator[Any, None, "AsyncSandbox"]:
        return self.start().__await__()

    # unasync: end

    # -- identity ----------------------------------------------------------

    @property
    def info(self) -> SandboxInfo:
        """The sandbox's description (as of its creation or last
        :meth:`refresh`)."""
        if self._info is None:
            raise RuntimeError("the sandbox is not created yet: use `async with` or `await` it")
        return self._info

    @property
    def id(self) -> str:
        """The handle of every route (the session key)."""
        return self.info.id

    @property
    def container_id(self) -> Optional[str]:
        return self.info.container_id

    @property
    def sandbox_id(self) -> Optional[str]:
        return self.info.sandbox_id

    @property
    def image(self) -> Optional[str]:
        return self.info.image

    async def refresh(self) -> SandboxInfo:
        """Fetch the sandbox's current description."""
        self._info = await self.client.sandbox_info(self.id)
        return self._info

    def _path(self, *parts: str) -> str:
        return "/v1/sandboxes/" + seg(self.id) + "".join("/" + p for p in parts)

    def __repr__(self) -> str:
        if self._info is None:
            return "AsyncSandbox(<not created>)"
        return f"AsyncSandbox(id={self.id!r}, container_id={(self.container_id or '')[:12]!r}, image={self.image!r})"

    # -- commands ----------------------------------------------------------

    async def run(
        self,
        cmd: Command,
        timeout: Optional[float] = None,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Stdin = None,
        max_output: Optional[int] = None,
        exclusive: bool = False,
        wait_for_output: bool = False,
        check: bool = False,
        raise_on_failure: bool = True,
    ) -> CommandResult:
        """Run a command and wait for it.

        ``cmd`` is a command line (run by ``/bin/sh -c``) or an argv list.
        ``timeout`` is in seconds (the command's whole process tree is killed
        then); ``max_output`` caps the bytes kept per stream (head and tail).

        A non-zero exit is a result, not an error (``check=True`` raises
        :class:`CommandFailedError` for it). A failure (timeout, OOM kill,
        lost container, ...) raises its typed exception carrying the result,
        unless ``raise_on_failure=False``, which returns the result with
        ``failure`` set.

        ``exclusive=True`` kills every other process in the sandbox first
        (leftovers of earlier commands included), so nothing can tamper with
        the command while it runs: use it for graders.

        By default the command ends when its main process exits: output a
        background job (``cmd &``) writes later is lost, and the job gets
        SIGPIPE when it writes. ``wait_for_output=True`` waits, as
        ``docker exec`` does, until stdout and stderr are closed by every
        process holding them (bounded by ``timeout``, which then kills them
        all and fails as a timeout) and returns their output; jobs that
        closed or redirected the streams are left running. The exit code is
        the main process's either way.
        """
        body = _core.exec_body(
            cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin, max_output=max_output,
            exclusive=exclusive,
            wait_for_output=wait_for_output,
        )
        answer = await self.client.post_json(
            self._path("exec"), body, read_timeout=_core.exec_read_timeout(timeout), resource="sandbox"
        )
        result = CommandResult.from_json(answer)
        return _finish(result, check=check, raise_on_failure=raise_on_failure)

    def stream(
        self,
        cmd: Command,
        timeout: Optional[float] = None,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Stdin = None,
        max_output: Optional[int] = None,
        wait_for_output: bool = False,
        raise_on_failure: bool = True,
        pty: Optional[Tuple[int, int]] = None,
        interactive: bool = False,
    ) -> "AsyncCommandStream":
        """Run a command, yielding its output as it comes::

            for ev in sb.stream("make test"):
                if ev.is_output:
                    print(ev.text, end="")
                else:
                    print("exit", ev.result.exit_code)

        Events are ``stdout``/``stderr`` chunks, then one ``result`` (also kept
        as ``.result`` of the returned stream). A failure raises its typed
        exception in place of the ``result`` event unless
        ``raise_on_failure=False``. ``wait_for_output`` is as for :meth:`run`.

        ``pty=(cols, rows)`` runs the command on a terminal of that size (its
        output, stdout and stderr merged as a terminal shows them, comes as
        ``stdout``); ``interactive=True`` (implied by ``pty``) keeps its stdin
        open: its first event is ``started``, and from then until its
        ``result``, :meth:`AsyncCommandStream.send_stdin`, ``resize``,
        ``signal`` and ``close_stdin`` reach it::

            with sb.stream("python3 -q", pty=(80, 24)) as s:
                for ev in s:
                    if ">>> " in ev.text:
                        s.send_stdin("exit()\r")
        """
        body = _core.exec_body(
            cmd,
            timeout=timeout,
            cwd=cwd,
            env=env,
            stdin=stdin,
            max_output=max_output,
            wait_for_output=wait_for_output,
        )
        if pty is not None:
            cols, rows = pty
            body["pty"] = {"cols": cols, "rows": rows}
        if interactive:
            body["interactive"] = True
        return AsyncCommandStream(self, body, timeout, raise_on_failure)

    # -- code contexts -----------------------------------------------------

    async def run_code(
        self,
        code: str,
        *,
        context: Union["_code.CodeContext", str, None] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        max_output: Optional[int] = None,
        exclusive: bool = False,
        on_stdout: "_code.Handler" = None,
        on_stderr: "_code.Handler" = None,
        on_result: "_code.Handler" = None,
        on_error: "_code.Handler" = None,
    ) -> "_code.Execution":
        """Run Python code in a code context (a Jupyter kernel in the
        sandbox; ``context=None`` is the default one) and return its
        :class:`~corral.code.Execution`: ``results`` (rich, ``.png`` of a
        plot, ``.html`` of a DataFrame), ``logs``, ``error`` (what the code
        raised). Variables live on between runs::

            sb.run_code("x = 41")
            assert sb.run_code("x + 1").text == "42"

        ``env`` is set for this run only. ``timeout`` (seconds) interrupts
        the kernel and raises :class:`SandboxTimeoutError`; an OOM kill
        raises :class:`SandboxOOMError`. Callbacks (plain or async) get items as they come.
        ``exclusive=True`` runs it in a fresh kernel with nothing else alive
        in the sandbox (every other process, other contexts' kernels
        included, is ended first; the context's variables are lost): for a
        grader after a rollout.
        """
        c = self.client
        body = _code.run_body(code, context, env, timeout, max_output, exclusive)
        req = c._http.build_request(
            "POST",
            self._path("code"),
            json=body,
            headers={"Accept": "text/event-stream"},
            timeout=_core.exec_http_timeout(c._timeout, timeout),
        )
        try:
            response = await c._http.send(req, stream=True)
        except httpx.TransportError as exc:
            raise _core.transport_error(exc, c.base_url) from exc
        ex = _code.Execution()
        try:
            if response.status_code >= 400:
                await response.aread()
                _core.raise_for_error(response, "sandbox")
            decoder = SSEDecoder()
            try:
                async for chunk in response.aiter_bytes():
                    for sse in decoder.feed(chunk):
                        data = _json.loads(sse.data) if sse.data else {}
                        done = _code.apply(ex, sse.event, data, on_stdout, on_stderr, on_result, on_error)
                        # unasync: async only
                        if inspect.isawaitable(done):
                            await done
                        # unasync: end
                for sse in decoder.close():
                    data = _json.loads(sse.data) if sse.data else {}
                    done = _code.apply(ex, sse.event, data, on_stdout, on_stderr, on_result, on_error)
                    # unasync: async only
                    if inspect.isawaitable(done):
                        await done
                    # unasync: end
            except httpx.TransportError as exc:
                raise _core.transport_error(exc, c.base_url) from exc
        finally:
            await response.aclose()
        return ex

    async def create_code_context(self, language: Optional[str] = None, cwd: Optional[str] = None) -> "_code.CodeContext":
        """A new code context: a kernel of its own (``python``; another
        language raises :class:`UnsupportedError`)."""
        body: Dict[str, Any] = {}
        if language is not None:
            body["language"] = language
        if cwd is not None:
            body["cwd"] = cwd
        r = await self.client.request("POST", self._path("code", "contexts"), json=body, resource="sandbox")
        return _code.CodeContext.from_json(r.json())

    async def code_contexts(self) -> List["_code.CodeContext"]:
        """The sandbox's code contexts."""
        r = await self.client.request("GET", self._path("code", "contexts"), idempotent=True, resource="sandbox")
        return [_code.CodeContext.from_json(d) for d in r.json()]

    async def remove_code_context(self, context: Union["_code.CodeContext", str]) -> None:
        """Ends a context's kernel."""
        cid = context.id if isinstance(context, _code.CodeContext) else str(context)
        await self.client.request("DELETE", self._path("code", "contexts", seg(cid)), resource="sandbox")

    # -- shell sessions ----------------------------------------------------

    def shell(self, name: str = "main") -> "AsyncShell":
        """A stateful shell session (``cd``, exports and functions persist
        between commands). It starts with its first command."""
        return AsyncShell(self, name)

    async def shells(self) -> List[str]:
        """Names of the open shell sessions."""
        r = await self.client.request("GET", self._path("shells"), idempotent=True, resource="sandbox")
        return list(r.json().get("shells", []))

    # -- files -------------------------------------------------------------

    async def write_file(
        self,
        path: str,
        data: Data,
        mode: Union[int, str, None] = None,
        mkdirs: bool = False,
    ) -> None:
        """Write ``data`` (bytes, or str as UTF-8) to ``path`` atomically.
        ``mode`` as 0o644 or "644"; ``mkdirs`` creates missing parents."""
        params: Dict[str, str] = {"path": path}
        m = _core.file_mode(mode)
        if m is not None:
            params["mode"] = m
        if mkdirs:
            params["mkdirs"] = "true"
        await self.client.request(
            "PUT",
            self._path("files"),
            params=params,
            content=_core.as_bytes(data),
            headers={"Content-Type": "application/octet-stream"},
            idempotent=True,
            resource="file",
        )

    async def read_file(self, path: str, max_bytes: Optional[int] = None) -> bytes:
        """The bytes of the file at ``path``. A missing file raises
        :class:`SandboxFileNotFoundError` (a :class:`FileNotFoundError`)."""
        params: Dict[str, Any] = {"path": path}
        if max_bytes is not None:
            params["max_bytes"] = int(max_bytes)
        r = await self.client.request("GET", self._path("files"), params=params, idempotent=True, resource="file")
        return r.content

    async def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        return (await self.read_file(path)).decode(encoding, errors)

    async def list_files(self, path: str) -> List[FileEntry]:
        """The entries of directory ``path``, by name."""
        r = await self.client.request(
            "GET", self._path("files", "list"), params={"path": path}, idempotent=True, resource="file"
        )
        return [FileEntry.from_json(e) for e in r.json().get("entries", [])]

    async def upload_tar(self, dest: str, tar: Union[bytes, bytearray, memoryview]) -> None:
        """Extract the tar archive ``tar`` under directory ``dest``."""
        await self.client.request(
            "PUT",
            self._path("archive"),
            params={"path": dest},
            content=bytes(tar),
            headers={"Content-Type": "application/x-tar"},
            idempotent=True,
            resource="file",
        )

    async def download_tar(self, path: str) -> bytes:
        """A tar archive of ``path`` (a file or a directory)."""
        r = await self.client.request(
            "GET", self._path("archive"), params={"path": path}, idempotent=True, resource="file"
        )
        return r.content

    async def upload_dir(self, local_dir: PathLike, dest: str) -> None:
        """Copy the contents of ``local_dir`` into ``dest`` in the sandbox."""
        await self.upload_tar(dest, _core.pack_dir(local_dir))

    async def download_dir(self, path: str, local_dir: PathLike) -> List[str]:
        """Copy ``path`` from the sandbox into ``local_dir`` (members that
        would land outside it are refused). Returns the extracted names."""
        return _core.unpack_tar(await self.download_tar(path), local_dir)

    # -- snapshots ---------------------------------------------------------

    async def snapshot(self, name: str, durable: bool = False, kind: Optional[str] = None) -> Snapshot:
        """Keep this sandbox's file system as snapshot ``name`` (replacing
        one of that name), to fork sandboxes from with
        :meth:`AsyncClient.fork`. It lands in the caller's own namespace: another
        principal's snapshot of the same name is not touched. It records
        the names of the sandbox's variables, not their values.
        ``durable`` keeps it until deleted; otherwise it goes with the
        service. ``kind`` asks for ``"delta"`` or ``"image"`` (default: the
        service's choice: a delta for a sandbox that resets in place, live
        for one that can be checkpointed), or ``"live"``: the running
        sandbox's processes and memory too, which forks go on from (gVisor
        sandboxes without network, where it is the default and ``"image"``
        raises :class:`UnsupportedError`; other tiers raise it for
        ``"live"``, naming why). A
        bad name raises :class:`InvalidRequestError` naming ``name``; a
        tenant past its ``max_snapshots`` or ``max_snapshot_bytes`` gets
        :class:`CapacityError` naming it."""
        body: Dict[str, Any] = {"name": name, "durable": durable}
        if kind is not None:
            body["kind"] = kind
        r = await self.client.request(
            "POST",
            self._path("snapshot"),
            json=body,
            timeout=httpx.Timeout(_core.CREATE_TIMEOUT, connect=self.client._timeout.connect),
            resource="sandbox",
        )
        return Snapshot.from_json(r.json())

    # -- usage -------------------------------------------------------------

    async def usage(self) -> Dict[str, Any]:
        """What the sandbox uses now (``GET /v1/sandboxes/{id}/usage``):
        ``cpu_ns``, ``memory_bytes`` (and ``memory_peak_bytes`` where kept)
        against ``memory_limit_bytes``, ``pids`` against ``pids_limit``,
        ``block_read_bytes``, ``block_write_bytes``, ``net_rx_bytes``,
        ``net_tx_bytes``, ``oom_kills`` (``None`` where not known), and
        ``source``: ``engine`` (the engine's accounting, Docker's stats) or
        ``agent`` (read by the sandbox's agent from its cgroup, where the
        engine has none, as on Kubernetes)."""
        r = await self.client.request("GET", self._path("usage"), idempotent=True, resource="sandbox")
        return dict(r.json())

    # -- egress ------------------------------------------------------------

    async def egress(self) -> Dict[str, Any]:
        """What the egress gateway of a sandbox with ``network: {egress:
        ...}`` allowed and refused (``GET /v1/sandboxes/{id}/egress``):
        ``dns_allowed``, ``dns_refused``, ``connections_allowed``,
        ``connections_refused`` and ``recent_refusals`` (the last ones,
        oldest first, e.g. ``"dns evil.test"``). Raises
        :class:`~corral.errors.NotFoundError` for a sandbox without an
        egress policy (and for another's)."""
        r = await self.client.request("GET", self._path("egress"), idempotent=True, resource="sandbox")
        return dict(r.json())

    # -- ports -------------------------------------------------------------

    async def port_url(self, port: int) -> str:
        """A URL through the service that reaches a server listening on
        ``port`` inside the sandbox (``GET /v1/sandboxes/{id}/ports/{port}``):
        HTTP, streamed responses and WebSocket upgrades, the link's token
        taken off the path. The URL's host name is the link's own,
        ``PORT-SANDBOXID.DOMAIN`` (``server.ports_domain``, else
        ``localhost``), so the link is an origin of its own in a browser: it
        shares cookies, storage and service workers with no other sandbox,
        port, the API or the dashboard. Browsers and curl resolve
        ``*.localhost`` to loopback; Python (glibc) does not: fetch such a
        link with :meth:`port_link` (``connect`` and ``host``). It needs no
        bearer token: its own token opens this port of this sandbox only,
        as long as the sandbox lives. Works for ``network: none`` sandboxes
        too, which gain no egress by it."""
        return str((await self.port_link(port))["url"])

    async def port_link(self, port: int) -> Dict[str, Any]:
        """The link of :meth:`port_url` whole: ``url`` (what a browser
        opens), ``host`` (its host name), ``connect`` (``http://IP:PORT`` of
        the port-link listener), ``path`` (``/TOKEN/``) and ``token``. A
        program that cannot resolve ``host`` sends its requests to
        ``connect + path`` with the header ``Host: host``, e.g.
        ``httpx.get(link["connect"] + link["path"], headers={"Host": link["host"]})``."""
        r = await self.client.request("GET", self._path(f"ports/{int(port)}"), idempotent=True, resource="sandbox")
        return dict(r.json())

    # -- lifetime ----------------------------------------------------------

    async def pause(self) -> str:
        """Pause the sandbox until :meth:`resume`. Where its tier
        checkpoints (the operator's gVisor tier without network) it goes to
        disk: its processes and memory are written to a checkpoint and its
        container stops, holding no memory; commands fail until it resumes,
        and it outlives a restart of the service (get it again with
        :meth:`Client.get_sandbox` and resume it). Elsewhere it is frozen
        with its memory kept. Returns ``"disk"`` or ``"memory"``. Raises
        :class:`ConflictError` when already paused."""
        r = await self.client.request(
            "POST",
            self._path("pause"),
            timeout=httpx.Timeout(_core.CREATE_TIMEOUT, connect=self.client._timeout.connect),
            resource="sandbox",
        )
        return str(r.json()["paused"])

    async def resume(self) -> None:
        """Resume a sandbox :meth:`pause` paused: one paused to disk comes
        back with its processes. Raises :class:`ConflictError` when it is
        not paused."""
        await self.client.request(
            "POST",
            self._path("resume"),
            timeout=httpx.Timeout(_core.CREATE_TIMEOUT, connect=self.client._timeout.connect),
            resource="sandbox",
        )

    async def reset(self) -> ResetResult:
        """Return the sandbox to its state right after start: every process
        killed (background jobs and shell sessions too), every change to its
        file system undone (host mounts are the host's); its id stays.

        A sandbox created with ``pristine=True`` is reset in place by its
        agent, in milliseconds (``mode == "in_place"``); any other has its
        container replaced by a new one from the same spec, start-up
        commands run again (``mode == "replaced"``, ``fallback_reason``
        saying why). Raises :class:`SandboxNotFoundError` for a sandbox that
        is gone.
        """
        r = await self.client.request(
            "POST",
            self._path("reset"),
            timeout=httpx.Timeout(_core.CREATE_TIMEOUT, connect=self.client._timeout.connect),
            # Resetting again after a lost answer ends in the same state.
            idempotent=True,
            resource="sandbox",
        )
        result = ResetResult.from_json(r.json())
        if not result.in_place:
            # A new container: its id changed.
            try:
                await self.refresh()
            except CorralError as exc:
                log.debug("corral: refreshing %s after a reset failed: %s", self.id, exc)
        return result

    async def delete(self) -> None:
        """Release the sandbox (its container is removed unless persistent).
        Deleting twice, or a sandbox already gone, is not an error."""
        if self._deleted or self._info is None:
            return
        try:
            await self.client.delete_sandbox(self.id)
            self._deleted = True
        finally:
            if self._deleted and self._owns_client:
                await self.client.aclose()

    async def aclose(self) -> None:
        """Delete the sandbox (as :meth:`delete`) and close the client it
        made for itself, if it made one."""
        try:
            await self.delete()
        finally:
            if self._owns_client:
                await self.client.aclose()

    async def __aenter__(self) -> "AsyncSandbox":
        return await self.start()

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            await self.delete()
        except CorralError as err:
            if exc is None:
                raise
            log.warning("corral: could not delete sandbox %s: %s", self._info.id if self._info else "?", err)
        finally:
            if self._owns_client:
                await self.client.aclose()


class AsyncShell:
    """A shell session in a sandbox: commands share one shell process, so
    ``cd``, exported variables and functions carry over."""

    def __init__(self, sandbox: AsyncSandbox, name: str = "main") -> None:
        self.sandbox = sandbox
        self.name = name

    async def run(
        self,
        cmd: str,
        timeout: Optional[float] = None,
        *,
        max_output: Optional[int] = None,
        check: bool = False,
        raise_on_failure: bool = True,
    ) -> CommandResult:
        """Run ``cmd`` in the session. The result says whether the shell was
        ``restarted`` (earlier state lost) and whether it ``ended`` (``exit``).
        On a timeout the command is interrupted; the session survives when it
        stops on the interrupt, else it is restarted."""
        body = _core.shell_body(cmd, timeout=timeout, max_output=max_output)
        c = self.sandbox.client
        answer = await c.post_json(
            self.sandbox._path("shells", seg(self.name), "exec"),
            body,
            read_timeout=_core.exec_read_timeout(timeout),
            resource="sandbox",
        )
        return _finish(CommandResult.from_json(answer), check=check, raise_on_failure=raise_on_failure)

    async def close(self) -> None:
        """End the session (its processes are killed). Closing a session that
        is not open is not an error."""
        try:
            await self.sandbox.client.request(
                "DELETE", self.sandbox._path("shells", seg(self.name)), idempotent=True, resource="shell"
            )
        except NotFoundError as err:
            if isinstance(err, SandboxNotFoundError):
                raise

    async def __aenter__(self) -> "AsyncShell":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self.close()
        except CorralError as err:
            if exc[1] is None:
                raise
            log.warning("corral: could not close shell %s: %s", self.name, err)

    def __repr__(self) -> str:
        return f"AsyncShell(sandbox={self.sandbox.id!r}, name={self.name!r})"


class AsyncCommandStream:
    """The events of a streamed command; iterate it once. ``result`` holds
    the final :class:`CommandResult` once it arrived. Closing it early (or
    leaving a ``with`` block) drops the connection."""

    def __init__(self, sandbox: AsyncSandbox, body: Dict[str, Any], timeout: Optional[float], raise_on_failure: bool):
        self.sandbox = sandbox
        self.result: Optional[CommandResult] = None
        self._body = body
        self._timeout = timeout
        self._raise = raise_on_failure
        self._response: Optional[httpx.Response] = None
        self._started = False
        #: Names the running command for its input (an interactive or pty
        #: stream, once its ``started`` event arrived).
        self.handle: Optional[str] = None

    async def _open(self) -> httpx.Response:
        c = self.sandbox.client
        attempt = 0
        refreshed = False
        while True:
            attempt += 1
            req = c._http.build_request(
                "POST",
                self.sandbox._path("exec", "stream"),
                json=self._body,
                headers={"Accept": "text/event-stream"},
                timeout=_core.exec_http_timeout(c._timeout, self._timeout),
            )
            try:
                response = await c._http.send(req, stream=True)
            except httpx.TransportError as exc:
                if attempt < c.retry.attempts and isinstance(exc, _core.NOT_SENT):
                    await asyncio.sleep(c.retry.delay(attempt))
                    continue
                raise _core.transport_error(exc, c.base_url) from exc
            if response.status_code == 401 and not refreshed and c._refresh_token():
                await response.aclose()
                refreshed = True
                continue
            if response.status_code >= 400:
                try:
                    await response.aread()
                finally:
                    await response.aclose()
                _core.raise_for_error(response, "sandbox")
            return response

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        if self._started:
            raise RuntimeError("a command stream can be iterated once")
        self._started = True
        return self._events()

    async def _events(self) -> AsyncIterator[StreamEvent]:
        self._response = await self._open()
        try:
            decoder = SSEDecoder()
            try:
                async for chunk in self._response.aiter_bytes():
                    for sse in decoder.feed(chunk):
                        ev = self._event(sse.event, sse.data)
                        if ev is not None:
                            yield ev
                for sse in decoder.close():
                    ev = self._event(sse.event, sse.data)
                    if ev is not None:
                        yield ev
            except httpx.TransportError as exc:
                raise _core.transport_error(exc, self.sandbox.client.base_url) from exc
            if self.result is None:
                raise ServiceUnavailableError(
                    "the command's event stream ended before its result", kind="stream_incomplete"
                )
        finally:
            await self.aclose()

    def _event(self, event: str, data: str) -> Optional[StreamEvent]:
        kind, payload = _core.stream_event(event, data)
        if kind == "started" and isinstance(payload, Mapping):
            self.handle = str(payload.get("handle", "")) or None
            return StreamEvent(kind="started")
        ev = _to_event(kind, payload)
        if ev is not None and ev.result is not None:
            self.result = ev.result
            if self._raise:
                ev.result.raise_for_failure()
        return ev

    async def _input(self, body: Dict[str, Any]) -> None:
        if self.handle is None:
            raise RuntimeError(
                "no input before the stream's started event: start it with interactive=True or pty=(cols, rows),"
                " and iterate it until its first event"
            )
        await self.sandbox.client.request(
            "POST", self.sandbox._path("exec", seg(self.handle), "input"), json=body
        )

    async def send_stdin(self, data: Union[str, bytes]) -> None:
        """Sends ``data`` to the running command's stdin (on a terminal:
        keystrokes, ``"\r"`` ends a line and ``"\x03"`` is Ctrl-C)."""
        if isinstance(data, bytes):
            import base64 as _b64

            await self._input({"data_base64": _b64.b64encode(data).decode("ascii")})
        else:
            await self._input({"data": data})

    async def close_stdin(self) -> None:
        """Closes the command's stdin (not on a terminal: send ``"\x04"``)."""
        await self._input({"eof": True})

    async def resize(self, cols: int, rows: int) -> None:
        """Resizes the command's terminal; its foreground job gets SIGWINCH."""
        await self._input({"resize": {"cols": cols, "rows": rows}})

    async def signal(self, signal: int) -> None:
        """Sends ``signal`` (a number: 2 SIGINT, 15 SIGTERM) to the command's
        process group."""
        await self._input({"signal": signal})

    async def aclose(self) -> None:
        if self._response is not None:
            await self._response.aclose()

    async def __aenter__(self) -> "AsyncCommandStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def _to_event(kind: str, payload: Any) -> Optional[StreamEvent]:
    """An SSE event of an exec stream as a :class:`StreamEvent` (``None`` for
    kinds this client does not know); an ``error`` event raises."""
    if kind in ("stdout", "stderr"):
        payload = payload if isinstance(payload, Mapping) else {}
        text = str(payload.get("data", ""))
        raw = _core.as_bytes(text)
        b64 = payload.get("base64")
        if isinstance(b64, str):
            import base64 as _b64

            try:
                raw = _b64.b64decode(b64)
            except ValueError:
                pass
        return StreamEvent(kind=kind, text=text, data=raw)
    if kind == "result":
        return StreamEvent(kind="result", result=CommandResult.from_json(payload if isinstance(payload, Mapping) else {}))
    if kind == "error":
        status = 500
        if isinstance(payload, Mapping) and isinstance(payload.get("status"), int):
            status = payload["status"]
        raise error_from_response(status, payload, resource="sandbox")
    return None


def _finish(result: CommandResult, *, check: bool, raise_on_failure: bool) -> CommandResult:
    if raise_on_failure:
        result.raise_for_failure()
    if check and result.failure is None:
        result.check()
    return result
