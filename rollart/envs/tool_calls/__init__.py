"""Tool calls in model output: one parser per model family, and which family a chat template writes.

In: the text a model generated, the tools the request offered (name → parameters schema, or just names) and
an id prefix. Out: `ParsedOutput` — the assistant's plain text and its tool calls in OpenAI's shape
(`{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}`), or, when the model wrote
something that looks like a tool call but does not parse, the whole text as plain content with `malformed`
saying what was wrong (the gateway counts it; the agent never gets a 500).

Families (one module each; the format the family's template teaches, hence the format its output is parsed
in, and the grammar a forced call is sampled under — rollart/envs/agents/constraints.py):
- `hermes` — Qwen2.5/Qwen3, NousResearch Hermes, rollart's tiny model: `<tool_call>` JSON blocks.
- `qwen3_coder` — Qwen3-Coder: `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>…`.
- `llama3_json` — Llama 3.1–3.3: `{"name": …, "parameters": {…}}`, several joined by `; `.
- `mistral` — `[TOOL_CALLS][{"name": …, "arguments": {…}}]` (and `[TOOL_CALLS]NAME[ARGS]{…}`).
- `deepseek_v3` — `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` + a JSON block.
- `glm45` — GLM-4.5: `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>`.
- `kimi_k2` — `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:I<|tool_call_argument_begin|>{…}…`.

`detect_family(chat_template)` names the family whose markers the template holds (the most specific first:
Qwen3-Coder's and GLM's templates also hold `<tool_call>`); None when the template renders no tool calls, so a
request with `tools` is refused. `envs.gateway.tool_parser` names one instead.

Guarantees: a call is accepted only if its name is one of the offered tools and its arguments are a JSON
object; parsing never raises on model text (deep nesting, huge or broken text, unclosed markers are a
`malformed` reason). A new family is one module with a `FAMILY` and one line in `FAMILIES`.
"""

from __future__ import annotations

from rollart.envs.tool_calls import deepseek_v3, glm45, hermes, kimi_k2, llama3_json, mistral, qwen3_coder
from rollart.envs.tool_calls.base import Family, ParsedOutput, Parser, ToolCall, Tools

# in detection order: a template is the first family whose markers it all holds
FAMILIES: dict[str, Family] = {f.name: f for f in (
    qwen3_coder.FAMILY, glm45.FAMILY, kimi_k2.FAMILY, deepseek_v3.FAMILY, mistral.FAMILY, llama3_json.FAMILY,
    hermes.FAMILY,
)}


def detect_family(chat_template: str | None) -> str | None:
    """The tool-call family a chat template writes, or None when it renders no tool calls."""
    if not chat_template:
        return None
    for family in FAMILIES.values():
        if all(marker in chat_template for marker in family.markers):
            return family.name
    return None


def family(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown tool-call family {name!r}; known: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def parser_for(name: str) -> Parser:
    return family(name).parse


__all__ = ["FAMILIES", "Family", "ParsedOutput", "Parser", "ToolCall", "Tools", "detect_family", "family",
           "parser_for"]
