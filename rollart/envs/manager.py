"""EnvManager: one environment lifecycle, from reset to a finished `Trajectory`.

In: a `Task`, the policy version it starts under, an env factory, the domain and env-runtime config, an
`LLMClient` (the inference plane's proxy, injected), a `ChatTokens` for the model's chat template, the
turn's `SamplingParams`, and optionally a `TurnBarrier` (rollout.barrier=turn).

Loop: reset (with timeout; a failed or timed-out reset is retried on a fresh env with bounded exponential
backoff: the episode policy, `rollart.envs.episode`, which the cluster twin's env runner follows too) → per turn (`_turn`): [turn_barrier.before_turn] → prompt ids (token-in/token-out, see chat.py) → generate → the
decoded response goes to env.step (with timeout) → until the env terminates or truncates, or `max_turns`
or `max_total_tokens` is reached.

Out: a `Trajectory` with `status` set and `reward` None (the reward plane scores it): COMPLETED when the env
terminated (or ended the episode on a malformed action under `end_on_format_error`), TRUNCATED on env
truncation/max turns/max tokens, FAILED with the error text when reset kept failing, step raised or timed
out, or generation failed, ABORTED/STALE when cancelled (`cancel`), with every turn generated so far.
`reference` comes from the reset info (and its `prompt_messages`, a whole chat, make the first prompt; its
`metrics` become `data/<name>` metrics), `env_return` is the sum of the turns' rewards (a malformed action's
turn gets the domain's `format_penalty`).

Guarantees: `run` returns exactly once per manager, never raises for env/LLM errors, and always closes
the env and leaves the turn barrier; every wait on an env or the LLM has a timeout.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any, NoReturn

from rollart.config import DomainConfig, EnvsConfig
from rollart.envs.chat import ChatTokens
from rollart.envs.episode import EpisodeEnds, after_step, error_text, reset_with_retries
from rollart.envs.injection import FaultInjectingEnv
from rollart.envs.protocol import (
    FORMAT_ERROR_KEY,
    METRICS_KEY,
    PROMPT_MESSAGES_KEY,
    REFERENCE_KEY,
    AsyncEnv,
    EnvFactory,
)
from rollart.envs.reset_stats import ResetStats
from rollart.envs.warm_pool import WarmPool, build_prepared
from rollart.envs.seeds import episode_seed, request_seed
from rollart.types import (
    DATA_METRIC_PREFIX,
    Fault,
    GenerationRequest,
    GenerationResult,
    LLMClient,
    SamplingParams,
    Span,
    Status,
    Task,
    Trajectory,
    Turn,
    TurnBarrier,
)

log = logging.getLogger(__name__)

ABORT_TIMEOUT_S = 10.0  # for LLMClient.abort and the turn barrier's leave
ABORT_GRACE_S = 2.0  # how long an aborted generation may take to come back with its partial tokens
CLOSE_TIMEOUT_S = 10.0


class EnvManager:
    """Runs one trajectory. Create one per task; call `run()` once; `cancel()` from any task."""

    def __init__(
        self,
        task: Task,
        start_version: int,
        *,
        make_env: EnvFactory,
        domain_cfg: DomainConfig,
        envs: EnvsConfig,
        llm: LLMClient,
        chat: ChatTokens,
        sampling: SamplingParams,
        executor: Executor | None = None,
        turn_barrier: TurnBarrier | None = None,
        worker: str = "env/env/0",
        generate_timeout_s: float = 300.0,
        pool: WarmPool | None = None,
        reset_stats: ResetStats | None = None,
    ) -> None:
        self.task, self.domain_cfg, self.envs = task, domain_cfg, envs
        self.llm, self.chat, self.sampling, self.turn_barrier = llm, chat, sampling, turn_barrier
        self.worker, self.generate_timeout_s = worker, generate_timeout_s
        self._make_env, self._executor = make_env, executor
        self._pool, self._reset_stats = pool, reset_stats
        self._pool_hit: bool | None = None  # whether the first reset try got a prepared env from the pool
        self._staged = False  # … and whether that env was staged for this episode's seed
        self.trajectory = Trajectory(trajectory_id=task.trajectory_id, task=task, start_version=start_version)
        # one RNG per episode for injected faults, shared by re-created envs so a retry draws anew
        inject_seed = domain_cfg.inject.seed if domain_cfg.inject else 0
        self._fault_rng = random.Random(f"{inject_seed}:{task.trajectory_id}:{task.seed}")
        self._env: AsyncEnv | FaultInjectingEnv | None = None
        self._inner: asyncio.Task[Trajectory] | None = None
        self._cancel: tuple[Status, str] | None = None
        self._phase = "idle"
        self._started = False
        self._first_chat: list[dict[str, Any]] | None = None  # reset info's prompt_messages
        # context_tokens / prefill_tokens: the turns' contexts and the part of them the engines computed (the
        # rest came from a prefix cache), for the online profiler's prefix-hit rate
        self._metrics: dict[str, float] = dict.fromkeys(
            ("reset_attempts", "format_errors", "env_time_s", "generate_time_s", "context_tokens", "prefill_tokens"),
            0.0,
        )

    @property
    def trajectory_id(self) -> str:
        return self.trajectory.trajectory_id

    @property
    def done(self) -> bool:
        return self.trajectory.status is not None

    def progress(self) -> int | None:
        """Oldest policy version among the tokens generated so far, None before the first token."""
        versions = [v for t in self.trajectory.turns for v in t.versions]
        return min(versions) if versions else None

    # --- lifecycle ----------------------------------------------------------------------------------
    async def run(self) -> Trajectory:
        if self._started:
            raise RuntimeError(f"EnvManager.run() called twice for trajectory {self.trajectory_id}")
        self._started = True
        if self._cancel is None:
            self._inner = asyncio.ensure_future(self._episode())
            try:
                await asyncio.wait({self._inner})
            except asyncio.CancelledError:  # our caller is cancelled: stop the episode too
                self._inner.cancel()
                await self._cleanup()
                raise
        if self._inner is not None and not self._inner.cancelled():
            exc = self._inner.exception()
            if exc is not None:  # a bug in this module: report it on the trajectory, do not lose it
                log.exception("trajectory %s crashed", self.trajectory_id, exc_info=exc)
                self._finish(Status.FAILED, f"env manager error: {error_text(exc)}")
        if not self.done:
            status, reason = self._cancel or (Status.ABORTED, "cancelled")
            self._finish(status, reason)
        await self._cleanup()
        return self.trajectory

    async def cancel(self, status: Status, reason: str) -> None:
        """End the trajectory early with `status` (ABORTED or STALE): abort its generation, stop its
        env; `run` then returns the partial trajectory. A no-op once it has ended."""
        if self.done or self._cancel is not None:
            return
        self._cancel = (status, reason)
        try:
            await asyncio.wait_for(self.llm.abort(self.trajectory_id), ABORT_TIMEOUT_S)
        except Exception as exc:  # the episode is cancelled below either way
            log.warning("abort of %s failed: %s", self.trajectory_id, error_text(exc))
        inner = self._inner
        if inner is None or inner.done():
            return
        if self._phase == "generate":  # let the aborted generation return its partial tokens
            await asyncio.wait({inner}, timeout=ABORT_GRACE_S)
        if not inner.done():
            inner.cancel()

    async def _cleanup(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            await self._close_quietly(env)
        if self.turn_barrier is not None:
            try:
                await asyncio.wait_for(self.turn_barrier.leave(self.trajectory_id), ABORT_TIMEOUT_S)
            except Exception as exc:
                log.warning("turn barrier leave of %s failed: %s", self.trajectory_id, error_text(exc))

    async def _close_quietly(self, env: AsyncEnv | FaultInjectingEnv) -> None:
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):  # (not wait_for: no extra task per trajectory)
                await env.close()
        except Exception as exc:
            log.warning("env.close of %s failed: %s", self.trajectory_id, error_text(exc))

    def _finish(self, status: Status, reason: str = "", fault: Fault | None = None) -> Trajectory:
        turns = self.trajectory.turns
        metrics = {
            **self._metrics,
            "turns": float(len(turns)),
            "response_tokens": float(self.trajectory.num_response_tokens),
            "total_tokens": float(sum(len(t.prompt_token_ids) + len(t.response_token_ids) for t in turns)),
        }
        self.trajectory = replace(
            self.trajectory, env_return=float(sum(t.reward for t in turns))
        ).finished(status, reason, metrics, fault)
        return self.trajectory

    # --- the episode ----------------------------------------------------------------------------------
    async def _acquire_env(self) -> AsyncEnv | FaultInjectingEnv:
        """A prepared env: from the domain's warm pool when it has one (staged for this episode's seed when
        the pool was told the group was coming), else built and prepared now."""
        if self._pool is not None:
            env, hit = await self._pool.acquire(episode_seed(self.task))
            if self._pool_hit is None:
                self._pool_hit, self._staged = hit, env.staged_for == episode_seed(self.task)
        else:
            env = await build_prepared(self._make_env, self._executor, self.envs.reset_timeout_s)
        if self.domain_cfg.inject is not None:
            return FaultInjectingEnv(env, self.domain_cfg.inject, self._fault_rng)
        return env

    async def _reset(self) -> tuple[str, dict[str, Any]]:
        """Reset (timed for the domain's reset statistics, retries included)."""
        start = time.time()
        try:
            result = await self._reset_with_retries()
        except EpisodeEnds:
            self._record_reset(start, ok=False)
            raise
        self._record_reset(start, ok=True)
        return result

    def _record_reset(self, start: float, ok: bool) -> None:
        if self._reset_stats is not None:
            self._reset_stats.record(self.task.domain, time.time() - start, int(self._metrics["reset_attempts"]),
                                     ok, self._pool_hit, self._staged)

    async def _reset_with_retries(self) -> tuple[str, dict[str, Any]]:
        """Reset a prepared env, retried by the episode policy; FAILED when out of tries."""
        def retrying(error: str, delay: float) -> None:
            log.info("env.reset of %s failed (%s); retry in %.2fs", self.trajectory_id, error, delay)

        return await reset_with_retries(self.envs, self._try_reset, on_retry=retrying)

    async def _try_reset(self, attempt: int) -> tuple[str, dict[str, Any]]:
        """One reset on a prepared env (closed again if the reset fails), within `envs.reset_timeout_s`."""
        self._metrics["reset_attempts"] = float(attempt + 1)
        start = time.time()
        try:
            # (asyncio.timeout, not wait_for: no extra task per call on the hot path of every trajectory)
            async with asyncio.timeout(self.envs.reset_timeout_s):
                self._env = await self._acquire_env()
            async with asyncio.timeout(self.envs.reset_timeout_s):
                obs, info = await self._env.reset(episode_seed(self.task))
        except Exception:
            self._metrics["env_time_s"] += time.time() - start
            env, self._env = self._env, None
            if env is not None:
                await self._close_quietly(env)
            raise
        self.trajectory = replace(
            self.trajectory, spans=self.trajectory.spans + (Span("env.reset", start, time.time(), self.worker),)
        )
        self._metrics["env_time_s"] += time.time() - start
        return obs, info

    async def _episode(self) -> Trajectory:
        """Reset, then turns until the episode ends; every way it ends is an `EpisodeEnds` from below."""
        try:
            observation, info = await self._reset()
            reference = info.get(REFERENCE_KEY)
            if isinstance(reference, dict):
                self.trajectory = replace(self.trajectory, reference=dict(reference))
            chat = info.get(PROMPT_MESSAGES_KEY)
            self._first_chat = [dict(m) for m in chat] if isinstance(chat, list) and chat else None
            for key, value in dict(info.get(METRICS_KEY) or {}).items():
                self._metrics[f"{DATA_METRIC_PREFIX}{key}"] = float(value)
            for turn_index in range(self.domain_cfg.max_turns):
                observation = await self._turn(turn_index, observation)
        except EpisodeEnds as end:
            return self._finish(end.status, end.reason, end.fault)
        end = EpisodeEnds.max_turns(self.domain_cfg.max_turns)
        return self._finish(end.status, end.reason)

    async def _turn(self, turn_index: int, observation: str) -> str:
        """One turn: [turn barrier] → prompt ids → generate → env.step. Returns the next observation, or raises
        `EpisodeEnds`. Once generation has returned, the turn is on the trajectory however it ends."""
        if self.turn_barrier is not None:
            await self.turn_barrier.before_turn(self.trajectory_id, turn_index)
        if turn_index == 0:
            prompt = self.chat.initial_messages(self._first_chat) if self._first_chat else self.chat.initial(observation)
        else:
            prompt = self.chat.follow_up(observation, self.trajectory.turns[-1].response_token_ids)
        context = self.trajectory.token_ids() + prompt
        budget = self.domain_cfg.max_total_tokens - len(context)
        if budget <= 0:
            raise EpisodeEnds.max_total_tokens(self.domain_cfg.max_total_tokens)
        result, generate_span = await self._generate(turn_index, context, budget)
        response = tuple(result.token_ids)
        action = self.chat.response_text(response)
        turn = Turn(
            prompt_token_ids=tuple(prompt),
            response_token_ids=response,
            logprobs=tuple(result.logprobs),
            versions=tuple(result.versions),
            observation=observation,
            action=action,
            finish_reason=result.finish_reason,
            spans=(generate_span, *result.spans),
        )
        if result.finish_reason == "abort" or self._cancel is not None:
            self._end_with(turn, EpisodeEnds.aborted(self._cancel))
        start = time.time()
        try:
            async with asyncio.timeout(self.envs.step_timeout_s):
                observation, reward, terminated, truncated, info = await self._env.step(action)  # type: ignore[union-attr]
        except TimeoutError:
            self._end_with(turn, EpisodeEnds.step_timed_out(self.envs.step_timeout_s))
        except Exception as exc:
            self._end_with(turn, EpisodeEnds.step_failed(exc))
        finally:
            self._metrics["env_time_s"] += time.time() - start
        format_error = info.get(FORMAT_ERROR_KEY)
        if format_error:
            self._metrics["format_errors"] += 1
            reward = self.domain_cfg.format_penalty
        step_span = Span("env.step", start, time.time(), self.worker)
        self.trajectory = self.trajectory.with_turn(
            replace(turn, reward=reward, format_ok=not format_error, spans=turn.spans + (step_span,))
        )
        end = after_step(terminated, truncated, format_error, self.domain_cfg.end_on_format_error)
        if end is not None:
            raise end
        return observation

    def _end_with(self, turn: Turn, end: EpisodeEnds) -> NoReturn:
        """The episode ends on this turn, before its env step (or without one): keep it, then end."""
        self.trajectory = self.trajectory.with_turn(turn)
        raise end

    async def _generate(self, turn_index: int, context: list[int], budget: int) -> tuple[GenerationResult, Span]:
        """Generate the turn's response (at most `budget` tokens); FAILED when generation fails."""
        sampling = replace(
            self.sampling,
            max_new_tokens=min(self.sampling.max_new_tokens, budget),
            # a seed per (episode, turn), unless the caller fixed one: the same task samples the same
            # tokens whatever else runs beside it — what makes runs reproducible and α = 0 equal to sync
            seed=self.sampling.seed if self.sampling.seed is not None else request_seed(self.task, turn_index),
        )
        request = GenerationRequest(
            request_id=f"{self.trajectory_id}/{turn_index}",
            trajectory_id=self.trajectory_id,
            domain=self.task.domain,
            prompt_token_ids=tuple(context),
            sampling=sampling,
        )
        start = time.time()
        self._phase = "generate"
        try:
            async with asyncio.timeout(self.generate_timeout_s):
                result = await self.llm.generate(request)
        except TimeoutError:
            raise EpisodeEnds.generation_timed_out(self.generate_timeout_s) from None
        except Exception as exc:
            raise EpisodeEnds.generation_failed(exc) from None
        finally:
            self._phase = "env"
        end = time.time()
        self._metrics["generate_time_s"] += end - start
        self._metrics["context_tokens"] += result.prompt_tokens
        self._metrics["prefill_tokens"] += result.prefill_tokens
        return result, Span("generate.wait", start, end, self.worker)
