"""OpenAI chat-completions and completions bodies and stream chunks for one generated call.

In: what the call produced — text or parsed tool calls, the engine's token ids and logprobs, its finish
reason, the prompt length. Out: the JSON object of a non-streaming answer, or the list of chunks of a
streaming one (`data: {...}` server-sent events, then `data: [DONE]`). The engine hands the gateway whole
generations, so a stream sends its chunks when the generation is complete: content, then each tool call,
then the finish reason (and usage, with `stream_options.include_usage`).
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Iterator, Sequence

from rollart.envs.agents.call import CallOutput


TokenText = Callable[[int], str]


def _entry(token_id: int, lp: float, token_text: TokenText) -> dict[str, Any]:
    text = token_text(token_id)
    return {"token": text, "logprob": lp, "bytes": list(text.encode())}


def _chat_logprobs(out: CallOutput, token_text: TokenText) -> dict[str, Any]:
    ids, lps = out.shown
    tops = out.top_logprobs or ((),) * len(ids)
    return {"content": [{**_entry(t, lp, token_text), "top_logprobs": [_entry(a, alp, token_text) for a, alp in top]}
                        for t, lp, top in zip(ids, lps, tops)]}


def _usage(outs: Sequence[CallOutput]) -> dict[str, int]:
    """One prompt, every choice's tokens (as OpenAI counts n > 1)."""
    prompt, completion = outs[0].prompt_tokens, sum(len(o.token_ids) for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_body(outs: Sequence[CallOutput], logprobs: bool, token_text: TokenText) -> dict[str, Any]:
    first = outs[0]
    return {
        "id": first.id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": first.model,
        "choices": [{
            "index": out.index,
            "message": out.message(),
            "finish_reason": out.openai_finish,
            "logprobs": _chat_logprobs(out, token_text) if logprobs else None,
        } for out in outs],
        "usage": _usage(outs),
    }


def chat_chunks(outs: Sequence[CallOutput], logprobs: bool, include_usage: bool,
                token_text: TokenText) -> Iterator[dict[str, Any]]:
    first = outs[0]

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None, **extra}
        return {"id": first.id, "object": "chat.completion.chunk", "created": int(time.time()), "model": first.model,
                "choices": [choice]}

    for out in outs:
        message = out.message()
        yield chunk(out.index, {"role": "assistant", "content": ""})
        if message["content"]:
            yield chunk(out.index, {"content": message["content"]},
                        **({"logprobs": _chat_logprobs(out, token_text)} if logprobs else {}))
        for i, call in enumerate(message.get("tool_calls", ())):
            yield chunk(out.index, {"tool_calls": [{"index": i, **call}]})
        yield chunk(out.index, {}, out.openai_finish)
    if include_usage:
        yield {"id": first.id, "object": "chat.completion.chunk", "created": int(time.time()), "model": first.model,
               "choices": [], "usage": _usage(outs)}


def _completion_logprobs(out: CallOutput, token_text: TokenText) -> dict[str, Any]:
    ids, logprobs = out.shown
    tokens = [token_text(t) for t in ids]
    offsets, pos = [], 0
    for text in tokens:
        offsets.append(pos)
        pos += len(text)
    return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": None, "text_offset": offsets}


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
