"""`rollart bench gateway`: what the OpenAI-compatible agent gateway adds to a turn, and whether it holds many
open trajectories.

Setup: an embedded Ray with one real `InferenceWorker` (the built-in tiny model) behind `LLMProxy`; the
`AgentGateway` serves in this process from its own thread, calling the proxy through `ActorLLMClient` —
the env worker's path. Agents use the real `openai` client (`AsyncOpenAI`, one shared connection pool).

Overhead (the same requests every way, interleaved turn by turn so machine noise hits them alike):
chat conversations of several turns (each turn appends the reply and a new user message; 8 new tokens
per turn). Each turn is sent through the gateway by the `openai` SDK and, in a twin session with the same
messages and seeds, by plain httpx; then the very `GenerationRequest` the gateway made (same context ids,
sampling and seed; its own trajectory id, so prefix reuse is alike) is sent to the proxy directly.
- `overhead_ms_p50`, `overhead_ms_p95`: per gateway turn sent by a plain HTTP client (httpx, what the
  `openai` SDK sends through), the wall time minus the time the gateway spent waiting on the proxy for it
  (its `generate.wait` span): HTTP, validation, templating, tokenisation, tool parsing, response
  building. Target: p50 ≤ 5 ms.
- `openai_sdk_overhead_ms_p50`: the same with the `openai` SDK as the client (its request building and
  response models added) — what an agent written with it sees.
- `gateway_vs_direct_turn_time`: median turn time through the gateway with the `openai` SDK ÷ median
  direct turn time.
- `responses_overhead_ms_p50`, `messages_overhead_ms_p50`: the overhead of the same conversation sent as the
  OpenAI Responses API and as Anthropic Messages (plain HTTP), each in a session of its own. Target: p50 ≤ 5 ms.
- `constrained_mask_us_per_token`: what constrained decoding adds per token in the built-in engine (the
  grammar's bitmask and the masked logits row, over a JSON schema, at the model's vocabulary).

Scale: `errors_at_<N>_open` (N = 1000; 100 with `--quick`): N trajectories opened at once, each agent
making two chat calls concurrently with all the others (2 new tokens each); errors counted (must be 0).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import replace
from typing import Any

from benchmarks.common import BenchResult
from rollart.config.loader import load_config
from rollart.envs.agents.gateway import AgentGateway
from rollart.envs.agents.session import SessionLimits
from rollart.envs.chat import ChatTokens
from rollart.envs.sampling import domain_sampling
from rollart.envs.worker import ActorLLMClient
from rollart.inference.proxy import LLMProxy
from rollart.inference.worker import InferenceWorker
from rollart.models import load_tokenizer, resolve_model_path
from rollart.resources import Runtime
from rollart.types import GenerationRequest, GenerationResult

ARMS = ("sdk", "raw", "responses", "messages")  # the openai SDK's chat; chat, Responses, Messages by plain HTTP
PROTOCOLS = {  # arm → the conversation as (path, body, the reply's text from the answer)
    "raw": lambda m: ("/chat/completions", {"model": "m", "messages": m, "max_tokens": 8},
                      lambda a: a["choices"][0]["message"]["content"] or ""),
    "responses": lambda m: ("/responses", {"model": "m", "input": m, "max_output_tokens": 8},
                            lambda a: a["output"][0]["content"][0]["text"]),
    "messages": lambda m: ("/messages", {"model": "m", "messages": m, "max_tokens": 8},
                           lambda a: a["content"][0]["text"]),
}
FULL = dict(conversations=20, turns=6, open=1000)
QUICK = dict(conversations=4, turns=3, open=100)


class _Recording:
    """The proxy client the gateway uses, keeping each request it sent (to replay it directly)."""

    def __init__(self, inner: ActorLLMClient) -> None:
        self.inner = inner
        self.requests: dict[str, GenerationRequest] = {}

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.requests[request.request_id] = request
        return await self.inner.generate(request)

    async def abort(self, trajectory_id: str) -> None:
        await self.inner.abort(trajectory_id)


def run(quick: bool) -> BenchResult:
    size = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="rollart-bench-gateway-") as run_dir:
        cfg = load_config(None, [f"run_dir={run_dir}", "domains.frozenlake=null", "observability.progress=quiet",
                                 "inference.max_batch_size=64"])
        with Runtime(cfg) as runtime:
            res = runtime.resources
            workers = res.place(InferenceWorker, pool="gen_decode", replicas=1, args=(cfg,),
                                worker_kwargs=lambda p: {"pool": p.pool, "index": p.index})
            try:
                proxy = res.spawn(LLMProxy, {"gen_decode": list(workers.actors)}, {"math": "gen_decode"},
                                  cfg.inference, name="llm_proxy")
                chat = ChatTokens(load_tokenizer(resolve_model_path(cfg.model, cfg.seed)))
                sampling = replace(domain_sampling(cfg, "math", chat.stop_token_ids), max_new_tokens=8,
                                   ignore_eos=True)
                return asyncio.run(_measure(ActorLLMClient(proxy), chat, sampling, cfg.envs.gateway, size))
            finally:
                workers.shutdown()


async def _measure(direct: ActorLLMClient, chat: ChatTokens, sampling: Any, gateway_cfg: Any, size: dict) -> BenchResult:
    import httpx
    import openai

    recording = _Recording(direct)
    gateway = AgentGateway(recording, chat, gateway_cfg).start()
    http = openai.DefaultAsyncHttpxClient(limits=httpx.Limits(max_connections=2000, max_keepalive_connections=2000))
    try:
        rows, via_gateway, via_direct = [], [], []
        overheads: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for c in range(size["conversations"]):
            sessions = {arm: gateway.open(f"{arm}/{c}", domain="math", limits=SessionLimits(size["turns"], 4096),
                                          sampling=sampling, seed_for=lambda k: 1000 + k) for arm in ARMS}
            client = openai.AsyncOpenAI(base_url=sessions["sdk"][0], api_key=sessions["sdk"][1], http_client=http,
                                        max_retries=0)
            await client.models.list()  # the SDK's one-time set-up is not a turn's cost
            first = {"role": "user", "content": f"Conversation {c}: what is {c} + 1?"}
            convo: dict[str, list[dict[str, Any]]] = {arm: [first] for arm in ARMS}
            walls: dict[str, list[float]] = {arm: [] for arm in ARMS}
            for k in range(size["turns"]):
                start = time.perf_counter()
                reply = await client.chat.completions.create(model="m", messages=convo["sdk"], max_tokens=8)
                walls["sdk"].append(time.perf_counter() - start)
                texts = {"sdk": reply.choices[0].message.content or ""}
                for arm in ARMS[1:]:  # the same conversation in each protocol, by plain HTTP
                    base, key = sessions[arm]
                    path, body, text_of = PROTOCOLS[arm](convo[arm])
                    start = time.perf_counter()
                    answer = await http.post(base + path, json=body, headers={"Authorization": f"Bearer {key}"})
                    walls[arm].append(time.perf_counter() - start)
                    answer.raise_for_status()
                    texts[arm] = text_of(answer.json())
                request = recording.requests[f"sdk/{c}/{k}"]
                start = time.perf_counter()
                await direct.generate(replace(request, request_id=f"direct/{c}/{k}", trajectory_id=f"direct/{c}"))
                via_direct.append(time.perf_counter() - start)
                for arm in ARMS:
                    convo[arm] += [{"role": "assistant", "content": texts[arm]},
                                   {"role": "user", "content": f"And then {k}?"}]
            segments = {}
            for arm in ARMS:
                session, failure = await gateway.finish(f"{arm}/{c}")
                assert not failure, failure
                segments[arm] = len({t.segment for t in session.turns})
                for turn, wall in zip(session.turns, walls[arm]):
                    overheads[arm].append((wall - sum(s.duration for s in turn.spans if s.name == "generate.wait")) * 1000)
            via_gateway += walls["sdk"]
            rows.append({"conversation": c, "turns": size["turns"], "segments": segments,
                         **{f"{arm}_overhead_ms_median": round(statistics.median(overheads[arm][-size["turns"]:]), 3)
                            for arm in ARMS}})
        overhead, sdk_overhead = overheads["raw"], overheads["sdk"]
        ratios = {
            "overhead_ms_p50": statistics.median(overhead),
            "overhead_ms_p95": statistics.quantiles(overhead, n=20)[-1] if len(overhead) > 1 else overhead[0],
            "openai_sdk_overhead_ms_p50": statistics.median(sdk_overhead),
            "gateway_vs_direct_turn_time": statistics.median(via_gateway) / statistics.median(via_direct),
            "responses_overhead_ms_p50": statistics.median(overheads["responses"]),
            "messages_overhead_ms_p50": statistics.median(overheads["messages"]),
            "constrained_mask_us_per_token": _mask_cost(chat),
        }
        n = size["open"]
        errors, seconds, peak = await _many_open(gateway, http, sampling, n)
        ratios[f"errors_at_{n}_open"] = float(errors)
        rows.append({"open_trajectories": n, "peak_open": peak, "errors": errors, "calls": 2 * n,
                     "seconds": round(seconds, 2)})
        notes = [f"{size['conversations']} conversations x {size['turns']} turns, 8 new tokens per turn (tiny model, "
                 "real engine and proxy); the direct arm replays the gateway's own GenerationRequests; "
                 f"{n} trajectories opened at once, 2 chat calls each, all concurrent"]
        return BenchResult("gateway", ratios, rows, notes)
    finally:
        await http.aclose()
        gateway.stop()


def _mask_cost(chat: ChatTokens, tokens: int = 2000) -> float:
    """Median µs per token that constrained decoding adds in the built-in engine: the grammar's bitmask and the
    masked logits row (`rollart/inference/constrained.py`), over a JSON schema, at this tokenizer's vocabulary."""
    import torch

    from rollart.envs.tool_calls.grammar import json_rule
    from rollart.inference.constrained import GrammarCompiler

    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 16},
                                               "steps": {"type": "array", "items": {"type": "integer"}}},
              "required": ["answer", "steps"]}
    vocab = len(chat.tokenizer)
    compiler = GrammarCompiler(chat.tokenizer, vocab)
    grammar, stops = f"start: {json_rule(schema)}", set(chat.stop_token_ids)
    mask, g, times = compiler.mask(grammar, stops), torch.Generator().manual_seed(0), []
    for _ in range(tokens):
        logits = torch.randn(vocab, generator=g)
        start = time.perf_counter()
        mask.apply(logits)
        times.append(time.perf_counter() - start)
        token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=g))
        if token in stops:
            mask = compiler.mask(grammar, stops)
        else:
            mask.advance(token)
    return statistics.median(times) * 1e6


async def _many_open(gateway: AgentGateway, http: Any, sampling: Any, n: int) -> tuple[int, float, int]:
    import openai

    short = replace(sampling, max_new_tokens=2)
    opened = [gateway.open(f"open/{i}", domain="math", limits=SessionLimits(2, 1024), sampling=short,
                           seed_for=lambda k: k) for i in range(n)]
    peak = gateway.open_sessions

    async def agent(i: int, base: str, key: str) -> int:
        client = openai.AsyncOpenAI(base_url=base, api_key=key, http_client=http, max_retries=0, timeout=600)
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Agent {i}, say something."}]
        try:
            first = await client.chat.completions.create(model="m", messages=messages, max_tokens=2)
            messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "More."}]
            await client.chat.completions.create(model="m", messages=messages, max_tokens=2)
            return 0
        except openai.OpenAIError:
            return 1

    start = time.perf_counter()
    errors = sum(await asyncio.gather(*(agent(i, base, key) for i, (base, key) in enumerate(opened))))
    seconds = time.perf_counter() - start
    for i in range(n):
        _, failure = await gateway.finish(f"open/{i}")
        errors += bool(failure)
    return errors, seconds, peak
