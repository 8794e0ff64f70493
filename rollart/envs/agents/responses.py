"""OpenAI response bodies and stream chunks for one generated call (chat.completion, text_completion).

In: what the call produced — text or parsed tool calls, the engine's token ids and logprobs, its finish
reason, the prompt length. Out: the JSON object of a non-streaming answer, or the list of chunks of a
streaming one (`data: {...}` server-sent events, then `data: [DONE]`). The engine hands the gateway whole
generations, so a stream sends its chunks when the generation is complete: content, then each tool call,
then the finish reason (and usage, with `stream_options.include_usage`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from rollart.envs.tool_calls import ParsedOutput


@dataclass(frozen=True)
class CallOutput:
    id: str
    model: str
    parsed: ParsedOutput
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str  # the engine's: stop | length
    prompt_tokens: int

    @property
    def openai_finish(self) -> str:
        if self.parsed.tool_calls:
            return "tool_calls"
        return "length" if self.finish_reason == "length" else "stop"

    def usage(self) -> dict[str, int]:
        n = len(self.token_ids)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n}

    def message(self) -> dict[str, Any]:
        """The assistant message as OpenAI returns it (content null when only tool calls were made)."""
        calls = [c.to_openai() for c in self.parsed.tool_calls]
        content = self.parsed.content if (self.parsed.content or not calls) else None
        return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}


TokenText = Callable[[int], str]


def _chat_logprobs(out: CallOutput, token_text: TokenText) -> dict[str, Any]:
    content = []
    for token_id, lp in zip(out.token_ids, out.logprobs):
        text = token_text(token_id)
        content.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []})
    return {"content": content}


def chat_body(out: CallOutput, logprobs: bool, token_text: TokenText) -> dict[str, Any]:
    return {
        "id": out.id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": out.model,
        "choices": [{
            "index": 0,
            "message": out.message(),
            "finish_reason": out.openai_finish,
            "logprobs": _chat_logprobs(out, token_text) if logprobs else None,
        }],
        "usage": out.usage(),
    }


def chat_chunks(out: CallOutput, logprobs: bool, include_usage: bool, token_text: TokenText) -> Iterator[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None, **extra}
        return {"id": out.id, "object": "chat.completion.chunk", "created": int(time.time()), "model": out.model,
                "choices": [choice]}

    message = out.message()
    yield chunk({"role": "assistant", "content": ""})
    if message["content"]:
        yield chunk({"content": message["content"]},
                    **({"logprobs": _chat_logprobs(out, token_text)} if logprobs else {}))
    for i, call in enumerate(message.get("tool_calls", ())):
        yield chunk({"tool_calls": [{"index": i, **call}]})
    yield chunk({}, out.openai_finish)
    if include_usage:
        yield {"id": out.id, "object": "chat.completion.chunk", "created": int(time.time()), "model": out.model,
               "choices": [], "usage": out.usage()}


def _completion_logprobs(out: CallOutput, token_text: TokenText) -> dict[str, Any]:
    tokens = [token_text(t) for t in out.token_ids]
    offsets, pos = [], 0
    for text in tokens:
        offsets.append(pos)
        pos += len(text)
    return {"tokens": tokens, "token_logprobs": list(out.logprobs), "top_logprobs": None, "text_offset": offsets}


def completion_body(out: CallOutput, logprobs: bool, token_text: TokenText) -> dict[str, Any]:
    return {
        "id": out.id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": out.model,
        "choices": [{
            "index": 0,
            "text": out.parsed.content,
            "finish_reason": "length" if out.finish_reason == "length" else "stop",
            "logprobs": _completion_logprobs(out, token_text) if logprobs else None,
        }],
        "usage": out.usage(),
    }


def completion_chunks(out: CallOutput, logprobs: bool, include_usage: bool, token_text: TokenText) -> Iterator[dict[str, Any]]:
    body = completion_body(out, logprobs, token_text)
    choice = body["choices"][0]
    finish = choice.pop("finish_reason")
    yield {**body, "choices": [{**choice, "finish_reason": None}], "usage": None}
    yield {**body, "choices": [{"index": 0, "text": "", "finish_reason": finish, "logprobs": None}], "usage": None}
    if include_usage:
        yield {**body, "choices": [], "usage": out.usage()}


def sse(chunks: Sequence[dict[str, Any]]) -> Iterator[bytes]:
    for c in chunks:
        yield f"data: {json.dumps(c, ensure_ascii=False)}\n\n".encode()
    yield b"data: [DONE]\n\n"
