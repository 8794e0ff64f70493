"""The agent gateway: an OpenAI-compatible HTTP server in front of the LLM client, one session per trajectory.

In: an `LLMClient` (the inference plane's proxy, or any implementation of `rollart.types.LLMClient`), a
`ChatTokens` of the model's tokenizer and chat template, and `envs.gateway` limits. The env plane opens a
session per agent trajectory (`open` → its base URL `http://127.0.0.1:PORT/t/<trajectory-id>/v1` and a
fresh key), the agent calls

    POST /t/<id>/v1/chat/completions     (messages, tools, streaming or not)
    POST /t/<id>/v1/completions          (prompt text or token ids, streaming or not)
    GET  /t/<id>/v1/models

with `Authorization: Bearer <key>`, and `finish` / `cancel` end the session and hand back its turns.
Out: OpenAI-shaped answers; each call becomes one `Turn` (see session.py for how its prompt ids keep the
prefix property, and requests.py for the sampling parameters).

Guarantees:
- Binds 127.0.0.1 only, on an ephemeral port; the server runs on its own thread and event loop, so an
  agent that blocks its own loop (a sync client inside `async def`) cannot stall the gateway.
- Every error is OpenAI-style JSON (`{"error": {message, type, param, code}}`), malformed requests
  included: 401 a wrong or missing key — also for a trajectory id that does not exist or has ended, so
  nothing reveals which ids exist to a caller without its key —, 410 a finished or cancelled trajectory
  (with its key), 400 a refused parameter or a limit, 408 a body slower than `body_timeout_s`, 413 a body
  over `max_body_mb`, 429 more than `max_concurrent_calls` calls of one trajectory at once, 502/504 a
  generation that failed or timed out (the trajectory then ends FAILED), 500 a bug (logged); below the app
  (`http_guard.py`) 503 past `max_connections`, 408 a request head slower than `header_timeout_s`, 431 one
  past `max_header_kb` or `max_headers`, 400 a head h11 cannot parse.
- What one request may cost is bounded before the work it asks for: the key is checked and the call
  counted against `max_concurrent_calls` before a byte of the body is read; a request whose text cannot fit
  the context is refused by a length count before it is rendered or tokenised (`AgentSession.check_length`);
  rendering and tokenising run on a thread pool off the serving loop (the Rust tokenizer lets go of the
  GIL), so one trajectory's long prompt delays no other trajectory's call; after a body over 1 MiB the
  allocator hands its free memory back to the system (glibc's `malloc_trim`).
- A session's calls run one at a time, in arrival order. After `cancel` every call is refused and the
  call in flight is aborted (its partial tokens are kept as a turn); after `finish` nothing more is
  recorded. Every wait is bounded.

Why Starlette + uvicorn (on a thread of its own, `rollart/envs/serving/http_serving.py`): a small, well-kept ASGI stack
already installed with Ray Serve; FastAPI's validation layer would duplicate the pydantic models of
requests.py.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import hmac
import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Literal, TypeVar
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rollart.config import GatewayConfig
from rollart.envs.agents.errors import GatewayError, unsupported
from rollart.envs.agents.messages import template_messages, template_tools
from rollart.envs.agents.requests import ChatRequest, CompletionRequest, parse_request, sampling_for, wants_logprobs
from rollart.envs.agents.responses import (
    CallOutput,
    chat_body,
    chat_chunks,
    completion_body,
    completion_chunks,
    sse,
)
from rollart.envs.agents.session import AgentSession, CallPlan, SessionLimits
from rollart.envs.tool_calls import ParsedOutput, detect_family, parser_for
from rollart.envs.chat import ChatTokens
from rollart.envs.serving.http_guard import HttpLimits
from rollart.envs.serving.http_serving import BodyTooLarge, BodyTooSlow, ThreadedServer, read_bounded
from rollart.types import GenerationRequest, GenerationResult, LLMClient, SamplingParams, Span, TurnBarrier

log = logging.getLogger(__name__)
T = TypeVar("T")

HOST = "127.0.0.1"
ABORT_TIMEOUT_S = 10.0
_REMEMBERED_CLOSED = 65536
_LARGE_BODY = 1 << 20  # after a body this large, free memory goes back to the system
_TRIM_AFTER_S = 0.5  # (once the rest of a refused body has been received and dropped)
_TOKENIZER_THREADS = 4


@dataclass
class _Entry:
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


class AgentGateway:
    def __init__(
        self,
        llm: LLMClient,
        chat: ChatTokens,
        cfg: GatewayConfig | None = None,
        *,
        worker: str = "env/env/0",
        generate_timeout_s: float = 360.0,
    ) -> None:
        self.llm, self.chat, self.cfg = llm, chat, cfg or GatewayConfig()
        self.worker, self.generate_timeout_s = worker, generate_timeout_s
        family = detect_family(getattr(chat.tokenizer, "chat_template", None))
        if self.cfg.tool_parser == "none":
            family = None
        elif self.cfg.tool_parser != "auto":
            family = self.cfg.tool_parser
        self.tool_family = family
        self._parse = parser_for(family) if family else None
        self._entries: dict[str, _Entry] = {}
        # recently ended ids → ("finished" | "cancelled", their key): with the key a call is told it ended
        self._closed: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._tokenize = ThreadPoolExecutor(_TOKENIZER_THREADS, thread_name_prefix="gateway-tokenize")
        self._trim: asyncio.TimerHandle | None = None
        chat.widest_token  # the length check's divisor, computed once here rather than at a first request
        self._lock = threading.Lock()
        self._max_body = int(self.cfg.max_body_mb * 2**20)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: ThreadedServer | None = None
        self.port = 0
        self.app = Starlette(
            routes=[
                Route("/t/{trajectory_id:path}/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/t/{trajectory_id:path}/v1/completions", self._completions, methods=["POST"]),
                Route("/t/{trajectory_id:path}/v1/models", self._models, methods=["GET"]),
            ],
            exception_handlers={GatewayError: self._error, HTTPException: self._http_error, Exception: self._bug},
        )

    # --- lifecycle (any thread) ------------------------------------------------------------------------
    def start(self) -> AgentGateway:
        """Serve on 127.0.0.1 (an ephemeral port) from a thread of its own; returns once listening."""
        cfg = self.cfg
        limits = HttpLimits(cfg.max_connections, cfg.header_timeout_s, cfg.max_header_kb * 1024, cfg.max_headers)
        self._http = ThreadedServer(self.app, HOST, 0, name="agent gateway", limits=limits).start()
        self._loop, self.port = self._http.loop, self._http.port
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._http is not None:
            self._http.stop(timeout_s)
        self._http = None
        self._tokenize.shutdown(wait=False, cancel_futures=True)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def base_url(self, trajectory_id: str) -> str:
        return f"{self.url}/t/{quote(trajectory_id, safe='')}/v1"

    @property
    def open_sessions(self) -> int:
        return len(self._entries)

    # --- sessions (called by the env plane, from any thread or loop) ---------------------------------
    def open(
        self,
        trajectory_id: str,
        *,
        domain: str,
        limits: SessionLimits,
        sampling: SamplingParams,
        sampling_source: Literal["run", "request"] = "run",
        seed_for: Callable[[int], int] = lambda k: k,
        turn_barrier: TurnBarrier | None = None,
    ) -> tuple[str, str]:
        """Open a session: (base URL, key) for the agent."""
        key = secrets.token_urlsafe(24)
        with self._lock:
            if trajectory_id in self._entries:
                raise ValueError(f"trajectory {trajectory_id} already has an open gateway session")
            if len(self._entries) >= self.cfg.max_open_trajectories:
                raise RuntimeError(f"the agent gateway holds {len(self._entries)} open trajectories, its limit "
                                   "(envs.gateway.max_open_trajectories)")
            self._closed.pop(trajectory_id, None)
            session = AgentSession(trajectory_id, key, self.chat, limits)
            self._entries[trajectory_id] = _Entry(session, domain, sampling, sampling_source, seed_for, turn_barrier)
        return self.base_url(trajectory_id), key

    async def cancel(self, trajectory_id: str, grace_s: float = 2.0) -> None:
        """Refuse every further call of the trajectory and abort the call in flight (waiting up to
        `grace_s` for it to record its partial turn). A no-op for an unknown or ended trajectory."""
        await self._on_loop(self._cancel(trajectory_id, grace_s))

    async def finish(self, trajectory_id: str, grace_s: float = 2.0) -> tuple[AgentSession, str]:
        """End the session: (the session with its turns, the generation failure or ''). A call still in
        flight (an agent that left one behind) is aborted and not recorded."""
        return await self._on_loop(self._finish(trajectory_id, grace_s))

    def oldest_version(self, trajectory_id: str) -> int | None:
        """Oldest policy version among an open trajectory's tokens (None before its first, or unknown)."""
        with self._lock:
            entry = self._entries.get(trajectory_id)
        return entry.session.oldest_version() if entry else None

    async def _on_loop(self, coro: Awaitable[T]) -> T:
        if self._loop is None:
            raise RuntimeError("the agent gateway is not started")
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        return await asyncio.wrap_future(future)

    async def _cancel(self, trajectory_id: str, grace_s: float) -> None:
        with self._lock:
            entry = self._entries.get(trajectory_id)
            if entry is None or entry.state != "open":
                return
            entry.state = "cancelled"
        await self._abort(trajectory_id)
        await self._drain(entry, grace_s)

    async def _finish(self, trajectory_id: str, grace_s: float) -> tuple[AgentSession, str]:
        with self._lock:
            entry = self._entries.get(trajectory_id)
            if entry is None:
                raise KeyError(f"trajectory {trajectory_id} has no gateway session")
            cancelled = entry.state == "cancelled"
            entry.state = "finished"
        if entry.pending:
            await self._abort(trajectory_id)
            await self._drain(entry, grace_s)
        with self._lock:
            self._entries.pop(trajectory_id, None)
            self._closed[trajectory_id] = ("cancelled" if cancelled else "finished", entry.session.key)
            while len(self._closed) > _REMEMBERED_CLOSED:
                self._closed.popitem(last=False)
        return entry.session, entry.failure

    async def _abort(self, trajectory_id: str) -> None:
        try:
            await asyncio.wait_for(self.llm.abort(trajectory_id), ABORT_TIMEOUT_S)
        except Exception as exc:
            log.warning("abort of %s failed: %s", trajectory_id, f"{type(exc).__name__}: {exc}")

    @staticmethod
    async def _drain(entry: _Entry, grace_s: float) -> None:
        try:
            await asyncio.wait_for(entry.lock.acquire(), grace_s)
            entry.lock.release()
        except TimeoutError:
            pass

    # --- HTTP ----------------------------------------------------------------------------------------
    def _entry(self, request: Request) -> _Entry:
        """The open session the request's path names, if its key is that session's: 401 first for any id
        without its key (unknown, ended or open alike), 410 for an ended one with its key."""
        trajectory_id = request.path_params["trajectory_id"]
        with self._lock:
            entry = self._entries.get(trajectory_id)
            ended, ended_key = self._closed.get(trajectory_id, ("", ""))
        key = entry.session.key if entry is not None else ended_key
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        # compared in constant time against a key (a random one for an unknown id): the answer's time says
        # nothing about whether the id exists
        expected = (key or secrets.token_urlsafe(24)).encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected) or not key:
            raise GatewayError(401, f"wrong or missing API key for trajectory {trajectory_id!r}",
                               code="invalid_api_key", kind="authentication_error")
        if entry is None:
            raise GatewayError(410, f"trajectory {trajectory_id!r} is {ended}; it takes no more calls",
                               code=f"trajectory_{ended}")
        self._check_open(entry, trajectory_id)
        return entry

    @asynccontextmanager
    async def _admitted(self, entry: _Entry) -> AsyncIterator[None]:
        """Count the call against the trajectory's `max_concurrent_calls` from its first byte (before its
        body is read): a caller that holds bodies open cannot hold more than that many."""
        trajectory_id = entry.session.trajectory_id
        if entry.pending >= self.cfg.max_concurrent_calls:
            raise GatewayError(429, f"trajectory {trajectory_id!r} has {entry.pending} calls in flight, queued or "
                               "sending their body (envs.gateway.max_concurrent_calls)", code="too_many_calls",
                               kind="rate_limit_error", retryable=True)
        entry.pending += 1
        try:
            yield
        finally:
            entry.pending -= 1

    @staticmethod
    def _check_open(entry: _Entry, trajectory_id: str) -> None:
        if entry.state != "open":
            raise GatewayError(410, f"trajectory {trajectory_id!r} is {entry.state}; it takes no more calls",
                               code=f"trajectory_{entry.state}")

    async def _body(self, request: Request, entry: _Entry, param: str) -> Any:
        """The request's JSON body: all of it within `body_timeout_s` (408) and `max_body_mb` (413); one
        larger than the trajectory's context could hold (`AgentSession.max_request_bytes`) is refused unread
        as too long for the context (400)."""
        session = entry.session
        fits = session.max_request_bytes(self.cfg.max_messages + self.cfg.max_tools)
        limit = min(self._max_body, fits)
        try:
            body = await read_bounded(request, limit, self.cfg.body_timeout_s)
        except BodyTooLarge:
            if limit < self._max_body:
                raise session.too_long(f"a request body over {fits} bytes cannot fit", param) from None
            raise GatewayError(413, f"request body over {self.cfg.max_body_mb:g} MiB (envs.gateway.max_body_mb)",
                               code="payload_too_large", close=True) from None
        except BodyTooSlow as exc:
            raise GatewayError(408, f"{exc} (envs.gateway.body_timeout_s)", code="request_timeout", close=True) from None
        if len(body) > _LARGE_BODY:
            request.state.large_body = True
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise GatewayError(400, f"the request body is not valid JSON ({str(exc)[:120]})", code="invalid_json") from None

    async def _models(self, request: Request) -> Response:
        self._entry(request)
        return JSONResponse({"object": "list", "data": [
            {"id": self.cfg.model_name, "object": "model", "created": 0, "owned_by": "rollart"}]})

    async def _chat(self, request: Request) -> Response:
        entry = self._entry(request)
        async with self._admitted(entry):
            try:
                return await self._chat_call(entry, request)
            finally:
                self._after(request)

    async def _chat_call(self, entry: _Entry, request: Request) -> Response:
        req = parse_request(ChatRequest, await self._body(request, entry, "messages"))
        assert isinstance(req, ChatRequest)
        messages = template_messages(req.messages, self.cfg.max_messages)
        tools = template_tools(req.tools, self.cfg.max_tools)
        entry.session.check_length([messages, tools], "messages")
        if tools and self._parse is None:
            raise unsupported("tools", f"{len(tools)} tools", "this model's chat template renders no tool calls "
                              "(envs.gateway.tool_parser)")
        parse = tools and req.tool_choice != "none"
        names = {t["function"]["name"] for t in tools}

        def output(text: str, k: int) -> tuple[ParsedOutput, dict[str, Any]]:
            if parse and self._parse is not None:
                parsed = self._parse(text, names, f"call_{k}")
                if req.parallel_tool_calls is False and len(parsed.tool_calls) > 1:
                    parsed = ParsedOutput(text, malformed="several tool calls with parallel_tool_calls=false")
            else:
                parsed = ParsedOutput(text)
            return parsed, _returned_message(parsed)

        out = await self._call(entry, request, lambda s: s.plan_chat(messages, tools), req, output)
        if req.stream:
            include = bool((req.stream_options or {}).get("include_usage"))
            return _stream(chat_chunks(out, bool(req.logprobs), include, self._token_text))
        return JSONResponse(chat_body(out, bool(req.logprobs), self._token_text))

    async def _completions(self, request: Request) -> Response:
        entry = self._entry(request)
        async with self._admitted(entry):
            try:
                return await self._completion_call(entry, request)
            finally:
                self._after(request)

    async def _completion_call(self, entry: _Entry, request: Request) -> Response:
        req = parse_request(CompletionRequest, await self._body(request, entry, "prompt"))
        assert isinstance(req, CompletionRequest)
        entry.session.check_length(req.prompt, "prompt")

        def output(text: str, k: int) -> tuple[ParsedOutput, None]:
            return ParsedOutput(text), None

        out = await self._call(entry, request, lambda s: s.plan_completion(req.prompt), req, output)
        logprobs = wants_logprobs(req)
        if req.stream:
            include = bool((req.stream_options or {}).get("include_usage"))
            return _stream(completion_chunks(out, logprobs, include, self._token_text))
        return JSONResponse(completion_body(out, logprobs, self._token_text))

    async def _call(
        self,
        entry: _Entry,
        request: Request,
        plan_of: Callable[[AgentSession], CallPlan],
        req: ChatRequest | CompletionRequest,
        output: Callable[[str, int], tuple[ParsedOutput, dict[str, Any] | None]],
    ) -> CallOutput:
        """One call, serialised with the trajectory's others: plan (rendered and tokenised off the serving
        loop) → generate → record."""
        trajectory_id = entry.session.trajectory_id
        async with entry.lock:
            self._check_open(entry, trajectory_id)
            session = entry.session
            plan = await asyncio.get_running_loop().run_in_executor(self._tokenize, plan_of, session)
            k = len(session.turns)
            sampling = sampling_for(req, entry.sampling, source=entry.sampling_source, seed=entry.seed_for(k),
                                    budget=session.budget(plan))
            agent_span = Span("agent.step", entry.last_call_end, time.time(), self.worker)
            if entry.turn_barrier is not None:
                await asyncio.wait_for(entry.turn_barrier.before_turn(trajectory_id, k), self.generate_timeout_s)
            result, wait_span = await self._generate(entry, GenerationRequest(
                request_id=f"{trajectory_id}/{k}", trajectory_id=trajectory_id, domain=entry.domain,
                prompt_token_ids=plan.context, sampling=sampling))
            text = self.chat.response_text(result.token_ids)
            parsed, returned = output(text, k)
            with self._lock:
                if entry.state == "finished":  # the trajectory ended while this call generated
                    raise GatewayError(410, f"trajectory {trajectory_id!r} is finished; it takes no more calls",
                                       code="trajectory_finished")
                session.record(plan, result, action=text, returned=returned, malformed=parsed.malformed,
                               spans=(agent_span, wait_span, *result.spans))
                session.counters["generate_time_s"] += wait_span.duration
            entry.last_call_end = time.time()
            if result.finish_reason == "abort" or entry.state != "open":
                raise GatewayError(410, f"trajectory {trajectory_id!r} was cancelled", code="trajectory_cancelled")
            return CallOutput(f"{'chatcmpl' if returned is not None else 'cmpl'}-{quote(trajectory_id, safe='')}-{k}",
                              self.cfg.model_name, parsed, tuple(result.token_ids), tuple(result.logprobs),
                              result.finish_reason, len(plan.context))

    def _after(self, request: Request) -> None:
        """After a request with a large body (read, or refused and discarded as it arrives), give the
        allocator's free memory back: once, shortly after the last such request (off the loop)."""
        length = request.headers.get("content-length", "")
        if getattr(request.state, "large_body", False) or (length.isdigit() and int(length) > _LARGE_BODY):
            if self._trim is not None:
                self._trim.cancel()
            self._trim = asyncio.get_running_loop().call_later(
                _TRIM_AFTER_S, lambda: self._tokenize.submit(_release_free_memory))

    async def _generate(self, entry: _Entry, request: GenerationRequest) -> tuple[GenerationResult, Span]:
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

    def _token_text(self, token_id: int) -> str:
        return self.chat.tokenizer.decode([token_id])

    # --- errors --------------------------------------------------------------------------------------
    async def _error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = "not_found" if exc.status_code == 404 else "method_not_allowed" if exc.status_code == 405 else "http_error"
        error = GatewayError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code)
        return await self._error(request, error)

    async def _bug(self, request: Request, exc: Exception) -> Response:
        log.exception("agent gateway: %s %s failed", request.method, request.url.path, exc_info=exc)
        error = GatewayError(500, f"internal error of the rollart gateway: {type(exc).__name__}: {exc}",
                             code="internal_error", kind="server_error")
        return await self._error(request, error)


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()


def _release_free_memory() -> None:
    """glibc keeps freed heap memory for the process (a 4 MB body and its copies stayed resident); this
    returns what is free to the system. A no-op where the C library has no malloc_trim."""
    if _TRIM is not None:
        _TRIM(0)


def _stream(chunks: Iterable[dict[str, Any]]) -> StreamingResponse:
    events = list(sse(list(chunks)))

    async def body() -> AsyncIterator[bytes]:  # async: Starlette would iterate a sync one in a thread pool
        for event in events:
            yield event

    return StreamingResponse(body(), media_type="text/event-stream")


def _returned_message(parsed: ParsedOutput) -> dict[str, Any]:
    """The assistant message as the template sees it when the agent sends it back."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in parsed.tool_calls
        ]
    return message
