"""The HTTP protocol ``parsearch serve`` runs under uvicorn: h11's, except for a request whose
head (request line and headers) is longer than :data:`MAX_HEAD_BYTES`.

uvicorn answers such a request ``400`` and closes the connection while the client is still
sending it: the bytes left unread make the kernel reset the connection, so the client sees a
reset, not an answer (a 300 KB URL did). Here it is answered ``414 URI Too Long`` (the
request line alone is that long) or ``431 Request Header Fields Too Large``, with a short
JSON body as every other error, and what the client still sends of its head is read and
dropped (at most :data:`LINGER_BYTES`, for at most :data:`LINGER_S`) before the connection
is closed, so that the client reads the answer.

h11 is chosen rather than uvicorn's "auto" (httptools when installed): the bound then holds
whatever else is installed.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# h11's own bound on a request's head: under it, h11 parses the request and the app answers
# (a 16 KB path is a 404 that quotes an excerpt).
MAX_HEAD_BYTES = 16 * 1024
# What is read and dropped of a refused request before the connection is closed anyway.
LINGER_BYTES = 64 * 1024 * 1024
LINGER_S = 5.0
_REASONS = {414: "URI Too Long", 431: "Request Header Fields Too Large"}
_END_OF_HEAD = b"\r\n\r\n"


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with an answer for a request head over :data:`MAX_HEAD_BYTES`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._head = bytearray()  # the start of the request head being received
        self._dropped: int | None = None  # bytes dropped since the refusal; None: not refused
        self._tail = b""  # the last bytes dropped, to see the head's end across two reads
        self._linger: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        if self._dropped is not None:
            self._drop(data)
            return
        if self.conn.their_state is h11.IDLE:  # between requests: this is a request's head
            self._head += data[: MAX_HEAD_BYTES + 1 - len(self._head)]
            if len(self._head) > MAX_HEAD_BYTES:
                self._refuse(data)
                return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the head was parsed
            self._head.clear()

    def _refuse(self, data: bytes) -> None:
        line_ended = b"\n" in self._head
        status = 431 if line_ended else 414
        what = "the request's headers" if line_ended else "the request line (the URL)"
        message = f"{what} is over {MAX_HEAD_BYTES} bytes: no address of this server is that long"
        body = json.dumps({"error": message}).encode()
        head = (
            f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        self._dropped = 0
        self._linger = self.loop.call_later(LINGER_S, self.transport.close)
        self._drop(data)

    def _drop(self, data: bytes) -> None:
        """Read and forget what the client still sends of its head; close once it ended."""
        self._dropped += len(data)
        seen = self._tail + data
        self._tail = seen[-(len(_END_OF_HEAD) - 1) :]
        if _END_OF_HEAD in seen or self._dropped > LINGER_BYTES:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
        super().connection_lost(exc)
