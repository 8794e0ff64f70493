"""A user environment whose workload changes mid-run (`shift_env:ShiftEnv`), for the re-mapping test.

Episodes of training seeds below `shift_at` are decode-like: one turn on a short prompt. From `shift_at`
on (the scheduler gives group k the seed k, so "from the k-th group admitted on") they are prefill-like:
`long_turns` turns, each observation a long board. Validation episodes stay short. Any action is accepted
(the reward is 1 for an action that names a digit), so the shape depends only on the seed."""

from __future__ import annotations

import re

VAL_OFFSET = 2_000_000_000  # validation seeds (rollart.envs.seeds)
BOARD = " ".join(f"r{i}c{j}" for i in range(6) for j in range(6))


class ShiftEnv:
    def __init__(self, shift_at: int = 0, long_turns: int = 4) -> None:
        self.shift_at, self.long_turns = shift_at, long_turns

    def reset(self, seed: int | None = None):
        seed = seed or 0
        self.turns = self.long_turns if self.shift_at <= seed < VAL_OFFSET else 1
        self.turn = 0
        return self._observation(), {}

    def _observation(self) -> str:
        return f"Board: {BOARD}. Name a digit." if self.turns > 1 else "Name a digit."

    def step(self, action: str):
        self.turn += 1
        reward = 1.0 if re.search(r"\d", action) else 0.0
        done = self.turn >= self.turns
        return ("Done." if done else self._observation()), reward, done, False, {}

    def expert_action(self) -> str:
        return "7"

    def random_action(self) -> str:
        return "7"
