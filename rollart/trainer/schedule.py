"""Learning-rate schedules as a multiplier of `train.lr` (for `torch.optim.lr_scheduler.LambdaLR`).

In: `train.schedule` (constant | cosine | linear), `train.warmup_steps` W and the total `train.steps` T.
Out: f(s) for train step s = 0, 1, … (one per batch, however many optimizer steps it makes):

    warm-up (s < W):   f = (s + 1) / (W + 1)         (never 0: the first step already moves the weights)
    constant:          f = 1
    linear:            f = max(0, 1 − (s − W) / max(1, T − W))
    cosine:            f = ½ (1 + cos(π · min(1, (s − W) / max(1, T − W))))
"""

from __future__ import annotations

import math
from typing import Callable


def lr_multiplier(schedule: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    if schedule not in ("constant", "cosine", "linear"):
        raise ValueError(f"train.schedule={schedule!r} is not one of 'constant', 'cosine', 'linear'")

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        if schedule == "linear":
            return max(0.0, 1.0 - progress)
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return f
