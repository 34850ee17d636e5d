"""The asyncio client: :class:`AsyncClient`, :class:`AsyncSandbox`,
:class:`AsyncShell` and :class:`AsyncCommandStream`, the same API as the
synchronous one with ``await``::

    async with AsyncSandbox(image="python:3.12-slim") as sb:
        r = await sb.run("python -c 'print(6*7)'", timeout=10)
        async for ev in sb.stream("make test"):
            ...
"""

from __future__ import annotations

import asyncio
import inspect
import json as _json
import logging
import os
from types import TracebackType
from typing import Any, AsyncIterator, Dict, Generator, List, Mapping, Optional, Type, Union

import httpx

from . import _core
from . import code as _code
from ._core import Command, RetryPolicy, Stdin, seg
from ._discovery import TokenSource
from ._sse import SSEDecoder
from .client import _finish, _to_event
from .errors import CorralError, NotFoundError, SandboxNotFoundError, ServiceUnavailableError
from .models import CommandResult, FileEntry, Health, ResetResult, SandboxInfo, Snapshot, StreamEvent, WhoAmI

__all__ = ["AsyncClient", "AsyncSandbox", "AsyncShell", "AsyncCommandStream"]

log = logging.getLogger("corral")

PathLike = Union[str, "os.PathLike[str]"]
Data = Union[bytes, bytearray, memoryview, str]


class AsyncClient:
    """A connection to a corral service, for asyncio. Arguments as
    :class:`corral.Client`."""

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
                    await asyncio.sleep(self.retry.delay(attempt))
                    continue
                raise _core.transport_error(exc, self.base_url) from exc
            if response.status_code == 401 and not refreshed and self._refresh_token():
                # A restarted local service has a new generated token.
                refreshed = True
                continue
            if idempotent and attempt < self.retry.attempts and _core.should_retry_status(response):
                await asyncio.sleep(_core.status_retry_delay(self.retry, attempt, response))
                continue
            _core.raise_for_error(response, resource)
            return response

    def _refresh_token(self) -> bool:
        """After a 401: read the local service's token file again; True when
        it holds a new token (now sent)."""
        if not self._tokens.refresh():
            return False
        self._http.headers["Authorization"] = f"Bearer {self._tokens.token}"
        return True

    async def aclose(self) -> None:
        await self._http.aclose()

    close = aclose

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def health(self) -> Health:
        r = await self.request("GET", "/v1/health", idempotent=True)
        return Health.from_json(r.json())

    async def whoami(self) -> WhoAmI:
        """As :meth:`corral.Client.whoami`."""
        r = await self.request("GET", "/v1/whoami", idempotent=True)
        return WhoAmI.from_json(r.json())

    async def usage(self) -> Dict[str, Any]:
        """As :meth:`corral.Client.usage`."""
        r = await self.request("GET", "/v1/usage", idempotent=True)
        return dict(r.json())

    async def images(self) -> Dict[str, Any]:
        """As :meth:`corral.Client.images`."""
        r = await self.request("GET", "/v1/images", idempotent=True)
        return dict(r.json())

    async def pull(self, image: str, *, timeout: Optional[float] = 900.0) -> Dict[str, Any]:
        """As :meth:`corral.Client.pull`."""
        r = await self.request("POST", "/v1/images/pull", json={"image": image}, timeout=timeout, idempotent=True)
        return dict(r.json())

    def sandbox(
        self,
        *,
        image: Optional[str] = None,
        spec: Optional[Mapping[str, Any]] = None,
        profile: Optional[str] = None,
        session: Optional[str] = None,
        persistent: bool = False,
        pristine: Optional[bool] = None,
    ) -> "AsyncSandbox":
        """A sandbox to be created by ``async with`` or ``await``."""
        return AsyncSandbox(
            self, image=image, spec=spec, profile=profile, session=session, persistent=persistent,
            pristine=pristine,
        )

    async def create_sandbox(self, **kwargs: Any) -> "AsyncSandbox":
        """Create a sandbox now (arguments as :meth:`sandbox`)."""
        return await self.sandbox(**kwargs)

    async def get_sandbox(self, sandbox_id: str) -> "AsyncSandbox":
        info = await self.sandbox_info(sandbox_id)
        sb = AsyncSandbox(self)
        sb._info = info
        return sb

    async def sandbox_info(self, sandbox_id: str) -> SandboxInfo:
        r = await self.request("GET", f"/v1/sandboxes/{seg(sandbox_id)}", idempotent=True, resource="sandbox")
        return SandboxInfo.from_json(r.json())

    async def list_sandboxes(self) -> List[SandboxInfo]:
        r = await self.request("GET", "/v1/sandboxes", idempotent=True)
        return [SandboxInfo.from_json(s) for s in r.json().get("sandboxes", [])]

    async def delete_sandbox(self, sandbox_id: str, *, missing_ok: bool = True) -> None:
        try:
            await self.request("DELETE", f"/v1/sandboxes/{seg(sandbox_id)}", idempotent=True, resource="sandbox")
        except NotFoundError:
            if not missing_ok:
                raise

    async def snapshots(self) -> List[Snapshot]:
        """As :meth:`corral.Client.snapshots`."""
        r = await self.request("GET", "/v1/snapshots", idempotent=True)
        return [Snapshot.from_json(s) for s in r.json().get("snapshots", [])]

    async def snapshot_info(self, name: str) -> Snapshot:
        """As :meth:`corral.Client.snapshot_info`."""
        r = await self.request("GET", f"/v1/snapshots/{seg(name)}", idempotent=True, resource="snapshot")
        return Snapshot.from_json(r.json())

    async def delete_snapshot(self, name: Union[str, Snapshot], *, missing_ok: bool = False) -> None:
        """As :meth:`corral.Client.delete_snapshot`."""
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
        """As :meth:`corral.Client.fork` (``env``: values of the snapshot's
        variables, which it keeps by name only)."""
        name = snapshot.name if isinstance(snapshot, Snapshot) else snapshot
        body = _core.fork_body(n, session_prefix=session_prefix, env=env)
        r = await self.request(
            "POST",
            f"/v1/snapshots/{seg(name)}/fork",
            json=body,
            timeout=httpx.Timeout(_core.CREATE_TIMEOUT, connect=self._timeout.connect),
            resource="snapshot",
        )
        out = []
        for s in r.json().get("sandboxes", []):
            sb = AsyncSandbox(self)
            sb._info = SandboxInfo.from_json(s)
            out.append(sb)
        return out

    async def _create(self, body: Dict[str, Any]) -> SandboxInfo:
        r = await self.request(
            "POST",
            "/v1/sandboxes",
            json=body,
            timeout=httpx.Timeout(_core.CREATE_TIMEOUT, connect=self._timeout.connect),
            idempotent=True,
        )
        return SandboxInfo.from_json(r.json())


