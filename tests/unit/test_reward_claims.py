"""The claim book (exactly-once bookkeeping) and the metric accumulators, on a fake clock."""

from __future__ import annotations

import asyncio

from rollart.reward.claims import LocalClaimBook, SharedClaimBook
from rollart.reward.metrics import BusyClock, LatencyWindow, Timeline, percentile


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


MB = 2**20


def test_claim_complete_then_replay():
    led = LocalClaimBook(max_bytes=MB, ttl_s=100, lease_s=5, clock=FakeClock())
    state, token = led.claim("k", "d1")
    assert state == "owner"
    assert led.claim("k", "d1") == ("busy", None)
    assert led.complete("k", token, {"reward": 1.0})
    assert led.claim("k", "d1") == ("done", {"reward": 1.0})
    assert led.scorings("k") == 1 and led.stats()["duplicates"] == 0 and led.stats()["replays"] == 1


def test_same_key_with_another_payload_is_a_conflict_never_a_replay():
    led = LocalClaimBook(MB, 100, 5, clock=FakeClock())
    _, token = led.claim("k", "d1")
    assert led.claim("k", "d2") == ("conflict", None)  # while it is being scored
    led.complete("k", token, {"reward": 1.0})
    assert led.claim("k", "d2") == ("conflict", None)  # and once it is done
    assert led.claim("k", "d1") == ("done", {"reward": 1.0})
    assert led.stats()["conflicts"] == 2 and led.stats()["replays"] == 1


def test_release_frees_the_key_and_is_not_a_scoring():
    led = LocalClaimBook(MB, 100, 5, clock=FakeClock())
    _, token = led.claim("k", "d")
    led.release("k", token)
    state, token2 = led.claim("k", "d")
    assert state == "owner" and token2 != token and led.stats()["completed"] == 0


def test_waiter_gets_the_owners_answer():
    async def scenario():
        led = LocalClaimBook(MB, 100, 5)
        _, token = led.claim("k", "d")
        waiter = asyncio.create_task(led.wait("k", timeout_s=5))
        await asyncio.sleep(0)
        led.complete("k", token, {"reward": 0.25})
        return await waiter

    assert asyncio.run(scenario()) == {"reward": 0.25}


def test_expired_lease_hands_the_key_on_and_late_answer_is_counted_not_stored_twice():
    clock = FakeClock()
    led = LocalClaimBook(MB, 100, lease_s=5, clock=clock)
    _, old = led.claim("k", "d")
    clock.t = 6.0
    state, new = led.claim("k", "d")
    assert state == "owner" and led.stats()["lease_expiries"] == 1
    assert led.complete("k", new, {"reward": 1.0})
    assert not led.complete("k", old, {"reward": 0.0})  # the stale owner's answer is dropped
    assert led.claim("k", "d") == ("done", {"reward": 1.0})
    assert led.stats()["late_completions"] == 1 and led.stats()["duplicates"] == 1 and led.scorings("k") == 2


def test_memory_is_bounded_in_bytes_oldest_first_and_says_so():
    clock = FakeClock()
    led = LocalClaimBook(max_bytes=4096, ttl_s=100, lease_s=5, clock=clock)
    big_key = "k" * 3000  # a huge key is charged in full
    led.complete(big_key, led.claim(big_key, "d")[1], {"x": 1})
    for i in range(20):
        key = f"run/0/g{i}"
        led.complete(key, led.claim(key, "d")[1], {"reward": float(i), "details": {"e": "x" * 50}})
    stats = led.stats()
    assert stats["bytes"] <= 4096 and stats["max_bytes"] == 4096 and stats["evicted"] >= 1
    assert led.claim(big_key, "d")[0] == "owner"  # the oldest went first
    assert led.claim("run/0/g19", "d")[0] == "done"  # the newest stayed
    assert stats["keys"] == len([k for k in (f"run/0/g{i}" for i in range(20)) if led.scorings(k)])


def test_entries_expire_without_being_asked():
    """An idle service forgets: the shared claim book's sweeper drops expired entries on its own."""

    async def scenario():
        shared = SharedClaimBook(MB, ttl_s=0.2, lease_s=5)
        _, token = await shared.claim("k", "d")
        await shared.complete("k", token, {"reward": 1.0})
        assert shared.stats()["keys"] == 1
        await asyncio.sleep(0.5)  # no call in between: only the sweeper can expire it
        return shared.stats()

    stats = asyncio.run(scenario())
    assert stats["keys"] == 0 and stats["expired"] == 1 and stats["bytes"] == 0


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


def test_a_claim_with_a_bogus_digest_holds_a_key_for_one_lease_at_most():
    """A claim under another payload (say, through the claim-book actor, with cluster access) is a conflict
    while its lease lasts, then the key is free for the real payload (on main it stayed a 409 for good)."""
    clock = FakeClock()
    led = LocalClaimBook(MB, 100, lease_s=5, clock=clock)
    assert led.claim("k", "bogus")[0] == "owner"  # never completed
    assert led.claim("k", "real") == ("conflict", None)
    clock.t = 5.0
    state, token = led.claim("k", "real")
    assert state == "owner" and led.stats()["lease_expiries"] == 1
    assert led.complete("k", token, {"reward": 1.0})
    assert led.claim("k", "real") == ("done", {"reward": 1.0})


def test_an_abandoned_claim_is_forgotten_a_lease_after_it_ran_out():
    clock = FakeClock()
    led = LocalClaimBook(MB, 100, lease_s=5, clock=clock)
    _, token = led.claim("k", "d")
    clock.t = 7.0  # past its lease, not yet forgotten: its owner may still complete
    assert led.complete("k", token, {"reward": 0.5}) and led.claim("k", "d") == ("done", {"reward": 0.5})
    led.claim("other", "d")  # lease until 12; abandoned
    clock.t = 16.9
    led.expire()
    assert led.stats()["pending"] == 1
    clock.t = 17.0
    led.expire()
    assert led.stats()["pending"] == 0 and led.stats()["lease_expiries"] == 1
