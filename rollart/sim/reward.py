"""`SimRewardPool`: the time reward scoring takes — reserved workers or an elastic serverless pool.

In: a `RewardSpec` (mode, workers or replicas, concurrency, cold start, scale-down delay). Out: `fn(domain)`
— an async reward function per domain — and `stats()`: requests, mean wait, busy time, provisioned time
and utilisation. `SimScorer` is the twin's `RewardScorer`: the production `LocalRewardClient` (its tries,
timeouts and in-flight limit are the real ones) calling each domain's pool function, with the real
router's `reward/*` metrics.

Rewards: 1 for every episode, or — with a domain profile's `success_rate` — 1 with that chance, drawn per
trajectory from a hash (so the algorithm's group filter, DAPO's dynamic sampling, has groups to drop and the
twin shows what their refill costs). Each trajectory's service time is the one its episode drew (`Trajectory.metrics["reward_s"]`, from the
domain profile's `reward`). Modes:
- `none`: scoring takes its service time, with no capacity limit;
- `reserved`: `workers × concurrency` slots, always provisioned (utilisation = busy ÷ workers·elapsed);
- `serverless`: replicas start on demand (`cold_start_s`), each with `concurrency` slots, up to
  `max_replicas`, and an idle replica is released after `scale_down_s`; utilisation = busy slot-time ÷
  provisioned slot-time (cold starts count as provisioned). One pool object can serve several jobs at once
  (several twins in one event loop), which is how a shared service reaches a high utilisation.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from rollart.config import RunConfig
from rollart.reward.client import LocalRewardClient, backend_metrics
from rollart.sim.hardware import RewardSpec
from rollart.types import RewardResult, Trajectory


@dataclass(eq=False)
class _Replica:
    free: int
    ready: bool = False
    started_at: float = 0.0
    idle_timer: asyncio.TimerHandle | None = None


@dataclass
class _Stats:
    requests: int = 0
    wait_s: float = 0.0
    busy_s: float = 0.0
    provisioned_s: float = 0.0  # released replicas' slot-seconds (live ones are added in stats())
    replica_starts: int = 0
    peak_replicas: int = 0
    first: float | None = None


@dataclass
class SimRewardPool:
    spec: RewardSpec
    stats_: _Stats = field(default_factory=_Stats)

    def __post_init__(self) -> None:
        self._queue: deque[asyncio.Future] = deque()
        self._replicas: list[_Replica] = []
        if self.spec.mode == "reserved":
            self._replicas = [_Replica(self.spec.concurrency, ready=True) for _ in range(self.spec.workers)]

    def fn(self, domain: str) -> Callable[[Trajectory], Awaitable[float]]:
        async def sim_reward(trajectory: Trajectory) -> float:
            await self.score(float(trajectory.metrics.get("reward_s", 0.0)))
            return 1.0

        sim_reward.__name__ = f"sim_reward_{domain}"
        return sim_reward

    async def score(self, service_s: float) -> None:
        loop = asyncio.get_running_loop()
        st = self.stats_
        st.requests += 1
        if st.first is None:
            st.first = loop.time()
            for r in self._replicas:
                r.started_at = st.first
        if self.spec.mode == "none":
            if service_s > 0:  # (a scoring that takes no time does not yield: one task hop less per trajectory)
                await asyncio.sleep(service_s)
            st.busy_s += service_s
            return
        arrived = loop.time()
        replica = self._free_replica()
        if replica is None:
            waiter = loop.create_future()
            self._queue.append(waiter)
            self._scale_up(loop)
            replica = await waiter
        st.wait_s += loop.time() - arrived
        try:
            await asyncio.sleep(service_s)
            st.busy_s += service_s
        finally:
            self._release(replica, loop)

    def _free_replica(self) -> _Replica | None:
        for r in self._replicas:
            if r.ready and r.free > 0:
                r.free -= 1
                if r.idle_timer is not None:
                    r.idle_timer.cancel()
                    r.idle_timer = None
                return r
        return None

    def _scale_up(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.spec.mode != "serverless":
            return
        starting = sum(r.free for r in self._replicas if not r.ready)
        if starting >= len(self._queue) or len(self._replicas) >= self.spec.max_replicas:
            return
        replica = _Replica(self.spec.concurrency, started_at=loop.time())
        self._replicas.append(replica)
        self.stats_.replica_starts += 1
        self.stats_.peak_replicas = max(self.stats_.peak_replicas, len(self._replicas))
        loop.call_later(self.spec.cold_start_s, self._up, replica, loop)

    def _up(self, replica: _Replica, loop: asyncio.AbstractEventLoop) -> None:
        replica.ready = True
        for _ in range(replica.free):
            if not self._hand_over(replica):
                break
        self._maybe_idle(replica, loop)

    def _hand_over(self, replica: _Replica) -> bool:
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.done():
                replica.free -= 1
                waiter.set_result(replica)
                return True
        return False

    def _release(self, replica: _Replica, loop: asyncio.AbstractEventLoop) -> None:
        replica.free += 1
        if replica.free > 0 and self._hand_over(replica):
            return
        self._maybe_idle(replica, loop)

    def _maybe_idle(self, replica: _Replica, loop: asyncio.AbstractEventLoop) -> None:
        if self.spec.mode == "serverless" and replica.free == self.spec.concurrency and replica.idle_timer is None:
            replica.idle_timer = loop.call_later(self.spec.scale_down_s, self._retire, replica, loop)

    def _retire(self, replica: _Replica, loop: asyncio.AbstractEventLoop) -> None:
        if replica in self._replicas and replica.free == self.spec.concurrency:
            self._replicas.remove(replica)
            self.stats_.provisioned_s += (loop.time() - replica.started_at) * self.spec.concurrency

    def stats(self, now: float) -> dict[str, Any]:
        st = self.stats_
        live = sum((now - r.started_at) * self.spec.concurrency for r in self._replicas if st.first is not None)
        provisioned = st.provisioned_s + live
        if self.spec.mode == "none":
            provisioned = 0.0
        return {
            "requests": st.requests,
            "mean_wait_s": st.wait_s / st.requests if st.requests else 0.0,
            "busy_s": st.busy_s,
            "provisioned_slot_s": provisioned,
            "utilisation": st.busy_s / provisioned if provisioned > 0 else 0.0,
            "replica_starts": st.replica_starts,
            "peak_replicas": st.peak_replicas if self.spec.mode == "serverless" else len(self._replicas),
        }


def _with_success_rate(fn: Callable[[Trajectory], Awaitable[float]], rate: float | None, seed: int
                       ) -> Callable[[Trajectory], Awaitable[float]]:
    """`fn`'s timing with a reward of 1 with probability `rate` (else 0), drawn from a hash of the run seed and
    the trajectory id — no shared random stream, so a run without a rate draws nothing new."""
    if rate is None:
        return fn

    async def scored(trajectory: Trajectory) -> float:
        await fn(trajectory)
        draw = random.Random(f"{seed}|{trajectory.trajectory_id}").random()  # (a str seed is hashed by sha512)
        return 1.0 if draw < rate else 0.0

    scored.__name__ = getattr(fn, "__name__", "sim_reward")
    return scored


class SimScorer:
    """The twin's `RewardScorer`: every domain scored by the pool's function through the production
    `LocalRewardClient`."""

    def __init__(self, cfg: RunConfig, pool: SimRewardPool, seed: int | None = None) -> None:
        fns = {domain: _with_success_rate(pool.fn(domain), dc.profile.success_rate if dc.profile else None, cfg.seed)
               for domain, dc in cfg.domains.items()}
        self.client = LocalRewardClient(fns.__getitem__, cfg.reward, seed)
        self._started_at = time.monotonic()

    async def score(self, trajectory: Trajectory) -> RewardResult:
        return await self.client.score(trajectory, trajectory.domain)

    def metrics(self) -> dict[str, float]:
        """The real router's `reward/local/*` metrics and totals."""
        return backend_metrics({"local": self.client}, time.monotonic() - self._started_at)
