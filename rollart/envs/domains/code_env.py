"""Code, single-turn: write a small Python function that must pass hidden tests.

In: `reset(seed)` draws a task from a family of small function specs (linear maps, list filters and
sums, string edits …) with seed-drawn constants, and hidden `assert` tests on seed-drawn inputs.
The model answers with the function in a fenced block (```python ... ```; `\\boxed{...}` is accepted
too). Out: reset info carries `reference = {"entry_point", "tests", "language"}` for the reward plane's
sandbox; `step` never runs the code (the reward plane does, sandboxed) and ends the episode with env
reward 0.0. An answer with no code, code that does not parse, or no `def <entry_point>` is a format
error. Expert: the family's reference solution.
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass
from typing import Any, Callable

from rollart.envs.actions import extract_code

ENTRY_POINT = "f"
NUM_TESTS = 4


@dataclass(frozen=True)
class CodeTask:
    prompt: str
    solution: str
    tests: tuple[str, ...]


def _linear(rng: random.Random) -> CodeTask:
    a, b = rng.randint(2, 9), rng.randint(0, 20)
    xs = rng.sample(range(-20, 21), NUM_TESTS)
    return CodeTask(
        f"Write f(x) returning {a}*x + {b}.",
        f"def f(x):\n    return {a} * x + {b}",
        tuple(f"assert f({x}) == {a * x + b}" for x in xs),
    )


def _list_sum(rng: random.Random) -> CodeTask:
    parity = rng.choice(("even", "odd"))
    rem = 0 if parity == "even" else 1
    lists = [[rng.randint(-9, 9) for _ in range(rng.randint(0, 6))] for _ in range(NUM_TESTS)]
    return CodeTask(
        f"Write f(xs) returning the sum of the {parity} numbers in list xs.",
        f"def f(xs):\n    return sum(x for x in xs if x % 2 == {rem})",
        tuple(f"assert f({xs}) == {sum(x for x in xs if x % 2 == rem)}" for xs in lists),
    )


def _count(rng: random.Random) -> CodeTask:
    k = rng.randint(0, 5)
    lists = [[rng.randint(0, 9) for _ in range(rng.randint(0, 7))] for _ in range(NUM_TESTS)]
    return CodeTask(
        f"Write f(xs) returning how many numbers in list xs are greater than {k}.",
        f"def f(xs):\n    return sum(1 for x in xs if x > {k})",
        tuple(f"assert f({xs}) == {sum(1 for x in xs if x > k)}" for xs in lists),
    )


def _string(rng: random.Random) -> CodeTask:
    words = ["abc", "rollart", "lake", "box", "hello", "", "a", "level"]
    kind = rng.randrange(3)
    samples = rng.sample(words, NUM_TESTS)
    if kind == 0:
        return CodeTask(
            "Write f(s) returning the string s reversed.",
            "def f(s):\n    return s[::-1]",
            tuple(f"assert f({s!r}) == {s[::-1]!r}" for s in samples),
        )
    if kind == 1:
        n = rng.randint(2, 4)
        return CodeTask(
            f"Write f(s) returning s repeated {n} times.",
            f"def f(s):\n    return s * {n}",
            tuple(f"assert f({s!r}) == {s * n!r}" for s in samples),
        )
    return CodeTask(
        "Write f(s) returning s in upper case.",
        "def f(s):\n    return s.upper()",
        tuple(f"assert f({s!r}) == {s.upper()!r}" for s in samples),
    )


def _extreme(rng: random.Random) -> CodeTask:
    which = rng.choice(("largest", "smallest"))
    fn = max if which == "largest" else min
    lists = [[rng.randint(-50, 50) for _ in range(rng.randint(1, 6))] for _ in range(NUM_TESTS)]
    return CodeTask(
        f"Write f(xs) returning the {which} number in the non-empty list xs.",
        f"def f(xs):\n    return {fn.__name__}(xs)",
        tuple(f"assert f({xs}) == {fn(xs)}" for xs in lists),
    )


FAMILIES: dict[str, Callable[[random.Random], CodeTask]] = {
    "linear": _linear,
    "list_sum": _list_sum,
    "count": _count,
    "string": _string,
    "extreme": _extreme,
}


def make_task(seed: int | None, families: tuple[str, ...] = tuple(FAMILIES)) -> CodeTask:
    rng = random.Random(seed)
    return FAMILIES[rng.choice(families)](rng)


def code_format_error(text: str) -> str | None:
    """Why `text` is not a usable answer (None when it is): it must hold parseable code defining f."""
    code = extract_code(text)
    if not code:
        return "no ```python code block``` found"
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return f"code does not parse: {exc.msg} (line {exc.lineno})"
    if not any(isinstance(n, ast.FunctionDef) and n.name == ENTRY_POINT for n in ast.walk(tree)):
        return f"no function named {ENTRY_POINT} defined"
    return None


class CodeEnv:
    """One generated function-writing task per episode, its family drawn from `families`."""

    def __init__(self, families: list[str] | tuple[str, ...] = tuple(FAMILIES)) -> None:
        unknown = [f for f in families if f not in FAMILIES]
        if unknown or not families:
            raise ValueError(f"code: families must be a non-empty subset of {sorted(FAMILIES)}, got {list(families)}")
        self.families = tuple(families)
        self.task: CodeTask | None = None

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.task = make_task(seed, self.families)
        obs = f"{self.task.prompt} Answer with the code in a ```python block."
        reference = {"entry_point": ENTRY_POINT, "tests": list(self.task.tests), "language": "python"}
        return obs, {"reference": reference}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task is None:
            raise RuntimeError("code: step() called before reset()")
        problem = code_format_error(action)
        if problem:
            return f"Invalid answer: {problem}.", 0.0, False, False, {"format_error": problem}
        return "Code received.", 0.0, True, False, {}

    def expert_action(self) -> str:
        assert self.task is not None, "code: expert_action() before reset()"
        return f"```python\n{self.task.solution}\n```"

    def random_action(self) -> str:
        """A well-formed but (almost surely) wrong answer."""
        return f"```python\ndef {ENTRY_POINT}(*args):\n    return None\n```"
