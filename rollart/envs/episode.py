"""The episode policy: how an episode's reset is retried and how the way it ends becomes a status.

In: the env-runtime config (`envs.reset_retries`, `retry_backoff_s`, `retry_backoff_max_s`), one try at a
reset (a coroutine function of the attempt number) and the sleep to back off with; the facts of a turn
(terminated, truncated, a malformed action) or of its failure. Out: `reset_with_retries(...)` → the reset's
result, or `EpisodeEnds(FAILED, "env.reset failed N times: …")` once out of tries; `EpisodeEnds` — every way
an episode ends, each with its status and reason, made by one of its constructors or by `after_step`.

The rules:
- a reset that raises or times out is retried on a fresh env after min(backoff · 2^attempt, max) seconds,
  `envs.reset_retries` times; then the episode is FAILED with every try's error;
- after an env step: terminated → COMPLETED; a malformed action with `end_on_format_error` → COMPLETED;
  truncated → TRUNCATED; else the episode goes on (until `max_turns` or `max_total_tokens`: TRUNCATED);
- a generation that fails or times out, an env step that fails or times out → FAILED with the error; an
  env that raised (step, or every reset try) also carries the `Fault` (what raised, its traceback) that
  the rollout's per-domain circuit breaker counts — a timeout or a generation failure does not: slow is
  not broken, and generation is the infrastructure's;
- a generation aborted → the cancel's status (ABORTED or STALE) if the trajectory was cancelled, else
  ABORTED by the inference plane.

Both env runners follow it: the real `EnvManager` and the cluster twin's `SimEnvRunner` (whose episodes are
drawn from a profile), so a status or a retry in the twin means what it means in a real run.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, TypeVar

from rollart.config import EnvsConfig
from rollart.types import Fault, Status

T = TypeVar("T")


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class EpisodeEnds(Exception):
    """The episode ends, with this status and reason (raised inside an episode, caught once by its runner)."""

    def __init__(self, status: Status, reason: str, fault: Fault | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.fault = status, reason, fault

    @classmethod
    def max_turns(cls, max_turns: int) -> EpisodeEnds:
        return cls(Status.TRUNCATED, f"max_turns ({max_turns}) reached")

    @classmethod
    def max_total_tokens(cls, max_total_tokens: int) -> EpisodeEnds:
        return cls(Status.TRUNCATED, f"max_total_tokens ({max_total_tokens}) reached")

    @classmethod
    def aborted(cls, cancel: tuple[Status, str] | None) -> EpisodeEnds:
        """Generation came back aborted: by the trajectory's own cancel (its status), or by the inference plane."""
        return cls(*(cancel or (Status.ABORTED, "generation aborted by the inference plane")))

    @classmethod
    def generation_failed(cls, exc: BaseException) -> EpisodeEnds:
        return cls(Status.FAILED, f"generation failed: {error_text(exc)}")

    @classmethod
    def generation_timed_out(cls, timeout_s: float) -> EpisodeEnds:
        return cls(Status.FAILED, f"generation timed out after {timeout_s:g}s")

    @classmethod
    def step_failed(cls, exc: BaseException) -> EpisodeEnds:
        return cls(Status.FAILED, f"env.step failed: {error_text(exc)}", Fault.of("env.step", exc))

    @classmethod
    def step_timed_out(cls, timeout_s: float) -> EpisodeEnds:
        return cls(Status.FAILED, f"env.step timed out after {timeout_s:g}s")


def after_step(terminated: bool, truncated: bool, format_error: str | None, end_on_format_error: bool
               ) -> EpisodeEnds | None:
    """How the episode ends after an env step, or None when it goes on."""
    if terminated:
        return EpisodeEnds(Status.COMPLETED, "env terminated")
    if format_error and end_on_format_error:
        return EpisodeEnds(Status.COMPLETED, f"malformed action: {format_error}")
    if truncated:
        return EpisodeEnds(Status.TRUNCATED, "env truncated")
    return None


def retry_delay_s(envs: EnvsConfig, attempt: int) -> float:
    """The backoff before reset try `attempt + 1` (bounded exponential)."""
    return min(envs.retry_backoff_s * 2**attempt, envs.retry_backoff_max_s)


async def reset_with_retries(
    envs: EnvsConfig,
    try_reset: Callable[[int], Awaitable[T]],
    *,
    sleep: Callable[[float], Awaitable[object]] | None = None,
    on_retry: Callable[[str, float], None] | None = None,
) -> T:
    """`await try_reset(attempt)` until it returns, `envs.reset_retries + 1` tries at most. A try that raises
    (or times out) is retried after `retry_delay_s` (`on_retry(error, delay)` is told first); an
    `EpisodeEnds` from a try (the trajectory was cancelled meanwhile) ends the episode at once. `sleep`: how
    to wait out a backoff (None: `asyncio.sleep`)."""
    tries = envs.reset_retries + 1
    errors: list[str] = []
    fault: Fault | None = None  # the last try's, when it raised (a timeout is no fault of the env's code)
    for attempt in range(tries):
        try:
            return await try_reset(attempt)
        except EpisodeEnds:
            raise
        except TimeoutError:
            errors.append(f"timed out after {envs.reset_timeout_s:g}s")
            fault = None
        except Exception as exc:
            errors.append(error_text(exc))
            fault = Fault.of("env.reset", exc)
        if attempt + 1 < tries:
            delay = retry_delay_s(envs, attempt)
            if on_retry is not None:
                on_retry(errors[-1], delay)
            await (sleep or asyncio.sleep)(delay)
    raise EpisodeEnds(Status.FAILED, f"env.reset failed {tries} time{'s' * (tries != 1)}: " + "; ".join(errors),
                      fault)
