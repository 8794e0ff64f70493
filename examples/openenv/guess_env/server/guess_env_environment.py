# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""
Guess Env Environment Implementation.

Guess a secret number, drawn from the reset seed in a range of 20 numbers between 1 and 100 (also drawn from the
seed), in at most 5 guesses; each guess is answered higher or lower. Reward 1.0 for finding it.
"""

import random
from typing import Optional
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

try:
    from ..models import GuessAction, GuessObservation
except ImportError:
    from models import GuessAction, GuessObservation

MAX_GUESSES = 5


class GuessEnvironment(Environment):
    """Guess the secret number; the seed of reset() chooses it."""

    # Enable concurrent WebSocket sessions.
    # Set to True if your environment isolates state between instances.
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self):
        """Initialize the guess_env environment."""
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._secret = 1

    def reset(self, seed: Optional[int] = None) -> GuessObservation:
        """Start an episode: the secret is drawn from `seed`."""
        self._state = State(episode_id=str(uuid4()), step_count=0)
        rng = random.Random(seed)
        low = rng.randint(1, 81)
        self._secret = rng.randint(low, low + 19)
        return GuessObservation(
            feedback=f"I picked a number from {low} to {low + 19}. Guess it.",
            guesses_left=MAX_GUESSES,
            done=False,
            reward=0.0,
        )

    def step(self, action: GuessAction) -> GuessObservation:  # type: ignore[override]
        """Compare the guess with the secret."""
        self._state.step_count += 1
        left = MAX_GUESSES - self._state.step_count
        if action.guess == self._secret:
            return GuessObservation(feedback=f"{action.guess} is right!", guesses_left=left, done=True, reward=1.0)
        hint = "higher" if action.guess < self._secret else "lower"
        return GuessObservation(
            feedback=f"{action.guess} is wrong: the secret is {hint}.",
            guesses_left=left,
            done=left <= 0,
            reward=0.0,
            metadata={"step": self._state.step_count},
        )

    @property
    def state(self) -> State:
        """Get the current environment state."""
        return self._state
