"""Text a policy writes never raises out of a parser, and never costs more than time linear in its length.

Every parser on the path from a model's text to a reward — each tool-call family registered in
`rollart.envs.tool_calls.FAMILIES` (a new family joins these tests by registering there), the SWE domain's
call parser, patch applier and result judge, the `\\boxed{}` and code-block extractors the built-in domains
and rewards use, the code reward's verdict reader and the dataset episodes' steps — gets nested input (up to
5,000 levels: json.loads alone raises RecursionError at ~1,000), huge input (hundreds of kilobytes of
unclosed openings: a parser that scans again from every opening is quadratic) and invalid input (lone
surrogates, NUL and control characters, fragments of every format mixed). Each returns, or raises only its
documented error (`PatchError`, `ToolCallError`); the huge cases run under a timeout that the quadratic
parsers of before missed by minutes.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollart.base.untrusted import MAX_JSON_DEPTH, loads_json, matching_braces
from rollart.envs.actions import extract_boxed, extract_code
from rollart.envs.dataset.episodes import EPISODES
from rollart.envs.domains.swe import scoring
from rollart.envs.domains.swe.generator import HiddenCase
from rollart.envs.domains.swe.patch import PatchError, apply_patch
from rollart.envs.domains.swe.tools import TOOL_NAMES, ToolCallError, parse_call
from rollart.envs.tool_calls import FAMILIES, parser_for
from rollart.reward.code_reward import count_passes, extract_program
from rollart.reward.protocol import boxed_contents

HIDDEN = [HiddenCase("pkg.mod", "f", "(1, 2)", "3"), HiddenCase("pkg.mod", "g", "()", "[1, [2]]")]
FILE = "".join(f"line {i}\n" for i in range(200))


def _episode_steps() -> dict[str, Callable[[str], Any]]:
    """The dataset episodes' `step` (they parse the policy's `\\boxed{}` and `name(argument)` calls)."""
    rows = {"single_turn": {"prompt": "2+2?", "answer": "4"},
            "tool_lookup": {"prompt": "capital of France?", "answer": "Paris",
                            "tools": [{"name": "lookup", "description": "d", "results": {"France": "Paris"}}]}}
    steps = {}
    for name, cls in EPISODES.items():
        episode = cls(rows[name])
        episode.reset(0)
        steps[f"episode:{name}"] = episode.step
    return steps


# name → (parser, exceptions it may raise by contract)
PARSE: dict[str, tuple[Callable[[str], Any], tuple[type[BaseException], ...]]] = {
    **{f"tool_calls:{family}": ((lambda text, p=parser: p(text, TOOL_NAMES, "call")), ())
       for family, parser in ((name, f.parse) for name, f in FAMILIES.items())},
    "swe.parse_call": (parse_call, (ToolCallError,)),
    "swe.judge": ((lambda text: scoring.judge(text, HIDDEN)), ()),
    "swe.apply_patch": ((lambda text: apply_patch(text, lambda path: FILE if path == "f.py" else None)), (PatchError,)),
    "extract_boxed": (extract_boxed, ()),
    "extract_code": (extract_code, ()),
    "boxed_contents": (boxed_contents, ()),
    "code_reward.extract_program": (extract_program, ()),
    "code_reward.count_passes": ((lambda text: count_passes(text, 3)), ()),
    "loads_json": (loads_json, (ValueError,)),
    **{name: (step, ()) for name, step in _episode_steps().items()},
}

# the openings every format above starts with (and a few that look like them)
OPENERS = ["<tool_call>", "</tool_call>", "{", "[", '"', "\\boxed{", "\\boxed {", "```python\n", "```", "@@ -1 +1 @@\n",
           "--- a/f.py\n+++ b/f.py\n", "-line 1\n", "+x\n", scoring.MARK, "\\", "{\"name\": ", "(", "\n"]
FRAGMENTS = OPENERS + ["}", "]", ")", ":", ",", "0", "1e999", "-1", "null", "true", "\"i\": 0, \"ok\": true",
                       "\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}", "\x00", "\x1b]52;c;eA==\x07",
                       "\ud800", "\udfff", "\u202e", " ", "\t", "lookup(France)", "#### 4"]


def _nested(depth: int, inner: str = "") -> str:
    return "[" * depth + inner + "]" * depth


def check(name: str, text: str) -> None:
    parser, allowed = PARSE[name]
    try:
        parser(text)
    except allowed:
        pass


@st.composite
def adversarial(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["nested", "mixed", "unicode"]))
    if kind == "nested":
        wrap = draw(st.sampled_from(["<tool_call>{}</tool_call>", "\\boxed{{{}}}", scoring.MARK + "{}", "{}",
                                     '<tool_call>{{"name": "bash", "arguments": {{"command": {}}}}}</tool_call>']))
        depth = draw(st.integers(1, 5000))
        brackets = draw(st.sampled_from([("[", "]"), ("{\"a\":", "}"), ("{", "}")]))
        closed = draw(st.booleans())
        return wrap.format(brackets[0] * depth + "1" + (brackets[1] * depth if closed else ""))
    if kind == "mixed":
        return "".join(draw(st.lists(st.sampled_from(FRAGMENTS), max_size=400)))
    return draw(st.text(st.characters(codec=None, exclude_categories=()), max_size=400))  # surrogates included


@pytest.mark.parametrize("name", sorted(PARSE))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(text=adversarial())
def test_no_parser_raises_on_adversarial_text(name: str, text: str) -> None:
    check(name, text)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(PARSE))
@pytest.mark.parametrize("opener", OPENERS)
def test_huge_runs_of_one_opening_cost_linear_time(name: str, opener: str) -> None:
    """~256 KB of one opening, unclosed (the quadratic parsers of before took minutes on the worst of these)."""
    check(name, opener * (256 * 1024 // len(opener)))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(PARSE))
def test_a_thousand_nested_brackets_are_data(name: str) -> None:
    """The issue's action: `<tool_call>` + `[`×1000 + `]`×1000 — and 100,000 of them."""
    for depth in (1000, 100_000):
        check(name, "<tool_call>" + _nested(depth) + "</tool_call>")
        check(name, scoring.MARK + _nested(depth))


