"""The reward service's request handling, free of Ray and HTTP frameworks (the Serve replica wraps it).

In: one request — its headers (lower-case names) and its body as an async stream of chunks.
Out: `(HTTP status, JSON-able dict)`; answers and errors are those of protocol.py.

Per request, in order (every refusal is a JSON 4xx whose `field` names what was wrong):
1. auth — when the service has a secret, `Authorization: Bearer <token>` must be it or a job token derived
   from it (tokens.py), else 401 `unauthorized`; the token decides the request's principal;
2. headers and size — a malformed `Content-Length` or `Idempotency-Key` (1–256 printable ASCII
   characters) is 400; a `Content-Length` over `reward.max_payload_mb`, or a body that grows past it while
   streaming, is 413 `payload_too_large` before it is parsed;
3. parse — JSON (400 `bad_request`) and the strict payload schema (422 `bad_request` naming the field);
4. exactly once — with an `Idempotency-Key` (the clients send `<run id>/<attempt>/<trajectory id>`), the
   key `<principal>|<Idempotency-Key>` and the SHA-256 of the body are claimed in the claim book (claims.py).
   Done → the stored answer, `replayed: true`. Busy → wait for the owner's answer. Used with a different
   body → 409 `conflict`, never a replay. Without the header nothing is remembered (no replay possible).
   Owner → score (bounded by `reward.timeout_s`), record, answer; a scoring error releases the key and
   answers with the error text: 422 `bad_request` when the trajectory cannot be scored (`RewardInputError`),
   501 `reward_unavailable` when this service cannot run the reward (the code sandbox refuses), else 500
   `reward_failed` (retryable). When the reward function itself raised (not a timeout, not TRL's None for
   "cannot score"), the error body's `fault` holds its error and traceback: the domain's fault, which the
   client's circuit breaker counts.
5. cold start — a request first sent (`X-Rollart-Sent-At`, client wall clock, the same on every retry)
   before this replica existed was waiting for a replica to start: `cold_start: true` in the answer; a
   replay keeps the flag of the scoring it replays (its first try may have timed out waiting for it).
Faults (`ServiceFaults`) can be injected after a score is recorded — a 500 or a delay past the client's
timeout — which is exactly where a non-idempotent service would score twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import re
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Protocol

from rollart.config import RunConfig
from rollart.reward.metrics import BusyClock
from rollart.reward import tokens
from rollart.reward.protocol import PayloadError, RewardInputError, call_reward, parse_payload
from rollart.reward.registry import BUILTINS, RewardFns
from rollart.reward.shapes import Unscorable
from rollart.sandbox import SandboxUnavailable
from rollart.types import Fault

log = logging.getLogger("rollart.reward")


@dataclass(frozen=True)
class ServiceFaults:
    """Failures the service injects on purpose (tests, chaos runs), each after the score is recorded."""

    error_prob: float = 0.0  # answer 500 instead of the score
    delay_prob: float = 0.0  # sleep `delay_s` before answering (past the client's timeout)
    delay_s: float = 0.0
    seed: int = 0


class ClaimBook(Protocol):
    """What the handler needs of the claim book (in-process, or the shared Ray actor)."""

    async def claim(self, key: str, digest: str) -> tuple[str, Any]: ...

    async def complete(self, key: str, token: int, answer: dict[str, Any]) -> bool: ...

    async def release(self, key: str, token: int) -> None: ...

    async def wait(self, key: str, timeout_s: float) -> dict[str, Any] | None: ...

    def report(self, replica: str, busy_s: float, alive_s: float) -> None: ...


def error(status: int, code: str, message: str, field: str = "", fault: Fault | None = None
          ) -> tuple[int, dict[str, Any]]:
    body: dict[str, Any] = {"error": message, "code": code}
    if field:
        body["field"] = field
    if fault is not None:  # the reward function's own failure, for the client's circuit breaker
        body["fault"] = {"error": fault.error, "traceback": fault.traceback}
    return status, body


_KEY = re.compile(r"^[\x21-\x7e]{1,256}$")  # printable ASCII, no spaces


def claim_key(principal: str, idempotency_key: str) -> str:
    """The claim book's key of a request: its sender's principal (tokens.py) and its Idempotency-Key."""
    return f"{principal}|{idempotency_key}"


class RewardHandler:
    def __init__(
        self,
        cfg: RunConfig,
        claims: ClaimBook,
        *,
        token: str | None,
        replica: str,
        faults: ServiceFaults | None = None,
    ) -> None:
        self.cfg = cfg
        self.claims = claims
        self.token = token
        self.replica = replica
        self.faults = faults or ServiceFaults()
        self.fns = RewardFns(cfg)
        self.busy = BusyClock()
        self.created_at = time.time()
        self.max_bytes = int(cfg.reward.max_payload_mb * 2**20)
        self._rng = random.Random(self.faults.seed)

    def _principal(self, headers: Mapping[str, str]) -> str | None:
        """Who sent the request: "" (the operator's secret, or no auth configured), a job name, or None."""
        if not self.token:
            return ""
        scheme, _, presented = headers.get("authorization", "").partition(" ")
        return tokens.principal(self.token, presented.strip()) if scheme.lower() == "bearer" else None

    async def _read(self, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> bytes | None:
        """The body, or None when it is over the limit (declared or streamed)."""
        if int(headers.get("content-length", "0")) > self.max_bytes:
            return None
        chunks, size = [], 0
        async for chunk in body:
            size += len(chunk)
            if size > self.max_bytes:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    def _fn_spec(self, domain: str, requested: Any) -> str:
        dom = self.cfg.domains.get(domain)
        if dom is not None:
            return dom.reward.fn
        if isinstance(requested, str) and requested in BUILTINS:
            return requested  # a domain this service was not configured with: built-ins only, never imports
        raise PayloadError(
            f"domain: {domain!r} is not configured on this service (domains: {sorted(self.cfg.domains)}) and "
            f"fn {requested!r} is not a built-in {list(BUILTINS)}", "domain"
        )

    async def handle(self, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> tuple[int, dict[str, Any]]:
        try:
            return await self._handle(headers, body)
        except Exception as exc:  # noqa: BLE001 — a bug must still answer JSON (and say so in the log)
            log.exception("reward request failed unexpectedly")
            return error(500, "internal", f"internal error: {type(exc).__name__}: {exc}")

    async def _handle(self, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> tuple[int, dict[str, Any]]:
        principal = self._principal(headers)
        if principal is None:
            return error(401, "unauthorized", "missing or wrong bearer token (Authorization: Bearer <token>)",
                         "Authorization")
        length = headers.get("content-length", "0")
        if not (length.isascii() and length.isdigit() and len(length) <= 18):
            return error(400, "bad_request", f"Content-Length: {length[:40]!r} is not a byte count", "Content-Length")
        key = headers.get("idempotency-key")
        if key is not None and not _KEY.match(key):
            return error(400, "bad_request", "Idempotency-Key: must be 1–256 printable ASCII characters without "
                         f"spaces, got {key[:60]!r}", "Idempotency-Key")
        raw = await self._read(headers, body)
        if raw is None:
            return error(413, "payload_too_large", f"request body over reward.max_payload_mb={self.cfg.reward.max_payload_mb}",
                         "body")
        try:
            payload = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, an int over 4300 digits, deep nesting
            return error(400, "bad_request", f"body is not JSON: {str(exc)[:200]}", "body")
        try:
            trajectory, fn = parse_payload(payload)
            spec = self._fn_spec(trajectory.domain, fn)
        except PayloadError as exc:
            return error(422, "bad_request", str(exc), exc.field)
        cold = self._cold(headers)
        if key is None:  # nothing to remember it by: scored, never replayed
            return await self._score(None, 0, trajectory, spec, cold)
        given, key = key, claim_key(principal, key)
        state, value = await self.claims.claim(key, hashlib.sha256(raw).hexdigest())
        if state == "conflict":
            return error(409, "conflict", f"Idempotency-Key {given!r} was already used with a "
                         "different payload (a key names one scoring: run id, attempt and trajectory id)",
                         "Idempotency-Key")
        if state == "busy":
            value = await self.claims.wait(key, self.cfg.reward.timeout_s)
            if value is None:
                return error(503, "busy", f"Idempotency-Key {given!r} is being scored by another request; retry")
            state = "done"
        if state == "done":
            return 200, {**value, "replayed": True, "cold_start": cold or bool(value.get("cold_start"))}
        return await self._score(key, value, trajectory, spec, cold)

    def _cold(self, headers: Mapping[str, str]) -> bool:
        try:
            return float(headers.get("x-rollart-sent-at", "inf")) < self.created_at
        except ValueError:
            return False

    async def _score(self, key: str | None, token: int, trajectory: Any, spec: str, cold: bool) -> tuple[int, dict[str, Any]]:
        t0 = time.monotonic()
        self.busy.enter()
        try:
            out = await asyncio.wait_for(call_reward(self.fns.get(spec), trajectory, spec), self.cfg.reward.timeout_s)
        except Exception as exc:  # noqa: BLE001 — any reward failure becomes a JSON error
            if key is not None:
                await self.claims.release(key, token)
            detail = "timed out" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
            message = f"reward fn {spec!r} failed on {trajectory.trajectory_id}: {detail}"
            if isinstance(exc, SandboxUnavailable):  # this service cannot run it at all
                return error(501, "reward_unavailable", message)
            own = not isinstance(exc, (asyncio.TimeoutError, Unscorable))  # the function's own failure
            fault = Fault.of("reward", exc) if own else None
            if isinstance(exc, RewardInputError):  # the request's fault: retrying cannot help
                return error(422, "bad_request", message, fault=fault)
            return error(500, "reward_failed", message, fault=fault)
        finally:
            self.busy.exit()
            self.claims.report(self.replica, self.busy.busy_s, self.busy.alive_s)
        answer = {
            "trajectory_id": trajectory.trajectory_id,
            "reward": out.reward,
            "per_turn": list(out.per_turn) if out.per_turn is not None else None,
            "details": _jsonable(out.details),
            "replica": self.replica,
            "score_s": time.monotonic() - t0,
            "cold_start": cold,  # kept: a retry replayed by a warm replica still waited for this cold start
        }
        if key is not None:
            await self.claims.complete(key, token, answer)
        if self.faults.error_prob and self._rng.random() < self.faults.error_prob:
            return error(500, "injected", "injected fault after scoring")
        if self.faults.delay_prob and self._rng.random() < self.faults.delay_prob:
            await asyncio.sleep(self.faults.delay_s)
        return 200, {**answer, "replayed": False}

    def close(self) -> None:
        self.fns.close()


def _jsonable(details: Mapping[str, Any]) -> dict[str, Any]:
    """Details as JSON can carry them (anything else as its repr)."""
    out = {}
    for k, v in details.items():
        try:
            json.dumps(v)
            out[str(k)] = v
        except (TypeError, ValueError):
            out[str(k)] = repr(v)
    return out
