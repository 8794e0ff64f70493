"""`SimEnvRunner`: the twin's env plane, behind the control plane's `TrajectoryRunner` protocol.

In: the run config's domains (their `profile`, limits and `inject`), the `LLMClient` to generate with (the
production `LLMProxy`, in process) and optionally the production turn barrier. Out: `run(task,
start_version)` → the finished `Trajectory` (not scored), `cancel(trajectory_id, status, reason)`,
`progress()` — what the real `EnvRouter` offers the `RolloutScheduler`.

An episode is drawn from its domain's profile with a generator seeded by the task (workload.py), then
played under the EnvManager's own episode policy (`rollart.envs.episode`): reset (its time; an injected
failure is retried after the same bounded exponential backoff, `envs.reset_retries`), then per turn [the
turn barrier] → a `GenerationRequest` with the whole context through the LLM client (so the proxy routes
it: by domain to its pool, sticky per trajectory) → the env step's time → the next turn, until the episode
ends. Statuses and reasons are the policy's: COMPLETED, TRUNCATED (limits), FAILED (an injected step
failure, reset failures past the retries, a generation error), ABORTED/STALE when cancelled (generation
aborted, partial turns kept).

Tokens are `Runs` (O(1) memory); each turn's spans are the env step and the generate wait, on the virtual
clock. The runner keeps, per domain, the profile it observed (turns, prompt and generated tokens per turn,
prefix hits, env and reward time) for the online profiler.
"""

from __future__ import annotations

import asyncio
import functools
import random
from dataclasses import dataclass
from typing import Any, Mapping

from rollart.config import DomainConfig, DomainProfileConfig, EnvsConfig
from rollart.envs.episode import EpisodeEnds, after_step, reset_with_retries
from rollart.envs.injection import InjectedFault
from rollart.sim.tokens import Runs
from rollart.sim.workload import draw_episode
from rollart.types import (
    GenerationRequest,
    LLMClient,
    SamplingParams,
    Span,
    Status,
    Task,
    Trajectory,
    Turn,
    TurnBarrier,
    UpcomingGroup,
)

WORKER = "env/sim/0"


@dataclass(eq=False)
class _Live:
    oldest_version: int | None = None
    cancelled: tuple[Status, str] | None = None
    sleeping: asyncio.Future | None = None
    generating: bool = False


