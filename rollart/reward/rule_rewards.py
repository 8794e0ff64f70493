"""Built-in rule rewards that read only what the environment recorded. Pure and cheap: awaited inline.

- `env`: the environment's own return (`Trajectory.env_return`, the sum of its per-step rewards), with
  the per-step rewards as per-turn scores.
- `format`: did every turn's action follow the domain's action format? In: the turns' `format_ok` (set
  by the env plane when it parsed the action). Out: the fraction of well-formed turns, per turn 1.0/0.0;
  a trajectory with no turns scores 0.0.
- `exact`: is the answer the reference answer? The answer is the last action's last `\\boxed{...}`, else the
  whole action, stripped; it must equal `reference["answer"]` stripped (1.0 or 0.0).
- `regex`: does the last action contain a match of the domain's `reward.pattern`, with `{answer}` in it
  replaced by the escaped reference answer? Matching is bounded (`REGEX_TIMEOUT_S`, on at most
  `MAX_MATCHED_CHARS` of the action): past it the answer scores 0.0 with `timeout` in the details.
Both need `reference["answer"]`: without it the trajectory is the request's fault (`RewardInputError`), never a
silent 0.
"""

from __future__ import annotations

from typing import Mapping

import regex

from rollart.reward.protocol import RewardInputError, RewardOutput, boxed_contents, final_action
from rollart.types import Trajectory

REGEX_TIMEOUT_S = 1.0
MAX_MATCHED_CHARS = 20_000


async def format_reward(trajectory: Trajectory) -> RewardOutput:
    per_turn = tuple(1.0 if t.format_ok else 0.0 for t in trajectory.turns)
    score = sum(per_turn) / len(per_turn) if per_turn else 0.0
    return RewardOutput(score, per_turn=per_turn, details={"well_formed_turns": int(sum(per_turn))})


async def env_reward(trajectory: Trajectory) -> RewardOutput:
    """`env`: the environment's own return (the sum of its per-step rewards), with per-turn rewards."""
    return RewardOutput(trajectory.env_return, per_turn=tuple(t.reward for t in trajectory.turns))


def reference_answer(trajectory: Trajectory, fn: str) -> str:
    """The reference answer a rule reward compares with; `RewardInputError` when the trajectory has none."""
    gold = trajectory.reference.get("answer")
    if gold is None or str(gold).strip() == "":
        raise RewardInputError(f"{fn} reward: trajectory {trajectory.trajectory_id} has no reference['answer'] "
                               f"({trajectory.reference.get('source', 'reference keys: ' + str(sorted(trajectory.reference)))})")
    return str(gold).strip()


def answer_of(text: str) -> str:
    """The answer in a response: its last `\\boxed{...}`, else the whole text, stripped."""
    boxed = boxed_contents(text)
    return (boxed[-1] if boxed else text).strip()


async def exact_reward(trajectory: Trajectory) -> RewardOutput:
    gold = reference_answer(trajectory, "exact")
    answer = answer_of(final_action(trajectory))
    return RewardOutput(1.0 if answer == gold else 0.0, details={"answer": answer[:200]})


class RegexReward:
    """`regex`: one compiled-on-demand pattern per domain (`domains.<d>.reward.pattern`)."""

    def __init__(self, patterns: Mapping[str, str]) -> None:
        self.patterns = dict(patterns)

    async def __call__(self, trajectory: Trajectory) -> RewardOutput:
        pattern = self.patterns.get(trajectory.domain)
        if not pattern:
            raise RewardInputError(f"regex reward: domain {trajectory.domain!r} has no reward.pattern")
        compiled = regex.compile(pattern.replace("{answer}", regex.escape(reference_answer(trajectory, "regex"))))
        text = final_action(trajectory)[-MAX_MATCHED_CHARS:]
        try:
            found = compiled.search(text, timeout=REGEX_TIMEOUT_S) is not None
        except TimeoutError:
            return RewardOutput(0.0, details={"timeout": True})
        return RewardOutput(1.0 if found else 0.0, details={"timeout": False})
