"""Reward clients: score one trajectory on one backend, with timeouts, retries and bounded concurrency.

In: a finished `Trajectory` and its reward spec. Out: a `RewardResult` — never an exception. A reward
that still fails after `reward.retries` further tries (an outage's tries apart, below) comes back as
`ok=False` with the last error, so the control plane ends that trajectory FAILED with the reason and the
batch goes on.

- `HttpRewardClient` (backends `serverless` and `http`): POSTs the payload of protocol.py — alone, or, to
  rollart's own service, batched with the trajectories that end within `reward.batch_ms` (batching.py) — with
  `Idempotency-Key: <run id>/<attempt>/<trajectory id>` (`run_key` = run id and attempt, see router.py; the
  service scores a key once, answers retries from its claim book, and refuses the key with another payload),
  `Authorization: Bearer <token>` and `X-Rollart-Sent-At` (when the first try left: cold-start detection). Retried: connection
  errors, timeouts (`reward.timeout_s` per try), dropped responses, HTTP 408/429 (the standard "try again
  later") and 5xx but 501. Not retried: every other 4xx (bad token, payload too large, bad payload, a key
  conflict) and 501 (the service cannot run the reward) — retrying cannot fix them.
- `LocalRewardClient` (backend `local`): awaits the reward function in this process (sync functions in a
  worker thread; `math` and `code` use their own process pool / sandbox processes), bounded by
  `reward.timeout_s` per try; an exception or timeout is retried the same way, except a
  `RewardInputError` (the trajectory cannot be scored) or `SandboxUnavailable` (the sandbox refuses).
  `score_group` scores a group with one call of a batched (TRL-shaped) function.
A failure of the reward function itself — it raised (not a timeout, not the sandbox refusing, not TRL's None
for "cannot score") or returned no score — comes back with a `Fault` (a service sends it in its error body):
the domain's own code failed, which the rollout's circuit breaker counts, as it counts an env that raises.
Both: at most `reward.max_in_flight` tries at once per client (waiting in backoff does not hold a slot);
backoff before try k (k ≥ 1) is uniform in [0, min(backoff_max_s, backoff_s · 2^(k-1))] ("full jitter").
An outage of a service (HTTP clients: connection refused or reset, timeouts, 502/503/504 — down or hung;
not a 500, which is the reward itself failing) is waited out past `reward.retries`, for up to
`reward.outage_budget_s` from the first try, calling the client's `on_outage` before each such try (the
router brings a dead service back there): an outage costs retries (`outage_retries`), not trajectories —
its tries do not use up `reward.retries` for the failures the service answers; past the budget the scoring
fails as before.
httpx (async, HTTP/1.1 keep-alive) is used for HTTP: one connection pool per event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import secrets
import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Mapping, Sequence

import httpx

from rollart.base.deadlines import Deadlines
from rollart.config import RewardConfig
from rollart.reward.batching import RequestBatcher
from rollart.reward.metrics import BusyClock, LatencyWindow
from rollart.reward.protocol import RewardFn, RewardInputError, RewardOutput, call_reward, normalise, to_payload
from rollart.reward.shapes import Unscorable
from rollart.sandbox import SandboxUnavailable
from rollart.types import MAX_TRACEBACK_CHARS, Fault, RewardResult, Trajectory

# 501: the service cannot run this reward at all (e.g. its code sandbox refuses) — retrying cannot help
RETRYABLE_STATUS = frozenset({408, 429}) | (frozenset(range(500, 600)) - {501})
# the service (or the gateway before it) is not there: an outage, waited out within reward.outage_budget_s
OUTAGE_STATUS = frozenset({502, 503, 504})


def backoff_delay(attempt: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Full-jitter exponential backoff before retry number `attempt` (1 = the first retry)."""
    return rng.uniform(0.0, min(max_s, base_s * 2 ** (attempt - 1)))


@dataclass
class BackendStats:
    """What one backend's client measured (summed into `RewardRouter.metrics()`)."""

    latency: LatencyWindow = field(default_factory=LatencyWindow)
    busy: BusyClock = field(default_factory=BusyClock)
    requests: int = 0
    failures: int = 0
    retries: int = 0
    cold_starts: int = 0
    replays: int = 0
    outage_retries: int = 0  # tries past `reward.retries` while a service was down (within the budget)


