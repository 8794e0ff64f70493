"""The one registry of algorithms: `train.algorithm` names → `Algorithm` records (one module each).

To add an algorithm: write `rollart/algo/<name>.py` with its pure functions and `ALGORITHM = Algorithm(...)`
(algorithm.py), add one line below, and — when it sets settings of its own — its preset in
`rollart/config/algorithm.py` (`ALGORITHM_PRESETS`; a test keeps the two lists of names the same).
"""

from __future__ import annotations

from rollart.algo import cispo, dapo, dr_grpo, grpo, gspo, ppo, reinforce_pp, rloo
from rollart.algo.algorithm import Algorithm
from rollart.config import TrainConfig

ALGORITHMS: dict[str, Algorithm] = {
    "grpo": grpo.ALGORITHM,
    "dr_grpo": dr_grpo.ALGORITHM,
    "dapo": dapo.ALGORITHM,
    "gspo": gspo.ALGORITHM,
    "cispo": cispo.ALGORITHM,
    "rloo": rloo.ALGORITHM,
    "reinforce_pp": reinforce_pp.ALGORITHM,
    "ppo": ppo.ALGORITHM,
}


def algorithm_of(train: TrainConfig) -> Algorithm:
    """The `Algorithm` `train.algorithm` names (the config has already refused an unknown name)."""
    try:
        return ALGORITHMS[train.algorithm]
    except KeyError:
        raise ValueError(f"train.algorithm={train.algorithm!r} is not a registered algorithm "
                         f"({', '.join(ALGORITHMS)})") from None
