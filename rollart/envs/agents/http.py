"""HTTP helpers of the gateway: server-sent event streams, and handing freed memory back after large bodies.

Streams: the engine hands the gateway whole generations, so a stream's events are all known when it starts;
they are sent from an async iterator (Starlette would iterate a sync one on a thread pool).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
from typing import Any, AsyncIterator, Callable, Iterable

from starlette.responses import StreamingResponse


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def release_free_memory() -> None:
    """glibc keeps freed heap memory for the process (a 4 MB body and its copies stayed resident); this
    returns what is free to the system. A no-op where the C library has no malloc_trim."""
    if _TRIM is not None:
        _TRIM(0)


def named_events(events: Iterable[tuple[str, dict[str, Any]]]) -> list[bytes]:
    """Server-sent events with an event name (the Responses and Messages streams; no [DONE] line)."""
    return [f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode() for name, data in events]


def stream_response(events: Iterable[bytes]) -> StreamingResponse:
    events = list(events)

    async def body() -> AsyncIterator[bytes]:  # async: Starlette would iterate a sync one in a thread pool
        for event in events:
            yield event

    return StreamingResponse(body(), media_type="text/event-stream")
