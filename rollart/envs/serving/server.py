"""The env server: one domain's environments over HTTP, for `remote` envs on other machines.

In: the domain's name, its env factory, `envs.server` limits, the reset/step timeouts of `envs`, an
optional warm pool size, and the server token. Out: `EnvServer.start()` → listening on
`envs.server.host:port` (127.0.0.1 unless told otherwise); `rollart env serve DOMAIN` runs one.

The protocol (JSON over HTTP/1.1; every error is `{"error": {"code", "message"}}`):

| call | auth | body | answer |
|---|---|---|---|
| `GET /v1/health` | — | — | `{"domain", "env", "sessions", "max_sessions"}` |
| `POST /v1/reset` | server token | `{"seed": int or null}` | `{"session", "token", "observation", "info"}` |
| `POST /v1/sessions/<id>/step` | session token | `{"action": str}` | `{"observation", "reward", "terminated", "truncated", "info"}` |
| `POST /v1/sessions/<id>/action` | session token | `{"policy": "expert" or "random"}` | `{"action"}` |
| `DELETE /v1/sessions/<id>` | session token | — | `{"closed": true}` |

Auth is `Authorization: Bearer <token>`. `reset` opens a session (one trajectory: a fresh env, reset with
the seed) and answers a token of its own: a session's calls need that token, so one trajectory can never
step, read or close another's. Status codes: 400 a body that is not the call's JSON, 401 a wrong token,
404 an unknown (or closed) session, 408 a body slower than 30 s, 409 a call while another of the same
session runs, 413 a body over `max_body_kb`, 429 `max_sessions` open, 502 the env raised (the message is
its error), 504 it timed out (`envs.reset_timeout_s`, `envs.step_timeout_s`); below the app
(`http_guard.py`, the defaults of `HttpLimits`) 503 past 4096 connections, 408 a request head slower than
10 s, 431 one past 64 KiB or 128 fields, 400 a head that does not parse.

Guarantees: bodies are bounded before they are read; every env call has a timeout; a session idle for
`idle_timeout_s` is closed (a client that died leaves nothing behind); `stop()` closes every session's
env and the warm pool; sync env calls run on `threads` threads, never on the server's event loop.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollart.config import EnvServerConfig, EnvsConfig
from rollart.envs.expert import expert_action, random_action
from rollart.envs.episode import error_text
from rollart.envs.serving.http_serving import BodyTooLarge, BodyTooSlow, ThreadedServer, read_bounded
from rollart.envs.protocol import AsyncEnv, EnvFactory
from rollart.envs.warm_pool import WarmPool, build_prepared

log = logging.getLogger(__name__)


class EnvServerError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class _Session:
    env: AsyncEnv
    token: str
    last_used: float
    busy: bool = False


def _json_safe(value: Any) -> Any:
    """`value` as JSON data (what is not JSON becomes its str)."""
    return json.loads(json.dumps(value, default=str))


class EnvServer:
    def __init__(self, domain: str, env_spec: str, factory: EnvFactory, cfg: EnvServerConfig, envs: EnvsConfig,
                 *, token: str, pool_size: int = 0) -> None:
        self.domain, self.env_spec, self.cfg, self.envs = domain, env_spec, cfg, envs
        self._factory, self._token = factory, token
        self._executor = ThreadPoolExecutor(cfg.threads, thread_name_prefix=f"env-server-{domain}")
        self.pool = (WarmPool(domain, factory, pool_size, executor=self._executor,
                              prepare_timeout_s=envs.warm_pool.prepare_timeout_s, parallel=envs.warm_pool.parallel)
                     if pool_size else None)
        self._sessions: dict[str, _Session] = {}
        self._reaper: Any = None
        self._http: ThreadedServer | None = None
        self._url = ""
        self.app = Starlette(routes=[
            Route("/v1/health", self._health, methods=["GET"]),
            Route("/v1/reset", self._reset, methods=["POST"]),
            Route("/v1/sessions/{sid}/step", self._step, methods=["POST"]),
            Route("/v1/sessions/{sid}/action", self._action, methods=["POST"]),
            Route("/v1/sessions/{sid}", self._close, methods=["DELETE"]),
        ], exception_handlers={EnvServerError: self._error, Exception: self._bug})

    # --- lifecycle (any thread) ----------------------------------------------------------------------
    def start(self) -> EnvServer:
        self._http = ThreadedServer(self.app, self.cfg.host, self.cfg.port, name=f"env server ({self.domain})").start()
        self._url = self._http.url
        self._reaper = asyncio.run_coroutine_threadsafe(self._reap_idle(), self._http.loop)  # type: ignore[arg-type]
        if self.pool is not None:
            self._http.loop.call_soon_threadsafe(self.pool.start)  # type: ignore[union-attr]
        return self

    @property
    def url(self) -> str:
        """Where it serves (kept after `stop`, to name the server in messages)."""
        assert self._url, "the env server is not started"
        return self._url

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Close every session's env and the warm pool, then stop serving."""
        http = self._http
        if http is None:
            return
        if http.loop is not None and http.loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self._close_all(), http.loop).result(timeout_s)
            except Exception as exc:  # stop goes on: the thread pool and the server still end
                log.warning("env server %s: closing sessions failed: %s", self.domain, error_text(exc))
        http.stop()
        self._http = None
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _close_all(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(self._close_env(s.env) for s in sessions))
        if self.pool is not None:
            await self.pool.close()

    async def _close_env(self, env: AsyncEnv) -> None:
        try:
            await asyncio.wait_for(env.close(), self.envs.reset_timeout_s)
        except Exception as exc:
            log.warning("env server %s: env.close failed: %s", self.domain, error_text(exc))

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(min(self.cfg.idle_timeout_s / 4, 30.0))
            cutoff = time.monotonic() - self.cfg.idle_timeout_s
            for sid, session in list(self._sessions.items()):
                if session.last_used < cutoff and not session.busy:
                    log.info("env server %s: session %s idle for %gs, closed", self.domain, sid, self.cfg.idle_timeout_s)
                    self._sessions.pop(sid, None)
                    await self._close_env(session.env)

    # --- requests (the server's loop) ------------------------------------------------------------------
    async def _error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, EnvServerError)
        return JSONResponse({"error": {"code": exc.code, "message": exc.message}}, status_code=exc.status)

    async def _bug(self, request: Request, exc: Exception) -> Response:
        log.exception("env server %s: error serving %s", self.domain, request.url.path, exc_info=exc)
        return JSONResponse({"error": {"code": "internal", "message": error_text(exc)}}, status_code=500)

    @staticmethod
    def _authorized(request: Request, token: str) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())

    async def _body(self, request: Request, field: str, kinds: tuple[type, ...]) -> Any:
        try:
            raw = await read_bounded(request, self.cfg.max_body_kb * 1024)
        except BodyTooLarge:
            raise EnvServerError(413, "payload_too_large",
                                 f"request body over {self.cfg.max_body_kb} KiB (envs.server.max_body_kb)") from None
        except BodyTooSlow as exc:
            raise EnvServerError(408, "request_timeout", str(exc)) from None
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            raise EnvServerError(400, "invalid_json", "the request body is not valid JSON") from None
        if not isinstance(body, dict) or field not in body or not isinstance(body[field], kinds) \
                or isinstance(body[field], bool) and bool not in kinds:
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise EnvServerError(400, "invalid_field", f"the body must be a JSON object with '{field}': {names}")
        return body[field]

    def _session(self, request: Request) -> tuple[str, _Session]:
        sid = request.path_params["sid"]
        session = self._sessions.get(sid)
        if session is None:
            raise EnvServerError(404, "session_not_found", f"no open session {sid!r} on this env server")
        if not self._authorized(request, session.token):
            raise EnvServerError(401, "invalid_token", f"wrong or missing token for session {sid!r}")
        return sid, session

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"domain": self.domain, "env": self.env_spec, "sessions": len(self._sessions),
                             "max_sessions": self.cfg.max_sessions})

    async def _reset(self, request: Request) -> Response:
        if not self._authorized(request, self._token):
            raise EnvServerError(401, "invalid_token", "wrong or missing server token (envs.server.token_env)")
        seed = await self._body(request, "seed", (int, type(None)))
        if len(self._sessions) >= self.cfg.max_sessions:
            raise EnvServerError(429, "too_many_sessions",
                                 f"{len(self._sessions)} sessions are open, the limit (envs.server.max_sessions)")
        env: AsyncEnv | None = None
        try:
            if self.pool is not None:
                env, _ = await asyncio.wait_for(self.pool.acquire(), self.envs.reset_timeout_s)
            else:
                env = await build_prepared(self._factory, self._executor, self.envs.reset_timeout_s)
            observation, info = await asyncio.wait_for(env.reset(seed), self.envs.reset_timeout_s)
            info = _json_safe(info)
        except TimeoutError:
            await self._discard(env)
            raise EnvServerError(504, "reset_timeout", f"env.reset timed out after {self.envs.reset_timeout_s:g}s") from None
        except Exception as exc:
            await self._discard(env)
            raise EnvServerError(502, "reset_failed", error_text(exc)) from None
        sid, token = secrets.token_urlsafe(12), secrets.token_urlsafe(24)
        self._sessions[sid] = _Session(env, token, time.monotonic())
        return JSONResponse({"session": sid, "token": token, "observation": observation, "info": info})

    async def _discard(self, env: AsyncEnv | None) -> None:
        if env is not None:
            await self._close_env(env)

    async def _exclusive(self, session: _Session, sid: str, call: Any) -> Any:
        if session.busy:
            raise EnvServerError(409, "session_busy", f"session {sid!r} is running another call")
        session.busy = True
        try:
            return await call
        finally:
            session.busy = False
            session.last_used = time.monotonic()

    async def _step(self, request: Request) -> Response:
        sid, session = self._session(request)
        action = await self._body(request, "action", (str,))
        try:
            obs, reward, terminated, truncated, info = await self._exclusive(
                session, sid, asyncio.wait_for(session.env.step(action), self.envs.step_timeout_s))
        except TimeoutError:
            raise EnvServerError(504, "step_timeout", f"env.step timed out after {self.envs.step_timeout_s:g}s") from None
        except EnvServerError:
            raise
        except Exception as exc:
            raise EnvServerError(502, "step_failed", error_text(exc)) from None
        return JSONResponse({"observation": obs, "reward": reward, "terminated": terminated, "truncated": truncated,
                             "info": _json_safe(info)})

    async def _action(self, request: Request) -> Response:
        sid, session = self._session(request)
        policy = await self._body(request, "policy", (str,))
        if policy not in ("expert", "random"):
            raise EnvServerError(400, "invalid_field", f"'policy' must be 'expert' or 'random', got {policy!r:.40}")
        choose = expert_action if policy == "expert" else random_action
        loop = asyncio.get_running_loop()
        try:
            action = await self._exclusive(session, sid, loop.run_in_executor(self._executor, choose, session.env))
        except EnvServerError:
            raise
        except Exception as exc:
            raise EnvServerError(502, "action_failed", error_text(exc)) from None
        return JSONResponse({"action": action})

    async def _close(self, request: Request) -> Response:
        sid, session = self._session(request)
        self._sessions.pop(sid, None)
        await self._close_env(session.env)
        return JSONResponse({"closed": True})
