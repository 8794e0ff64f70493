"""One agent trajectory's model calls: exact prompt ids (the prefix property), segments, and the turns made.

In: each call's request — chat messages and tools, or a completion prompt (text or token ids) — and the
`GenerationResult` the engine returned for it. Out: `CallPlan` (the ids the call adds to the context and
the whole context the engine sees) and, once generated, a `Turn` per call; `turns` is the trajectory.

How a call's prompt ids are made (token-in/token-out, never a re-tokenisation of what the model wrote):
- The context is the current segment's ids so far: every earlier call's prompt ids and the ids the engine
  sampled for it, exactly.
- Chat: the call extends the context when its messages begin with the previous call's messages followed
  by the assistant message the gateway returned (same role, content, tool calls; `message_key`), its tools
  are the same, and the template renders the longer conversation as a text extension of the shorter one.
  Then the new ids encode only what follows: the end of the assistant message the model did not write
  itself (e.g. the newline after `<|im_end|>`), the new messages and the generation prompt.
- Completion: a text prompt extends the context when it starts with the context's text (decoded with its
  special tokens), and the new ids encode the rest; a token-id prompt when it starts with the context ids.
- Otherwise the agent rewrote its history (dropped, edited or reordered messages, changed tools, or
  cut the model's stop token): the call starts a new segment whose prompt is the whole rendered request.
  Each segment is a sequence the model really saw; the trainer gets each segment's own tokens.

Limits (`SessionLimits`): at most `max_calls` calls (the domain's `max_turns`) and `max_total_tokens` in a
segment's context; a call past either is a 400 (`max_turns_exceeded`, `context_length_exceeded`) and the
trajectory is marked truncated. Before that, a request that cannot fit is refused by counting, never by
tokenising: `max_request_bytes` bounds the body (JSON writes a byte of text as at most 6, and no token
stands for more bytes than the vocabulary's widest), so a larger one is refused unread; `check_length`
bounds the parsed request's text (`ChatTokens.min_tokens`: O(characters)). A 4 MB message costs a length
count, not seconds of tokenising.

Not thread-safe by itself: the gateway runs one call of a session at a time (calls are serialised) on its
own event loop; `turns` is only appended to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from rollart.envs.agents.errors import GatewayError, bad_request, unsupported
from rollart.envs.agents.messages import TemplateMessage, message_key, observation_text, tools_key
from rollart.envs.chat import ChatTokens
from rollart.types import GenerationResult, Span, Turn


@dataclass(frozen=True)
class SessionLimits:
    max_calls: int
    max_total_tokens: int


@dataclass(frozen=True)
class CallPlan:
    prompt_ids: tuple[int, ...]  # what this call adds (the whole prompt when it starts a segment)
    context: tuple[int, ...]  # everything the engine sees: the segment's ids so far + prompt_ids
    segment: int
    branched: bool  # a new segment after the first: the agent rewrote its history
    observation: str
    messages: tuple[TemplateMessage, ...] | None = None  # chat calls: the request's messages
    tools_key: str = ""


@dataclass(frozen=True)
class Choice:
    """One of a call's n generations, with what the agent is shown of it."""

    result: GenerationResult
    action: str
    returned: TemplateMessage | None
    malformed: str


