"""Idempotency ledger: the service's memory of which trajectories it has scored, so each is scored once.

In: idempotency keys (the trajectory id) from requests, and the scorer's outcome. Out, for `claim(key)`:
- `("done", answer)` — already scored; the stored answer is returned again (a retried request);
- `("owner", token)` — nobody holds the key: the caller scores it, then `complete(key, token, answer)`, or
  `release(key, token)` if scoring failed (the key is free again; a failure is not a scoring);
- `("busy", None)` — another request is scoring it now: `await wait(key, timeout)` for its answer.

Guarantees (single event loop; the Ray actor in `service.py` hosts one for all replicas):
- At most one owner per key at a time. A claim whose owner vanished (a replica died mid-scoring) expires
  after `lease_s`; then a new owner may take it, and if the old owner still completes, its answer is
  dropped (first answer wins) and counted in `late_completions`.
- `scorings[key]` counts completed scorings while the key is remembered; `duplicates` counts completions
  of a key that was already done (0 when exactly-once held).
- Bounded memory: at most `max_keys` done keys (least recently used evicted first), each for `ttl_s`.
  A retry that arrives after its key was evicted is scored again — the documented limit of exactly-once.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

ClaimState = Literal["done", "owner", "busy"]


@dataclass
class _Pending:
    token: int
    expires: float
    event: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Done:
    answer: dict[str, Any]
    stored: float
    scorings: int = 1


class IdempotencyLedger:
    def __init__(
        self, max_keys: int, ttl_s: float, lease_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_keys, self.ttl_s, self.lease_s, self.clock = max_keys, ttl_s, lease_s, clock
        self._done: OrderedDict[str, _Done] = OrderedDict()
        self._pending: dict[str, _Pending] = {}
        self._tokens = itertools.count(1)
        self.completed = 0
        self.duplicates = 0
        self.late_completions = 0
        self.replays = 0
        self.evicted = 0
        self.lease_expiries = 0

    def _lookup(self, key: str) -> _Done | None:
        done = self._done.get(key)
        if done is None:
            return None
        if self.clock() - done.stored > self.ttl_s:
            del self._done[key]
            self.evicted += 1
            return None
        self._done.move_to_end(key)
        return done

    def claim(self, key: str) -> tuple[ClaimState, Any]:
        done = self._lookup(key)
        if done is not None:
            self.replays += 1
            return "done", done.answer
        pending = self._pending.get(key)
        now = self.clock()
        if pending is not None and now < pending.expires:
            return "busy", None
        if pending is not None:  # the owner's lease ran out: hand the key on, wake its waiters
            self.lease_expiries += 1
            pending.event.set()
        token = next(self._tokens)
        self._pending[key] = _Pending(token, now + self.lease_s)
        return "owner", token

    def complete(self, key: str, token: int, answer: dict[str, Any]) -> bool:
        """Store the answer of the owner `token`. False when the key was already done (answer dropped)."""
        pending = self._pending.get(key)
        if pending is not None and pending.token == token:
            del self._pending[key]
            pending.event.set()
        elif pending is not None or key in self._done:
            self.late_completions += 1
        done = self._lookup(key)
        self.completed += 1
        if done is not None:
            done.scorings += 1
            self.duplicates += 1
            return False
        self._done[key] = _Done(answer, self.clock())
        while len(self._done) > self.max_keys:
            self._done.popitem(last=False)
            self.evicted += 1
        return True

    def release(self, key: str, token: int) -> None:
        """The owner failed to score: free the key so a retry can take it."""
        pending = self._pending.get(key)
        if pending is not None and pending.token == token:
            del self._pending[key]
            pending.event.set()

    async def wait(self, key: str, timeout_s: float) -> dict[str, Any] | None:
        """The answer once the current owner completes; None if it released, expired or `timeout_s` passed."""
        pending = self._pending.get(key)
        if pending is not None:
            remaining = max(0.0, min(timeout_s, pending.expires - self.clock()))
            try:
                await asyncio.wait_for(pending.event.wait(), remaining)
            except asyncio.TimeoutError:
                return None
        done = self._lookup(key)
        return done.answer if done is not None else None

    def scorings(self, key: str) -> int:
        done = self._done.get(key)
        return done.scorings if done is not None else 0

    def stats(self) -> dict[str, int]:
        return {
            "keys": len(self._done),
            "pending": len(self._pending),
            "completed": self.completed,
            "duplicates": self.duplicates,
            "late_completions": self.late_completions,
            "replays": self.replays,
            "evicted": self.evicted,
            "lease_expiries": self.lease_expiries,
        }


class SharedLedger:
    """The ledger as the service's replicas use it (the `Ledger` protocol of handler.py): async methods,
    plus each replica's busy and alive seconds for the reward pool's utilisation. Hosted in-process for a
    single handler, or as one Ray actor shared by every Serve replica (service.py)."""

    def __init__(self, max_keys: int, ttl_s: float, lease_s: float) -> None:
        self.ledger = IdempotencyLedger(max_keys, ttl_s, lease_s)
        self.replicas: dict[str, tuple[float, float]] = {}  # replica → (busy_s, alive_s), latest report

    async def claim(self, key: str) -> tuple[ClaimState, Any]:
        return self.ledger.claim(key)

    async def complete(self, key: str, token: int, answer: dict[str, Any]) -> bool:
        return self.ledger.complete(key, token, answer)

    async def release(self, key: str, token: int) -> None:
        self.ledger.release(key, token)

    async def wait(self, key: str, timeout_s: float) -> dict[str, Any] | None:
        return await self.ledger.wait(key, timeout_s)

    def report(self, replica: str, busy_s: float, alive_s: float) -> None:
        self.replicas[replica] = (busy_s, alive_s)

    def scorings(self, key: str) -> int:
        return self.ledger.scorings(key)

    def stats(self) -> dict[str, float]:
        busy = sum(b for b, _ in self.replicas.values())
        alive = sum(a for _, a in self.replicas.values())
        return {**self.ledger.stats(), "replica_starts": len(self.replicas), "busy_s": busy, "alive_s": alive}
