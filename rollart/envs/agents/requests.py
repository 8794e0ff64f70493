"""The request bodies the gateway accepts, and how their sampling parameters map onto the engine's.

In: the JSON body of `POST .../chat/completions` or `.../completions` (the sampling knobs of the Responses and
Messages codecs map through `sampling_for` too). Out: a validated request (pydantic;
an unknown parameter, a wrong type or an unsupported value is a 400 naming it) and, with `sampling_for`,
the `SamplingParams` of the generation.

Mapped: temperature, top_p, top_k (a vLLM-style extension), max_tokens / max_completion_tokens, stop
(strings: as OpenAI, the content ends before the stop string; the recorded ids keep it), seed, n (chat, up to
MAX_CHOICES: each choice is generated and recorded; the one the agent continues with becomes the turn, the
others are counted in `choices_dropped` and dropped), logprobs (the sampled token's; never the end-of-turn
token) and top_logprobs (up to 20), stream and stream_options.include_usage, tools, tool_choice ('auto',
'none', 'required', a named function: the last two by constrained decoding, constraints.py),
parallel_tool_calls, response_format (text, json_object, json_schema: constrained decoding),
reasoning_effort (the template's thinking switch where it has one: none/minimal off, the others on; else
accepted and said once in the log). Accepted and ignored: user, metadata, store, verbosity,
prompt_cache_key, safety_identifier, service_tier. Accepted only at their neutral value: frequency_penalty
and presence_penalty (0), logit_bias (empty), echo (false), best_of (1), suffix (none). Everything else is
refused by name.

Whose parameters win (`domains.<name>.agent_sampling`): under `run` (the default) the run's sampling —
`rollout.temperature`/`top_p`/`top_k` for training episodes, `eval.temperature` for validation — replaces
the agent's temperature, top_p, top_k and seed (each call gets a seed derived from the task and the call,
as env turns do), so an agent that hard-codes `temperature=0` or a fixed seed still explores and GRPO
groups still differ; under `request` the agent's values are used. Either way max_tokens is capped by the
domain's `max_new_tokens` and by what is left of `max_total_tokens`, and the stop tokens of the chat
template always stop.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollart.envs.agents.call import Asked, ChatCall, ToolChoice
from rollart.envs.agents.constraints import output_schema
from rollart.envs.agents.errors import GatewayError, bad_request, unsupported
from rollart.envs.agents.messages import template_messages, template_tools
from rollart.types import SamplingParams


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)

    model: str = Field(max_length=256)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    store: bool | None = None


class ChatRequest(_Request):
    messages: list[Any]
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0)
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None


MAX_STOP_STRINGS = 4
MAX_CHOICES = 8
MAX_TOP_LOGPROBS = 20
# reasoning effort → the template's thinking switch (where it has one): the two lowest efforts mean no thinking
THINKING = {"none": False, "minimal": False, "low": True, "medium": True, "high": True, "xhigh": True}
MAX_STOP_CHARS = 256


def parse_request(kind: type[BaseModel], body: Any) -> Any:
    """Validate a body; the first problem becomes a 400 naming the parameter."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        request = kind.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = ".".join(str(p) for p in error["loc"])
        if error["type"] == "extra_forbidden":
            raise unsupported(param, error.get("input"), "see the gateway's list of parameters") from None
        raise bad_request(f"'{param}': {error['msg']} (got {error.get('input')!r:.80})", param) from None
    if isinstance(request, _Request):
        _check_neutral(request)
    return request


