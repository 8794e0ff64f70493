"""The planner's search: pool sizes and the domain → pool mapping that maximise trained trajectories per
second per dollar, scored by the cluster twin.

In: a run config (its domains, with their declared or measured `profile`s, and its rollout settings), a
hardware template (`SimHardware`: model shape, the training pool, efficiencies, the weight link; its
generation pools are ignored), the GPU kinds to consider, a budget in USD per hour for the generation
GPUs and the node size (GPUs per node: pools grow in whole nodes). Out: `Plan` — the run planned for
(`plan/cluster.py`: every domain's profile known, token budgets that hold its episodes) with notes on what
was filled in, the chosen `Candidate`, its twin report, the best homogeneous cluster's, and every candidate
scored. `costs` splits a candidate's price into the budgeted generation GPUs and what the hardware file adds
(the training pool, reserved reward GPUs, CPU nodes).

Candidates: for each split of the budget between the kinds (whole nodes, as much of the budget spent as
the nodes allow; each kind alone included), every mapping of domains to the pools that have GPUs. The
search is two-stage, since a twin run costs seconds at scale:
1. an analytic estimate ranks all candidates — each domain's GPU-seconds per trajectory on each kind
   (prefill of what is not cached, decode at the batch the KV allows) gives each pool's rollout time per
   step; a step is the slowest of those, the train step and the slowest episode's serial latency;
2. the twin runs the `top_k` best of them, plus the best homogeneous cluster of each kind, and the
   plan is the twin's best. `exhaustive` runs the twin on every candidate (for small scenarios, and
   `rollart bench sim`'s `plan_vs_exhaustive`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from math import floor
from typing import Any, Callable, Iterable, Sequence

from rollart.config import RunConfig
from rollart.plan.cluster import for_the_cluster
from rollart.sim.estimate import Candidate, estimate
from rollart.sim.hardware import GpuPoolSpec, SimHardware
from rollart.sim.run import SimReport, simulate


@dataclass
class Scored:
    candidate: Candidate
    estimate: float  # analytic trajectories/s per $/h
    score: float | None = None  # the twin's trajectories/s per $/h
    report: SimReport | None = None


@dataclass
class Plan:
    run: RunConfig  # the run the candidates were scored on (plan/cluster.py)
    notes: list[str]  # what `run` filled in or raised, one line each
    best: Scored
    best_homogeneous: Scored
    scored: list[Scored] = field(default_factory=list)

    @property
    def gain_over_homogeneous(self) -> float:
        return (self.best.score or 0.0) / (self.best_homogeneous.score or float("inf"))


def costs(hardware: SimHardware, cand: Candidate) -> dict[str, float]:
    """USD per hour of a candidate: `generation` (the GPUs the budget buys) and what the hardware file adds
    — `training` (its training pool), `reward` (reserved reward GPUs), `env` (CPU nodes) — and `total`."""
    cat = hardware.load_catalogue()
    train = hardware.pools[hardware.train_pool]
    out = {
        "generation": sum(cat.gpu(kind).price_per_hour * gpus for _, kind, gpus in cand.pools),
        "training": train.count * cat.gpu(train.gpu).price_per_hour,
        "reward": hardware.reward.workers * cat.gpu(hardware.reward.gpu).price_per_hour
        if hardware.reward.mode == "reserved" else 0.0,
        "env": hardware.env_nodes * next(iter(cat.cpus.values())).price_per_hour,
    }
    return {**out, "total": sum(out.values())}


def pool_name(kind: str) -> str:
    return kind.lower().replace("-", "_")


def candidates(domains: Sequence[str], kinds: Sequence[str], hardware: SimHardware, budget: float,
               node: int, tp: int) -> list[Candidate]:
    """Every budget split (whole nodes) × every mapping of domains to the pools with GPUs."""
    cat = hardware.load_catalogue()
    prices = {k: cat.gpu(k).price_per_hour * node for k in kinds}  # per node
    splits: set[tuple[tuple[str, int], ...]] = set()
    for counts in _node_splits(list(kinds), prices, budget):
        used = tuple((k, n * node) for k, n in zip(kinds, counts) if n > 0)
        if used and all(n % tp == 0 for _, n in used):
            splits.add(used)
    out = []
    for split in sorted(splits):
        names = [pool_name(k) for k, _ in split]
        for assignment in itertools.product(names, repeat=len(domains)):
            if len(names) > 1 and set(assignment) != set(names):
                continue  # a pool that generates for no domain is money spent for nothing
            out.append(Candidate(tuple((pool_name(k), k, n) for k, n in split), tuple(zip(domains, assignment))))
    return out


def _node_splits(kinds: list[str], prices: dict[str, float], budget: float) -> Iterable[tuple[int, ...]]:
    """Node counts per kind whose price fits the budget, the last kind taking all that is left."""
    if len(kinds) == 1:
        yield (floor(budget / prices[kinds[0]] + 1e-9),)
        return
    first = kinds[0]
    for n in range(floor(budget / prices[first] + 1e-9) + 1):
        for rest in _node_splits(kinds[1:], prices, budget - n * prices[first]):
            yield (n, *rest)


# --- scenario building ----------------------------------------------------------------------------------
def apply(cfg: RunConfig, hardware: SimHardware, cand: Candidate, tp: int, steps: int | None = None
          ) -> tuple[RunConfig, SimHardware]:
    """The run config and hardware of a candidate (generation pools replaced, domains re-mapped)."""
    data = cfg.model_dump()
    gen = {name for name, _, _ in cand.pools}
    old_gen = {d.pool for d in cfg.domains.values()}
    pools = {n: p for n, p in data["pools"].items() if n not in old_gen or n == hardware.train_pool}
    for p in pools.values():  # a kept pool falls back only to pools that are still there
        p["fallback"] = [fb for fb in p["fallback"] if fb in pools or fb in gen]
    for name, _, gpus in cand.pools:
        pools[name] = {"kind": "gpu", "device": "cuda", "capacity": gpus // tp,
                       "fallback": sorted(gen - {name}), "description": ""}
    data["pools"] = pools
    for domain, pool in cand.mapping:
        data["domains"][domain]["pool"] = pool
    if steps is not None:
        data["train"]["steps"] = steps
    hw = hardware.model_copy(update={"pools": {
        hardware.train_pool: hardware.pools[hardware.train_pool],
        **{name: GpuPoolSpec(gpu=kind, count=gpus, tp=tp) for name, kind, gpus in cand.pools},
    }})
    return RunConfig.model_validate(data), hw


# --- stage 2: the twin -----------------------------------------------------------------------------------
def twin_score(cfg: RunConfig, hardware: SimHardware, cand: Candidate, tp: int, steps: int) -> tuple[float, SimReport]:
    run_cfg, hw = apply(cfg, hardware, cand, tp, steps)
    report = simulate(run_cfg, hw)
    return report.per_dollar_hour(), report


def plan(cfg: RunConfig, hardware: SimHardware, kinds: Sequence[str], budget: float, *, node: int = 8,
         tp: int = 1, steps: int = 4, top_k: int = 4, exhaustive: bool = False, progress: Any = None,
         check: Callable[[RunConfig, Candidate], Any] | None = None) -> Plan:
    """Choose pool sizes and the domain → pool mapping (see the module docstring); a domain with no profile
    and no default for its kind is refused (`MissingProfiles`, a ValueError). `check(run, candidate)`: raises
    ValueError if the run the plan would write is not valid — called once, before any twin runs."""
    for k in kinds:
        hardware.load_catalogue().gpu(k, "plan --gpus")
    if node % tp:
        raise ValueError(f"--tp {tp} does not divide --node {node}: an inference engine's GPUs must share a node")
    cfg, notes = for_the_cluster(cfg, hardware)
    domains = sorted(cfg.domains)
    cands = candidates(domains, kinds, hardware, budget, node, tp)
    if not cands:
        cheapest = min(hardware.load_catalogue().gpu(k).price_per_hour * node for k in kinds)
        raise ValueError(f"budget ${budget:g}/h buys no node of {node} GPUs of {list(kinds)} "
                         f"(the cheapest node costs ${cheapest:g}/h)")
    if check is not None:
        try:  # what the plan writes must be a valid run: known before anything is simulated
            check(cfg, cands[0])
        except ValueError as exc:
            raise ValueError(f"the planned run would not be a valid run config: {exc}") from None
    scored = sorted((Scored(c, estimate(cfg, hardware, c, tp)) for c in cands), key=lambda s: -s.estimate)
    chosen = scored if exhaustive else scored[:top_k]
    for kind in kinds:  # the best homogeneous cluster of each kind, for the gain the plan reports
        homo = [s for s in scored if s.candidate.homogeneous and s.candidate.pools[0][1] == kind]
        if homo and homo[0] not in chosen:
            chosen.append(homo[0])
    for i, s in enumerate(chosen):
        s.score, s.report = twin_score(cfg, hardware, s.candidate, tp, steps)
        if progress:
            progress(i + 1, len(chosen), s)
    ran = [s for s in scored if s.score is not None]
    best = max(ran, key=lambda s: s.score or 0.0)
    homogeneous = [s for s in ran if s.candidate.homogeneous]
    return Plan(cfg, notes, best, max(homogeneous, key=lambda s: s.score or 0.0) if homogeneous else best, scored)


def twin_remapper(steps: int = 3) -> Callable[[RunConfig, SimHardware, tuple[tuple[str, str, int], ...], int],
                                              tuple[tuple[str, str], ...]]:
    """A re-mapper for the twin's `rollout.remap` (SimSystem's `remapper`): every mapping of the domains to
    the running pools, scored by a short twin run of the measured workload; the best one."""

    def remap(cfg: RunConfig, hardware: SimHardware, pools: tuple[tuple[str, str, int], ...], tp: int
              ) -> tuple[tuple[str, str], ...]:
        domains = sorted(cfg.domains)
        names = [name for name, _, _ in pools]
        mappings = [Candidate(pools, tuple(zip(domains, a))) for a in itertools.product(names, repeat=len(domains))]
        return max(mappings, key=lambda c: twin_score(cfg, hardware, c, tp, steps)[0]).mapping

    return remap
