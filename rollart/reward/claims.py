"""The claim book: the service's memory of what it has scored, so each request is scored once.

In: idempotency keys — `<principal>|<run id>/<attempt>/<trajectory id>`, the principal being the job the
request's token belongs to (tokens.py), so two jobs, two runs or two evaluations never share a key — with
the SHA-256 of the request body; and the scorer's outcome. Out, for `claim(key, digest)`:
- `("done", answer)` — already scored with this same payload; the stored answer is returned again;
- `("owner", token)` — nobody holds the key: the caller scores it, then `complete(key, token, answer)`, or
  `release(key, token)` if scoring failed (the key is free again; a failure is not a scoring);
- `("busy", None)` — another request with this payload is scoring it now: `await wait(key, timeout)`;
- `("conflict", None)` — the key was used with a different payload (scored, or being scored under a live
  lease): never a replay (HTTP 409).
A batched request's items are claimed, completed and released in one call each (`claim_many`,
`complete_many`, `release_many`: the same rules, item by item, in order).

Guarantees (single event loop; the Ray actor in `service.py` hosts one for all replicas):
- At most one owner per key at a time. A claim whose owner vanished (a replica died mid-scoring) expires
  after `lease_s`, whatever its payload digest: then a new owner may take it (with any payload — a claim
  with a bogus digest holds a key for one lease at most), and if the old owner still completes, its
  answer is dropped (first answer wins) and counted in `late_completions`. A claim nobody took over is
  forgotten by `expire()` one more lease after its own ran out (its owner may still complete until then),
  so held claims stay bounded too.
- `scorings(key)` counts completed scorings while the key is remembered; `duplicates` counts completions
  of a key that was already done (0 when exactly-once held).
- Bounded memory: keys, digests and stored answers together stay under `max_bytes` (oldest entries are
  evicted first, counted in `evicted`), and an entry is dropped `ttl_s` after it was stored (`expired`)
  by `expire()`, which every call runs and `SharedClaimBook` also runs on its own every `ttl_s / 4` (at most
  every 30 s), so an idle service does not keep them. A retry that arrives after its key is gone is
  scored again — the documented limit of exactly-once. `stats()` says how much is held.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

ClaimState = Literal["done", "owner", "busy", "conflict"]
ENTRY_OVERHEAD = 256  # bytes charged per entry for the dict slot, the record and the timestamps


@dataclass
class _Pending:
    token: int
    digest: str
    expires: float
    event: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Done:
    answer: dict[str, Any]
    digest: str
    stored: float
    size: int
    scorings: int = 1


class LocalClaimBook:
    def __init__(
        self, max_bytes: int, ttl_s: float, lease_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_bytes, self.ttl_s, self.lease_s, self.clock = max_bytes, ttl_s, lease_s, clock
        self._done: OrderedDict[str, _Done] = OrderedDict()  # oldest stored first
        self._pending: dict[str, _Pending] = {}
        self._tokens = itertools.count(1)
        self.bytes = 0
        self.completed = 0
        self.duplicates = 0
        self.late_completions = 0
        self.replays = 0
        self.conflicts = 0
        self.evicted = 0
        self.expired = 0
        self.lease_expiries = 0

    def expire(self) -> int:
        """Drop every entry stored more than `ttl_s` ago, and every claim a lease past its own; how many
        stored entries went."""
        now = self.clock()
        for key in [k for k, p in self._pending.items() if p.expires + self.lease_s <= now]:
            self.lease_expiries += 1
            self._pending.pop(key).event.set()  # its waiters look again
        cutoff, n = now - self.ttl_s, 0
        while self._done:
            key, done = next(iter(self._done.items()))
            if done.stored > cutoff:
                break
            self._drop(key)
            n += 1
        self.expired += n
        return n

    def _drop(self, key: str) -> None:
        self.bytes -= self._done.pop(key).size

    def claim(self, key: str, digest: str) -> tuple[ClaimState, Any]:
        self.expire()
        done = self._done.get(key)
        if done is not None:
            if done.digest != digest:
                self.conflicts += 1
                return "conflict", None
            self.replays += 1
            return "done", done.answer
        pending = self._pending.get(key)
        now = self.clock()
        if pending is not None and now >= pending.expires:  # its lease ran out: the key is free, whatever the
            self.lease_expiries += 1                        # payload it was claimed with; its waiters look again
            pending.event.set()
            pending = None
        if pending is not None and pending.digest != digest:
            self.conflicts += 1
            return "conflict", None
        if pending is not None:
            return "busy", None
        token = next(self._tokens)
        self._pending[key] = _Pending(token, digest, now + self.lease_s)
        return "owner", token

    def complete(self, key: str, token: int, answer: dict[str, Any]) -> bool:
        """Store the answer of owner `token` (first answer wins). False when it was not stored: the key was
        already done (counted in `duplicates`) or is no longer known at all."""
        pending = self._pending.get(key)
        if pending is not None and pending.token == token:
            del self._pending[key]
            pending.event.set()
        elif pending is not None or key in self._done:
            self.late_completions += 1  # a stale owner, its lease handed on
        self.expire()
        self.completed += 1
        done = self._done.get(key)
        if done is not None:
            done.scorings += 1
            self.duplicates += 1
            return False
        if pending is None:
            return False  # released or forgotten meanwhile: no payload digest to store it under
        size = len(key) + len(pending.digest) + len(json.dumps(answer, default=repr)) + ENTRY_OVERHEAD
        self._done[key] = _Done(answer, pending.digest, self.clock(), size)
        self.bytes += size
        while self.bytes > self.max_bytes and self._done:
            self._drop(next(iter(self._done)))
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
        done = self._done.get(key)
        return done.answer if done is not None else None

    def claim_many(self, items: list[tuple[str, str]]) -> list[tuple[ClaimState, Any]]:
        """`claim` of each (key, digest), in order (a batch's items: one call, one look at the clock's expiries)."""
        return [self.claim(key, digest) for key, digest in items]

    def complete_many(self, items: list[tuple[str, int, dict[str, Any]]]) -> list[bool]:
        """`complete` of each (key, token, answer), in order."""
        return [self.complete(key, token, answer) for key, token, answer in items]

    def release_many(self, items: list[tuple[str, int]]) -> None:
        for key, token in items:
            self.release(key, token)

    def scorings(self, key: str) -> int:
        done = self._done.get(key)
        return done.scorings if done is not None else 0

    def stats(self) -> dict[str, int]:
        """What the claim book holds now and what it did (reading it changes nothing)."""
        pending_bytes = sum(len(k) + len(p.digest) + ENTRY_OVERHEAD for k, p in self._pending.items())
        return {
            "keys": len(self._done),
            "pending": len(self._pending),
            "bytes": self.bytes + pending_bytes,
            "max_bytes": self.max_bytes,
            "completed": self.completed,
            "duplicates": self.duplicates,
            "late_completions": self.late_completions,
            "replays": self.replays,
            "conflicts": self.conflicts,
            "evicted": self.evicted,
            "expired": self.expired,
            "lease_expiries": self.lease_expiries,
        }


class SharedClaimBook:
    """The claim book as the service's replicas use it (the `ClaimBook` protocol of handler.py): async methods,
    plus each replica's busy and alive seconds for the reward pool's utilisation. Hosted in-process for a
    single handler, or as one Ray actor shared by every Serve replica (service.py). Runs `expire()` every
    `ttl_s / 4` (at most every 30 s) on the event loop it is used from."""

    def __init__(self, max_bytes: int, ttl_s: float, lease_s: float) -> None:
        self.claims = LocalClaimBook(max_bytes, ttl_s, lease_s)
        self.sweep_s = min(ttl_s / 4, 30.0)
        self.replicas: dict[str, tuple[float, float]] = {}  # replica → (busy_s, alive_s), latest report
        self._sweeper: asyncio.Task | None = None

    def _sweep_here(self) -> None:
        loop = asyncio.get_running_loop()
        if self._sweeper is None or self._sweeper.done() or self._sweeper.get_loop() is not loop:
            self._sweeper = loop.create_task(self._sweep())

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_s)
            self.claims.expire()

    async def claim(self, key: str, digest: str) -> tuple[ClaimState, Any]:
        self._sweep_here()
        return self.claims.claim(key, digest)

    async def complete(self, key: str, token: int, answer: dict[str, Any]) -> bool:
        return self.claims.complete(key, token, answer)

    async def release(self, key: str, token: int) -> None:
        self.claims.release(key, token)

    async def claim_many(self, items: list[tuple[str, str]]) -> list[tuple[ClaimState, Any]]:
        self._sweep_here()
        return self.claims.claim_many(items)

    async def complete_many(self, items: list[tuple[str, int, dict[str, Any]]]) -> list[bool]:
        return self.claims.complete_many(items)

    async def release_many(self, items: list[tuple[str, int]]) -> None:
        self.claims.release_many(items)

    async def wait(self, key: str, timeout_s: float) -> dict[str, Any] | None:
        return await self.claims.wait(key, timeout_s)

    def report(self, replica: str, busy_s: float, alive_s: float) -> None:
        self.replicas[replica] = (busy_s, alive_s)

    def scorings(self, key: str) -> int:
        return self.claims.scorings(key)

    def stats(self) -> dict[str, float]:
        busy = sum(b for b, _ in self.replicas.values())
        alive = sum(a for _, a in self.replicas.values())
        return {**self.claims.stats(), "replica_starts": len(self.replicas), "busy_s": busy, "alive_s": alive}
