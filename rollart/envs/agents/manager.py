"""AgentManager: one agent trajectory, from the first model call to a finished `Trajectory` — the agent-domain
counterpart of `EnvManager`, with the same `run` / `cancel` / `progress` contract, so the env worker, the
pool and the scheduler treat both alike.

In: a `Task` of an agent domain, its start version, the user's agent function (`function.py`), the domain
config, the worker's `AgentGateway`, the turn's run `SamplingParams` and optionally a `TurnBarrier`.

Run: open a gateway session (base URL + key) → call the agent with them and an `AgentTask`, bounded by
`domains.<name>.agent_timeout_s` → end the session and turn its calls into turns (each model call is one
`Turn`; the agent's time between calls is an `agent.step` span, like `env.step`).

Out: a `Trajectory` with `status` set and `reward` None (the reward plane scores it; `env_return` is the
reward the agent returned, if any; `reference` what it returned under that key):
- COMPLETED: the agent returned;
- TRUNCATED: a call hit `max_turns` or `max_total_tokens` (the agent may then return or raise);
- FAILED: the agent raised, returned something unusable, timed out, made no model call, a generation
  failed, or it returned no reward on a domain whose reward is `env` — with the reason; when the agent's
  own code is to blame (it raised, returned something unusable or no reward, made no call) with the
  `Fault` too, which the rollout's per-domain circuit breaker counts;
- ABORTED/STALE: cancelled (`cancel`): the gateway refuses further calls, the call in flight is aborted
  (its partial tokens kept), the agent's task is cancelled.

Guarantees: `run` returns exactly once and never raises for agent or LLM errors; the session is always
ended and the turn barrier left; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from dataclasses import replace
from typing import Any

from rollart.config import DomainConfig
from rollart.envs.agents.function import AgentFunction, AgentOutcome, AgentTask, agent_outcome
from rollart.envs.agents.gateway import AgentGateway
from rollart.envs.agents.session import SessionLimits
from rollart.envs.episode import error_text
from rollart.envs.seeds import episode_seed, request_seed
from rollart.types import AGENT_METRIC_PREFIX, Fault, SamplingParams, Span, Status, Task, Trajectory, TurnBarrier

log = logging.getLogger(__name__)

CANCEL_GRACE_S = 2.0  # for the aborted call to record its partial turn, and for the agent to unwind
GATE_TIMEOUT_S = 10.0


class AgentManager:
    """Runs one agent trajectory. Create one per task; call `run()` once; `cancel()` from any task."""

    def __init__(
        self,
        task: Task,
        start_version: int,
        *,
        agent: AgentFunction,
        domain_cfg: DomainConfig,
        gateway: AgentGateway,
        sampling: SamplingParams,
        turn_barrier: TurnBarrier | None = None,
        worker: str = "env/env/0",
    ) -> None:
        self.task, self.agent, self.domain_cfg, self.gateway = task, agent, domain_cfg, gateway
        self.sampling, self.turn_barrier, self.worker = sampling, turn_barrier, worker
        self.trajectory = Trajectory(trajectory_id=task.trajectory_id, task=task, start_version=start_version)
        self._cancel: tuple[Status, str] | None = None
        self._inner: asyncio.Future[Any] | None = None
        self._opened = False
        self._started = False

    @property
    def trajectory_id(self) -> str:
        return self.trajectory.trajectory_id

    @property
    def done(self) -> bool:
        return self.trajectory.status is not None

    def progress(self) -> int | None:
        """Oldest policy version among the tokens generated so far, None before the first token."""
        return self.gateway.oldest_version(self.trajectory_id) if self._opened else None

    def agent_task(self) -> AgentTask:
        t = self.task
        return AgentTask(t.trajectory_id, t.domain, episode_seed(t), t.split, dict(self.domain_cfg.options),
                         self.gateway.cfg.model_name)

    # --- lifecycle ----------------------------------------------------------------------------------
    async def run(self) -> Trajectory:
        if self._started:
            raise RuntimeError(f"AgentManager.run() called twice for trajectory {self.trajectory_id}")
        self._started = True
        if self._cancel is not None:
            return await self._end(*self._cancel)
        base_url, key = self.gateway.open(
            self.trajectory_id, domain=self.task.domain,
            limits=SessionLimits(self.domain_cfg.max_turns, self.domain_cfg.max_total_tokens), sampling=self.sampling,
            sampling_source=self.domain_cfg.agent_sampling, seed_for=lambda k: request_seed(self.task, k), turn_barrier=self.turn_barrier,
        )
        self._opened = True
        start = time.time()
        self._inner = asyncio.ensure_future(self._call_agent(base_url, key))
        # an agent cancelled (a timeout, a cancel, our caller's cancellation) may still end with an error of its
        # own after we stopped looking: read it, so asyncio never logs "Task exception was never retrieved"
        self._inner.add_done_callback(_read_outcome)
        try:
            await asyncio.wait({self._inner}, timeout=self.domain_cfg.agent_timeout_s)
        except asyncio.CancelledError:  # our caller is cancelled: stop the agent too, end the session
            self._inner.cancel()
            await self._end(Status.ABORTED, "cancelled")
            raise
        if not self._inner.done():
            self._inner.cancel()
            await asyncio.wait({self._inner}, timeout=CANCEL_GRACE_S)
            return await self._end(Status.FAILED, f"agent timed out after {self.domain_cfg.agent_timeout_s:g}s", start)
        if self._cancel is not None:
            return await self._end(*self._cancel, start=start)
        if self._inner.cancelled():
            return await self._end(Status.ABORTED, "the agent's task was cancelled", start)
        exc = self._inner.exception()
        if exc is not None:
            return await self._end(Status.FAILED, f"agent raised {error_text(exc)}", start, raised=True,
                                   fault=Fault.of("agent", exc))
        try:
            outcome = agent_outcome(self._inner.result())
        except TypeError as err:
            return await self._end(Status.FAILED, str(err), start, fault=Fault("agent", str(err)))
        if outcome.reward is None and self.domain_cfg.reward.fn == "env":
            why = ("the agent returned no reward and the domain's reward is 'env' (return a number, or set "
                   "domains.<name>.reward)")
            return await self._end(Status.FAILED, why, start, fault=Fault("agent", why))
        return await self._end(Status.COMPLETED, "agent returned", start, outcome=outcome)

    async def _call_agent(self, base_url: str, key: str) -> Any:
        if inspect.iscoroutinefunction(self.agent):
            return await self.agent(base_url, key, self.agent_task())
        result = await asyncio.to_thread(self.agent, base_url, key, self.agent_task())
        return await result if inspect.isawaitable(result) else result

    async def cancel(self, status: Status, reason: str) -> None:
        """End the trajectory early with `status` (ABORTED or STALE): refuse the agent's further calls,
        abort the one in flight, cancel the agent. A no-op once it has ended."""
        if self.done or self._cancel is not None:
            return
        self._cancel = (status, reason)
        if self._opened:
            try:
                await asyncio.wait_for(self.gateway.cancel(self.trajectory_id, CANCEL_GRACE_S), CANCEL_GRACE_S + 10)
            except Exception as exc:  # the agent is cancelled below either way
                log.warning("gateway cancel of %s failed: %s", self.trajectory_id, error_text(exc))
        if self._inner is not None and not self._inner.done():
            self._inner.cancel()

    async def _end(
        self,
        status: Status,
        reason: str,
        start: float | None = None,
        *,
        outcome: AgentOutcome | None = None,
        raised: bool = False,
        fault: Fault | None = None,
    ) -> Trajectory:
        """End the session, build the trajectory from its calls, leave the turn barrier."""
        turns, counters, failure, truncated = (), {}, "", ""
        if self._opened:
            self._opened = False
            try:
                session, failure = await asyncio.wait_for(self.gateway.finish(self.trajectory_id, CANCEL_GRACE_S),
                                                          CANCEL_GRACE_S + 10)
                turns, counters, truncated = tuple(session.turns), session.counters, session.truncated
            except Exception as exc:
                log.warning("ending the gateway session of %s failed: %s", self.trajectory_id, error_text(exc))
                status, reason, fault = Status.FAILED, f"gateway session lost: {error_text(exc)}", None
        if status in (Status.COMPLETED, Status.FAILED) and self._cancel is None:
            if failure:  # a generation of one of its calls failed: the infrastructure's, not the agent's fault
                status, reason, fault = Status.FAILED, failure, None
            elif truncated and (status == Status.COMPLETED or raised):
                status, reason = Status.TRUNCATED, truncated
        if status.trainable and not turns:
            status, reason = Status.FAILED, "the agent made no model call"
            fault = Fault("agent", reason)
        end = time.time()
        spans: tuple[Span, ...] = ()
        if start is not None:
            last = max((s.end for t in turns for s in t.spans), default=start)
            spans = (Span("agent.step", last, end, self.worker),)
        metrics = {
            # the agent's own numbers, namespaced so they cannot overwrite the runner's counters; the
            # observability plane logs them as env/<domain>/agent/<name>
            **{f"{AGENT_METRIC_PREFIX}{k}": v for k, v in (outcome.metrics if outcome else {}).items()},
            **{k: float(v) for k, v in counters.items()},
            "turns": float(len(turns)),
            "response_tokens": float(sum(len(t.response_token_ids) for t in turns)),
            "total_tokens": float(sum(len(t.prompt_token_ids) + len(t.response_token_ids) for t in turns)),
        }
        if start is not None:
            metrics["agent_time_s"] = max(0.0, end - start - counters.get("generate_time_s", 0.0))
        self.trajectory = replace(
            self.trajectory, turns=turns, spans=self.trajectory.spans + spans,
            env_return=float(outcome.reward) if outcome and outcome.reward is not None else 0.0,
            reference=dict(outcome.reference) if outcome else {},
        ).finished(status, reason, metrics, fault if status is Status.FAILED and self._cancel is None else None)
        if self.turn_barrier is not None:
            try:
                await asyncio.wait_for(self.turn_barrier.leave(self.trajectory_id), GATE_TIMEOUT_S)
            except Exception as exc:
                log.warning("turn barrier leave of %s failed: %s", self.trajectory_id, error_text(exc))
        return self.trajectory


def _read_outcome(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
