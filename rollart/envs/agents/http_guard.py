"""The gateway's HTTP connection limits, below the app: what a request may cost before any route runs.

In: `HttpLimits` (from `envs.gateway`). Out: `protocol_class(limits)`, an HTTP/1.1 protocol for uvicorn
(its h11 implementation, extended), and `HeaderCountGuard`, an ASGI wrapper of the app. Together:
- at most `max_connections` connections are open at once; one more is answered 503 and closed;
- a request's line and headers must arrive within `header_timeout_s` of its first byte (or of the
  connection, for its first request) — a slow client is answered 408 and closed — and hold at most
  `max_header_bytes` (431; h11 buffers no more than that) and `max_headers` fields (431);
- every refusal here, and every request h11 cannot parse (a malformed Content-Length included), is the
  gateway's JSON error (`{"error": {message, type, param, code}}`), never uvicorn's plain text.
The body's own deadline and size are the app's (it reads every body through one bounded reader).

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

from rollart.envs.agents.errors import GatewayError

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class HttpLimits:
    max_connections: int
    header_timeout_s: float
    max_header_bytes: int
    max_headers: int


def error_response(error: GatewayError) -> bytes:
    """`error` as a whole HTTP/1.1 response that closes the connection (for refusals before h11 has a
    request to answer)."""
    body = json.dumps(error.body()).encode()
    head = (f"HTTP/1.1 {error.status} {_PHRASES.get(error.status, 'Error')}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n" + "".join(f"{k}: {v}\r\n" for k, v in error.headers().items()
                                                if k != "connection") + "\r\n")
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
                self._refuse(GatewayError(503, f"the gateway holds {limits.max_connections} open connections, its "
                                          "limit (envs.gateway.max_connections); retry shortly",
                                          code="too_many_connections", kind="server_error", retryable=True))
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
                error = GatewayError(400, "malformed HTTP request (h11 could not parse its head: a bad "
                                     "Content-Length, request line or header)", code="malformed_request")
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
                self._refuse(GatewayError(408, f"the request head did not arrive within {limits.header_timeout_s:g}s "
                                          "(envs.gateway.header_timeout_s)", code="request_timeout"))

        def _refuse(self, error: GatewayError) -> None:
            self._disarm_header_timer()
            if not self.transport.is_closing():
                self.transport.write(error_response(error))
                self.transport.close()

    return GuardedH11Protocol


def _head_too_large(limits: HttpLimits) -> GatewayError:
    return GatewayError(431, f"the request head is over {limits.max_header_bytes} bytes (envs.gateway.max_header_kb)",
                        code="headers_too_large")


class HeaderCountGuard:
    """ASGI wrapper: a request with more than `max_headers` header fields is answered 431 before the app."""

    def __init__(self, app: ASGIApp, max_headers: int, respond: Callable[[GatewayError], Any]) -> None:
        self.app, self.max_headers, self.respond = app, max_headers, respond

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and len(scope.get("headers") or ()) > self.max_headers:
            error = GatewayError(431, f"{len(scope['headers'])} header fields, more than this gateway accepts "
                                 f"({self.max_headers}, envs.gateway.max_headers)", code="too_many_headers")
            await self.respond(error)(scope, receive, send)
            return
        await self.app(scope, receive, send)
