"""The Anthropic Messages API (`POST .../v1/messages`) as a codec onto the gateway's chat-like call.

In: the request body — `system` (a string or text blocks), `messages` whose content is a string or blocks
(`text`, `tool_use`, `tool_result`, `thinking`), custom `tools` (`name`, `description`, `input_schema`),
`tool_choice` (`auto`, `any`, `tool`, `none`), `stop_sequences`, `max_tokens` (required), sampling knobs.
Out: a `ChatCall` (system first; a user message's `tool_result` blocks become tool messages, its text a user
message; an assistant message's text its content and its `tool_use` blocks its tool calls); then the
`message` object for a `CallOutput` (`text` and `tool_use` blocks, `stop_reason` end_turn / max_tokens /
stop_sequence / tool_use) or its stream of events (`message_start` … `message_stop`); errors in
Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`.

Accepted: `anthropic-version` (any), `cache_control` on blocks and tools (no prompt cache to control: the
engine's prefix cache works on its own), `metadata`, `thinking` (`enabled` / `disabled`: the template's thinking switch where it has one, as
chat's `reasoning_effort`; the budget is not enforced), `thinking` / `redacted_thinking` blocks in earlier assistant messages (not rendered: the
gateway returns none, they come from elsewhere), `service_tier`, `tool_choice.disable_parallel_tool_use`.
Refused by name: images, documents, server tools (web search, code execution, …), `container`, `mcp_servers`.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from rollart.envs.agents.call import Asked, CallOutput, ChatCall, TemplateMessage, ToolChoice
from rollart.envs.agents.errors import GatewayError, bad_request, unsupported
from rollart.envs.agents.requests import MAX_STOP_CHARS, MAX_STOP_STRINGS, parse_request

# HTTP status → Anthropic's error type (https://docs.anthropic.com/en/api/errors)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 410: "invalid_request_error",
               413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 502: "api_error",
               503: "overloaded_error", 504: "timeout_error"}


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)

    model: str = Field(max_length=256)
    max_tokens: int = Field(ge=1)
    messages: list[Any]
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool | None = False
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    service_tier: str | None = None


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)

    model: str = Field(max_length=256)
    messages: list[Any]
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


def error_body(error: GatewayError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(error.status, "api_error"), "message": error.message}}


def _text(blocks: Any, where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise bad_request(f"{where}: expected a string or a list of text blocks", where)
    texts = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
        if kind != "text" or not isinstance(block.get("text"), str):
            raise unsupported(f"{where}[{j}].type", kind, "only text blocks here")
        texts.append(block["text"])
    return "".join(texts)


def template_messages(req: MessagesRequest | CountTokensRequest, max_messages: int) -> list[TemplateMessage]:
    if not req.messages:
        raise bad_request("messages: at least one message", "messages")
    if len(req.messages) > max_messages:
        raise bad_request(f"messages: {len(req.messages)} messages, more than this gateway accepts ({max_messages})",
                          "messages", code="too_many_messages")
    out: list[TemplateMessage] = []
    system = _text(req.system, "system") if req.system is not None else ""
    if system:
        out.append({"role": "system", "content": system})
    names: dict[str, str] = {}
    for i, message in enumerate(req.messages):
        where = f"messages.{i}"
        role = message.get("role") if isinstance(message, Mapping) else None
        if role not in ("user", "assistant"):
            raise bad_request(f"{where}.role: {role!r} is not one of user, assistant", f"{where}.role")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise bad_request(f"{where}.content: a string or a list of content blocks", f"{where}.content")
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        results = 0
        for j, block in enumerate(blocks):
            at = f"{where}.content.{j}"
            kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) \
                        or not isinstance(block.get("input"), Mapping):
                    raise bad_request(f"{at}: a tool_use block needs 'id', 'name' and an 'input' object", at)
                calls.append({"id": block["id"], "type": "function",
                              "function": {"name": block["name"], "arguments": dict(block["input"])}})
                names[block["id"]] = block["name"]
            elif kind == "tool_result" and role == "user":
                call_id = block.get("tool_use_id")
                if not isinstance(call_id, str):
                    raise bad_request(f"{at}.tool_use_id: the id of the tool_use it answers", f"{at}.tool_use_id")
                result = block.get("content", "")
                text = _text(result, f"{at}.content") if result is not None else ""
                if block.get("is_error"):
                    text = f"Error: {text}"
                out.append({"role": "tool", "content": text, "tool_call_id": call_id, "name": names.get(call_id, "")})
                results += 1
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                continue
            else:
                raise unsupported(f"{at}.type", kind, "text, tool_use (assistant), tool_result (user), thinking blocks")
        if role == "assistant":
            out.append({"role": "assistant", "content": "".join(texts), **({"tool_calls": calls} if calls else {})})
        elif texts or not results:
            out.append({"role": "user", "content": "".join(texts)})
    return out


def template_tools(raw: Any, max_tools: int) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > max_tools:
        raise bad_request(f"tools: expected a list of at most {max_tools} tools", "tools")
    tools = []
    for i, tool in enumerate(raw):
        where = f"tools.{i}"
        if not isinstance(tool, Mapping) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
            raise unsupported(f"{where}.type", kind, "only custom tools ({name, description, input_schema})")
        if not isinstance(tool.get("name"), str) or not tool["name"] or not isinstance(tool.get("input_schema"), Mapping):
            raise bad_request(f"{where}: a tool needs a non-empty 'name' and an 'input_schema' object", where)
        tools.append({"type": "function", "function": {"name": tool["name"], "description": tool.get("description") or "",
                                                       "parameters": dict(tool["input_schema"])}})
    return tools


def tool_choice(raw: Mapping[str, Any] | None, names: Sequence[str]) -> tuple[ToolChoice, bool]:
    """(the choice, whether parallel calls are allowed)."""
    if raw is None:
        return ToolChoice("auto"), True
    kind = raw.get("type")
    parallel = not raw.get("disable_parallel_tool_use", False)
    if kind in ("auto", "none"):
        return ToolChoice(kind), parallel
    if kind == "any":
        return ToolChoice("required"), parallel
    if kind == "tool" and raw.get("name") in names:
        return ToolChoice("named", raw["name"]), parallel
    raise unsupported("tool_choice", raw, f"type auto, any, none, or tool with a name among the tools "
                      f"({', '.join(names) or 'none given'})")


def messages_call(req: MessagesRequest, cfg: Any) -> ChatCall:
    stops = tuple(req.stop_sequences or ())
    if len(stops) > MAX_STOP_STRINGS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise bad_request(f"stop_sequences: at most {MAX_STOP_STRINGS} non-empty strings of up to {MAX_STOP_CHARS} "
                          "characters", "stop_sequences")
    tools = template_tools(req.tools, cfg.max_tools)
    choice, parallel = tool_choice(req.tool_choice, [t["function"]["name"] for t in tools])
    asked = Asked(req.temperature, req.top_p, req.top_k, None, req.max_tokens, stops)
    kind = (req.thinking or {}).get("type")
    if kind not in (None, "enabled", "disabled"):
        raise unsupported("thinking.type", kind, "enabled or disabled")
    thinking = None if kind is None else kind == "enabled"
    return ChatCall(template_messages(req, cfg.max_messages), tools, choice, parallel, asked, thinking=thinking)


def message_body(out: CallOutput, stop_sequence: str | None) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if out.parsed.content or not out.parsed.tool_calls:
        content.append({"type": "text", "text": out.parsed.content})
    for c in out.parsed.tool_calls:
        content.append({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments})
    if out.parsed.tool_calls:
        reason = "tool_use"
    elif out.finish_reason == "length":
        reason = "max_tokens"
    else:
        reason = "stop_sequence" if stop_sequence else "end_turn"
    return {"id": out.id, "type": "message", "role": "assistant", "model": out.model, "content": content,
            "stop_reason": reason, "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
            "usage": {"input_tokens": out.prompt_tokens, "output_tokens": len(out.token_ids),
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}


def message_events(body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) of a streamed message: whole blocks, as the generation is complete when sent."""
    start = {**body, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**body["usage"], "output_tokens": 0}}
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            yield "content_block_start", {"type": "content_block_start", "index": index,
                                          "content_block": {"type": "text", "text": ""}}
            if block["text"]:
                yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                              "delta": {"type": "text_delta", "text": block["text"]}}
        else:
            yield "content_block_start", {"type": "content_block_start", "index": index,
                                          "content_block": {**block, "input": {}}}
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": body["stop_reason"],
                                                              "stop_sequence": body["stop_sequence"]},
                            "usage": {"output_tokens": body["usage"]["output_tokens"]}}
    yield "message_stop", {"type": "message_stop"}
