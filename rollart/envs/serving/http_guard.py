"""HTTP connection limits of the env plane's servers (the agent gateway, the env server), below the app:
what a request may cost before any route runs.

In: `HttpLimits` (the gateway's from `envs.gateway`). Out: `protocol_class(limits)`, an HTTP/1.1 protocol
for uvicorn (its h11 implementation, extended), and `HeaderCountGuard`, an ASGI wrapper of the app.
`http_serving.ThreadedServer` puts both in front of every app it serves. Together:
- at most `max_connections` connections are open at once; one more is answered 503 and closed;
- a request's line and headers must arrive within `header_timeout_s` of its first byte (or of the
  connection, for its first request) — a slow client is answered 408 and closed — and hold at most
  `max_header_bytes` (431; h11 buffers no more than that) and `max_headers` fields (431);
- every refusal here, and every request h11 cannot parse (a malformed Content-Length included), is a JSON
  error (`{"error": {message, type, param, code}}`, OpenAI's shape, which holds the env server's `code` and
  `message` too), never uvicorn's plain text.
The body's own deadline and size are the app's (`http_serving.read_bounded`).

Why h11 and not httptools (uvicorn's default when installed): httptools buffers a header line of any size
(a 64 MB line was held whole); h11 refuses a request head past its buffer limit. The subclass hooks only
the protocol's public callbacks (connection made, data received, the 400 response).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class HttpLimits:
    max_connections: int = 4096
    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    max_headers: int = 128


@dataclass(frozen=True)
class Refusal:
    """An answer given below the app: status, machine-readable code, message for people."""

    status: int
    code: str
    message: str
    retryable: bool = False  # 503: the client may try again; anything else: it should not

    def body(self) -> dict[str, Any]:
        kind = "server_error" if self.status >= 500 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": None, "code": self.code}}

    def response(self) -> bytes:
        """A whole HTTP/1.1 response that closes the connection (sent before h11 has a request to answer)."""
        body = json.dumps(self.body()).encode()
        retry = "" if self.retryable else "x-should-retry: false\r\n"
        head = (f"HTTP/1.1 {self.status} {_PHRASES.get(self.status, 'Error')}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n{retry}\r\n")
        return head.encode("latin-1") + body


_PHRASES = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large",
            503: "Service Unavailable"}


def protocol_class(limits: HttpLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with `limits` (pass it as `uvicorn.Config(http=...)`, with
    `h11_max_incomplete_event_size=limits.max_header_bytes`)."""

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                self._refuse(Refusal(503, "too_many_connections", f"the server holds {limits.max_connections} open "
                                     "connections, its limit (envs.gateway.max_connections); retry shortly",
                                     retryable=True))
                return
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE:  # a request head is coming in
                if self._header_timer is None:
                    self._arm_header_timer()  # the first byte of a keep-alive connection's next request
                # h11 bounds a head that arrives in pieces, not one that arrives whole in a single read
                buffered = self.conn.trailing_data[0] + data
                end = buffered.find(b"\r\n\r\n")
                if (end if end >= 0 else len(buffered)) > limits.max_header_bytes:
                    self._refuse(_head_too_large(limits))
                    return
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the request head is in (or the connection failed)
                self._disarm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            # h11 refused the request head: too long (its buffer limit) or malformed (a bad Content-Length …)
            if len(self.conn.trailing_data[0]) > limits.max_header_bytes:
                error = _head_too_large(limits)
            else:
                error = Refusal(400, "malformed_request", "malformed HTTP request (h11 could not parse its head: a "
                                "bad Content-Length, request line or header)")
            self._refuse(error)

        def _arm_header_timer(self) -> None:
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._header_timed_out)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timed_out(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self._refuse(Refusal(408, "request_timeout", "the request head did not arrive within "
                                     f"{limits.header_timeout_s:g}s (envs.gateway.header_timeout_s)"))

        def _refuse(self, refusal: Refusal) -> None:
            self._disarm_header_timer()
            if not self.transport.is_closing():
                self.transport.write(refusal.response())
                self.transport.close()

    return GuardedH11Protocol


def _head_too_large(limits: HttpLimits) -> Refusal:
    return Refusal(431, "headers_too_large", f"the request head is over {limits.max_header_bytes} bytes "
                   "(envs.gateway.max_header_kb)")


class HeaderCountGuard:
    """ASGI wrapper: a request with more than `max_headers` header fields is answered 431 before the app."""

    def __init__(self, app: ASGIApp, max_headers: int) -> None:
        self.app, self.max_headers = app, max_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and len(scope.get("headers") or ()) > self.max_headers:
            refusal = Refusal(431, "too_many_headers", f"{len(scope['headers'])} header fields, more than this "
                              f"server accepts ({self.max_headers}, envs.gateway.max_headers)")
            body = json.dumps(refusal.body()).encode()
            await send({"type": "http.response.start", "status": 431, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"x-should-retry", b"false")]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
