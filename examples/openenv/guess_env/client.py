# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Guess Env Environment Client."""

from typing import Dict

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.types import State

from .models import GuessAction, GuessObservation


class GuessEnv(
    EnvClient[GuessAction, GuessObservation, State]
):
    """
    Client for the Guess Env Environment.

    This client maintains a persistent WebSocket connection to the environment server,
    enabling efficient multi-step interactions with lower latency.
    Each client instance has its own dedicated environment session on the server.

    Example:
        >>> # Connect to a running server
        >>> with GuessEnv(base_url="http://localhost:8000") as client:
        ...     result = client.reset()
        ...     print(result.observation.feedback)
        ...
        ...     result = client.step(GuessAction(guess=10))
        ...     print(result.observation.feedback)

    Example with Docker:
        >>> # Automatically start container and connect
        >>> client = GuessEnv.from_docker_image("guess_env-env:latest")
        >>> try:
        ...     result = client.reset()
        ...     result = client.step(GuessAction(guess=10))
        ... finally:
        ...     client.close()
    """

    def _step_payload(self, action: GuessAction) -> Dict:
        """
        Convert GuessAction to JSON payload for step message.

        Args:
            action: GuessAction instance

        Returns:
            Dictionary representation suitable for JSON encoding
        """
        return {
            "guess": action.guess,
        }

    def _parse_result(self, payload: Dict) -> StepResult[GuessObservation]:
        """
        Parse server response into StepResult[GuessObservation].

        Args:
            payload: JSON response data from server

        Returns:
            StepResult with GuessObservation
        """
        obs_data = payload.get("observation", {})
        observation = GuessObservation(
            feedback=obs_data.get("feedback", ""),
            guesses_left=obs_data.get("guesses_left", 0),
            done=payload.get("done", False),
            reward=payload.get("reward"),
            metadata=obs_data.get("metadata", {}),
        )

        return StepResult(
            observation=observation,
            reward=payload.get("reward"),
            done=payload.get("done", False),
        )

    def _parse_state(self, payload: Dict) -> State:
        """
        Parse server response into State object.

        Args:
            payload: JSON response from state request

        Returns:
            State object with episode_id and step_count
        """
        return State(
            episode_id=payload.get("episode_id"),
            step_count=payload.get("step_count", 0),
        )
