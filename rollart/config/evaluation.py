"""The `eval` section: validation, each domain's validation split scored at the served weights (read by the
job's evaluation).

In: `Section` (`base`), the bounds (`bounds`). Out: `EvalConfig`.

Guarantee: an episode that failed for an infrastructure reason is re-run, never scored as 0.
"""

from __future__ import annotations

from pydantic import Field

from rollart.config.base import Section
from rollart.config.bounds import MAX_BATCH, MAX_RETRIES, MAX_STEPS


class EvalConfig(Section):
    """Validation: each domain's validation split, scored at the served weights."""

    every: int = Field(50, ge=1, le=MAX_STEPS, description="evaluate every N train steps (and at the first and last)")
    episodes_per_domain: int = Field(
        64, ge=1, le=MAX_BATCH, description="validation episodes per domain (seeds 0..N-1 of the validation split)"
    )
    temperature: float = Field(
        0.0, ge=0, le=100, description="sampling temperature of validation episodes (0 = greedy)"
    )
    samples: int = Field(
        0, ge=0, le=1024, description="pass@k / avg@n: each validation episode is also run this many times at "
        "eval.sample_temperature, and eval/<domain>/pass@k (k = 1, 2, 4 … ≤ n, and n) and avg@n are reported beside "
        "the greedy score; 0 = off"
    )
    sample_temperature: float = Field(
        1.0, gt=0, le=100, description="sampling temperature of the eval.samples runs of each episode"
    )
    pass_threshold: float = Field(
        1.0, ge=0, le=1, description="a sampled episode passes when its score (reward clipped to [0, 1]) is at least "
        "this"
    )
    retries: int = Field(
        2, ge=0, le=MAX_RETRIES, description="re-runs of an episode that failed for an infrastructure reason (a "
        "worker died, the reward service was down); one still failing is reported as failed, never scored as 0"
    )
