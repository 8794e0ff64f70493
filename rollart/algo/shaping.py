"""Reward shaping and sample masking by length (DAPO §3.4): overlong reward shaping and overlong filtering.

In: a scored `Trajectory`, its domain's `max_new_tokens` (a turn's limit), `train.overlong_buffer` (the
fraction of the limit that is the soft zone), `train.overlong_penalty`. Out: the reward penalty (≤ 0) and
whether the trajectory was cut (its loss is then masked under `train.overlong_filter`).

Per turn with L_max = max_new_tokens and L_cache = overlong_buffer · L_max, of a response of |y| tokens:

    R_len(y) = 0                                              |y| ≤ L_max − L_cache
             = ((L_max − L_cache) − |y|) / L_cache · penalty    otherwise (down to −penalty at |y| = L_max)

A trajectory's penalty is its worst turn's (a single-turn episode: exactly DAPO's). A trajectory was *cut*
when a turn stopped at its token limit (finish reason "length") or the episode ended TRUNCATED.
"""

from __future__ import annotations

from rollart.types import Status, Trajectory


def overlong_penalty(trajectory: Trajectory, max_new_tokens: int, buffer: float, penalty: float) -> float:
    """R_len of the trajectory's worst turn (module docstring); 0 when `buffer` is 0."""
    if buffer <= 0 or penalty == 0 or not trajectory.turns:
        return 0.0
    cache = buffer * max_new_tokens
    start = max_new_tokens - cache
    worst = 0.0
    for turn in trajectory.turns:
        n = len(turn.response_token_ids)
        if n > start:
            worst = min(worst, max((start - n) / cache, -1.0) * penalty)
    return worst


def was_cut(trajectory: Trajectory) -> bool:
    """A turn stopped at its token limit, or the episode was TRUNCATED."""
    return trajectory.status is Status.TRUNCATED or any(t.finish_reason == "length" for t in trajectory.turns)
