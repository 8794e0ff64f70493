"""Starting the control plane: `start_rollout`, the one place a `RolloutScheduler` is built from a config.

In: a `RunConfig` (its `rollout` section and domains), the env plane's `TrajectoryRunner`, the reward
plane's `RewardScorer`, the number of batches to fill and the versions the run stands at; optionally a
`TurnBarrier` (`rollout.barrier=turn`), a checkpointed scheduler state to go on from, a `LedgerSink` for
the ledger moves, the clock (the cluster twin's is virtual) and the algorithm's group filter (the job passes
`Algorithm.filter_for(cfg.train)`: None unless `train.dynamic_sampling`; its bound is `train.max_filtered_groups`). Out: a started `RolloutScheduler` whose
buffer holds the configured staleness policy, selection and domain weights.

Used by the real system (`rollart.job.system`), the cluster twin (`rollart.sim.system`) and the rollout
benchmark, so the three build the same control plane. `trajectory_timeout_s` is the one bound on a
trajectory's whole run.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from rollart.config import RunConfig
from rollart.control.buffer import SampleBuffer
from rollart.control.scheduler import RolloutScheduler
from rollart.control.staleness import StalenessPolicy
from rollart.types import GroupFilter, LedgerSink, RewardScorer, TrajectoryRunner, TurnBarrier


def trajectory_timeout_s(cfg: RunConfig) -> float:
    """How long one trajectory may run: its longest domain's turns, each a generation and an env step at
    their own timeouts (`inference.request_timeout_s`, `envs.step_timeout_s`)."""
    longest = max(domain.max_turns for domain in cfg.domains.values())
    return longest * (cfg.inference.request_timeout_s + cfg.envs.step_timeout_s)


def start_rollout(
    cfg: RunConfig,
    runner: TrajectoryRunner,
    scorer: RewardScorer,
    *,
    batches: int,
    first_version: int = 0,
    inference_version: int = 0,
    turn_barrier: TurnBarrier | None = None,
    resume_from: Mapping[str, Any] | None = None,
    ledger_sink: LedgerSink | None = None,
    clock: Callable[[], float] = time.time,
    group_filter: GroupFilter | None = None,
) -> RolloutScheduler:
    """A started scheduler that fills `batches` batches, the first trained at `first_version`, with the
    engines serving `inference_version`; `resume_from`: a `RolloutScheduler.state_dict()` to go on from."""
    policy = StalenessPolicy(cfg.rollout.alpha, cfg.rollout.staleness)
    weights = {domain: domain_cfg.weight for domain, domain_cfg in cfg.domains.items() if domain_cfg.weight > 0}
    buffer = SampleBuffer(policy, cfg.rollout.redundancy.selection, weights, clock=clock)
    scheduler = RolloutScheduler(
        cfg.rollout, cfg.domains, runner, scorer, buffer, policy, total_batches=batches,
        first_version=first_version, seed=cfg.seed, turn_barrier=turn_barrier, trajectory_timeout_s=trajectory_timeout_s(cfg),
        clock=clock, ledger_sink=ledger_sink, group_filter=group_filter,
        max_filtered_groups=cfg.train.max_filtered_groups,
    )
    scheduler.set_inference_version(inference_version)
    if resume_from is not None:
        scheduler.load_state_dict(resume_from)
    scheduler.start()
    return scheduler