@dataclass
class AgentSession:
    trajectory_id: str
    key: str
    chat: ChatTokens
    limits: SessionLimits
    turns: list[Turn] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("calls", "segments_branched", "malformed_tool_calls", "generate_time_s", "choices_dropped"), 0.0))
    truncated: str = ""  # why a call was refused for a limit ('' while none was)
    _context: tuple[int, ...] = ()
    _segment: int = 0
    _last_response: tuple[int, ...] = ()
    _previous: tuple[TemplateMessage, ...] | None = None  # last call's messages + the returned assistant message
    _previous_tools: str = ""
    _pending: tuple[CallPlan, tuple[Choice, ...], tuple[Span, ...]] | None = None  # a call of n > 1 choices

    # --- planning --------------------------------------------------------------------------------------
    def plan_chat(self, messages: Sequence[TemplateMessage], tools: Sequence[Mapping[str, Any]],
                  thinking: bool | None = None) -> CallPlan:
        self._check_calls()
        self.resolve_choices(messages)
        key = tools_key(tools)
        prev = self._previous
        if prev is not None and key == self._previous_tools and len(messages) >= len(prev) and all(
            message_key(a) == message_key(b) for a, b in zip(messages, prev)
        ):
            before = self._render(messages[: len(prev)], False, tools, thinking)
            after = self._render(messages, True, tools, thinking)
            if after.startswith(before) and before.endswith(self.chat.message_close):
                text = self.chat.closing_after(self._last_response) + after[len(before) :]
                return self._plan(self.chat.encode(text), False, observation_text(messages[len(prev) :]),
                                  tuple(messages), key)
        ids = self.chat.encode(self._render(messages, True, tools, thinking))
        return self._plan(ids, True, observation_text(messages), tuple(messages), key)

    def plan_completion(self, prompt: Any) -> CallPlan:
        self._check_calls()
        self.resolve_choices()
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise unsupported("prompt", f"{len(prompt)} prompts", "one prompt per request")
            prompt = prompt[0]
        if isinstance(prompt, str):
            context_text = self.chat.tokenizer.decode(list(self._context)) if self._context else None
            if context_text is not None and prompt.startswith(context_text):
                rest = prompt[len(context_text) :]
                return self._plan(self.chat.encode(rest), False, rest)
            return self._plan(self.chat.encode(prompt), True, prompt)
        vocab = len(self.chat.tokenizer)
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt):
            raise bad_request(f"prompt: token ids must be integers in [0, {vocab})", "prompt")
        n = len(self._context)
        if n and tuple(prompt[:n]) == self._context:
            rest = list(prompt[n:])
            return self._plan(rest, False, self.chat.tokenizer.decode(rest))
        return self._plan(list(prompt), True, self.chat.tokenizer.decode(list(prompt)))

    def max_request_bytes(self, fields: int) -> int:
        """The largest request body whose text could still fit the context, for a request of at most `fields`
        messages and tools: each byte of text is at most 6 of JSON (`\\u0001`), each token at most the
        widest token's bytes (×2: see `ChatTokens.min_tokens`), plus 1 KiB of JSON structure per field and
        64 KiB for the other parameters (model, stop strings, metadata …)."""
        return 6 * 2 * self.chat.widest_token[1] * self.limits.max_total_tokens + 1024 * fields + 65536

    def too_long(self, what: str, param: str) -> GatewayError:
        """The 400 for a request that cannot fit the context (`what` says how it was counted); the trajectory
        is marked truncated, as for a prompt that was tokenised and found too long."""
        self.truncated = f"max_total_tokens ({self.limits.max_total_tokens}) reached"
        return GatewayError(400, f"{what}; this trajectory's context holds at most {self.limits.max_total_tokens - 1} "
                            "tokens before generating (domains.<name>.max_total_tokens)",
                            code="context_length_exceeded", param=param)

    def check_length(self, request: Any, param: str) -> None:
        """Refuse (400 context_length_exceeded) a request whose strings hold more tokens than a context may,
        counted without tokenising; a list of token ids is counted as it is."""
        if isinstance(request, list) and request and all(isinstance(t, int) for t in request[:1]):
            tokens = len(request)
        else:
            tokens = self.chat.min_tokens(_strings(request))
        if tokens >= self.limits.max_total_tokens:
            raise self.too_long(f"the request holds at least {tokens} tokens", param)

    def _render(self, messages: Sequence[TemplateMessage], generation_prompt: bool,
                tools: Sequence[Mapping[str, Any]], thinking: bool | None = None) -> str:
        try:
            return self.chat.render(messages, generation_prompt, tools, thinking)
        except Exception as exc:  # the template's own checks (role order, …) or a value it cannot render
            raise bad_request(f"messages: the model's chat template refused them ({type(exc).__name__}: "
                              f"{str(exc)[:200]})", "messages") from None

    def _check_calls(self) -> None:
        if len(self.turns) + (self._pending is not None) >= self.limits.max_calls:
            self.truncated = f"max_turns ({self.limits.max_calls}) reached"
            raise GatewayError(400, f"this trajectory may make at most {self.limits.max_calls} model calls "
                               "(domains.<name>.max_turns)", code="max_turns_exceeded")

    def _plan(self, ids: Sequence[int], new_segment: bool, observation: str,
              messages: tuple[TemplateMessage, ...] | None = None, key: str = "") -> CallPlan:
        first = not self.turns
        context = tuple(ids) if new_segment else self._context + tuple(ids)
        if not context:
            raise bad_request("prompt: empty (nothing to generate from)", "prompt")
        if len(context) >= self.limits.max_total_tokens:
            self.truncated = f"max_total_tokens ({self.limits.max_total_tokens}) reached"
            raise GatewayError(
                400, f"the prompt is {len(context)} tokens; this trajectory's context holds at most "
                f"{self.limits.max_total_tokens - 1} before generating (domains.<name>.max_total_tokens)",
                code="context_length_exceeded", param="messages" if messages is not None else "prompt",
            )
        segment = self._segment + (1 if new_segment and not first else 0)
        return CallPlan(tuple(ids), context, segment, new_segment and not first, observation, messages, key)

    def budget(self, plan: CallPlan) -> int:
        """Tokens the call may generate before the segment reaches `max_total_tokens`."""
        return self.limits.max_total_tokens - len(plan.context)

    # --- recording -------------------------------------------------------------------------------------
    def record(
        self,
        plan: CallPlan,
        result: GenerationResult,
        *,
        action: str,
        returned: TemplateMessage | None,
        malformed: str,
        spans: Sequence[Span],
    ) -> Turn:
        """The call's turn, appended; the context now ends with the sampled ids."""
        turn = Turn(
            prompt_token_ids=plan.prompt_ids,
            response_token_ids=tuple(result.token_ids),
            logprobs=tuple(result.logprobs),
            versions=tuple(result.versions),
            observation=plan.observation,
            action=action,
            finish_reason=result.finish_reason,
            format_ok=not malformed,
            spans=tuple(spans),
            segment=plan.segment,
        )
        self.turns.append(turn)
        self.counters["calls"] += 1
        self.counters["segments_branched"] += float(plan.branched)
        self.counters["malformed_tool_calls"] += float(bool(malformed))
        self._segment = plan.segment
        self._context = plan.context + turn.response_token_ids
        self._last_response = turn.response_token_ids
        if plan.messages is not None and returned is not None:
            self._previous, self._previous_tools = plan.messages + (returned,), plan.tools_key
        else:
            self._previous, self._previous_tools = None, ""
        return turn

    def record_choices(self, plan: CallPlan, choices: Sequence[Choice], spans: Sequence[Span]) -> None:
        """A call of n > 1 choices: kept pending until the agent's next call shows which one it continued
        (that one becomes the turn; the others are counted in `choices_dropped` and dropped), or until the
        session ends (`resolve_choices`: the first choice)."""
        self._pending = (plan, tuple(choices), tuple(spans))

    def resolve_choices(self, messages: Sequence[TemplateMessage] | None = None) -> None:
        """Record the pending call's choice that `messages` continue (the first choice if none or no messages)."""
        if self._pending is None:
            return
        plan, choices, spans = self._pending
        self._pending = None
        chosen = choices[0]
        if messages is not None and plan.messages is not None:
            for choice in choices:
                prev = plan.messages + ((choice.returned,) if choice.returned is not None else ())
                if len(messages) >= len(prev) and all(message_key(a) == message_key(b) for a, b in zip(messages, prev)):
                    chosen = choice
                    break
        self.counters["choices_dropped"] += len(choices) - 1
        self.record(plan, chosen.result, action=chosen.action, returned=chosen.returned, malformed=chosen.malformed,
                    spans=spans)

    def oldest_version(self) -> int | None:
        versions = [v for t in list(self.turns) for v in t.versions]
        return min(versions) if versions else None


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a request's JSON value (message contents, tool arguments, tool schemas …)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)
