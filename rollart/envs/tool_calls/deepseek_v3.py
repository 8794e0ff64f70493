"""DeepSeek V3 / R1 calls (and V3.1's shorter form).

Format (what the template renders), all markers single tokens of DeepSeek's tokenizer:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {...}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>…<｜tool▁call▁end｜><｜tool▁calls▁end｜>

V3.1 writes `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`; both are read. Text before the
first marker is the message content.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from rollart.envs.tool_calls.base import (
    Family, Literal, Malformed, ParsedOutput, Tools, ToolCall, checked_call, load_json, only_blocks,
)
from rollart.envs.tool_calls.grammar import json_rule, quoted

BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_V3 = re.compile(r"function\s*" + re.escape(SEP) + r"([^\n]{1,256})\n```json\n(.*)\n```\s*", re.DOTALL)


def _call(body: str, tools: Tools, index: int, call_id: str) -> ToolCall:
    v3 = _V3.fullmatch(body)
    if v3 is not None:
        name, arguments = v3.group(1).strip(), v3.group(2)
    else:
        name, sep, arguments = body.partition(SEP)
        if not sep:
            raise Malformed(f"tool call {index} has no '{SEP}'")
        name = name.strip()
    return checked_call(name, load_json(arguments, f"tool call {index}'s arguments"), tools, index, call_id)


def parse(text: str, tools: Tools, id_prefix: str) -> ParsedOutput:
    start = text.find(BEGIN)
    if start < 0:
        return ParsedOutput(text, malformed=f"'{CALL_BEGIN}' outside '{BEGIN}'") if CALL_BEGIN in text \
            else ParsedOutput(text)
    end = text.find(END, start)
    calls: list[ToolCall] = []
    try:
        if end < 0:
            raise Malformed(f"'{BEGIN}' is never closed")
        if text[end + len(END) :].strip():
            raise Malformed("text after the tool calls")
        for inner in only_blocks(text[start + len(BEGIN) : end], CALL_BEGIN, CALL_END, "tool calls"):
            calls.append(_call(inner, tools, len(calls), f"{id_prefix}_{len(calls)}"))
        if not calls:
            raise Malformed("the tool-call section holds no call")
    except Malformed as why:
        return ParsedOutput(text, malformed=str(why))
    return ParsedOutput(text[:start].strip(), tuple(calls))


def call_grammar(name: str, parameters: Mapping[str, Any], lit: Literal) -> str:
    return (f'{lit(CALL_BEGIN)} {quoted("function")} {lit(SEP)} {quoted(name + chr(10) + "```json" + chr(10))} '
            f'{json_rule(parameters)} {quoted(chr(10) + "```")} {lit(CALL_END)}')


FAMILY = Family("deepseek_v3", parse, (BEGIN, SEP), call_grammar, between="\n", keep_special_tokens=True,
                wrap=lambda calls, lit: f"{lit(BEGIN)} {calls} {lit(END)}")
