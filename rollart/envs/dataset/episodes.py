"""What a row becomes: an episode (an env with reset/step) made from the row's values.

In: `row`, the row's mapped roles (role → value, see `DatasetConfig.columns`), with `prompt` already the user
message `data.prompt_format` made, and the domain's `options` as keyword arguments. Out: an env with the
GEM interface (`rollart.envs.protocol`), plus `expert_action()` / `random_action()` for warm starts.

The reference the reward reads (`answer`, `tests`, `row` …) is the dataset env's job (env.py), not the
episode's: an episode only plays the row. A user's episode is any class `Class(row, **options)` with
reset/step, named `module.path:Class` in `data.episode`.

Built-in:
- `single_turn` — the prompt (or the row's chat, a `messages` column: the reset info's `prompt_messages`),
  one answer, the episode ends. The reward plane scores the answer. An answer without `\\boxed{...}` is a
  format error (the turn gets the domain's `format_penalty`), unless the domain's `options` say
  `boxed: false` (free-text answers, e.g. for a `regex` reward).
- `tool_lookup` — a multi-turn tool-use task from the row: the row's `tools` (a list of {name, description,
  results: {argument: result}}) are listed under the question; the model calls one by writing
  `\\boxed{name(argument)}` and sees `name(argument) = result`, until it answers with any other
  `\\boxed{...}`. The hidden answer is the row's `answer` (scored by the reward, e.g. `exact`). Its expert
  calls the tools in their listed order — the first on the argument the question names, each next on the
  previous result — then answers with the last result.
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable, Mapping

from rollart.envs.actions import boxed, extract_boxed
from rollart.envs.dataset.rows import final_answer
from rollart.envs.protocol import PROMPT_MESSAGES_KEY


def _chat(row: Mapping[str, Any]) -> list[dict[str, str]] | None:
    """The chat a row starts from: its `messages`, or its prompt under a per-row `system` message."""
    if "messages" in row:
        return [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in row["messages"] or []]
    if row.get("system"):
        return [{"role": "system", "content": str(row["system"])}, {"role": "user", "content": row["prompt"]}]
    return None


def _first_observation(row: Mapping[str, Any], chat: list[dict[str, str]] | None) -> str:
    if chat is not None:
        users = [m["content"] for m in chat if m["role"] == "user"]
        return users[-1] if users else ""
    return str(row["prompt"])


class SingleTurnEpisode:
    """The row's prompt and one answer (see the module docstring)."""

    def __init__(self, row: Mapping[str, Any], boxed: bool = True) -> None:
        self.row, self.boxed = row, boxed
        self._rng = random.Random(0)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self._rng = random.Random(seed)
        chat = _chat(self.row)
        return _first_observation(self.row, chat), ({PROMPT_MESSAGES_KEY: chat} if chat is not None else {})

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.boxed and extract_boxed(action) is None:
            return "No \\boxed{} answer.", 0.0, True, False, {"format_error": "no \\boxed{answer} found"}
        return "Answer received.", 0.0, True, False, {}

    def expert_action(self) -> str:
        if self.row.get("answer") is None:
            raise TypeError("single_turn: a row without an answer column has no expert")
        return boxed(final_answer(self.row["answer"]))

    def random_action(self) -> str:
        """A well-formed answer of the right kind: a number up to twice the answer's size when it is one."""
        try:
            high = max(9, 2 * abs(int(float(final_answer(self.row.get("answer"))))))
        except (TypeError, ValueError, OverflowError):
            high = 100
        guess = str(self._rng.randint(0, high))
        return boxed(guess) if self.boxed else guess


_CALL = re.compile(r"^\s*([A-Za-z_]\w*)\s*\((.*)\)\s*$", re.DOTALL)


class ToolLookupEpisode:
    """A tool-use task whose tools and hidden answer come from the row (see the module docstring)."""

    def __init__(self, row: Mapping[str, Any]) -> None:
        tools = row.get("tools")
        if not isinstance(tools, list) or not tools:
            raise ValueError("tool_lookup: the row's tools must be a non-empty list of {name, description, results}")
        self.row = row
        self.tools: dict[str, dict[str, str]] = {}
        self.descriptions: dict[str, str] = {}
        for tool in tools:
            if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
                raise ValueError(f"tool_lookup: a tool is not an object with a name: {tool!r:.200}")
            results = tool.get("results") or {}
            self.tools[tool["name"]] = {str(k): str(v) for k, v in dict(results).items() if v is not None}
            self.descriptions[tool["name"]] = str(tool.get("description") or "")
        self._plan: list[str] = []
        self._turn = 0
        self._rng = random.Random(0)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self._turn, self._rng = 0, random.Random(seed)
        self._plan = self._expert_plan()
        listed = "\n".join(f"- {name}(argument): {self.descriptions[name]}" for name in self.tools)
        return (f"{self.row['prompt']}\nTools (call one as \\boxed{{name(argument)}}; answer as "
                f"\\boxed{{answer}}):\n{listed}"), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._turn += 1
        content = extract_boxed(action)
        if content is None:
            return ("Write \\boxed{name(argument)} to call a tool, or \\boxed{answer} to answer.", 0.0, False, False,
                    {"format_error": "no \\boxed{...} found"})
        call = _CALL.match(content)
        if call and call.group(1) in self.tools:
            name, argument = call.group(1), call.group(2).strip().strip("'\"")
            result = self.tools[name].get(argument)
            text = f"{name}({argument}) = {result}" if result is not None else f"{name}({argument}): no result"
            return text, 0.0, False, False, {"tool": name}
        return "Answer received.", 0.0, True, False, {"answer": content}

    def _expert_plan(self) -> list[str]:
        """The expert's actions: each tool in order on the chain's current value, then the last value."""
        value, calls = None, []
        for name, results in self.tools.items():
            if value is None:  # the first tool's argument is the one the question names
                value = next((k for k in results if k and k in str(self.row["prompt"])), None)
            if value is None or value not in results:
                break
            calls.append(boxed(f"{name}({value})"))
            value = results[value]
        answer = final_answer(self.row["answer"]) if self.row.get("answer") is not None else value
        return calls + [boxed(str(answer))]

    def expert_action(self) -> str:
        return self._plan[min(self._turn, len(self._plan) - 1)]

    def random_action(self) -> str:
        name = self._rng.choice(sorted(self.tools))
        if self.tools[name] and self._rng.random() < 0.7:
            return boxed(f"{name}({self._rng.choice(sorted(self.tools[name]))})")
        values = [v for results in self.tools.values() for v in results.values()] or ["?"]
        return boxed(self._rng.choice(values))


EPISODES: dict[str, Callable[..., Any]] = {"single_turn": SingleTurnEpisode, "tool_lookup": ToolLookupEpisode}
# roles an episode reads besides the prompt (a row without them is dropped)
EPISODE_ROLES: dict[str, tuple[str, ...]] = {"single_turn": (), "tool_lookup": ("tools",)}
