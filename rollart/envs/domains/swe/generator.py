"""SWE-style repair tasks, generated here: a small Python package with one seeded bug, an issue that
reports it, visible tests in the package and hidden tests kept outside it.

In: a seed, a difficulty (0–3) and the mutation families to draw the bug from (`mutations.FAMILIES`).
Out: a `RepairTask` — the package's files as the policy gets them (modules with the bug, `tests/` with
the visible tests, a README), the hidden cases that score it, the bug itself and the file that fixes it
(for the scripted expert).

How a task is made: modules of the package come from topics (`templates.TOPICS`), each holding a few
template functions with seed-drawn constants (and any function a chosen one calls). Every function gets
argument tuples; the expected results come from running the correct functions here. One function is
mutated; the first seeded mutation that changes at least one of that function's results is the bug.

The difficulty knob:
| difficulty | modules (+ those of functions called) | the issue says | the visible tests |
|---|---|---|---|
| 0 | 1 (no function calls another) | the file, the call, what it returned and what was expected | fail on the bug |
| 1 | 2 | the call, what it returned and what was expected | fail on the bug |
| 2 | 3 | a call that shows the bug (through a caller when one breaks) | pass: only hidden tests see it |
| 3 | 4 | only which kind of function misbehaves | pass |

Guarantees: the same (seed, difficulty, families) gives the same task on every machine; the original
package passes every hidden case and the buggy one fails at least one (checked here in-process, and by
running the real files in `tests/unit/test_swe_tasks.py`); hidden cases and the fix never appear in
`files`; every function is as `ast.unparse` writes it, so the fix is a one-statement diff.
"""

from __future__ import annotations

import ast
import functools
import random
import sys
from dataclasses import dataclass
from types import CodeType, MappingProxyType
from typing import Any, Mapping

from rollart.envs.domains.swe.mutations import FAMILIES, Mutation, mutations
from rollart.envs.domains.swe.templates import BY_NAME, TEMPLATES, TOPICS, Args, Template

PACKAGES = ("ledger", "toolbox", "quill", "abacus", "tally", "sprout", "beacon", "harbor", "lumen", "orchard")
MAX_DIFFICULTY = 3
TEST_COMMAND = "python3 -B -m unittest discover -s tests -t . -q"  # -B: no stale .pyc after an edit in the same second
_STEP_LIMIT = 200_000  # traced lines per call while checking a mutant (a guard: templates cannot loop forever)


@dataclass(frozen=True)
class HiddenCase:
    """One hidden check: `module.function(*args)` must have the repr `expected`."""

    module: str  # dotted, e.g. "ledger.numbers"
    function: str
    args: str  # repr of the argument tuple (a Python literal)
    expected: str  # repr of the correct result


@dataclass(frozen=True)
class Bug:
    path: str  # the module file, e.g. "ledger/numbers.py"
    function: str
    family: str
    description: str  # what the mutation did, e.g. "'<' became '<='"


@dataclass(frozen=True)
class RepairTask:
    seed: int
    difficulty: int
    package: str
    issue: str
    files: Mapping[str, str]  # path → text, what the policy's workspace starts with
    hidden: tuple[HiddenCase, ...]
    bug: Bug
    fix: Mapping[str, str]  # path → the correct text of the files the bug touched

    @property
    def prompt(self) -> str:
        return (
            f"You are working in a checkout of the Python package `{self.package}`. Issue:\n{self.issue}\n"
            f"Find and fix the bug in the package's code (its tests run with `{TEST_COMMAND}`). "
            "Hidden tests decide whether the fix is right."
        )


class _StepLimit(Exception):
    pass


def _bounded(fn: Any, args: Args) -> tuple[bool, str]:
    """(ok, repr of the result or the exception's name) of fn(*args), stopped past `_STEP_LIMIT` lines."""
    steps = 0

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal steps
        steps += 1
        if steps > _STEP_LIMIT:
            raise _StepLimit
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return True, repr(fn(*args))
    except BaseException as exc:  # noqa: BLE001 - a mutant may raise anything; that is a result
        return False, type(exc).__name__
    finally:
        sys.settrace(previous)


def _canonical(source: str) -> str:
    return ast.unparse(ast.parse(source))


def _namespace(sources: Mapping[str, str]) -> dict[str, Any]:
    """The package's functions in one namespace (names are unique across templates; imports between
    modules only bring these names in, so a flat namespace runs them exactly as the package does)."""
    namespace: dict[str, Any] = {"__builtins__": __builtins__}
    for source in sources.values():
        exec(_compiled(source), namespace)  # noqa: S102 - our own templates and their mutants
    return namespace


