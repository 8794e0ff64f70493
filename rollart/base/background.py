"""Waiting on one thing while something else runs in the background: `unless_fails`.

In: an awaitable to wait for (a batch, a train step) and a background task or future that may fail
meanwhile (the driver's weight landing, a scheduler's failure signal). Out: the awaitable's result — or,
the moment the background one fails, its error, with the wait cancelled. A background task that ends
without an error leaves the wait to finish. Used by the RL loop (`rollart.loop`) and the rollout scheduler
(`rollart.control.scheduler`), the two places a long wait must not outlive the failure that makes it vain.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, TypeVar

T = TypeVar("T")


async def unless_fails(work: Awaitable[T], background: asyncio.Future[Any] | None) -> T:
    """The result of `work`, unless `background` fails first: then `background`'s error is raised at once and
    `work` is cancelled. `background` is the caller's and is never cancelled here; None: just `await work`.
    When both end at the same moment, `work`'s result wins (the failure surfaces at its next await)."""
    if background is None:
        return await work
    waiting = asyncio.ensure_future(work)
    try:
        await asyncio.wait({waiting, background}, return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done() and not background.cancelled() and background.exception() is not None:
            raise background.exception()  # type: ignore[misc]
        return await waiting
    finally:
        waiting.cancel()  # a no-op once it is done
