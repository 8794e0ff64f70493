"""What the env plane's HTTP servers share (the agent gateway, the env server): a Starlette app served by
uvicorn on a thread of its own, and request bodies read within a bound.

In: an ASGI app, a host and a port (0: an ephemeral one), connection limits (`http_guard.HttpLimits`).
Out: `ThreadedServer` — `start()` returns once the socket listens (or raises within `START_TIMEOUT_S`
saying why), `loop` is the server's event loop (for work that must run beside the requests), `stop()` ends
it within a timeout; every connection is held to the limits (`http_guard.py`: a connection cap, a header
read timeout, header size and count caps, JSON for every refusal and every request h11 cannot parse).
`read_bounded(request, max_bytes, timeout_s)` → the body, or `BodyTooLarge` as soon as the Content-Length
or the bytes streamed pass the bound (a flood never reaches memory), `BodyTooSlow` once the whole body has
not arrived within `timeout_s`.

Why uvicorn on its own thread and loop: a caller that blocks its own loop (a sync client in `async def`,
a slow env call) cannot stall the server; and TCP_NODELAY on the listening socket (accepted ones
inherit it) keeps a response from waiting out the client's delayed ACK (~40 ms per call on loopback).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any

from starlette.requests import Request

from rollart.envs.serving.http_guard import HeaderCountGuard, HttpLimits, protocol_class

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0
BODY_TIMEOUT_S = 30.0


class BodyTooLarge(ValueError):
    pass


class BodyTooSlow(TimeoutError):
    pass


async def read_bounded(request: Request, max_bytes: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > max_bytes):
        raise BodyTooLarge(f"request body over {max_bytes} bytes")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise BodyTooLarge(f"request body over {max_bytes} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTooSlow(f"the request body did not arrive within {timeout_s:g}s") from None
    return b"".join(chunks)


class ThreadedServer:
    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, name: str = "http",
                 limits: HttpLimits = HttpLimits()) -> None:
        self.app, self.host, self.port, self.name, self.limits = app, host, port, name, limits
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> ThreadedServer:
        import uvicorn

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(HeaderCountGuard(self.app, self.limits.max_headers), log_level="warning",
                                access_log=False, lifespan="off", backlog=4096, timeout_keep_alive=60,
                                http=protocol_class(self.limits),
                                h11_max_incomplete_event_size=self.limits.max_header_bytes)
        self._server = uvicorn.Server(config)
        ready = threading.Event()

        def serve() -> None:
            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(ready.set)
            try:
                self.loop.run_until_complete(self._server.serve(sockets=[sock]))
            finally:
                self.loop.close()

        self._thread = threading.Thread(target=serve, name=f"{self.name}-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        ready.wait(START_TIMEOUT_S)
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the {self.name} did not start listening on {self.host}:{self.port} within "
                                   f"{START_TIMEOUT_S:g}s")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("%s on port %d did not stop within %gs", self.name, self.port, timeout_s)
        self._server = self._thread = None
