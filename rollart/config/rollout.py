"""The `rollout` section: the control plane's bounds on rollout (batch and group sizes, staleness α,
barriers, redundancy, sampling, the circuit breaker, online re-mapping, admission pacing, the adaptive batch).

In: `Section` (`base`), the bounds (`bounds`). Out: `RolloutConfig`, its `RedundancyConfig` and
`CircuitBreakerConfig`; `min_batch_groups` (the adaptive batch's floor in whole groups).

Guarantee: every wait and count is bounded; that a batch holds whole groups is checked once the whole config
is known (`rollart.config.run`).
"""

from __future__ import annotations

from math import ceil
from typing import Literal

from pydantic import Field

from rollart.config.base import Section
from rollart.config.bounds import MAX_BATCH, MAX_VOCAB, WEEK_S


class RedundancyConfig(Section):
    """Redundant rollouts: start more trajectories than a batch needs; the stragglers are cancelled."""

    extra_per_group: int = Field(0, ge=0, le=4096, description="extra trajectories started per group")
    extra_groups: int = Field(0, ge=0, le=MAX_BATCH, description="extra groups started per batch")
    selection: Literal["first", "stratified"] = Field(
        "stratified", description="first: batches fill in completion order; stratified: keep the domain mix"
    )


class CircuitBreakerConfig(Section):
    """When a domain counts as broken: its own code (env, agent or reward function) keeps failing. Rollout (or an
    evaluation) then stops within seconds with the domain, the count and the first error with its traceback
    (rollart/control/breaker.py). Failures of the infrastructure (a worker that died, a service out) and
    timeouts never count."""

    consecutive_failures: int = Field(
        32, ge=0, le=MAX_BATCH, description="trajectories of one domain in a row that failed in its own code; 0 = "
        "never stop"
    )
    failure_rate: float = Field(
        0.95, gt=0, le=1, description="or: this share of the domain's last `window` counted trajectories failed so"
    )
    window: int = Field(100, ge=1, le=MAX_BATCH, description="trajectories the failure rate is measured over")


class RolloutConfig(Section):
    """Rollout and its bounds: batch and group sizes, staleness α, barriers, sampling."""

    batch_size: int = Field(36, ge=1, le=MAX_BATCH, description="trajectories per train batch (whole groups)")
    group_size: int = Field(4, ge=1, le=4096, description="trajectories sharing a seed (GRPO group)")
    alpha: int = Field(1, ge=0, le=1024, description="staleness bound: train version − behaviour version ≤ α")
    staleness: Literal["trajectory", "token"] = Field(
        "trajectory", description="what α bounds: the version a trajectory started under (trajectory, the "
        "paper's rule) or the oldest version among its generated tokens (token, stricter)"
    )
    barrier: Literal["none", "turn", "batch"] = Field(
        "none", description="none: every trajectory advances on its own; turn: trajectories admitted together "
        "advance turn by turn in lock step (training still overlaps); batch: no new trajectory starts from the "
        "moment a batch is taken until its train step has landed and its weights are served (running ones "
        "keep generating)"
    )
    redundancy: RedundancyConfig = RedundancyConfig()
    circuit_breaker: CircuitBreakerConfig = Field(
        CircuitBreakerConfig(), description="when a domain whose own code keeps failing stops rollout"
    )
    temperature: float = Field(1.0, ge=0, le=100, description="sampling temperature of training episodes (0 = greedy)")
    top_p: float = Field(
        1.0, gt=0, le=1, description="nucleus sampling: keep the smallest set of tokens with this mass"
    )
    top_k: int = Field(0, ge=0, le=MAX_VOCAB, description="sample among the k likeliest tokens; 0 = off")
    pacing: Literal["off", "measured"] = Field(
        "off", description="admission pacing under the α bound: off (admit whenever the window has room); measured "
        "(a group is admitted only if its domain's measured group latency fits in the time left until the last batch "
        "it could serve is taken, from the measured interval between batches — work that would only end STALE waits "
        "for the next weights instead; rollart/control/pacing.py)"
    )
    min_batch_fraction: float = Field(
        1.0, gt=0, le=1, description="adaptive batch: while the trainer is idle, a train step may start with this "
        "share of rollout.batch_size ready (rounded up to whole groups; stratified selection keeps the domain mix), "
        "when taking it makes no running trajectory stale; the loss is normalised by the batch actually taken (its "
        "tokens / sequences), so the update stays an unbiased estimate; rollout/batch_fraction says what was taken. "
        "1.0 = always the full batch"
    )
    get_batch_timeout_s: float = Field(
        600.0, gt=0, le=WEEK_S, description="bound on the wait for one batch (and on a turn-barrier wait); then the "
        "run stops with what it waited for"
    )
    remap: Literal["none", "propose", "auto"] = Field(
        "none", description="online re-mapping when a domain's measured profile drifts from the one its pool was "
        "chosen for (its declared `profile`, else what it measured over its first episodes): none; propose (log "
        "the new mapping); auto (route that domain's new trajectories to it at the next weight sync; in-flight "
        "ones finish where they are). `rollart train` moves a drifted domain to the pool of the domain whose "
        "workload it now resembles most; the cluster twin (`rollart sim`) takes its cost model's best mapping"
    )
    remap_drift: float = Field(
        0.5, gt=0, le=1000, description="drift (largest relative change of a domain's turn/token means) that triggers "
        "it"
    )
    remap_min_episodes: int = Field(
        16, ge=1, le=1_000_000, description="episodes a domain's profile is measured over before it is trusted: for a baseline "
        "(a domain without a declared profile) and again, after a drift is first seen, to confirm it"
    )


def min_batch_groups(rollout: RolloutConfig) -> int:
    """The adaptive batch's floor: `min_batch_fraction` of a batch's groups, rounded up, at least one group
    (`batch_size // group_size` when the fraction is 1: always the full batch)."""
    groups = rollout.batch_size // rollout.group_size
    return max(1, min(groups, ceil(rollout.min_batch_fraction * groups - 1e-9)))
