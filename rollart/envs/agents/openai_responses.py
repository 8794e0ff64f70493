"""The OpenAI Responses API (`POST .../v1/responses`) as a codec onto the gateway's chat-like call.

In: the request body — `input` (a string or a list of items), `instructions`, function `tools`,
`tool_choice`, `previous_response_id`, `store`, sampling knobs — and the trajectory's stored responses.
Out: a `ChatCall` (the conversation as template messages: instructions as the system message, message items
by role, each `function_call` item a tool call of the assistant message it follows, each
`function_call_output` a tool message); then the `response` object for a `CallOutput` (a `message` item with
`output_text`, a `function_call` item per tool call), or its stream of server-sent events
(`response.created` … `response.completed`), and the conversation to store under the response's id.

Accepted as OpenAI defines them: `store` (default true; a stored response can be continued with
`previous_response_id` within its trajectory — the gateway keeps a trajectory's responses until it ends),
`reasoning` items in the input (accepted, not rendered: the gateway returns none, so they come from elsewhere),
`reasoning.effort` / `text.verbosity` (see requests.py), `metadata`, `user`, `truncation: "disabled"`,
`include: []`, `background: false`, `parallel_tool_calls`, `max_output_tokens`, `temperature`, `top_p`,
`text.format` (json_object / json_schema: constrained decoding, constraints.py); ignored as metadata:
`service_tier`, `prompt_cache_key`, `safety_identifier`.
`instructions` apply to their own request only (OpenAI does not carry them over `previous_response_id`).
Refused by name: images, files, built-in tools (web search, file search, computer use …), `conversation`,
`prompt` templates, `item_reference` items, `truncation: "auto"`, `background: true`, `top_logprobs`,
`max_tool_calls`.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterator, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from rollart.envs.agents.call import Asked, CallOutput, ChatCall, TemplateMessage, ToolChoice
from rollart.envs.agents.constraints import output_schema
from rollart.envs.agents.errors import GatewayError, bad_request, unsupported
from rollart.envs.agents.messages import arguments_object
from rollart.envs.agents.requests import THINKING, parse_request


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)

    model: str = Field(max_length=256)
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    max_tool_calls: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    store: bool | None = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    truncation: str | None = None
    include: list[str] | None = None
    background: bool | None = None


def parse_responses_request(body: Any) -> ResponsesRequest:
    req = parse_request(ResponsesRequest, body)
    assert isinstance(req, ResponsesRequest)
    if req.truncation not in (None, "disabled"):
        raise unsupported("truncation", req.truncation, "only 'disabled': a prompt that does not fit is refused")
    if req.background:
        raise unsupported("background", req.background, "only false")
    if req.top_logprobs:
        raise unsupported("top_logprobs", req.top_logprobs, "0 (chat completions report top logprobs)")
    if req.max_tool_calls is not None:
        raise unsupported("max_tool_calls", req.max_tool_calls, "null (limit calls in the agent, or with max_turns)")
    if req.text and set(req.text) - {"format", "verbosity"}:
        raise unsupported("text", req.text, "format and verbosity")
    if req.include:
        raise unsupported("include", req.include, "only an empty list")
    if req.stream_options and set(req.stream_options) - {"include_obfuscation"}:
        raise unsupported("stream_options", req.stream_options, "only include_obfuscation")
    return req


def _text_parts(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}: expected a string or a list of content parts", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise unsupported(f"{where}[{j}].type", kind, "only text parts (input_text, output_text)")
        texts.append(part["text"])
    return "".join(texts)


def _tool_output(output: Any, where: str) -> str:
    if isinstance(output, str):
        return output
    return _text_parts(output, where)


def input_messages(raw: str | list[Any], max_messages: int) -> list[TemplateMessage]:
    """The request's `input` items as template messages (see the module docstring)."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if len(raw) > max_messages:
        raise bad_request(f"input: {len(raw)} items, more than this gateway accepts ({max_messages})", "input",
                          code="too_many_messages")
    out: list[TemplateMessage] = []
    call_names: dict[str, str] = {}
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise bad_request(f"{where}: expected an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = {"developer": "system"}.get(item.get("role"), item.get("role"))
            if role not in ("system", "user", "assistant"):
                raise bad_request(f"{where}.role: {item.get('role')!r} is not one of system, developer, user, "
                                  "assistant", f"{where}.role")
            out.append({"role": role, "content": _text_parts(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise bad_request(f"{where}: a function_call needs 'name' and 'call_id' strings", where)
            call = {"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments_object(item.get("arguments", "{}"),
                                                                             f"{where}.arguments")}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # the calls of one assistant turn
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            call_names[call_id] = name
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{where}.call_id: the id of the function_call it answers", f"{where}.call_id")
            out.append({"role": "tool", "content": _tool_output(item.get("output"), f"{where}.output"),
                        "tool_call_id": call_id, "name": call_names.get(call_id, "")})
        elif kind == "reasoning":
            continue  # accepted, not rendered (module docstring)
        else:
            raise unsupported(f"{where}.type", kind, "message, function_call, function_call_output, reasoning items")
    return out


def template_tools(raw: Any, max_tools: int) -> list[dict[str, Any]]:
    """Responses function tools (`{type, name, description, parameters, strict}`) as the template's."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > max_tools:
        raise bad_request(f"tools: expected a list of at most {max_tools} tools", "tools")
    tools = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
        if kind != "function":
            raise unsupported(f"{where}.type", kind, "only function tools")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise bad_request(f"{where}.name: a non-empty string", f"{where}.name")
        fn = {"name": tool["name"], "description": tool.get("description") or "",
              "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
        tools.append({"type": "function", "function": fn})
    return tools


def tool_choice(raw: Any, names: Sequence[str]) -> ToolChoice:
    if raw is None or raw in ("auto", "none", "required"):
        return ToolChoice(raw or "auto")  # type: ignore[arg-type]
    if isinstance(raw, Mapping) and raw.get("type") == "function" and raw.get("name") in names:
        return ToolChoice("named", raw["name"])
    raise unsupported("tool_choice", raw, f"'auto', 'none', 'required' or {{'type': 'function', 'name': NAME}} "
                      f"naming one of the tools ({', '.join(names) or 'none given'})")


def responses_call(req: ResponsesRequest, history: tuple[TemplateMessage, ...], cfg: Any) -> tuple[ChatCall, list[TemplateMessage]]:
    """(the call, the conversation without instructions — stored with the output under the response's id)."""
    conversation = list(history) + input_messages(req.input, cfg.max_messages)
    if len(conversation) > cfg.max_messages:
        raise bad_request(f"input: the conversation holds {len(conversation)} messages, more than this gateway "
                          f"accepts ({cfg.max_messages})", "input", code="too_many_messages")
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + conversation
    if not messages:
        raise bad_request("input: nothing to respond to", "input")
    tools = template_tools(req.tools, cfg.max_tools)
    names = [t["function"]["name"] for t in tools]
    asked = Asked(req.temperature, req.top_p, None, None, req.max_output_tokens, ())
    schema = output_schema((req.text or {}).get("format"), "text.format")
    effort = (req.reasoning or {}).get("effort")
    if effort is not None and effort not in THINKING:
        raise unsupported("reasoning.effort", effort, ", ".join(THINKING))
    call = ChatCall(messages, tools, tool_choice(req.tool_choice, names), req.parallel_tool_calls is not False, asked,
                    schema, THINKING.get(effort or ""))
    return call, conversation


def previous(responses: Mapping[str, tuple[TemplateMessage, ...]], response_id: str | None) -> tuple[TemplateMessage, ...]:
    if response_id is None:
        return ()
    if response_id not in responses:
        raise GatewayError(404, f"previous_response_id: no stored response {response_id!r} in this trajectory "
                           "(responses are kept within their trajectory when `store` is not false)",
                           code="previous_response_not_found", param="previous_response_id")
    return responses[response_id]


# --- the response -------------------------------------------------------------------------------------

def output_items(out: CallOutput, response_id: str, status: str = "completed") -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    calls = out.parsed.tool_calls
    if out.parsed.content or not calls:
        items.append({"type": "message", "id": f"msg_{response_id[5:]}", "status": status, "role": "assistant",
                      "content": [{"type": "output_text", "text": out.parsed.content, "annotations": [],
                                   "logprobs": []}]})
    for c in calls:
        items.append({"type": "function_call", "id": f"fc_{c.id}", "call_id": c.id, "name": c.name,
                      "arguments": json.dumps(c.arguments, ensure_ascii=False), "status": "completed"})
    return items


def response_body(out: CallOutput, req: ResponsesRequest, response_id: str, created: float) -> dict[str, Any]:
    incomplete = out.finish_reason == "length"
    n = len(out.token_ids)
    return {
        "id": response_id, "object": "response", "created_at": created, "completed_at": time.time(),
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None, "model": out.model, "instructions": req.instructions,
        "output": output_items(out, response_id, "incomplete" if incomplete else "completed"),
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
        "temperature": req.temperature, "top_p": req.top_p, "max_output_tokens": req.max_output_tokens,
        "previous_response_id": req.previous_response_id, "store": req.store is not False,
        "reasoning": req.reasoning, "text": req.text or {"format": {"type": "text"}}, "truncation": "disabled",
        "metadata": req.metadata or {}, "user": req.user, "background": False,
        "usage": {"input_tokens": out.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": n, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": out.prompt_tokens + n},
    }


def response_events(body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) of a streamed response: whole items, as the generation is complete when sent."""
    seq = iter(range(1 << 30))

    def event(kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
        return kind, {"type": kind, "sequence_number": next(seq), **data}

    started = {**body, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None,
               "completed_at": None}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(body["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress",
                                                                                "content": []})
            where = dict(item_id=item["id"], output_index=index, content_index=0)
            yield event("response.content_part.added", **where, part={**part, "text": ""})
            if part["text"]:
                yield event("response.output_text.delta", **where, delta=part["text"], logprobs=[])
            yield event("response.output_text.done", **where, text=part["text"], logprobs=[])
            yield event("response.content_part.done", **where, part=part)
        else:
            yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress",
                                                                                "arguments": ""})
            yield event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                        delta=item["arguments"])
            yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                        name=item["name"], arguments=item["arguments"])
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.incomplete" if body["status"] == "incomplete" else "response.completed", response=body)
