"""`reasoning_gym:<dataset>` — a reasoning-gym procedural task generator (`reasoning-gym`) as a single-turn env.

In: a dataset name (any of `reasoning_gym.factory.DATASETS`, e.g. `basic_arithmetic`, `chain_sum`,
`spell_backward`) and options: the dataset's own config fields (e.g. `min_terms`, `max_digits` — passed to
`reasoning_gym.create_dataset(name, **options)`, which checks them), `seed` (the dataset's base seed, default
0), `size` (its size: only finite datasets use it), `system_prompt` (a key of reasoning-gym's
`SYSTEM_PROMPTS`, e.g. `default`, sent as the system message; unset: the question with a one-line answer
format) and `max_answer_chars` (longer answers score 0 unread).

Out: `reset(seed)` → the dataset's item for that seed: its question as the observation, `reference` =
{answer, dataset, index} in the info. reasoning-gym derives item i from `Random(base seed + i)`, and the item
index is the episode seed itself, so rollart's disjoint train and validation seed ranges (envs/seeds.py) give
disjoint items. A finite dataset (one that refuses an index past its `size`, e.g. word_ladder) keeps its last
tenth for validation: train seeds index the first 90%, validation seeds the rest.
`step(text)` → the answer is the content of the last `<answer>…</answer>` (reasoning-gym's own
`extract_answer`), scored by the dataset's own `score_answer(answer, item)`: that is the reward, and the
episode ends. No `<answer>` tags is a format error (the domain's `format_penalty`). A scorer that raises on
what the policy wrote scores 0 (`info["score_error"]`).

Expert: `<answer>` + the item's `answer` (a few datasets — boxnet, graph_color, propositional_logic,
rubiks_cube, rush_hour — have no single oracle answer: their expert scores 0); random: another item's answer.
"""

from __future__ import annotations

import functools
import random
from typing import Any

from rollart.envs.seeds import SPLIT_SIZE, VAL_OFFSET

ANSWER_FORMAT = "Give only the final answer, as <answer>your answer</answer>."


def _frozen(value: Any) -> Any:
    """YAML lists as tuples (reasoning-gym's configs hold tuples; and the dataset cache needs hashable keys)."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    return value


@functools.lru_cache(maxsize=64)
def _dataset(name: str, options: tuple[tuple[str, Any], ...]) -> tuple[Any, bool]:
    """(the dataset, whether it is finite): made once per process per config — a group's members share it."""
    import reasoning_gym

    try:
        ReasoningGymEnv.check_id(name)
    except ValueError as exc:
        raise ValueError(f"reasoning_gym:{name}: {exc}") from None
    kwargs = dict(options)
    try:
        dataset = reasoning_gym.create_dataset(name, **kwargs)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ValueError(f"reasoning_gym:{name}: its config refused options {kwargs}: {exc}") from exc
    try:
        dataset[VAL_OFFSET + SPLIT_SIZE - 1]
        finite = False
    except IndexError:
        finite = True
    return dataset, finite


class ReasoningGymEnv:
    """One reasoning-gym item per episode, scored by the dataset's own `score_answer` (see the module docstring)."""

    FORM = "reasoning_gym:<dataset>"
    EXAMPLE = "reasoning_gym:basic_arithmetic (options: the dataset's config fields, e.g. max_terms: 2)"

    @classmethod
    def check_id(cls, name: str) -> None:
        """ValueError unless reasoning-gym has a dataset `name`."""
        from reasoning_gym.factory import DATASETS

        if name not in DATASETS:
            import difflib

            close = difflib.get_close_matches(name, DATASETS, n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ValueError(f"reasoning-gym has no dataset {name!r}; {hint}({len(DATASETS)} datasets, e.g. "
                             "basic_arithmetic, chain_sum, spell_backward)")

    def __init__(self, dataset: str, system_prompt: str | None = None, max_answer_chars: int = 4096,
                 seed: int = 0, size: int = 500, **config: Any) -> None:
        from reasoning_gym.utils import SYSTEM_PROMPTS

        if system_prompt is not None and system_prompt not in SYSTEM_PROMPTS:
            raise ValueError(f"reasoning_gym:{dataset}: system_prompt must be one of {sorted(SYSTEM_PROMPTS)} (or "
                             f"unset), got {system_prompt!r}")
        if max_answer_chars < 1:
            raise ValueError(f"reasoning_gym:{dataset}: max_answer_chars must be ≥ 1, got {max_answer_chars}")
        self.name = dataset
        self.dataset, self.finite = _dataset(dataset, tuple(sorted((k, _frozen(v)) for k, v in
                                                                       {**config, "seed": seed, "size": size}.items())))
        self.system_prompt = SYSTEM_PROMPTS[system_prompt] if system_prompt else None
        self.max_answer_chars = max_answer_chars
        self.item: dict[str, Any] | None = None
        self._rng = random.Random(0)

    def index(self, seed: int) -> int:
        """The item of an episode seed (disjoint for train and validation seeds; see the module docstring)."""
        if not self.finite:
            return seed
        size = len(self.dataset)
        held_out = max(1, size // 10)
        if size < 2:
            raise ValueError(f"reasoning_gym:{self.name}: a finite dataset needs size ≥ 2 to hold out validation items")
        if seed >= VAL_OFFSET:
            return size - held_out + (seed - VAL_OFFSET) % held_out
        return seed % (size - held_out)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        seed = int(seed or 0)
        index = self.index(seed)
        self.item = self.dataset[index]
        self._rng = random.Random(seed)
        question = str(self.item["question"])
        info: dict[str, Any] = {"reference": {"answer": self._answer(), "dataset": self.name, "index": index}}
        if self.system_prompt:
            info["prompt_messages"] = [{"role": "system", "content": self.system_prompt},
                                       {"role": "user", "content": question}]
            return question, info
        return f"{question}\n{ANSWER_FORMAT}", info

    def _answer(self) -> str:
        answer = (self.item or {}).get("answer")
        return "" if answer is None else str(answer)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        from reasoning_gym.utils import extract_answer

        if self.item is None:
            raise RuntimeError(f"reasoning_gym:{self.name}: step() before reset()")
        answer = extract_answer(action)
        if answer is None:
            return f"Invalid answer. {ANSWER_FORMAT}", 0.0, False, False, {"format_error": "no <answer>...</answer>"}
        if len(answer) > self.max_answer_chars:
            return "Answer received.", 0.0, True, False, {"answer": answer[:200], "score_error": "answer too long"}
        try:
            score = float(self.dataset.score_answer(answer, self.item))
        except Exception as exc:  # a scorer that chokes on what the policy wrote: 0, with why
            return "Answer received.", 0.0, True, False, {"answer": answer[:200],
                                                          "score_error": f"{type(exc).__name__}: {exc}"[:300]}
        return "Answer received.", score, True, False, {"answer": answer[:200]}

    def expert_action(self) -> str:
        assert self.item is not None, f"reasoning_gym:{self.name}: expert_action() before reset()"
        return f"<answer>{self._answer()}</answer>"

    def random_action(self) -> str:
        """Another item's answer: well formed, rarely right."""
        other = self.dataset[self.index(self._rng.randrange(SPLIT_SIZE))]
        answer = other.get("answer")
        return f"<answer>{'' if answer is None else answer}</answer>"
