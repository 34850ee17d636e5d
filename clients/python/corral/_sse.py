"""An incremental parser for ``text/event-stream`` (server-sent events).

It follows the WHATWG event-stream rules the service's stream needs: lines end
with CRLF, LF or CR (a CR at the end of one chunk and an LF at the start of
the next are one line end); ``field: value`` with at most one space after the
colon removed; ``data`` lines of one event joined with ``\\n``; lines starting
with ``:`` are comments; a blank line dispatches the event; an event without
``data`` is dropped; a partial event at the end of the stream is dropped.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional

__all__ = ["ServerSentEvent", "SSEDecoder", "iter_sse"]


@dataclass(frozen=True)
class ServerSentEvent:
    event: str = "message"
    data: str = ""
    id: Optional[str] = None
    retry: Optional[int] = None


class SSEDecoder:
    """Feed bytes as they arrive; get complete events back."""

    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = ""
        self._pending_cr = False
        self._first = True
        self._event = ""
        self._data: List[str] = []
        self._has_data = False
        self._id: Optional[str] = None
        self._last_id: Optional[str] = None
        self._retry: Optional[int] = None

    def feed(self, chunk: bytes) -> List[ServerSentEvent]:
        """Parse ``chunk``; returns the events it completed."""
        return self._feed_text(self._text.decode(chunk, final=False))

    def close(self) -> List[ServerSentEvent]:
        """End of stream: a final line without its line end still counts, but
        an event never closed by a blank line is dropped."""
        events = self._feed_text(self._text.decode(b"", final=True))
        if self._buf:
            line, self._buf = self._buf, ""
            ev = self._line(line)
            if ev is not None:
                events.append(ev)
        self._reset_event()
        return events

    def _feed_text(self, text: str) -> List[ServerSentEvent]:
        if not text:
            return []
        if self._first:
            self._first = False
            if text.startswith("\ufeff"):
                text = text[1:]
        if self._pending_cr:
            self._pending_cr = False
            if text.startswith("\n"):
                text = text[1:]
        buf = self._buf + text
        events: List[ServerSentEvent] = []
        start = 0
        n = len(buf)
        i = 0
        while i < n:
            c = buf[i]
            if c == "\n" or c == "\r":
                line = buf[start:i]
                if c == "\r":
                    if i + 1 < n:
                        if buf[i + 1] == "\n":
                            i += 1
                    else:
                        self._pending_cr = True
                ev = self._line(line)
                if ev is not None:
                    events.append(ev)
                start = i + 1
            i += 1
        self._buf = buf[start:]
        return events

    def _line(self, line: str) -> Optional[ServerSentEvent]:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
            self._has_data = True
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry":
            if value.isdigit():
                self._retry = int(value)
        return None

    def _dispatch(self) -> Optional[ServerSentEvent]:
        if self._id is not None:
            self._last_id = self._id
        if not self._has_data:
            self._reset_event()
            return None
        ev = ServerSentEvent(
            event=self._event or "message",
            data="\n".join(self._data),
            id=self._last_id,
            retry=self._retry,
        )
        self._reset_event()
        return ev

    def _reset_event(self) -> None:
        self._event = ""
        self._data = []
        self._has_data = False
        self._id = None
        self._retry = None


def iter_sse(chunks: Iterable[bytes]) -> Iterator[ServerSentEvent]:
    """Events from an iterable of byte chunks."""
    decoder = SSEDecoder()
    for chunk in chunks:
        yield from decoder.feed(chunk)
    yield from decoder.close()