def test_nested_tool_calls_are_malformed_not_errors() -> None:
    for family, parser in [("hermes", parser_for("hermes"))]:  # every family's own format: test_tool_call_parsers.py
        parsed = parser("<tool_call>" + _nested(1000) + "</tool_call>", TOOL_NAMES, "c")
        assert not parsed.tool_calls and "not valid JSON" in parsed.malformed, family
        deep = '<tool_call>{"name": "bash", "arguments": {"command": "ls", "x": ' + _nested(MAX_JSON_DEPTH) + "}}</tool_call>"
        assert "nested deeper than" in parser(deep, TOOL_NAMES, "c").malformed, family
    with pytest.raises(ToolCallError, match="not valid JSON"):
        parse_call("<tool_call>" + _nested(1000) + "</tool_call>")
    assert scoring.judge(scoring.MARK + _nested(1000), HIDDEN).reason == "the hidden tests' results are unreadable"


def test_loads_json_refuses_depth_and_keeps_the_rest() -> None:
    assert loads_json(_nested(MAX_JSON_DEPTH - 1, "1")) == eval(_nested(MAX_JSON_DEPTH - 1, "1"))  # noqa: S307
    for text in (_nested(MAX_JSON_DEPTH + 1), _nested(10_000), '{"a":' * 5000 + "1" + "}" * 5000):
        with pytest.raises(ValueError, match="nested deeper than"):
            loads_json(text)


def test_linear_parsers_keep_their_answers() -> None:
    """What the one-pass brace matching returns is what the forward scans returned."""
    assert extract_boxed("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert extract_boxed("\\boxed{1} then \\boxed{2") == "1"  # an unclosed last one leaves the closed one
    assert extract_boxed("\\boxed{1} \\boxed{}} \\boxed{{x}") == ""
    assert extract_boxed("} \\boxed{ { } no") is None
    assert boxed_contents("\\boxed{a{b}c} \\boxed {d} \\boxed{e") == ["a{b}c", "d"]
    assert matching_braces("}{{}{") == {2: 3}
