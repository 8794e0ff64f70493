"""`TrainerLoan` without Ray: the order of a loan's steps on the ranks and the proxy, a reclaim that comes while
a loan is still starting, and what a rank's death or rebuild tells the proxy."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from types import SimpleNamespace

from rollart.job.lending import LENT_POOL, TrainerLoan
from rollart.resources.worker_set import MemberEvent


class Ref:
    """What `ProxyShards.each` returns, as a Ray object ref behaves: awaitable, and `future()`."""

    def __init__(self, value) -> None:
        self.value = value

    def __await__(self):
        yield from asyncio.sleep(0).__await__()
        return self.value

    def future(self) -> concurrent.futures.Future:
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(self.value)
        return done


class Proxy:
    def __init__(self, log: list) -> None:
        self.log = log

    def each(self, method: str, *args):
        self.log.append((method, *args))
        return [Ref({"reclaim": 3, "rebalance": 2}.get(method))]


class Ranks:
    def __init__(self, log: list, lend_s: float = 0.0) -> None:
        self.log, self.lend_s = log, lend_s
        self.serving = False

    def lend(self) -> dict:
        time.sleep(self.lend_s)
        self.serving = True
        self.log.append(("ranks.lend",))
        return {"version": 1.0, "lend_s": self.lend_s}

    def reclaim(self) -> dict:
        self.serving = False
        self.log.append(("ranks.reclaim",))
        return {"preempted": 0.0, "busy_s": 0.04}


def test_a_loan_starts_on_the_ranks_then_the_proxy_and_ends_on_the_proxy_then_the_ranks() -> None:
    log: list = []
    ranks = Ranks(log)
    loan = TrainerLoan(ranks, Proxy(log), timeout_s=10)

    async def main():
        loan.lend()
        loan.lend()  # (one loan at a time: a second call while it starts does nothing)
        await asyncio.sleep(0.1)
        assert loan.lent and loan.loans == 1 and loan.moved_in == 2
        return await loan.reclaim()

    metrics = asyncio.run(main())
    assert log == [("ranks.lend",), ("lend", LENT_POOL), ("rebalance", LENT_POOL), ("reclaim", LENT_POOL),
                   ("ranks.reclaim",)]
    assert metrics.metrics["train/lent_preempted_turns"] == 3 and metrics.span.name == "trainer.reclaim"
    assert metrics.metrics["time/trainer.lent_busy"] == 0.04 and metrics.metrics["time/trainer.lent"] >= 0.09
    assert not loan.lent and not ranks.serving
    assert loan.metrics()["train/loans"] == 1


def test_a_reclaim_while_the_loan_still_starts_waits_for_it_and_ends_it() -> None:
    log: list = []
    ranks = Ranks(log, lend_s=0.3)
    loan = TrainerLoan(ranks, Proxy(log), timeout_s=10)

    async def main():
        loan.lend()
        await asyncio.sleep(0.05)  # the ranks are starting their engines
        return await loan.reclaim()

    asyncio.run(main())
    assert not ranks.serving and not loan.lent  # the train step that follows finds no engine generating
    assert log[-2:] == [("reclaim", LENT_POOL), ("ranks.reclaim",)]


def test_no_loan_no_span() -> None:
    log: list = []
    loan = TrainerLoan(Ranks(log), Proxy(log), timeout_s=10)
    assert asyncio.run(loan.reclaim()).metrics == {} and log == []


def test_a_dead_rank_ends_the_loan_and_leaves_the_pool_and_a_rebuilt_one_joins_it() -> None:
    log: list = []
    loan = TrainerLoan(Ranks(log), Proxy(log), timeout_s=10)
    loan.lent = True
    actor = SimpleNamespace(_actor_id=SimpleNamespace(hex=lambda: "abc"))
    died = MemberEvent("died", "trainer", 0, "trainer/train/0", "train", actor=actor, cause="killed")
    thread = threading.Thread(target=loan.on_trainer_change, args=(died,))  # (the listener's own thread)
    thread.start()
    thread.join()
    assert not loan.lent
    assert log == [("reclaim", LENT_POOL), ("remove_worker", "abc", "killed")]
    loan.on_trainer_change(MemberEvent("joined", "trainer", 0, "trainer/train/0", "train", actor=actor))
    assert log[-1] == ("add_worker", LENT_POOL, actor)
