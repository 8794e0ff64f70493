"""Prefix cache: reuse needs same trajectory and version, leaves a token to prefill, LRU under a budget."""

from __future__ import annotations

import torch

from rollart.inference.prefix_cache import PrefixCache, common_prefix


def _kv(tokens: int, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.zeros(1, 2, tokens, 4), torch.zeros(1, 2, tokens, 4)) for _ in range(layers)]


ENTRY_BYTES = 2 * 2 * (2 * 10 * 4) * 4  # layers × (k, v) × elements × float32 bytes, for 10 tokens


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_hit_needs_same_version_and_keeps_one_token_to_prefill():
    c = PrefixCache(1 << 20)
    c.put("t", list(range(10)), version=3, kv=_kv(10))
    assert c.take("t", list(range(10)) + [99], version=4) == (0, None)  # other weights: never reused
    c.put("t", list(range(10)), version=3, kv=_kv(10))
    reuse, kv = c.take("t", list(range(10)), version=3)  # the whole prompt is cached: one token stays
    assert reuse == 9 and kv is not None
    assert "t" not in c  # a hit moves the KV out


def test_partial_match_reuses_common_prefix():
    c = PrefixCache(1 << 20)
    c.put("t", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], version=0, kv=_kv(10))
    reuse, _ = c.take("t", [1, 2, 3, 0, 0, 0], version=0)
    assert reuse == 3 and c.tokens_reused == 3


def test_lru_eviction_under_tiny_budget():
    c = PrefixCache(2 * ENTRY_BYTES)
    c.put("a", range(10), 0, _kv(10))
    c.put("b", range(10), 0, _kv(10))
    c.take("a", list(range(10)) + [1], 0)  # a used → b is now least recently used… but a left the cache
    c.put("a", range(10), 0, _kv(10))
    c.put("c", range(10), 0, _kv(10))  # over budget: b (least recent) goes
    assert "b" not in c and "a" in c and "c" in c
    assert c.evictions == 1 and c.bytes <= c.budget_bytes


def test_entry_larger_than_budget_is_not_kept_and_zero_budget_disables():
    c = PrefixCache(ENTRY_BYTES - 1)
    c.put("a", range(10), 0, _kv(10))
    assert len(c) == 0 and c.bytes == 0
    off = PrefixCache(0)
    off.put("a", range(10), 0, _kv(10))
    assert len(off) == 0
