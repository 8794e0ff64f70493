"""The run the planner plans for: the user's run with every domain's profile known and token budgets that
hold the episodes those profiles describe.

In: a `RunConfig` (often a laptop's: the demo caps answers at 12 tokens) and, when planning for one, the
hardware template. Out: `for_the_cluster(cfg, hardware) -> (RunConfig, notes)` — every domain with a profile
(`rollart.sim.profiles.with_profiles`: declared, or its kind's default; a domain with neither is refused),
`max_new_tokens` and `max_total_tokens` raised where they would cut the profile's episodes short, the batch
raised to what the hardware's training GPUs need (each of the `train.mini_batches` mini-batches holds at least
one sample per training GPU: `train.workers` is their number on the cluster), in whole groups; and one note per
change. A hardware file whose training pool has no GPU is refused here, before anything is simulated. The twin scores candidates on this run and
`plan/run.yaml` is written from it, so what was planned is what the cluster runs.

A budget holds a long episode: mean + 3 std of each count (the largest sample of an empirical one), turns
capped by `max_turns`, rounded up to a power of two. Budgets are only ever raised: a larger one the run set
stays.
"""

from __future__ import annotations

from math import ceil, log2

from rollart.config import CountConfig, DomainConfig, RunConfig
from rollart.sim.hardware import SimHardware
from rollart.sim.profiles import with_profiles


def _long(count: CountConfig) -> float:
    """A long draw of `count`: mean + 3 std, or the largest sample."""
    if count.dist == "empirical":
        return float(max(count.samples))
    return count.mean + (3 * count.std if count.dist != "constant" else 0.0)


def _power_of_two(tokens: float) -> int:
    return 1 << ceil(log2(max(tokens, 16.0)))


def token_budgets(domain: DomainConfig) -> dict[str, int]:
    """`max_new_tokens` and `max_total_tokens` that hold a long episode of the domain's profile."""
    assert domain.profile is not None
    prof = domain.profile
    response = _long(prof.response_tokens)
    turns = min(domain.max_turns, max(1, ceil(_long(prof.turns))))
    context = _long(prof.prompt_tokens) + (turns - 1) * _long(prof.obs_tokens) + turns * response
    return {"max_new_tokens": _power_of_two(response), "max_total_tokens": _power_of_two(context)}


def for_the_cluster(cfg: RunConfig, hardware: SimHardware | None = None) -> tuple[RunConfig, list[str]]:
    """`cfg` as the planner plans it, and what was filled in or raised (see the module docstring)."""
    cfg, notes = with_profiles(cfg)
    if hardware is not None:
        cfg = _batch_for(cfg, hardware, notes)
    domains: dict[str, DomainConfig] = {}
    for name, domain in cfg.domains.items():
        raised = {key: value for key, value in token_budgets(domain).items() if value > getattr(domain, key)}
        domains[name] = domain.model_copy(update=raised)
        if raised:
            changes = ", ".join(f"{key} {getattr(domain, key)} → {value}" for key, value in raised.items())
            notes.append(f"{name}: {changes} (to hold its profile's long episodes: mean + 3 std)")
    return cfg.model_copy(update={"domains": domains}), notes


def _batch_for(cfg: RunConfig, hardware: SimHardware, notes: list[str]) -> RunConfig:
    """`cfg` with a batch the hardware's training GPUs can split: ≥ mini_batches × GPUs, in whole groups."""
    pool = hardware.pools.get(hardware.train_pool)
    gpus = pool.count if pool is not None else 0
    if gpus < 1:
        raise ValueError(f"hardware pools.{hardware.train_pool}: the training pool has no GPUs; give it a count ≥ 1")
    rollout, group = cfg.rollout, cfg.rollout.group_size
    need = cfg.train.mini_batches * gpus
    if rollout.batch_size >= need:
        return cfg
    batch = -(-need // group) * group
    notes.append(f"rollout.batch_size {rollout.batch_size} → {batch} (the hardware's {gpus} training GPUs train "
                 f"on {cfg.train.mini_batches} mini-batch{'es' * (cfg.train.mini_batches != 1)} of at least one "
                 f"sample per GPU; in whole groups of {group})")
    return cfg.model_copy(update={"rollout": rollout.model_copy(update={"batch_size": batch})})
