"""The agent gateway: an OpenAI-compatible HTTP server in front of the LLM client, one session per trajectory.

In: an `LLMClient` (the inference plane's proxy, or any implementation of `rollart.types.LLMClient`), a
`ChatTokens` of the model's tokenizer and chat template, and `envs.gateway` limits. The env plane opens a
session per agent trajectory (`open` → its base URL `http://127.0.0.1:PORT/t/<trajectory-id>/v1` and a
fresh key), the agent calls

    POST /t/<id>/v1/chat/completions     OpenAI chat completions (requests.py, responses.py)
    POST /t/<id>/v1/completions          OpenAI completions: prompt text or token ids
    POST /t/<id>/v1/responses            OpenAI Responses (openai_responses.py)
    POST /t/<id>/v1/messages             Anthropic Messages (anthropic_messages.py), and messages/count_tokens
    GET  /t/<id>/v1/models

each streaming or not, with `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`), and `finish` /
`cancel` end the session and hand back its turns. Any other path is a 404 that lists these routes.
Out: each protocol's own answers; each call becomes one `Turn` of the one exact-token session, whatever the
protocol (calls.py runs it; see session.py for how its prompt ids keep the prefix property).

Guarantees:
- Binds 127.0.0.1 only, on an ephemeral port; the server runs on its own thread and event loop, so an
  agent that blocks its own loop (a sync client inside `async def`) cannot stall the gateway.
- Every error is JSON in the protocol's shape — OpenAI's `{"error": {message, type, param, code}}`, on the
  Messages routes Anthropic's `{"type": "error", "error": {type, message}}` —, malformed requests included: 401 a wrong or missing key — also for a trajectory id that does not exist or has ended, so
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
import hmac
import json
import logging
import secrets
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Literal, TypeVar
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollart.config import GatewayConfig
from rollart.envs.agents import anthropic_messages as anthropic
from rollart.envs.agents import openai_responses as responses_api
from rollart.envs.agents.calls import CallRunner, Entry, check_open, returned_message
from rollart.envs.agents.errors import GatewayError
from rollart.envs.agents.http import named_events, release_free_memory, stream_response
from rollart.envs.agents.requests import ChatRequest, CompletionRequest, asked_of, chat_call, parse_request, wants_logprobs
from rollart.envs.agents.responses import chat_body, chat_chunks, completion_body, completion_chunks, sse
from rollart.envs.agents.session import AgentSession, SessionLimits
from rollart.envs.chat import ChatTokens
from rollart.envs.serving.http_guard import HttpLimits
from rollart.envs.serving.http_serving import BodyTooLarge, BodyTooSlow, ThreadedServer, read_bounded
from rollart.envs.tool_calls import detect_family
from rollart.types import LLMClient, SamplingParams, TurnBarrier

log = logging.getLogger(__name__)
T = TypeVar("T")

HOST = "127.0.0.1"
ABORT_TIMEOUT_S = 10.0
_REMEMBERED_CLOSED = 65536
_LARGE_BODY = 1 << 20  # after a body this large, free memory goes back to the system
_TRIM_AFTER_S = 0.5  # (once the rest of a refused body has been received and dropped)
_TOKENIZER_THREADS = 4


# (method, path under /t/<trajectory-id>/v1/, handler). Anthropic's SDK appends /v1/messages to its base URL, so
# `Anthropic(base_url=<the agent's base URL>)` posts to .../v1/v1/messages: served too, so that such an agent
# runs unchanged.
ROUTES = (
    ("POST", "v1/messages", "_messages"),  # first: the path converter of the id would swallow the extra /v1
    ("POST", "v1/messages/count_tokens", "_count_tokens"),
    ("POST", "chat/completions", "_chat"),
    ("POST", "completions", "_completions"),
    ("POST", "responses", "_responses"),
    ("POST", "messages", "_messages"),
    ("POST", "messages/count_tokens", "_count_tokens"),
    ("GET", "models", "_models"),
)
ROUTE_LIST = ", ".join(f"{m} /t/<trajectory-id>/v1/{p}" for m, p, _ in ROUTES if not p.startswith("v1/"))


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
        self._entries: dict[str, Entry] = {}
        # recently ended ids → ("finished" | "cancelled", their key): with the key a call is told it ended
        self._closed: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._tokenize = ThreadPoolExecutor(_TOKENIZER_THREADS, thread_name_prefix="gateway-tokenize")
        self._trim: asyncio.TimerHandle | None = None
        chat.widest_token  # the length check's divisor, computed once here rather than at a first request
        self._lock = threading.Lock()
        self.calls = CallRunner(llm, chat, self.cfg, family, self._tokenize, worker, generate_timeout_s, self._lock)
        self._max_body = int(self.cfg.max_body_mb * 2**20)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: ThreadedServer | None = None
        self.port = 0
        self.app = Starlette(
            routes=[Route(f"/t/{{trajectory_id:path}}/v1/{path}", getattr(self, handler), methods=[method])
                    for method, path, handler in ROUTES],
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
            self._entries[trajectory_id] = Entry(session, domain, sampling, sampling_source, seed_for, turn_barrier)
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
            entry.session.resolve_choices()  # a last call of n > 1 choices: its first choice is the turn
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
    async def _drain(entry: Entry, grace_s: float) -> None:
        try:
            await asyncio.wait_for(entry.lock.acquire(), grace_s)
            entry.lock.release()
        except TimeoutError:
            pass

    # --- HTTP ----------------------------------------------------------------------------------------
    def _entry(self, request: Request) -> Entry:
        """The open session the request's path names, if its key is that session's: 401 first for any id
        without its key (unknown, ended or open alike), 410 for an ended one with its key."""
        trajectory_id = request.path_params["trajectory_id"]
        with self._lock:
            entry = self._entries.get(trajectory_id)
            ended, ended_key = self._closed.get(trajectory_id, ("", ""))
        key = entry.session.key if entry is not None else ended_key
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if not auth and "x-api-key" in request.headers:  # Anthropic's clients send the key this way
            scheme, token = "bearer", request.headers["x-api-key"]
        # compared in constant time against a key (a random one for an unknown id): the answer's time says
        # nothing about whether the id exists
        expected = (key or secrets.token_urlsafe(24)).encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected) or not key:
            raise GatewayError(401, f"wrong or missing API key for trajectory {trajectory_id!r}",
                               code="invalid_api_key", kind="authentication_error")
        if entry is None:
            raise GatewayError(410, f"trajectory {trajectory_id!r} is {ended}; it takes no more calls",
                               code=f"trajectory_{ended}")
        check_open(entry)
        return entry

    @asynccontextmanager
    async def _admitted(self, entry: Entry) -> AsyncIterator[None]:
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

    async def _body(self, request: Request, entry: Entry, param: str) -> Any:
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

    async def _serve(self, request: Request, handle: Callable[[Entry, Request], Awaitable[Response]]) -> Response:
        entry = self._entry(request)
        async with self._admitted(entry):
            try:
                return await handle(entry, request)
            finally:
                self._after(request)

    async def _chat(self, request: Request) -> Response:
        return await self._serve(request, self._chat_call)

    async def _chat_call(self, entry: Entry, request: Request) -> Response:
        req = parse_request(ChatRequest, await self._body(request, entry, "messages"))
        outs = await self.calls.chat_call(entry, chat_call(req, self.cfg))
        if req.stream:
            include = bool((req.stream_options or {}).get("include_usage"))
            return stream_response(sse(list(chat_chunks(outs, bool(req.logprobs), include, self._token_text))))
        return JSONResponse(chat_body(outs, bool(req.logprobs), self._token_text))

    async def _completions(self, request: Request) -> Response:
        return await self._serve(request, self._completion_call)

    async def _completion_call(self, entry: Entry, request: Request) -> Response:
        req = parse_request(CompletionRequest, await self._body(request, entry, "prompt"))
        out = await self.calls.completion_call(entry, req.prompt, asked_of(req))
        logprobs = wants_logprobs(req)
        if req.stream:
            include = bool((req.stream_options or {}).get("include_usage"))
            return stream_response(sse(list(completion_chunks(out, logprobs, include, self._token_text))))
        return JSONResponse(completion_body(out, logprobs, self._token_text))

    async def _responses(self, request: Request) -> Response:
        return await self._serve(request, self._responses_call)

    async def _responses_call(self, entry: Entry, request: Request) -> Response:
        req = responses_api.parse_responses_request(await self._body(request, entry, "input"))
        history = responses_api.previous(entry.responses, req.previous_response_id)
        call, conversation = responses_api.responses_call(req, history, self.cfg)
        created = time.time()
        (out,) = await self.calls.chat_call(entry, call)
        response_id = f"resp_{secrets.token_hex(12)}"
        if req.store is not False:
            entry.responses[response_id] = (*conversation, returned_message(out.parsed))
        body = responses_api.response_body(out, req, response_id, created)
        if req.stream:
            return stream_response(named_events(responses_api.response_events(body)))
        return JSONResponse(body)

    async def _messages(self, request: Request) -> Response:
        return await self._serve(request, self._messages_call)

    async def _messages_call(self, entry: Entry, request: Request) -> Response:
        req = parse_request(anthropic.MessagesRequest, await self._body(request, entry, "messages"))
        (out,) = await self.calls.chat_call(entry, anthropic.messages_call(req, self.cfg))
        body = anthropic.message_body(out, out.stop_sequence)
        if req.stream:
            return stream_response(named_events(anthropic.message_events(body)))
        return JSONResponse(body)

    async def _count_tokens(self, request: Request) -> Response:
        return await self._serve(request, self._count_tokens_call)

    async def _count_tokens_call(self, entry: Entry, request: Request) -> Response:
        """Anthropic's token count: the request as the template renders it, tokenised (nothing recorded)."""
        req = parse_request(anthropic.CountTokensRequest, await self._body(request, entry, "messages"))
        messages = anthropic.template_messages(req, self.cfg.max_messages)
        tools = anthropic.template_tools(req.tools, self.cfg.max_tools)
        entry.session.check_length([messages, tools], "messages")

        def count() -> int:
            return len(self.chat.encode(self.chat.render(messages, True, tools)))

        return JSONResponse({"input_tokens": await asyncio.get_running_loop().run_in_executor(self._tokenize, count)})

    def _after(self, request: Request) -> None:
        """After a request with a large body (read, or refused and discarded as it arrives), give the
        allocator's free memory back: once, shortly after the last such request (off the loop)."""
        length = request.headers.get("content-length", "")
        if getattr(request.state, "large_body", False) or (length.isdigit() and int(length) > _LARGE_BODY):
            if self._trim is not None:
                self._trim.cancel()
            self._trim = asyncio.get_running_loop().call_later(
                _TRIM_AFTER_S, lambda: self._tokenize.submit(release_free_memory))

    def _token_text(self, token_id: int) -> str:
        return self.chat.tokenizer.decode([token_id])

    # --- errors --------------------------------------------------------------------------------------
    async def _error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        anthropic_route = request.url.path.endswith(("/messages", "/messages/count_tokens"))
        body = anthropic.error_body(exc) if anthropic_route else exc.body()
        return JSONResponse(body, status_code=exc.status, headers=exc.headers())

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = "not_found" if exc.status_code == 404 else "method_not_allowed" if exc.status_code == 405 else "http_error"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code in (404, 405):
            message += f"; the gateway serves {ROUTE_LIST}"
        return await self._error(request, GatewayError(exc.status_code, message, code=code))

    async def _bug(self, request: Request, exc: Exception) -> Response:
        log.exception("agent gateway: %s %s failed", request.method, request.url.path, exc_info=exc)
        error = GatewayError(500, f"internal error of the rollart gateway: {type(exc).__name__}: {exc}",
                             code="internal_error", kind="server_error")
        return await self._error(request, error)
