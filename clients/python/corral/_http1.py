"""A lean HTTP/1.1 client for the hot path: one JSON request, one JSON
answer, over kept-alive connections to the service (TCP or its Unix
socket). Same requests and answers as through httpx (the wire is
unchanged); a tenth of the CPU per request, which decides how many
commands one Python process can drive.

Only plain ``http://`` and Unix sockets; the clients send everything
else (https, a custom transport) through httpx. :class:`AsyncJsonPool`
serves the asyncio client, :class:`JsonPool` the synchronous one.

A connection is reused only after its answer was read to the end and it
was not closed meanwhile, so a request is never written to a connection
the service had closed before (a close racing the write is reported as
"maybe sent", as httpx does)."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlsplit

# The largest answer head and body taken: a command's answer holds its
# output, bounded by the service's ``max_output`` ceiling (64 MiB per
# stream by default, base64 in JSON at worst).
MAX_HEAD = 64 * 1024
MAX_BODY = 1 << 30


class NotSent(Exception):
    """The request surely did not reach the service (no connection)."""


class MaybeSent(Exception):
    """The connection failed after the request may have reached the service."""


class Timeout(Exception):
    """No (complete) answer in time."""


class Answer:
    """A parsed answer: status, lower-cased headers, body."""

    __slots__ = ("status", "headers", "body", "keep_alive")

    def __init__(self, status: int, headers: Dict[str, str], body: bytes, keep_alive: bool) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive


class Parser:
    """Feeds on bytes until one answer is complete (``Content-Length`` or
    chunked bodies)."""

    __slots__ = ("buf", "head", "need", "chunked", "answer", "_body")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.head: Optional[Tuple[int, Dict[str, str], bool]] = None
        self.need = -1
        self.chunked = False
        self.answer: Optional[Answer] = None
        self._body = bytearray()

    def feed(self, data: bytes) -> bool:
        """True once the answer is complete (then in ``self.answer``)."""
        self.buf += data
        if self.head is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD:
                    raise MaybeSent("the service's answer head is too long")
                return False
            self._parse_head(bytes(self.buf[:end]))
            del self.buf[: end + 4]
        if self.chunked:
            return self._chunks()
        if len(self.buf) >= self.need:
            status, headers, keep = self.head  # type: ignore[misc]
            self.answer = Answer(status, headers, bytes(self.buf[: self.need]), keep)
            return True
        return False

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise MaybeSent(f"not an HTTP/1.1 answer: {lines[0][:100]!r}")
        status = int(parts[1])
        headers: Dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        keep = headers.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.chunked = True
            self.need = 0
        else:
            length = headers.get("content-length")
            if length is None or not length.isdigit():
                raise MaybeSent("the service's answer has no Content-Length")
            self.need = int(length)
            if self.need > MAX_BODY:
                raise MaybeSent(f"the service's answer is too large ({self.need} bytes)")
        self.head = (status, headers, keep)

    def _chunks(self) -> bool:
        body: bytearray = self._body
        while True:
            line_end = self.buf.find(b"\r\n")
            if line_end < 0:
                return False
            size_text = bytes(self.buf[:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise MaybeSent(f"a bad chunk size in the service's answer: {size_text[:20]!r}") from None
            if size == 0:
                # Trailers (none expected) end with an empty line.
                end = self.buf.find(b"\r\n\r\n", line_end)
                if end < 0 and not self.buf.endswith(b"0\r\n\r\n"):
                    return False
                status, headers, keep = self.head  # type: ignore[misc]
                self.answer = Answer(status, headers, bytes(body), keep)
                return True
            if len(self.buf) < line_end + 2 + size + 2:
                return False
            body += self.buf[line_end + 2 : line_end + 2 + size]
            if len(body) > MAX_BODY:
                raise MaybeSent("the service's answer is too large")
            del self.buf[: line_end + 2 + size + 2]


class Endpoint:
    """Where the service is and the fixed part of every request's head."""

    def __init__(self, base_url: str, uds: Optional[str], headers: Dict[str, str]) -> None:
        self.uds = uds
        parts = urlsplit(base_url)
        self.host = parts.hostname or "localhost"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        host_header = parts.netloc if not uds else (parts.netloc or "localhost")
        self.headers = dict(headers)
        self.host_header = host_header
        self.fixed = b""
        self.set_headers(headers)

    @staticmethod
    def usable(base_url: str) -> bool:
        return urlsplit(base_url).scheme == "http"

    def set_headers(self, headers: Dict[str, str]) -> None:
        self.headers = dict(headers)
        lines = [f"Host: {self.host_header}"]
        for name, value in self.headers.items():
            if name.lower() in ("host", "content-type", "content-length", "connection"):
                continue
            lines.append(f"{name}: {value}")
        lines.append("Content-Type: application/json")
        self.fixed = ("\r\n".join(lines) + "\r\n").encode("latin-1")

    def request(self, method: str, path: str, body: bytes) -> bytes:
        return b"".join(
            (
                f"{method} {self.prefix}{path} HTTP/1.1\r\n".encode("latin-1"),
                self.fixed,
                b"Content-Length: %d\r\n\r\n" % len(body),
                body,
            )
        )


# --- asyncio --------------------------------------------------------------


