"""`gym:<id>` — a gymnasium env with a discrete action space, played through text.

In: a gymnasium id and options: `action_names` (optional list naming the discrete actions in order, e.g.
`[Left, Down, Right, Up]` for FrozenLake-v1) and any keyword arguments of `gymnasium.make`. Out: the
observation is the env's `ansi` text render (colour codes removed, a highlighted cell shown as
`[c]`) when the env has one, else
the raw observation printed; the action is `\\boxed{<name>}` or `\\boxed{<index>}`; rewards and
termination are the env's own. A missing or unknown action is a format error (the env is not stepped).
"""

from __future__ import annotations

import random
import re
from typing import Any

from rollart.envs.actions import boxed, extract_boxed

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# gymnasium highlights the agent's cell with a background colour (codes 40-47): keep it visible as [c]
_HIGHLIGHT = re.compile(r"\x1b\[4[0-7](?:;[0-9]+)*m(.*?)\x1b\[0m")


class GymEnv:
    """`gymnasium.make(env_id, **options)` with a Discrete action space."""

    FORM = "gym:<id>"
    EXAMPLE = "gym:FrozenLake-v1"

    @classmethod
    def check_id(cls, env_id: str) -> None:
        """ValueError unless gymnasium has registered `env_id`."""
        import gymnasium

        try:
            gymnasium.spec(env_id)
        except gymnasium.error.Error as exc:
            raise ValueError(f"gymnasium has no env {env_id!r} ({exc})") from None

    def __init__(self, env_id: str, action_names: list[str] | None = None, **options: Any) -> None:
        import gymnasium as gym

        try:
            env = gym.make(env_id, **options)
        except Exception as exc:
            raise ValueError(f"gym:{env_id}: gymnasium.make failed with options {options}: {exc}") from exc
        # the text render is chosen from the env's declared render modes (a remake switches it on)
        if "render_mode" not in options and "ansi" in env.metadata.get("render_modes", []):
            env.close()
            env = gym.make(env_id, **options, render_mode="ansi")
        self._text_render = env.render_mode == "ansi"
        self.env = env
        space = self.env.action_space
        if not isinstance(space, gym.spaces.Discrete):
            raise ValueError(
                f"gym:{env_id}: the text adapter supports Discrete action spaces; this env has {space}"
            )
        self._start, self._n = int(space.start), int(space.n)
        if action_names is not None and len(action_names) != self._n:
            raise ValueError(f"gym:{env_id}: action_names has {len(action_names)} names, the env has {self._n} actions")
        self.action_names = [str(a) for a in action_names] if action_names else None
        self.env_id = env_id
        self._rng = random.Random(0)

    def _text(self, obs: Any) -> str:
        if self._text_render:
            rendered = self.env.render()
            if isinstance(rendered, str):
                return _ANSI.sub("", _HIGHLIGHT.sub(r"[\1]", rendered)).strip("\n")
        return f"Observation: {obs}"

    def _menu(self) -> str:
        if self.action_names:
            return "Actions: " + ", ".join(f"\\boxed{{{a}}}" for a in self.action_names)
        return f"Actions: \\boxed{{k}} for k in {self._start}..{self._start + self._n - 1}"

    def parse(self, text: str) -> int | None:
        content = extract_boxed(text)
        if content is None:
            return None
        if self.action_names:
            lowered = [a.lower() for a in self.action_names]
            if content.lower() in lowered:
                return self._start + lowered.index(content.lower())
        try:
            index = int(content)
        except ValueError:
            return None
        return index if self._start <= index < self._start + self._n else None

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed)
        self._rng = random.Random(seed)
        return f"{self.env_id}\n{self._text(obs)}\n{self._menu()}", dict(info)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        index = self.parse(action)
        if index is None:
            return f"Invalid action. {self._menu()}", 0.0, False, False, {"format_error": "no valid \\boxed{action}"}
        obs, reward, terminated, truncated, info = self.env.step(index)
        return self._text(obs), float(reward), bool(terminated), bool(truncated), dict(info)

    def random_action(self) -> str:
        index = self._rng.randrange(self._start, self._start + self._n)
        return boxed(self.action_names[index - self._start] if self.action_names else str(index))

    def close(self) -> None:
        self.env.close()
