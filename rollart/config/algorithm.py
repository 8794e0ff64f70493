"""`train.algorithm`: the named algorithms' presets over the `train.*` settings, and the critic's section.

In: `Section` (`base`), the bounds. Out: `ALGORITHM_PRESETS` (name → the `train.*` values the algorithm sets),
`apply_preset(data)` (what `TrainConfig` runs on its raw input) and `CriticConfig` (`train.critic`).

An algorithm is pure functions in the algo plane (`rollart/algo/<name>.py`, registered in
`rollart/algo/registry.py`); its *parameters* are ordinary `train.*` settings. `train.algorithm=<name>` sets
the settings its preset lists, and a setting the user gives still wins: `{**preset, **given}`. The presets
live here, not in the algo plane, because the configuration sits below the planes and the run directory's
config.yaml must hold the values the run used (a resume reads it back). A test keeps the names here and the
algo registry's the same.

Deprecated keys, read once more and mapped (old run directories still load): `train.importance_weights`
(false → `train.correction=none`) and `train.advantage` (rloo → `algorithm=rloo`, reinforce →
`algorithm=reinforce_pp`, grpo → nothing).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from pydantic import Field

from rollart.config.base import Section

log = logging.getLogger("rollart.config")

# Each algorithm's settings beside today's defaults (grpo: none, exactly today's behaviour). The formulas behind
# each are in docs/training.md and in the algorithm's own module.
ALGORITHM_PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {},
    "dr_grpo": {"normalize_std": False, "aggregation": "seq_sum_norm"},
    "dapo": {"clip_low": 0.2, "clip_high": 0.28, "aggregation": "token_mean", "dynamic_sampling": True,
             "overlong_buffer": 0.2},
    "gspo": {"clip_low": 3e-4, "clip_high": 4e-4, "aggregation": "seq_mean"},
    "cispo": {"clip_low": 1.0, "clip_high": 4.0, "aggregation": "token_mean"},
    "rloo": {"normalize_std": False, "aggregation": "seq_sum"},
    "reinforce_pp": {"normalize_std": True, "kl_estimator": "k2"},
    "ppo": {"normalize_std": True, "aggregation": "token_mean"},
}

_ADVANTAGE_TO_ALGORITHM = {"grpo": None, "rloo": "rloo", "reinforce": "reinforce_pp"}


def apply_preset(data: Any) -> Any:
    """The raw `train` input with its algorithm's preset under it (given keys win); deprecated keys mapped."""
    if not isinstance(data, Mapping):
        return data
    given = dict(data)
    if "importance_weights" in given:
        value = given.pop("importance_weights")
        if value is False and "correction" not in given:
            given["correction"] = "none"
            log.warning("train.importance_weights=false is deprecated: it is train.correction=none now")
        elif value not in (True, False):
            raise ValueError(f"train.importance_weights (deprecated, now train.correction) must be true or false, "
                             f"got {value!r}")
    if "advantage" in given:
        value = given.pop("advantage")
        if value not in _ADVANTAGE_TO_ALGORITHM:
            raise ValueError(f"train.advantage (deprecated, now train.algorithm) must be one of "
                             f"{sorted(_ADVANTAGE_TO_ALGORITHM)}, got {value!r}")
        mapped = _ADVANTAGE_TO_ALGORITHM[value]
        if mapped is not None and "algorithm" not in given:
            given["algorithm"] = mapped
            log.warning("train.advantage=%s is deprecated: it is train.algorithm=%s now", value, mapped)
    name = given.get("algorithm", "grpo")
    if not isinstance(name, str) or name not in ALGORITHM_PRESETS:
        raise ValueError(f"train.algorithm: {name!r} is not one of {', '.join(ALGORITHM_PRESETS)}")
    return {**ALGORITHM_PRESETS[name], **given}


class CriticConfig(Section):
    """The value model of `train.algorithm=ppo`: a value head on a copy of the policy's decoder (taken when RL
    starts, after the warm start) or on `path`'s, trained beside the policy on the trainer's ranks with its own
    optimizer; never sent to inference. Read only by algorithms with a critic."""

    path: str = Field(
        "", description="a Hugging Face causal-LM checkpoint (same tokenizer) whose decoder initialises the critic; "
        "empty = a copy of the policy's decoder when RL starts"
    )
    lr: float = Field(1e-3, gt=0, le=10, description="AdamW learning rate of the critic")
    grad_clip: float = Field(1.0, gt=0, le=1e12, description="clip the critic's global gradient norm to this")
    value_clip: float = Field(
        0.2, ge=0, le=1e6, description="value clipping: a new value may move at most this far from the one the "
        "batch started with (½·max((V−R)², (clip(V, V_old ± c)−R)²)); 0 = off"
    )
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount γ per model token")
    lam: float = Field(1.0, ge=0, le=1, description="GAE λ (1 = Monte-Carlo returns minus the value baseline)")