class SimEnvRunner:
    def __init__(
        self,
        domains: Mapping[str, DomainConfig],
        envs: EnvsConfig,
        llm: LLMClient,
        turn_barrier: TurnBarrier | None = None,
        seed: int = 0,
        observer: Any = None,
        shifts: Mapping[str, tuple[int, DomainProfileConfig]] | None = None,
    ) -> None:
        self.domains, self.envs, self.llm, self.turn_barrier, self.seed = dict(domains), envs, llm, turn_barrier, seed
        self.observer = observer  # gets observe_turn / observe_episode calls (the profiler), or None
        # a workload shift: episodes begun at version ≥ v draw from another profile (the re-mapping demo)
        self.shifts = {d: (v, self.domains[d].model_copy(update={"profile": p})) for d, (v, p) in (shifts or {}).items()}
        self._live: dict[str, _Live] = {}
        self.started = 0

    # --- TrajectoryRunner -----------------------------------------------------------------------------
    async def run(self, task: Task, start_version: int) -> Trajectory:
        trajectory_id = task.trajectory_id
        if trajectory_id in self._live:
            raise ValueError(f"trajectory {trajectory_id} is already running in the twin")
        live = self._live[trajectory_id] = _Live()
        self.started += 1
        try:
            return await self._episode(task, start_version, live)
        finally:
            del self._live[trajectory_id]
            if self.turn_barrier is not None:
                await self.turn_barrier.leave(trajectory_id)

    async def cancel(self, trajectory_id: str, status: Status, reason: str) -> None:
        live = self._live.get(trajectory_id)
        if live is None or live.cancelled is not None:
            return
        live.cancelled = (status, reason)
        if live.generating:
            await self.llm.abort(trajectory_id)
        if live.sleeping is not None and not live.sleeping.done():
            live.sleeping.set_result(None)  # wake it: the episode ends with the cancel's status

    async def progress(self) -> dict[str, int | None]:
        return {trajectory_id: live.oldest_version for trajectory_id, live in self._live.items()}

    async def expect(self, group: UpcomingGroup) -> None:
        """Forecasts change nothing here: the twin's resets take their profile's time (it models no warm pool)."""

    # --- one episode ------------------------------------------------------------------------------------
    async def _sleep(self, live: _Live, seconds: float) -> None:
        """Take `seconds` of virtual time, or less if the trajectory is cancelled meanwhile. (A timer left
        behind by a cancel fires on a done future and does nothing: cancelling it each time would cost every
        turn two calls for the rare straggler.)"""
        if seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        live.sleeping = woken = loop.create_future()
        loop.call_at(loop.time() + seconds, _wake, woken)
        try:
            await woken
        finally:
            live.sleeping = None

    async def _episode(self, task: Task, start_version: int, live: _Live) -> Trajectory:
        domain = self.domains[task.domain]
        shift = self.shifts.get(task.domain)
        if shift is not None and start_version >= shift[0]:
            domain = shift[1]
        rng = random.Random(f"{self.seed}:{task.trajectory_id}:{task.seed}")
        episode = draw_episode(domain, rng)
        clock = asyncio.get_running_loop().time
        t0 = clock()
        failed = self._reset_fails(domain, rng)

        async def try_reset(attempt: int) -> None:
            await self._sleep(live, episode.reset_s)
            if live.cancelled:
                raise EpisodeEnds(*live.cancelled)
            if failed[attempt]:
                raise InjectedFault("injected env.reset failure")

        try:
            await reset_with_retries(self.envs, try_reset, sleep=lambda seconds: self._sleep(live, seconds))
        except EpisodeEnds as end:
            return Trajectory(task.trajectory_id, task, start_version).finished(end.status, end.reason)
        traj = Trajectory(task.trajectory_id, task, start_version, spans=(Span("env.reset", t0, clock(), WORKER),))
        turns: list[Turn] = []  # the trajectory takes them once, at its end (not a copy of it per turn)
        context = 0
        generated = 0
        for k, turn in enumerate(episode.turns):
            if self.turn_barrier is not None:
                await self.turn_barrier.before_turn(task.trajectory_id, k)
            if live.cancelled:
                return self._end(traj, turns, EpisodeEnds(*live.cancelled), generated)
            context += turn.prompt_tokens
            request = GenerationRequest(
                f"{task.trajectory_id}/{k}", task.trajectory_id, task.domain, Runs.of(0, context),
                _sampling(turn.response_tokens),
            )
            started = clock()
            live.generating = True
            try:
                result = await self.llm.generate(request)
            except Exception as exc:  # noqa: BLE001 — a broken generation ends the episode, as in EnvManager
                return self._end(traj, turns, EpisodeEnds.generation_failed(exc), generated)
            finally:
                live.generating = False
            n = len(result.token_ids)
            generated += n
            context += n
            if n and live.oldest_version is None:
                live.oldest_version = result.versions[0]
            wait = Span("generate.wait", started, clock(), WORKER)
            if self.observer is not None:
                self.observer.observe_turn(task.domain, turn.prompt_tokens, n, result.prompt_tokens,
                                           result.prefill_tokens, turn.env_s, k == 0)
            if result.finish_reason == "abort" or live.cancelled:
                turns.append(Turn(Runs.shared(0, turn.prompt_tokens), result.token_ids, result.logprobs,
                                  result.versions, finish_reason=result.finish_reason, spans=(wait,)))
                return self._end(traj, turns, EpisodeEnds.aborted(live.cancelled), generated)
            step_start = clock()
            await self._sleep(live, turn.env_s)
            turns.append(Turn(Runs.shared(0, turn.prompt_tokens), result.token_ids, result.logprobs, result.versions,
                              finish_reason=result.finish_reason,
                              spans=(wait, Span("env.step", step_start, clock(), WORKER))))
            if live.cancelled:
                return self._end(traj, turns, EpisodeEnds(*live.cancelled), generated)
            if turn.env_fails:
                return self._end(traj, turns, EpisodeEnds.step_failed(InjectedFault("injected env.step failure")),
                                 generated)
        # the episode's last turn: the env terminated it, unless a limit of the domain did
        if episode.limit == "max_turns":
            end = EpisodeEnds.max_turns(domain.max_turns)
        elif episode.limit == "max_total_tokens":
            end = EpisodeEnds.max_total_tokens(domain.max_total_tokens)
        else:
            end = after_step(terminated=True, truncated=False, format_error=None, end_on_format_error=False)
            assert end is not None  # (terminated always ends it)
        return self._end(traj, turns, end, generated, episode.reward_s)

    def _reset_fails(self, domain: DomainConfig, rng: random.Random) -> list[bool]:
        p = domain.inject.reset_fail_prob if domain.inject is not None else 0.0
        return [p > 0 and rng.random() < p for _ in range(self.envs.reset_retries + 1)]

    def _end(self, traj: Trajectory, turns: list[Turn], end: EpisodeEnds, generated: int,
             reward_s: float = 0.0) -> Trajectory:
        """`traj` (reset done) with its turns, ended as `end` says (built once: no copy per field set)."""
        status = end.status
        total = sum(len(t.prompt_token_ids) + len(t.response_token_ids) for t in turns)
        if self.observer is not None and status.trainable:
            self.observer.observe_episode(traj.domain, len(turns), reward_s)
        metrics = {"turns": float(len(turns)), "response_tokens": float(generated), "total_tokens": float(total),
                   "reward_s": reward_s}
        return Trajectory(traj.trajectory_id, traj.task, traj.start_version, tuple(turns), status, end.reason,
                          metrics=metrics, spans=traj.spans)


def _wake(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


@functools.lru_cache(maxsize=None)
def _sampling(max_new_tokens: int) -> SamplingParams:
    """The (immutable) sampling params of a turn of this length, made once per length."""
    return SamplingParams(max_new_tokens=max_new_tokens)
