"""Qwen3-Coder's XML calls.

Format (what its template renders): each call is

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    ...
    </function>
    </tool_call>

a string VALUE as written, any other value as JSON (the template writes Python's `True`/`False`/`None` for
some; they are read back too). A value is typed by its parameter's schema, so the parser needs the tools'
schemas (with names only, a value is JSON when it parses, else text). Calls are separated by a newline; text
before the first call is the message content.
"""

from __future__ import annotations

from typing import Any, Mapping

from rollart.envs.tool_calls.base import (
    Family, Literal, Malformed, ParsedOutput, Tools, ToolCall, checked_call, only_blocks, parameters_of, typed_value,
)
from rollart.envs.tool_calls.grammar import properties, quoted, xml_value

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAM, PARAM_END = "<parameter=", "</parameter>"


def _tagged(body: str, tag: str, what: str) -> tuple[str, str]:
    """(the name after `tag` up to '>', the rest) of `<tag NAME>rest`."""
    if not body.startswith(tag) or ">" not in body[: len(tag) + 257]:
        raise Malformed(f"{what} is not {tag}NAME>…")
    close = body.index(">", len(tag))
    return body[len(tag) : close].strip(), body[close + 1 :]


def _call(body: str, tools: Tools, index: int, call_id: str) -> ToolCall:
    (inner,) = only_blocks(body, FUNCTION, FUNCTION_END, f"tool call {index}'s function") or [None]
    if inner is None:
        raise Malformed(f"tool call {index} has no {FUNCTION}NAME>")
    name, params = _tagged(FUNCTION + inner, FUNCTION, f"tool call {index}")
    schemas = parameters_of(tools, name)
    arguments: dict[str, Any] = {}
    for param in only_blocks(params, PARAM, PARAM_END, f"tool call {index}'s parameters"):
        key, value = _tagged(PARAM + param, PARAM, f"a parameter of tool call {index}")
        value = value[1:] if value.startswith("\n") else value
        arguments[key] = typed_value(value[:-1] if value.endswith("\n") else value, schemas.get(key))
    return checked_call(name, arguments, tools, index, call_id)


def parse(text: str, tools: Tools, id_prefix: str) -> ParsedOutput:
    start = text.find(OPEN)
    if start < 0:
        return ParsedOutput(text, malformed=f"'{CLOSE}' without a '{OPEN}'") if CLOSE in text else ParsedOutput(text)
    calls: list[ToolCall] = []
    try:
        for inner in only_blocks(text[start:], OPEN, CLOSE, "tool calls"):
            calls.append(_call(inner.strip(), tools, len(calls), f"{id_prefix}_{len(calls)}"))
    except (Malformed, ValueError) as why:
        return ParsedOutput(text, malformed=str(why) or "a malformed tool call")
    return ParsedOutput(text[:start].strip(), tuple(calls))


def call_grammar(name: str, parameters: Mapping[str, Any], lit: Literal) -> str:
    parts = [lit(OPEN), quoted(f"\n<function={name}>\n")]
    for key, schema in properties(parameters):
        parts += [quoted(f"<parameter={key}>\n"), xml_value(schema), quoted("\n</parameter>\n")]
    parts += [quoted("</function>\n"), lit(CLOSE)]
    return " ".join(parts)


FAMILY = Family("qwen3_coder", parse, (OPEN, "<function=", "<parameter="), call_grammar)