class _Conn(asyncio.Protocol):
    __slots__ = ("transport", "parser", "waiter", "closed")

    def __init__(self) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self.parser: Optional[Parser] = None
        self.waiter: Optional["asyncio.Future[Answer]"] = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        parser, waiter = self.parser, self.waiter
        if parser is None or waiter is None or waiter.done():
            # Bytes nobody asked for: the connection is out of step.
            self.closed = True
            if self.transport is not None:
                self.transport.close()
            return
        try:
            if parser.feed(data):
                waiter.set_result(parser.answer)  # type: ignore[arg-type]
        except MaybeSent as exc:
            self.closed = True
            waiter.set_exception(exc)
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(MaybeSent(f"the service closed the connection ({exc or 'end of stream'})"))

    def eof_received(self) -> Optional[bool]:
        return None


class AsyncJsonPool:
    """Kept-alive connections of one event loop; one request at a time on
    each, as many connections as requests in flight."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._idle: List[_Conn] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    async def _connect(self, timeout: Optional[float]) -> _Conn:
        loop = asyncio.get_running_loop()
        ep = self.endpoint
        try:
            if ep.uds:
                opening = loop.create_unix_connection(_Conn, ep.uds)
            else:
                opening = loop.create_connection(_Conn, ep.host, ep.port)
            _, conn = await asyncio.wait_for(opening, timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise NotSent(f"cannot connect: {exc or 'timed out'}") from exc
        return conn

    async def send(
        self, method: str, path: str, body: bytes, timeout: Optional[float], connect_timeout: Optional[float]
    ) -> Answer:
        """One request and its answer (``timeout``: seconds to wait for
        it, ``connect_timeout``: for a new connection). Raises
        :class:`NotSent`, :class:`MaybeSent` or :class:`Timeout`."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # Connections belong to the loop that made them.
            self._drop_idle()
            self._loop = loop
        conn = None
        while self._idle:
            c = self._idle.pop()
            if not c.closed and not _readable(c.transport):
                conn = c
                break
            c.closed = True
            c.transport.close()  # type: ignore[union-attr]
        if conn is None:
            conn = await self._connect(connect_timeout)
        waiter = loop.create_future()
        conn.parser = Parser()
        conn.waiter = waiter
        conn.transport.write(self.endpoint.request(method, path, body))  # type: ignore[union-attr]
        timer = None
        if timeout is not None:
            timer = loop.call_later(timeout, _expire, waiter)
        try:
            answer = await waiter
        except BaseException:
            conn.closed = True
            conn.transport.close()  # type: ignore[union-attr]
            raise
        finally:
            if timer is not None:
                timer.cancel()
            conn.waiter = None
            conn.parser = None
        if answer.keep_alive and not conn.closed:
            self._idle.append(conn)
        else:
            conn.closed = True
            conn.transport.close()  # type: ignore[union-attr]
        return answer

    def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        for c in idle:
            if c.transport is not None:
                try:
                    c.transport.close()
                except RuntimeError:  # its loop is closed
                    pass

    async def aclose(self) -> None:
        self._drop_idle()


def _readable(transport: Optional[asyncio.BaseTransport]) -> bool:
    """An idle connection with something to read: the service closed it
    (or sent bytes nobody asked for); the loop may not have seen it yet."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _expire(waiter: "asyncio.Future[Answer]") -> None:
    if not waiter.done():
        waiter.set_exception(Timeout("no answer in time"))


# --- synchronous ----------------------------------------------------------


class _SyncConn:
    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def stale(self) -> bool:
        """Closed by the service (or bytes nobody asked for) while idle."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class JsonPool:
    """Kept-alive connections shared by threads; one request at a time on
    each."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._idle: List[_SyncConn] = []
        self._lock = threading.Lock()

    def _connect(self, timeout: Optional[float]) -> _SyncConn:
        ep = self.endpoint
        try:
            if ep.uds:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(timeout)
                    sock.connect(ep.uds)
                except BaseException:
                    sock.close()
                    raise
            else:
                sock = socket.create_connection((ep.host, ep.port), timeout=timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            raise NotSent(f"cannot connect: {exc}") from exc
        return _SyncConn(sock)

    def send(
        self, method: str, path: str, body: bytes, timeout: Optional[float], connect_timeout: Optional[float]
    ) -> Answer:
        """As :meth:`AsyncJsonPool.send`."""
        conn = None
        with self._lock:
            while self._idle:
                c = self._idle.pop()
                if c.stale():
                    c.close()
                    continue
                conn = c
                break
        if conn is None:
            conn = self._connect(connect_timeout)
        sock = conn.sock
        parser = Parser()
        try:
            sock.settimeout(timeout)
            sock.sendall(self.endpoint.request(method, path, body))
            while True:
                data = sock.recv(262144)
                if not data:
                    raise MaybeSent("the service closed the connection (end of stream)")
                if parser.feed(data):
                    break
        except socket.timeout as exc:
            conn.close()
            raise Timeout("no answer in time") from exc
        except OSError as exc:
            conn.close()
            raise MaybeSent(f"the connection failed: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        answer = parser.answer
        assert answer is not None
        if answer.keep_alive:
            with self._lock:
                self._idle.append(conn)
        else:
            conn.close()
        return answer

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

