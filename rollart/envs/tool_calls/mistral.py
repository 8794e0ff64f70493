"""Mistral's calls (Mistral 7B v0.3, Mixtral, Mistral Small / Nemo / Large).

Format (what the template renders): `[TOOL_CALLS]` — a control token — then a JSON array of
`{"name": "<tool>", "arguments": {...}, "id": "<9 letters or digits>"}`; newer tokenizers also write
`[TOOL_CALLS]<tool>[ARGS]{...}` per call, which is read too. Text before `[TOOL_CALLS]` is content.
Mistral's templates accept only 9-character alphanumeric call ids, so the ids this parser gives are such
(derived from the call's place in the trajectory; an id the model wrote is kept).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping

from rollart.envs.tool_calls.base import (
    Family, Literal, Malformed, ParsedOutput, Tools, ToolCall, checked_call, load_json,
)
from rollart.envs.tool_calls.grammar import json_rule, quoted

CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
_ID = re.compile(r"[A-Za-z0-9]{9}")


def call_id(id_prefix: str, index: int) -> str:
    return hashlib.sha256(f"{id_prefix}_{index}".encode()).hexdigest()[:9]


def parse(text: str, tools: Tools, id_prefix: str) -> ParsedOutput:
    start = text.find(CALLS)
    if start < 0:
        return ParsedOutput(text)
    rest = text[start + len(CALLS) :].strip()
    calls: list[ToolCall] = []
    try:
        if rest.startswith("["):
            items = load_json(rest, "the tool calls")
            if not isinstance(items, list) or not items:
                raise Malformed("the tool calls are not a non-empty JSON array")
            for i, item in enumerate(items):
                if not isinstance(item, dict) or set(item) - {"name", "arguments", "id"}:
                    raise Malformed(f"tool call {i} is not {{\"name\", \"arguments\", \"id\"}}")
                given = item.get("id")
                cid = given if isinstance(given, str) and _ID.fullmatch(given) else call_id(id_prefix, i)
                calls.append(checked_call(item.get("name"), item.get("arguments", {}), tools, i, cid))
        else:
            for i, piece in enumerate(text[start:].split(CALLS)[1:]):
                name, sep, arguments = piece.partition(ARGS)
                if not sep:
                    raise Malformed(f"tool call {i} has no '{ARGS}'")
                calls.append(checked_call(name.strip(), load_json(arguments, f"tool call {i}'s arguments"), tools,
                                          i, call_id(id_prefix, i)))
    except Malformed as why:
        return ParsedOutput(text, malformed=str(why))
    return ParsedOutput(text[:start].strip(), tuple(calls))


def call_grammar(name: str, parameters: Mapping[str, Any], lit: Literal) -> str:
    head = quoted('{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
    return f'{head} {json_rule(parameters)} {quoted("}")}'


FAMILY = Family("mistral", parse, (CALLS,), call_grammar, between=", ", keep_special_tokens=True,
                wrap=lambda calls, lit: f'{lit(CALLS)} " [" {calls} "]"')
