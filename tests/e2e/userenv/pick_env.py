"""A trivially learnable user environment (`pick_env:PickEnv`): answer \\boxed{red} (reward 1) or
\\boxed{blue} (reward 0). Its "expert" picks at random, so the warm start teaches the format only and
leaves the choice to RL."""

from __future__ import annotations

import random
import re


class PickEnv:
    def reset(self, seed: int | None = None):
        self._rng = random.Random(seed)
        return "Pick a colour: answer \\boxed{red} or \\boxed{blue}.", {}

    def step(self, action: str):
        found = re.findall(r"\\boxed\{(\w+)\}", action)
        if not found or found[-1] not in ("red", "blue"):
            return "Answer \\boxed{red} or \\boxed{blue}.", 0.0, False, False, {"format_error": "no colour"}
        return "Done.", 1.0 if found[-1] == "red" else 0.0, True, False, {}

    def expert_action(self) -> str:
        return self.random_action()

    def random_action(self) -> str:
        return "\\boxed{%s}" % self._rng.choice(["red", "blue"])