def _check_neutral(r: _Request) -> None:
    if r.n not in (None, 1) and not (isinstance(r, ChatRequest) and isinstance(r.n, int) and 1 <= r.n <= MAX_CHOICES):
        raise unsupported("n", r.n, f"1 to {MAX_CHOICES} choices on chat completions; one on completions")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(r, name) not in (None, 0, 0.0):
            raise unsupported(name, getattr(r, name), "only 0")
    if r.logit_bias:
        raise unsupported("logit_bias", r.logit_bias, "only an empty map")
    if r.stream_options and set(r.stream_options) - {"include_usage"}:
        raise unsupported("stream_options", r.stream_options, "only include_usage")
    stops = [r.stop] if isinstance(r.stop, str) else list(r.stop or [])
    if len(stops) > MAX_STOP_STRINGS or any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise bad_request(f"stop: at most {MAX_STOP_STRINGS} non-empty strings of up to {MAX_STOP_CHARS} "
                          "characters", "stop")
    if isinstance(r, ChatRequest):
        if r.top_logprobs and not (r.logprobs and 0 <= r.top_logprobs <= MAX_TOP_LOGPROBS):
            raise unsupported("top_logprobs", r.top_logprobs, f"0 to {MAX_TOP_LOGPROBS}, with logprobs=true")
    if isinstance(r, CompletionRequest):
        if r.logprobs:
            raise unsupported("logprobs", r.logprobs, "0 or null: the sampled token's logprob, no top alternatives")
        if r.echo:
            raise unsupported("echo", r.echo, "only false")
        if r.best_of not in (None, 1):
            raise unsupported("best_of", r.best_of, "only 1")
        if r.suffix:
            raise unsupported("suffix", r.suffix, "only null")


def asked_of(r: _Request) -> Asked:
    """The sampling knobs an OpenAI chat or completions request set."""
    max_tokens = r.max_completion_tokens if isinstance(r, ChatRequest) and r.max_completion_tokens is not None \
        else r.max_tokens
    return Asked(r.temperature, r.top_p, r.top_k, r.seed, max_tokens,
                 (r.stop,) if isinstance(r.stop, str) else tuple(r.stop or ()))


def chat_tool_choice(raw: Any, names: list[str]) -> ToolChoice:
    if raw is None or raw in ("auto", "none", "required"):
        return ToolChoice(raw or "auto")
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("function"), dict) \
            and raw["function"].get("name") in names:
        return ToolChoice("named", raw["function"]["name"])
    raise unsupported("tool_choice", raw, "'auto', 'none', 'required' or {'type': 'function', 'function': {'name': "
                      f"NAME}}}} naming one of the tools ({', '.join(names) or 'none given'})")


def chat_call(r: ChatRequest, cfg: Any) -> ChatCall:
    """The chat request as the gateway's chat-like call (messages and tools checked field by field)."""
    tools = template_tools(r.tools, cfg.max_tools)
    choice = chat_tool_choice(r.tool_choice, [t["function"]["name"] for t in tools])
    return ChatCall(template_messages(r.messages, cfg.max_messages), tools, choice, r.parallel_tool_calls is not False,
                    asked_of(r), output_schema(r.response_format, "response_format"),
                    THINKING.get(r.reasoning_effort or ""), r.n or 1, r.top_logprobs or 0)


def wants_logprobs(r: _Request) -> bool:
    return r.logprobs is not None and r.logprobs is not False


def sampling_for(
    r: Asked, run: SamplingParams, *, source: Literal["run", "request"], seed: int, budget: int
) -> SamplingParams:
    """The engine's parameters for this call: `run` is the run's sampling for the domain (its stop token
    ids always apply), `seed` the call's derived seed, `budget` the tokens left in the trajectory."""
    if budget < 1:
        raise GatewayError(400, "the trajectory's token budget (domains.<name>.max_total_tokens) is used up",
                           code="context_length_exceeded", param="messages")
    cap = min(run.max_new_tokens, budget)
    asked = r.max_tokens
    sampling = replace(run, max_new_tokens=min(asked, cap) if asked else cap, stop_strings=r.stop, seed=seed)
    if source == "request":
        sampling = replace(
            sampling,
            temperature=run.temperature if r.temperature is None else float(r.temperature),
            top_p=run.top_p if r.top_p is None else float(r.top_p),
            top_k=run.top_k if r.top_k is None else int(r.top_k),
            seed=seed if r.seed is None else int(r.seed) % (2**63 - 1),
        )
    return sampling
