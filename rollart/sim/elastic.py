"""Elastic generation on the trainer's pool, as the twin models it (`train.elastic_generation`).

In: the trainer pool's spec (GPU kind, count; GPUs per lent engine: the widest `tp` of the hardware's
pools — a narrower engine would decode each token slower than the ones it relieves), the model, the engine
efficiencies and the switch time (`trainer.lend_switch_s`), the twin's `SimTrainer` and the production
`LLMProxy` built with the lent engines as its lendable pool. Out: `engines` (to hand the proxy), `lend()` — a
train step just ended: after one switch the trainer's devices run engines on the trainer's own current
weights (no weight transfer: they hold them), the proxy routes there and moves turns from the busiest
engines there until the load is level — and `reclaim()` — a batch is
ready: the proxy takes nothing more there and every turn running there goes on, from its tokens so far, on
a worker of its domain's pool; the devices switch back (one more switch, exposed before the train step) —,
and `busy_s()` (GPU-seconds the lent engines generated).

The switch (an engine waking with the weights already in memory, then its KV freed and the trainer's state
back) is a declared figure, not a measured one: `trainer.lend_switch_s` in the hardware file.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from rollart.sim.costs import EngineCost
from rollart.sim.engine import SimEngine
from rollart.sim.hardware import SimHardware

POOL = "trainer_lent"  # the proxy's name for the lendable pool


class TrainerLending:
    def __init__(self, hardware: SimHardware, weights: Any, first_index: int, trainer: Any,
                 clock: Callable[[], float]) -> None:
        spec = hardware.pools[hardware.train_pool]
        # as wide as the generation pools' engines (a narrower one decodes each token slower), or the trainer
        # pool's own tp if wider
        self.tp = max([spec.tp] + [p.tp for name, p in hardware.pools.items() if name != hardware.train_pool])
        cost = EngineCost(hardware.model, hardware.gpu_kind(hardware.train_pool), self.tp, hardware.engine)
        self.switch_s = hardware.trainer.lend_switch_s
        self.engines = [SimEngine(f"trainer/{hardware.train_pool}/lent{i}", cost, weights, first_index + i)
                        for i in range(spec.count // self.tp)]
        self.trainer, self.clock = trainer, clock
        self.proxy: Any = None  # the LLMProxy, set once built
        self.lent = False
        self._waking: asyncio.Task[None] | None = None
        self.loans = 0
        self.preempted = 0  # turns that went on elsewhere when the devices were taken back
        self.moved_in = 0  # turns moved here from the busiest engines when a loan began

    def lend(self) -> None:
        """Start lending (after one switch); returns at once."""
        if self._waking is None and not self.lent:
            self._waking = asyncio.get_running_loop().create_task(self._wake())

    async def _wake(self) -> None:
        await asyncio.sleep(self.switch_s)
        for engine in self.engines:  # the trainer's own weights, whatever version it has reached
            engine.version = self.trainer.version
        await self.proxy.lend(POOL)
        self.lent, self._waking, self.loans = True, None, self.loans + 1
        self.moved_in += await self.proxy.rebalance(POOL)  # the busiest engines' turns go on here

    async def reclaim(self) -> tuple[float, int]:
        """Take the devices back: (seconds it took, turns that went on elsewhere). A loan still switching in
        is called off (nothing ran there: no switch back)."""
        if self._waking is not None:
            self._waking.cancel()
            self._waking = None
        if not self.lent:
            return 0.0, 0
        start = self.clock()
        moved = await self.proxy.reclaim(POOL)
        self.preempted += moved
        self.lent = False
        await asyncio.sleep(self.switch_s)
        return self.clock() - start, moved

    def busy_s(self) -> float:
        """GPU-seconds the lent engines spent generating."""
        return sum(e.busy_s for e in self.engines) * self.tp
