"""OpenAI chat messages and tools → the messages a Hugging Face chat template renders, checked field by field.

In: the `messages` and `tools` of a chat-completions request, as JSON (adversarial: anything may be there).
Out: `TemplateMessage`s — `{"role", "content": str}` plus, for an assistant, `tool_calls` with decoded
`arguments` objects (what HF templates expect) and, for a tool result, `tool_call_id` and the called
function's `name` — and the tools as the template's list of JSON schemas. `message_key` gives the part of
a message that decides its tokens, to recognise an agent sending back what the gateway returned.

Accepted: roles system, developer (rendered as system), user, assistant, tool; content as a string, null
(assistant) or a list of `{"type": "text", "text": ...}` parts; OpenAI's read-only fields (`refusal`,
`audio`, `function_call`, `annotations`) only when empty, as the `openai` client sends back a message it
received. Anything else is a 400 naming the field (`messages[3].content[0].type`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from rollart.base.untrusted import loads_json
from rollart.envs.agents.errors import bad_request, unsupported

TemplateMessage = dict[str, Any]

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_KNOWN = {"role", "content", "name", "tool_calls", "tool_call_id"}
_EMPTY_ONLY = {"refusal", "audio", "function_call", "annotations", "reasoning_content"}


def _text(content: Any, where: str, allow_null: bool) -> str:
    if content is None:
        if allow_null:
            return ""
        raise bad_request(f"{where}: content is required for this role", where)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise unsupported(f"{where}[{j}].type", kind, "only text parts: {'type': 'text', 'text': ...}")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"{where}: expected a string or a list of text parts, got {type(content).__name__}", where)


def arguments_object(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, Mapping):
        return dict(raw)
    if not isinstance(raw, str):
        raise bad_request(f"{where}: expected a JSON object as a string", where)
    try:
        value = loads_json(raw)
    except ValueError as exc:  # not JSON, or nested past loads_json's depth
        raise bad_request(f"{where}: not valid JSON ({str(exc)[:120]})", where) from None
    if not isinstance(value, dict):
        raise bad_request(f"{where}: must encode a JSON object", where)
    return value


def _tool_calls(raw: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise bad_request(f"{where}: expected a list", where)
    calls = []
    for j, call in enumerate(raw):
        at = f"{where}[{j}]"
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{at}.function: expected {{'name': str, 'arguments': str}}", f"{at}.function")
        if call.get("type", "function") != "function":
            raise unsupported(f"{at}.type", call.get("type"), "only 'function'")
        calls.append({
            "id": str(call.get("id") or ""),
            "type": "function",
            "function": {"name": fn["name"], "arguments": arguments_object(fn.get("arguments", "{}"), f"{at}.function.arguments")},
        })
    return calls


def template_messages(raw: Any, max_messages: int) -> list[TemplateMessage]:
    """The request's `messages`, validated and converted for the chat template (see module docstring)."""
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages: expected a non-empty list of messages", "messages")
    if len(raw) > max_messages:
        raise bad_request(f"messages: {len(raw)} messages, more than this gateway accepts ({max_messages})",
                          "messages", code="too_many_messages")
    out: list[TemplateMessage] = []
    call_names: dict[str, str] = {}
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise bad_request(f"{where}: expected an object", where)
        role = _ROLES.get(message.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise bad_request(f"{where}.role: {message.get('role')!r} is not one of {sorted(_ROLES)}", f"{where}.role")
        for key, value in message.items():
            if key in _EMPTY_ONLY:
                if value not in (None, [], "", {}):
                    raise unsupported(f"{where}.{key}", value, "only empty values")
            elif key not in _KNOWN:
                raise unsupported(f"{where}.{key}", value, f"message fields: {', '.join(sorted(_KNOWN))}")
        converted: TemplateMessage = {"role": role, "content": _text(message.get("content"), f"{where}.content",
                                                                     allow_null=role == "assistant")}
        if message.get("tool_calls"):
            if role != "assistant":
                raise bad_request(f"{where}.tool_calls: only assistant messages have tool calls", f"{where}.tool_calls")
            converted["tool_calls"] = _tool_calls(message["tool_calls"], f"{where}.tool_calls")
            for call in converted["tool_calls"]:
                call_names[call["id"]] = call["function"]["name"]
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{where}.tool_call_id: a tool message needs the id of the call it answers",
                                  f"{where}.tool_call_id")
            converted["tool_call_id"] = call_id
            converted["name"] = call_names.get(call_id, str(message.get("name") or ""))
        elif isinstance(message.get("name"), str):
            converted["name"] = message["name"]
        out.append(converted)
    return out


def template_tools(raw: Any, max_tools: int) -> list[dict[str, Any]]:
    """The request's `tools` (function tools only), as the JSON schemas the template renders."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise bad_request("tools: expected a list of tools", "tools")
    if len(raw) > max_tools:
        raise bad_request(f"tools: {len(raw)} tools, more than this gateway accepts ({max_tools})", "tools")
    tools = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            raise unsupported(f"{where}.type", tool.get("type") if isinstance(tool, Mapping) else tool,
                              "only function tools")
        fn = tool.get("function")
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"{where}.function: expected an object with a non-empty 'name'", f"{where}.function")
        tools.append({"type": "function", "function": dict(fn)})
    return tools


def message_key(message: TemplateMessage) -> tuple[Any, ...]:
    """What decides a message's tokens: role, content, and each tool call's name and arguments (call ids
    and names of tool results are not compared: the hermes family does not render them)."""
    calls = tuple(
        (c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
        for c in message.get("tool_calls") or ()
    )
    return (message["role"], message["content"], calls, message.get("tool_call_id", ""))


def tools_key(tools: Sequence[Mapping[str, Any]]) -> str:
    return json.dumps(list(tools), sort_keys=True)


def observation_text(messages: Sequence[TemplateMessage]) -> str:
    """The turn's observation: the content of the messages that are new in this call."""
    return "\n".join(m["content"] for m in messages if m["content"])