@functools.lru_cache(maxsize=4096)
def _compiled(source: str) -> CodeType:
    return compile(source, "<swe-template>", "exec")


def _choose_functions(rng: random.Random, difficulty: int) -> dict[str, list[str]]:
    """topic → function names: 1 + difficulty topics, 2–3 functions each, plus what they call (at
    difficulty 0 only functions that call none, so the package is one module)."""
    topics = rng.sample(TOPICS, min(1 + difficulty, len(TOPICS)))
    chosen: dict[str, list[str]] = {}
    for topic in topics:
        names = [t.name for t in TEMPLATES if t.topic == topic and not (difficulty == 0 and t.calls)]
        chosen[topic] = rng.sample(names, min(len(names), 2 + difficulty // 2))
    pending = [n for names in chosen.values() for n in names]
    while pending:
        for callee in BY_NAME[pending.pop()].calls:
            topic = BY_NAME[callee].topic
            if callee not in chosen.setdefault(topic, []):
                chosen[topic].append(callee)
                pending.append(callee)
    return {topic: names for topic, names in chosen.items()}


def _module_text(package: str, topic: str, names: list[str], sources: Mapping[str, str]) -> str:
    imports: dict[str, list[str]] = {}
    for name in names:
        for callee in BY_NAME[name].calls:
            other = BY_NAME[callee].topic
            if other != topic and callee not in imports.setdefault(other, []):
                imports[other].append(callee)
    lines = [f'"""{package}.{topic}: {topic} helpers."""']
    lines += [f"from {package}.{other} import {', '.join(sorted(callees))}" for other, callees in sorted(imports.items())]
    return "\n".join(lines) + "\n\n\n" + "\n\n\n".join(sources[n] for n in names) + "\n"


def _test_module(package: str, topic: str, cases: list[tuple[str, Args, str]]) -> str:
    """A unittest module checking `cases` ((function, args, expected repr)) of one topic."""
    functions = sorted({c[0] for c in cases})
    lines = ["import unittest", "", f"from {package}.{topic} import {', '.join(functions)}", "", "",
             f"class Test{topic.title()}(unittest.TestCase):"]
    for index, (function, args, expected) in enumerate(cases):
        call = f"{function}({', '.join(repr(a) for a in args)})"
        lines += [f"    def test_{function}_{index}(self):", f"        self.assertEqual({call}, {expected})", ""]
    return "\n".join(lines)


def _describe(function: str, args: Args, got: tuple[bool, str], expected: str) -> str:
    call = f"{function}({', '.join(repr(a) for a in args)})"
    outcome = f"returns {got[1]}" if got[0] else f"raises {got[1]}"
    return f"`{call}` {outcome}, but {expected} is expected."


def _issue(difficulty: int, package: str, bug_path: str, template: Template,
           shown: tuple[str, Args, tuple[bool, str], str]) -> str:
    function, args, got, expected = shown
    if difficulty == 0:
        return f"In `{bug_path}`, {_describe(function, args, got, expected)}"
    if difficulty == 1:
        return _describe(function, args, got, expected)
    if difficulty == 2:
        return f"A user of `{package}` reports: {_describe(function, args, got, expected)}"
    return f"Users of `{package}` report that the function that {template.summary} gives wrong results for some inputs."


def generate(seed: int, difficulty: int = 1, families: tuple[str, ...] = FAMILIES) -> RepairTask:
    """The repair task of `seed` at `difficulty` with a bug from `families` (see the module docstring)."""
    if not 0 <= difficulty <= MAX_DIFFICULTY:
        raise ValueError(f"swe: difficulty must be in 0..{MAX_DIFFICULTY}, got {difficulty}")
    families = tuple(families)
    if not families or set(families) - set(FAMILIES):
        raise ValueError(f"swe: families must be a non-empty subset of {list(FAMILIES)}, got {list(families)}")
    for attempt in range(64):  # a draw whose functions admit no observable mutation is drawn again
        task = _attempt(random.Random(f"swe:{seed}:{difficulty}:{attempt}"), seed, difficulty, families)
        if task is not None:
            return task
    raise RuntimeError(f"swe: no observable bug from families {list(families)} for seed {seed}")  # pragma: no cover


def _attempt(rng: random.Random, seed: int, difficulty: int, families: tuple[str, ...]) -> RepairTask | None:
    package = rng.choice(PACKAGES)
    chosen = _choose_functions(rng, difficulty)
    topic_of = {name: topic for topic, names in chosen.items() for name in names}
    sources = {name: _canonical(BY_NAME[name].source(rng)) for name in topic_of}
    cases = {name: BY_NAME[name].cases(rng) for name in topic_of}
    correct = _namespace(sources)
    expected: dict[str, list[str]] = {}
    for name, arg_list in cases.items():
        expected[name] = [repr(correct[name](*args)) for args in arg_list]  # our templates: they never raise

    callers = {callee for name in topic_of for callee in BY_NAME[name].calls}
    order = sorted(topic_of)
    rng.shuffle(order)
    if difficulty >= 2:  # a helper that another function calls first: the symptom may show elsewhere
        order.sort(key=lambda n: n not in callers)
    for name in order:
        options = mutations(sources[name], families)
        rng.shuffle(options)
        for mutation in options:
            found = _observable(mutation, name, sources, cases, expected)
            if found is not None:
                return _assemble(rng, seed, difficulty, package, chosen, sources, cases, expected, name,
                                 mutation, found)
    return None


def _observable(mutation: Mutation, name: str, sources: Mapping[str, str], cases: Mapping[str, list[Args]],
                expected: Mapping[str, list[str]]) -> dict[str, list[tuple[bool, str]]] | None:
    """Every function's results under the mutant, if the mutated function itself gets one wrong (only the
    mutated function and those that call it, directly or not, can change: the others are not run)."""
    namespace = _namespace({**sources, name: mutation.source})
    got = [_bounded(namespace[name], args) for args in cases[name]]
    if all(g == (True, e) for g, e in zip(got, expected[name])):
        return None
    affected = {name}
    while grown := {fn for fn in cases if fn not in affected and affected & set(BY_NAME[fn].calls)}:
        affected |= grown
    results = {fn: [(True, e) for e in expected[fn]] for fn in cases}
    results[name] = got
    for fn in affected - {name}:
        results[fn] = [_bounded(namespace[fn], args) for args in cases[fn]]
    return results


def _assemble(rng: random.Random, seed: int, difficulty: int, package: str, chosen: Mapping[str, list[str]],
              sources: Mapping[str, str], cases: Mapping[str, list[Args]], expected: Mapping[str, list[str]],
              name: str, mutation: Mutation, mutant_results: Mapping[str, list[tuple[bool, str]]]) -> RepairTask:
    bug_topic = next(topic for topic, names in chosen.items() if name in names)
    bug_path = f"{package}/{bug_topic}.py"
    modules = {topic: _module_text(package, topic, names, sources) for topic, names in chosen.items()}
    buggy = _module_text(package, bug_topic, chosen[bug_topic], {**sources, name: mutation.source})

    def wrong(fn: str) -> list[int]:
        return [i for i, got in enumerate(mutant_results[fn]) if got != (True, expected[fn][i])]

    # what the issue shows: the bug's own function up to difficulty 1, then preferably a caller it breaks
    shown_fn = name
    if difficulty >= 2:
        shown_fn = next((fn for fn in sorted(cases) if name in BY_NAME[fn].calls and wrong(fn)), name)
    first = wrong(shown_fn)[0]
    shown = (shown_fn, cases[shown_fn][first], mutant_results[shown_fn][first], expected[shown_fn][first])

    files: dict[str, str] = {
        f"{package}/__init__.py": f'"""{package}: small utilities."""\n',
        "tests/__init__.py": "",
        "README.md": (f"# {package}\n\nSmall utilities in modules {', '.join(sorted(chosen))}.\n\n"
                      f"Run the tests: `{TEST_COMMAND}`\n"),
    }
    for topic, text in modules.items():
        files[f"{package}/{topic}.py"] = buggy if topic == bug_topic else text
    for topic, names in sorted(chosen.items()):
        visible: list[tuple[str, Args, str]] = []
        for fn in names:
            bad = set(wrong(fn))
            good = [i for i in range(len(cases[fn])) if i not in bad]
            picks = rng.sample(good, min(2, len(good)))
            if difficulty <= 1 and fn == name:
                picks = [sorted(bad)[0]] + picks[:1]
            visible += [(fn, cases[fn][i], expected[fn][i]) for i in sorted(picks)]
        if visible:
            files[f"tests/test_{topic}.py"] = _test_module(package, topic, visible)
    hidden = tuple(
        HiddenCase(f"{package}.{BY_NAME[fn].topic}", fn, repr(tuple(args)), expected[fn][i])
        for fn in sorted(cases) for i, args in enumerate(cases[fn])
    )
    return RepairTask(
        seed=seed,
        difficulty=difficulty,
        package=package,
        issue=_issue(difficulty, package, bug_path, BY_NAME[name], shown),
        files=MappingProxyType(files),
        hidden=hidden,
        bug=Bug(bug_path, name, mutation.family, mutation.description),
        fix=MappingProxyType({bug_path: modules[bug_topic]}),
    )
