"""The analytic estimate of a candidate cluster: trajectories per second per $/h, without running anything.

In: a run config (domains with profiles), a `SimHardware` (model, training pool, efficiencies) and a
`Candidate` (generation pools by GPU kind and count, and the domain → pool mapping). Out: `estimate(...)`,
and `best_mapping(...)` — for fixed pools, the mapping the estimate ranks first (what the online re-mapper
proposes when a domain's profile drifts; the planner ranks candidates with the same estimate before the
twin scores the best of them, rollart/plan/search.py).

The estimate: each domain's GPU-seconds per trajectory on each kind — prefill of what is not cached, and
decode at the batch an engine runs (what is in flight on the pool, as slots and KV allow) — gives each
pool's rollout time per step; a step is the slowest of those, the train step and the serial latency of a
long episode (mean + 2 std of turns and response length).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from rollart.config import RunConfig
from rollart.sim.costs import EngineCost, TrainerCost
from rollart.sim.hardware import SimHardware
from rollart.sim.workload import profile_of


@dataclass(frozen=True)
class Candidate:
    pools: tuple[tuple[str, str, int], ...]  # (pool name, GPU kind, GPUs), pools with GPUs only
    mapping: tuple[tuple[str, str], ...]  # (domain, pool)

    @property
    def homogeneous(self) -> bool:
        return len(self.pools) == 1

    def describe(self) -> str:
        pools = " + ".join(f"{n} {kind}" for _, kind, n in self.pools)
        return f"{pools}: " + ", ".join(f"{d}→{p}" for d, p in self.mapping)


def estimate(cfg: RunConfig, hardware: SimHardware, cand: Candidate, tp: int) -> float:
    """Trajectories per second per $/h, from the cost models without running anything."""
    batch, alpha = cfg.rollout.batch_size, cfg.rollout.alpha
    weights = {d: dc.weight for d, dc in cfg.domains.items() if dc.weight > 0}
    total_w = sum(weights.values())
    cat = hardware.load_catalogue()
    engines = {name: gpus // tp for name, _, gpus in cand.pools}
    share = {d: batch * w / total_w for d, w in weights.items()}
    in_flight: dict[str, float] = {}
    for domain, pool in cand.mapping:
        in_flight[pool] = in_flight.get(pool, 0.0) + (alpha + 1) * share.get(domain, 0.0)
    busy: dict[str, float] = {}
    serial = tokens = 0.0
    for domain, pool in cand.mapping:
        if domain not in weights:
            continue
        kind = next(k for n, k, _ in cand.pools if n == pool)
        engine = EngineCost(hardware.model, cat.gpu(kind), tp, hardware.engine)
        prof, dc = profile_of(cfg.domains[domain]), cfg.domains[domain]
        turns = min(max(prof.turns.mean, 1.0), dc.max_turns)
        prompt, obs = prof.prompt_tokens.mean, prof.obs_tokens.mean
        response = min(prof.response_tokens.mean, dc.max_new_tokens)
        context = prompt + (turns - 1) * obs + turns * response
        prefill = engine.prefill_s(int(prompt)) + (turns - 1) * engine.prefill_s(int(obs + response), int(context / 2))
        # sequences an engine decodes at once: what is in flight on the pool, as far as slots and KV allow
        kv_room = engine.kv_capacity_tokens() / max(context, 1)
        running = max(1.0, min(engine.eff.max_batch, kv_room, in_flight[pool] / engines[pool]))
        step_s = engine.decode_step_s(int(running), running * context / 2)
        busy[pool] = busy.get(pool, 0.0) + share[domain] * (prefill + turns * response * step_s / running)
        # the slowest episode of a batch: a long one (mean + 2 std of turns and of response length)
        long_turns = min(turns + 2 * prof.turns.std, dc.max_turns)
        long_response = min(response + 2 * prof.response_tokens.std, dc.max_new_tokens)
        env = prof.env_reset.mean_s + long_turns * prof.env_step.mean_s + prof.reward.mean_s
        serial = max(serial, env + long_turns * (long_response * step_s + engine.prefill_s(int(obs + response))))
        tokens += share[domain] * context
    rollout = max(busy.get(p, 0.0) / engines[p] for p in engines)
    train = hardware.pools[hardware.train_pool]
    train_s = TrainerCost(hardware.model, cat.gpu(train.gpu), train.count, hardware.trainer).step_s(int(tokens))
    step = max(rollout, serial, train_s)
    price = sum(cat.gpu(k).price_per_hour * n for _, k, n in cand.pools) + train.count * cat.gpu(train.gpu).price_per_hour
    return batch / step / price


def best_mapping(cfg: RunConfig, hardware: SimHardware, pools: tuple[tuple[str, str, int], ...], tp: int
                 ) -> tuple[tuple[str, str], ...]:
    """The domain → pool mapping the estimate ranks first for these pools (every mapping is tried)."""
    domains = sorted(cfg.domains)
    names = [name for name, _, _ in pools]
    best = max(
        (Candidate(pools, tuple(zip(domains, assignment)))
         for assignment in itertools.product(names, repeat=len(domains))),
        key=lambda c: estimate(cfg, hardware, c, tp),
    )
    return best.mapping
