"""What a protocol codec asks of the gateway, and what it gets back — the same for every protocol.

In: a codec (OpenAI chat completions, OpenAI Responses, Anthropic Messages) turns its request into a
`ChatCall` — messages and tools as the chat template renders them, the tool choice, the sampling knobs the
request set (`Asked`). Out: a `CallOutput` — the parsed text and tool calls, the engine's ids and logprobs,
its finish reason — which the codec renders in its own shape. The session under them (session.py) never
sees a protocol; the codecs never see a token they did not get in a `CallOutput`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rollart.envs.tool_calls import ParsedOutput

TemplateMessage = dict[str, Any]


@dataclass(frozen=True)
class Asked:
    """The sampling knobs a request set (None: not given). How they map onto the engine's parameters, and
    whose win, is `requests.sampling_for`."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolChoice:
    """`auto` (the model decides), `none` (no calls parsed), `required` (at least one call), `named` (a call
    of the function `name`)."""

    mode: Literal["auto", "none", "required", "named"] = "auto"
    name: str = ""


@dataclass(frozen=True)
class ChatCall:
    messages: list[TemplateMessage]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    asked: Asked = Asked()
    output_schema: dict[str, Any] | None = None  # structured output: the JSON schema the answer must satisfy
    thinking: bool | None = None  # the template's thinking switch for this call (reasoning effort); None: default
    n: int = 1  # choices to generate (chat completions)
    top_logprobs: int = 0


@dataclass(frozen=True)
class CallOutput:
    id: str
    model: str
    parsed: ParsedOutput
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str  # the engine's: stop | length
    prompt_tokens: int
    stop_sequence: str | None = None  # the request's stop string the generation ended on (cut from the content)
    ends_with_stop_token: bool = False  # the last id is the template's end-of-turn token (no logprob shown for it)
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()  # per token, with top_logprobs asked
    index: int = 0  # which of the call's choices

    @property
    def shown(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The ids and logprobs a client is shown: without the end-of-turn token."""
        n = len(self.token_ids) - int(self.ends_with_stop_token)
        return self.token_ids[:n], self.logprobs[:n]

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
