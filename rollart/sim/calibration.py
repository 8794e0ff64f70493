"""What the twin needs to stand in for this repository's build machine (the real benches' machine).

`BUILD_MACHINE` is the hardware file of the 2-core machine running the tiny model (presets/
build_machine.yaml, its engine figures from `rollart bench engine`). `FROZENLAKE_TINY` is the episode
profile of `rollart bench rollout`'s tasks as the real system runs them: FrozenLake under the tiny model's
tokenizer and chat template — a first prompt of 74 tokens and 40 tokens per later turn (measured with
`ChatTokens` on the built-in tokenizer), 8 generated tokens per turn (the bench's `max_new_tokens`; the
untrained tiny model rarely stops early), every episode running all its turns (the bench never ends an
episode on a malformed action, and an untrained policy rarely reaches a hole or the goal).
"""

from __future__ import annotations

from pathlib import Path

from rollart.config import CountConfig, DomainProfileConfig, RunConfig
from rollart.sim.hardware import SimHardware, load_hardware

PRESETS = Path(__file__).with_name("presets")


def build_machine() -> SimHardware:
    return load_hardware(PRESETS / "build_machine.yaml")


def frozenlake_tiny(turns: int) -> DomainProfileConfig:
    return DomainProfileConfig(
        turns=CountConfig(mean=turns), prompt_tokens=CountConfig(mean=74), obs_tokens=CountConfig(mean=40),
        response_tokens=CountConfig(mean=8),
    )


def with_profiles(cfg: RunConfig, profile: DomainProfileConfig) -> RunConfig:
    """`cfg` with every domain given `profile` (a copy; `cfg` is unchanged)."""
    domains = {d: dc.model_copy(update={"profile": profile}) for d, dc in cfg.domains.items()}
    return cfg.model_copy(update={"domains": domains})
