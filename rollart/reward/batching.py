"""`RequestBatcher`: one-trajectory reward requests that end together go to the service in one HTTP request.

In: items — one trajectory's request each: its idempotency key, when its first try left, and its payload as
JSON text (exactly the body a one-trajectory request would carry) — and a `post(body) -> httpx.Response`.
Out: `await send(item)` → (HTTP status, answer) of that item, as a one-trajectory request would have got
them; a transport error of the batch's request (connection, timeout) is raised to every item in it.

When: an item waits at most `batch_ms` for others (a GRPO group's members end within milliseconds of each
other), and a batch goes at once when it holds `max_batch` items or the next item would take its body past
`max_bytes` (the service refuses a larger body whole; an item too large alone goes alone, and gets the 413
it would get anyway). Each event loop batches its own items (httpx clients are per loop).

The wire (protocol.py): `{"v": 1, "batch": [{"idempotency_key", "sent_at", "payload"}]}` → `{"results":
[{"status", "body"}]}` in the same order; an answer that is not a list of results (the whole request refused:
a wrong token, a body over the limit, an outage) is every item's answer. Nothing else changes per item:
its key, its payload's digest (of the same bytes) and its retries are its own, so a retry may travel alone or
in another batch and still be replayed, never scored twice.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import httpx

from rollart.reward.protocol import PAYLOAD_VERSION

_ENVELOPE_BYTES = 64  # {"v": 1, "batch": [...]} around the items
_ITEM_BYTES = 96  # an item's keys, key and timestamp around its payload (plus the key's own length)


@dataclass
class _Pending:
    items: list[tuple[dict[str, Any], asyncio.Future]] = field(default_factory=list)
    size: int = _ENVELOPE_BYTES
    timer: asyncio.TimerHandle | None = None


class RequestBatcher:
    def __init__(self, post: Callable[[bytes], Awaitable[httpx.Response]], batch_ms: float, max_batch: int,
                 max_bytes: int) -> None:
        self.post, self.batch_s, self.max_batch, self.max_bytes = post, batch_ms / 1000, max_batch, max_bytes
        self._pending: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pending] = weakref.WeakKeyDictionary()
        self._sending: set[asyncio.Task] = set()
        self.batches = 0  # requests sent
        self.items = 0  # items they carried

    async def send(self, key: str | None, sent_at: float, payload: str) -> tuple[int, Any]:
        loop = asyncio.get_running_loop()
        item = {"idempotency_key": key, "sent_at": sent_at, "payload": payload}
        size = len(payload) + len(key or "") + _ITEM_BYTES
        pending = self._pending.get(loop)
        if pending is not None and pending.items and pending.size + size > self.max_bytes:
            self._flush(loop)
            pending = None
        if pending is None:
            pending = self._pending[loop] = _Pending()
        future: asyncio.Future = loop.create_future()
        pending.items.append((item, future))
        pending.size += size
        if len(pending.items) >= self.max_batch:
            self._flush(loop)
        elif pending.timer is None:
            pending.timer = loop.call_later(self.batch_s, self._flush, loop)
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        pending = self._pending.pop(loop, None)
        if pending is None:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        items = [(item, future) for item, future in pending.items if not future.done()]  # (a cancelled waiter)
        if items:
            task = loop.create_task(self._send(items))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, items: list[tuple[dict[str, Any], asyncio.Future]]) -> None:
        body = json.dumps({"v": PAYLOAD_VERSION, "batch": [item for item, _ in items]}).encode()
        self.batches += 1
        self.items += len(items)
        try:
            response = await self.post(body)
        except Exception as exc:  # noqa: BLE001 — the batch's transport error is each item's
            for _, future in items:
                if not future.done():
                    future.set_exception(exc)
            return
        try:
            answer = response.json()
        except ValueError:
            answer = {"error": response.text[:200]}
        results = answer.get("results") if response.status_code == 200 and isinstance(answer, dict) else None
        if not (isinstance(results, list) and len(results) == len(items)
                and all(isinstance(r, dict) and isinstance(r.get("status"), int) for r in results)):
            results = [{"status": response.status_code if results is None else 502,
                        "body": answer if results is None else {"error": "a batch answer that does not match its "
                                                                         "request", "code": "internal"}}] * len(items)
        for (_, future), result in zip(items, results):
            if not future.done():
                future.set_result((result["status"], result.get("body")))
