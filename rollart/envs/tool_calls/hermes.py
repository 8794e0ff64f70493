"""Hermes-style calls (Qwen2.5, Qwen3, NousResearch Hermes, rollart's tiny model).

Format (what these templates render and teach): each call is
`<tool_call>\\n{"name": "<tool>", "arguments": {...}}\\n</tool_call>`, calls separated by a newline; text before
the first call is the message content; only whitespace may stand between and after calls.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from rollart.envs.tool_calls.base import Family, Literal, Malformed, ParsedOutput, Tools, ToolCall, checked_call, load_json, only_blocks
from rollart.envs.tool_calls.grammar import json_rule, quoted

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def parse(text: str, tools: Tools, id_prefix: str) -> ParsedOutput:
    start = text.find(OPEN)
    if start < 0:
        if CLOSE in text:
            return ParsedOutput(text, malformed=f"'{CLOSE}' without a '{OPEN}' before it")
        return ParsedOutput(text)
    calls: list[ToolCall] = []
    try:
        for inner in only_blocks(text[start:], OPEN, CLOSE, "tool calls"):
            body = load_json(inner, f"tool call {len(calls)}")
            if not isinstance(body, dict) or not isinstance(body.get("name"), str):
                raise Malformed(f"tool call {len(calls)} is not a JSON object with a 'name'")
            if set(body) - {"name", "arguments"}:
                raise Malformed(f"tool call {len(calls)} has keys besides 'name' and 'arguments'")
            calls.append(checked_call(body["name"], body.get("arguments", {}), tools, len(calls),
                                      f"{id_prefix}_{len(calls)}"))
    except Malformed as why:
        return ParsedOutput(text, malformed=str(why))
    return ParsedOutput(text[:start].strip(), tuple(calls))


def call_grammar(name: str, parameters: Mapping[str, Any], lit: Literal) -> str:
    head = quoted('\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
    return f'{lit(OPEN)} {head} {json_rule(parameters)} {quoted("}" + chr(10))} {lit(CLOSE)}'


FAMILY = Family("hermes", parse, (OPEN,), call_grammar)
