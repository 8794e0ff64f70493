"""Multi-turn prefix reuse: the KV of each trajectory's last turn, kept under a byte budget (LRU).

In: when a request finishes, its trajectory id, the tokens its KV covers, the weight version that
computed it and the per-layer KV. Out: for the trajectory's next request, the longest usable cached
prefix of the new prompt — same trajectory, same weight version — so only the rest is prefilled.

Guarantees:
- KV computed under another weight version is never reused (a lookup under a newer version misses, and
  `clear()` drops everything when weights change).
- At least one prompt token is always left to prefill (the next token's logits need one).
- Total kept bytes ≤ budget: least recently stored/used entries are evicted first; an entry larger than
  the whole budget is not kept. A budget of 0 disables reuse.
- A hit takes the entry out (its KV moves into the running batch and comes back when that turn ends).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

from rollart.inference.kv import RowKV, nbytes


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    version: int
    kv: RowKV
    nbytes: int


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    """Per-trajectory KV of the last finished turn, bounded by `budget_bytes` with LRU eviction."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, int(budget_bytes))
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.tokens_reused = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, trajectory_id: str) -> bool:
        return trajectory_id in self._entries

    def put(self, trajectory_id: str, tokens: Sequence[int], version: int, kv: RowKV) -> None:
        self.discard(trajectory_id)
        size = nbytes(kv)
        if size == 0 or size > self.budget_bytes:
            return
        self._entries[trajectory_id] = _Entry(tuple(tokens), version, kv, size)
        self.bytes += size
        while self.bytes > self.budget_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.nbytes
            self.evictions += 1

    def take(self, trajectory_id: str, prompt: Sequence[int], version: int) -> tuple[int, RowKV | None]:
        """(reusable length, KV) for a new prompt of `trajectory_id` under `version`; (0, None) on a miss."""
        entry = self._entries.get(trajectory_id)
        if entry is None or entry.version != version:
            self.discard(trajectory_id)
            self.misses += 1
            return 0, None
        reuse = min(common_prefix(entry.tokens, prompt), len(prompt) - 1)
        self.discard(trajectory_id)
        if reuse <= 0:
            self.misses += 1
            return 0, None
        self.hits += 1
        self.tokens_reused += reuse
        return reuse, entry.kv

    def discard(self, trajectory_id: str) -> None:
        entry = self._entries.pop(trajectory_id, None)
        if entry is not None:
            self.bytes -= entry.nbytes

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def stats(self) -> dict[str, float]:
        return {
            "prefix_entries": float(len(self._entries)),
            "prefix_cache_mb": self.bytes / 2**20,
            "prefix_hits": float(self.hits),
            "prefix_misses": float(self.misses),
            "prefix_evictions": float(self.evictions),
            "prefix_tokens_reused": float(self.tokens_reused),
        }
