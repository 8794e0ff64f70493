"""FrozenLake, multi-turn and prefill-heavy: the whole map is in every observation.

In: `reset(seed)` draws a random solvable map with gymnasium's `generate_random_map` (a path from S to G
is guaranteed) and plays it with gymnasium's deterministic `FrozenLake-v1`; `step(text)` reads
`\\boxed{Left|Right|Up|Down}` (case-insensitive; L/R/U/D too). Out: text observations rendered here
from `env.unwrapped.desc` (gymnasium's ansi render carries colour codes), reward 1.0 on reaching the
goal, 0 otherwise; falling in a hole or reaching the goal terminates.
Expert: breadth-first search for the shortest safe path from the agent's cell.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from rollart.envs.actions import boxed, extract_boxed

# gymnasium's FrozenLake action ids
ACTIONS = {"left": 0, "down": 1, "right": 2, "up": 3}
_ALIASES = {"l": "left", "d": "down", "r": "right", "u": "up"}
_MOVES = {0: (0, -1), 1: (1, 0), 2: (0, 1), 3: (-1, 0)}
NAMES = {v: k.capitalize() for k, v in ACTIONS.items()}

INSTRUCTIONS = (
    "FrozenLake. You are P. Reach G, avoid holes H; F is ice.\n"
    "Move with \\boxed{Left}, \\boxed{Right}, \\boxed{Up} or \\boxed{Down}."
)


def parse_action(text: str) -> int | None:
    """gymnasium action id of `\\boxed{<direction>}` in `text`, or None when malformed."""
    content = extract_boxed(text)
    if content is None:
        return None
    word = content.strip().lower()
    return ACTIONS.get(_ALIASES.get(word, word))


def render(desc: list[str], pos: int) -> str:
    """The map as rows of S/F/H/G with the agent's cell shown as P."""
    n = len(desc[0])
    rows = [list(r) for r in desc]
    rows[pos // n][pos % n] = "P"
    return "\n".join("".join(r) for r in rows)


def shortest_path(desc: list[str], pos: int) -> list[int]:
    """Action ids of a shortest path from cell `pos` to G avoiding holes ([] if none or already there)."""
    nrow, ncol = len(desc), len(desc[0])
    start = divmod(pos, ncol)
    prev: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if desc[cell[0]][cell[1]] == "G":
            path = []
            while prev[cell] is not None:
                cell, action = prev[cell]  # type: ignore[misc]
                path.append(action)
            return path[::-1]
        for action, (dr, dc) in _MOVES.items():
            nxt = (min(max(cell[0] + dr, 0), nrow - 1), min(max(cell[1] + dc, 0), ncol - 1))
            if nxt not in prev and desc[nxt[0]][nxt[1]] != "H":
                prev[nxt] = (cell, action)
                queue.append(nxt)
    return []


class FrozenLakeEnv:
    """A random `size`×`size` lake per seed (`frozen_prob` = chance a cell is ice), not slippery by default."""

    def __init__(self, size: int = 4, frozen_prob: float = 0.8, slippery: bool = False) -> None:
        if size < 2:
            raise ValueError(f"frozenlake: size must be ≥ 2, got {size}")
        if not 0 < frozen_prob <= 1:
            raise ValueError(f"frozenlake: frozen_prob must be in (0, 1], got {frozen_prob}")
        self.size, self.frozen_prob, self.slippery = size, frozen_prob, slippery
        self._env: Any = None
        self.desc: list[str] = []
        self._rng = random.Random(0)

    @property
    def position(self) -> int:
        return int(self._env.unwrapped.s)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        import gymnasium as gym
        from gymnasium.envs.toy_text.frozen_lake import generate_random_map

        desc = generate_random_map(size=self.size, p=self.frozen_prob, seed=seed)
        if self._env is not None:
            self._env.close()
        self._env = gym.make("FrozenLake-v1", desc=desc, is_slippery=self.slippery)
        self._env.reset(seed=seed)
        self.desc = ["".join(c.decode() for c in row) for row in self._env.unwrapped.desc]
        self._rng = random.Random(seed)
        obs = f"{INSTRUCTIONS}\n{render(self.desc, self.position)}"
        return obs, {"map": list(self.desc)}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._env is None:
            raise RuntimeError("frozenlake: step() called before reset()")
        move = parse_action(action)
        board = render(self.desc, self.position)
        if move is None:
            msg = "Invalid move. Answer \\boxed{Left}, \\boxed{Right}, \\boxed{Up} or \\boxed{Down}."
            return f"{msg}\n{board}", 0.0, False, False, {"format_error": "expected \\boxed{Left|Right|Up|Down}"}
        _, reward, terminated, truncated, _ = self._env.step(move)
        board = render(self.desc, self.position)
        cell = self.desc[self.position // self.size][self.position % self.size]
        outcome = {"G": "You reached the goal!", "H": "You fell into a hole."}.get(cell, "Next move?")
        obs = f"You moved {NAMES[move]}.\n{board}\n{outcome}"
        return obs, float(reward), bool(terminated), bool(truncated), {"action": NAMES[move]}

    def expert_action(self) -> str:
        path = shortest_path(self.desc, self.position)
        return boxed(NAMES[path[0]]) if path else self.random_action()

    def random_action(self) -> str:
        return boxed(self._rng.choice(list(NAMES.values())))

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
