"""`guess_number`: GEM's GuessTheNumber game through the GEM adapter, with a binary-search expert.

In/out: exactly `gem:game:GuessTheNumber-v0-<level>` (see `rollart.envs.adapters.gem`); this module only
adds the expert, which plays what the hints so far allow: the middle of the interval still possible.
"""

from __future__ import annotations

from typing import Any

from rollart.envs.actions import boxed
from rollart.envs.adapters.gem import GemEnv


class GuessNumberEnv(GemEnv):
    """GuessTheNumber (`level` easy: 1..10 in 4 turns; hard: 1..50 in 7 turns)."""

    def __init__(self, level: str = "easy", **options: Any) -> None:
        if level not in ("easy", "hard"):
            raise ValueError(f"guess_number: level must be 'easy' or 'hard', got {level!r}")
        super().__init__(f"game:GuessTheNumber-v0-{level}", **options)

    def expert_action(self) -> str:
        game = self.env.unwrapped
        lo, hi = game.min_number, game.max_number
        for guess in game.previous_guesses:  # each hint says on which side of `guess` the number lies
            if guess < game.game_number:
                lo = max(lo, guess + 1)
            elif guess > game.game_number:
                hi = min(hi, guess - 1)
        return boxed(str((lo + hi) // 2))
