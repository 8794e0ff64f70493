# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""
Data models for the Guess Env Environment (made with `openenv init guess_env`, then turned from the
template's echo env into a number-guessing game).
"""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class GuessAction(Action):
    """Action for the Guess Env environment - a guess of the secret number."""

    guess: int = Field(..., ge=1, le=100, description="Your guess, a whole number from 1 to 100")


class GuessObservation(Observation):
    """Observation from the Guess Env environment - how the last guess compares."""

    feedback: str = Field(default="", description="Whether the secret is higher, lower, or was found")
    guesses_left: int = Field(default=0, description="Guesses left in this episode")
