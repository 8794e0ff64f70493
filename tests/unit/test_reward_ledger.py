"""Idempotency ledger (exactly-once bookkeeping) and the metric accumulators, on a fake clock."""

from __future__ import annotations

import asyncio

from rollart.reward.ledger import IdempotencyLedger
from rollart.reward.metrics import BusyClock, LatencyWindow, Timeline, percentile


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_claim_complete_then_replay():
    led = IdempotencyLedger(max_keys=10, ttl_s=100, lease_s=5, clock=FakeClock())
    state, token = led.claim("k")
    assert state == "owner"
    assert led.claim("k") == ("busy", None)
    assert led.complete("k", token, {"reward": 1.0})
    assert led.claim("k") == ("done", {"reward": 1.0})
    assert led.scorings("k") == 1 and led.stats()["duplicates"] == 0 and led.stats()["replays"] == 1


def test_release_frees_the_key_and_is_not_a_scoring():
    led = IdempotencyLedger(10, 100, 5, clock=FakeClock())
    _, token = led.claim("k")
    led.release("k", token)
    state, token2 = led.claim("k")
    assert state == "owner" and token2 != token and led.stats()["completed"] == 0


def test_waiter_gets_the_owners_answer():
    async def scenario():
        led = IdempotencyLedger(10, 100, 5)
        _, token = led.claim("k")
        waiter = asyncio.create_task(led.wait("k", timeout_s=5))
        await asyncio.sleep(0)
        led.complete("k", token, {"reward": 0.25})
        return await waiter

    assert asyncio.run(scenario()) == {"reward": 0.25}


def test_expired_lease_hands_the_key_on_and_late_answer_is_counted_not_stored_twice():
    clock = FakeClock()
    led = IdempotencyLedger(10, 100, lease_s=5, clock=clock)
    _, old = led.claim("k")
    clock.t = 6.0
    state, new = led.claim("k")
    assert state == "owner" and led.stats()["lease_expiries"] == 1
    assert led.complete("k", new, {"reward": 1.0})
    assert not led.complete("k", old, {"reward": 0.0})  # the stale owner's answer is dropped
    assert led.claim("k") == ("done", {"reward": 1.0})
    assert led.stats()["late_completions"] == 1 and led.stats()["duplicates"] == 1 and led.scorings("k") == 2


def test_memory_is_bounded_by_lru_and_ttl():
    clock = FakeClock()
    led = IdempotencyLedger(max_keys=2, ttl_s=10, lease_s=5, clock=clock)
    for key in ("a", "b"):
        led.complete(key, led.claim(key)[1], {"k": key})
    led.claim("a")  # touch a: b is now least recently used
    led.complete("c", led.claim("c")[1], {"k": "c"})
    assert led.claim("b")[0] == "owner" and led.claim("a")[0] == "done"
    clock.t = 20.0
    assert led.claim("a")[0] == "owner"  # expired by TTL
    assert led.stats()["evicted"] >= 2


def test_percentiles_and_latency_window():
    assert percentile([], 50) == 0.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0 and percentile([1.0, 2.0, 3.0, 4.0], 95) == 4.0
    w = LatencyWindow(maxlen=3)
    for v in (10.0, 1.0, 2.0, 3.0):
        w.add(v)
    assert w.summary() == {"latency_p50_s": 2.0, "latency_p95_s": 3.0} and w.count == 4


def test_busy_clock_counts_overlap_once():
    clock = FakeClock()
    busy = BusyClock(clock)
    busy.enter()
    clock.t = 1.0
    busy.enter()
    clock.t = 2.0
    busy.exit()
    clock.t = 3.0
    busy.exit()
    clock.t = 4.0
    assert busy.busy_s == 3.0 and busy.utilisation() == 0.75


def test_timeline_integral_and_mean():
    clock = FakeClock()
    tl = Timeline(clock)
    tl.record(0)
    clock.t = 2.0
    tl.record(2)
    clock.t = 3.0
    tl.record(2)
    clock.t = 4.0
    assert tl.integral() == 4.0 and tl.mean() == 1.0 and tl.max == 2 and tl.current == 2
    assert list(tl.points) == [(0.0, 0), (2.0, 2)]
