"""GLM-4.5 / GLM-4.6 calls.

Format (what the template renders):

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    ...
    </tool_call>

a string VALUE as written, any other value as JSON; a value is typed by its parameter's schema (as for
Qwen3-Coder). Calls are separated by a newline; text before the first call is the message content.
"""

from __future__ import annotations

from typing import Any, Mapping

from rollart.envs.tool_calls.base import (
    Family, Literal, Malformed, ParsedOutput, Tools, ToolCall, blocks, checked_call, only_blocks, parameters_of,
    typed_value,
)
from rollart.envs.tool_calls.grammar import properties, quoted, xml_value

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


def _call(body: str, tools: Tools, index: int, call_id: str) -> ToolCall:
    cut = body.find(KEY)
    name, inner = (body, "") if cut < 0 else (body[:cut], body[cut:])
    name = name.strip()
    schemas = parameters_of(tools, name)
    arguments: dict[str, Any] = {}
    pos = 0
    for begin, end, key in blocks(inner, KEY, KEY_END):
        if inner[pos:begin].strip():
            raise Malformed(f"tool call {index}: text between its arguments")
        rest = inner[end:].lstrip()
        if not rest.startswith(VALUE) or VALUE_END not in rest:
            raise Malformed(f"tool call {index}: {KEY} without its {VALUE}")
        value_end = rest.index(VALUE_END)
        arguments[key.strip()] = typed_value(rest[len(VALUE) : value_end], schemas.get(key.strip()))
        pos = len(inner) - len(rest) + value_end + len(VALUE_END)
    if inner[pos:].strip():
        raise Malformed(f"tool call {index}: text after its arguments")
    return checked_call(name, arguments, tools, index, call_id)


def parse(text: str, tools: Tools, id_prefix: str) -> ParsedOutput:
    start = text.find(OPEN)
    if start < 0:
        return ParsedOutput(text, malformed=f"'{CLOSE}' without a '{OPEN}'") if CLOSE in text else ParsedOutput(text)
    calls: list[ToolCall] = []
    try:
        for inner in only_blocks(text[start:], OPEN, CLOSE, "tool calls"):
            calls.append(_call(inner, tools, len(calls), f"{id_prefix}_{len(calls)}"))
    except Malformed as why:
        return ParsedOutput(text, malformed=str(why))
    return ParsedOutput(text[:start].strip(), tuple(calls))


def call_grammar(name: str, parameters: Mapping[str, Any], lit: Literal) -> str:
    parts = [lit(OPEN), quoted(f"{name}\n")]
    for key, schema in properties(parameters):
        parts += [quoted(f"<arg_key>{key}</arg_key>\n<arg_value>"), xml_value(schema), quoted("</arg_value>\n")]
    parts.append(lit(CLOSE))
    return " ".join(parts)


FAMILY = Family("glm45", parse, (OPEN, "<arg_key>", "<arg_value>"), call_grammar, keep_special_tokens=True)
