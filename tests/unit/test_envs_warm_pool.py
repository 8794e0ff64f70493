"""The warm pool (prepared envs per domain, refilled in the background, bounded) and per-domain reset
statistics: hits and misses, the bound, refill after failures with backoff, nothing leaked on close
(also an env still being built when the pool closes), and the EnvManager recording every reset."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rollart.config import DomainConfig, EnvsConfig, FaultInjectionConfig, RunConfig
from rollart.envs import ChatTokens, EnvManager
from rollart.envs.reset_stats import ResetStats, quantile
from rollart.envs.warm_pool import WarmPool
from rollart.models import load_tokenizer
from rollart.types import SamplingParams, Status, Task
from envs_fakes import ScriptedLLM


class Prepared:
    """An env with a slow, seed-free prepare() and a fast reset; every instance is tracked."""

    made: list["Prepared"] = []
    prepare_s = 0.05
    fail_prepares = 0  # the next prepares (of any instance) that fail
    lock = threading.Lock()

    def __init__(self) -> None:
        self.prepared = self.closed = False
        self.preloaded: int | None = None  # the seed preload() staged (the seed's part of a reset, ahead)
        with Prepared.lock:
            Prepared.made.append(self)

    def prepare(self) -> None:
        time.sleep(Prepared.prepare_s)
        with Prepared.lock:
            if Prepared.fail_prepares > 0:
                Prepared.fail_prepares -= 1
                raise OSError("sandbox could not be created")
        self.prepared = True

    def preload(self, seed):
        if not self.prepared:
            self.prepare()
        self.preloaded = seed

    def reset(self, seed=None):
        if not self.prepared:
            self.prepare()
        return f"seed {seed}", {"staged": self.preloaded == seed}

    def step(self, action):
        return "done", 1.0, True, False, {}

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def fresh():
    Prepared.made, Prepared.prepare_s, Prepared.fail_prepares = [], 0.05, 0


async def until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def test_hits_after_the_fill_misses_when_empty_and_the_bound_holds():
    async def scenario():
        pool = WarmPool("d", Prepared, 3)
        env, hit = await pool.acquire()  # empty: built and prepared now, the refill starts behind it
        assert not hit and env.inner.prepared
        await until(lambda: pool.ready == 3)
        await asyncio.sleep(0.2)
        assert len(Prepared.made) == 4  # 3 kept ready + the one handed out: never more
        got = [await pool.acquire() for _ in range(3)]
        assert all(hit for _, hit in got) and all(e.inner.prepared for e, _ in got)
        await until(lambda: pool.ready == 3)
        assert pool.counts == {"hits": 3, "staged_hits": 0, "misses": 1, "prepared": 6, "staged": 0, "staged_unused": 0,
                               "prepare_failures": 0, "joined": 0}
        await pool.close()
        await pool.close()  # idempotent
        ready = [p for p in Prepared.made if p not in {env.inner, *(e.inner for e, _ in got)}]
        assert len(ready) == 3 and all(p.closed for p in ready)
        with pytest.raises(RuntimeError, match="closed"):
            await pool.acquire()

    asyncio.run(scenario())


def test_forecast_seeds_are_staged_ahead_newer_forecasts_replace_older_and_nothing_leaks():
    async def scenario():
        pool = WarmPool("d", Prepared, 4)
        pool.expect(7, 3)  # a group of 3 is coming: staged first, then one seed-free env fills the pool
        await until(lambda: pool.staged == 3 and pool.ready == 4)
        got = [await pool.acquire(7) for _ in range(3)]
        assert all(hit for _, hit in got) and [e.inner.preloaded for e, _ in got] == [7, 7, 7]
        assert (await got[0][0].reset(7))[1] == {"staged": True}
        other, hit = await pool.acquire(8)  # not forecast: a seed-free env
        assert hit and other.inner.preloaded is None
        await until(lambda: pool.ready == 4)
        pool.expect(9, 4)  # the seed-free envs the pool holds are staged, no new one built
        await until(lambda: pool.staged == 4)
        made = len(Prepared.made)
        pool.expect(10, 2)  # a newer forecast, the pool full: two of 9's staged envs make room
        await until(lambda: len(pool._staged.get(10, ())) == 2)
        assert len(pool._staged[9]) == 2 and pool.counts["staged_unused"] == 2 and len(Prepared.made) == made + 2
        pool.expect(9, 4)  # told again: 9 gets its room back from 10, the newer-told forecast now older
        await until(lambda: len(pool._staged.get(9, ())) == 4)
        assert pool.ready == 4 and pool.counts["staged_hits"] == 3 and pool.counts["misses"] == 0
        await pool.close()
        handed = {e.inner for e, _ in got} | {other.inner}
        assert all(p.closed for p in Prepared.made if p not in handed)

    asyncio.run(scenario())


def test_a_forecast_told_again_with_the_same_count_still_stands():
    async def scenario():
        Prepared.prepare_s = 0.3  # the first stage is still running when the group is forecast again
        pool = WarmPool("d", Prepared, 4)
        pool.expect(7, 3)
        pool.expect(7, 3)  # the scheduler forecasts the same group twice (it waited twice before admitting it)
        assert pool._expected[7] == 3
        await until(lambda: pool.staged == 3)
        pool.expect(7, 3)  # told again once all three are staged: nothing more to stage, nothing given up
        assert 7 not in pool._expected and len(pool._staged[7]) == 3
        got = [await pool.acquire(7) for _ in range(3)]
        assert all(hit for _, hit in got) and pool.counts["staged_hits"] == 3 and pool.counts["misses"] == 0
        await pool.close()

    asyncio.run(scenario())


def test_a_reset_before_any_prepare_builds_one_and_a_reset_during_a_build_joins_it():
    Prepared.prepare_s = 0.1

    async def scenario():
        pool = WarmPool("d", Prepared, 2)
        pool.expect(5, 2)  # nothing is ready yet: the first member comes before the refill began
        first = await pool.acquire(5)
        assert not first[1]  # built on the spot; the refill builds the second member's env meanwhile
        second = await pool.acquire(5)  # while that env is being built: it waits for it, builds no other
        assert second[1] and second[0].inner.prepared and second[0].inner.preloaded is None  # its reset stages it
        await until(lambda: pool.ready == 2)
        assert pool.counts["misses"] == 1 and pool.counts["joined"] == 1 and pool.counts["staged_unused"] == 0
        assert len(Prepared.made) == 4  # the two handed out and two seed-free ones: nothing built twice
        await pool.close()
        assert all(p.closed for p in Prepared.made if p not in {first[0].inner, second[0].inner})

    asyncio.run(scenario())


def test_a_group_that_comes_while_its_envs_are_built_joins_those_prepares_not_new_ones():
    """Container domains (issue 37): a group whose resets came while the pool was still preparing its envs built
    a second set beside them on the spot — on 2 cores the two sets' container starts competed, and the staged
    set was closed unused. Now each reset joins one prepare in flight: ready sooner than a new one, none wasted."""
    Prepared.prepare_s = 0.4

    async def scenario():
        from concurrent.futures import ThreadPoolExecutor

        pool = WarmPool("d", Prepared, 4, executor=ThreadPoolExecutor(8), parallel=4)
        pool.expect(9, 4)
        await until(lambda: len(Prepared.made) == 4)  # the four are being staged
        got = await asyncio.gather(*(pool.acquire(9) for _ in range(4)))
        assert {e.inner for e, _ in got} == set(Prepared.made[:4])  # the four in flight, none built beside them
        assert all(hit for _, hit in got) and all(e.inner.prepared for e, _ in got)  # (their resets stage them)
        assert pool.counts["joined"] == 4 and pool.counts["misses"] == 0 and pool.counts["staged_unused"] == 0
        await until(lambda: pool.ready == 4)
        assert len(Prepared.made) == 8  # four handed out, four refilled: no second set
        await pool.close()
        for env, _ in got:
            await env.close()
        assert all(p.closed for p in Prepared.made)

    asyncio.run(scenario())


def test_a_build_begun_for_one_forecast_serves_a_reset_of_another_seed_that_comes_first():
    """Issue 37 (late binding): a build was bound to the forecast seed it began for, so a reset of another seed
    (a member whose own envs were late) that came while it ran could not use it and started one more container
    beside it. Now an env is bound to a seed once built: the reset joins the build, and the forecast group is
    staged from the envs built after."""
    Prepared.prepare_s = 0.3

    async def scenario():
        from concurrent.futures import ThreadPoolExecutor

        pool = WarmPool("d", Prepared, 2, executor=ThreadPoolExecutor(4), parallel=2)
        pool.expect(1, 2)
        await until(lambda: len(Prepared.made) == 2)  # both builds under way, begun for seed 1's forecast
        late, hit = await pool.acquire(0)  # a laggard of group 0: nothing staged or being staged for it
        assert hit and late.inner in Prepared.made[:2] and pool.counts["joined"] == 1 and pool.counts["misses"] == 0
        await until(lambda: len(pool._staged.get(1, ())) == 2)  # group 1 is still staged in full
        assert len(Prepared.made) == 3 and pool.counts["staged_unused"] == 0  # one build more, none thrown away
        got = [await pool.acquire(1) for _ in range(2)]
        assert all(hit for _, hit in got) and [e.inner.preloaded for e, _ in got] == [1, 1]
        await pool.close()
        for env in (late, *(e for e, _ in got)):
            await env.close()
        assert all(p.closed for p in Prepared.made)

    asyncio.run(scenario())


def test_envs_staged_for_a_group_that_is_resetting_are_not_given_up_for_the_next_forecast():
    """The next group is forecast as the current one is admitted; on a slow domain the current group's last
    members reach the pool later than the forecast. Their staged envs were closed for the next group's, and they
    built their own; now a group whose resets began keeps them (for `begun_hold_s` after its last reset)."""
    Prepared.prepare_s = 0.1

    async def scenario():
        pool = WarmPool("d", Prepared, 2, parallel=2, begun_hold_s=0.6)
        pool.expect(1, 2)
        await until(lambda: len(pool._staged.get(1, ())) == 2)
        first, _ = await pool.acquire(1)  # group 1 begins
        pool.expect(2, 2)  # group 2 is forecast before group 1's second member came
        await until(lambda: len(pool._staged.get(2, ())) == 1)  # the room left: one env for group 2
        await asyncio.sleep(0.3)
        second, hit = await pool.acquire(1)  # the laggard: its staged env is still there
        assert hit and second.inner.preloaded == 1 and pool.counts["staged_hits"] == 2
        assert pool.counts["staged_unused"] == 0
        await until(lambda: len(pool._staged.get(2, ())) == 2)
        pool.expect(3, 2)  # group 2's resets have not begun: a newer forecast still replaces its envs
        await until(lambda: len(pool._staged.get(3, ())) == 2)
        assert pool.counts["staged_unused"] == 2
        await pool.close()
        for env in (first, second):
            await env.close()
        assert all(p.closed for p in Prepared.made)

    asyncio.run(scenario())


def test_a_group_that_is_resetting_keeps_its_forecast_when_the_next_group_is_forecast():
    """A group's first member came before its envs were staged; the next group's forecast then dropped what was
    still expected for this one (the oldest forecast), so its later members found nothing staged for them."""
    Prepared.prepare_s = 0.2

    async def scenario():
        pool = WarmPool("d", Prepared, 2)
        pool.expect(1, 2)
        first, hit = await pool.acquire(1)  # before any prepare began: built on the spot
        assert not hit
        pool.expect(2, 2)  # the next group: forecast as this one was admitted
        await until(lambda: pool.counts["staged"] >= 1)
        second, hit = await pool.acquire(1)  # the second member: its env was staged, not dropped
        assert hit and second.inner.preloaded == 1 and pool.counts["staged_unused"] == 0
        await pool.close()
        for env in (first, second):
            await env.close()
        assert all(p.closed for p in Prepared.made)

    asyncio.run(scenario())


def test_a_begun_groups_staged_env_is_given_up_once_its_hold_passes():
    Prepared.prepare_s = 0.05

    async def scenario():
        pool = WarmPool("d", Prepared, 2, parallel=2, begun_hold_s=0.2)
        pool.expect(1, 2)
        await until(lambda: len(pool._staged.get(1, ())) == 2)
        first, _ = await pool.acquire(1)  # the other member never comes (cancelled before its reset)
        pool.expect(2, 2)
        await until(lambda: len(pool._staged.get(2, ())) == 1)
        await asyncio.sleep(0.3)
        pool.start()  # (as the next forecast or reset does: the refill looks at the room again)
        await until(lambda: len(pool._staged.get(2, ())) == 2 and 1 not in pool._staged)
        assert pool.counts["staged_unused"] == 1
        await pool.close()
        await first.close()
        assert all(p.closed for p in Prepared.made)

    asyncio.run(scenario())


def test_a_reset_whose_joined_prepare_fails_builds_its_own():
    Prepared.fail_prepares, Prepared.prepare_s = 1, 0.2

    async def scenario():
        pool = WarmPool("d", Prepared, 1, backoff_s=1.0)
        pool.start()
        await until(lambda: len(Prepared.made) == 1)  # the pool's prepare is under way, and will fail
        t0 = time.monotonic()
        env, hit = await pool.acquire(3)
        assert time.monotonic() - t0 < 0.9, "the reset waited out the pool's backoff"
        assert not hit and env.inner.prepared and env.inner is not Prepared.made[0]
        assert pool.counts["prepare_failures"] == 1 and pool.counts["misses"] == 1 and pool.counts["joined"] == 0
        await pool.close()
        await env.close()

    asyncio.run(scenario())


def test_failing_prepares_are_counted_backed_off_and_the_pool_still_fills():
    Prepared.fail_prepares = 3

    async def scenario():
        pool = WarmPool("d", Prepared, 2, backoff_s=0.01, backoff_max_s=0.02)
        pool.start()
        await until(lambda: pool.ready == 2)
        assert pool.counts["prepare_failures"] == 3
        await pool.close()

    asyncio.run(scenario())
    assert all(p.closed for p in Prepared.made if p.prepared)


def test_close_while_an_env_is_being_built_closes_it_when_the_build_ends():
    started = threading.Event()

    def slow_factory():
        started.set()
        time.sleep(0.3)
        return Prepared()

    async def scenario():
        pool = WarmPool("d", slow_factory, 1)
        pool.start()
        await asyncio.to_thread(started.wait, 5)
        await pool.close()  # the constructor is still running in its thread
        await until(lambda: Prepared.made and Prepared.made[0].closed)

    asyncio.run(scenario())


def test_reset_stats_percentiles_totals_and_drain():
    worker = ResetStats()
    for i in range(100):
        worker.record("swe", seconds=0.01 * (i + 1), attempts=2 if i < 5 else 1, ok=i != 0, pool_hit=i % 4 != 0)
    worker.record("math", 0.5, 1, True, None)
    router = ResetStats()
    router.add(worker.drain())
    assert worker.drain() == {}
    metrics = router.metrics()
    assert metrics["env/swe/reset_p50_s"] == pytest.approx(0.505)
    assert metrics["env/swe/reset_p99_s"] == pytest.approx(0.9901)
    assert (metrics["env/swe/resets"], metrics["env/swe/reset_retries"], metrics["env/swe/resets_failed"]) == (100, 5, 1)
    assert (metrics["env/swe/pool_hits"], metrics["env/swe/pool_misses"]) == (75, 25)
    assert metrics["env/swe/pool_staged_hits"] == 0
    assert metrics["env/math/reset_p99_s"] == 0.5 and metrics["env/math/pool_hits"] == 0
    again = router.metrics()  # no resets since: no percentiles, the totals stay
    assert "env/swe/reset_p50_s" not in again and again["env/swe/resets"] == 100
    assert quantile([3.0], 99) == 3.0


@pytest.fixture(scope="module")
def chat(tiny_model_path):
    return ChatTokens(load_tokenizer(tiny_model_path))


def manager(chat, task_id, *, pool=None, stats=None, inject=None, envs=None):
    task = Task(trajectory_id=task_id, domain="d", env="custom", seed=3, group_id="g")
    return EnvManager(
        task, 0, make_env=Prepared, domain_cfg=DomainConfig(env="custom", max_turns=1, inject=inject),
        envs=envs or EnvsConfig(retry_backoff_s=0.0), llm=ScriptedLLM(chat.tokenizer, ["ok"]), chat=chat,
        sampling=SamplingParams(max_new_tokens=8, stop_token_ids=chat.stop_token_ids), pool=pool, reset_stats=stats,
    )


def test_the_manager_resets_from_the_pool_and_records_every_reset(chat):
    async def scenario():
        stats = ResetStats()
        pool = WarmPool("d", Prepared, 2)
        first = await manager(chat, "t0", pool=pool, stats=stats).run()
        await until(lambda: pool.ready == 2)
        second = await manager(chat, "t1", pool=pool, stats=stats).run()
        pool.expect(3, 1)  # the group of seed 3 is forecast: its env is staged
        await until(lambda: pool.staged == 1)
        staged = await manager(chat, "t4", pool=pool, stats=stats).run()
        assert staged.status is Status.COMPLETED and staged.turns[0].observation == "seed 3"
        unpooled = await manager(chat, "t2", stats=stats).run()
        failing = await manager(chat, "t3", stats=stats, inject=FaultInjectionConfig(reset_fail_prob=1.0),
                                envs=EnvsConfig(reset_retries=2, retry_backoff_s=0.0)).run()
        await pool.close()
        return stats.metrics(), first, second, unpooled, failing

    metrics, first, second, unpooled, failing = asyncio.run(scenario())
    assert first.status is second.status is unpooled.status is Status.COMPLETED
    assert failing.status is Status.FAILED
    assert (metrics["env/d/pool_misses"], metrics["env/d/pool_hits"], metrics["env/d/pool_staged_hits"]) == (1, 2, 1)
    assert (metrics["env/d/resets"], metrics["env/d/resets_failed"], metrics["env/d/reset_retries"]) == (5, 1, 2)
    assert metrics["env/d/reset_p99_s"] >= Prepared.prepare_s  # a miss and the unpooled resets prepare inline
    assert all(p.closed for p in Prepared.made)  # each env the episodes used, and the pool's spares


def test_warm_pool_config_names_env_domains_only():
    assert not RunConfig().envs.pooled("math", RunConfig().domains["math"])  # off by default
    cfg = RunConfig(envs={"warm_pool": {"size": 2, "domains": ["math"]}})
    assert cfg.envs.pooled("math", cfg.domains["math"]) and not cfg.envs.pooled("frozenlake", cfg.domains["frozenlake"])
    with pytest.raises(ValueError, match=r"envs.warm_pool.domains: 'nope' is not an env domain .*frozenlake"):
        RunConfig(envs={"warm_pool": {"size": 1, "domains": ["nope"]}})


def test_a_parallel_refill_prepares_a_group_at_once_and_stays_bounded():
    """Prepares that mostly wait (a container start) overlap with `parallel`: four 0.4-s prepares fill the pool
    in about one prepare time, never more than `size` envs held, and a forecast group is staged once, not twice."""
    Prepared.prepare_s = 0.4

    async def main():
        from concurrent.futures import ThreadPoolExecutor

        pool = WarmPool("d", Prepared, 4, executor=ThreadPoolExecutor(8), parallel=4)
        t0 = time.monotonic()
        pool.start()
        await until(lambda: pool.ready == 4)
        filled_s = time.monotonic() - t0
        assert len(Prepared.made) == 4 and pool._preparing == 0
        pool.expect(7, 4)  # four resets of seed 7 to come: the four seed-free envs are staged for it
        await until(lambda: pool.staged == 4)
        assert pool.counts["staged"] == 4 and pool.counts["staged_unused"] == 0 and len(Prepared.made) == 4
        envs = [(await pool.acquire(7))[0] for _ in range(4)]
        assert all(e.inner.preloaded == 7 for e in envs) and pool.counts["staged_hits"] == 4
        await until(lambda: pool.ready == 4)
        assert len(Prepared.made) == 8 and max(pool.ready, 0) <= 4
        await pool.close()
        for env in envs:
            await env.close()
        assert all(p.closed for p in Prepared.made)
        return filled_s

    filled_s = asyncio.run(main())
    assert filled_s < 1.2, f"4 prepares of 0.4 s in parallel took {filled_s:.2f}s"
    with pytest.raises(ValueError, match="parallel"):
        WarmPool("d", Prepared, 2, parallel=0)
