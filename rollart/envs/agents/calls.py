"""One model call on a trajectory's session, whatever protocol asked for it: plan → generate → parse → record.

In: a session's `Entry` (the session and what the gateway keeps beside it), and a `ChatCall` (chat-like
protocols: chat completions, Responses, Messages) or a completion prompt with its `Asked` knobs.
Out: a `CallOutput` the protocol's codec renders; the call recorded as a `Turn` of the session.

Guarantees: a session's calls run one at a time, in arrival order (`Entry.lock`); rendering and tokenising
run on the gateway's thread pool, off its serving loop; every wait is bounded (`generate_timeout_s`); a
generation that fails or times out ends the trajectory FAILED (502/504), a call that ends while the
trajectory is cancelled or finished is a 410, and its partial tokens are kept only while the session is
not finished. Tool calls are parsed with the model family's parser (`rollart/envs/tool_calls`); a request
with tools on a model whose template renders none is refused by name.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal
from urllib.parse import quote

from rollart.config import GatewayConfig
from rollart.envs.agents.call import Asked, CallOutput, ChatCall
from rollart.envs.agents.constraints import check_grammar, grammar_for, literal_for
from rollart.envs.agents.errors import GatewayError, unsupported
from rollart.envs.agents.requests import sampling_for
from rollart.envs.agents.session import AgentSession, CallPlan, Choice
from rollart.envs.chat import ChatTokens
from rollart.envs.tool_calls import FAMILIES, ParsedOutput, Parser, parser_for
from rollart.types import GenerationRequest, GenerationResult, LLMClient, SamplingParams, Span, TurnBarrier

log = logging.getLogger(__name__)


@dataclass
class Entry:
    """A session and what the gateway needs to serve it."""

    session: AgentSession
    domain: str
    sampling: SamplingParams
    sampling_source: Literal["run", "request"]
    seed_for: Callable[[int], int]
    turn_barrier: TurnBarrier | None
    state: Literal["open", "cancelled", "finished"] = "open"
    failure: str = ""  # a generation that failed: the trajectory ends FAILED with this reason
    pending: int = 0  # calls in flight or queued
    last_call_end: float = field(default_factory=time.time)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # serialises calls (used on the gateway loop)
    # Responses API: this trajectory's stored responses, id → the conversation through that response's output
    responses: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)


def check_open(entry: Entry) -> None:
    if entry.state != "open":
        raise GatewayError(410, f"trajectory {entry.session.trajectory_id!r} is {entry.state}; it takes no more calls",
                           code=f"trajectory_{entry.state}")


class CallRunner:
    """Runs the calls of every session of one gateway (see the module docstring)."""

    def __init__(self, llm: LLMClient, chat: ChatTokens, cfg: GatewayConfig, family: str | None,
                 tokenize: Executor, worker: str, generate_timeout_s: float, state_lock: Any) -> None:
        self.llm, self.chat, self.cfg, self.family = llm, chat, cfg, family
        self.parse: Parser | None = parser_for(family) if family else None
        # a family whose markers are special tokens is parsed from text that keeps them (the end-of-turn
        # token is never part of it)
        self.keep_special = bool(family) and FAMILIES[family].keep_special_tokens
        self.literal = literal_for(chat.tokenizer)
        self._said_no_switch = False  # reasoning effort on a template without a thinking switch: logged once
        self.tokenize, self.worker, self.generate_timeout_s = tokenize, worker, generate_timeout_s
        self._state_lock = state_lock  # the gateway's lock over entries' states

    async def chat_call(self, entry: Entry, call: ChatCall) -> list[CallOutput]:
        """A chat-like call: its messages and tools rendered by the template, tool calls parsed."""
        messages, tools = call.messages, call.tools
        entry.session.check_length([messages, tools], "messages")
        if tools and self.parse is None:
            raise unsupported("tools", f"{len(tools)} tools", "this model's chat template renders no tool calls "
                              "(envs.gateway.tool_parser)")
        grammar = grammar_for(call, self.family, self.literal)
        if grammar is not None:
            check_grammar(grammar, "response_format" if call.tool_choice.mode in ("auto", "none") else "tool_choice")
        parse = bool(tools) and call.tool_choice.mode != "none"
        names = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}

        def output(text: str, k: int) -> tuple[ParsedOutput, dict[str, Any]]:
            if parse and self.parse is not None:
                parsed = self.parse(text, names, f"call_{k}")
                if not call.parallel_tool_calls and len(parsed.tool_calls) > 1:
                    parsed = ParsedOutput(text, malformed="several tool calls with parallel_tool_calls=false")
            else:
                parsed = ParsedOutput(text)
            return parsed, returned_message(parsed)

        thinking = call.thinking if self.chat.has_thinking_switch else None
        if call.thinking is not None and thinking is None and not self._said_no_switch:
            self._said_no_switch = True
            log.info("agent gateway: a request set reasoning effort (thinking=%s); this model's chat template has no "
                     "thinking switch, so it is accepted and has no effect", call.thinking)
        return await self._call(entry, lambda s: s.plan_chat(messages, tools, thinking), call.asked, output,
                                "chatcmpl", grammar, call.n, call.top_logprobs)

    async def completion_call(self, entry: Entry, prompt: Any, asked: Asked) -> CallOutput:
        entry.session.check_length(prompt, "prompt")

        def output(text: str, k: int) -> tuple[ParsedOutput, None]:
            return ParsedOutput(text), None

        return (await self._call(entry, lambda s: s.plan_completion(prompt), asked, output, "cmpl"))[0]

    async def _call(
        self,
        entry: Entry,
        plan_of: Callable[[AgentSession], CallPlan],
        asked: Asked,
        output: Callable[[str, int], tuple[ParsedOutput, dict[str, Any] | None]],
        id_prefix: str,
        grammar: str | None = None,
        n: int = 1,
        top_logprobs: int = 0,
    ) -> list[CallOutput]:
        """One call, serialised with the trajectory's others: plan (rendered and tokenised off the serving
        loop) → generate its n choices (concurrently, seeds apart) → record (n > 1: pending until the agent's
        next call shows which choice it continued, see `AgentSession.record_choices`)."""
        trajectory_id = entry.session.trajectory_id
        async with entry.lock:
            check_open(entry)
            session = entry.session
            plan = await asyncio.get_running_loop().run_in_executor(self.tokenize, plan_of, session)
            k = len(session.turns)
            sampling = sampling_for(asked, entry.sampling, source=entry.sampling_source, seed=entry.seed_for(k),
                                    budget=session.budget(plan))
            sampling = replace(sampling, grammar=grammar, top_logprobs=top_logprobs)
            agent_span = Span("agent.step", entry.last_call_end, time.time(), self.worker)
            if entry.turn_barrier is not None:
                await asyncio.wait_for(entry.turn_barrier.before_turn(trajectory_id, k), self.generate_timeout_s)
            requests = [GenerationRequest(
                request_id=f"{trajectory_id}/{k}" + (f".{c}" if c else ""), trajectory_id=trajectory_id,
                domain=entry.domain, prompt_token_ids=plan.context,
                sampling=replace(sampling, seed=None if sampling.seed is None else (sampling.seed + c) % 2**63))
                for c in range(n)]
            generated = await asyncio.gather(*(self._generate(entry, r) for r in requests))
            choices, outputs = [], []
            for c, (result, _) in enumerate(generated):
                text = self._text(result.token_ids, sampling.stop_token_ids)
                ends_with_stop = bool(result.token_ids) and result.token_ids[-1] in sampling.stop_token_ids
                shown, stop_sequence = text, None
                if result.finish_reason == "stop" and not ends_with_stop and sampling.stop_strings:
                    shown, stop_sequence = cut_at_stop(text, sampling.stop_strings)
                parsed, returned = output(shown, k)
                choices.append(Choice(result, text, returned, parsed.malformed))
                outputs.append(CallOutput(
                    f"{id_prefix}-{quote(trajectory_id, safe='')}-{k}", self.cfg.model_name, parsed,
                    tuple(result.token_ids), tuple(result.logprobs), result.finish_reason, len(plan.context),
                    stop_sequence, ends_with_stop, result.top_logprobs, c))
            wait_span = max((span for _, span in generated), key=lambda span: span.duration)
            with self._state_lock:
                if entry.state == "finished":  # the trajectory ended while this call generated
                    raise GatewayError(410, f"trajectory {trajectory_id!r} is finished; it takes no more calls",
                                       code="trajectory_finished")
                spans = (agent_span, wait_span, *generated[0][0].spans)
                if n == 1:
                    session.record(plan, choices[0].result, action=choices[0].action, returned=choices[0].returned,
                                   malformed=choices[0].malformed, spans=spans)
                else:
                    session.record_choices(plan, choices, spans)
                session.counters["generate_time_s"] += wait_span.duration
            entry.last_call_end = time.time()
            if any(r.finish_reason == "abort" for r, _ in generated) or entry.state != "open":
                raise GatewayError(410, f"trajectory {trajectory_id!r} was cancelled", code="trajectory_cancelled")
            return outputs

    def _text(self, ids: tuple[int, ...], stop_ids: tuple[int, ...]) -> str:
        if not self.keep_special:
            return self.chat.response_text(ids)
        shown = ids[:-1] if ids and ids[-1] in stop_ids else ids
        return self.chat.tokenizer.decode(list(shown), skip_special_tokens=False)

    async def _generate(self, entry: Entry, request: GenerationRequest) -> tuple[GenerationResult, Span]:
        start = time.time()
        try:
            result = await asyncio.wait_for(self.llm.generate(request), self.generate_timeout_s)
        except TimeoutError:
            entry.failure = f"generation timed out after {self.generate_timeout_s:g}s"
            raise GatewayError(504, entry.failure, code="generation_timeout", kind="server_error") from None
        except Exception as exc:
            entry.failure = f"generation failed: {type(exc).__name__}: {exc}"
            raise GatewayError(502, entry.failure, code="generation_failed", kind="server_error") from None
        return result, Span("generate.wait", start, time.time(), self.worker)


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """OpenAI's stop: the content ends before the first stop string (the recorded ids keep it)."""
    found = [(text.find(s), s) for s in stops if s in text]
    if not found:
        return text, None
    index, stop = min(found)
    return text[:index], stop


def returned_message(parsed: ParsedOutput) -> dict[str, Any]:
    """The assistant message as the template sees it when the agent sends it back."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in parsed.tool_calls
        ]
    return message
