"""What every tool-call family shares: the parsed records, the family record, and the checks a call passes.

In: a family module's pieces. Out: `ToolCall` (one call, OpenAI's shape via `to_openai`), `ParsedOutput` (the
plain text and the calls, or the whole text with `malformed` saying why), `Family` (how one model family
writes calls: its parser, the template markers that name it, one call as a grammar, the text between calls,
and whether its markers are special tokens that decoding must keep), and helpers that never raise on model
text: `load_json` (deep nesting and invalid text are a reason, not an exception) and `checked_call`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterator, Mapping

from rollart.base.untrusted import loads_json

Tools = Mapping[str, Mapping[str, Any]] | Collection[str]  # offered tools: name → parameters schema, or names
Literal = Callable[[str], str]  # text → a Lark literal (constraints.py: a quoted string or `<[id]>`)


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


Parser = Callable[[str, Tools, str], ParsedOutput]
CallGrammar = Callable[[str, Mapping[str, Any], Literal], str]


@dataclass(frozen=True)
class Family:
    name: str
    parse: Parser
    markers: tuple[str, ...]  # a chat template that holds all of these writes this family's calls
    call_grammar: CallGrammar  # one call of a tool (name, parameters schema) as a Lark expression
    between: str = "\n"  # the text between two calls
    keep_special_tokens: bool = False  # its markers are special tokens: decode the output with them kept
    wrap: Callable[[str, Literal], str] = lambda calls, lit: calls  # what stands around all the calls


class Malformed(ValueError):
    """A call that does not parse; its message is the reason the output is plain content."""


def blocks(text: str, open_: str, close: str, start: int = 0) -> Iterator[tuple[int, int, str]]:
    """(start, end, inner) of each `open_ … close` block from `start`, in order, with str.find: linear in the
    text (a lazy regex over many unclosed markers is quadratic). Malformed when a block is never closed."""
    pos = start
    while True:
        begin = text.find(open_, pos)
        if begin < 0:
            return
        end = text.find(close, begin + len(open_))
        if end < 0:
            raise Malformed(f"'{open_}' is never closed")
        yield begin, end + len(close), text[begin + len(open_) : end]
        pos = end + len(close)


def only_blocks(text: str, open_: str, close: str, what: str) -> list[str]:
    """The inner texts of `text`, which must hold nothing but such blocks (and whitespace)."""
    inners, pos = [], 0
    for begin, end, inner in blocks(text, open_, close):
        if text[pos:begin].strip():
            raise Malformed(f"text between {what}")
        inners.append(inner)
        pos = end
    if text[pos:].strip():
        raise Malformed(f"text after the last of the {what}")
    return inners


def load_json(text: str, what: str) -> Any:
    """The JSON value of model text, or Malformed (never RecursionError; nested past `MAX_JSON_DEPTH` refused:
    rollart/base/untrusted.py)."""
    try:
        return loads_json(text)
    except ValueError as exc:
        raise Malformed(f"{what} is not valid JSON ({str(exc)[:80]})") from None


def checked_call(name: Any, arguments: Any, tools: Tools, index: int, call_id: str) -> ToolCall:  # noqa: D401
    """The call, if `name` is an offered tool and `arguments` a JSON object; else Malformed naming why."""
    if not isinstance(name, str):
        raise Malformed(f"tool call {index} has no function name")
    if name not in tools:
        offered = ", ".join(sorted(tools)) or "none"
        raise Malformed(f"tool call {index} names {name[:60]!r}; offered: {offered[:200]}")
    if not isinstance(arguments, dict):
        raise Malformed(f"tool call {index}: its arguments are not a JSON object")
    return ToolCall(call_id, name, arguments)


def typed_value(raw: str, schema: Any) -> Any:
    """An XML-style argument's text as the type its parameter's schema names (strings stay as written; other
    values are JSON, or Python's spelling of booleans and None as some templates render them)."""
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    if kind == "string":
        return raw
    text = raw.strip()
    if kind == "boolean" and text in ("True", "False"):
        return text == "True"
    if text == "None":
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        if kind in (None, "string") or isinstance(kind, list):
            return raw
        raise Malformed(f"argument {text[:40]!r} is not a {kind}") from None


def parameters_of(tools: Tools, name: str) -> Mapping[str, Any]:
    """The properties of a tool's parameters schema ({} when only names were given)."""
    if isinstance(tools, Mapping):
        schema = tools.get(name) or {}
        props = schema.get("properties") if isinstance(schema, Mapping) else None
        return props if isinstance(props, Mapping) else {}
    return {}
