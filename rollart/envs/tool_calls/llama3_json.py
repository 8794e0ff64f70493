"""Llama 3.1 / 3.2 / 3.3 JSON calls.

Format (what Meta's template renders and the model writes): the whole message is one JSON object per call,
`{"name": "<tool>", "parameters": {...}}`, several separated by `; `, optionally after the `<|python_tag|>`
token; a message that does not start with `{` (or the tag) is plain content. `arguments` is read as a
synonym of `parameters` (peers' prompts teach either).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from rollart.envs.tool_calls.base import Family, Literal, Malformed, ParsedOutput, Tools, ToolCall, checked_call
from rollart.envs.tool_calls.grammar import json_rule, quoted

TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


def parse(text: str, tools: Tools, id_prefix: str) -> ParsedOutput:
    body = text.strip()
    if body.startswith(TAG):
        body = body[len(TAG) :].lstrip()
    if not body.startswith("{"):
        return ParsedOutput(text)
    calls: list[ToolCall] = []
    pos = 0
    try:
        while True:
            try:
                obj, end = _DECODER.raw_decode(body, pos)
            except RecursionError:
                raise Malformed(f"tool call {len(calls)} is nested too deeply") from None
            except ValueError as exc:
                raise Malformed(f"tool call {len(calls)} is not valid JSON ({str(exc)[:80]})") from None
            if not isinstance(obj, dict) or set(obj) - {"name", "parameters", "arguments", "type"}:
                raise Malformed(f"tool call {len(calls)} is not {{\"name\", \"parameters\"}}")
            arguments = obj.get("parameters", obj.get("arguments", {}))
            calls.append(checked_call(obj.get("name"), arguments, tools, len(calls), f"{id_prefix}_{len(calls)}"))
            rest = body[end:].lstrip()
            if not rest:
                break
            if not rest.startswith(";"):
                raise Malformed("text after a tool call")
            pos = len(body) - len(rest[1:].lstrip())
    except Malformed as why:
        return ParsedOutput(text, malformed=str(why))
    return ParsedOutput("", tuple(calls))


def call_grammar(name: str, parameters: Mapping[str, Any], lit: Literal) -> str:
    head = quoted('{"name": ' + json.dumps(name, ensure_ascii=False) + ', "parameters": ')
    return f'{head} {json_rule(parameters)} {quoted("}")}'


FAMILY = Family("llama3_json", parse, ('"parameters": ', "<|start_header_id|>"), call_grammar, between="; ",
                keep_special_tokens=True)
