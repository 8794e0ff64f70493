"""Math, single-turn and decode-heavy: procedurally generated arithmetic and word problems.

In: `reset(seed)` draws one problem (`a op b` arithmetic, or a one-step word problem) from the seed; the
model answers with `\\boxed{<number>}`. Out: the reset info carries `reference = {"answer": "<int>"}`;
`step` ends the episode with env reward 0.0 — the env never scores: the reward plane's `math` reward
(math-verify) checks the response against the reference. A response with no `\\boxed{}` is a format
error (the episode then goes on, or ends, per the domain config).
Expert: the reference answer, boxed. Nothing is downloaded.
"""

from __future__ import annotations

import random
from typing import Any, Callable

from rollart.envs.actions import boxed, extract_boxed

NAMES = ("Ana", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana")
ITEMS = ("apples", "pens", "coins", "books", "cards", "shells")


def _arithmetic(rng: random.Random, hi: int, ops: str) -> tuple[str, int]:
    op = rng.choice(ops)
    a, b = rng.randint(0, hi), rng.randint(0, hi if op != "*" else min(hi, 12))
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"What is {a} {op} {b}?", value


def _word(rng: random.Random, hi: int, ops: str) -> tuple[str, int]:  # noqa: ARG001 - its own operations
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.randrange(4)
    if kind == 0:
        a, b = rng.randint(1, hi), rng.randint(1, hi)
        return f"{name} has {a} {item} and gets {b} more. How many {item} now?", a + b
    if kind == 1:
        a = rng.randint(2, hi)
        b = rng.randint(1, a)
        return f"{name} has {a} {item} and gives away {b}. How many {item} are left?", a - b
    if kind == 2:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return f"{name} has {a} bags with {b} {item} each. How many {item} in all?", a * b
    b, q = rng.randint(2, 9), rng.randint(1, 12)
    return f"{name} shares {b * q} {item} equally among {b} friends. How many each?", q


KINDS: dict[str, Callable[[random.Random, int, str], tuple[str, int]]] = {"arithmetic": _arithmetic, "word": _word}
OPS = "+-*"


def make_problem(
    seed: int | None, kinds: tuple[str, ...] = ("arithmetic", "word"), max_operand: int = 99, ops: str = OPS
) -> tuple[str, str]:
    """(question, answer) for a seed; `ops` are the operations arithmetic problems draw from."""
    rng = random.Random(seed)
    question, value = KINDS[rng.choice(kinds)](rng, max_operand, ops)
    return question, str(value)


class MathEnv:
    """One generated problem per episode; `kinds` ⊆ {arithmetic, word}; operands up to `max_operand`;
    arithmetic draws its operation from `ops` (a string over "+-*")."""

    runs_inline = True  # construction, reset and step are quick pure Python: the env worker's loop runs them

    def __init__(
        self, kinds: list[str] | tuple[str, ...] = ("arithmetic", "word"), max_operand: int = 99, ops: str = OPS
    ) -> None:
        unknown = [k for k in kinds if k not in KINDS]
        if unknown or not kinds:
            raise ValueError(f"math: kinds must be a non-empty subset of {sorted(KINDS)}, got {list(kinds)}")
        if max_operand < 2:
            raise ValueError(f"math: max_operand must be ≥ 2, got {max_operand}")
        if not ops or set(ops) - set(OPS):
            raise ValueError(f"math: ops must be a non-empty string over {OPS!r}, got {ops!r}")
        self.kinds, self.max_operand, self.ops = tuple(kinds), max_operand, ops
        self.question = self.answer = ""
        self._rng = random.Random(0)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.question, self.answer = make_problem(seed, self.kinds, self.max_operand, self.ops)
        self._rng = random.Random(seed)
        return f"{self.question} Answer in \\boxed{{}}.", {"reference": {"answer": self.answer}}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not self.answer:
            raise RuntimeError("math: step() called before reset()")
        given = extract_boxed(action)
        if not given:
            return "Put the final answer in \\boxed{}.", 0.0, False, False, {"format_error": "no \\boxed{answer} found"}
        return "Answer received.", 0.0, True, False, {"answer": given}

    def expert_action(self) -> str:
        return boxed(self.answer)

    def random_action(self) -> str:
        """A well-formed guess anywhere in the range the configured operations can produce."""
        hi = self.max_operand
        low = -hi if "-" in self.ops else 0
        high = max(2 * hi if "+" in self.ops else 0, hi * min(hi, 12) if "*" in self.ops else 0, hi)
        return boxed(str(self._rng.randint(low, high)))
