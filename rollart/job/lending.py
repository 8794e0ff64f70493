"""`TrainerLoan`: the trainer's devices lent to generation while it waits for a batch (`train.elastic_generation`).

In: the `TrainerRanks` (built with a lent-engine factory, so each rank can run an engine on its own weights), the
LLM proxy's one shard (`ProxyShards`; config validation refuses lending beside several), a call bound and a clock.
Out: `register()` — the ranks join the proxy's lendable pool `LENT_POOL`; `lend()` — a train step just ended:
in the background every rank serves its current weights, then the proxy routes there and moves turns from its
busiest workers until the load is level; `reclaim()` — before a train step: the proxy routes nothing more
there and moves every turn running there to a worker of its domain's pool (from the tokens it has), then the ranks
stop their engines — a `TimedMetrics` with the time it took and the turns moved (`time/trainer.reclaim`,
`train/lent_preempted_turns`, as the twin reports them), how long the loan lasted (`time/trainer.lent`) and how
much of it a rank's engine spent generating (`time/trainer.lent_busy`: the wait for a batch minus this is what
the trainer's devices were idle); `metrics()` — counters since the start; `on_trainer_change(event)` —
a rank that dies leaves the pool (its loan ends at once), a rebuilt rank joins it.

Guarantees: a loan never outlives the wait it fills — `reclaim` first waits for a loan still starting (bounded),
so the ranks never train while an engine of theirs generates (each rank reclaims before a step as well);
every wait is bounded by `timeout_s`. The cluster twin models the same loan (`rollart.sim.elastic`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from rollart.inference.proxy_shards import ProxyShards
from rollart.loop import TRAINER_LANE
from rollart.resources.worker_set import MemberEvent
from rollart.trainer import TrainerRanks
from rollart.types import Span, TimedMetrics

log = logging.getLogger("rollart")
LENT_POOL = "trainer_lent"  # the proxy's name for the lendable pool of the trainer's ranks


class TrainerLoan:
    def __init__(self, trainer: TrainerRanks, proxy: ProxyShards, timeout_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.trainer, self.proxy, self.timeout_s, self.clock = trainer, proxy, timeout_s, clock
        self.lent = False
        self._starting: asyncio.Task[None] | None = None
        self.loans = 0
        self.moved_in = 0  # turns moved onto the lent engines when loans began
        self.lend_s = 0.0  # the ranks' time to start serving, summed over loans
        self._lent_at = 0.0  # when the current loan began routing

    def register(self) -> None:
        """The ranks join the proxy's lendable pool (at start, and again after a rebuild: `on_trainer_change`)."""
        import ray

        ray.get([ref for actor in self.trainer.actors() for ref in self.proxy.each("add_worker", LENT_POOL, actor)],
                timeout=self.timeout_s)

    def lend(self) -> None:
        """Start a loan in the background (nothing if one is lent or starting); returns at once."""
        if self._starting is None and not self.lent:
            self._starting = asyncio.get_running_loop().create_task(self._start())

    async def _start(self) -> None:
        timings = await asyncio.wait_for(asyncio.to_thread(self.trainer.lend), self.timeout_s)
        self.lend_s += timings["lend_s"]
        await self._proxy("lend")
        self.lent, self.loans, self._lent_at = True, self.loans + 1, self.clock()
        self.moved_in += await self._proxy("rebalance")  # the busiest engines' turns go on here

    async def reclaim(self) -> TimedMetrics:
        """End the loan (nothing to do, no span, when there is none)."""
        start = self.clock()
        starting, self._starting = self._starting, None
        if starting is not None:
            try:
                await asyncio.wait_for(starting, self.timeout_s)
            except Exception as exc:  # noqa: BLE001 — a loan that failed to start is no loan; the step goes on
                log.warning("lending the trainer's devices to generation failed: %s: %s", type(exc).__name__, exc)
        if not self.lent:
            if starting is not None:  # (a rank may serve already though the proxy never routed there)
                await asyncio.wait_for(asyncio.to_thread(self.trainer.reclaim), self.timeout_s)
            return TimedMetrics({})
        moved = await self._proxy("reclaim")
        self.lent = False
        ranks = await asyncio.wait_for(asyncio.to_thread(self.trainer.reclaim), self.timeout_s)
        return TimedMetrics({"time/trainer.reclaim": self.clock() - start, "train/lent_preempted_turns": float(moved),
                             "time/trainer.lent": start - self._lent_at, "time/trainer.lent_busy": ranks["busy_s"]},
                            Span("trainer.reclaim", start, self.clock(), TRAINER_LANE))

    def metrics(self) -> dict[str, float]:
        """Counters since the start: loans, turns moved onto the lent engines, seconds the ranks took to start serving."""
        return {"train/loans": float(self.loans), "train/lent_moved_in_turns": float(self.moved_in),
                "train/lend_s_total": self.lend_s}

    def on_trainer_change(self, event: MemberEvent) -> None:
        """From the trainer's listener thread: a dead rank's engine leaves the routing (the loan ends: what ran
        anywhere in the pool goes on elsewhere); each rank of a rebuilt set joins the pool, not lent."""
        if event.kind == "died" and event.actor is not None:
            self.lent = False
            refs = [*self.proxy.each("reclaim", LENT_POOL),
                    *self.proxy.each("remove_worker", event.actor._actor_id.hex(), event.cause)]
        elif event.kind == "joined" and event.actor is not None:
            refs = self.proxy.each("add_worker", LENT_POOL, event.actor)
        else:
            return
        for ref in refs:
            ref.future().add_done_callback(lambda done: done.exception() and log.error(
                "LLMProxy could not follow trainer rank %s (%s): %s", event.worker, event.kind, done.exception()))

    async def _proxy(self, method: str) -> Any:
        return (await asyncio.wait_for(asyncio.gather(*self.proxy.each(method, LENT_POOL)), self.timeout_s))[0]
