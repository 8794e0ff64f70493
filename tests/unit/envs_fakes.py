"""Fakes for the env plane's tests: an `LLMClient` that answers from a script, encoding each answer with
the real tokenizer (so its ids are the canonical encoding of its text, as a sampled response re-encodes),
plus the stop token; it can be slowed down, aborted, or made to fail."""

from __future__ import annotations

import asyncio
from typing import Callable, Sequence

from rollart.types import GenerationRequest, GenerationResult, Span


class ScriptedLLM:
    """`reply(request, turn_index) -> text` decides each answer; `stop=False` ends it on length instead."""

    def __init__(
        self,
        tokenizer,
        reply: Callable[[GenerationRequest, int], str] | Sequence[str],
        *,
        version: int = 0,
        delay_s: float = 0.0,
        stop: bool = True,
        fail_on_turn: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        if not callable(reply):
            script = list(reply)
            reply = lambda request, k: script[min(k, len(script) - 1)]  # noqa: E731
        self.reply = reply
        self.version = version
        self.delay_s = delay_s
        self.stop = stop
        self.fail_on_turn = fail_on_turn
        self.requests: list[GenerationRequest] = []
        self.aborted: list[str] = []
        self._abort_events: dict[str, asyncio.Event] = {}

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests.append(request)
        turn = int(request.request_id.rsplit("/", 1)[1].split(".")[0])  # "<trajectory>/<call>[.<choice>]"
        if self.fail_on_turn == turn:
            raise RuntimeError("inference worker died")
        start = asyncio.get_running_loop().time()
        event = self._abort_events.setdefault(request.trajectory_id, asyncio.Event())
        ids = list(self.tokenizer.encode(self.reply(request, turn), add_special_tokens=False))
        if self.stop:
            ids.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        ids = ids[: request.sampling.max_new_tokens]
        finish = "stop" if self.stop and len(ids) and ids[-1] in request.sampling.stop_token_ids else "length"
        for n in range(1, len(ids) + 1):  # a stop string ends the output with the token that completes it
            if any(s in self.tokenizer.decode(ids[:n]) for s in request.sampling.stop_strings):
                ids, finish = ids[:n], "stop"
                break
        if self.delay_s:
            try:
                await asyncio.wait_for(event.wait(), self.delay_s)
            except TimeoutError:
                pass
        if event.is_set():  # aborted: return what was "generated" so far
            ids, finish = ids[:1], "abort"
        n = len(ids)
        end = asyncio.get_running_loop().time()
        return GenerationResult(
            request_id=request.request_id,
            trajectory_id=request.trajectory_id,
            token_ids=tuple(ids),
            logprobs=tuple([-0.5] * n),
            versions=tuple([self.version] * n),
            finish_reason=finish,
            prompt_tokens=len(request.prompt_token_ids),
            worker="inference/fake/0",
            spans=(Span("engine", start, end, "inference/fake/0"),),
        )

    async def abort(self, trajectory_id: str) -> None:
        self.aborted.append(trajectory_id)
        self._abort_events.setdefault(trajectory_id, asyncio.Event()).set()


class RecordingTurnBarrier:
    """A TurnBarrier that lets everyone through and records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    async def join(self, trajectory_id: str, cohort: int) -> None:
        self.calls.append(("join", trajectory_id, cohort))

    async def before_turn(self, trajectory_id: str, turn_index: int) -> None:
        self.calls.append(("before_turn", trajectory_id, turn_index))

    async def leave(self, trajectory_id: str) -> None:
        self.calls.append(("leave", trajectory_id, -1))
