"""Fault and latency injection around any env, from `domains.<name>.inject` (FaultInjectionConfig).

In: an `AsyncEnv`, the config and a `random.Random` owned by the caller (shared across re-created envs,
so a retried reset draws new faults instead of repeating the first). Out: the same async interface,
where each reset/step first sleeps a latency drawn from its `LatencyConfig`, then fails with
`InjectedFault` with probability `*_fail_prob`, or hangs (until the caller's timeout cancels it) with
probability `hang_prob`, else calls the env. Sleeps and hangs are asyncio waits: they occupy no thread,
so injected latency never starves the pool that runs real env calls.

Latency: `constant` = mean_s; `gaussian` = N(mean_s, std_s) clipped at 0; `empirical` = one of `samples`;
`lognormal` with the given mean and std of the latency itself (μ, σ of the underlying normal derived from them).
"""

from __future__ import annotations

import asyncio
import math
import random

from rollart.config import FaultInjectionConfig, LatencyConfig
from rollart.envs.protocol import AsyncEnv, ResetResult, StepResult


class InjectedFault(RuntimeError):
    """A failure injected on purpose (reliability tests, benchmarks)."""


def sample_latency(cfg: LatencyConfig, rng: random.Random) -> float:
    """One latency in seconds (≥ 0) from `cfg`."""
    if cfg.dist == "none":
        return 0.0
    if cfg.dist == "constant":
        return cfg.mean_s
    if cfg.dist == "gaussian":
        return max(0.0, rng.gauss(cfg.mean_s, cfg.std_s))
    if cfg.dist == "empirical":
        return rng.choice(cfg.samples)
    return lognormal(cfg.mean_s, cfg.std_s, rng)


def lognormal(mean: float, std: float, rng: random.Random) -> float:
    """A lognormal draw with this mean and standard deviation (of the value itself); 0 if mean ≤ 0."""
    if mean <= 0:
        return 0.0
    sigma2 = math.log1p((std / mean) ** 2)
    return rng.lognormvariate(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))


class FaultInjectingEnv:
    """`AsyncEnv`-compatible wrapper adding latency, failures and hangs to reset and step."""

    def __init__(self, env: AsyncEnv, cfg: FaultInjectionConfig, rng: random.Random) -> None:
        self.env, self.cfg, self.rng = env, cfg, rng
        self.inner = env.inner

    async def _perturb(self, what: str, latency: LatencyConfig, fail_prob: float) -> None:
        delay = sample_latency(latency, self.rng)
        if delay > 0:
            await asyncio.sleep(delay)
        if self.rng.random() < fail_prob:
            raise InjectedFault(f"injected {what} failure")
        if self.rng.random() < self.cfg.hang_prob:
            await asyncio.Event().wait()  # a hang: only the caller's timeout ends it

    async def reset(self, seed: int | None = None) -> ResetResult:
        await self._perturb("env.reset", self.cfg.reset_latency, self.cfg.reset_fail_prob)
        return await self.env.reset(seed)

    async def step(self, action: str) -> StepResult:
        await self._perturb("env.step", self.cfg.step_latency, self.cfg.step_fail_prob)
        return await self.env.step(action)

    async def close(self) -> None:
        await self.env.close()