class _Tries:
    """The retry loop shared by both clients: slots, backoff, bookkeeping."""

    def __init__(self, cfg: RewardConfig, stats: BackendStats, seed: int | None = None,
                 on_outage: Callable[[], Awaitable[None]] | None = None) -> None:
        self.cfg = cfg
        self.stats = stats
        self.rng = random.Random(seed)
        self.on_outage = on_outage  # set: the backend is a service whose outages are waited out
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()

    def slots(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._slots:
            self._slots[loop] = asyncio.Semaphore(self.cfg.max_in_flight)
        return self._slots[loop]

    async def run(
        self, trajectory: Trajectory, backend: str, attempt_fn: Callable[[], Any]
    ) -> RewardResult:
        """`attempt_fn()` → (result | None, retryable, error, outage: the service is down or hung, fault: the
        reward function's own failure or None). Returns the first success or the failure (with the last try's
        fault: a function that raised on every try is the domain's fault, counted by its circuit breaker)."""
        t0 = time.monotonic()
        self.stats.requests += 1
        error = ""
        fault: Fault | None = None
        tries, answered_failures, outage = 0, 0, False
        while True:
            if tries > self.cfg.retries:
                # Past the retries, an outage goes on within its budget, and a failure the service answered
                # goes on while those are still within the retries: tries an outage took do not count
                # against them (timeouts through an overload, then an answer to retry, lost the scoring).
                if outage:
                    if self.on_outage is None or time.monotonic() - t0 >= self.cfg.outage_budget_s:
                        break
                    self.stats.outage_retries += 1
                    await self.on_outage()
                elif answered_failures > self.cfg.retries:
                    break
            tries += 1
            if tries > 1:
                self.stats.retries += 1
                await asyncio.sleep(backoff_delay(tries - 1, self.cfg.backoff_s, self.cfg.backoff_max_s, self.rng))
            async with self.slots():
                self.stats.busy.enter()
                try:
                    result, retryable, error, outage, fault = await attempt_fn()
                finally:
                    self.stats.busy.exit()
            if result is not None:
                latency = time.monotonic() - t0
                self.stats.latency.add(latency)
                return RewardResult(
                    trajectory.trajectory_id, result["reward"], attempts=tries, backend=backend,
                    latency_s=latency, details=result["details"],
                )
            if not retryable:
                break
            answered_failures += not outage
        self.stats.failures += 1
        return RewardResult(
            trajectory.trajectory_id, 0.0, ok=False, attempts=tries, backend=backend,
            latency_s=time.monotonic() - t0,
            error=f"{backend} reward failed after {tries} tr{'y' if tries == 1 else 'ies'}: {error}", fault=fault,
        )


async def _wait_it_out() -> None:
    """An outage of a service nobody here can restart (an external endpoint): just try again."""


def _details(answer: dict[str, Any]) -> dict[str, Any]:
    details = dict(answer.get("details") or {})
    if answer.get("per_turn") is not None:
        details["per_turn"] = tuple(answer["per_turn"])
    for key in ("replica", "replayed", "cold_start", "score_s"):
        if key in answer:
            details[key] = answer[key]
    return details


class HttpRewardClient:
    def __init__(
        self,
        url: str,
        cfg: RewardConfig,
        *,
        token: str | None = None,
        backend: str = "http",
        transport: httpx.AsyncBaseTransport | None = None,
        seed: int | None = None,
        run_key: str | None = None,
        on_outage: Callable[[], Awaitable[None]] | None = None,
        outage_status: frozenset[int] = frozenset(),
        batched: bool = False,
    ) -> None:
        """`run_key`: `<run id>/<attempt>` prefixed to every idempotency key (default: a fresh random run).
        `on_outage`: awaited before each try past `reward.retries` while the service is out (see above);
        `outage_status`: more HTTP statuses that mean the service is out (for rollart's own service, 404:
        its route is gone with its app). `batched`: the service is rollart's own, which takes batches —
        trajectories that end within `reward.batch_ms` go in one request (batching.py; 0 ms: never)."""
        self.url = url
        self.run_key = run_key or f"{secrets.token_hex(16)}/0"
        self.outage_status = OUTAGE_STATUS | outage_status
        self.retry_status = RETRYABLE_STATUS | self.outage_status
        self.cfg = cfg
        self.token = token
        self.backend = backend
        self.transport = transport
        self.stats = BackendStats()
        self._tries = _Tries(cfg, self.stats, seed, on_outage=on_outage or _wait_it_out)
        self._batcher = (RequestBatcher(self._post_batch, cfg.batch_ms, cfg.max_batch, int(cfg.max_payload_mb * 2**20))
                         if batched and cfg.batch_ms > 0 else None)
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if loop not in self._clients:
            limits = httpx.Limits(max_connections=self.cfg.max_in_flight, max_keepalive_connections=self.cfg.max_in_flight)
            self._clients[loop] = httpx.AsyncClient(transport=self.transport, limits=limits, timeout=self.cfg.timeout_s)
        return self._clients[loop]

    def idempotency_key(self, trajectory: Trajectory, run_key: str | None = None) -> str:
        """`<run key>/<trajectory id>` (an over-long trajectory id by its digest: keys are ≤ 256 chars)."""
        key = f"{run_key or self.run_key}/{trajectory.trajectory_id}"
        if len(key) > 256 or not key.isascii() or not key.isprintable() or " " in key:
            key = f"{run_key or self.run_key}/sha256:{hashlib.sha256(trajectory.trajectory_id.encode()).hexdigest()}"
        return key

    async def score(self, trajectory: Trajectory, fn: str, run_key: str | None = None) -> RewardResult:
        """Score on the service; `run_key` overrides the client's (an evaluation's own run)."""
        text = json.dumps(to_payload(trajectory, fn))
        key = self.idempotency_key(trajectory, run_key)
        sent_at = time.time()  # when the first try left: a replica created after it means a cold start

        async def exchange() -> tuple[int, Any]:
            if self._batcher is not None:
                return await self._batcher.send(key, sent_at, text)
            headers = {**self._auth(), "content-type": "application/json", "idempotency-key": key,
                       "x-rollart-sent-at": repr(sent_at)}
            resp = await self._client().post(self.url, content=text.encode(), headers=headers)
            try:
                return resp.status_code, resp.json()
            except ValueError:
                return resp.status_code, {"error": resp.text[:200]}

        async def attempt() -> tuple[dict[str, Any] | None, bool, str, bool, Fault | None]:
            try:
                status, answer = await exchange()
            except httpx.TimeoutException as exc:
                return None, True, f"timeout after {self.cfg.timeout_s}s ({type(exc).__name__})", True, None
            except httpx.TransportError as exc:
                return None, True, f"{type(exc).__name__}: {exc}", True, None
            if status == 200 and isinstance(answer, dict) and isinstance(answer.get("reward"), (int, float)):
                self.stats.cold_starts += bool(answer.get("cold_start"))
                self.stats.replays += bool(answer.get("replayed"))
                return {"reward": float(answer["reward"]), "details": _details(answer)}, False, "", False, None
            message = f"HTTP {status}: {answer.get('error', answer) if isinstance(answer, dict) else answer}"
            return (None, status in self.retry_status or status == 200, message, status in self.outage_status,
                    _fault_of(answer))

        return await self._tries.run(trajectory, self.backend, attempt)

    def _auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"} if self.token else {}

    async def _post_batch(self, body: bytes) -> httpx.Response:
        return await self._client().post(self.url, content=body,
                                         headers={**self._auth(), "content-type": "application/json"})

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()


class LocalRewardClient:
    backend = "local"

    def __init__(self, get_fn: Callable[[str], RewardFn], cfg: RewardConfig, seed: int | None = None) -> None:
        self.get_fn = get_fn
        self.cfg = cfg
        self.stats = BackendStats()
        self._tries = _Tries(cfg, self.stats, seed)
        self._deadlines = Deadlines(cfg.timeout_s)

    async def score(self, trajectory: Trajectory, fn: str) -> RewardResult:
        async def attempt() -> tuple[dict[str, Any] | None, bool, str, bool, Fault | None]:
            try:
                async with self._deadlines.bound():  # (in this task; one timer for every score in flight)
                    out = await call_reward(self.get_fn(fn), trajectory, fn)
            except TimeoutError:
                return None, True, f"reward fn {fn!r} timed out after {self.cfg.timeout_s}s", False, None
            except Exception as exc:  # noqa: BLE001 — a failing reward becomes a failed result, never a raise
                return failed(fn, exc)
            return succeeded(out)

        return await self._tries.run(trajectory, self.backend, attempt)

    async def score_group(self, trajectories: Sequence[Trajectory], fn: str) -> list[RewardResult]:
        """Score a whole group with one call of a batched function (TRL's shape: `ShapedReward.score_batch`);
        the call's tries are those of one `score`, each trajectory's result its own value (or its None:
        unscorable, not a fault). A function that is not batched is called per trajectory, concurrently."""
        reward = self.get_fn(fn)
        if not getattr(reward, "batched", False):
            return list(await asyncio.gather(*(self.score(t, fn) for t in trajectories)))
        first = trajectories[0]

        async def attempt() -> tuple[dict[str, Any] | None, bool, str, bool, Fault | None]:
            try:
                async with self._deadlines.bound():
                    outs = await reward.score_batch(trajectories)  # type: ignore[attr-defined]
            except TimeoutError:
                return None, True, f"reward fn {fn!r} timed out after {self.cfg.timeout_s}s", False, None
            except Exception as exc:  # noqa: BLE001
                return failed(fn, exc)
            return {"reward": 0.0, "details": {"outs": outs}}, False, "", False, None

        extra = len(trajectories) - 1  # the tries count one request (and one failure) for the group's call
        self.stats.requests += extra
        group = await self._tries.run(first, self.backend, attempt)
        if not group.ok:
            self.stats.failures += extra
            return [replace(group, trajectory_id=t.trajectory_id) for t in trajectories]
        results = []
        for t, out in zip(trajectories, group.details["outs"]):
            if isinstance(out, Exception):  # its None: unscorable
                self.stats.failures += 1
                results.append(replace(group, trajectory_id=t.trajectory_id, ok=False, reward=0.0, details={},
                                       error=f"reward fn {fn!r}: {out}"))
                continue
            try:
                checked = normalise(out, t, fn)
            except (TypeError, ValueError) as exc:
                results.append(replace(group, trajectory_id=t.trajectory_id, ok=False, reward=0.0, details={},
                                       error=f"reward fn {fn!r}: {exc}", fault=Fault.of("reward", exc)))
                continue
            details = dict(checked.details)
            if checked.per_turn is not None:
                details["per_turn"] = checked.per_turn
            results.append(replace(group, trajectory_id=t.trajectory_id, reward=checked.reward, details=details))
        return results


def failed(fn: str, exc: Exception) -> tuple[None, bool, str, bool, Fault | None]:
    """A try whose reward function raised: retried unless retrying cannot help (the trajectory cannot be scored,
    the sandbox refuses); the function's own exception — not an unscorable answer, not the sandbox — is the
    domain's fault."""
    retryable = not isinstance(exc, (RewardInputError, SandboxUnavailable))
    fault = None if isinstance(exc, (Unscorable, SandboxUnavailable)) else Fault.of("reward", exc)
    return None, retryable, f"reward fn {fn!r} raised {type(exc).__name__}: {exc}", False, fault


def succeeded(out: RewardOutput) -> tuple[dict[str, Any], bool, str, bool, None]:
    details = dict(out.details)
    if out.per_turn is not None:
        details["per_turn"] = out.per_turn
    return {"reward": out.reward, "details": details}, False, "", False, None


def _fault_of(answer: Any) -> Fault | None:
    """The reward function's own failure a service reported (`fault` in its error body), if any."""
    fault = answer.get("fault") if isinstance(answer, dict) else None
    if not isinstance(fault, dict) or not isinstance(fault.get("error"), str):
        return None
    trace = fault.get("traceback")
    return Fault("reward", fault["error"][:2000], trace[-MAX_TRACEBACK_CHARS:] if isinstance(trace, str) else "")


def backend_metrics(clients: Mapping[str, Any], alive_s: float) -> dict[str, float]:
    """`reward/<backend>/…` of each client (by backend name; None: not used) that scored anything, the totals
    `reward/{retries,failures,cold_starts}`, and for local scoring `reward/local/{busy_s,util}` — the time
    with a scoring in progress, and its share of `alive_s`."""
    out: dict[str, float] = {}
    totals = {"retries": 0.0, "failures": 0.0, "cold_starts": 0.0}
    for name, client in clients.items():
        if client is None or not client.stats.requests:
            continue
        stats: BackendStats = client.stats
        for k, v in stats.latency.summary().items():
            out[f"reward/{name}/{k}"] = v
        for k in ("requests", "failures", "retries", "cold_starts", "replays", "outage_retries"):
            out[f"reward/{name}/{k}"] = float(getattr(stats, k))
        for k in totals:
            totals[k] += getattr(stats, k)
    local = clients.get("local")
    if local is not None and local.stats.requests:
        out["reward/local/busy_s"] = local.stats.busy.busy_s
        out["reward/local/util"] = local.stats.busy.busy_s / alive_s if alive_s > 0 else 0.0
    out.update({f"reward/{k}": v for k, v in totals.items()})
    return out
