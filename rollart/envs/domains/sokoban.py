"""Sokoban, multi-turn: push every box onto a goal. Small puzzles generated per seed, always solvable.

In: `reset(seed)` places goals, boxes and the player at random inside a walled `width`×`height` room
and keeps the first layout (drawn from the seed's RNG) that the breadth-first solver can solve in
`min_moves`..`max_moves` moves — so every puzzle has a solution, found by search, not assumed.
`step(text)` reads `\\boxed{up|down|left|right}`. Out: the board each turn (`#` wall, `_` floor,
`O` goal, `X` box, `*` box on goal, `P` player, `+` player on goal); reward 1.0 and termination when
every box is on a goal, 0 otherwise (a deadlocked puzzle runs on until the turn limit).
Expert: the first move of a shortest solution from the current state.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from rollart.envs.actions import boxed, extract_boxed

MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_ALIASES = {"u": "up", "d": "down", "l": "left", "r": "right"}
MAX_GENERATION_TRIES = 2000
MAX_SOLVER_STATES = 200_000

INSTRUCTIONS = (
    "Sokoban. Push every box X onto a goal O. You are P; # is wall, * box on goal.\n"
    "Move with \\boxed{up}, \\boxed{down}, \\boxed{left} or \\boxed{right}."
)

Cell = tuple[int, int]
State = tuple[Cell, frozenset[Cell]]  # player, boxes


def parse_action(text: str) -> str | None:
    content = extract_boxed(text)
    if content is None:
        return None
    word = content.strip().lower()
    word = _ALIASES.get(word, word)
    return word if word in MOVES else None


def apply_move(walls: frozenset[Cell], state: State, move: str) -> State | None:
    """The state after `move`, or None if the move is blocked (wall, or a box that cannot be pushed)."""
    (r, c), boxes = state
    dr, dc = MOVES[move]
    nxt = (r + dr, c + dc)
    if nxt in walls:
        return None
    if nxt in boxes:
        beyond = (nxt[0] + dr, nxt[1] + dc)
        if beyond in walls or beyond in boxes:
            return None
        boxes = (boxes - {nxt}) | {beyond}
    return nxt, boxes


def solve(walls: frozenset[Cell], goals: frozenset[Cell], state: State, limit: int = MAX_SOLVER_STATES) -> list[str] | None:
    """A shortest move sequence solving the puzzle (breadth-first search), [] if solved, None if none
    exists within `limit` visited states."""
    if state[1] == goals:
        return []
    prev: dict[State, tuple[State, str] | None] = {state: None}
    queue = deque([state])
    while queue and len(prev) < limit:
        cur = queue.popleft()
        for move in MOVES:
            nxt = apply_move(walls, cur, move)
            if nxt is None or nxt in prev:
                continue
            prev[nxt] = (cur, move)
            if nxt[1] == goals:
                path = []
                node: State = nxt
                while prev[node] is not None:
                    node, m = prev[node]  # type: ignore[misc]
                    path.append(m)
                return path[::-1]
            queue.append(nxt)
    return None


def render(walls: frozenset[Cell], goals: frozenset[Cell], state: State, height: int, width: int) -> str:
    player, boxes = state
    rows = []
    for r in range(height):
        row = []
        for c in range(width):
            cell = (r, c)
            if cell in walls:
                ch = "#"
            elif cell == player:
                ch = "+" if cell in goals else "P"
            elif cell in boxes:
                ch = "*" if cell in goals else "X"
            else:
                ch = "O" if cell in goals else "_"
            row.append(ch)
        rows.append("".join(row))
    return "\n".join(rows)


def generate(rng: random.Random, height: int, width: int, boxes: int, min_moves: int, max_moves: int):
    """(walls, goals, start state, solution) of a random solvable puzzle."""
    border = {(r, c) for r in range(height) for c in range(width) if r in (0, height - 1) or c in (0, width - 1)}
    inner = [(r, c) for r in range(1, height - 1) for c in range(1, width - 1)]
    walls = frozenset(border)
    for _ in range(MAX_GENERATION_TRIES):
        cells = rng.sample(inner, 2 * boxes + 1)
        goals = frozenset(cells[:boxes])
        state: State = (cells[-1], frozenset(cells[boxes : 2 * boxes]))
        solution = solve(walls, goals, state)
        if solution is not None and min_moves <= len(solution) <= max_moves:
            return walls, goals, state, solution
    raise RuntimeError(
        f"sokoban: no solvable {height}x{width} puzzle with {boxes} box(es) and {min_moves}..{max_moves} "
        f"moves in {MAX_GENERATION_TRIES} tries; widen min_moves/max_moves or enlarge the room"
    )


class SokobanEnv:
    """A walled `height`×`width` room (border included) with `boxes` boxes; solutions of
    `min_moves`..`max_moves` moves."""

    def __init__(self, height: int = 6, width: int = 6, boxes: int = 1, min_moves: int = 2, max_moves: int = 8) -> None:
        if height < 4 or width < 4:
            raise ValueError(f"sokoban: height and width must be ≥ 4 (the border is a wall), got {height}x{width}")
        if boxes < 1 or 2 * boxes + 1 > (height - 2) * (width - 2):
            raise ValueError(f"sokoban: boxes={boxes} does not fit a {height}x{width} room")
        if not 1 <= min_moves <= max_moves:
            raise ValueError(f"sokoban: need 1 ≤ min_moves ≤ max_moves, got {min_moves}, {max_moves}")
        self.height, self.width, self.boxes = height, width, boxes
        self.min_moves, self.max_moves = min_moves, max_moves
        self.walls: frozenset[Cell] = frozenset()
        self.goals: frozenset[Cell] = frozenset()
        self.state: State | None = None
        self._rng = random.Random(0)

    def board(self) -> str:
        assert self.state is not None
        return render(self.walls, self.goals, self.state, self.height, self.width)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self._rng = random.Random(seed)
        self.walls, self.goals, self.state, solution = generate(
            self._rng, self.height, self.width, self.boxes, self.min_moves, self.max_moves
        )
        return f"{INSTRUCTIONS}\n{self.board()}", {"optimal_moves": len(solution)}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.state is None:
            raise RuntimeError("sokoban: step() called before reset()")
        move = parse_action(action)
        if move is None:
            msg = "Invalid move. Answer \\boxed{up}, \\boxed{down}, \\boxed{left} or \\boxed{right}."
            return f"{msg}\n{self.board()}", 0.0, False, False, {"format_error": "expected \\boxed{up|down|left|right}"}
        nxt = apply_move(self.walls, self.state, move)
        if nxt is None:
            return f"You cannot move {move}.\n{self.board()}", 0.0, False, False, {"action": move}
        self.state = nxt
        solved = nxt[1] == self.goals
        tail = "Solved!" if solved else "Next move?"
        return f"You moved {move}.\n{self.board()}\n{tail}", float(solved), solved, False, {"action": move}

    def expert_action(self) -> str:
        assert self.state is not None, "sokoban: expert_action() before reset()"
        plan = solve(self.walls, self.goals, self.state)
        return boxed(plan[0]) if plan else self.random_action()

    def random_action(self) -> str:
        return boxed(self._rng.choice(list(MOVES)))
