"""Kimi K2 calls.

Format (what the template renders), all markers special tokens of Kimi's tokenizer:

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>…<|tool_calls_section_end|>

The call id is `functions.NAME:IDX` (IDX counts the calls of the conversation): the template writes the id
back, so the id the model wrote is the call's id. Text before the section is the message content.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from rollart.envs.tool_calls.base import (
    Family, Literal, Malformed, ParsedOutput, Tools, ToolCall, checked_call, load_json, only_blocks,
)
from rollart.envs.tool_calls.grammar import json_rule, quoted

BEGIN, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARGS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_ID = re.compile(r"\s*functions\.([^:\s]{1,256}):(\d{1,9})\s*")


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
            head, sep, raw = inner.partition(ARGS)
            ident = _ID.fullmatch(head)
            if not sep or ident is None:
                raise Malformed(f"tool call {len(calls)} is not functions.NAME:INDEX{ARGS}{{…}}")
            arguments = load_json(raw, f"tool call {len(calls)}'s arguments")
            calls.append(checked_call(ident.group(1), arguments, tools, len(calls), head.strip()))
        if not calls:
            raise Malformed("the tool-call section holds no call")
    except Malformed as why:
        return ParsedOutput(text, malformed=str(why))
    return ParsedOutput(text[:start].strip(), tuple(calls))


def call_grammar(name: str, parameters: Mapping[str, Any], lit: Literal) -> str:
    return (f'{lit(CALL_BEGIN)} {quoted(f"functions.{name}:")} /[0-9]{{1,3}}/ {lit(ARGS)} {json_rule(parameters)} '
            f'{lit(CALL_END)}')


FAMILY = Family("kimi_k2", parse, (BEGIN, ARGS), call_grammar, between="", keep_special_tokens=True,
                wrap=lambda calls, lit: f"{lit(BEGIN)} {calls} {lit(END)}")