class AsyncSandbox:
    """A sandbox, for asyncio. Created on ``async with`` (deleted on exit) or
    ``sb = await AsyncSandbox(...)``; arguments as :class:`corral.Sandbox`."""

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
        base_url: Optional[str] = None,
        token: Optional[str] = None,
        timeout: Union[float, httpx.Timeout, None] = None,
    ) -> None:
        self._owns_client = client is None
        self.client = client if client is not None else AsyncClient(base_url, token=token, timeout=timeout)
        self._body = _core.create_body(
            session=session, image=image, spec=spec, profile=profile, persistent=persistent, pristine=pristine
        )
        self._info: Optional[SandboxInfo] = None
        self._deleted = False

    @classmethod
    async def create(cls, client: Optional[AsyncClient] = None, **kwargs: Any) -> "AsyncSandbox":
        return await cls(client, **kwargs).start()

    async def start(self) -> "AsyncSandbox":
        """Create the sandbox (once)."""
        if self._info is None:
            try:
                self._info = await self.client._create(self._body)
            except BaseException:
                if self._owns_client:
                    await self.client.aclose()
                raise
        return self

    def __await__(self) -> Generator[Any, None, "AsyncSandbox"]:
        return self.start().__await__()

    @property
    def info(self) -> SandboxInfo:
        if self._info is None:
            raise RuntimeError("the sandbox is not created yet: use `async with` or `await` it")
        return self._info

    @property
    def id(self) -> str:
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
        self._info = await self.client.sandbox_info(self.id)
        return self._info

    def _path(self, *parts: str) -> str:
        return "/v1/sandboxes/" + seg(self.id) + "".join("/" + p for p in parts)

    def __repr__(self) -> str:
        if self._info is None:
            return "AsyncSandbox(<not created>)"
        return f"AsyncSandbox(id={self.id!r}, container_id={(self.container_id or '')[:12]!r}, image={self.image!r})"

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
        """As :meth:`corral.Sandbox.run`."""
        body = _core.exec_body(
            cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin, max_output=max_output,
            exclusive=exclusive,
            wait_for_output=wait_for_output,
        )
        r = await self.client.request(
            "POST",
            self._path("exec"),
            json=body,
            timeout=_core.exec_http_timeout(self.client._timeout, timeout),
            resource="sandbox",
        )
        return _finish(CommandResult.from_json(r.json()), check=check, raise_on_failure=raise_on_failure)

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
    ) -> "AsyncCommandStream":
        """As :meth:`corral.Sandbox.stream`, iterated with ``async for``."""
        body = _core.exec_body(
            cmd,
            timeout=timeout,
            cwd=cwd,
            env=env,
            stdin=stdin,
            max_output=max_output,
            wait_for_output=wait_for_output,
        )
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
        """
        c = self.client
        body = _code.run_body(code, context, env, timeout, max_output)
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
                        if inspect.isawaitable(done):
                            await done
                for sse in decoder.close():
                    data = _json.loads(sse.data) if sse.data else {}
                    done = _code.apply(ex, sse.event, data, on_stdout, on_stderr, on_result, on_error)
                    if inspect.isawaitable(done):
                        await done
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

    def shell(self, name: str = "main") -> "AsyncShell":
        return AsyncShell(self, name)

    async def shells(self) -> List[str]:
        r = await self.client.request("GET", self._path("shells"), idempotent=True, resource="sandbox")
        return list(r.json().get("shells", []))

    async def write_file(
        self, path: str, data: Data, mode: Union[int, str, None] = None, mkdirs: bool = False
    ) -> None:
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
        params: Dict[str, Any] = {"path": path}
        if max_bytes is not None:
            params["max_bytes"] = int(max_bytes)
        r = await self.client.request("GET", self._path("files"), params=params, idempotent=True, resource="file")
        return r.content

    async def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        return (await self.read_file(path)).decode(encoding, errors)

    async def list_files(self, path: str) -> List[FileEntry]:
        r = await self.client.request(
            "GET", self._path("files", "list"), params={"path": path}, idempotent=True, resource="file"
        )
        return [FileEntry.from_json(e) for e in r.json().get("entries", [])]

    async def upload_tar(self, dest: str, tar: Union[bytes, bytearray, memoryview]) -> None:
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
        r = await self.client.request(
            "GET", self._path("archive"), params={"path": path}, idempotent=True, resource="file"
        )
        return r.content

    async def upload_dir(self, local_dir: PathLike, dest: str) -> None:
        await self.upload_tar(dest, _core.pack_dir(local_dir))

    async def download_dir(self, path: str, local_dir: PathLike) -> List[str]:
        return _core.unpack_tar(await self.download_tar(path), local_dir)

    async def usage(self) -> Dict[str, Any]:
        """As :meth:`corral.Sandbox.usage`."""
        r = await self.client.request("GET", self._path("usage"), idempotent=True, resource="sandbox")
        return dict(r.json())

    async def egress(self) -> Dict[str, Any]:
        """As :meth:`corral.Sandbox.egress`."""
        r = await self.client.request("GET", self._path("egress"), idempotent=True, resource="sandbox")
        return dict(r.json())

    async def port_url(self, port: int) -> str:
        """As :meth:`corral.Sandbox.port_url`."""
        r = await self.client.request("GET", self._path(f"ports/{int(port)}"), idempotent=True, resource="sandbox")
        return str(r.json()["url"])

    async def reset(self) -> ResetResult:
        """Return the sandbox to its state right after start (as
        :meth:`corral.Sandbox.reset`): in place when it was created with
        ``pristine=True``, else by replacing its container."""
        r = await self.client.request(
            "POST",
            self._path("reset"),
            timeout=httpx.Timeout(_core.CREATE_TIMEOUT, connect=self.client._timeout.connect),
            idempotent=True,
            resource="sandbox",
        )
        result = ResetResult.from_json(r.json())
        if not result.in_place:
            try:
                await self.refresh()
            except CorralError as exc:
                log.debug("corral: refreshing %s after a reset failed: %s", self.id, exc)
        return result

    async def snapshot(self, name: str, durable: bool = False, kind: Optional[str] = None) -> Snapshot:
        """As :meth:`corral.Sandbox.snapshot`."""
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

    async def delete(self) -> None:
        if self._deleted or self._info is None:
            return
        await self.client.delete_sandbox(self.id)
        self._deleted = True

    async def aclose(self) -> None:
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
    """A shell session, for asyncio; as :class:`corral.Shell`."""

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
        body = _core.shell_body(cmd, timeout=timeout, max_output=max_output)
        c = self.sandbox.client
        r = await c.request(
            "POST",
            self.sandbox._path("shells", seg(self.name), "exec"),
            json=body,
            timeout=_core.exec_http_timeout(c._timeout, timeout),
            resource="sandbox",
        )
        return _finish(CommandResult.from_json(r.json()), check=check, raise_on_failure=raise_on_failure)

    async def close(self) -> None:
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


class AsyncCommandStream:
    """The events of a streamed command, for ``async for``; ``result`` holds
    the final :class:`CommandResult` once it arrived."""

    def __init__(
        self, sandbox: AsyncSandbox, body: Dict[str, Any], timeout: Optional[float], raise_on_failure: bool
    ) -> None:
        self.sandbox = sandbox
        self.result: Optional[CommandResult] = None
        self._body = body
        self._timeout = timeout
        self._raise = raise_on_failure
        self._response: Optional[httpx.Response] = None
        self._started = False

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
            raise RuntimeError("an AsyncCommandStream can be iterated once")
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
        ev = _to_event(kind, payload)
        if ev is not None and ev.result is not None:
            self.result = ev.result
            if self._raise:
                ev.result.raise_for_failure()
        return ev

    async def aclose(self) -> None:
        if self._response is not None:
            await self._response.aclose()

    async def __aenter__(self) -> "AsyncCommandStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
