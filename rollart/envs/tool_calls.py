"""Tool calls in model output: one parser per chat-template family, and which family a template is.

In: the text a model generated (special tokens dropped), the names of the tools the request offered and
an id prefix. Out: `ParsedOutput` — the assistant's plain text and its tool calls in OpenAI's shape
(`{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}`), or, when the model
wrote something that looks like a tool call but does not parse, the whole text as plain content with
`malformed` saying what was wrong (the gateway counts it in a metric; the agent never gets a 500).

Families (the format the template teaches the model, hence the format its output is parsed in):
- `hermes` — Qwen2.5/Qwen3, NousResearch Hermes and rollart's tiny model: each call is
  `<tool_call>\\n{"name": "<tool>", "arguments": {...}}\\n</tool_call>`; text before the first call is the
  message content; only whitespace may stand between and after calls.

`detect_family(chat_template)` names the family a template writes (None: the template renders no tool
calls, so a request with `tools` is refused).

Guarantees: a call is accepted only if its name is one of the offered tools and its arguments are a JSON
object nested at most `MAX_JSON_DEPTH` deep (rollart/base/untrusted.py); ids are unique within a trajectory
(`call_<turn>_<index>`); parsing never raises, whatever the text (nested, huge, invalid), and takes time
linear in its length. Every parser registered in `PARSERS` is held to this by the property tests of
tests/unit/test_parsers_adversarial.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Collection

from rollart.base.untrusted import loads_json

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: `arguments` is the decoded JSON object (sent to the agent as a JSON string)."""

    id: str
    name: str
    arguments: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    malformed: str = ""  # why a tool call in the text was refused ('' when none was)


def parse_hermes(text: str, tool_names: Collection[str], id_prefix: str) -> ParsedOutput:
    """`<tool_call>` JSON blocks (see the module docstring); anything off → plain content + reason. One pass
    over the text with `str.find` (a lazy regex rescans the rest of the text from every unclosed opening:
    quadratic in what a policy writes)."""
    start = text.find(_OPEN)
    if start < 0:
        if _CLOSE in text:
            return ParsedOutput(text, malformed=f"'{_CLOSE}' without a '{_OPEN}' before it")
        return ParsedOutput(text)
    calls: list[ToolCall] = []
    pos = start
    while (opened := text.find(_OPEN, pos)) >= 0:
        closed = text.find(_CLOSE, opened + len(_OPEN))
        if closed < 0:
            break  # never closed: said below
        if text[pos:opened].strip():
            return ParsedOutput(text, malformed="text between tool calls")
        try:
            body = loads_json(text[opened + len(_OPEN) : closed])
        except ValueError as exc:
            return ParsedOutput(text, malformed=f"tool call {len(calls)} is not valid JSON ({str(exc)[:120]})")
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            return ParsedOutput(text, malformed=f"tool call {len(calls)} is not a JSON object with a 'name'")
        if body["name"] not in tool_names:
            offered = ", ".join(sorted(tool_names)) or "none"
            return ParsedOutput(text, malformed=f"tool call {len(calls)} names {body['name']!r:.60}; offered: {offered}")
        arguments = body.get("arguments", {})
        if not isinstance(arguments, dict):
            return ParsedOutput(text, malformed=f"tool call {len(calls)}: 'arguments' is not a JSON object")
        if set(body) - {"name", "arguments"}:
            return ParsedOutput(text, malformed=f"tool call {len(calls)} has keys besides 'name' and 'arguments'")
        calls.append(ToolCall(f"{id_prefix}_{len(calls)}", body["name"], arguments))
        pos = closed + len(_CLOSE)
    if not calls:
        return ParsedOutput(text, malformed=f"'{_OPEN}' is never closed")
    if text[pos:].strip():
        rest = text[pos:]
        reason = f"'{_OPEN}' is never closed" if _OPEN in rest else "text after the last tool call"
        return ParsedOutput(text, malformed=reason)
    return ParsedOutput(text[:start].strip(), tuple(calls))


Parser = Callable[[str, Collection[str], str], ParsedOutput]

PARSERS: dict[str, Parser] = {"hermes": parse_hermes}


def detect_family(chat_template: str | None) -> str | None:
    """The tool-call family a chat template writes, or None when it renders no tool calls."""
    if chat_template and _OPEN in chat_template:
        return "hermes"
    return None


def parser_for(family: str) -> Parser:
    if family not in PARSERS:
        raise ValueError(f"unknown tool-call family {family!r}; known: {', '.join(sorted(PARSERS))}")
    return PARSERS[family]
